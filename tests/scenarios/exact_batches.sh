#!/usr/bin/env bash
# Exact mode at the DataLoader (shim/python/tsshim_exact.py): jobs whose
# loaders make the same epoch (same key, generators, batch size, workers,
# versions) share whole batches; every job still trains on exactly the bytes
# it trains on without the shim, and its generators end each epoch where they
# would (tests/py/imagefolder_job.py --step-draws draws from torch's default
# generator after every batch, mixes the draws into each batch's record, and
# prints both generators' state after each epoch; the records are compared
# whole with a plain run's).
#   same     3 same-seed jobs, 3 epochs: in every epoch the others read their
#            batches from the feed, one feed an epoch
#   model    the loader has a generator of its own, the jobs' models draw
#            differently before it runs: shared all the same
#   default  no generator of the loader's own: shared while the jobs' default
#            generators agree, not when their models drew differently
#   kill     the producer SIGKILLed in mid-epoch: the others make the rest on
#            their own (the batches they had read made again first)
#   early    a job that leaves each epoch after 2 batches, with two that do not
#   late     a job that starts 1 s after the others
#   keep     jobs that keep every batch: past the views the feed lends, copies
#   many     40 epochs: 40 feeds, more than a process remembers for its exit sweep
#   workers0 no workers: not shared, one info line
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh
imagefolder_data
BASE=(--batch 8 --workers 2 --size 64 --step-draws --records)
NB=6 # batches an epoch: 48 images in batches of 8
export TSSHIM_MODE=exact

plain() { # NAME ARGS...: the job without the shim
	local n=$1
	shift
	"$PY" "$JOB" "$DATA" "${BASE[@]}" "$@" >"$T_TMP/$n.plain" 2>&1
}
# CASE JOB ARGS...: one job with the shim, in the background, started with the case's others
start() {
	local c=$1 j=$2
	shift 2
	LD_PRELOAD="$TS_PRELOAD" TSSHIM_SESSION=$(session_name "$c") TSSHIM_LOG=info "$PY" "$JOB" "$DATA" "${BASE[@]}" \
		--barrier "$T_TMP/$c.go:$NJOBS" "$@" >"$T_TMP/$c.$j" 2>"$T_TMP/$c.$j.err" &
	PIDS+=($!)
}
begin() { # CASE NJOBS
	NJOBS=$2 PIDS=()
	mkdir -p "$T_TMP/$1.go"
}
same_as() { # CASE JOB PLAIN: the job's records, generators and checksum are the plain run's
	cmp -s <(grep -v cpu_s "$T_TMP/$3.plain"; sed -n 's/.*checksum=\([0-9a-f]*\).*/\1/p' "$T_TMP/$3.plain") \
		<(grep -v cpu_s "$T_TMP/$1.$2"; sed -n 's/.*checksum=\([0-9a-f]*\).*/\1/p' "$T_TMP/$1.$2")
}
exact_all() { # CASE PLAIN...: job j of the case against the j-th plain run
	local c=$1 j=0 bad=
	shift
	for p in "$@"; do
		j=$((j + 1))
		same_as "$c" $j "$p" || bad="$bad $j"
	done
	check "$c: every job trained on exactly its batches without the shim, generators included${bad:+ (not jobs$bad)}" [ -z "$bad" ]
	[ -z "$bad" ] || for j in $bad; do tail -n 4 "$T_TMP/$c.$j" "$T_TMP/$c.$j.err" | sed 's/^/#   /'; done
}
whole_reads() { # CASE: iterations a consumer read whole from a feed
	cat "$T_TMP/$1".[0-9].err | grep -c "of this loader: $NB of $NB batches read from the feed"
}
reads() { # CASE: every batch read from a feed
	cat "$T_TMP/$1".[0-9].err | sed -n 's/.*of this loader: \([0-9]*\) of .*/\1/p' | awk '{s += $1} END {print s + 0}'
}
no_leftovers() { # CASE
	check "$1: nothing of its sessions left in /dev/shm" \
		cond "! ls /dev/shm 2>/dev/null | grep -q -- '$(session_name "$1")'"
}

# --- same: 3 same-seed jobs, 3 epochs ------------------------------------------
plain s --seed 11 --epochs 3
begin same 3
for j in 1 2 3; do start same $j --seed 11 --epochs 3; done
wait "${PIDS[@]}"
exact_all same s s s
w=$(whole_reads same)
echo "# same: $w of 6 consumer epochs read whole from the feed ($(reads same) batches); lines:"
cat "$T_TMP"/same.[0-9].err | grep "batches read from the feed" | sed 's/^/#   /'
check "same: consumers read epochs whole from the feed ($w of the 6 possible, 3 at least)" [ "$w" -ge 3 ]
# One feed an epoch, whoever made the one before: a job that made an epoch with
# its workers keyed its next one apart from those that had read it (the default
# start method, None until a process starts its first child), 5 feeds, not 3.
f=$(cat "$T_TMP"/same.[0-9].err | grep -o "of feed '[^']*'" | sort -u | wc -l)
check "same: the three jobs keyed each epoch alike (one feed an epoch: $f for 3 epochs)" [ "$f" = 3 ]
# A consumer that came after an epoch's first batch makes that epoch itself from
# its start (under load, rarely); none may have to leave a feed in mid-epoch.
check "same: no job fell back to its own loader in mid-epoch" \
	cond "! grep 'are the job.s own' $T_TMP/same.[0-9].err | grep -qv '(0 made again first)'"
no_leftovers same

# --- model: the loader's own generator; the models draw differently -----------------
plain m5 --seed 11 --epochs 2 --model-draws 5
plain m9 --seed 11 --epochs 2 --model-draws 9
begin model 2
start model 1 --seed 11 --epochs 2 --model-draws 5
start model 2 --seed 11 --epochs 2 --model-draws 9
wait "${PIDS[@]}"
exact_all model m5 m9
check "model: the loader with a generator of its own was shared whatever the models drew ($(reads model) batches read)" \
	[ "$(reads model)" -gt 0 ]
no_leftovers model

# --- default: the loader draws from torch's default generator -----------------------
plain d5 --seed 11 --epochs 2 --model-draws 5 --no-generator
plain d9 --seed 11 --epochs 2 --model-draws 9 --no-generator
begin default 2
start default 1 --seed 11 --epochs 2 --model-draws 5 --no-generator
start default 2 --seed 11 --epochs 2 --model-draws 5 --no-generator
wait "${PIDS[@]}"
exact_all default d5 d5
check "default: same default generators, shared ($(reads default) batches read)" [ "$(reads default)" -gt 0 ]
begin default2 2
start default2 1 --seed 11 --epochs 2 --model-draws 5 --no-generator
start default2 2 --seed 11 --epochs 2 --model-draws 9 --no-generator
wait "${PIDS[@]}"
exact_all default2 d5 d9
check "default: models that drew differently: nothing shared ($(reads default2) batches read)" \
	[ "$(reads default2)" = 0 ]
no_leftovers default
no_leftovers default2

# --- kill: the producer SIGKILLed in mid-epoch ------------------------------------
plain k --seed 11 --epochs 2 --sleep 0.15
begin kill 3
for j in 1 2 3; do start kill $j --seed 11 --epochs 2 --sleep 0.15; done
victim=
for _ in $(seq 1 300); do
	for j in 1 2 3; do
		if grep -q "producer of feed" "$T_TMP/kill.$j.err" 2>/dev/null &&
			[ "$(grep -c '^batch ' "$T_TMP/kill.$j" 2>/dev/null)" -ge 2 ]; then
			victim=$j
			break 2
		fi
	done
	sleep 0.05
done
if [ -n "$victim" ]; then
	kill -KILL "${PIDS[$((victim - 1))]}"
	echo "# kill: job $victim (the producer) killed after $(grep -c '^batch ' "$T_TMP/kill.$victim") batches"
fi
wait "${PIDS[@]}" 2>/dev/null
check "kill: the producer was found and killed in its first epoch" [ -n "$victim" ]
left=()
for j in 1 2 3; do [ "$j" = "$victim" ] || left+=("$j"); done
bad=
for j in "${left[@]}"; do same_as kill "$j" k || bad="$bad $j"; done
check "kill: the jobs left trained on exactly their batches without the shim${bad:+ (not jobs$bad)}" [ -z "$bad" ]
grep -h "are the job's own" "$T_TMP"/kill.[0-9].err | sed 's/^/#   /'
check "kill: the others made the rest of that epoch on their own" \
	cond "[ \$(grep -l \"are the job's own\" $T_TMP/kill.[0-9].err | wc -l) -ge 1 ]"
no_leftovers kill

# --- early: a job that leaves each epoch after 2 batches ------------------------------
plain e --seed 11 --epochs 2 --sleep 0.05
plain e2 --seed 11 --epochs 2 --sleep 0.05 --batches 2
begin early 3
start early 1 --seed 11 --epochs 2 --sleep 0.05 --batches 2
start early 2 --seed 11 --epochs 2 --sleep 0.05
start early 3 --seed 11 --epochs 2 --sleep 0.05
wait "${PIDS[@]}"
exact_all early e2 e e
echo "# early: $(reads early) batches read from feeds"
no_leftovers early

# --- late: a job that starts 1 s after the others ---------------------------------
plain l --seed 11 --epochs 2 --sleep 0.05
begin late 3
start late 1 --seed 11 --epochs 2 --sleep 0.05
start late 2 --seed 11 --epochs 2 --sleep 0.05
start late 3 --seed 11 --epochs 2 --sleep 0.05 --start-delay 1
wait "${PIDS[@]}"
exact_all late l l l
echo "# late: $(reads late) batches read from feeds"
no_leftovers late

# --- keep: a job that keeps every batch (more than the feed lends views) -------------
# An epoch of 80 batches of 1, every one kept: the feed lends 64 views at most.
"$MKDATA" --classes 4 --train 20 --val 1 --seed 7 "$T_TMP/data80" >/dev/null 2>&1 || { echo "mkdata failed"; exit 1; }
DATA0=$DATA DATA="$T_TMP/data80/train" NB=80
plain kp --seed 11 --batch 1 --keep
# A consumer that opens the epoch's feed after the producer's first batch makes
# the epoch itself (exact, but not what this case is about): once more then.
for attempt in 1 2; do
	rm -rf "$T_TMP"/keep.*
	begin keep 2
	for j in 1 2; do start keep $j --seed 11 --batch 1 --keep; done
	wait "${PIDS[@]}"
	[ "$(reads keep)" = 0 ] && [ $attempt = 1 ] || break
	echo "# keep: no batch was read from the feed (a consumer came after the first batch): again"
done
exact_all keep kp kp
copied=$(sed -n 's/.*(\([0-9]*\) of them copied.*/\1/p' "$T_TMP"/keep.[0-9].err)
check "keep: the consumer read all its 80 batches from the feed ($(reads keep)), the last ${copied:-0} as copies" \
	cond "[ $(reads keep) = 80 ] && [ '${copied:-0}' -ge 16 ]"
no_leftovers keep
DATA=$DATA0 NB=6

# --- many: 40 epochs, one feed each (a process remembers 32 for its sweep at exit) ---
plain mn --seed 11 --epochs 40 --batches 1
begin many 2
for j in 1 2; do start many $j --seed 11 --epochs 40 --batches 1; done
wait "${PIDS[@]}"
exact_all many mn mn
# How many of these epochs are shared depends on how close the jobs keep (each
# leaves its epoch after one batch); what matters here is that each job went
# through 40 feeds, past the 32 it remembers, exactly and leaving nothing.
feeds_of() { grep -oE "(producer|consumer) of feed '[^']*\.x[0-9a-f]+'" "$T_TMP/many.$1.err" | sed 's/.* of feed //' | sort -u | wc -l; }
echo "# many: $(reads many) batches read from feeds"
check "many: each job went through 40 feeds ($(feeds_of 1) and $(feeds_of 2))" \
	cond "[ $(feeds_of 1) = 40 ] && [ $(feeds_of 2) = 40 ]"
no_leftovers many

# --- workers0: no workers, no batch sharing -----------------------------------------
plain w0 --seed 11 --workers 0
begin workers0 2
for j in 1 2; do start workers0 $j --seed 11 --workers 0; done
wait "${PIDS[@]}"
exact_all workers0 w0 w0
check "workers0: one line says why its batches are not shared" \
	grep -q "batches not shared in exact mode: no workers" "$T_TMP/workers0.1.err"

finish exact_batches
