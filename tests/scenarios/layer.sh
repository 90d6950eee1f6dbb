#!/usr/bin/env bash
# The PyTorch layer's own private loaders, in a plain Python process (no shim,
# no feed): tests/py/test_layer.py with Debian's python3 against the layer as
# built (build/python; the source if not built). A private loader the layer
# drops has its workers taken out of torch's SIGCHLD watch first: one that dies
# on its way out (case dw under make asan: SIGABRT) must not raise in the job.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh

PY=${TS_PYTHON:-/usr/bin/python3} # TS_PYTHON: another Python with torch (another torch version)
[ -x "$PY" ] || { echo "needs $PY"; exit 77; }
"$PY" -c 'import torch' 2>/dev/null || { echo "python3-torch not installed"; exit 77; }

PYDIR=$PWD/shim/python
[ -f "$BUILD/python/tsshim_feed.py" ] && PYDIR=$(realpath "$BUILD/python")

if TSSHIM_PYDIR="$PYDIR" "$PY" tests/py/test_layer.py >"$T_TMP/out" 2>&1; then
	ok "layer unit tests ($(grep -oE '^Ran [0-9]+ tests in [0-9.]+s' "$T_TMP/out"), layer from $PYDIR)"
else
	not_ok "layer unit tests (layer from $PYDIR)"
	sed 's/^/#   /' "$T_TMP/out"
fi
finish layer
