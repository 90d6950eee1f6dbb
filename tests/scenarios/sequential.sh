#!/usr/bin/env bash
# A loader in index order (shuffle=False: a validation loader, a pre-tokenised
# corpus) keeps that order in socket mode: a job may pair its outputs with
# dataset positions (predictions written in order, metrics against
# dataset.targets). tests/py/seq_job.py, 400 numbered samples in batches of
# 16, records every epoch's indices as the job got them.
#   j  a late joiner (job 1 has trained 10 of 25 batches, the ring holds 4):
#      the head the stream published before it joined is made privately
#      first, while it keeps its place, then the stream from there; its later
#      epochs are the stream's (nothing made privately). Before, its first
#      epoch was the stream's rest, then the head: [160..399, 0..159].
#   e  a consumer stopped (SIGSTOP) in mid-epoch until it is evicted: it makes
#      what was published while it was away privately, in order, then reads on
#      from the stream. Before, that gap came at the epoch's end. Having joined
#      while the ring held the epoch's start, it made none of its head (before,
#      the head published by then, 16 samples, though the ring held it).
#   g  a consumer woken after the stream's epoch ended, far into the next: what
#      it lacks is gathered from the stream only where it continues the order,
#      else made privately. Before, the stream's rest came first.
#   ed the same across an epoch's end with drop_last: as many as the epoch lacks
#   p  a consumer woken after the producer left: elected producer, what was
#      published while it was away is made privately
#   pl the same, joining late (job 1 has trained 8 batches): the head it made
#      privately is not made again at the end. Before, it was (416 samples).
# Every epoch of every job: the 400 indices in order, 25 batches, paired.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh
need_python torch
JOB="$PWD/tests/py/seq_job.py"
unset TSSHIM_MODE
export TSSHIM_LOG=info

# in_order CASE EPOCHS JOB...: every epoch of these jobs' records whole and in index order
in_order() {
	local c=$1 epochs=$2; shift 2
	local files=() i
	for i in "$@"; do files+=("$T_TMP/$c.$i.out"); done
	"$PY" - "$epochs" "${files[@]}" <<'PYV'
import json, sys
bad, epochs = [], 0
for p in sys.argv[2:]:
    for r in map(json.loads, open(p)):
        epochs += 1
        if r["ids"] != list(range(400)) or r["batches"] != 25 or not r["paired"]:
            i = next((k for k, (a, b) in enumerate(zip(r["ids"], range(400))) if a != b), len(r["ids"]))
            bad.append("%s epoch %d: %d samples, %d batches, paired %s, first out of order at %d: %s"
                       % (p.rsplit("/", 1)[1], r["epoch"], len(r["ids"]), r["batches"], r["paired"], i,
                          r["ids"][max(0, i - 1):i + 3]))
if epochs != int(sys.argv[1]) * (len(sys.argv) - 2):
    bad.append("%d epochs recorded" % epochs)
print("; ".join(bad) if bad else "%d epochs in order" % epochs)
sys.exit(1 if bad else 0)
PYV
}

said() { # CASE JOB TEXT: the first line of job JOB's stderr that holds TEXT, from there on
	grep -o "$3[^;]*" "$T_TMP/$1.$2.err" | head -n 1
}
private_after() { # CASE JOB: samples its layer made privately by the end of each epoch
	"$PY" -c 'import json,sys; print(*[json.loads(l)["pv"] for l in open(sys.argv[1])])' "$T_TMP/$1.$2.out"
}

wait_for_file() { # FILE: wait up to 30 s for it
	local i
	for ((i = 0; i < 3000; i++)); do [ -e "$1" ] && return 0; sleep 0.01; done
	return 1
}

# job CASE I ARGS...: job I of CASE in the background (its pid in JPID[CASE.I])
declare -A JPID
job() {
	local c=$1 i=$2; shift 2
	LD_PRELOAD="$TS_PRELOAD" TSSHIM_SESSION="$(session_name "$c")" timeout 120 "$PY" "$JOB" \
		--out "$T_TMP/$c.$i.out" "$@" >"$T_TMP/$c.$i.log" 2>"$T_TMP/$c.$i.err" &
	JPID[$c.$i]=$!
	T_PIDS+=($!)
}
finished() { # CASE N: wait for its jobs 1..N; each must exit 0
	local c=$1 n=$2 i rc
	for ((i = 1; i <= n; i++)); do
		wait "${JPID[$c.$i]}"; rc=$?
		check "($c) job $i exited 0" [ "$rc" = 0 ] || tail -n 5 "$T_TMP/$c.$i.err" | sed 's/^/#   /'
	done
}

# --- j: a late joiner -------------------------------------------------------------
job j 1 --sleep 0.04 --mark "$T_TMP/j.go:10"
job j 2 --sleep 0.04 --go "$T_TMP/j.go" --workers 2 # its private loader has workers
finished j 2
out=$(in_order j 3 1 2)
check "(j) a late joiner's epochs in index order, whole, paired: $out" [ $? = 0 ]
line=$(said j 2 'making [0-9]* samples privately (made before it joined)')
check "(j) it made the head it missed privately, first: $line" [ -n "$line" ]
pv=$(private_after j 2)
check "(j) then read the stream: samples made privately by the end of each epoch: $pv (later epochs shared)" \
	cond "set -- $pv; [ \"\$1\" -gt 0 ] && [ \"\$1\" -lt 400 ] && [ \"\$1\" = \"\$3\" ]"

# stopped_consumer CASE WAKE ARGS...: two jobs of 2 epochs (ARGS for both); job 2
# starts once job 1 (the producer) has trained a batch (the ring holds the epoch's
# start; job 1 goes on once job 2 has its first batch: a job 2 slow to start on a
# loaded machine joined late, past the ring's start, and failed the case's premise),
# is stopped at its 4th batch (evicted: its heartbeat stops) and woken when
# job 1's progress has a line WAKE ("EPOCH BATCHES")
stopped_consumer() {
	local c=$1 wake=$2 pid; shift 2
	TSSHIM_TIMEOUT_MS=500 job "$c" 1 --epochs 2 --sleep 0.2 "$@" --mark "$T_TMP/$c.go:1" --wait "$T_TMP/$c.in:1"
	TSSHIM_TIMEOUT_MS=500 job "$c" 2 --epochs 2 --sleep 0.2 "$@" --go "$T_TMP/$c.go" --mark "$T_TMP/$c.in:1" \
		--mark "$T_TMP/$c.stop:4"
	if wait_for_file "$T_TMP/$c.stop"; then
		pid=$(cat "$T_TMP/$c.stop")
		kill -STOP "$pid"
		wait_for "$T_TMP/$c.1.log" "^$wake\$" 60
		kill -CONT "$pid"
	else
		not_ok "($c) job 2 trained no 4 batches in 30 s"
	fi
	finished "$c" 2
}

# --- e: a consumer evicted in mid-epoch -------------------------------------------
# (410 samples, drop_last: the same 25 batches of 16 in order, the last 10 samples dropped)
stopped_consumer e "0 14" --n 410 --drop-last
out=$(in_order e 2 1 2)
check "(e) an evicted consumer's epochs in index order, whole, paired: $out" [ $? = 0 ]
line=$(said e 2 'making [0-9]* samples privately (published while it was away)')
check "(e) it was evicted, and made what it missed privately, in its place: $line" [ -n "$line" ]
line=$(said e 2 'before it joined')
check "(e) joining while the ring held the epoch's start, it made nothing of its head (${line:-no such line})" [ -z "$line" ]
pv=$(private_after e 2)
check "(e) then read on from the stream: ${pv%% *} samples of its epoch 0 made privately, fewer than the 336 after its 4th batch" \
	cond "set -- $pv; [ \"\$1\" -gt 0 ] && [ \"\$1\" -lt 336 ]"

# --- g: a consumer woken after the stream's epoch ended, far into the next --------
# Stopped at its 4th batch, job 2 is woken when job 1 trains batch 10 of epoch 1:
# its epoch ends there, and what it lacks (all but its first 64 samples) is
# made privately while it keeps its place, the head of epoch 1 (the ring no
# longer holds that epoch's start). At its pace (the job's step included) that
# outlasts what the producer may wait, so it gathers from the stream instead,
# taking only samples that continue its order: none of the rest of epoch 1
# (its first is 160 or more, and 64.. are lacking), then makes the rest
# privately. Before, it took that rest of epoch 1 first: sample 143 was
# followed by 160, from where the stream was when it was woken.
stopped_consumer g "1 10"
out=$(in_order g 2 1 2)
check "(g) a consumer that gathers what it lacks keeps its epochs in index order: $out" [ $? = 0 ]
line=$(said g 2 "the stream's epoch ended while we were away")
check "(g) it found the stream's epoch over: $line" [ -n "$line" ]

# --- ed: the same across an epoch's end, with drop_last -------------------------------
# 410 samples, drop_last: the epoch is the first 400, and the layer does not know
# which samples a shuffled epoch drops. Knowing what this one was given, it makes
# as many as it lacks. Before, it ended short: 64 samples, 4 of 25 batches.
stopped_consumer ed "1 3" --n 410 --drop-last
out=$(in_order ed 2 1 2)
check "(ed) woken after the stream's epoch ended, with drop_last: epochs in index order, whole, paired: $out" [ $? = 0 ]

# --- p: a consumer woken after the producer left ----------------------------------------
# Job 2 is stopped at its 4th batch and evicted; job 1 ends its one epoch and
# exits; woken, job 2 is the feed's only member, its producer, and what the
# stream published while it was away is still its epoch's. Before, a member
# elected producer noted no loss: its epoch was 64 samples, 4 of 25 batches,
# and a loop of len(loader) next() calls died of StopIteration (found by a
# differential run: 19 of 19 runs, in order and shuffled).
for c in p pl; do
	# pl: the ring (4) no longer holds the epoch's start; p: job 1 goes on once
	# job 2 has its first batch (it joined at the epoch's start, as for e)
	at=1 wait=(--wait "$T_TMP/p.in:1"); [ $c = pl ] && at=8 wait=()
	TSSHIM_TIMEOUT_MS=500 job $c 1 --epochs 1 --sleep 0.05 --mark "$T_TMP/$c.go:$at" "${wait[@]}"
	TSSHIM_TIMEOUT_MS=500 job $c 2 --epochs 2 --sleep 0.05 --go "$T_TMP/$c.go" --mark "$T_TMP/$c.in:1" \
		--mark "$T_TMP/$c.stop:$((at + 3))"
	if wait_for_file "$T_TMP/$c.stop"; then
		pid=$(cat "$T_TMP/$c.stop")
		kill -STOP "$pid"
		wait "${JPID[$c.1]}"; rc1=$?
		kill -CONT "$pid"
	else
		not_ok "($c) job 2 trained no $((at + 3)) batches in 30 s"
		wait "${JPID[$c.1]}"; rc1=$?
	fi
	wait "${JPID[$c.2]}"; rc2=$?
	check "($c) both jobs exited 0 ($rc1 $rc2)" [ "$rc1" = 0 ] && [ "$rc2" = 0 ]
	out=$(in_order $c 1 1) && out=$(in_order $c 2 2)
	check "($c) job 2, the producer once woken, has its epochs whole and in order: $out" [ $? = 0 ]
done
line=$(said pl 2 'making [0-9]* samples privately (made before it joined)')
check "(pl) job 2 joined late and made the head privately first: $line" [ -n "$line" ]
line=$(said p 2 "the stream's epoch ended while we were away")
check "(p) it found the stream's epoch over, and made the rest privately: $line" [ -n "$line" ]

finish sequential
