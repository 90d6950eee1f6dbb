# Shared helpers for the scenario scripts (sourced, not run).
# Each scenario prints "ok - ..." / "not ok - ..." per check and ends with
# "NAME: N passed, M failed"; its exit status is 0 only if nothing failed.

BUILD=${BUILD:-build}
TS_PRELOAD=${TS_PRELOAD:-$PWD/$BUILD/libtsshim.so}
INSPECT=$PWD/$BUILD/tsshim-inspect
MEMBER=$PWD/$BUILD/tests/ts-member
T_PASSED=0
T_FAILED=0
T_PIDS=()
T_TMP=$(mktemp -d /tmp/tsshim-test.XXXXXX)

ok() { T_PASSED=$((T_PASSED + 1)); echo "ok - $*"; }
not_ok() { T_FAILED=$((T_FAILED + 1)); echo "not ok - $*"; }
# cond 'A && B': a compound condition for check (check runs one command:
# `check D a && b` would test only a).
cond() { eval "$1"; }

check() { # description, command...; returns the command's verdict (check ... || show details)
	local d=$1; shift
	if "$@"; then ok "$d"; else not_ok "$d"; return 1; fi
}

finish() { # scenario name
	if [ "$T_FAILED" -ne 0 ] && [ -s "$T_TMP/stderr" ]; then
		echo "# members' stderr:"; sed 's/^/#   /' "$T_TMP/stderr"
	fi
	echo "$1: $T_PASSED passed, $T_FAILED failed"
	[ "$T_FAILED" -eq 0 ]
}

# our_child PID: is PID a child of this shell still, not a number the kernel
# has handed to another process since ours exited and was reaped? pid_max is
# often 32768 and a test run starts that many processes in minutes (every
# grep and sleep of a wait loop): the other lane's processes get our old
# numbers. Until we reap it, a child's number cannot be reused, so a yes
# here stays true until our own wait.
our_child() {
	local st
	read -r st 2>/dev/null <"/proc/$1/stat" || return 1
	st=${st##*) } # "STATE PPID ...", past "PID (COMM) "
	st=${st#* }
	[ "${st%% *}" = "$$" ]
}

cleanup() {
	local p i alive mine=()
	# Only what is still ours: a kill of a number from T_PIDS whose process
	# ended long ago hit whatever process of the other lane had it by then
	# (CI: scenario/shmfull's share_verify, "Terminated", as scenario/
	# pytorch_share ended beside it).
	for p in "${T_PIDS[@]}"; do our_child "$p" && mine+=("$p"); done
	# TERM first: a job started as `timeout N CMD` passes it on to CMD, while
	# KILL would end only timeout and leave CMD running. What is left after
	# 2 s is killed.
	for p in "${mine[@]}"; do kill -TERM "$p" 2>/dev/null; done
	for ((i = 0; i < 20; i++)); do
		alive=
		for p in "${mine[@]}"; do our_child "$p" && alive=1; done
		[ -n "$alive" ] || break
		sleep 0.1
	done
	for p in "${mine[@]}"; do kill -KILL "$p" 2>/dev/null; done
	wait 2>/dev/null
	# This run's sessions, feeds and caches, also those of members that were
	# killed (they cannot remove their files).
	rm -f /dev/shm/tsshim."$(id -u)".t-"$$"-* /dev/shm/tsshim-feed."$(id -u)".t-"$$"-* \
		/dev/shm/tsshim-cache."$(id -u)".t-"$$"-* 2>/dev/null
	[ -n "${T_KEEP:-}" ] && cp -r "$T_TMP" "$T_KEEP" 2>/dev/null; rm -rf "$T_TMP"
}
trap cleanup EXIT

# Unique session name for this scenario run.
session_name() { echo "t-$$-$1"; }

# Start a member in the background: start_member VAR SESSION [args...]
# Sets VAR to its pid; its stdout goes to $T_TMP/<pid>.out.
start_member() {
	local __var=$1 sess=$2; shift 2
	T_NMEMBERS=$((${T_NMEMBERS:-0} + 1))
	local out="$T_TMP/member$T_NMEMBERS.out"
	LD_PRELOAD="$TS_PRELOAD" TSSHIM_SESSION="$sess" "$MEMBER" "$@" >"$out" 2>>"$T_TMP/stderr" &
	local pid=$!
	T_PIDS+=("$pid")
	# The child opens $out itself, maybe only after we get here: never rename
	# it, point a pid-named link at it.
	ln -s "$out" "$T_TMP/$pid.out"
	printf -v "$__var" '%s' "$pid"
}

# wait_for FILE PATTERN [TIMEOUT_S]: wait until FILE has a line matching
# PATTERN. A wait that runs out says so in the log: a case that stopped a job
# for the wait (gpu_share case 20) fails later, far from its cause.
wait_for() {
	local f=$1 pat=$2 t=${3:-10} i
	for ((i = 0; i < t * 100; i++)); do
		grep -qE "$pat" "$f" 2>/dev/null && return 0
		sleep 0.01
	done
	echo "# waited ${t} s in vain for /$pat/ in ${f#"$T_TMP"/}"
	return 1
}

# layer_py_tests LABEL SCRIPT [MODULES]: one check for a unittest SCRIPT of
# tests/py, run with Debian's python3 (TS_PYTHON: another Python with torch)
# against the PyTorch layer as built (build/python; the source if not built).
# Exits 77 (skip) without that Python or its MODULES (default torch).
# need_python MODULES: PY, the Python the PyTorch scenarios run (TS_PYTHON, or
# Debian's), or skip (exit 77) when it cannot import MODULES ("torch, torchvision").
need_python() {
	PY=${TS_PYTHON:-/usr/bin/python3}
	"$PY" -c "import $1" 2>/dev/null || { echo "$PY cannot import $1"; exit 77; }
}

layer_py_tests() {
	local label=$1 script=$2 mods=${3:-torch} py=${TS_PYTHON:-/usr/bin/python3} dir=$PWD/shim/python
	[ -x "$py" ] || { echo "needs $py"; exit 77; }
	"$py" -c "import $mods" 2>/dev/null || { echo "$py cannot import $mods"; exit 77; }
	[ -f "$BUILD/python/tsshim_feed.py" ] && dir=$(realpath "$BUILD/python")
	if TSSHIM_PYDIR="$dir" "$py" "$script" >"$T_TMP/out" 2>&1; then
		ok "$label ($(grep -oE '^Ran [0-9]+ tests in [0-9.]+s' "$T_TMP/out"), layer from $dir)"
	else
		not_ok "$label (layer from $dir)"
		sed 's/^/#   /' "$T_TMP/out"
	fi
}

# Last role a member printed: producer | consumer | worker | none.
last_role() {
	grep -oE 'role=[a-z]+' "$T_TMP/$1.out" | tail -n 1 | cut -d= -f2
}

# json_query SESSION PYTHON_EXPR: evaluate EXPR with `s` = inspect's session object.
json_query() {
	"$INSPECT" "$1" --json | python3 -c "import json,sys; s=json.load(sys.stdin)['session']; print($2)"
}

seg_path() { echo "/dev/shm/tsshim.$(id -u).$1"; }

# imagefolder_data: what the scenarios running tests/py/imagefolder_job.py
# need: PY (Debian's python3; TS_PYTHON: another Python with torch), JOB,
# MKDATA, and DATA, a small ImageFolder (4 classes of 12 JPEGs) made under
# $T_TMP/data. Exits 77 (skip) without torch/torchvision/Pillow or tsshim-mkdata.
imagefolder_data() {
	PY=${TS_PYTHON:-/usr/bin/python3}
	"$PY" -c 'import torch, torchvision, PIL' 2>/dev/null || { echo "python3-torch/torchvision/pil not installed"; exit 77; }
	JOB="$PWD/tests/py/imagefolder_job.py"
	MKDATA="$PWD/$BUILD/tsshim-mkdata"
	[ -x "$MKDATA" ] || { echo "needs $MKDATA"; exit 77; }
	"$MKDATA" --classes 4 --train 12 --val 1 --seed 7 "$T_TMP/data" >/dev/null 2>&1 || { echo "mkdata failed"; exit 1; }
	DATA="$T_TMP/data/train"
}
