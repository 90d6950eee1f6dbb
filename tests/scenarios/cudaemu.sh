#!/usr/bin/env bash
# tsemu, the test device (build/emu/libcudart.so.13, libcuda.so.1): the CUDA
# semantics the shim relies on, checked by tests/helpers/ts-cudaemu-check
# across processes (IPC memory and events, stream ordering and asynchrony,
# stream capture and graphs, cuGetProcAddress, the runtime's route to the driver, pinned memory and
# pointer attributes, fork, peers, the bandwidth model, counters), its real
# mode (the subset scripts/gpu-check.sh runs against real CUDA), then the
# reference trainer on the emulated GPU, and memcheck.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh

EMU=$PWD/$BUILD/emu
CHK=$PWD/$BUILD/tests/ts-cudaemu-check
OTHER=$PWD/$BUILD/tests/libts-cudartother.so # another runtime's failing functions
TRAIN=$PWD/$BUILD/tsshim-train
MKDATA=$PWD/$BUILD/tsshim-mkdata
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
for f in "$EMU/libcudart.so.13" "$EMU/libcuda.so.1" "$CHK" "$OTHER"; do
	[ -e "$f" ] || { echo "not ok - $f not built"; exit 1; }
done
export LD_LIBRARY_PATH=$EMU
unset TSEMU_DEVICES TSEMU_MEM_MB TSEMU_H2D_GBPS TSEMU_D2H_GBPS TSEMU_D2D_GBPS TSEMU_PEER_GBPS \
	TSEMU_STREAM_DELAY_US TSEMU_STATS TSEMU_TRACE TSEMU_GETPROC_DENY

# run NAME [ENV=VALUE...] -- ARGS...: the checker with that environment;
# its output goes to $T_TMP/NAME.out, shown on failure.
run() {
	local name=$1; shift
	local envs=()
	while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
	shift
	env "${envs[@]}" timeout 60 "$CHK" "$@" >"$T_TMP/$name.out" 2>&1
	local rc=$?
	[ $rc = 0 ] || sed 's/^/#   /' "$T_TMP/$name.out" | head -20
	return $rc
}

# --- the libraries themselves --------------------------------------------------------------
exports() { nm -D --defined-only "$1" | awk '{print $3}' | sed 's/@.*//' | sort -u; }
check "libcuda.so.1 exports only cu* and tsemu_stats" \
	[ -z "$(exports "$EMU/libcuda.so.1" | grep -vE '^(cu[A-Z]|tsemu_stats$)')" ]
check "libcudart.so.13 exports only cuda* and tsemu_stats, all at version libcudart.so.13" \
	[ -z "$(nm -D --defined-only "$EMU/libcudart.so.13" | awk '$3 != "libcudart.so.13" {print $3}' |
		grep -vE '^(cuda[A-Z][A-Za-z_]*|tsemu_stats)@@libcudart\.so\.13$')" ]
if [ -e "$CUDA_HOME/lib64/stubs/libcuda.so" ]; then
	extra=$(comm -23 <(exports "$EMU/libcuda.so.1" | grep -v tsemu_stats) <(exports "$CUDA_HOME/lib64/stubs/libcuda.so"))
	check "every driver symbol exported is one NVIDIA's libcuda exports${extra:+ (not: $extra)}" [ -z "$extra" ]
fi
if [ -e "$CUDA_HOME/lib64/libcudart.so.13" ]; then
	extra=$(comm -23 <(exports "$EMU/libcudart.so.13" | grep -v tsemu_stats) <(exports "$CUDA_HOME/lib64/libcudart.so.13"))
	check "every runtime symbol exported is one NVIDIA's libcudart.so.13 exports${extra:+ (not: $extra)}" [ -z "$extra" ]
fi
no_driver_link() {
	[ -z "$(nm -D --undefined-only "$EMU/libcudart.so.13" | awk '{print $2}' | grep -E '^cu[A-Z]')" ] &&
		! readelf -d "$EMU/libcudart.so.13" | grep -q 'libcuda\.so'
}
check "libcudart.so.13 does not link the driver (no cu* reference, no libcuda in its needs)" no_driver_link
check "the only versioned driver name in libcudart.so.13 is cuGetProcAddress_v2 (the rest by base name)" \
	[ "$(strings "$EMU/libcudart.so.13" | grep -E '^cu[A-Z][A-Za-z]*_(v[0-9]|pt)' | sort -u)" = cuGetProcAddress_v2 ]

# --- semantics ------------------------------------------------------------------------------
check "basics: 3 devices (TSEMU_DEVICES=3), versions 13000, copies, 256-byte bases, cudaMalloc(0), memset, _ptds/_ptsz, device per thread" \
	run basics TSEMU_DEVICES=3 -- basics
check "a device pointer is not host memory: dereferencing it faults" run nohost -- no-host-access
check "TSEMU_DEVICES=0: cudaErrorNoDevice" run nodevice TSEMU_DEVICES=0 -- nodevice
run badenv TSEMU_DEVICES=abc -- errors
check "an invalid TSEMU_ value: one line on stderr, default used" \
	grep -q "TSEMU_DEVICES='abc' is invalid" "$T_TMP/badenv.out"
check "errors: codes, sticky last error (get clears, peek keeps), bad pointers, handles and kinds, error strings" \
	run errors -- errors
check "cuGetProcAddress: versioned and per-thread variants by name and version, status, bad input; the pointers work; cudaGetDriverEntryPoint agrees" \
	run getproc -- getproc
run route TSEMU_TRACE=1 -- route
routed() {
	grep -q 'cuGetProcAddress("cuMemAlloc", 13000, 0x1) -> cuMemAlloc_v2' "$T_TMP/route.out" &&
		grep -q 'cuGetProcAddress("cuMemcpyHtoD", 13000, 0x2) -> cuMemcpyHtoD_v2_ptds' "$T_TMP/route.out" &&
		! grep -q FAIL "$T_TMP/route.out"
}
check "the runtime takes its driver entry points from cuGetProcAddress (TSEMU_TRACE=1 lists them) and its calls reach the driver" \
	routed
check "cuGetProcAddress withholding cuMemcpyHtoD (TSEMU_GETPROC_DENY): the runtime cannot start, though the symbol is exported" \
	run deny TSEMU_GETPROC_DENY=cuMemcpyHtoD -- deny
check "pinned memory: cudaHostAlloc/cudaMallocHost/cudaHostRegister are Host, cudaMalloc Device (with its device), others Unregistered without error" \
	run pinned -- pinned
check "fork after initialisation: every call in the child fails with cudaErrorInitializationError, the parent goes on" \
	run fork -- fork
check "fork before initialisation: the child may use CUDA" run forkclean -- fork-clean
check "peers: cudaDeviceCanAccessPeer, enable twice, cudaMemcpyPeer(Async), unified copy across devices, counters" \
	run peer -- peer
check "IPC memory: handle only of a base, own handle refused (invalid device context), another process reads/writes, reopen/close refcount, a free while another live process has it open is counted and overwrites it (not after a close or the importer's death), stale handle refused" \
	run ipcmem -- ipc-mem
check "IPC events: records in one process order streams in the other, both ways; cudaEventQuery not ready is not a last error; a dead recorder does not hang waiters" \
	run ipcevent -- ipc-event
check "IPC, an exporter killed with a copy and a record queued behind a blocked stream (cudaLaunchHostFunc): a stream waiting on that record goes on (tsemu's default), its copy never ran; its memory still reads what it held; the importer's own work goes on" \
	run ipcdead -- ipc-dead
check "TSEMU_DEAD_EVENTS=pending: a stream waiting on a dead recorder's pending record does not go on until the importer records the event itself; the importer's own work goes on meanwhile" \
	run ipcdeadp TSEMU_DEAD_EVENTS=pending -- ipc-dead
check "IPC, an exporter that exits normally while the importer has its memory open: the memory goes with its context (overwritten; the importer's read of it counted, ipc_read_lost); the importer's own work goes on" \
	run ipcexit -- ipc-exit
check "IPC, an exporter that calls cudaDeviceReset and lives on while the importer has its memory open: the memory goes with its primary context (overwritten; the importer's read of it counted, ipc_read_lost); the exporter's cudaFree of a pointer from before fails, it allocates and copies again; the importer's own work goes on" \
	run ipcreset -- ipc-reset
check "IPC, an exporter that destroys a context it made (cuCtxCreate, cuCtxDestroy) and lives on while the importer has its memory open: the memory goes with that context (overwritten; the importer's read of it counted); the exporter's cudaFree of a pointer from before fails, it allocates and copies again (in its primary context); the importer's own work goes on" \
	run ipcctxdestroy -- ipc-ctx-destroy
check "contexts: cuCtxCreate pushes, cuCtxPushCurrent/cuCtxPopCurrent push and pop, cuCtxSetCurrent replaces the top, memory lives in the current context, cuCtxDestroy of the current context pops it and its handle is invalid after, the runtime makes its context current again" \
	run ctxstack -- ctx-stack
check "TSEMU_DEAD_EVENTS=bogus: one line on stderr, tsemu's default kept" \
	cond "run ipcdeadx TSEMU_DEAD_EVENTS=bogus -- ipc-dead &&
		grep -q \"TSEMU_DEAD_EVENTS='bogus' is invalid\" '$T_TMP/ipcdeadx.out'"
check "asynchrony: pinned async copies run later on their stream, pageable ones are staged, D2D cudaMemcpy does not block, events, destroy with work pending" \
	run async -- stream-async
check "ordering: cudaStreamWaitEvent orders a copy after an earlier queued one (and without it streams overlap); legacy default stream vs blocking/non-blocking streams; per-thread streams" \
	run order -- stream-order
check "beside another runtime first in the global scope (PyTorch 2 loads its libcudart.so.13 so), tsemu's runtime calls only itself: streams and events made" \
	run other LD_PRELOAD="$OTHER" -- errors
check "stream capture: captured copies do not run, a graph launch replays H2D/D2D/D2H reading the sources then; a sync, query or pageable copy of a capturing stream, a wait on an event recorded outside the capture, a query of a captured event invalidate it; a global capture bars unsafe calls (cudaMalloc, cudaEventQuery) of other global-mode threads and invalidates, relaxed and thread-local threads may; thread-local bars its own thread; legacy stream never captured, unusable beside a blocking capture" \
	run capture -- capture
# Real mode, forced here (TS_CUDAEMU_CHECK_REAL=1): what scripts/gpu-check.sh
# checks on a real GPU. tsemu claims those semantics, so they hold on it too,
# without its knobs; what only tsemu shows (counters, delays) is skipped.
REAL_CMDS="basics errors no-host-access getproc pinned fork fork-clean peer ipc-mem ipc-event ipc-dead ipc-exit ipc-reset ipc-ctx-destroy ctx-stack stream-async stream-order capture"
real_subset() {
	local c rc=0
	for c in $REAL_CMDS; do
		run "real-$c" TS_CUDAEMU_CHECK_REAL=1 -- "$c" || rc=1
		grep -q "^$c: real mode on tsemu: [1-9][0-9]* checks run, [0-9]* skipped" "$T_TMP/real-$c.out" ||
			{ echo "#   $c: no count of the checks run"; rc=1; }
	done
	return $rc
}
check "real mode (TS_CUDAEMU_CHECK_REAL=1): $REAL_CMDS pass on tsemu, each counting its checks" real_subset
skipped_in() { sed -n "s/^$1: real mode on tsemu: .* checks run, \([0-9]*\) skipped.*/\1/p" "$T_TMP/real-$1.out"; }
skips_counted() { [ "$(skipped_in stream-async)" -gt 0 ] && [ "$(skipped_in capture)" = 2 ] && [ "$(skipped_in basics)" = 0 ]; }
check "real mode skips what needs tsemu's counters or delays (skipped: stream-async $(skipped_in stream-async), capture $(skipped_in capture), basics $(skipped_in basics))" \
	skips_counted
real_skips() {
	local c
	for c in route deny stats nodevice "bandwidth h2d 0 5000"; do
		# shellcheck disable=SC2086
		TS_CUDAEMU_CHECK_REAL=1 timeout 60 "$CHK" $c >"$T_TMP/real-skip.out" 2>&1
		if [ $? != 77 ] || ! grep -qx "skip: ${c%% *} needs the test device" "$T_TMP/real-skip.out"; then
			echo "#   $c: $(head -1 "$T_TMP/real-skip.out")"
			return 1
		fi
	done
	TSEMU_DEVICES=1 TS_CUDAEMU_CHECK_REAL=1 timeout 60 "$CHK" peer >"$T_TMP/real-skip.out" 2>&1
	[ $? = 77 ] && grep -q "^skip: peer needs 2 devices" "$T_TMP/real-skip.out"
}
check "real mode: route, deny, stats, nodevice, bandwidth (tsemu's own machinery) and peer on one device exit 77 with a line" \
	real_skips

# 64 MiB at 1 GB/s: 67 ms modelled on top of the copy itself. The copy's own
# time varies between runs by tens of ms on a loaded machine or under ASan, so
# the two settings are compared by their shortest of 5 rounds (each round
# must still take >= 60 ms at 1 GB/s).
run bw1 TSEMU_H2D_GBPS=1 -- bandwidth h2d 60 5000 5
rc=$?
ms1=$(sed -n 's/^ms=//p' "$T_TMP/bw1.out")
check "bandwidth: a 64 MiB H2D copy at TSEMU_H2D_GBPS=1 takes >= 60 ms (5 rounds, shortest ${ms1:-?} ms)" [ $rc = 0 ]
run bw0 -- bandwidth h2d 0 5000 5
ms0=$(sed -n 's/^ms=//p' "$T_TMP/bw0.out")
check "bandwidth: without TSEMU_H2D_GBPS no modelled delay (shortest of 5: ${ms0:-?} ms, >= 40 ms less than at 1 GB/s)" \
	awk -v a="${ms0:-1e9}" -v b="${ms1:-0}" 'BEGIN { exit !(a + 40 <= b) }'
run bw2 TSEMU_D2D_GBPS=2 -- bandwidth d2d 30 5000
rc=$?
check "bandwidth: a 64 MiB D2D copy at TSEMU_D2D_GBPS=2 takes >= 30 ms ($(sed -n 's/^ms=//p' "$T_TMP/bw2.out") ms)" [ $rc = 0 ]

STATS=$T_TMP/stats.jsonl
run stats TSEMU_STATS="$STATS" -- stats
sp=$(sed -n 's/^pid=//p' "$T_TMP/stats.out")
stats_exact() {
	[ -n "$sp" ] && [ "$(wc -l <"$STATS")" = 1 ] &&
		grep -q "^{\"pid\":$sp,\"devices\":2,\"h2d_bytes\":3000,\"d2h_bytes\":500,\"d2d_bytes\":700,.*\"h2d_calls\":3," "$STATS"
}
check "tsemu_stats counts copies exactly; TSEMU_STATS appends one JSON line at exit" stats_exact
if command -v python3 >/dev/null; then
	check "the TSEMU_STATS line is valid JSON" python3 -c 'import json,sys; json.loads(open(sys.argv[1]).readline())' "$STATS"
fi

# --- the reference trainer on the emulated GPU ------------------------------------------------
if [ -x "$TRAIN" ] && [ -x "$MKDATA" ]; then
	D=$T_TMP/data
	"$MKDATA" --classes 3 --train 8 --val 3 --seed 5 "$D" >"$T_TMP/mkdata.out" 2>&1 || cat "$T_TMP/mkdata.out"
	COMMON=(--size 32 --batch 5 --epochs 2 --seed 3 --readback --val "$D/val" "$D/train")
	train() { # NAME ARGS...
		local name=$1; shift
		"$TRAIN" --record "$T_TMP/$name.rec" "$@" >"$T_TMP/$name.out" 2>"$T_TMP/$name.err"
		local rc=$?
		[ $rc = 0 ] || sed 's/^/#   /' "$T_TMP/$name.err" | head -5
		return $rc
	}
	sum() { sed -n 's/.*trained_checksum=\([0-9a-f]*\).*/\1/p' "$T_TMP/$1.out"; }
	dsum() { sed -n 's/.*device_checksum=\([0-9a-f]*\).*/\1/p' "$T_TMP/$1.out"; }
	train cpu --device cpu --workers 0 "${COMMON[@]}"
	check "tsshim-train --device cpu (reference)" [ -n "$(sum cpu)" ]
	TSEMU_STATS=$T_TMP/train.jsonl train gpu --device cuda --workers 2 "${COMMON[@]}"
	same_as_cpu() { # NAME: trained, and the same checksums (records too with --rec) as --device cpu
		[ -n "$(sum "$1")" ] && [ "$(sum "$1")" = "$(sum cpu)" ] || return 1
		[ "${2:-}" != --rec ] || { cmp -s "$T_TMP/cpu.rec" "$T_TMP/$1.rec" && cmp -s "$T_TMP/cpu.out" "$T_TMP/$1.out"; }
	}
	check "tsshim-train --device cuda on the test device: same records and trained_checksum as --device cpu" \
		same_as_cpu gpu --rec
	check "... and what it read back from the device is what it uploaded (device_checksum)" \
		[ "$(dsum gpu)" = "$(sum gpu)" ]
	# 2 epochs x 24 samples + 2 validation passes x 9 samples, each 3x32x32 float32 + int64 label
	want=$(((2 * 24 + 2 * 9) * (3 * 32 * 32 * 4 + 8)))
	check "... it used the emulated GPU: TSEMU_STATS counts $want bytes host to device and back" \
		grep -q "\"h2d_bytes\":$want,\"d2h_bytes\":$want," "$T_TMP/train.jsonl"
	train gpupin --device cuda --workers 2 --pin "${COMMON[@]}"
	check "tsshim-train --device cuda --pin (cudaHostAlloc + cudaMemcpyAsync): same trained_checksum" \
		same_as_cpu gpupin
	check "... and read back from the device" [ "$(dsum gpupin)" = "$(sum cpu)" ]
	TSEMU_STREAM_DELAY_US=2000 TSEMU_H2D_GBPS=0.5 train gpuslow --device cuda --workers 2 --pin "${COMMON[@]}"
	check "... also with slow streams (TSEMU_STREAM_DELAY_US=2000, TSEMU_H2D_GBPS=0.5)" \
		same_as_cpu gpuslow
	check "... and read back from the device" [ "$(dsum gpuslow)" = "$(sum cpu)" ]
else
	echo "# skipped: the reference trainer (tsshim-train, tsshim-mkdata not built)"
fi

# --- memcheck -------------------------------------------------------------------------------
if command -v valgrind >/dev/null && ! ldd "$CHK" | grep -q libasan; then
	valgrind -q --error-exitcode=9 --leak-check=full --show-leak-kinds=definite,indirect,possible \
		--errors-for-leak-kinds=definite,indirect,possible "$CHK" quick >"$T_TMP/vg.out" 2>&1
	rc=$?
	check "ts-cudaemu-check quick (basics errors pinned peer ipc-mem capture) under valgrind: no error, no leak" [ $rc = 0 ] ||
		sed 's/^/#   /' "$T_TMP/vg.out" | head -30
fi

finish cudaemu
