#!/usr/bin/env bash
# Loader fingerprints (issue 4 item 2): which DataLoaders share. Runs
# tests/py/test_fingerprint.py with Debian's python3 against the layer as
# built (build/python/tsshim_loader.py; the source if not built): same key in
# another process, loader settings ignored, train/val, transforms, sampler
# kinds, collate, refusals with their reason, subclasses.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh

PY=${TS_PYTHON:-/usr/bin/python3} # TS_PYTHON: another Python with torch (another torch version)
[ -x "$PY" ] || { echo "needs $PY"; exit 77; }
"$PY" -c 'import torch, torchvision, PIL' 2>/dev/null || { echo "python3-torch/torchvision/pil not installed"; exit 77; }

PYDIR=$PWD/shim/python
[ -f "$BUILD/python/tsshim_loader.py" ] && PYDIR=$(realpath "$BUILD/python")

if TSSHIM_PYDIR="$PYDIR" "$PY" tests/py/test_fingerprint.py >"$T_TMP/out" 2>&1; then
	ok "fingerprint unit tests ($(grep -oE '^Ran [0-9]+ tests in [0-9.]+s' "$T_TMP/out"), layer from $PYDIR)"
else
	not_ok "fingerprint unit tests (layer from $PYDIR)"
	sed 's/^/#   /' "$T_TMP/out"
fi
finish fingerprint
