#!/usr/bin/env bash
# CUDA interposition (shim/cuda.c) on the test device: host copies through
# the runtime, the driver by dlsym and by cuGetProcAddress(_v2) are all seen,
# each exactly once, and change nothing: same data, same errors, same
# trained_checksum with and without the shim; TSSHIM_MODE=off and forked
# children pass everything through.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh

EMU=$PWD/$BUILD/emu
CALLS=$PWD/$BUILD/tests/ts-cudacalls
LOCAL=$PWD/$BUILD/tests/libts-cudalocal.so
CHK=$PWD/$BUILD/tests/ts-cudaemu-check
INTERP=$PWD/$BUILD/tests/cudainterp # tsemu's driver, its table bound by the dynamic linker
TWO=$PWD/$BUILD/tests/ts-tworuntimes
PLUGIN12=$PWD/$BUILD/tests/libts-cudaplugin12.so
PLUGINNOV=$PWD/$BUILD/tests/libts-cudapluginnov.so
TRAIN=$PWD/$BUILD/tsshim-train
MKDATA=$PWD/$BUILD/tsshim-mkdata
for f in "$EMU/libcudart.so.13" "$EMU/libcuda.so.1" "$INTERP/libcuda.so.1" "$CALLS" "$LOCAL" "$CHK" "$TWO" "$PLUGIN12" "$PLUGINNOV" "$TRAIN" "$MKDATA"; do
	[ -e "$f" ] || { echo "$f not built"; exit 77; }
done
export LD_LIBRARY_PATH=$EMU
unset TSEMU_DEVICES TSEMU_MEM_MB TSEMU_H2D_GBPS TSEMU_D2H_GBPS TSEMU_D2D_GBPS TSEMU_PEER_GBPS \
	TSEMU_STREAM_DELAY_US TSEMU_STATS TSEMU_TRACE TSEMU_GETPROC_DENY TSSHIM_MODE TSSHIM_LOG

# calls NAME [ENV=VALUE...] -- ARGS...: ts-cudacalls with that environment
# (LD_PRELOAD=$TS_PRELOAD among them for the shim); output in $T_TMP/NAME.out.
calls() {
	local name=$1; shift
	local envs=()
	while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
	shift
	env "${envs[@]}" timeout 60 "$CALLS" "$@" >"$T_TMP/$name.out" 2>"$T_TMP/$name.err"
	local rc=$?
	[ $rc = 0 ] || sed 's/^/#   /' "$T_TMP/$name.err" | head -20
	return $rc
}
field() { sed -n "s/^$2 //p" "$T_TMP/$1.out"; }   # field NAME made|shim
debugline() { grep -h 'tsshim\[[0-9]*\]: cuda: ' "$T_TMP/$1.err"; }

# --- every road, each copy once -------------------------------------------------------------
check "without the shim: 28 copies by every road, every byte right on the device" calls plain -- copies
check "... and the program saw no shim" [ "$(field plain shim)" = none ]
check "with the shim: the same copies, every byte right" calls shim LD_PRELOAD="$TS_PRELOAD" TSSHIM_LOG=debug -- copies
made=$(field shim made)
same_counts() { [ -n "$made" ] && [ "$(field shim shim)" = "$made" ] && [ "$(field plain made)" = "$made" ]; }
check "the shim counted exactly the copies made, each once: $made" same_counts
check "... runtime 9 (cudaMemcpy, _ptds, Async, _ptsz, RTLD_DEFAULT), driver 19 (dlsym, RTLD_DEFAULT, cuGetProcAddress legacy/per-thread, v1, cudaGetDriverEntryPoint)" \
	grep -q '^made runtime=9 driver=19 h2d=17 h2d_bytes=124992 unknown=10 replaced=0$' "$T_TMP/shim.out"
exit_line() { [ "$(debugline shim | wc -l)" = 1 ] &&
	debugline shim | grep -q ': cuda: 28 copies seen (runtime 9, driver 19), H2D 17 copies 124992 bytes, batches replaced 0$'; }
check "TSSHIM_LOG=debug: one line at exit with the same counts" exit_line
# tsemu's driver, like the real one, hands out its own functions from
# cuGetProcAddress; one linked without -Bsymbolic-functions hands out
# whatever the dynamic linker binds its names to: the shim's exports.
interp_counts() { calls interp LD_LIBRARY_PATH="$INTERP:$EMU" LD_PRELOAD="$TS_PRELOAD" -- copies &&
	[ -n "$made" ] && [ "$(field interp shim)" = "$made" ] && [ "$(field interp made)" = "$made" ]; }
check "a driver whose cuGetProcAddress hands out the shim's exports: the same copies, each counted once" interp_counts

check "a library bound to libcudart and loaded RTLD_LOCAL: its copies work without the shim" \
	calls localplain -- local "$LOCAL"
local_shim() { calls local LD_PRELOAD="$TS_PRELOAD" -- local "$LOCAL" &&
	grep -q '^shim runtime=3 driver=0 h2d=2 unknown=0$' "$T_TMP/local.out"; }
check "... and with it (our export finds the caller's own libcudart), each seen once" local_shim

# A plugin built for another CUDA: the program links libcudart.so.13, the
# plugin (loaded RTLD_LOCAL) its own libcudart.so.12, whose version node the
# global 13 lacks: its copies run in 12. A second plugin's own runtime has
# no versions: the global 13 matches its references first, its copies run
# there. Each is unloaded before the next is loaded (glibc's malloc puts
# the second where the first was, under its link_map; ASan's does not),
# then the first comes back. The shim's exports match any version and come
# first: they must pass each copy on to where it went without them, code
# and errno included.
two() { # NAME [ENV=VALUE...]
	local name=$1; shift
	env "$@" timeout 60 "$TWO" "$PLUGIN12" "$PLUGINNOV" >"$T_TMP/$name.out" 2>"$T_TMP/$name.err"
	local rc=$?
	[ $rc = 0 ] || sed 's/^/#   /' "$T_TMP/$name.out" "$T_TMP/$name.err" | head -20
	return $rc
}
two_want() {
	cat <<-EOF
	main cudaMemcpy: rt13=1 rt12=0 rc=0 errno=kept data=ok
	main cudaMemcpyAsync: rt13=1 rt12=0 rc=0 errno=kept data=ok
	plugin12 cudaMemcpy: rt13=0 rt12=1 rc=1212 errno=ERANGE
	plugin12 cudaMemcpyAsync: rt13=0 rt12=1 rc=1212 errno=ERANGE
	main beside plugin12 cudaMemcpy: rt13=1 rt12=0 rc=0 errno=kept data=ok
	pluginnov cudaMemcpy: rt13=1 rt12=0 rc=0 errno=0
	pluginnov cudaMemcpyAsync: rt13=1 rt12=0 rc=0 errno=0
	main beside pluginnov cudaMemcpy: rt13=1 rt12=0 rc=0 errno=kept data=ok
	plugin12 again cudaMemcpy: rt13=0 rt12=1 rc=1212 errno=ERANGE
	plugin12 again cudaMemcpyAsync: rt13=0 rt12=1 rc=1212 errno=ERANGE
	main beside plugin12 again cudaMemcpy: rt13=1 rt12=0 rc=0 errno=kept data=ok
	main again cudaMemcpy: rt13=1 rt12=0 rc=0 errno=kept data=ok
	main again cudaMemcpyAsync: rt13=1 rt12=0 rc=0 errno=kept data=ok
	EOF
}
two_runs() { # NAME: every copy where it belongs, with that runtime's code and errno
	[ "$(grep -v '^shim \|^note ' "$T_TMP/$1.out")" = "$(two_want)" ] ||
		{ diff <(two_want) <(grep -v '^shim \|^note ' "$T_TMP/$1.out") | sed 's/^/#   /'; return 1; }
}
check "two runtimes without the shim: the program's copies run in libcudart.so.13, the RTLD_LOCAL plugin's in its libcudart.so.12 (an unversioned one's in 13)" \
	cond 'two twoplain && two_runs twoplain'
check "... and with it, also after plugins are unloaded and others loaded in their place: the same runtimes, return codes and errno" \
	cond 'two twoshim LD_PRELOAD="$TS_PRELOAD" && two_runs twoshim'
sed -n 's/^note /# /p' "$T_TMP/twoshim.out"
check "... the shim saw every copy once, the plugins' too (runtime 20, H2D 13)" \
	grep -q '^shim runtime=20 h2d=13$' "$T_TMP/twoshim.out"

# --- everything else untouched ----------------------------------------------------------------
check "non-copy calls through dlsym and cuGetProcAddress (malloc, streams, events, memset, attributes, errors), without the shim" \
	calls otherplain -- other
check "... and with it" calls other LD_PRELOAD="$TS_PRELOAD" -- other
check "with the shim only the hooked names come from it (cudaMalloc and cuMemAlloc stay the libraries' own)" \
	grep -q '^where cudaMalloc=libcudart.so.13 cudaMemcpy=libtsshim.so cuMemcpyHtoD_v2=libtsshim.so cuGetProcAddress_v2=libtsshim.so cuMemAlloc=libcuda.so.1$' "$T_TMP/other.out"
# cuDevicePrimaryCtxReset/Release (v1 at 7000, as the real libcudart 13 asks
# for them, and _v2) are hooked so that the GPU ring is drained before a
# primary context goes (gpu_share.sh case 29): wrappers, answering as the
# driver does (errno kept, a reset still takes the context's memory).
check "the primary-context reset and release (v1, _v2, by cuGetProcAddress and dlsym) come from the shim and answer as the driver's" \
	grep -q '^where-ctx reset=libtsshim.so reset_v2=libtsshim.so release=libtsshim.so release_v2=libtsshim.so dlsym_reset_v2=libtsshim.so$' "$T_TMP/other.out"
# cuCtxDestroy (v1 at 2000, _v2 at 4000 and by dlsym) of a context the program
# made: the same, drained by context (gpu_share.sh case 30).
check "cuCtxDestroy (v1, _v2, by cuGetProcAddress and dlsym) comes from the shim and answers as the driver's" \
	grep -q '^where-ctx-destroy destroy=libtsshim.so destroy_v2=libtsshim.so dlsym_destroy_v2=libtsshim.so$' "$T_TMP/other.out"
check "... the same with a driver whose own v1 reset calls the shim's _v2 export (handled once)" \
	calls otherinterp LD_LIBRARY_PATH="$INTERP:$EMU" LD_PRELOAD="$TS_PRELOAD" -- other
check "dlsym(RTLD_DEFAULT) and dlsym(RTLD_NEXT) from the program of CUDA names before CUDA is loaded: NULL and an error, as without the shim, and RTLD_NEXT of libjpeg's names (before, RTLD_NEXT found the shim's exports)" \
	calls probe LD_PRELOAD="$TS_PRELOAD" -- probe
check "... and with the shim off (before, off mode answered with the shim's own exports)" \
	calls probeoff LD_PRELOAD="$TS_PRELOAD" TSSHIM_MODE=off -- probe
emu_checks() {
	local c
	for c in getproc route errors stream-order ipc-event peer fork; do
		LD_PRELOAD="$TS_PRELOAD" timeout 60 "$CHK" $c >>"$T_TMP/emuchecks.out" 2>&1 ||
			{ echo "# $c failed"; sed 's/^/#   /' "$T_TMP/emuchecks.out" | tail -20; return 1; }
	done
}
check "the emulator's own checks (getproc, route, errors, stream order, IPC events, peers, fork) pass with the shim preloaded" emu_checks

# --- off and fork: pure pass-through -------------------------------------------------------------
check "TSSHIM_MODE=off: the same copies, right" calls off LD_PRELOAD="$TS_PRELOAD" TSSHIM_MODE=off TSSHIM_LOG=debug -- copies
off_silent() { grep -q '^shim runtime=0 driver=0 h2d=0 h2d_bytes=0 unknown=0 replaced=0$' "$T_TMP/off.out" &&
	[ -z "$(debugline off)" ]; }
check "... the shim counted nothing and printed no cuda line" off_silent
off_real() { calls offother LD_PRELOAD="$TS_PRELOAD" TSSHIM_MODE=off -- other &&
	grep -q '^where cudaMalloc=libcudart.so.13 cudaMemcpy=libcudart.so.13 cuMemcpyHtoD_v2=libcuda.so.1 cuGetProcAddress_v2=libcuda.so.1 cuMemAlloc=libcuda.so.1$' "$T_TMP/offother.out" &&
	grep -q '^where-ctx reset=libcuda.so.1 reset_v2=libcuda.so.1 release=libcuda.so.1 release_v2=libcuda.so.1 dlsym_reset_v2=libcuda.so.1$' "$T_TMP/offother.out" &&
	grep -q '^where-ctx-destroy destroy=libcuda.so.1 destroy_v2=libcuda.so.1 dlsym_destroy_v2=libcuda.so.1$' "$T_TMP/offother.out"; }
check "... and dlsym handed out the libraries' own pointers" off_real
check "a child forked after CUDA init gets cudaErrorInitializationError / CUDA_ERROR_NOT_INITIALIZED, without the shim" \
	calls forkplain -- fork
fork_shim() { calls fork LD_PRELOAD="$TS_PRELOAD" TSSHIM_LOG=debug -- fork && [ "$(debugline fork | wc -l)" = 1 ]; }
check "... and the same through the hooks, which look at none of the child's calls; one cuda line (the parent's)" fork_shim

# --- the reference trainer ----------------------------------------------------------------------
D=$T_TMP/data
"$MKDATA" --classes 3 --train 8 --val 3 --seed 5 "$D" >"$T_TMP/mkdata.out" 2>&1 || cat "$T_TMP/mkdata.out"
COMMON=(--size 32 --batch 5 --epochs 2 --seed 3 --readback --workers 2 --val "$D/val" "$D/train")
train() { # NAME [ENV=VALUE...] -- ARGS...
	local name=$1; shift
	local envs=()
	while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
	shift
	env "${envs[@]}" timeout 120 "$TRAIN" --record "$T_TMP/$name.rec" "$@" >"$T_TMP/$name.out" 2>"$T_TMP/$name.err"
	local rc=$?
	[ $rc = 0 ] || sed 's/^/#   /' "$T_TMP/$name.err" | head -5
	return $rc
}
sum() { sed -n 's/.*trained_checksum=\([0-9a-f]*\).*/\1/p' "$T_TMP/$1.out"; }
same_training() { [ -n "$(sum "$1")" ] && [ "$(sum "$1")" = "$(sum "$2")" ] && cmp -s "$T_TMP/$1.rec" "$T_TMP/$2.rec"; }
saw_uploads() { debugline "$1" | grep -q "H2D [0-9]* copies $2 bytes, batches replaced 0\$"; }
for pin in "" --pin; do
	n=gpu${pin#--}
	train "$n" -- --device cuda $pin "${COMMON[@]}"
	train "${n}shim" LD_PRELOAD="$TS_PRELOAD" TSSHIM_SESSION="$(session_name train)" TSSHIM_LOG=debug -- \
		--device cuda $pin "${COMMON[@]}"
	check "tsshim-train --device cuda ${pin:-(pageable)}: same records and trained_checksum ($(sum "$n")) with and without the shim" \
		same_training "$n" "${n}shim"
	# 2 epochs x 24 samples + 2 validation passes x 9, uploaded as images + labels, and read back
	want=$(((2 * 24 + 2 * 9) * (3 * 32 * 32 * 4 + 8)))
	check "... the shim saw its uploads: $want bytes host to device" saw_uploads "${n}shim" "$want"
done

# --- memcheck ---------------------------------------------------------------------------------
if command -v valgrind >/dev/null && ! ldd "$TS_PRELOAD" 2>/dev/null | grep -q libasan && [ "${TS_PRELOAD#* }" = "$TS_PRELOAD" ]; then
	LD_PRELOAD="$TS_PRELOAD" valgrind -q --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite \
		"$CALLS" copies >"$T_TMP/vg.out" 2>&1
	rc=$?
	check "ts-cudacalls copies with the shim under valgrind: no error, no definite leak" [ $rc = 0 ] ||
		sed 's/^/#   /' "$T_TMP/vg.out" | head -30
fi

finish cuda_hooks
