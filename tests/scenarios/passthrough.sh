#!/usr/bin/env bash
# The shim is invisible to programs it does not serve: same stdout, stderr
# and exit status with and without it; an invalid variable costs exactly one
# line on stderr and changes nothing else.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh

PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)

# same CMD...: run with and without the shim (extra env in $EXTRA), compare.
same() {
	local desc=$1; shift
	local o1 e1 r1 o2 e2 r2
	o1=$("$@" 2>"$T_TMP/e1"); r1=$?
	o2=$(env $EXTRA LD_PRELOAD="$TS_PRELOAD" "$@" 2>"$T_TMP/e2"); r2=$?
	if [ "$o1" = "$o2" ] && [ "$r1" = "$r2" ] && cmp -s "$T_TMP/e1" "$T_TMP/e2"; then
		ok "$desc"
	else
		not_ok "$desc (exit $r1 vs $r2)"; diff "$T_TMP/e1" "$T_TMP/e2" | head -5
	fi
}

EXTRA=
same "ls behaves as without the shim" ls -la /usr/lib
same "ls of a missing file: same error and exit status" ls /nonexistent-tsshim
same "python3 -c 'print(1)'" "$PY" -c 'print(1)'
same "python3 exit status and stderr" "$PY" -c 'import sys; sys.stderr.write("e\n"); sys.exit(3)'
same "git status" git status --short
same "sh pipeline with fork/exec" sh -c 'for i in 1 2 3; do echo $i | cat; done; exit 5'
same "TSSHIM_MODE=off" env TSSHIM_MODE=off cat /etc/hostname

# Invalid values: exactly one line naming the variable, output unchanged.
for bad in "TSSHIM_DEPTH=abc" "TSSHIM_DEPTH=0" "TSSHIM_DEPTH=" "TSSHIM_MODE=fast" "TSSHIM_TIMEOUT_MS=-5" \
	"TSSHIM_CACHE_MB=1e3" "TSSHIM_SESSION=../x" "TSSHIM_DATA=relative" "TSSHIM_LOG=loud" \
	"TSSHIM_PYTHON=yes" "TSSHIM_PREFETCH=cold"; do
	var=${bad%%=*}
	o1=$(printf 'x\n' | cat); o2=$(printf 'x\n' | env "$bad" LD_PRELOAD="$TS_PRELOAD" cat 2>"$T_TMP/err"); r=$?
	lines=$(wc -l <"$T_TMP/err")
	if [ "$o1" = "$o2" ] && [ "$r" = 0 ] && [ "$lines" = 1 ] && grep -q "^tsshim\[[0-9]*\]: $var=.* is invalid: expected .*tsshim is off" "$T_TMP/err"; then
		ok "$bad: one clear line, output unchanged"
	else
		not_ok "$bad: stderr was: $(cat "$T_TMP/err")"
	fi
done

# An invalid value also turns membership off: the process runs, joins nothing.
out=$(TSSHIM_DEPTH=abc TSSHIM_SESSION=$(session_name off) LD_PRELOAD="$TS_PRELOAD" "$MEMBER" --hold-ms 0 2>/dev/null)
check "shim off after invalid value: tsshim_join says not supported" [ "${out%% *}" = "join=-95" ]
check "and no segment is created" [ ! -e "$(seg_path "$(session_name off)")" ]

# A misspelt variable: one warning, shim stays on.
err=$(TSSHIM_DEPHT=3 LD_PRELOAD="$TS_PRELOAD" /bin/true 2>&1)
check "misspelt variable: one warning" [ "$(echo "$err" | grep -c 'unknown variable TSSHIM_DEPHT')" = 1 ]

# Loading the shim alone creates nothing and starts no thread. (Segments of
# test runs, t-PID-*, are left out of the count: other scenarios may be
# running beside this one, tests/run.sh. The probe's would be "default".)
segments() { ls /dev/shm | grep "^tsshim\.$(id -u)\." | grep -vc "^tsshim\.$(id -u)\.t-[0-9]*-" || true; }
before=$(segments)
threads=$(LD_PRELOAD="$TS_PRELOAD" "$PY" -c 'import os; print(len(os.listdir("/proc/self/task")))')
check "no thread started by loading the shim" [ "$threads" = 1 ]
after=$(segments)
check "no segment created by loading the shim" [ "$before" = "$after" ]

check "ldd shows no CUDA library" sh -c "! ldd '$BUILD/libtsshim.so' | grep -qiE 'libcuda|libcudart'"
# Exactly the API and the hooks the version script names, nothing of the core.
exported=$(nm -D --defined-only "$BUILD/libtsshim.so" | awk '{print $3}' | sort)
listed=$(sed -n '/global:/,/local:/p' shim/tsshim.map | sed 's,/\*.*\*/,,' | tr ' ;\t' '\n\n\n' |
	grep -E '^[A-Za-z_][A-Za-z0-9_]*$' | grep -vE '^(global|local)$' | sort)
check "exports are exactly the version script's list ($(echo "$exported" | wc -l) symbols)" [ "$exported" = "$listed" ]
check "no core symbol leaks out" sh -c "! nm -D --defined-only '$BUILD/libtsshim.so' | grep -q ' ts_'"

# Log lines: a stderr whose reader is gone (a job piped into head) made the
# first line a SIGPIPE that killed the program (exit -13); a stderr the
# program closed and gave to a file of its own got our lines in that file.
rc=$("$PY" tests/py/log_target.py pipe env LD_PRELOAD="$TS_PRELOAD" TSSHIM_TYPO=1 /bin/true)
check "a line to a stderr whose reader is gone: the program exits as without the shim (status $rc)" [ "$rc" = 0 ]
"$PWD/$BUILD/tsshim-mkdata" --classes 1 --train 1 --val 0 --seed 3 "$T_TMP/logd" >/dev/null 2>&1
jpeg=$(ls "$T_TMP"/logd/train/*/*.jpg | head -n 1)
JPEG=$jpeg LD_PRELOAD="$TS_PRELOAD" TSSHIM_MODE=exact TSSHIM_LOG=info TSSHIM_SESSION="$(session_name logfd)" \
	"$PY" tests/py/log_target.py "$T_TMP/fd2.dat"
check "fd 2 closed and reused for the program's file: none of our lines in it ($(grep -c tsshim "$T_TMP/fd2.dat") lines)" \
	[ "$(cat "$T_TMP/fd2.dat" | tr '\n' ' ')" = "DATA END " ]

finish passthrough
