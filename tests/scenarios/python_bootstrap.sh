#!/usr/bin/env bash
# The Python bootstrap (issue 4 item 1): under the shim a Python interpreter
# loads our sitecustomize from PYTHONPATH, which runs the sitecustomize it
# shadows, gives the program (and its children) the user's PYTHONPATH back,
# and hooks torch.utils.data when, and only when, the program imports it.
# Silent and absent where it must be: TSSHIM_PYTHON=0, shim off, shim not
# loaded, non-Python programs. Start-up cost is measured and reported.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh

SYS_PY=/usr/bin/python3
[ -x "$SYS_PY" ] || { echo "needs $SYS_PY"; exit 77; }
[ -f "$BUILD/python/sitecustomize.py" ] || { echo "needs $BUILD/python (make all)"; exit 1; }
OURDIR=$(realpath "$BUILD/python")

# Python interpreters to test: Debian's, and python3 from PATH (pyenv here:
# a bash shim that execs the real one) when it is another interpreter.
PYS=("$SYS_PY")
PATH_PY=$(command -v python3 || true)
if [ -n "$PATH_PY" ] && [ "$("$PATH_PY" -c 'import sys; print(sys.executable)' 2>/dev/null)" != \
	"$("$SYS_PY" -c 'import sys; print(sys.executable)')" ]; then
	PYS+=("$PATH_PY")
fi

# A clean environment for every run: no PYTHONPATH, no leftover of ours.
CLEAN=(env -u PYTHONPATH -u _TSSHIM_ORIG_PYTHONPATH -u TSSHIM_PYTHON -u TSSHIM_LOG -u TSSHIM_MODE)
shim() { "${CLEAN[@]}" LD_PRELOAD="$TS_PRELOAD" "$@"; }
plain() { "${CLEAN[@]}" "$@"; }

# Python snippets: is our finder installed, where does sitecustomize come from.
HOOKED='any(getattr(f, "_tsshim_finder", False) for f in sys.meta_path)'
SC_FILE='getattr(sys.modules.get("sitecustomize"), "__file__", None)'

# A user sitecustomize (found on the user's PYTHONPATH) that records what it
# saw: our finder already installed, PYTHONPATH already the user's.
mkdir -p "$T_TMP/user" "$T_TMP/apport" "$T_TMP/bad" "$T_TMP/badimp"
cat >"$T_TMP/user/sitecustomize.py" <<EOF
import os, sys
sys._user_sc = ($HOOKED, os.environ.get("PYTHONPATH"))
EOF
# Debian's sitecustomize imports apport_python_hook and calls install(): a
# fake one on PYTHONPATH makes its run observable.
cat >"$T_TMP/apport/apport_python_hook.py" <<'EOF'
import sys
def install():
    sys._apport_installed = True
EOF
printf 'import sys\nsys._bad_ran = True\nraise ValueError("boom from user sitecustomize")\n' >"$T_TMP/bad/sitecustomize.py"
printf 'import no_such_module_tsshim_test\n' >"$T_TMP/badimp/sitecustomize.py"
mkdir -p "$T_TMP/late"
: >"$T_TMP/late/sitecustomize.py"

for PY in "${PYS[@]}"; do
	n=$(basename "$PY")
	if [ "$PY" = "$SYS_PY" ]; then n="debian $n"; else n="PATH $n"; fi

	# --- our sitecustomize runs, the shadowed one too, in that order ---------
	out=$(shim "$PY" -c "import sys; print($HOOKED, $SC_FILE, sys.path.count('$OURDIR'))")
	SHADOW=$(plain "$PY" -c "import sys; print($SC_FILE)")
	# With nothing to shadow (pyenv), none, as without us (it was ours)
	check "$n: our finder is installed; sitecustomize module as without the shim ($SHADOW)" \
		[ "$out" = "True $SHADOW 1" ]
	# ... and a later import of sitecustomize (ours was found again, and a
	# program's own put on sys.path later never ran)
	LATE='import sys; sys.path.insert(0, sys.argv[1])
try:
    import sitecustomize; print(sitecustomize.__file__)
except ImportError as e:
    print(type(e).__name__, e)'
	want=$(plain "$PY" -c "$LATE" "$T_TMP/late")
	check "$n: a later import sitecustomize finds what it finds without the shim ($want)" \
		[ "$(shim "$PY" -c "$LATE" "$T_TMP/late")" = "$want" ]
	out=$(shim PYTHONPATH="$T_TMP/user" "$PY" -c "import sys; print(sys._user_sc, $SC_FILE)")
	check "$n: shadowed user sitecustomize ran after ours, saw the user's PYTHONPATH ($out)" \
		[ "$out" = "(True, '$T_TMP/user') $T_TMP/user/sitecustomize.py" ]
	if [ "$PY" = "$SYS_PY" ] && [ "$SHADOW" != None ]; then
		out=$(shim PYTHONPATH="$T_TMP/apport" "$PY" -c "import sys; print(getattr(sys, '_apport_installed', False), $HOOKED)")
		check "$n: Debian's sitecustomize ran (its apport hook installed) and ours too" [ "$out" = "True True" ]
	fi

	# --- PYTHONPATH: the program and its children see the user's value ------
	PP='import os; print(repr(os.environ.get("PYTHONPATH")), "_TSSHIM_ORIG_PYTHONPATH" in os.environ)'
	check "$n: PYTHONPATH unset stays unset" [ "$(shim "$PY" -c "$PP")" = "None False" ]
	check "$n: PYTHONPATH='' stays ''" [ "$(shim PYTHONPATH= "$PY" -c "$PP")" = "'' False" ]
	check "$n: PYTHONPATH=/a:/b stays /a:/b" [ "$(shim PYTHONPATH=/a:/b "$PY" -c "$PP")" = "'/a:/b' False" ]
	CHILD='import subprocess, sys; subprocess.run([sys.executable, "-c", sys.argv[1]], check=True)'
	KID="import os, sys; print(repr(os.environ.get('PYTHONPATH')), sys.path.count('$OURDIR'), $HOOKED)"
	check "$n: a child python sees the user's PYTHONPATH (unset), bootstrapped once" \
		[ "$(shim "$PY" -c "$CHILD" "$KID")" = "None 1 True" ]
	check "$n: a child python sees the user's PYTHONPATH (/a:/b), bootstrapped once" \
		[ "$(shim PYTHONPATH=/a:/b "$PY" -c "$CHILD" "$KID")" = "'/a:/b' 1 True" ]
	# A parent started with -S never restores: its child must not get our
	# directory twice, and still ends with the user's value.
	check "$n: child of a 'python -S' parent: prefix not doubled, user's PYTHONPATH" \
		[ "$(shim PYTHONPATH=/a "$PY" -S -c "$CHILD" "$KID")" = "'/a' 1 True" ]
	# -E and -I ignore PYTHONPATH, -S never imports sitecustomize (which would
	# restore it): the environment stays the user's for the program and the
	# children it starts (before, PYTHONPATH was our directory in all five).
	for flags in -S -E -I -Es "-W ignore -E"; do
		# shellcheck disable=SC2086
		check "$n: python $flags: PYTHONPATH unset stays unset" [ "$(shim "$PY" $flags -c "$PP")" = "None False" ]
	done
	check "$n: python -E: PYTHONPATH=/a:/b stays /a:/b" [ "$(shim PYTHONPATH=/a:/b "$PY" -E -c "$PP")" = "'/a:/b' False" ]
	out=$(shim PYTHONPATH=/a:/b "$PY" -c 'import subprocess; subprocess.run(["/bin/sh", "-c", "echo \"${PYTHONPATH-unset}\""])')
	check "$n: a shell started by the program sees the user's PYTHONPATH ($out)" [ "$out" = /a:/b ]
	out=$(cd / && shim "$PY" -c 'import sys; print([p for p in sys.path if "tsshim" in p or p.endswith("/python")][:1])')
	check "$n: our sys.path entry is absolute ($out)" [ "$out" = "['$OURDIR']" ]

	# --- absent where it must be ---------------------------------------------
	ABSENT="import sys; print($HOOKED, sys.path.count('$OURDIR'), $SC_FILE)"
	check "$n: TSSHIM_PYTHON=0: not loaded" [ "$(shim TSSHIM_PYTHON=0 "$PY" -c "$ABSENT")" = "False 0 $SHADOW" ]
	check "$n: TSSHIM_MODE=off: not loaded" [ "$(shim TSSHIM_MODE=off "$PY" -c "$ABSENT")" = "False 0 $SHADOW" ]
	check "$n: TSSHIM_DEPTH=abc (shim off): not loaded" \
		[ "$(shim TSSHIM_DEPTH=abc "$PY" -c "$ABSENT" 2>/dev/null)" = "False 0 $SHADOW" ]
	# Our directory inherited on PYTHONPATH by a python without the shim:
	# silent, no hook, the shadowed sitecustomize still runs.
	out=$(plain PYTHONPATH="$OURDIR:$T_TMP/user" "$PY" -c "import sys; print($HOOKED, sys._user_sc[0])" 2>"$T_TMP/err")
	check "$n: shim not loaded, our directory on PYTHONPATH: no hook, shadowed ran, silent" \
		[ "$out:$(cat "$T_TMP/err")" = "False False:" ]
	out=$(shim TSSHIM_LOG=debug "$PY" -c 'import sys, json; print("torch" in sys.modules, "tsshim_hook" in sys.modules)' 2>"$T_TMP/err")
	check "$n: a program that never imports torch: no torch, no tsshim_hook imported" [ "$out" = "False False" ]
	check "$n: and at debug level the bootstrap says where it came from" grep -q "python: bootstrap from $OURDIR" "$T_TMP/err"
	out=$(shim "$PY" -c 'print(1)' 2>"$T_TMP/err")
	check "$n: silent at the default log level" [ "$out:$(cat "$T_TMP/err")" = "1:" ]

	# --- errors in the shadowed sitecustomize: exactly as without us ---------
	for d in bad badimp; do
		o1=$(plain PYTHONPATH="$T_TMP/$d" "$PY" -c 'import sys; print("main ran", getattr(sys, "_bad_ran", None))' 2>"$T_TMP/e1"); r1=$?
		o2=$(shim PYTHONPATH="$T_TMP/$d" "$PY" -c 'import sys; print("main ran", getattr(sys, "_bad_ran", None))' 2>"$T_TMP/e2"); r2=$?
		if [ "$o1" = "$o2" ] && [ "$r1" = "$r2" ] && cmp -s "$T_TMP/e1" "$T_TMP/e2" && grep -q "Error in sitecustomize" "$T_TMP/e1"; then
			ok "$n: failing user sitecustomize ($d): same stdout, stderr, status"
		else
			not_ok "$n: failing user sitecustomize ($d): '$o1' vs '$o2', $r1 vs $r2"; diff "$T_TMP/e1" "$T_TMP/e2" | head -5
		fi
	done

	# --- the bootstrap run twice: one finder ---------------------------------
	# (by path: a later import sitecustomize no longer finds ours)
	TWICE="import sys, runpy
try:
    runpy.run_path('$OURDIR/sitecustomize.py', run_name='sitecustomize')
except ImportError:
    pass
print(sum(getattr(f, '_tsshim_finder', False) for f in sys.meta_path))"
	check "$n: sitecustomize imported again: still one finder" [ "$(shim "$PY" -c "$TWICE")" = 1 ]
done

# --- Python 2: not bootstrapped (our sitecustomize is Python 3's): its own
# sitecustomize runs and PYTHONPATH is the user's, as without the shim (before,
# neither: our module failed to import, which Python 2's site.py passes over)
PY2=
for p in $(command -v python2.7 python2 2>/dev/null) "$HOME"/.pyenv/versions/2*/bin/python2.7; do
	[ -x "$p" ] && "$p" -c pass 2>/dev/null && { PY2=$p; break; }
done
if [ -n "$PY2" ]; then
	P2='import os, sys; print(getattr(sys, "_user_sc", None) is not None, os.environ.get("PYTHONPATH"), "_TSSHIM_ORIG_PYTHONPATH" in os.environ)'
	mkdir -p "$T_TMP/user2"
	printf 'import sys\nsys._user_sc = 1\n' >"$T_TMP/user2/sitecustomize.py"
	want=$(plain PYTHONPATH="$T_TMP/user2" "$PY2" -c "$P2" 2>&1)
	check "python 2 ($PY2): its sitecustomize ran, PYTHONPATH the user's, as without the shim ($want)" \
		[ "$(shim PYTHONPATH="$T_TMP/user2" "$PY2" -c "$P2" 2>&1)" = "$want" ]
	# A Python 2 under a name bootstrap.c takes for 3's (a virtualenv's copy
	# named python): the environment it would set, by hand. Our module then
	# gives PYTHONPATH back and runs the user's sitecustomize; without one,
	# it fails as a missing module does, which site.py passes over.
	got=$(plain PYTHONPATH="$OURDIR:$T_TMP/user2" _TSSHIM_ORIG_PYTHONPATH="$T_TMP/user2" "$PY2" -c "$P2" 2>&1)
	check "python 2 bootstrapped all the same: its sitecustomize ran, PYTHONPATH the user's ($got)" [ "$got" = "$want" ]
	want=$(plain "$PY2" -c "$P2" 2>&1)
	got=$(plain PYTHONPATH="$OURDIR" "$PY2" -c "$P2" 2>&1)
	check "python 2 bootstrapped, no sitecustomize of its own: as without the shim ($got)" [ "$got" = "$want" ]
else
	echo "# no Python 2: its check skipped"
fi

# --- a non-Python program sees PYTHONPATH unchanged -------------------------------
check "sh under the shim: PYTHONPATH unset stays unset" \
	[ "$(shim /bin/sh -c 'echo "${PYTHONPATH-unset}"')" = unset ]
check "sh under the shim: PYTHONPATH=/a:/b unchanged" \
	[ "$(shim PYTHONPATH=/a:/b /bin/sh -c 'echo "${PYTHONPATH-unset} ${_TSSHIM_ORIG_PYTHONPATH-none}"')" = "/a:/b none" ]

# --- torch: the hook fires on import, once, and leaves no trace --------------------
if plain "$SYS_PY" -c 'import torch.utils.data' 2>/dev/null; then
	T='import sys, torch.utils.data as d
print(d.DataLoader.__dict__.get("_tsshim_hooked"), '"$HOOKED"', type(d.__loader__).__name__, type(d.__spec__.loader).__name__)'
	check "import torch.utils.data: DataLoader hooked, finder gone, real loader back" \
		[ "$(shim "$SYS_PY" -c "$T")" = "True False SourceFileLoader SourceFileLoader" ]
	check "import torch: DataLoader hooked" \
		[ "$(shim "$SYS_PY" -c 'import torch; print(torch.utils.data.DataLoader._tsshim_hooked)')" = True ]
	check "TSSHIM_PYTHON=0: DataLoader not hooked" \
		[ "$(shim TSSHIM_PYTHON=0 "$SYS_PY" -c 'import torch; print(hasattr(torch.utils.data.DataLoader, "_tsshim_hooked"))')" = False ]
	out=$(shim TSSHIM_LOG=debug "$SYS_PY" -c "import torch; $TWICE" 2>"$T_TMP/err")
	check "bootstrap run again after torch: no finder left, hooked once" \
		[ "$out:$(grep -c 'DataLoader hooked' "$T_TMP/err")" = "0:1" ]
	check "torch under the shim: silent at the default log level" \
		[ -z "$(shim "$SYS_PY" -c 'import torch' 2>&1)" ]
else
	echo "# torch not importable by $SYS_PY: torch checks skipped"
fi

# --- start-up cost: report medians, assert nothing (machines are noisy; make bench
# measures it, this is a glance: 5 runs each) --------------------------------------
# PYTHONDONTWRITEBYTECODE (if set) makes Python compile our files at every
# start; it is reported so the numbers can be read.
# The real interpreter, not a pyenv shim (bash would dominate the numbers).
for PY in "${PYS[@]}"; do
	PY=$("$PY" -c 'import sys; print(sys.executable)')
	"${CLEAN[@]}" "$SYS_PY" - "$PY" "$TS_PRELOAD" <<'EOF'
import os, statistics, subprocess, sys, time
py, preload = sys.argv[1], sys.argv[2]
def median_ms(args, extra):
    env = dict(os.environ, **extra)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        subprocess.run([py] + args, env=env, check=True)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)
shim, off = {"LD_PRELOAD": preload}, {"LD_PRELOAD": preload, "TSSHIM_PYTHON": "0"}
parts = []
for flag in ([], ["-S"], ["-I"]):
    a = flag + ["-c", "pass"]
    parts.append("%-3s plain %.1f, shim+TSSHIM_PYTHON=0 %.1f, shim %.1f" % (
        " ".join(flag) or "-", median_ms(a, {}), median_ms(a, off), median_ms(a, shim)))
print("# start-up of %s -c pass, median of 5 (ms; -S/-I: no bootstrap, -I ignores PYTHONPATH; "
      "PYTHONDONTWRITEBYTECODE=%s):" % (py, os.environ.get("PYTHONDONTWRITEBYTECODE", "")))
for p in parts:
    print("#   " + p)
EOF
done

finish python_bootstrap
