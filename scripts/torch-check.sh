#!/usr/bin/env bash
# The PyTorch scenarios (pytorch_share, pytorch_exact, exact_batches, layer, fingerprint, stress)
# with another torch than Debian's 1.13, which make test uses: by default
# torch 2.11.0 and torchvision 0.26.0, the versions on the GPU machines
# scripts/gpu-check.sh runs on. They come from PyPI into a virtual
# environment under $BUILD/torch-VERSION (about 4.7 GB with the CUDA
# libraries torch's wheel depends on; 2-3 minutes to fetch, kept for the
# next run); the jobs run on the CPU.
#
#   scripts/torch-check.sh [TORCH_VERSION [TORCHVISION_VERSION]]   after make check-build
#
# Exit 0 when every scenario passes, 1 otherwise.
# TORCH_CHECK_PYTHON=PY runs them with that Python's torch instead (no venv,
# nothing installed: scripts/gpu-device.sh on a GPU machine); TORCH_CHECK_TIMEOUT
# bounds the whole run in seconds (a scenario still running then fails).
set -u
cd "$(dirname "$0")/.." || exit 1
BUILD=${BUILD:-build}
TORCH=${1:-2.11.0}
VISION=${2:-0.26.0}
VENV=$PWD/$BUILD/torch-$TORCH
PY=${TORCH_CHECK_PYTHON:-$VENV/bin/python}

if [ -n "${TORCH_CHECK_PYTHON:-}" ]; then
	"$PY" -c 'import torch, torchvision, PIL' || { echo "torch-check: $PY has no torch, torchvision and PIL"; exit 1; }
elif ! "$PY" -c "import torch, torchvision, PIL; assert torch.__version__.split('+')[0] == '$TORCH'" 2>/dev/null; then
	echo "torch-check: installing torch $TORCH and torchvision $VISION into $VENV (from PyPI, about 4.7 GB)"
	rm -rf "$VENV"
	/usr/bin/python3 -m venv "$VENV" || { echo "torch-check: no venv module (Debian: python3-venv)"; exit 1; }
	"$PY" -m pip install -q --disable-pip-version-check "torch==$TORCH" "torchvision==$VISION" pillow ||
		{ echo "torch-check: pip install failed"; exit 1; }
fi
echo "torch-check: $("$PY" -c 'import sys, torch, torchvision, PIL; print("Python %d.%d, torch %s, torchvision %s, Pillow %s" % (sys.version_info[:2] + (torch.__version__, torchvision.__version__, PIL.__version__)))')"

# As tests/run.sh runs them (an ASan build's shim after the ASan runtime).
export TS_PYTHON=$PY BUILD
TS_PRELOAD="$PWD/$BUILD/libtsshim.so"
if ldd "$BUILD/libtsshim.so" 2>/dev/null | grep -q libasan; then
	TS_PRELOAD="$(${CC:-cc} -print-file-name=libasan.so) $TS_PRELOAD"
	export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:verify_asan_link_order=0}
fi
export TS_PRELOAD
failed=0 end=$((SECONDS + ${TORCH_CHECK_TIMEOUT:-4800}))
mkdir -p "$BUILD/test-logs"
TORCH=$("$PY" -c 'import torch; print(torch.__version__)')
scenarios="pytorch_share pytorch_exact exact_batches layer fingerprint stress"
total=$(set -- $scenarios; echo $#)
for s in $scenarios; do
	log=$BUILD/test-logs/torch-$TORCH-$s.log
	t0=$SECONDS left=$((end - SECONDS))
	[ $left -gt 1200 ] && left=1200
	if [ $left -le 0 ]; then
		failed=$((failed + 1))
		printf 'FAIL  %-28s (not run: out of time)\n' "torch $TORCH: $s"
	elif timeout "$left" bash "tests/scenarios/$s.sh" >"$log" 2>&1; then
		printf 'PASS  %-28s %3ss\n' "torch $TORCH: $s" $((SECONDS - t0))
	else
		failed=$((failed + 1))
		printf 'FAIL  %-28s (log %s)\n' "torch $TORCH: $s" "$log"
		grep -E '^not ok' "$log" | head -n 10 | sed 's/^/      /'
	fi
done
echo "torch-check: $((total - failed)) passed, $failed failed"
[ "$failed" -eq 0 ]
