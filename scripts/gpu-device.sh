#!/usr/bin/env bash
# The GPU checks in one call on a lent GPU machine (the workplace's `device`
# tool): a bare machine with the NVIDIA driver, CUDA 13 and a python3 that
# holds torch, but none of our build dependencies (liburing, libjpeg-turbo,
# Criterion) and no network. So the programs are built here and carried.
#
#   scripts/gpu-device.sh bundle   here: make the bundle, $BUILD/gpu-bundle
#                                  (the programs, the shim, the test device,
#                                  the helpers, and libjpeg.so.62), and check
#                                  that nothing in it needs another library
#   scripts/gpu-device.sh run      there, in the repository root:
#       run(command="bash scripts/gpu-device.sh run", carry=["build/gpu-bundle"], timeout_s=590)
#   scripts/gpu-device.sh try      here: `run` against the test device, with
#                                  stand-ins for nvidia-smi and CUDA_HOME
#
# `run` makes no build and installs nothing. It writes what it finds and
# does under $OUT (the device tool brings that folder back; without $OUT,
# $BUILD/gpu-bundle/out): device.log (the machine, where the CUDA libraries
# are, then both phases' output), gpu-check.tgz (every job's record and
# stderr) and torch-logs.tgz.
#   1. scripts/gpu-check.sh against real CUDA: case 0 (tsemu's semantics on
#      this GPU) first, then the tsshim-train and PyTorch jobs.
#   2. In the time left (GPU_DEVICE_LIMIT_S, 540 s in all): the PyTorch
#      scenarios with that machine's torch (CPU jobs), as `make torch-check`
#      runs them with torch 2.11 from PyPI. GPU_DEVICE_TORCH=0 skips them.
# Exit: gpu-check's status (0, 1, or 77 with no usable GPU), or 2 when the
# bundle is missing or incomplete.
set -u
cd "$(dirname "$0")/.." || exit 2
BUILD=${BUILD:-build}
# (GPU_BUNDLE names another place for it; the scripts it runs take it as
# their BUILD, relative to the repository)
BUNDLE=$(realpath -m "${GPU_BUNDLE:-$BUILD/gpu-bundle}")
BUNDLE_REL=$(realpath -m --relative-to=. "$BUNDLE")

die() { echo "gpu-device: $*" >&2; exit 2; }
TMPDIRS=()
trap 'rm -rf "${TMPDIRS[@]}"' EXIT

# Programs and libraries the checks run, relative to $BUILD
bundle_files() {
	(cd "$BUILD" && ls -d libtsshim.so tsshim-* emu python tests/ts-* tests/lib*.so \
		tests/cudainterp tests/cudart12 tests/cudartnov tests/jpegfake 2>/dev/null)
}

# ELF files of the bundle whose libraries resolve outside glibc, CUDA and the
# bundle itself: one line each (the check that the bundle runs where only
# the driver and CUDA are)
foreign_needs() {
	local f lib
	find "$BUNDLE" -path "$BUNDLE/out" -prune -o -type f -print | while read -r f; do
		head -c 4 "$f" 2>/dev/null | grep -q 'ELF' || continue
		LD_LIBRARY_PATH=$BUNDLE/lib ldd "$f" 2>/dev/null | while read -r lib _ path _; do
			case $lib in
			linux-vdso.so.*|/lib64/ld-linux-x86-64.so.*|libc.so.6|libm.so.6|libdl.so.2|libpthread.so.0|librt.so.1) ;;
			libcuda.so.1|libcudart.so.*|statically) ;;
			*) case $path in "$BUNDLE"/*) ;; *) echo "${f#"$BUNDLE"/} needs $lib ($path)" ;; esac ;;
			esac
		done
	done
}

make_bundle() {
	local f san
	for f in libtsshim.so tsshim-train tsshim-verify tsshim-mkdata tests/ts-cudaemu-check \
		tests/ts-train-linked python emu; do
		[ -e "$BUILD/$f" ] || die "$BUILD/$f not built (make gpu-bundle builds what it needs)"
	done
	# a sanitizer build needs its runtimes, which the GPU machines lack: the
	# plain build goes
	san=$(ldd "$BUILD/libtsshim.so" 2>/dev/null | grep -Eo 'lib[at]san\.so[.0-9]*' | head -n 1)
	[ -z "$san" ] || die "$BUILD is a sanitizer build (it needs $san): bundle the plain build (make gpu-bundle)"
	# (built by make gpu-bundle where the toolkit has libcudart_static.a)
	[ -e "$BUILD/tests/ts-train-cudart-static" ] ||
		echo "gpu-device: no $BUILD/tests/ts-train-cudart-static: gpu-check's case 8 (static runtime) will not run"
	rm -rf "$BUNDLE"
	mkdir -p "$BUNDLE/lib" "$BUNDLE/tests"
	# (links copied as files: a link travels to the device as a link)
	bundle_files | while read -r f; do cp -rL "$BUILD/$f" "$BUNDLE/$f" || exit 1; done || die "copying failed"
	# libjpeg-turbo's library, as the programs were linked against it (the
	# GPU machines' image is not Debian: its libjpeg, if any, is another ABI)
	f=$(ldd "$BUILD/tsshim-train" | awk '$1 == "libjpeg.so.62" { print $3 }')
	[ -f "$f" ] || die "tsshim-train is not linked against libjpeg.so.62"
	cp -L "$f" "$BUNDLE/lib/libjpeg.so.62" || die "copying $f failed"
	local foreign glibc
	foreign=$(foreign_needs)
	[ -z "$foreign" ] || { echo "$foreign" >&2; die "the bundle needs libraries it does not hold"; }
	glibc=$(find "$BUNDLE" -type f -exec objdump -T {} + 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1)
	echo "gpu-device: $BUNDLE_REL: $(du -sh "$BUNDLE" | cut -f1), $(find "$BUNDLE" -type f | wc -l) files, needs glibc ${glibc#GLIBC_} or newer besides CUDA"
	echo "gpu-device: there: run(command=\"bash scripts/gpu-device.sh run\", carry=[\"$BUNDLE_REL\"], timeout_s=590)"
}

# the first of the directories that follow to hold a file named $1 (none: nothing, status 1)
find_lib() {
	local name=$1 d; shift
	for d; do [ -e "$d/$name" ] && { echo "$d"; return 0; }; done
	return 1
}

# torch's own CUDA libraries: where a pip-installed runtime lives
torch_cuda_dirs() {
	"$PY" -c 'import glob, os, sys
for p in sys.path:
    for d in glob.glob(os.path.join(p, "nvidia", "*", "lib")):  # nvidia/cu13/lib, nvidia/cuda_runtime/lib
        print(d)' 2>/dev/null
}

run_checks() {
	local out=${OUT:-$BUNDLE/out}
	if [ ! -x "$BUNDLE/tsshim-train" ] || [ ! -f "$BUNDLE/lib/libjpeg.so.62" ]; then
		die "no bundle at $BUNDLE: make gpu-bundle here, then carry it"
	fi
	mkdir -p "$out" || die "cannot write $out"
	checks "$out" 2>&1 | tee "$out/device.log"
	return "${PIPESTATUS[0]}"
}

checks() {
	local out=$1 limit=${GPU_DEVICE_LIMIT_S:-540} t0=$SECONDS rc trc=skipped
	PY=${TS_PYTHON:-python3}
	echo "gpu-device: $(date -u '+%F %T') UTC, $(uname -srm), $(ldd --version 2>/dev/null | head -n 1)"
	echo "gpu-device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 2)"
	echo "gpu-device: $("$PY" -c 'import sys, torch; print("python %s, torch %s (CUDA %s, available %s)" % (sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.is_available()))' 2>&1 | tail -n 1)"

	# The CUDA 13 runtime: the toolkit's, else torch's (gpu-check.sh wants it
	# under $CUDA_HOME/lib64, so a stand-in CUDA_HOME points at torch's)
	local cudart_dir cuda_dir home
	home=${CUDA_HOME:-/usr/local/cuda}
	# shellcheck disable=SC2046 # one directory per word
	cudart_dir=$(find_lib libcudart.so.13 "$home/lib64" /usr/local/cuda*/lib64 \
		/usr/local/cuda*/targets/x86_64-linux/lib $(torch_cuda_dirs))
	if [ -n "$cudart_dir" ] && [ "$cudart_dir" != "$home/lib64" ]; then
		home=$BUNDLE/cuda-home
		rm -rf "$home" && mkdir -p "$home" && ln -s "$cudart_dir" "$home/lib64"
	fi
	echo "gpu-device: libcudart.so.13: ${cudart_dir:-not found} (CUDA_HOME=$home)"
	cuda_dir=$(ldconfig -p 2>/dev/null | awk '$1 == "libcuda.so.1" { print $NF; exit }')
	cuda_dir=${cuda_dir:+$(dirname "$cuda_dir")}
	[ -n "$cuda_dir" ] || cuda_dir=$(find_lib libcuda.so.1 /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu \
		/usr/lib64 /usr/local/cuda/compat)
	echo "gpu-device: libcuda.so.1: ${cuda_dir:-not found}"

	export BUILD=$BUNDLE_REL CUDA_HOME=$home TS_PYTHON=$PY
	# what the caller named first (try: tsemu), then the bundle's, the driver
	export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$BUNDLE/lib${cuda_dir:+:$cuda_dir}
	# (set, even to nothing there: gpu-check then builds nothing, case 8 is not run)
	export GPU_CHECK_STATIC=${GPU_CHECK_STATIC:-$BUNDLE/tests/ts-train-cudart-static}
	export GPU_CHECK_KEEP=$out/gpu-check
	echo "gpu-device: phase 1: scripts/gpu-check.sh"
	timeout --kill-after=10 $((limit * 2 / 3)) bash scripts/gpu-check.sh
	rc=$?
	[ $rc = 124 ] && echo "gpu-device: gpu-check ran past $((limit * 2 / 3)) s and was stopped"
	# (the dataset is made again from its seed: tsshim-mkdata --seed 5)
	tar -czf "$out/gpu-check.tgz" -C "$out" --exclude=gpu-check/data gpu-check 2>/dev/null &&
		rm -rf "$out/gpu-check"

	local left=$((limit - (SECONDS - t0)))
	if [ $rc = 77 ]; then
		echo "gpu-device: phase 2 skipped: no usable GPU here"
	elif [ "${GPU_DEVICE_TORCH:-1}" = 0 ]; then
		echo "gpu-device: phase 2 skipped (GPU_DEVICE_TORCH=0)"
	elif [ $left -lt 90 ]; then
		echo "gpu-device: phase 2 skipped: ${left} s left"
	else
		echo "gpu-device: phase 2: the PyTorch scenarios with $PY, CPU jobs (${left} s left)"
		TORCH_CHECK_PYTHON=$PY TORCH_CHECK_TIMEOUT=$((left - 15)) timeout --kill-after=10 $((left - 5)) \
			bash scripts/torch-check.sh
		trc=$?
		tar -czf "$out/torch-logs.tgz" -C "$BUNDLE" test-logs 2>/dev/null
	fi
	echo "gpu-device: gpu-check exit $rc, torch scenarios exit $trc, $((SECONDS - t0)) s"
	return $rc
}

# `run` on this machine: tsemu stands in for the driver and runtime, as
# gpu-check.sh's header describes
try_here() {
	local fake
	fake=$(mktemp -d /tmp/tsshim-gputry.XXXXXX)
	TMPDIRS+=("$fake")
	mkdir -p "$fake/bin" "$fake/cuda/lib64"
	cat >"$fake/bin/nvidia-smi" <<-'EOF'
		#!/bin/sh
		case "$*" in
		-L) echo "GPU 0: tsemu (stand-in for nvidia-smi)" ;;
		*) echo "tsemu, none, 0 MiB" ;;
		esac
	EOF
	chmod +x "$fake/bin/nvidia-smi"
	ln -s "$BUNDLE/emu/libcudart.so.13" "$fake/cuda/lib64/libcudart.so.13"
	PATH=$fake/bin:$PATH CUDA_HOME=$fake/cuda LD_LIBRARY_PATH=$BUNDLE/emu \
		GPU_CHECK_STATIC=$BUNDLE/tests/ts-train-linked TS_CUDAEMU_CHECK_REAL=1 \
		TS_PYTHON=${TS_PYTHON:-/usr/bin/python3} \
		GPU_CHECK_TORCH_UPLOAD="--emu-cuda $BUNDLE/emu/libcudart.so.13" \
		run_checks
}

case ${1:-} in
bundle) make_bundle ;;
run) run_checks ;;
try) try_here ;;
*) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; [ "${1:-}" = --help ] || [ "${1:-}" = -h ] ;;
esac
