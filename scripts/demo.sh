#!/usr/bin/env bash
# make demo: three jobs join one tsshim session; tsshim-inspect shows the
# producer and consumers; the producer is killed and a consumer takes over;
# when all leave, nothing is left behind.
#
# Then the data path: the ring at two batch sizes, exact mode (shared JPEG
# decodes) with tsshim-train, and socket mode with three real PyTorch jobs
# that share one DataLoader, measured against the same jobs without tsshim.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
LIB=$PWD/$BUILD/libtsshim.so
INSPECT=$PWD/$BUILD/tsshim-inspect
MEMBER=$PWD/$BUILD/tests/ts-member
SESSION=demo-$$
export TSSHIM_SESSION=$SESSION TSSHIM_TIMEOUT_MS=500
tmp=$(mktemp -d)
pids=()
cleanup() { kill -KILL "${pids[@]}" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
# Wait for pids that are not our waitable children (disowned), up to 5 s.
wait_gone() {
	local i
	for ((i = 0; i < 500; i++)); do
		kill -0 "$@" 2>/dev/null || return 0
		sleep 0.01
	done
	return 1
}

say() { printf '\n== %s\n' "$*"; }

say "starting 3 jobs with LD_PRELOAD=$BUILD/libtsshim.so TSSHIM_SESSION=$SESSION"
for job in 1 2 3; do
	LD_PRELOAD=$LIB "$MEMBER" >"$tmp/job$job" 2>&1 &
	pids+=($!)
	disown # no job-control chatter when we kill it
	until grep -q '^join=' "$tmp/job$job"; do sleep 0.02; done
	echo "job $job: pid ${pids[-1]}, $(head -n1 "$tmp/job$job" | grep -oE 'role=[a-z]+')"
done

say "$BUILD/tsshim-inspect $SESSION"
"$INSPECT" "$SESSION"

say "killing the producer (pid ${pids[0]}) with SIGKILL"
start=$(date +%s%N)
kill -KILL "${pids[0]}"
until grep -qh 'role=producer' "$tmp/job2" "$tmp/job3"; do sleep 0.005; done
ms=$(( ($(date +%s%N) - start) / 1000000 ))
new=$(grep -l 'role=producer' "$tmp/job2" "$tmp/job3" | head -n1)
echo "$(basename "$new") took over as producer after ${ms} ms (TSSHIM_TIMEOUT_MS=500)"

say "$BUILD/tsshim-inspect $SESSION"
"$INSPECT" "$SESSION"

say "the other jobs finish"
kill -TERM "${pids[1]}" "${pids[2]}"
wait_gone "${pids[1]}" || { echo "job 2 did not exit"; exit 1; }
wait_gone "${pids[2]}" || { echo "job 3 did not exit"; exit 1; }
if ls /dev/shm/tsshim."$(id -u)"."$SESSION" >/dev/null 2>&1; then
	echo "segment still present (unexpected)"; exit 1
fi
echo "session segment removed by the last job out: nothing left in /dev/shm"

say "the ring: a producer publishes batches of 64; consumers read at their own batch size"
RING=$PWD/$BUILD/tests/ts-ring
RS=$SESSION-ring
"$RING" --session "$RS" --produce-us 20000 >"$tmp/r0" 2>&1 &
pids+=($!); disown
sleep 0.1
"$RING" --session "$RS" --batch 48 --consume-us 5000 --max-samples 3000 >"$tmp/r1" 2>&1 &
pids+=($!); disown
"$RING" --session "$RS" --batch 100 --max-samples 3000 >"$tmp/r2" 2>&1 &
pids+=($!); disown
sleep 0.4
"$INSPECT" "$RS" | sed -n '/^members/,/^counters/p' | head -n -2
wait_gone "${pids[-1]}" "${pids[-2]}" || true
echo "consumer batch 48:  $(grep '^done' "$tmp/r1")"
echo "consumer batch 100: $(grep '^done' "$tmp/r2")"
echo "(each consumer checked every sample: in order, none skipped or repeated, positions paired)"
kill -TERM "${pids[-3]}"; wait_gone "${pids[-3]}" || true

say "exact mode: 3 same-seed training jobs (tsshim-train, 2 workers each) share their JPEG decodes"
DATA=$tmp/data
"$PWD/$BUILD/tsshim-mkdata" --classes 8 --train 40 --val 1 --seed 1 "$DATA" >/dev/null 2>&1
TRAIN=$PWD/$BUILD/tsshim-train
# CPU seconds (user+sys) of three concurrent jobs and all their workers.
three_jobs() { # extra env...
	bash -c 'for j in 1 2 3; do env "$@" "'"$TRAIN"'" --workers 2 --batch 32 --seed 7 \
		--record "'"$tmp"'/rec.$j" "'"$DATA"'/train" >/dev/null 2>&1 & done; wait
		times' three "$@" | tail -n 1 |
		awk '{ split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%.2f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }'
}
plain=$(three_jobs TSSHIM_MODE=off)
cp "$tmp/rec.1" "$tmp/plain.rec"
# A holder keeps the session's cache (and its counters) after the jobs end.
mkfifo "$tmp/hold"
"$PWD/$BUILD/tests/ts-cachetool" hold "$SESSION-x" --budget-mb 1024 <"$tmp/hold" >/dev/null 2>&1 &
holder=$!
exec 7>"$tmp/hold"
shared=$(three_jobs LD_PRELOAD="$LIB" TSSHIM_SESSION="$SESSION-x" TSSHIM_MODE=exact)
"$INSPECT" "$SESSION-x" | sed -n '/decoded-image cache/,$p'
exec 7>&-
wait_gone "$holder" || true
same=no; cmp -s "$tmp/plain.rec" "$tmp/rec.1" && cmp -s "$tmp/rec.1" "$tmp/rec.3" && same=yes
echo "CPU seconds, 3 jobs x 320 images: without sharing $plain, with exact-mode sharing $shared"
echo "every job trained on exactly the batches it trains on alone: $same"

say "socket mode: 3 PyTorch jobs (different seeds, models, batch sizes) share one DataLoader"
# tests/py/share_job.py is an ordinary torchvision ImageFolder training job;
# it records a hash of every sample it trains on, so share_verify.py can
# prove what each job saw.
PY=/usr/bin/python3
torch_ok=
"$PY" -c 'import torch, torchvision' 2>/dev/null && torch_ok=1
if [ -n "$torch_ok" ]; then
	# cpu_seconds: the last line of bash's `times` (children's user and sys) in seconds.
	cpu_seconds() { tail -n 1 | awk '{ split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%.2f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }'; }
	torch_jobs() ( # VARIANT (plain|shim): 3 jobs at once; prints their CPU seconds
		bs=(0 64 32 96) model=(- a b c)
		for j in 1 2 3; do
			if [ "$1" = shim ]; then
				export LD_PRELOAD=$LIB TSSHIM_SESSION=$SESSION-torch
			else
				unset LD_PRELOAD TSSHIM_SESSION
			fi
			"$PY" tests/py/share_job.py --root "$DATA" --seed "$j" --model "${model[$j]}" \
				--batch-size "${bs[$j]}" --workers 2 --epochs 2 --barrier "$tmp/go.$1:3" \
				--record "$tmp/$1.$j.jsonl" >/dev/null 2>&1 &
		done
		wait
		times >"$tmp/times.$1" # not in a pipe: a piped builtin runs in a fork with no children
		cpu_seconds <"$tmp/times.$1"
	)
	tplain=$(torch_jobs plain)
	torch_jobs shim >"$tmp/tshim" &
	tp=$!
	# While they run: the loader's feed, as tsshim-inspect shows it.
	for _ in $(seq 1 150); do
		feed=$("$INSPECT" --json 2>/dev/null | "$PY" -c 'import json,sys
for s in json.load(sys.stdin)["sessions"]:
    if s["name"].startswith(sys.argv[1] + ".") and s.get("loader"):
        print(s["name"]); break' "$SESSION-torch" 2>/dev/null || true)
		if [ -n "$feed" ] && "$INSPECT" "$feed" >"$tmp/feedview" 2>/dev/null &&
			grep -Eq 'samples served +[1-9][0-9]{2}' "$tmp/feedview"; then
			echo "\$ $BUILD/tsshim-inspect $feed"
			cat "$tmp/feedview"
			break
		fi
		sleep 0.1
	done
	wait "$tp"
	tshim=$(cat "$tmp/tshim")
	workers=""
	for j in 1 2 3; do workers+=" $(wc -l <"$tmp/shim.$j.jsonl.workers")"; done
	echo "loader worker processes started per job:$workers (one producer; consumers start none)"
	"$PY" tests/py/share_verify.py --root "$DATA" "$tmp"/shim.{1,2,3}.jsonl >"$tmp/verify" 2>&1 || true
	echo "share_verify (every sample of every job checked against the images): $(tail -n 1 "$tmp/verify")"
	echo "CPU seconds, 3 PyTorch jobs x 2 epochs x 320 images: without sharing $tplain, with tsshim $tshim"
else
	echo "(python3-torch/torchvision not installed: skipped)"
fi

say "summary"
[ -n "$torch_ok" ] && echo "Socket mode: 3 PyTorch jobs used $tshim CPU seconds instead of $tplain; one ran its DataLoader, the others were fed from it."
echo "Exact mode: 3 same-seed jobs used $shared CPU seconds instead of $plain, each image decoded once."
echo "3 jobs shared one session: 1 producer, 2 consumers; the producer died and exactly"
echo "one consumer took over in ${ms} ms; the last job out cleaned up. Consumers read the"
echo "producer's batches of 64 at batch sizes 48 and 100, every sample exactly once."
echo "GPU uploads are shared too (socket mode, a GPU ring): make bench measures it on the test device (gpu3: C trainers; gpu3py: PyTorch jobs)."
