#!/usr/bin/env bash
# A PyTorch job alone in its session behaves as without the shim, in the
# corners a differential run found it did not (tests/py/alone_cases.py says
# what each case was): every case run plainly and under the shim (socket
# mode and exact mode, default log level), its output and exit status
# compared, and nothing of the shim's on its stderr.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh
need_python "torch"
CASES="$PWD/tests/py/alone_cases.py"
unset TSSHIM_MODE TSSHIM_LOG

# the gpu case's test device: one device of 16 MiB
export LD_LIBRARY_PATH="$PWD/$BUILD/emu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" TSEMU_DEVICES=1 TSEMU_MEM_MB=16
for c in reassign stopiter two_loaders fork_child atexit copy strings interrupt worker_error gpu threads quiet; do
	want=$(env -u LD_PRELOAD timeout 60 "$PY" "$CASES" "$c" 2>"$T_TMP/$c.plain.err"; echo "rc=$?")
	for mode in socket exact; do
		got=$(LD_PRELOAD="$TS_PRELOAD" TSSHIM_MODE=$mode TSSHIM_SESSION="$(session_name "$c-$mode")" \
			timeout 60 "$PY" "$CASES" "$c" 2>"$T_TMP/$c.err"; echo "rc=$?")
		lines=$(grep -c '^tsshim\[' "$T_TMP/$c.err")
		check "$c ($mode): as without the shim (${got##*rc=}), no line of the shim's ($lines)" \
			cond '[ "$want" = "$got" ] && [ "$lines" = 0 ]'
		if [ "$want" != "$got" ] || [ "$lines" != 0 ]; then
			diff <(echo "$want") <(echo "$got") | head -n 8 | sed 's/^/#   /'
			grep '^tsshim\[' "$T_TMP/$c.err" | head -n 4 | sed 's/^/#   /'
		fi
	done
done
# quiet: what a job alone publishes (its feed's pub_seq, by tsshim-inspect while
# it waits at its end): the first TSSHIM_DEPTH (4) batches of each of its 3
# epochs of 10, for a job started a moment after it; the rest only noted.
# Before, every batch (30).
mkdir -p "$T_TMP/hold"
LD_PRELOAD="$TS_PRELOAD" TSSHIM_MODE=socket TSSHIM_SESSION="$(session_name quiet-pub)" QUIET_HOLD="$T_TMP/hold" \
	timeout 60 "$PY" "$CASES" quiet >"$T_TMP/quiet.held.out" 2>&1 &
held=$!
T_PIDS+=($held)
for ((i = 0; i < 3000; i++)); do [ -e "$T_TMP/hold/ready" ] && break; sleep 0.01; done
pub=$("$INSPECT" --json | "$PY" -c '
import json, sys
s = [x for x in json.load(sys.stdin)["sessions"] if x["name"].startswith(sys.argv[1] + ".")]
print(",".join(str(x.get("pub_seq")) for x in s) or "no feed")' "$(session_name quiet-pub)")
touch "$T_TMP/hold/go"
wait "$held"; rc=$?
check "quiet: a job alone published the first 4 of each epoch's 10 batches ($pub of 30; exit $rc)" \
	cond '[ "$pub" = 12 ] && [ "$rc" = 0 ]'
finish alone
