#!/usr/bin/env bash
# The socket-mode GPU scenarios against real CUDA (the test suite runs them
# on tsemu, the CUDA test device). Exit 0 when all hold, 1 when one fails,
# 77 when this machine has no usable GPU.
#
#   scripts/gpu-check.sh            after `make`
#
# Jobs: tsshim-train --device cuda --tsshim --readback with the real
# libcudart (CUDA_HOME/lib64) and the driver's libcuda. Every record is
# proven by tsshim-verify: each served batch's *device* bytes (read back)
# equal the producer's stream at the right offsets, labels paired,
# validation batches the job's own. The shim's own counters (TSSHIM_LOG=debug
# exit line) must show consumer uploads replaced by device-to-device copies.
# Case 0 runs tests/helpers/ts-cudaemu-check against the real libraries
# first: each FAIL it prints is a place where tsemu, the test device, differs
# from the real driver (fix tools/cudaemu there). Case 8 runs tsshim-train
# built with the static runtime, case 9 PyTorch jobs (TS_PYTHON, default
# python3) uploading with torch's own CUDA.
# (To try the script itself without a GPU: a stand-in nvidia-smi on PATH,
# CUDA_HOME with build/emu's libcudart in lib64, LD_LIBRARY_PATH=build/emu,
# GPU_CHECK_STATIC=build/tests/ts-train-linked, TS_CUDAEMU_CHECK_REAL=1 for
# case 0's real mode on tsemu, TS_PYTHON=/usr/bin/python3 and
# GPU_CHECK_TORCH_UPLOAD="--emu-cuda $PWD/build/emu/libcudart.so.13";
# 83 checks with one device, about 50-80 s here. scripts/gpu-device.sh try
# does all that, and `run` runs this script on a GPU machine from a bundle.)
set -u
cd "$(dirname "$0")/.." || exit 1
BUILD=${BUILD:-build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
TRAIN=$PWD/$BUILD/tsshim-train MKDATA=$PWD/$BUILD/tsshim-mkdata VERIFY=$PWD/$BUILD/tsshim-verify
LIB=$PWD/$BUILD/libtsshim.so CHK=$PWD/$BUILD/tests/ts-cudaemu-check

skip() { echo "gpu-check: skipped: $*"; exit 77; }
for f in "$TRAIN" "$MKDATA" "$VERIFY" "$LIB"; do [ -x "$f" ] || [ -f "$f" ] || skip "$f not built (run make)"; done
command -v nvidia-smi >/dev/null 2>&1 || skip "no nvidia-smi: no NVIDIA driver on this machine"
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$ngpu" -ge 1 ] || skip "nvidia-smi lists no GPU"
CUDART=$CUDA_HOME/lib64/libcudart.so.13
[ -f "$CUDART" ] || skip "no CUDA 13 runtime at $CUDART"
ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' || [ -n "${LD_LIBRARY_PATH:-}" ] || skip "no libcuda.so.1"

T=$(mktemp -d /tmp/tsshim-gpucheck.XXXXXX)
# GPU_CHECK_KEEP=DIR keeps every job's record, stdout and stderr there
trap '[ -n "${GPU_CHECK_KEEP:-}" ] && mkdir -p "$GPU_CHECK_KEEP" && cp -r "$T"/. "$GPU_CHECK_KEEP"; rm -rf "$T"' EXIT
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok - $*"; }
not_ok() { failed=$((failed + 1)); echo "not ok - $*"; }
check() { local d=$1; shift; if "$@"; then ok "$d"; else not_ok "$d"; fi; }

echo "gpu-check: $ngpu GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"

# 0. the test device's semantic checks on this GPU: ts-cudaemu-check in real
# mode (the real libraries have no tsemu_stats), one command each. A FAIL
# line names the check's source line and what the real driver answered;
# 77 is a command with nothing to check here (peer on one GPU).
if [ -x "$CHK" ]; then
	for c in basics errors no-host-access getproc pinned fork fork-clean peer ipc-mem ipc-event ipc-dead \
		ipc-exit ipc-reset ipc-ctx-destroy ctx-stack stream-async stream-order capture; do
		LD_LIBRARY_PATH=$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} timeout 120 "$CHK" "$c" \
			>"$T/emu-$c.out" 2>&1
		rc=$?
		if [ $rc = 77 ]; then
			echo "# skipped: ts-cudaemu-check $c: $(grep -m1 '^skip' "$T/emu-$c.out")"
			continue
		fi
		count=$(sed -n "s/^$c: \(.*\) (test device only)$/\1/p" "$T/emu-$c.out")
		check "tsemu's semantics on this GPU: ts-cudaemu-check $c (${count:-exit $rc})" [ $rc = 0 ]
		[ $rc = 0 ] || { grep -E '^FAIL' "$T/emu-$c.out" || tail -n 5 "$T/emu-$c.out"; } | sed 's/^/#   /'
		# what the driver answers after a lazy open of another GPU's handle (README, Limitations),
		# to a process whose exporter died with work queued, and what memory of an exporter
		# that exited reads (README, The GPU data plane)
		grep -E '^# (lazy peer|dead exporter|exited exporter)' "$T/emu-$c.out" | sed 's/^/#   /'
	done
else
	echo "# no $CHK (make gpu-check builds it): case 0 not run"
fi
"$MKDATA" --classes 4 --train 80 --val 8 --seed 5 "$T/data" >/dev/null 2>&1 || { echo "tsshim-mkdata failed"; exit 1; }

# job NAME SESSION ARGS...: one tsshim-train job in the background under the
# shim (JOB_TRAIN: another build of it, with the runtime linked in)
job() {
	local name=$1 sess=$2 rt=(--cudart "$CUDART"); shift 2
	[ -n "${JOB_TRAIN:-}" ] && rt=()
	LD_PRELOAD=$LIB TSSHIM_SESSION=$sess TSSHIM_LOG=debug timeout 120 "${JOB_TRAIN:-$TRAIN}" --device cuda \
		"${rt[@]}" --tsshim --readback --size 64 --record "$T/$name.rec" "$@" "$T/data/train" \
		>"$T/$name.out" 2>"$T/$name.err" &
}
replaced() { sed -n 's/.*batches replaced \([0-9]*\).*/\1/p' "$T/$1.err" | tail -n 1; }
runtime_copies() { sed -n 's/.*copies seen (runtime \([0-9]*\),.*/\1/p' "$T/$1.err" | tail -n 1; }
served_lines() { grep -c 'share=served' "$T/$1.rec" 2>/dev/null; }
no_leftovers() { ! compgen -G "/dev/shm/tsshim*.${1}*" >/dev/null; }
finished() { local n; for n; do grep -q 'trained_checksum' "$T/$n.out" || return 1; done; }

# 1-2. one producer, two consumers at other batch sizes (same GPU; and across GPUs when there are two)
for layout in same cross; do
	[ "$layout" = cross ] && [ "$ngpu" -lt 2 ] && { echo "# one GPU: the cross-device case is not run"; continue; }
	g1=0 g2=0
	[ "$layout" = cross ] && g2=1
	S=gc-$$-$layout
	job p-$layout "$S" --seed 1 --batch 64 --epochs 3 --step-ms 20 --gpu 0
	for _ in $(seq 200); do grep -q '^seq=' "$T/p-$layout.rec" 2>/dev/null && break; sleep 0.05; done
	job c1-$layout "$S" --seed 2 --batch 32 --epochs 3 --gpu $g1 --pin
	probe=()
	[ "$layout" = cross ] && probe=(--peer-probe 0)
	job c2-$layout "$S" --seed 3 --batch 100 --epochs 3 --gpu $g2 "${probe[@]}"
	wait
	for n in p c1 c2; do check "$layout: $n finishes" finished $n-$layout; done
	check "$layout: tsshim-verify proves every served batch (device bytes)" \
		"$VERIFY" "$T/p-$layout.rec" "$T/c1-$layout.rec" "$T/c2-$layout.rec"
	check "$layout: consumers were served ($(served_lines c1-$layout)+$(served_lines c2-$layout) lines)" \
		test "$(( $(served_lines c1-$layout) + $(served_lines c2-$layout) ))" -gt 0
	check "$layout: uploads replaced by device copies ($(replaced c1-$layout)/$(replaced c2-$layout))" \
		test "$(( $(replaced c1-$layout || echo 0) + $(replaced c2-$layout || echo 0) ))" -gt 0
	check "$layout: nothing left in /dev/shm" no_leftovers "$S"
	if [ "$layout" = cross ]; then
		# the consumer on GPU 1 mapped GPU 0's buffers: its own peer-access calls answer as without the shim
		"$TRAIN" --device cuda --cudart "$CUDART" --size 64 --seed 3 --batch 100 --gpu 1 --peer-probe 0 \
			"$T/data/train" >"$T/c2-alone.out" 2>&1
		a=$(grep -o 'peer-probe .*' "$T/c2-cross.out") b=$(grep -o 'peer-probe .*' "$T/c2-alone.out")
		check "cross: peer access as the consumer sees it ('$a') is as without the shim ('$b')" \
			test -n "$b" -a "$a" = "$b"
	fi
done

# 3. producer killed mid-run: the consumers finish, everything they trained is proven
for r in 1 2 3 4 5; do
	S=gc-$$-kill$r
	job kp$r "$S" --seed 1 --batch 64 --epochs 4 --step-ms 30
	for _ in $(seq 200); do grep -q '^seq=' "$T/kp$r.rec" 2>/dev/null && break; sleep 0.05; done
	job kc$r "$S" --seed 2 --batch 48 --epochs 4
	job kd$r "$S" --seed 3 --batch 64 --epochs 4
	sleep "0.$((RANDOM % 9 + 1))"
	pkill -KILL -f "^$TRAIN .*/kp$r\.rec" 2>/dev/null
	wait 2>/dev/null
	check "kill $r: both consumers finish" finished kc$r kd$r
	check "kill $r: tsshim-verify" "$VERIFY" --killed "$T/kp$r.rec" "$T/kc$r.rec" "$T/kd$r.rec"
done

# 4. how the producer uploads (gpu_share case 14): in pieces, a piece twice,
# the labels on a second stream, no labels at first. What the ring keeps of
# such batches must still be exactly the stream's bytes.
for pat in halves repeat side-stream late-labels; do
	S=gc-$$-$pat
	job up-$pat "$S" --seed 1 --batch 64 --epochs 3 --step-ms 20 --upload-pattern $pat
	for _ in $(seq 200); do grep -q '^seq=' "$T/up-$pat.rec" 2>/dev/null && break; sleep 0.05; done
	job uc-$pat "$S" --seed 2 --batch 48 --epochs 2 --pin
	wait
	check "$pat: both finish" finished up-$pat uc-$pat
	check "$pat: tsshim-verify proves every served batch (device bytes)" "$VERIFY" "$T/up-$pat.rec" "$T/uc-$pat.rec"
	check "$pat: the consumer was served ($(served_lines uc-$pat) lines)" test "$(served_lines uc-$pat)" -gt 0
	check "$pat: nothing left in /dev/shm" no_leftovers "$S"
done

# 5. epochs aligned (gpu_share case 20): a ring of 4, a consumer that leaves
# each epoch early and one that joins in mid-epoch: each consumer epoch is
# one of the stream's, no sample twice (--strict)
S=gc-$$-align
TSSHIM_DEPTH=4 job ap "$S" --seed 1 --batch 8 --epochs 5 --step-ms 30
for _ in $(seq 200); do grep -q ' iter=5 ' "$T/ap.rec" 2>/dev/null && break; sleep 0.05; done
TSSHIM_DEPTH=4 job ab "$S" --seed 2 --batch 20 --epochs 6 --break-after 3
TSSHIM_DEPTH=4 job al "$S" --seed 3 --batch 16 --epochs 3
wait
check "align: all finish" finished ap ab al
check "align: tsshim-verify --strict (no sample twice in an epoch)" "$VERIFY" --strict "$T/ap.rec" "$T/ab.rec" "$T/al.rec"
check "align: the consumers were served ($(served_lines ab)+$(served_lines al) lines)" \
	test "$(( $(served_lines ab) + $(served_lines al) ))" -gt 0
check "align: nothing left in /dev/shm" no_leftovers "$S"

# 6. a slow consumer: the producer waits for it (backpressure) or evicts it; what
# it trained is still proven
S=gc-$$-slow
job sp "$S" --seed 1 --batch 32 --epochs 3 --step-ms 5
for _ in $(seq 200); do grep -q '^seq=' "$T/sp.rec" 2>/dev/null && break; sleep 0.05; done
job sc "$S" --seed 2 --batch 32 --epochs 3 --step-ms 60
wait
check "slow: both finish" finished sp sc
check "slow: tsshim-verify" "$VERIFY" "$T/sp.rec" "$T/sc.rec"
check "slow: nothing left in /dev/shm" no_leftovers "$S"

# 6b. a consumer evicted in mid-epoch (gpu_share case 24): stopped in its
# second epoch past the stall time (5 s), it is evicted, then gathers what its
# epoch lacks from the stream (those batches go up from the host): no sample
# twice in an epoch (--strict), some passed over
S=gc-$$-evict
TSSHIM_DEPTH=2 TSSHIM_TIMEOUT_MS=500 job ep "$S" --seed 1 --batch 4 --epochs 6 --step-ms 10
for _ in $(seq 200); do grep -q '^seq=' "$T/ep.rec" 2>/dev/null && break; sleep 0.05; done
TSSHIM_DEPTH=2 job ec "$S" --seed 2 --batch 10 --epochs 3
ect=$! ecp=
for _ in $(seq 500); do ecp=$(pgrep -P $ect | head -n 1) && [ -n "$ecp" ] && break; sleep 0.01; done
for _ in $(seq 600); do grep -qE ' phase=train epoch=1 pass=[0-9]+ iter=2 ' "$T/ec.rec" 2>/dev/null && break; sleep 0.05; done
[ -n "$ecp" ] && kill -STOP "$ecp"
pub=$(grep -c 'share=pub' "$T/ep.rec")
for _ in $(seq 300); do [ "$(grep -c 'share=pub' "$T/ep.rec")" -ge $((pub + 12)) ] && break; sleep 0.1; done
[ -n "$ecp" ] && kill -CONT "$ecp"
wait
check "evict: both finish" finished ep ec
"$VERIFY" --strict "$T/ep.rec" "$T/ec.rec" >"$T/evict.verify" 2>&1
check "evict: tsshim-verify --strict ($(tail -n 1 "$T/evict.verify"))" grep -q 'passed=[1-9][0-9]* problems=0: OK' "$T/evict.verify"
check "evict: nothing left in /dev/shm" no_leftovers "$S"

# 6c. a producer that leaves its epochs early (gpu_share case 26: 304 of the
# 320 samples an epoch here, as 96 of 100 there): the consumer gathers the rest of its first shared epoch (from the host), then
# trains its own batches while that producer produces: no sample twice in an
# epoch (--strict), some passed over, its later lines its own
S=gc-$$-short
job shp "$S" --seed 1 --batch 16 --epochs 12 --break-after 19 --step-ms 10
for _ in $(seq 200); do grep -q '^seq=' "$T/shp.rec" 2>/dev/null && break; sleep 0.05; done
job shc "$S" --seed 2 --batch 10 --epochs 3
wait
check "short epochs: both finish" finished shp shc
"$VERIFY" --strict "$T/shp.rec" "$T/shc.rec" >"$T/short.verify" 2>&1
check "short epochs: tsshim-verify --strict ($(tail -n 1 "$T/short.verify"))" \
	grep -q 'passed=[1-9][0-9]* problems=0: OK' "$T/short.verify"
own=$(grep -c 'share=own' "$T/shc.rec") said=$(grep -c "the stream's epochs hold fewer samples than this job's" "$T/shc.err")
check "short epochs: the consumer said once that its epochs are its own ($said), and they were ($own own lines)" \
	test "$said" = 1 -a "$own" -gt 0
check "short epochs: nothing left in /dev/shm" no_leftovers "$S"

# 7. CUDA graph capture (gpu_share case 21): consumers that capture their uploads
# (they pass through: from the host), a producer that does, and jobs with a
# global-mode capture open in another thread while the shim works (served from
# the ring, the capture still valid). A job whose capture is invalidated fails.
for way in consumer producer thread; do
	S=gc-$$-g$way
	pa='' ca=''
	case $way in
	consumer) ca=--graph ;;
	producer) pa=--graph ;;
	thread) pa=--capture-thread ca=--capture-thread ;;
	esac
	job gp-$way "$S" --seed 1 --batch 32 --epochs 3 --step-ms 10 --pin --workers 0 $pa
	for _ in $(seq 200); do grep -q '^seq=' "$T/gp-$way.rec" 2>/dev/null && break; sleep 0.05; done
	job gc-$way "$S" --seed 2 --batch 48 --epochs 2 --pin --workers 0 $ca
	wait
	check "graph $way: both finish (captures valid)" finished gp-$way gc-$way
	check "graph $way: tsshim-verify" "$VERIFY" "$T/gp-$way.rec" "$T/gc-$way.rec"
	[ "$way" = thread ] && check "graph $way: the consumer was served beside the open capture ($(replaced gc-$way))" \
		test "$(replaced gc-$way || echo 0)" -gt 0
	check "graph $way: nothing left in /dev/shm" no_leftovers "$S"
done

# 8. the runtime linked into the program, as nvcc links it by default
# (-cudart static; gpu_share case 22): its cudaMemcpy cannot be interposed,
# so the shim sees the copies only at the driver entry points the real
# runtime takes from cuGetProcAddress. A producer and a consumer built so,
# beside a consumer that loads libcudart.so.13.
# (GPU_CHECK_STATIC names another such build: build/tests/ts-train-linked,
# tsemu's runtime linked in, when trying the script without a GPU.)
STATIC=${GPU_CHECK_STATIC:-$PWD/$BUILD/tests/ts-train-cudart-static}
if [ -z "${GPU_CHECK_STATIC:-}" ] && [ -f "$CUDA_HOME/lib64/libcudart_static.a" ]; then
	make -s BUILD="$BUILD" CUDA_HOME="$CUDA_HOME" "$BUILD/tests/ts-train-cudart-static" >/dev/null ||
		echo "# building $STATIC failed"
fi
if [ -x "$STATIC" ]; then
	S=gc-$$-static
	JOB_TRAIN=$STATIC job stp "$S" --seed 1 --batch 64 --epochs 3 --step-ms 20 --pin --workers 2
	for _ in $(seq 200); do grep -q '^seq=' "$T/stp.rec" 2>/dev/null && break; sleep 0.05; done
	JOB_TRAIN=$STATIC job stc "$S" --seed 2 --batch 48 --epochs 2
	job std "$S" --seed 3 --batch 32 --epochs 2 --pin
	wait
	check "static: all finish" finished stp stc std
	check "static: tsshim-verify proves every served batch (device bytes)" "$VERIFY" "$T/stp.rec" "$T/stc.rec" "$T/std.rec"
	for n in stp stc; do
		check "static: $n's copies were seen at the driver only (runtime $(runtime_copies $n))" test "$(runtime_copies $n)" = 0
	done
	r1=$(replaced stc) r2=$(replaced std)
	check "static: both consumers were served from the linked producer's ring ($r1/$r2 uploads replaced)" \
		test "${r1:-0}" -gt 0 -a "${r2:-0}" -gt 0
	check "static: nothing left in /dev/shm" no_leftovers "$S"
else
	echo "# no $STATIC (the toolkit has no lib64/libcudart_static.a): case 8 not run"
fi

# 9. PyTorch jobs, the DataLoader layer, uploading with torch's own CUDA
# (share_job.py --torch-cuda: x.to("cuda"), read back): pytorch_share.sh
# case m on a real GPU. One stream at batch sizes 64/48/100, every batch
# right on the device, the consumers' uploads served from the producer's
# ring (the shim's exit line). TS_PYTHON names the Python with torch.
# (GPU_CHECK_TORCH_UPLOAD="--emu-cuda $PWD/build/emu/libcudart.so.13" tries
# the case without a GPU, with Debian's torch.)
PY=${TS_PYTHON:-python3}
TORCH_UPLOAD=${GPU_CHECK_TORCH_UPLOAD:---torch-cuda}
if [ -n "${GPU_CHECK_TORCH_UPLOAD:-}" ] ||
	"$PY" -c 'import sys, torch, torchvision, PIL; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
	S=gc-$$-torch
	bs=(0 64 48 100)
	for i in 1 2 3; do
		pin=()
		[ "$i" = 2 ] && pin=(--pin-memory)
		LD_PRELOAD=$LIB TSSHIM_SESSION=$S TSSHIM_LOG=debug timeout 300 "$PY" tests/py/share_job.py \
			--root "$T/data" --record "$T/py$i.jsonl" --seed "$i" --model a --batch-size "${bs[$i]}" \
			--workers 2 --epochs 2 --barrier "$T/py.go:3" $TORCH_UPLOAD "${pin[@]}" \
			>"$T/py$i.out" 2>"$T/py$i.err" &
	done
	wait
	done_lines() { local i; for i in 1 2 3; do grep -q '"done":true' "$T/py$i.jsonl" 2>/dev/null || return 1; done; }
	check "torch: the 3 jobs finished" done_lines
	check "torch: one stream, complete epochs, labels paired (share_verify)" \
		"$PY" tests/py/share_verify.py --root "$T/data" --cache "$T/table.json" "$T/py1.jsonl" "$T/py2.jsonl" "$T/py3.jsonl"
	wrong=$(cat "$T"/py?.jsonl | grep -c '"dev":0') right=$(cat "$T"/py?.jsonl | grep -c '"dev":1')
	check "torch: every batch right on the device ($right right, $wrong wrong)" test "$wrong" = 0 -a "$right" -gt 0
	served=
	for i in 1 2 3; do
		r=$(replaced py$i)
		grep -q '"role":2' "$T/py$i.jsonl" && served="$served ${r:-0}"
	done
	all_positive() { local r; [ $# -gt 0 ] || return 1; for r; do [ "$r" -gt 0 ] 2>/dev/null || return 1; done; }
	# shellcheck disable=SC2086 # one word per consumer
	check "torch: the consumers' uploads served from the ring (uploads replaced:${served:- no consumer})" \
		all_positive $served
	check "torch: nothing left in /dev/shm" no_leftovers "$S"
else
	echo "# $PY has no torch with CUDA: case 9 not run (TS_PYTHON names another)"
fi

echo "gpu-check: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
