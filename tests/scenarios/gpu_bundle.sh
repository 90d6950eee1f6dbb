#!/usr/bin/env bash
# scripts/gpu-device.sh, which runs the GPU checks on a lent GPU machine that
# has the driver, CUDA and torch but none of the build's libraries: its
# bundle holds every program and file those checks name, and nothing in it
# needs a library beyond glibc, CUDA and the bundle (a program that does is
# named, and no bundle is made); `run` on a machine without a usable GPU
# exits 77 at once and says so in its log; without a bundle it exits 2.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh

DEV=scripts/gpu-device.sh
B=$T_TMP/bundle

GPU_BUNDLE=$B bash "$DEV" bundle >"$T_TMP/bundle.out" 2>&1
rc=$?
# make asan / make tsan: such a build is refused, by name, and what follows
# needs a bundle: make test checks it with the plain build
if ldd "$BUILD/libtsshim.so" 2>/dev/null | grep -Eq 'lib[at]san\.so'; then
	check "bundle: a sanitizer build is refused ($(head -n 1 "$T_TMP/bundle.out")), exit 2 ($rc)" \
		cond "[ $rc = 2 ] && grep -q 'is a sanitizer build (it needs lib[at]san' '$T_TMP/bundle.out' && [ ! -e '$B' ]"
	echo "# the bundle's other checks need the plain build (make test)"
	finish gpu_bundle
	exit
fi
check "bundle: made (exit $rc: $(tail -n 2 "$T_TMP/bundle.out" | head -n 1))" test $rc = 0

# every $BUILD/PATH the checks it runs name (gpu-check.sh; the PyTorch
# scenarios, as torch-check.sh runs them) is in the bundle, where the build
# has it (ts-train-cudart-static only make gpu-bundle builds)
missing=
for p in $(grep -ho '\$BUILD/[A-Za-z0-9_./-]*' scripts/gpu-check.sh tests/lib.sh tests/scenarios/pytorch_share.sh \
	tests/scenarios/pytorch_exact.sh tests/scenarios/fingerprint.sh tests/scenarios/stress.sh | sort -u); do
	p=${p#\$BUILD/}
	[ -e "$B/$p" ] || { [ "$p" = tests/ts-train-cudart-static ] && [ ! -e "$BUILD/$p" ]; } || missing="$missing $p"
done
check "bundle: holds every program the GPU and PyTorch checks name (missing:${missing:- none})" test -z "$missing"
check "bundle: libjpeg.so.62 is in it, and the programs find it there" \
	cond "[ -f '$B/lib/libjpeg.so.62' ] && LD_LIBRARY_PATH='$B/lib' ldd '$B/tsshim-train' | grep -q '$B/lib/libjpeg.so.62'"

# a build whose tsshim-verify needs Criterion (a unit suite stands in for it):
# named, exit 2, no bundle claimed
FB=$T_TMP/fakebuild
mkdir -p "$FB/tests"
for f in libtsshim.so tsshim-train tsshim-mkdata tsshim-inspect python emu; do ln -s "$PWD/$BUILD/$f" "$FB/$f"; done
for f in ts-cudaemu-check ts-train-linked; do ln -s "$PWD/$BUILD/tests/$f" "$FB/tests/$f"; done
ln -s "$PWD/$BUILD/tests/test_hash" "$FB/tsshim-verify"
BUILD=$FB GPU_BUNDLE=$T_TMP/fb bash "$DEV" bundle >"$T_TMP/fb.out" 2>&1
rc=$?
check "bundle: a program that needs another library is named ($(grep -m1 needs "$T_TMP/fb.out")), exit 2 ($rc)" \
	cond "[ $rc = 2 ] && grep -q '^tsshim-verify needs libcriterion' '$T_TMP/fb.out'"

# run on a machine whose nvidia-smi lists no GPU: 77 at once, said in device.log
mkdir -p "$T_TMP/bin"
printf '#!/bin/sh\nexit 0\n' >"$T_TMP/bin/nvidia-smi"
chmod +x "$T_TMP/bin/nvidia-smi"
t0=$SECONDS
PATH=$T_TMP/bin:$PATH OUT=$T_TMP/out GPU_BUNDLE=$B timeout 120 bash "$DEV" run >"$T_TMP/run.out" 2>&1
rc=$?
check "run without a GPU: exit 77 ($rc) in $((SECONDS - t0)) s" test $rc = 77
check "run without a GPU: device.log says why, and that phase 2 did not run" \
	cond "grep -q 'gpu-check: skipped: nvidia-smi lists no GPU' '$T_TMP/out/device.log' &&
		grep -q 'phase 2 skipped: no usable GPU' '$T_TMP/out/device.log'"

OUT=$T_TMP/out2 GPU_BUNDLE=$T_TMP/none bash "$DEV" run >"$T_TMP/none.out" 2>&1
rc=$?
check "run without a bundle: exit 2 ($rc), says so" cond "[ $rc = 2 ] && grep -q 'no bundle at' '$T_TMP/none.out'"
bash "$DEV" --help >"$T_TMP/help.out" 2>&1
rc=$?
check "--help: the three verbs, exit 0 ($rc)" \
	cond "[ $rc = 0 ] && grep -q 'gpu-device.sh bundle' '$T_TMP/help.out' && grep -q 'gpu-device.sh try' '$T_TMP/help.out'"

finish gpu_bundle
