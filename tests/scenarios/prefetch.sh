#!/usr/bin/env bash
# TSSHIM_PREFETCH=warm: the session's producer reads the dataset scope ahead
# (io_uring, plain reads where refused) so later reads find it in the page
# cache; consumers and TSSHIM_PREFETCH=off read nothing ahead.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
PC="$PWD/tests/py/pagecache.py"
[ -x "$PWD/$BUILD/tsshim-mkdata" ] || { echo "needs tsshim-mkdata"; exit 77; }
"$PWD/$BUILD/tsshim-mkdata" --classes 3 --train 20 --val 1 --seed 5 "$T_TMP/data" >/dev/null 2>&1 || exit 1
DATA="$T_TMP/data/train"
NFILES=$(find "$DATA" -type f | wc -l)
export TSSHIM_DATA=$DATA TSSHIM_LOG=info

"$PY" "$PC" evict "$DATA"
r=$("$PY" "$PC" resident "$DATA")
if awk "BEGIN {exit !($r > 0.2)}"; then echo "page cache eviction has no effect here ($r resident)"; exit 77; fi

# prefetch off: nothing is read ahead
S=$(session_name off)
TSSHIM_SESSION=$S TSSHIM_PREFETCH=off LD_PRELOAD="$TS_PRELOAD" "$MEMBER" --hold-ms 500 >/dev/null 2>"$T_TMP/off.err"
r=$("$PY" "$PC" resident "$DATA")
check "TSSHIM_PREFETCH=off reads nothing ahead ($r resident)" awk "BEGIN {exit !($r < 0.2)}"

# warm: the producer reads the whole scope ahead
S=$(session_name warm)
export TSSHIM_PREFETCH=warm
start_member P "$S" --hold-ms 4000
wait_for "$T_TMP/$P.out" '^join=0'
start_member C "$S" --hold-ms 500
for ((i = 0; i < 200; i++)); do
	r=$("$PY" "$PC" resident "$DATA")
	awk "BEGIN {exit !($r >= 0.99)}" && break
	sleep 0.05
done
check "the producer read the whole scope into the page cache ($r resident)" awk "BEGIN {exit !($r >= 0.99)}"
check "only the producer prefetched" [ "$(grep -c 'prefetch: reading' "$T_TMP/stderr")" = 1 ]
# The consumer leaves first: a producer leaving first hands over, and the
# new producer prefetches too (once per process).
kill -TERM "$C" 2>/dev/null; wait "$C"
kill -TERM "$P" 2>/dev/null; wait "$P"
line=$(grep -h "\[$P\]: prefetch: [0-9]* files" "$T_TMP/stderr")
echo "# $line"
check "prefetch read every file of the scope ($NFILES)" [ "$(echo "$line" | grep -c "prefetch: $NFILES files, .* 0 errors")" = 1 ]

# A program that closes every descriptor above stderr (close_range, closefrom) while the
# prefetch reads. Under a seccomp filter the prefetch keeps its descriptors in the program's
# table: the shim must stop it before the close, or it goes on with numbers the program reuses.
# Without a filter its table is its own and it reads on. The program's pipes, made in the
# freed numbers, must carry exactly their data. A sparse file keeps the prefetch busy.
CR="$PWD/$BUILD/tests/ts-closerange"
mkdir -p "$T_TMP/big" && truncate -s 1G "$T_TMP/big/blob"
for way in "--seccomp close_range" "--seccomp closefrom" "close_range"; do
	key=${way//[^a-z]/_}
	S=$(session_name "cr$key")
	# shellcheck disable=SC2086 # $way is two words on purpose
	out=$(TSSHIM_SESSION=$S TSSHIM_DATA="$T_TMP/big" LD_PRELOAD="$TS_PRELOAD" timeout 60 "$CR" $way 2>"$T_TMP/cr$key.err")
	rc=$?
	check "$way: the program's pipes carry their data (rc=$rc: $out)" [ "$rc" = 0 ] || cat "$T_TMP/cr$key.err"
	if [[ "$way" == --seccomp* ]]; then
		check "$way: the prefetch (descriptors in the program's table) was stopped before the close" \
			grep -q "prefetch stopped: the program closes its descriptors" "$T_TMP/cr$key.err"
	else
		check "$way: the prefetch (a table of its own) read on ($out)" \
			cond '[[ "$out" == *prefetch_after=1* ]] && ! grep -q "prefetch stopped: the program" "$T_TMP/cr$key.err"'
	fi
	check "$way: the session segment is removed at exit" [ ! -e "$(seg_path "$S")" ]
done
finish prefetch
