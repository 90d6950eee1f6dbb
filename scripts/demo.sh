#!/usr/bin/env bash
# make demo: three jobs join one tsshim session; tsshim-inspect shows the
# producer and consumers; the producer is killed and a consumer takes over;
# when all leave, nothing is left behind.
#
# At this stage of the project the jobs are small member programs
# (build/tests/ts-member); the data path (dataset, PyTorch jobs, GPU ring)
# arrives with the later issues and will replace them here.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
LIB=$PWD/$BUILD/libtsshim.so
INSPECT=$PWD/$BUILD/tsshim-inspect
MEMBER=$PWD/$BUILD/tests/ts-member
SESSION=demo-$$
export TSSHIM_SESSION=$SESSION TSSHIM_TIMEOUT_MS=500
tmp=$(mktemp -d)
pids=()
trap 'kill -KILL "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT

say() { printf '\n== %s\n' "$*"; }

say "starting 3 jobs with LD_PRELOAD=$BUILD/libtsshim.so TSSHIM_SESSION=$SESSION"
for job in 1 2 3; do
	LD_PRELOAD=$LIB "$MEMBER" >"$tmp/job$job" 2>&1 &
	pids+=($!)
	until grep -q '^join=' "$tmp/job$job"; do sleep 0.02; done
	echo "job $job: pid ${pids[-1]}, $(head -n1 "$tmp/job$job" | grep -oE 'role=[a-z]+')"
done

say "$BUILD/tsshim-inspect $SESSION"
"$INSPECT" "$SESSION"

say "killing the producer (pid ${pids[0]}) with SIGKILL"
start=$(date +%s%N)
kill -KILL "${pids[0]}"
until grep -qh 'role=producer' "$tmp/job2" "$tmp/job3"; do sleep 0.005; done
ms=$(( ($(date +%s%N) - start) / 1000000 ))
new=$(grep -l 'role=producer' "$tmp/job2" "$tmp/job3" | head -n1)
echo "$(basename "$new") took over as producer after ${ms} ms (TSSHIM_TIMEOUT_MS=500)"

say "$BUILD/tsshim-inspect $SESSION"
"$INSPECT" "$SESSION"

say "the other jobs finish"
kill -TERM "${pids[1]}" "${pids[2]}"
wait "${pids[1]}" "${pids[2]}" 2>/dev/null || true
if ls /dev/shm/tsshim."$(id -u)"."$SESSION" >/dev/null 2>&1; then
	echo "segment still present (unexpected)"; exit 1
fi
echo "session segment removed by the last job out: nothing left in /dev/shm"

say "summary"
echo "3 jobs shared one session: 1 producer, 2 consumers; the producer died and exactly"
echo "one consumer took over in ${ms} ms; the last job out cleaned up."
echo "(Data sharing itself - dataset reads, JPEG decodes, GPU batches - comes with the"
echo " dataset, PyTorch and GPU issues; see README.md.)"
