#!/usr/bin/env bash
# Benchmarks: the same collocated jobs without the shim and with it, in one
# run (scripts/bench.py says what is measured and how). Builds what is
# missing, generates the dataset once (build/bench/data), then runs.
#
#   scripts/bench.sh [--quick] [bench.py options...]
#
# --quick: one round, a smaller dataset (a check that it all works, ~2 min).
# Results: build/bench/results.json, build/bench/bench.png, last line RESULT ...
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
quick=
if [ "${1:-}" = --quick ]; then quick=1; shift; fi

scripts/install-deps.sh --bench
make --no-print-directory -s all

if [ -n "$quick" ]; then
	data=$BUILD/bench/data-quick; per_class=20; set -- --repeats 1 "$@"
else
	data=$BUILD/bench/data; per_class=100
fi
if [ ! -f "$data/manifest.tsv" ]; then
	echo "bench: generating $data (8 classes x $per_class training images)"
	"$BUILD/tsshim-mkdata" --classes 8 --train "$per_class" --val 5 --seed 3 --force "$data" >/dev/null
fi
echo "bench: $(nproc) CPUs; $(find "$data/train" -name '*.jpg' | wc -l) training images in $data"
exec /usr/bin/python3 scripts/bench.py --build "$BUILD" --data "$data" "$@"
