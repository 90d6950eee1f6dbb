#!/usr/bin/env bash
# Real PyTorch jobs sharing one DataLoader pipeline (TSSHIM_MODE unset: auto).
# Jobs that build the same loader (dataset, transforms, sampler kind, collate)
# share it: one producer runs its DataLoader, the others start no worker and
# cut the producer's stream at their own batch size, so every job sees the
# producer's sample order whatever its seed, model or batch size. Each case
# starts its jobs together (tests/py/share_job.py, recording every sample's
# tensor hash) and checks the records with tests/py/share_verify.py, which
# knows every image's hash and label from a plain, shim-free pass:
#   a/b/c  three jobs, seeds 1/2/3, models a/b/c, batch sizes 64/64/64,
#          64/32/96, 64/48/100: one stream, exactly one job started workers;
#          job 2 overwrites every batch after use (consumers' batches are
#          copy-on-write views of the feed: nobody else may see that)
#   d      a late joiner: its first epoch is whole, len(loader) batches: the
#          stream's epoch from its start when the ring still holds it, else
#          its rest, then the head made privately
#   e      the producer SIGKILLed mid-epoch: a consumer takes over, the others'
#          epochs stay complete permutations
#   f      different transforms: no sharing (both start workers), plain checks
#   g      --val: val loaders share among themselves, in ImageFolder order
#   h      a DataLoader subclass, spawn + persistent workers and a plain job
#   i      Ctrl-C in a waiting consumer; --break-after in a consumer
#   vi     Ctrl-C inside the producer's own loader: a consumer takes over, the
#          others share to the end (the stream does not stop)
#   j      a fast producer ends while a slow consumer still has its last
#          batches to read: elected producer, it reads them (no hang)
#   k      the producer SIGSTOPped until its successor has finished; woken,
#          elected again behind the stream, it reads on (no hang, no fallback)
#   l      the same with the ring at its default depth: the successor evicts
#          the stopped job, which, woken, ends that epoch short (no exception)
#   ev/ee  a consumer stopped past the stall time in mid-epoch: evicted, it reads
#          on from the head (ev) or, the stream's epoch over (ee), ends its epoch
#          there, and makes what it missed privately (whole epochs)
#   m-p    GPU jobs on tsemu: consumers' uploads served from the producer's
#          GPU ring; a batch changed before its upload never is
#   q      GPU jobs, the producer killed: the successor's batches fill the
#          ring, and it makes them without waiting on itself
#   r      GPU jobs that fetch the next batch before uploading this one
#   dv     GPU jobs on device 1 that never make it current
#   w      a collate function that pads each batch: a consumer finishing its epoch
#          privately gets the part of a batch it holds as it is (no crash)
#   xs/xo  a consumer with persistent workers that later runs its own loader (elected
#          producer; sharing off): no second base seed drawn, its workers' seeds kept
#   vk     validation every 3 steps in one job, after each epoch in the other: no
#          10 s waits on each other through the two loaders
#   sb     a producer that breaks out of an epoch while a consumer reads on: the
#          rest of that stream epoch is the consumer's; its next epochs are whole
#   z      a train loader that goes off sharing, then a validation loader (its feed
#          gets the closed feed's handle): the train epoch's end leaves it alone
# plus the same jobs as (a) without the shim: per-job checks pass, and the
# shared check fails (each job shuffles by its own seed); and first the
# verifier's own self checks (tests/py/test_share_verify.py).
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh
PY=${TS_PYTHON:-/usr/bin/python3} # TS_PYTHON: another Python with torch (another torch version)
"$PY" -c 'import torch, torchvision, PIL' 2>/dev/null || { echo "python3-torch/torchvision/pil not installed"; exit 77; }
JOB="$PWD/tests/py/share_job.py"
VERIFY="$PWD/tests/py/share_verify.py"
MKDATA="$PWD/$BUILD/tsshim-mkdata"
[ -x "$MKDATA" ] || { echo "needs $MKDATA"; exit 77; }

"$MKDATA" --classes 4 --train 40 --val 4 --seed 7 "$T_TMP/data" >/dev/null 2>&1 || { echo "mkdata failed"; exit 1; }
DATA="$T_TMP/data"
NTRAIN=$(find "$DATA/train" -name '*.jpg' | wc -l)
CACHE="$T_TMP/table.json"
unset TSSHIM_MODE
export TSSHIM_LOG=${TSSHIM_LOG:-info}

# The verifier catches what it should (hand-made broken records).
if BUILD=$BUILD timeout 120 "$PY" tests/py/test_share_verify.py >"$T_TMP/selftest" 2>&1; then
	ok "share_verify self checks: $(grep -E '^Ran ' "$T_TMP/selftest")"
else
	not_ok "share_verify self checks"; tail -n 20 "$T_TMP/selftest" | sed 's/^/#   /'
fi

# The verifier's table (every image under both transforms), built once.
timeout 120 "$PY" -c "import sys; sys.path.insert(0, '$PWD/tests/py'); import share_verify as v; \
	t = v.build_table('$DATA', '$CACHE'); print(t.size('train'), t.size('val'))" >"$T_TMP/table.out" 2>&1
check "verifier table: $NTRAIN train and 16 val images hashed without the shim" \
	grep -qx "$NTRAIN 16" "$T_TMP/table.out"

# job CASE I SHIM(1|0) ARGS...: start job I of CASE in the background, with
# the shim (session per case) or without; record $T_TMP/CASE.I.jsonl.
# A job takes seconds (5-10 s each under make asan); one still running after
# 120 s is hung: SIGABRT, and Python's fault handler writes every thread's
# traceback to its stderr (timeout exits 124), which the failure report shows.
JOB_LIMIT=(timeout -s ABRT -k 10 120)
export PYTHONFAULTHANDLER=1 # also in the small jobs written below
declare -A JPID CSTART  # CSTART: when a case started its first job (the time finished says)
# (Under an ASan preload share_job.py spawns its workers: see its main(). The
# small jobs below do the same: a forked worker of case v hung in gcc 12's ASan
# allocator lock, held by another thread of its job at the fork.)
job() {
	local c=$1 i=$2 shim=$3; shift 3
	local base="$T_TMP/$c.$i"
	[ -n "${CSTART[$c]:-}" ] || CSTART[$c]=$SECONDS
	if [ "$shim" = 1 ]; then
		LD_PRELOAD="$TS_PRELOAD" TSSHIM_SESSION="$(session_name "$c")" \
			PYTHONFAULTHANDLER=1 "${JOB_LIMIT[@]}" "$PY" "$JOB" --root "$DATA" --record "$base.jsonl" "$@" >"$base.out" 2>"$base.err" &
	else
		env -u LD_PRELOAD -u TSSHIM_SESSION \
			PYTHONFAULTHANDLER=1 "${JOB_LIMIT[@]}" "$PY" "$JOB" --root "$DATA" --record "$base.jsonl" "$@" >"$base.out" 2>"$base.err" &
	fi
	JPID[$c.$i]=$!
	T_PIDS+=($!)
}

# finished CASE N [KILLED]: wait for jobs 1..N of CASE; all must exit 0 but
# KILLED (which must have died of SIGKILL).
finished() {
	local c=$1 n=$2 killed=${3:-} i rc bad=
	for i in $(seq 1 "$n"); do
		{ wait "${JPID[$c.$i]}"; } 2>/dev/null  # no "Killed" notice from bash
		rc=$?
		if [ "$i" = "$killed" ]; then
			[ "$rc" = 137 ] || bad+=" job $i (killed) exit $rc"
		elif [ "$rc" = 124 ]; then
			bad+=" job $i hung (stopped after 120 s)"
		elif [ "$rc" != 0 ]; then
			bad+=" job $i exit $rc"
		fi
	done
	local took=  # (jobs started without job(), by hand, have no start here)
	[ -n "${CSTART[$c]:-}" ] && took=" in $((SECONDS - CSTART[$c])) s"
	unset "CSTART[$c]"
	if [ -z "$bad" ]; then
		ok "($c) the $n jobs finished${killed:+ (job $killed SIGKILLed)}$took"
	else
		not_ok "($c) the $n jobs finished:$bad${took:+ (${took# })}"
		for i in $(seq 1 "$n"); do
			# the shim's lines and where an exception came from, then the end
			{ echo "[$c.$i]"; grep -E '^tsshim\[|Caught|Error' "$T_TMP/$c.$i.err" | head -n 20
			  echo "  ..."; tail -n 15 "$T_TMP/$c.$i.err"
			  grep -q '^Fatal Python error: Aborted' "$T_TMP/$c.$i.err" &&
				sed -n '/^Fatal Python error: Aborted/,$p' "$T_TMP/$c.$i.err" | head -n 60; } >>"$T_TMP/stderr"
		done
	fi
}

job_pid() { # CASE I: the pid job I of CASE recorded in its start line
	grep -o '"pid":[0-9]*' "$T_TMP/$1.$2.jsonl" | head -n 1 | cut -d: -f2
}

recs() { # CASE N: the record paths
	local i
	for i in $(seq 1 "$2"); do echo "$T_TMP/$1.$i.jsonl"; done
}

# verify CASE DESCRIPTION ARGS...: share_verify.py must pass.
verify() {
	local c=$1 d=$2; shift 2
	if timeout 120 "$PY" "$VERIFY" --root "$DATA" --cache "$CACHE" "$@" >"$T_TMP/$c.verify" 2>&1; then
		ok "($c) $d: $(tail -n 1 "$T_TMP/$c.verify")"
	else
		not_ok "($c) $d: $(tail -n 1 "$T_TMP/$c.verify")"
		grep -v '^verify:' "$T_TMP/$c.verify" | head -n 12 | sed 's/^/#   /'
	fi
}

total() { awk '{s += $1} END {print s + 0}'; }

field() { # RECORD KEY: a number from the record's done line
	grep -o "\"$2\":[0-9.]*" "$1" 2>/dev/null | tail -n 1 | cut -d: -f2
}

loader_workers() { # RECORD LOADER: workers that job started for that loader
	grep -c " $2\$" "$1.workers" 2>/dev/null
}

# one_producer CASE N [LOADER]: exactly one of the N jobs started workers (for LOADER).
one_producer() {
	local c=$1 n=$2 l=${3:-train} i w list= count=0
	for i in $(seq 1 "$n"); do
		w=$(loader_workers "$T_TMP/$c.$i.jsonl" "$l")
		list+=" ${w:-?}"
		[ "${w:-0}" -gt 0 ] && count=$((count + 1))
	done
	check "($c) exactly one job started $l-loader workers, the consumers none (workers per job:$list)" [ "$count" = 1 ]
}

# some_consumer CASE N [LOADER]: at least one job never started workers for
# LOADER (a producer that sits idle between epochs may hand over, so the role
# can move at an epoch boundary; a job that only ever consumed starts none).
some_consumer() {
	local c=$1 n=$2 l=${3:-train} i w list= count=0
	for i in $(seq 1 "$n"); do
		w=$(loader_workers "$T_TMP/$c.$i.jsonl" "$l")
		list+=" ${w:-?}"
		[ "${w:-0}" = 0 ] && count=$((count + 1))
	done
	check "($c) a consumer never started $l-loader workers (workers per job:$list)" [ "$count" -ge 1 ]
}

all_started() { # CASE N: each of the N jobs started train-loader workers
	local i w
	for i in $(seq 1 "$2"); do
		w=$(loader_workers "$T_TMP/$1.$i.jsonl" train)
		[ "${w:-0}" -gt 0 ] || return 1
	done
}

cpu_line() { # CASE N: data CPU of producer vs consumers (informational)
	local c=$1 n=$2 i r line=
	for i in $(seq 1 "$n"); do
		r="$T_TMP/$c.$i.jsonl"
		if [ "$(loader_workers "$r" train)" -gt 0 ] 2>/dev/null; then
			line+=" job$i(producer)=$(field "$r" data_cpu_s)"
		else
			line+=" job$i(consumer)=$(field "$r" data_cpu_s)"
		fi
	done
	echo "# ($c) data CPU seconds (main process in next() + its train workers):$line"
}

# --- plain baseline: the jobs of (a) without the shim ------------------------------
job base 1 0 --seed 1 --model a --batch-size 64 --workers 2 --epochs 2
job base 2 0 --seed 2 --model b --batch-size 64 --workers 2 --epochs 2
job base 3 0 --seed 3 --model c --batch-size 64 --workers 2 --epochs 2
finished base 3
verify base "without the shim: every job saw complete epochs, labels paired" --mode plain $(recs base 3)
check "(base) without the shim every job started its own workers" all_started base 3
timeout 120 "$PY" "$VERIFY" --root "$DATA" --cache "$CACHE" $(recs base 3) >"$T_TMP/base.neg" 2>&1
rc=$?
check "(base) without the shim the shared check fails: each job shuffles by its own seed ($(tail -n 1 "$T_TMP/base.neg"))" \
	[ "$rc" = 1 ]
cpu_line base 3

# --- a, b, c: three jobs, three models, three seeds, one stream -------------------
for c in a b c; do
	case $c in
	a) bs=(64 64 64) ;;
	b) bs=(64 32 96) ;;
	c) bs=(64 48 100) ;;
	esac
	job "$c" 1 1 --seed 1 --model a --batch-size "${bs[0]}" --workers 2 --epochs 2 --barrier "$T_TMP/$c.go:3"
	# job 2 overwrites each batch in place after training on it: no other job may see that
	job "$c" 2 1 --seed 2 --model b --batch-size "${bs[1]}" --workers 2 --epochs 2 --barrier "$T_TMP/$c.go:3" --scribble
	job "$c" 3 1 --seed 3 --model c --batch-size "${bs[2]}" --workers 2 --epochs 2 --barrier "$T_TMP/$c.go:3"
	finished "$c" 3
	verify "$c" "batch sizes ${bs[*]}: one stream, complete epochs, labels paired" $(recs "$c" 3)
	one_producer "$c" 3
	cpu_line "$c" 3
done

# --- d: a late joiner ------------------------------------------------------------
# Slow jobs (0.2 s a batch, 10 batches an epoch, 4 epochs). The joiner starts
# with the others but waits at a barrier of its own until job 1 has trained 5
# batches: it joins in the middle of epoch 0, where the ring (depth 4) no
# longer holds the epoch's start, whatever an import costs (torch 2's takes
# 5 s here). It reads the rest of the stream's epoch, then makes the head
# privately: its first epoch is whole, len(loader) batches taken with next()
# and no try (--exact-len). Before, it was the suffix (80 of 160 samples)
# and the job died of StopIteration. It trains at the stream's pace (0.3 s a
# batch of 24), and keeps its place at the stream's next epoch start while it
# makes the head (the producer waits half a second once), so its later
# epochs are the stream's, whole. Leaving that place as soon as the producer
# waited, it stayed out of step: 96, 128 and 144 samples of its epochs 1-3
# made privately. (dl: a head too long to wait for is gathered instead.)
job d 1 1 --seed 1 --model a --batch-size 16 --workers 2 --epochs 4 --sleep 0.2 --barrier "$T_TMP/d.go:3"
job d 2 1 --seed 2 --model b --batch-size 16 --workers 2 --epochs 4 --sleep 0.2 --barrier "$T_TMP/d.go:3"
job d 3 1 --seed 3 --model c --batch-size 24 --workers 2 --epochs 4 --sleep 0.3 --barrier "$T_TMP/d.go:4" --exact-len
if wait_for "$T_TMP/d.1.jsonl" '"loader":"train","epoch":0,"batch":4,' 60; then
	mkdir -p "$T_TMP/d.go" && touch "$T_TMP/d.go/joiner-go"
	# While they run, tsshim-inspect shows the loader's feed: key, producer, consumers, service.
	feed_seen=
	for _ in $(seq 1 100); do
		"$INSPECT" --json >"$T_TMP/d.list" 2>/dev/null
		name=$("$PY" -c 'import json,sys
for s in json.load(open(sys.argv[1]))["sessions"]:
    if s["name"].startswith(sys.argv[2] + ".") and (s.get("loader") or "").startswith("ImageFolder"):
        print(s["name"])' "$T_TMP/d.list" "$(session_name d)" 2>/dev/null | head -n 1)
		if [ -n "$name" ] && "$INSPECT" "$name" --json >"$T_TMP/d.feed" 2>/dev/null &&
			"$PY" -c 'import json,sys
s = json.load(open(sys.argv[1]))["session"]
f = s["feed"]
roles = sorted(m["role"] for m in s["members"] if m["state"] == "live")
ok = s["producer"] is not None and roles.count("consumer") >= 2 and f["samples_served"] > 0 \
    and f["cpu_ns_saved"] > 0 and s["counters"]["batches_shared"] > 0 and len(f["key"]) == 16
print("feed %s: %s; producer pid %d, %d consumers, %d samples served, %.2f s CPU saved" % (
    f["key"], f["label"], s["producer"]["pid"], roles.count("consumer"), f["samples_served"],
    f["cpu_ns_saved"] / 1e9))
sys.exit(0 if ok else 1)' "$T_TMP/d.feed" >"$T_TMP/d.feedline" 2>&1; then
			feed_seen=1
			break
		fi
		sleep 0.2
	done
	check "(d) tsshim-inspect shows the running feed: $(cat "$T_TMP/d.feedline" 2>/dev/null)" [ -n "$feed_seen" ]
	finished d 3
	first=$(grep '"loader":"train","epoch":0,"batch"' "$T_TMP/d.3.jsonl" | grep -o '"n":[0-9]*' | cut -d: -f2 | total)
	check "(d) the late joiner's first epoch holds all $NTRAIN samples ($first), in len(loader) batches taken with next() (no StopIteration)" \
		[ "$first" = "$NTRAIN" ]
	verify d "late joiner: each epoch the stream's (whole, or its suffix then its head made privately)" $(recs d 3)
	grep '^note: stream\|^note: .*made privately' "$T_TMP/d.verify" | sed 's/^note: /# (d) /'
	check "(d) the joiner's first epoch was the rest of the stream's, then its head made privately" \
		grep -q '^note: d\.3\.jsonl epoch 0: stream positions [0-9]*\.\.[0-9]*, then [0-9]* samples made privately' \
		"$T_TMP/d.verify"
	later=$(grep '"loader":"train","epoch":[1-9][0-9]*,"batch"' "$T_TMP/d.3.jsonl" | grep -o '"pv":[0-9]*' | cut -d: -f2 | total)
	check "(d) the joiner kept its place meanwhile: its later epochs are the stream's, whole, none of it made privately ($later samples)" \
		[ "$later" = 0 ]
else
	not_ok "(d) the first job recorded no 5th training batch within 60 s"
	mkdir -p "$T_TMP/d.go" && touch "$T_TMP/d.go/joiner-go"
	finished d 3
fi

# --- dl: a late joiner slower than the stream ------------------------------------
# Job 2 joins late in epoch 0 and trains slowly in it (1.2 s a batch): making
# its head privately takes longer than the stall time (5 s with
# TSSHIM_TIMEOUT_MS=500). It keeps its place at the stream's next epoch start
# only while the producer's wait and what it has left fit in half the stall
# time (case d: they do); here, once the producer has filled the ring (depth
# 4) and waits, it makes no more of it: it gathers the samples it still
# lacks from the stream's next epoch as that comes, in the stream's order,
# at its own pace (a consumer that slow holds the producer to its pace, as
# any slow consumer does, but never for the stall time). The rest of that
# stream epoch is not its: its next epoch is the stream epoch after, whole,
# in step with job 1, and so is the one after. Before, it held its place
# until the producer evicted it after the stall time (a 5.3 s pause); held
# for good, the producer trained no batch while job 2 made its head (a 6.4 s
# pause with the default stall time); leaving that place (the last policy),
# its next epochs began where the stream was then, out of step: the rest of
# a stream epoch, and its head made privately, every epoch.
# Its loader's workers take 6 s to start (--worker-start), more than the
# stall time, as workers that load a large index do. Its steps alone (1.2 s
# for each of the 5-6 batches it lacks) already outlast half the stall time,
# so it gathers at once, making no batch. Before, it made one first to learn
# its pace: that batch waited for the workers, and the producer, waiting on
# its place, evicted it meanwhile (a 5.3 s pause, and its next epochs out of
# step); make asan's slow workers did the same to this case and db.
# (dd) The same with drop_last and other batch sizes (36 for the stream, 144
# samples an epoch, and 24 for the joiner) and a ring of 2: the joiner's
# reads span the stream's batches, so what it gathers is copied out of
# them; the samples the stream's next epoch dropped with its last batch are
# made privately once that epoch ends (its record: "not gathered"). Its
# steps are short (0.2 s, still slower than the stream's 0.1 s for 36
# samples, so the producer already waits on it when it begins its head)
# and its workers start in 1 s: its steps alone would fit, so it makes one
# batch, and what that took tells it to gather.
# late_go CASE WHEN N: once job 1's record has WHEN, let CASE's joiners go
# (they wait at a barrier for "joiner-go"); when it never does, say so and
# wait for the N jobs: 1
late_go() {
	local c=$1 seen=0
	wait_for "$T_TMP/$c.1.jsonl" "$2" 60 && seen=1
	mkdir -p "$T_TMP/$c.go" && touch "$T_TMP/$c.go/joiner-go"
	[ $seen = 1 ] && return 0
	not_ok "($c) the first job recorded no $2 within 60 s"
	finished "$c" "$3"
	return 1
}
# slow_joiner CASE DEPTH WHEN JOB1-ARGS -- JOB2-ARGS: job 2 joins once job 1's record has WHEN
slow_joiner() {
	local c=$1 depth=$2 when=$3 a1=() pause later
	shift 3
	SJ_KEPT=
	while [ "$1" != -- ]; do a1+=("$1"); shift; done
	shift
	TSSHIM_DEPTH=$depth TSSHIM_TIMEOUT_MS=500 job "$c" 1 1 --seed 1 --model a --workers 2 --epochs 4 "${a1[@]}" \
		--barrier "$T_TMP/$c.go:1"
	TSSHIM_DEPTH=$depth TSSHIM_TIMEOUT_MS=500 job "$c" 2 1 --seed 2 --model b --workers 2 --epochs 3 --sleep 1.2 \
		--sleep-epochs 1 "$@" --barrier "$T_TMP/$c.go:3" --exact-len
	late_go "$c" "$when" 2 || return
	finished "$c" 2
	pause=$("$PY" -c 'import json,sys
t = [r["t"] for r in map(json.loads, open(sys.argv[1])) if r.get("loader") == "train" and "h" in r]
print("%.1f" % max(b - a for a, b in zip(t, t[1:])))' "$T_TMP/$c.1.jsonl" 2>/dev/null)
	# The case's premise is a producer that waits on the joiner. One that
	# itself pauses longer than the stall time while the joiner makes its head
	# (make asan: its spawned workers restart at each epoch, 9.3 s once) never
	# does, and the joiner rightly keeps its place, making its whole head
	# privately: its next epochs are then the stream's epochs 1 and 2.
	if ! grep -q ': gathering them from' "$T_TMP/$c.2.err" && awk "BEGIN {exit !(${pause:-0} >= 5)}"; then
		SJ_KEPT=1
		echo "# ($c) the producer paused ${pause} s on its own, past the stall time: the joiner kept its place"
		check "($c) the slow joiner made its head privately while the producer paused on its own" \
			grep -q 'finishing the epoch privately ([0-9]* samples made before it joined)' "$T_TMP/$c.2.err"
	else
		check "($c) the slow joiner gathered the rest of its head when the producer waited on it: $(grep -o 'our place, and .*: gathering' "$T_TMP/$c.2.err" | sed 's/^our place, and //; s/: gathering$//')" \
			grep -q "the producer waits on our place, and .*: gathering them from the stream's next epoch" "$T_TMP/$c.2.err"
	fi
	check "($c) the producer did not have to evict it (its longest pause ${pause:-?} s)" \
		cond "! grep -q 'evicted (too slow)' '$T_TMP/$c.2.err'"
	verify "$c" "slow late joiner: each epoch the stream's (whole, or its suffix then its head made privately and gathered)" $(recs "$c" 2)
	# a loader whose sharing went off says why (dw under make asan, once: unknown)
	grep -h 'sharing off for this loader' "$T_TMP/$c.1.err" "$T_TMP/$c.2.err" | sed "s/^/# ($c) /"
	grep '^note: .*made privately\|^note: stream' "$T_TMP/$c.verify" | sed "s/^note: /# ($c) /"
	later=$(grep '"loader":"train","epoch":[1-9][0-9]*,"batch"' "$T_TMP/$c.2.jsonl" | grep -o '"[pg]v":[0-9]*' | cut -d: -f2 | total)
	local next=2
	[ -n "$SJ_KEPT" ] && next=1
	check "($c) back in step: its next epochs are the stream's epochs $next and $((next + 1)), whole, as job 1's ($later samples made privately or gathered)" \
		cond "[ '$later' = 0 ] && grep -q '^note: stream epochs per job: $c\.1\.jsonl 0\.\.3, $c\.2\.jsonl 0\.\.0, $c\.2\.jsonl $next\.\.$((next + 1))' '$T_TMP/$c.verify'"
}
# gathered CASE CHECK...: CHECK (a check of how the joiner gathered) unless it kept its place (SJ_KEPT)
gathered() {
	if [ -n "$SJ_KEPT" ]; then
		echo "# ($1) not checked, the joiner kept its place: ${2%%:*}"
		return
	fi
	shift
	check "$@"
}
# made_first CASE: samples job 2 made privately in epoch 0 before its first gathered one
made_first() {
	"$PY" -c 'import json,sys
n = 0
for r in map(json.loads, open(sys.argv[1])):
    if r.get("loader") == "train" and r.get("epoch") == 0 and "h" in r:
        if r.get("gv"):
            break
        n += r.get("pv", 0)
print(n)' "$T_TMP/$1.2.jsonl" 2>&1
}
slow_joiner dl 4 '"loader":"train","epoch":0,"batch":5,' --batch-size 16 --sleep 0.25 -- --batch-size 16 --worker-start 6
made=$(made_first dl)
gathered dl "(dl) its steps alone outlast the budget: it gathered before making a batch (made $made samples first)" \
	[ "$made" = 0 ]
slow_joiner dd 2 '"loader":"train","epoch":0,"batch":2,' --batch-size 36 --drop-last --sleep 0.1 -- \
	--batch-size 24 --drop-last --sleep 0.2 --worker-start 1
made=$(made_first dd)
gathered dd "(dd) its steps alone fit the budget: it made a batch, then gathered ($made samples made first)" \
	cond "[ '$made' -gt 0 ] 2>/dev/null"
gathered dd "(dd) what the stream's next epoch lacked was made privately after it: $(grep -o -m 1 '[0-9]* samples not gathered' "$T_TMP/dd.2.err")" \
	grep -q "finishing the epoch privately ([0-9]* samples not gathered)" "$T_TMP/dd.2.err"
# (dw) A joiner whose steps are short (0.3 s, so its head fits the budget at
# that pace) but whose workers take 6 s to start: nothing before its first
# batch tells it. The layer waits for that batch on a thread and looks at the
# producer meanwhile: once the producer's wait on its place passes half the
# stall time, it drops the batch and gathers. Before, it waited for the
# batch, and the producer evicted it (by hand: a 5.3 s pause; the joiner,
# evicted, made its whole head privately, 14 s, and its next epochs were its
# own, not the stream's).
slow_joiner dw 4 '"loader":"train","epoch":0,"batch":5,' --batch-size 16 --sleep 0.25 -- \
	--batch-size 16 --sleep 0.3 --worker-start 6
made=$(made_first dw)
gathered dw "(dw) its first private batch outlasted the producer's wait: it dropped it and gathered (made $made samples first)" \
	cond "[ '$made' = 0 ] && grep -q 'our private loader has not made its next batch in [0-9.]* s ([0-9]* samples left to make): gathering' '$T_TMP/dw.2.err'"

# --- db: joiners that break out of an epoch while they gather ---------------------
# Jobs 2 and 3 join late in epoch 0 and train slowly in it (1.2 s a batch):
# they gather, as in dl, and break out of every epoch after 7 batches
# (--break-after), inside what they gather. The rest of the stream epoch
# they gathered from is still not theirs: job 2's next epoch begins at the
# stream epoch after it (it reads past the rest without a copy), so its 7
# batches are the first 7 of job 1's epoch 2; without that, they were the
# next 7 of the stream epoch it gathered from. Job 3 breaks out of its
# first epoch only (--break-epochs 1) and checkpoints for 9 s after it,
# longer than the stall time: the producer evicts it meanwhile, and its
# next epoch begins afresh (where the ring still holds a stream epoch's
# start, else at the head, what it missed made privately): whole, in
# len(loader) batches taken with next(). Before, the head it noted was
# forgotten as that epoch began, and the job died of StopIteration. Job 1
# runs 5 epochs, so it still produces when job 3 is back (with 4, job 3's
# next epoch began as job 1's last did, 0.2 s before it ended, here).
TSSHIM_TIMEOUT_MS=500 job db 1 1 --seed 1 --model a --batch-size 16 --workers 2 --epochs 5 --sleep 0.25 \
	--barrier "$T_TMP/db.go:1"
for i in 2 3; do
	extra=()
	[ "$i" = 3 ] && extra=(--break-epochs 1 --pause-after-first 9 --exact-len)
	TSSHIM_TIMEOUT_MS=500 job db "$i" 1 --seed "$i" --model b --batch-size 16 --workers 2 --epochs 3 --sleep 1.2 \
		--sleep-epochs 1 --break-after 7 "${extra[@]}" --barrier "$T_TMP/db.go:4"
done
if late_go db '"loader":"train","epoch":0,"batch":5,' 3; then
	finished db 3
	for i in 2 3; do
		check "(db) job $i gathered the rest of its head: $(grep -o 'the [0-9]* samples we have left to make take about [0-9.]* s' "$T_TMP/db.$i.err")" \
			grep -q "gathering them from the stream's next epoch" "$T_TMP/db.$i.err"
	done
	same=$("$PY" -c 'import json,sys
def seq(p, e):
    return [h for r in map(json.loads, open(p)) if r.get("loader") == "train" and r.get("epoch") == e and "h" in r
            for h in r["h"]]
a, b = seq(sys.argv[1], 2), seq(sys.argv[2], 1)
print("%d of %d" % (sum(1 for x, y in zip(a, b) if x == y), len(b)))' "$T_TMP/db.1.jsonl" "$T_TMP/db.2.jsonl" 2>&1)
	check "(db) job 2's next epoch begins where job 1's epoch 2 does: $same samples the same" \
		cond "[ '$same' = '112 of 112' ]"
	check "(db) job 3, evicted while it checkpointed, began its next epoch afresh" \
		grep -q 'evicted (too slow) before this epoch; it begins afresh' "$T_TMP/db.3.err"
	n1=$(grep '"loader":"train","epoch":1,"batch"' "$T_TMP/db.3.jsonl" | grep -o '"n":[0-9]*' | cut -d: -f2 | total)
	check "(db) that epoch holds all $NTRAIN samples ($n1)" [ "$n1" = "$NTRAIN" ]
	verify db "joiners that break out while they gather: every epoch a run of the stream, no sample twice" $(recs db 3)
fi

# --- dk: the producer killed while a joiner gathers ------------------------------
# As dl, with jobs 1 and 3 reading the stream from the start: the one that
# produces is SIGKILLed at job 2's first gathered batch. The other takes
# over and makes the rest of that stream epoch, from which job 2 gathers
# what it still lacks; job 2's epoch is whole (len(loader) batches taken
# with next()), and its next epochs are the stream's, in step with the
# successor's.
TSSHIM_TIMEOUT_MS=500 job dk 1 1 --seed 1 --model a --batch-size 16 --workers 2 --epochs 4 --sleep 0.25 \
	--barrier "$T_TMP/dk.go:2"
TSSHIM_TIMEOUT_MS=500 job dk 3 1 --seed 3 --model c --batch-size 16 --workers 2 --epochs 4 --sleep 0.25 \
	--barrier "$T_TMP/dk.go:2"
TSSHIM_TIMEOUT_MS=500 job dk 2 1 --seed 2 --model b --batch-size 16 --workers 2 --epochs 3 --sleep 1.2 \
	--sleep-epochs 1 --barrier "$T_TMP/dk.go:4" --exact-len
if late_go dk '"loader":"train","epoch":0,"batch":5,' 3; then
	if wait_for "$T_TMP/dk.2.jsonl" '"gv":' 60; then
		prod=1 succ=3
		grep '"loader":"train".*"h":' "$T_TMP/dk.3.jsonl" | tail -n 1 | grep -q '"role":1' && prod=3 succ=1
		kill -9 "$(job_pid dk $prod)"
		finished dk 3 $prod
		check "(dk) job $succ took over from job $prod, killed while job 2 gathered" \
			cond "grep '\"loader\":\"train\".*\"h\":' '$T_TMP/dk.$succ.jsonl' | tail -n 1 | grep -q '\"role\":1'"
		verify dk "producer killed while a joiner gathers: every epoch whole, the gathered part the stream's" $(recs dk 3)
		grep '^note: .*gathered\|^note: stream' "$T_TMP/dk.verify" | sed 's/^note: /# (dk) /'
		later=$(grep '"loader":"train","epoch":[1-9][0-9]*,"batch"' "$T_TMP/dk.2.jsonl" | grep -o '"[pg]v":[0-9]*' | cut -d: -f2 | total)
		check "(dk) job 2's next epochs are the stream's, whole, as job $succ's ($later samples made privately or gathered)" \
			cond "[ '$later' = 0 ] && grep '^note: stream epochs per job: ' '$T_TMP/dk.verify' | grep 'dk\.2\.jsonl 2\.\.3' | grep -q 'dk\.$succ\.jsonl 0\.\.3'"
	else
		not_ok "(dk) job 2 recorded no gathered batch within 60 s"
		finished dk 3
	fi
fi

# --- de: a joiner evicted while it gathers ----------------------------------------
# As dl; job 2 is stopped for 8 s at its first gathered batch, longer than
# the stall time: the producer evicts it. The stream epoch it gathered from
# is its place no more, and the head is no substitute (it may be a later
# stream epoch already): it makes what it still lacks privately, and its
# next epoch begins afresh. Its epoch is whole, what it gathered the
# stream's next epoch's, in its order. Before, it gathered on from the head:
# 30 samples of two stream epochs ("its 30 gathered samples are not ...'s
# next stream epoch's, in its order").
TSSHIM_TIMEOUT_MS=500 job de 1 1 --seed 1 --model a --batch-size 16 --workers 2 --epochs 3 --sleep 0.25 \
	--barrier "$T_TMP/de.go:1"
TSSHIM_TIMEOUT_MS=500 job de 2 1 --seed 2 --model b --batch-size 16 --workers 2 --epochs 2 --sleep 1.2 \
	--sleep-epochs 1 --barrier "$T_TMP/de.go:3" --exact-len
if late_go de '"loader":"train","epoch":0,"batch":5,' 2; then
	if wait_for "$T_TMP/de.2.jsonl" '"gv":' 60; then
		kill -STOP "$(job_pid de 2)"
		sleep 8
		kill -CONT "$(job_pid de 2)"
	else
		not_ok "(de) job 2 recorded no gathered batch within 60 s"
	fi
	finished de 2
	check "(de) job 2 was evicted while it gathered, and made the rest privately: $(grep -o -m 1 '[0-9]* samples not gathered' "$T_TMP/de.2.err")" \
		grep -q 'samples not gathered (evicted (too slow) while gathering)' "$T_TMP/de.2.err"
	verify de "joiner evicted while it gathers: its epoch whole, what it gathered the next stream epoch's" $(recs de 2)
	grep '^note: .*gathered' "$T_TMP/de.verify" | sed 's/^note: /# (de) /'
fi

# --- e: the producer dies mid-epoch ----------------------------------------------
# Killed once every job reads the stream (a producer killed before the others
# joined would just leave a dead session, which the next job replaces).
job e 1 1 --seed 1 --model a --batch-size 16 --workers 2 --epochs 3 --sleep 0.1
job e 2 1 --seed 2 --model b --batch-size 16 --workers 2 --epochs 3 --sleep 0.1
job e 3 1 --seed 3 --model c --batch-size 32 --workers 2 --epochs 3 --sleep 0.1
victim=
if wait_for "$T_TMP/e.1.jsonl" '"loader":"train","epoch":0,"batch":0,' 60 &&
	wait_for "$T_TMP/e.2.jsonl" '"loader":"train","epoch":0,"batch":0,' 60 &&
	wait_for "$T_TMP/e.3.jsonl" '"loader":"train","epoch":0,"batch":0,' 60; then
	sleep 0.3
	for i in 1 2 3; do
		if [ -s "$T_TMP/e.$i.jsonl.workers" ]; then victim=$i; break; fi
	done
fi
if [ -n "$victim" ]; then
	vpid=$(job_pid e "$victim")
	kill -KILL "$vpid"
	echo "# (e) SIGKILLed job $victim (pid $vpid), the one that started workers, after $(grep -c '"batch"' "$T_TMP/e.$victim.jsonl") batches"
	finished e 3 "$victim"
	verify e "producer killed: the others' epochs complete, one stream" $(recs e 3)
	grep '^note: stream' "$T_TMP/e.verify" | sed 's/^note: /# (e) /'
	for i in 1 2 3; do
		[ "$i" = "$victim" ] && continue
		echo "# (e) job $i: workers started $(field "$T_TMP/e.$i.jsonl" workers_started) (one survivor takes over)"
	done
else
	not_ok "(e) no job recorded a batch within 60 s, or none started workers"
	finished e 3
fi

# --- f: different transforms do not share ---------------------------------------
job f 1 1 --seed 1 --model a --batch-size 64 --workers 2 --epochs 2 --transform std
job f 2 1 --seed 2 --model b --batch-size 64 --workers 2 --epochs 2 --transform other
finished f 2
verify f "different transforms: per-job checks" --mode plain $(recs f 2)
check "(f) different transforms: both jobs started their own workers ($(field "$T_TMP/f.1.jsonl" workers_started), $(field "$T_TMP/f.2.jsonl" workers_started))" \
	all_started f 2

# --- g: validation loaders share among themselves --------------------------------
job g 1 1 --barrier "$T_TMP/g.go:3" --seed 1 --model a --batch-size 64 --val-batch-size 8 --workers 2 --epochs 2 --val
job g 2 1 --barrier "$T_TMP/g.go:3" --seed 2 --model b --batch-size 32 --val-batch-size 16 --workers 2 --epochs 2 --val
job g 3 1 --barrier "$T_TMP/g.go:3" --seed 3 --model c --batch-size 96 --val-batch-size 5 --workers 2 --epochs 2 --val
finished g 3
verify g "--val: one train stream, every val epoch the val split in order" $(recs g 3)
some_consumer g 3 train
some_consumer g 3 val
cpu_line g 3

# --- h: subclass, spawn + persistent workers, plain -----------------------------
# (their batches are dicts {"y", "x"}, unpacked by position: consumers must get the
# collate function's key order; sorted, they trained on labels as images)
job h 1 1 --barrier "$T_TMP/h.go:3" --seed 1 --model a --batch-size 64 --workers 2 --epochs 2 --subclass --dict-batch
job h 2 1 --barrier "$T_TMP/h.go:3" --seed 2 --model b --batch-size 32 --workers 2 --epochs 2 --start-method spawn --persistent --dict-batch
job h 3 1 --barrier "$T_TMP/h.go:3" --seed 3 --model c --batch-size 48 --workers 2 --epochs 2 --dict-batch
finished h 3
verify h "DataLoader subclass, spawn+persistent and plain jobs, dict batches: one stream" $(recs h 3)
one_producer h 3
cpu_line h 3

# --- i: Ctrl-C in a waiting consumer; --break-after in a consumer ---------------
# Job 1 produces slowly; job 2 breaks out of every epoch after 2 batches; job 3
# gets SIGINT while it waits for data: KeyboardInterrupt within a moment, and
# the others go on. Jobs 2 and 3 start 0.3 s after the barrier all three
# reach once torch is imported (started after job 1's first batch instead,
# they came after it had ended with torch 2, whose import takes 5 s here).
job i 1 1 --seed 1 --model a --batch-size 16 --workers 2 --epochs 3 --sleep 0.1 --barrier "$T_TMP/i.go:3"
job i 2 1 --seed 2 --model b --batch-size 16 --workers 2 --epochs 3 --sleep 0.1 --break-after 2 \
	--barrier "$T_TMP/i.go:3" --start-delay 0.3
job i 3 1 --seed 3 --model c --batch-size 16 --workers 2 --epochs 3 --sleep 0.1 --barrier "$T_TMP/i.go:3" \
	--start-delay 0.3
if wait_for "$T_TMP/i.3.jsonl" '"loader":"train","epoch":[0-9]+,"batch":1,' 60; then  # its first epoch may be a 1-batch suffix
	kill -INT "$(job_pid i 3)"
	t0=$(date +%s%N)
	{ wait "${JPID[i.3]}"; } 2>/dev/null
	rc=$? t1=$(date +%s%N)
	check "(i) SIGINT: the consumer stops with KeyboardInterrupt (exit $rc, $(((t1 - t0) / 1000000)) ms)" \
		grep -q KeyboardInterrupt "$T_TMP/i.3.err"
	unset 'JPID[i.3]'
	finished i 2
	verify i "--break-after 2: each of its epochs a window of the stream; the other jobs' epochs whole" $(recs i 3)
else
	not_ok "(i) job 3 recorded no second batch within 60 s"
	finished i 3
fi

# --- j: the producer ends before a slow consumer has read its last batches --------
# Job 1 produces (job 2 starts 0.3 s later), slowly in epoch 0 so job 2 joins
# at the stream's start, then as fast as job 2's ring space allows: it
# publishes its last epoch and exits while job 2 still trains on the epoch
# before. Job 2 is elected producer with those batches unread: it must read
# them (once it waited on its own place in the ring forever).
job j 1 1 --barrier "$T_TMP/j.go:2" --seed 1 --model a --batch-size 48 --workers 2 --epochs 3 --sleep 0.3 --sleep-epochs 1
job j 2 1 --barrier "$T_TMP/j.go:2" --seed 2 --model b --batch-size 48 --workers 2 --epochs 3 --sleep 0.6 --start-delay 0.3
finished j 2
verify j "a slow consumer outlived by its producer reads the stream to its end" $(recs j 2)
one_producer j 2
check "(j) job 2 was elected producer after job 1 ended (the case this tests)" \
	grep -q "^tsshim\[[0-9]*\]: producer of feed" "$T_TMP/j.2.err"

# stopped_producer CASE: job 1 (the producer: job 2 starts 0.3 s later) is
# SIGSTOPped mid-epoch; job 2 takes over, finishes all its epochs and exits;
# then job 1 gets SIGCONT and must finish too. 1 when the case could not be set up.
stopped_producer() {
	local c=$1 pid rc
	job "$c" 1 1 --barrier "$T_TMP/$c.go:2" --seed 1 --model a --batch-size 32 --workers 2 --epochs 3 --sleep 0.1
	job "$c" 2 1 --barrier "$T_TMP/$c.go:2" --seed 2 --model b --batch-size 48 --workers 2 --epochs 3 --sleep 0.1 \
		--start-delay 0.3
	if ! wait_for "$T_TMP/$c.2.jsonl" '"loader":"train","epoch":0,"batch":1,' 60 || [ ! -s "$T_TMP/$c.1.jsonl.workers" ]; then
		not_ok "($c) job 2 recorded no second batch within 60 s, or job 1 is not the producer"
		finished "$c" 2
		return 1
	fi
	pid=$(job_pid "$c" 1)
	kill -STOP "$pid"
	{ wait "${JPID[$c.2]}"; } 2>/dev/null
	rc=$?
	kill -CONT "$pid"
	check "($c) job 2 finished while the producer was stopped (exit $rc)" [ "$rc" = 0 ]
	unset "JPID[$c.2]"
	finished "$c" 1
}

# --- k: a stopped producer wakes up after its successor has left -------------------
# The stream went on without job 1: elected again when job 2 leaves, it must
# read the rest of its epoch and the epochs after from the feed, as
# published. The ring (TSSHIM_DEPTH=16) holds all job 2 publishes, so job 2
# never waits on job 1's place and job 1 keeps it (a member stopped for ten
# timeouts while the producer waits on it would lose its place: case l).
if TSSHIM_DEPTH=16 stopped_producer k; then
	verify k "a producer stopped past its successor's end reads what was published" $(recs k 2)
	check "(k) the woken producer kept sharing (no fallback to its own loader)" \
		cond "! grep -q 'DataLoader sharing off' '$T_TMP/k.1.err'"
fi

# --- l: a stopped producer loses its place ----------------------------------------
# As (k), but the ring (depth 4) fills while job 1 is stopped: job 2 waits on
# it for ten timeouts, evicts it and goes on. Woken, job 1 has lost its place
# and the stream's epoch has ended meanwhile: like any evicted reader, its
# epoch lacks what was published meanwhile and ends there (once an internal
# exception reached the program here); its later epochs are whole.
if stopped_producer l; then
	check "(l) job 1 was told it lost its place, and its epoch ended there" \
		grep -q "this epoch ends after" "$T_TMP/l.1.err"
	# plain checks: every sample real and paired, no repeat in an epoch, epochs
	# 1 and 2 whole; the only problems allowed are job 1's short epoch 0
	timeout 120 "$PY" "$VERIFY" --mode plain --root "$DATA" --cache "$CACHE" $(recs l 2) >"$T_TMP/l.verify" 2>&1
	other=$(grep '^FAIL' "$T_TMP/l.verify" | grep -v '^FAIL [^ ]*l\.1\.jsonl loader=train epoch=0: ')
	check "(l) plain checks ran and pass but for job 1's short epoch 0 ($(tail -n 1 "$T_TMP/l.verify"))" \
		cond "grep -q '^verify: ' '$T_TMP/l.verify' && [ -z \"\$other\" ]"
	[ -z "$other" ] || echo "$other" | head -n 5 | sed 's/^/#   /'
fi

# --- ev, ee: a consumer evicted in mid-epoch makes what it missed privately ---------
# Job 2 (a consumer) is SIGSTOPped at its third batch; the producer fills the
# ring (depth 4), waits the stall time (5 s here) for it, evicts it and goes
# on. (ev) Job 2 is woken while the stream's epoch is still under way: it
# reads on from the head, then makes privately the samples published while
# it was away. (ee) Woken after that epoch ended: what is ahead of it in the
# feed is the next epoch's, so its epoch ends there, and the samples it never
# read are made privately. Either way its epoch is whole (plain checks: every
# sample once in every epoch; (ee) its next epoch begins where the stream is,
# and what it lacks of it is made privately, as for a late joiner: before, it
# was that stream epoch's suffix, 128 of 160 samples). Before, its epoch lacked
# them (ev: a consumer checkpointing or validating for longer than the stall
# time lost them the same way), or (ee) went on into the stream's next epoch,
# training samples twice.
# evicted_consumer CASE PATTERN [ALLOWED]: wake job 2 when job 1's record has
# PATTERN; plain-check failures of ALLOWED (a record and epoch) are let pass
evicted_consumer() {
	local c=$1 pid
	TSSHIM_TIMEOUT_MS=500 job "$c" 1 1 --barrier "$T_TMP/$c.go:2" --seed 1 --model a --batch-size 8 --workers 2 \
		--epochs 2 --sleep 0.35
	TSSHIM_TIMEOUT_MS=500 job "$c" 2 1 --barrier "$T_TMP/$c.go:2" --seed 2 --model b --batch-size 16 --workers 2 \
		--epochs 2 --start-delay 0.3
	if ! wait_for "$T_TMP/$c.2.jsonl" '"loader":"train","epoch":0,"batch":2,' 60; then
		not_ok "($c) job 2 recorded no third batch within 60 s"
		finished "$c" 2
		return
	fi
	pid=$(job_pid "$c" 2)
	kill -STOP "$pid"
	wait_for "$T_TMP/$c.1.jsonl" "$2" 60
	kill -CONT "$pid"
	finished "$c" 2
	check "($c) job 2 lost its place in epoch 0 and made what it missed privately ($(grep -o 'finishing the epoch privately ([0-9]* samples published while it was away)' "$T_TMP/$c.2.err"))" \
		grep -q 'finishing the epoch privately ([0-9]* samples published while it was away)' "$T_TMP/$c.2.err"
	timeout 120 "$PY" "$VERIFY" --mode plain --root "$DATA" --cache "$CACHE" $(recs "$c" 2) >"$T_TMP/$c.verify" 2>&1
	# (ee) job 2's next epoch may begin where the stream is, as a late joiner's
	local allow=${3:-} other
	other=$(grep '^FAIL' "$T_TMP/$c.verify" | if [ -n "$allow" ]; then grep -v "^FAIL [^ ]*$allow"; else cat; fi)
	check "($c) every epoch of both jobs whole, each sample once${allow:+ (but the next epoch of job 2)}: $(tail -n 1 "$T_TMP/$c.verify")" \
		cond "grep -q '^verify: ' '$T_TMP/$c.verify' && [ -z \"\$other\" ]" ||
		echo "$other" | head -n 5 | sed 's/^/#   /'
}
# the ring fills, 5 s of stall, the eviction, more batches: (ev) woken 6 batches
# (2 s) before the epoch (20 of 8) ends; (ee) 4 batches into the next one
evicted_consumer ev '"loader":"train","epoch":0,"batch":13,'
evicted_consumer ee '"loader":"train","epoch":1,"batch":3,'
check "(ee) job 2 ended its epoch where it found the stream's over, not in the next one" \
	grep -q "the stream's epoch ended while we were away; this epoch ends here" "$T_TMP/ee.2.err"

# --- s: a job alone that breaks out of every epoch ----------------------------------
# Nobody reads its stream, so nobody needs the rest of an epoch it left: its next
# epoch is its own loader's, as without the shim (it made the rest of the epoch it
# left privately, a short epoch in another order).
job s 1 0 --seed 5 --batch-size 16 --workers 2 --epochs 3 --break-after 3
job s 2 1 --seed 5 --batch-size 16 --workers 2 --epochs 3 --break-after 3
finished s 2
same=$("$PY" - "$T_TMP/s.1.jsonl" "$T_TMP/s.2.jsonl" <<'PY'
import json, sys
def batches(p):
    return [(x["epoch"], tuple(x["h"]), tuple(x["y"])) for x in map(json.loads, open(p))
            if "batch" in x and x.get("loader") == "train"]
a, b = batches(sys.argv[1]), batches(sys.argv[2])
print("same" if a == b and len(a) == 9 else "differ (%d vs %d batches, first difference at %s)" % (
    len(a), len(b), next((i for i, (u, v) in enumerate(zip(a, b)) if u != v), "the end")))
PY
)
check "(s) a lone job breaking out of each epoch trains on the batches it trains on without the shim ($same)" \
	[ "$same" = same ]

# --- sb: a producer that breaks out of an epoch while a consumer reads on ----------
# Job 1 produces and leaves its first epoch after 9 of its 10 batches; job 2
# reads every epoch whole. The rest of that stream epoch is job 2's: job 1
# makes it for job 2 and reads past it, and its next epochs are its own
# loader's, whole, taken with next() len(loader) times (--exact-len). Before,
# job 1's next epoch was that rest, one batch, and its second next() died of
# StopIteration (a `for` loop got a 1-batch epoch).
job sb 1 1 --seed 1 --model a --batch-size 16 --workers 2 --epochs 3 --sleep 0.1 --break-after 9 \
	--break-epochs 1 --exact-len --barrier "$T_TMP/sb.go:2"
job sb 2 1 --seed 2 --model b --batch-size 16 --workers 2 --epochs 3 --sleep 0.1 --barrier "$T_TMP/sb.go:2" \
	--start-delay 0.5
finished sb 2
verify sb "a producer leaving its first epoch one batch early: every job's epochs whole" $(recs sb 2)
nb=$(grep -c '"loader":"train","epoch":[12],"batch"' "$T_TMP/sb.1.jsonl")
check "(sb) job 1's epochs 1 and 2 are whole: $nb batches of 20" [ "$nb" = 20 ]
check "(sb) job 1 made the rest of the epoch it left for job 2" \
	grep -q "producing the rest of stream epoch 1" "$T_TMP/sb.1.err"

# --- vk: one job validates every 3 steps, the other after each epoch -------------
# Job 1 validates every 3 training steps, job 2 after each epoch (a train
# loader of 100 samples in batches of 10, a validation loader of 40 in order
# in batches of 8: 5 batches, one more than the ring holds). Each came to
# wait on the other through the other loader: the validation loader's
# producer on job 2's place there (job 2 waiting in the training feed for
# the producer's next batch), until the stall time (ten timeouts) evicted
# it: both jobs stood still 10 s about once an epoch (4 epochs: 33 s, against
# 0.8 s without the shim). A job waiting in one feed is now away from the
# others it is not reading, and a producer evicts a laggard that is away at
# once (it makes what it missed as any evicted reader does). Every epoch of
# both loaders stays whole.
cat >"$T_TMP/vk_job.py" <<'PY'
import json, sys, time, torch
from torch.utils.data import Dataset, DataLoader
mode, out = sys.argv[1], open(sys.argv[2], "w")
class DS(Dataset):
    def __init__(self, n, tag): self.n, self.tag = n, tag
    def __len__(self): return self.n
    def __getitem__(self, i): return torch.tensor([float(i), float(self.tag)]), i
train = DataLoader(DS(100, 0), batch_size=10, shuffle=True)
val = DataLoader(DS(40, 1), batch_size=8)
last, gap, step = time.monotonic(), 0.0, 0
def tick():
    global last, gap
    now = time.monotonic(); gap = max(gap, now - last); last = now
def validate():
    ids = []
    for x, y in val:
        tick(); ids += y.tolist()
    out.write(json.dumps({"val": ids}) + "\n")
for ep in range(4):
    ids = []
    for x, y in train:
        tick(); time.sleep(0.02); step += 1; ids += y.tolist()
        assert x[:, 0].long().tolist() == y.tolist(), "unpaired"
        if mode == "k3" and step % 3 == 0:
            validate()
    out.write(json.dumps({"train": sorted(ids)}) + "\n")
    if mode == "epoch":
        validate()
out.write(json.dumps({"gap": round(gap, 2)}) + "\n")
PY
for i in 1 2; do
	mode=k3; [ "$i" = 2 ] && mode=epoch
	LD_PRELOAD="$TS_PRELOAD" TSSHIM_SESSION="$(session_name vk)" "${JOB_LIMIT[@]}" "$PY" "$T_TMP/vk_job.py" \
		"$mode" "$T_TMP/vk.$i.out" >"$T_TMP/vk.$i.log" 2>&1 &
	JPID[vk.$i]=$!
	T_PIDS+=($!)
done
finished vk 2
vk=$("$PY" - "$T_TMP/vk.1.out" "$T_TMP/vk.2.out" <<'PYV'
import json, sys
bad, gaps = [], []
for p in sys.argv[1:]:
    for r in map(json.loads, open(p)):
        if "train" in r and r["train"] != list(range(100)):
            bad.append("%s: a train epoch of %d samples, %d distinct" % (p[-8:], len(r["train"]), len(set(r["train"]))))
        if "val" in r and r["val"] != list(range(40)):
            bad.append("%s: a validation pass %s..." % (p[-8:], r["val"][:10]))
        if "gap" in r:
            gaps.append(r["gap"])
print("; ".join(bad[:3]) if bad else "whole, longest waits %s s" % " and ".join(map(str, gaps)))
sys.exit(1 if bad or len(gaps) != 2 or max(gaps) >= 5 else 0)
PYV
)
vkrc=$?
check "(vk) validation every 3 steps beside validation per epoch: every epoch whole, no wait of 5 s ($vk)" \
	[ "$vkrc" = 0 ]
# Job 2 was away from the validation feed between its passes (training), and lost
# its place there. Its next pass begins afresh, as at iter(), from the stream's
# newest validation epoch. Before, that pass was taken for one it had been
# reading: "the stream's epoch ended while we were away", and made privately
# (2 of its 4 passes here; found by a differential run).
gone=$(grep -c "ended while we were away" "$T_TMP/vk.2.log")
check "(vk) job 2's validation passes read the stream, none taken for an epoch it lost ($gone)" [ "$gone" = 0 ]

# --- t: a stream this torch cannot read; a fault in the layer ----------------------
# Job 1's schema names a dtype no torch has (as a newer torch's new dtype would be
# to an older one; the producer is patched to say so): job 2, a consumer, must take that data
# from shared memory as unreadable, say so and run its own loader (it died of an
# AttributeError in the layer). Job 3, a consumer whose layer is patched to fail
# (RuntimeError) when it reads a batch, must do the same: a fault of the layer is
# never the job's. Job 1 trains 0.2 s a batch, so that the others, 0.5 s
# behind, find it producing (without a step, its two epochs took 0.4 s here:
# it had left, and the case tested nothing).
cat >"$T_TMP/odd_job.py" <<'PY'
import os, runpy, sys
sys.argv = [os.environ["SHARE_JOB"]] + sys.argv[1:]
import tsshim_feed  # the layer, as the bootstrap put it on sys.path
if os.environ["ODD"] == "schema":
    plain = tsshim_feed.describe_batch
    def odd(batch, torch):
        schema, leaves, n = plain(batch, torch)
        return schema.replace(b'"dtype":"int64"', b'"dtype":"uint256"'), leaves, n
    tsshim_feed.describe_batch = odd
else:
    def fault(node, out):
        raise RuntimeError("injected")
    tsshim_feed._tensor_nodes = fault
runpy.run_path(sys.argv[0], run_name="__main__")
PY
JOB_PLAIN=$JOB
JOB="$T_TMP/odd_job.py"
SHARE_JOB=$JOB_PLAIN ODD=schema job t 1 1 --barrier "$T_TMP/t.go:3" --seed 1 --batch-size 32 --workers 0 --epochs 2 \
	--sleep 0.2
SHARE_JOB=$JOB_PLAIN ODD=fault job t 3 1 --barrier "$T_TMP/t.go:3" --start-delay 0.5 --seed 3 --batch-size 32 --workers 0 --epochs 2
JOB=$JOB_PLAIN
job t 2 1 --barrier "$T_TMP/t.go:3" --start-delay 0.5 --seed 2 --batch-size 32 --workers 0 --epochs 2
finished t 3
check "(t) job 2 said the stream's dtype is unknown to it, and ran on its own" \
	grep -q "sharing off for this loader: the stream's tensors have a dtype this torch does not know" "$T_TMP/t.2.err"
check "(t) job 3 said the layer failed, and ran on its own" \
	grep -q "sharing off for this loader: internal error: RuntimeError: injected" "$T_TMP/t.3.err"
verify t "a stream this torch cannot read, a fault in the layer: every epoch of each job whole" --mode plain $(recs t 3)

# --- tf: the layer fails in the middle of a consumer's epoch ------------------------
# Job 2's layer is patched to fail (RuntimeError) at its 4th read of the feed,
# after 3 batches of its first epoch. Sharing goes off for that loader, and the
# rest of the epoch must be the samples it was not given yet, made by a
# private loader: the epoch holds every sample once. Before, the job's own
# loader restarted for the 7 batches left, a fresh permutation, so its epoch
# repeated 36 of its first 48 samples and missed as many (2 of 2 runs); under
# make asan case dw once failed the same way. Its second epoch is its own
# loader's.
cat >"$T_TMP/fault_job.py" <<'PY'
import os, runpy, sys
sys.argv = [os.environ["SHARE_JOB"]] + sys.argv[1:]
import tsshim_feed  # the layer, as the bootstrap put it on sys.path
at = int(os.environ["FAULT_AT"])
if os.environ.get("FAULT_IN") == "private_rest":  # after that many batches made privately
    plain_rest = tsshim_feed._Epoch.private_rest
    def private_rest(self, *args, **kw):
        for n, batch in enumerate(plain_rest(self, *args, **kw), 1):
            yield batch
            if n == at:
                raise RuntimeError("injected while making the head")
    tsshim_feed._Epoch.private_rest = private_rest
else:  # at that read of the feed
    plain, calls = tsshim_feed._Epoch.read_view, [0]
    def read_view(self, *args):
        calls[0] += 1
        if calls[0] == at:
            raise RuntimeError("injected mid-epoch")
        return plain(self, *args)
    tsshim_feed._Epoch.read_view = read_view
runpy.run_path(sys.argv[0], run_name="__main__")
PY
# Job 2 starts once job 1 has trained a batch: it is the consumer, and the
# ring (depth 4) still holds the epoch's start.
job tf 1 1 --barrier "$T_TMP/tf.go:1" --seed 1 --batch-size 16 --workers 0 --epochs 2 --sleep 0.2
JOB_PLAIN=$JOB
JOB="$T_TMP/fault_job.py"
SHARE_JOB=$JOB_PLAIN FAULT_AT=4 job tf 2 1 --barrier "$T_TMP/tf.go:3" --seed 2 --batch-size 16 --workers 0 --epochs 2 \
	--exact-len
JOB=$JOB_PLAIN
late_go tf '"loader":"train","epoch":0,"batch":0,' 2 && finished tf 2
check "(tf) job 2 said the layer failed, and made the rest of its epoch privately: $(grep -o 'the rest of this epoch ([0-9]* samples' "$T_TMP/tf.2.err")" \
	cond "grep -q 'sharing off for this loader: internal error: RuntimeError: injected mid-epoch' '$T_TMP/tf.2.err' &&
		grep -q 'the rest of this epoch (112 samples it was not given yet) is made by a private loader' '$T_TMP/tf.2.err'"
# (the line names the layer's frame and the raising one: dw's one fault, stop 35, said only its type)
where=$(grep -o "injected mid-epoch ([^)]*)" "$T_TMP/tf.2.err" | head -n 1)
check "(tf) the line says where the layer failed: ${where#injected mid-epoch }" \
	grep -qE 'injected mid-epoch \(at tsshim_feed\.py:[0-9]+ in [A-Za-z_]+; raised in fault_job\.py:[0-9]+ in read_view\)' "$T_TMP/tf.2.err"
shared_first=$(grep '"loader":"train","epoch":0,"batch"' "$T_TMP/tf.2.jsonl" | head -n 3 | grep -c '"role":2')
check "(tf) job 2's first 3 batches came from the stream, as a consumer's ($shared_first of 3)" [ "$shared_first" = 3 ]
verify tf "a layer that fails after 3 shared batches: every epoch of each job whole, len(loader) batches" --mode plain $(recs tf 2)
# (tg) The same while a late joiner makes its head privately (case d's, 2 jobs):
# the layer fails after its first private batch. What it was given (the rest
# of the stream's epoch, and that batch) is left out of what is made then.
job tg 1 1 --barrier "$T_TMP/tg.go:1" --seed 1 --batch-size 16 --workers 0 --epochs 2 --sleep 0.2
JOB="$T_TMP/fault_job.py"
SHARE_JOB=$JOB_PLAIN FAULT_IN=private_rest FAULT_AT=1 job tg 2 1 --barrier "$T_TMP/tg.go:3" --seed 2 --batch-size 16 \
	--workers 0 --epochs 2 --sleep 0.2 --exact-len
JOB=$JOB_PLAIN
if late_go tg '"loader":"train","epoch":0,"batch":4,' 2; then
	finished tg 2
	made=$(grep '"loader":"train","epoch":0,"batch"' "$T_TMP/tg.2.jsonl" | grep -o '"pv":[0-9]*' | cut -d: -f2 | total)
	check "(tg) job 2 made a batch of its head privately, then the layer failed, and the rest was made privately: $made samples, $(grep -o 'the rest of this epoch ([0-9]* samples' "$T_TMP/tg.2.err")" \
		cond "[ '$made' -ge 16 ] && grep -q 'sharing off for this loader: internal error: RuntimeError: injected while making the head' '$T_TMP/tg.2.err' &&
			grep -q 'the rest of this epoch ([0-9]* samples it was not given yet) is made by a private loader' '$T_TMP/tg.2.err'"
	verify tg "a layer that fails while a joiner makes its head: every epoch of each job whole, len(loader) batches" \
		--mode plain $(recs tg 2)
fi

# --- u: what a consumer's tensors are, and what a persistent loader keeps --------------
# Two jobs of u_job.py (batch 16 both: every consumer batch is a view of the feed):
# the consumer's labels pickle to about their own size (each tensor its own
# storage, as the job's own batches; they carried the whole slot, images included),
# and a persistent_workers loader that cannot share (its batches hold strings)
# keeps no record of its batches' indices however many epochs it runs (it kept
# every batch's, for good).
cat >"$T_TMP/u_job.py" <<'PY'
import multiprocessing, os, pickle, sys, time, torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms
def named(batch):
    return [str(i) for i in range(len(batch))], torch.utils.data.default_collate(batch)
def main():
    root, out, go = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(go, exist_ok=True)
    open(os.path.join(go, str(os.getpid())), "w").close()
    while len(os.listdir(go)) < 2:  # both jobs iterate together: one of them is a consumer
        time.sleep(0.01)
    ds = datasets.ImageFolder(root + "/train", transform=transforms.Compose([transforms.Resize((32, 32)), transforms.ToTensor()]))
    sizes = []
    for epoch in range(2):
        for x, y in DataLoader(ds, batch_size=16, shuffle=True):
            sizes.append(len(pickle.dumps(y)))
    dl = DataLoader(ds, batch_size=16, num_workers=1, persistent_workers=True, collate_fn=named)
    for epoch in range(4):
        for names, b in dl:
            pass
    st = dl.__dict__.get("_tsshim_state")
    notes = len(st.rec.notes) if st is not None and st.rec is not None else 0
    with open(out, "w") as f:
        f.write("max_label_pickle=%d notes=%d\n" % (max(sizes), notes))
if __name__ == "__main__":
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        multiprocessing.set_start_method("spawn")  # as share_job.py's main() does: see there
    main()
PY
for i in 1 2; do
	LD_PRELOAD="$TS_PRELOAD" TSSHIM_SESSION="$(session_name u)" "${JOB_LIMIT[@]}" "$PY" "$T_TMP/u_job.py" "$DATA" "$T_TMP/u.$i.res" "$T_TMP/u.go" \
		>"$T_TMP/u.$i.out" 2>"$T_TMP/u.$i.err" &
	JPID[u.$i]=$!
	T_PIDS+=($!)
done
finished u 2
res="$(cat "$T_TMP/u.1.res" "$T_TMP/u.2.res" 2>/dev/null | xargs)"
check "(u) labels of a batch pickle to their own size, not the slot's; no index records kept ($res)" \
	cond "echo '$res' | grep -Eq '^max_label_pickle=[0-9]{3,4} notes=0 max_label_pickle=[0-9]{3,4} notes=0$'"

# --- v: the dataset raises, the loop catches it and goes on ----------------------------
# Sample 9 of 20 raises ValueError; the loop counts it and calls next() again, as
# DataLoader's own iterator allows. Two jobs (2 workers each) in one session must
# see what one job sees without the shim: 4 batches and 1 error per epoch, 3 epochs
# (the error ended the layer's iterator: the rest of every epoch was lost).
cat >"$T_TMP/v_job.py" <<'PY'
import multiprocessing, os, sys, time, torch
from torch.utils.data import Dataset, DataLoader
class Raising(Dataset):
    def __len__(self):
        return 20
    def __getitem__(self, i):
        time.sleep(0.01)
        if i == 9:
            raise ValueError("bad sample %d" % i)
        return torch.tensor([float(i)])
def main():
    go = sys.argv[1]
    role = sys.argv[2] if len(sys.argv) > 2 else ""  # "quitter": leaves after its first batch; "late": starts later
    if go != "-":
        os.makedirs(go, exist_ok=True)
        open(os.path.join(go, str(os.getpid())), "w").close()
        while len(os.listdir(go)) < 2:
            time.sleep(0.01)
        if role == "late":
            time.sleep(0.5)
    dl = DataLoader(Raising(), batch_size=4, num_workers=2)
    for epoch in range(3):
        it, got, errs = iter(dl), [], 0
        while True:
            try:
                b = next(it)
            except StopIteration:
                break
            except ValueError:
                errs += 1
                continue
            got.append(len(b))
            if role == "quitter":  # once the late job read it and waits for the next
                print("left after", got)
                sys.stdout.flush()
                time.sleep(1.5)
                sys.exit(0)
        print("epoch", epoch, "batches", got, "errors", errs)
if __name__ == "__main__":
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        multiprocessing.set_start_method("spawn")  # as share_job.py's main() does: see there
    main()
PY
env -u LD_PRELOAD "${JOB_LIMIT[@]}" "$PY" "$T_TMP/v_job.py" - >"$T_TMP/v.ref" 2>"$T_TMP/v.ref.err"
for i in 1 2; do
	LD_PRELOAD="$TS_PRELOAD" TSSHIM_SESSION="$(session_name v)" "${JOB_LIMIT[@]}" "$PY" "$T_TMP/v_job.py" "$T_TMP/v.go" \
		>"$T_TMP/v.$i.out" 2>"$T_TMP/v.$i.err" &
	JPID[v.$i]=$!
	T_PIDS+=($!)
done
finished v 2
check "(v) without the shim: 4 batches and 1 error in each of 3 epochs" \
	cond "[ \"\$(grep -c 'batches \[4, 4, 4, 4\] errors 1' '$T_TMP/v.ref')\" = 3 ]"
check "(v) two jobs sharing the loader see the same ($(grep -h '^epoch' "$T_TMP/v.1.out" "$T_TMP/v.2.out" | sort | uniq -c | xargs))" \
	cond "cmp -s '$T_TMP/v.ref' '$T_TMP/v.1.out' && cmp -s '$T_TMP/v.ref' '$T_TMP/v.2.out'"
# The same with a producer that leaves after its first batch: job 2 becomes its
# successor and makes the rest of epoch 0 for the feed, sample 9 included. It
# sees the exception at that next() and goes on, the rest of its epoch made
# privately (the stream stops there). Before, its epoch ended at the error.
LD_PRELOAD="$TS_PRELOAD" TSSHIM_SESSION="$(session_name vs)" "${JOB_LIMIT[@]}" "$PY" "$T_TMP/v_job.py" "$T_TMP/vs.go" quitter \
	>"$T_TMP/vs.1.out" 2>"$T_TMP/vs.1.err" &
JPID[vs.1]=$!
LD_PRELOAD="$TS_PRELOAD" TSSHIM_SESSION="$(session_name vs)" TSSHIM_LOG=info "${JOB_LIMIT[@]}" "$PY" "$T_TMP/v_job.py" "$T_TMP/vs.go" late \
	>"$T_TMP/vs.2.out" 2>"$T_TMP/vs.2.err" &
JPID[vs.2]=$!
T_PIDS+=("${JPID[vs.1]}" "${JPID[vs.2]}")
finished vs 2
check "(vs) job 1 was the producer and left after its first batch ($(cat "$T_TMP/vs.1.out"))" \
	cond "grep -q 'left after \\[4\\]' '$T_TMP/vs.1.out'"
check "(vs) its successor sees what one job sees without the shim ($(grep -h '^epoch' "$T_TMP/vs.2.out" | xargs))" \
	cond "grep -q 'producing the rest of stream epoch' '$T_TMP/vs.2.err' && cmp -s '$T_TMP/v.ref' '$T_TMP/vs.2.out'"

# --- vi: Ctrl-C inside the producer's own loader -------------------------------------
# Job 3 produces (jobs 1 and 2 begin once it has recorded a batch) and loads its
# images in its main process (no workers): its 240th image load raises
# KeyboardInterrupt inside next(), in epoch 1, as Ctrl-C there does; it does not
# catch it. The stream goes on without it: a consumer takes over the rest of the
# epoch, and jobs 1 and 2 share every epoch to the end, every epoch whole. Before,
# the interrupt stopped the stream: both went off sharing and ran their own loaders
# for the rest of their training, each in its own order (stress, seed 8448934).
job vi 3 1 --seed 3 --model c --batch-size 16 --workers 0 --epochs 3 --sleep 0.1 --interrupt-at 240 \
	--barrier "$T_TMP/vi.go:3" --mark "$T_TMP/vi.first"
job vi 1 1 --seed 1 --model a --batch-size 32 --workers 2 --epochs 3 --sleep 0.1 \
	--barrier "$T_TMP/vi.go:3" --after "$T_TMP/vi.first"
job vi 2 1 --seed 2 --model b --batch-size 48 --workers 2 --epochs 3 --sleep 0.1 \
	--barrier "$T_TMP/vi.go:3" --after "$T_TMP/vi.first"
{ wait "${JPID[vi.3]}"; } 2>/dev/null
rc=$?
check "(vi) job 3 produced and was interrupted in epoch 1, uncaught (exit $rc)" \
	cond "[ $rc = 130 ] && grep -q 'the job was interrupted (KeyboardInterrupt) in its loader' '$T_TMP/vi.3.err' &&
		grep -q '\"epoch\":1,' '$T_TMP/vi.3.jsonl' && ! grep -q '\"role\":2' '$T_TMP/vi.3.jsonl'"
finished vi 2
verify vi "an interrupted producer: the others' epochs whole, one stream" $(recs vi 3)
grep '^note: stream' "$T_TMP/vi.verify" | sed 's/^/# (vi) /'
shared2=$(grep -h '"epoch":2,"batch"' "$T_TMP/vi.1.jsonl" "$T_TMP/vi.2.jsonl" | grep -c '"role":[12]')
check "(vi) jobs 1 and 2 shared to the end: no sharing off, a successor, every epoch-2 batch shared ($shared2 of 9)" \
	cond "! grep -q 'sharing off' '$T_TMP/vi.1.err' '$T_TMP/vi.2.err' &&
		grep -q 'producing the rest of stream epoch' '$T_TMP/vi.1.err' '$T_TMP/vi.2.err' && [ '$shared2' = 9 ]"

# --- w: a collate function that pads each batch to its longest sample ---------------
# Sample i is 1 + i // 10 long; the collate function pads a batch to its longest
# (so the second batch of 5 holding a sample of 2 changes shape, and the producer
# stops sharing). The consumer (batch size 8) has read 8 and holds 2 of its next
# batch; the rest of its epoch is made privately, and the part it holds (width 1)
# cannot be glued to the first private batch (width 2). Both go to it as they
# are: every epoch of both jobs holds samples 0..59 once, in order, each padded
# as the collate function pads it. Before, torch.cat's RuntimeError reached the
# job from inside its for loop.
cat >"$T_TMP/w_job.py" <<'PY'
import os, sys, time, torch
from torch.utils.data import Dataset, DataLoader
go, bs, lead = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "lead"
os.makedirs(go, exist_ok=True)
open(os.path.join(go, str(os.getpid())), "w").close()
while len(os.listdir(go)) < 2:
    time.sleep(0.01)
if not lead:
    time.sleep(0.3)  # the leader opens the feed first: it produces
class Seq(Dataset):
    def __len__(self):
        return 60
    def __getitem__(self, i):
        return torch.full((1 + i // 10,), i, dtype=torch.int64)
def pad(batch):
    out = torch.zeros(len(batch), max(len(x) for x in batch), dtype=torch.int64)
    for k, x in enumerate(batch):
        out[k, :len(x)] = x
    return out
def padded_right(b):  # each row its sample id, 1 + id // 10 times, then zeros; no wider than needed
    ids = b[:, 0].tolist()
    want = pad([torch.full((1 + i // 10,), i, dtype=torch.int64) for i in ids])
    return b.shape == want.shape and torch.equal(b, want)
dl = DataLoader(Seq(), batch_size=bs, collate_fn=pad)
for epoch in range(2):
    ids, sizes, ok = [], [], True
    for b in dl:
        ids += b[:, 0].tolist()
        sizes.append(b.shape[0])
        ok &= padded_right(b)
        if lead and epoch == 0 and len(sizes) <= 3:
            time.sleep(0.6)  # the consumer reads batches 0 and 1 before batch 2 fails to publish
    print("epoch", epoch, "in order", ids == list(range(60)), "padded", ok, "sizes", sizes, flush=True)
PY
for i in 1 2; do
	LD_PRELOAD="$TS_PRELOAD" TSSHIM_SESSION="$(session_name w)" TSSHIM_LOG=info "${JOB_LIMIT[@]}" "$PY" "$T_TMP/w_job.py" \
		"$T_TMP/w.go" "$((i == 1 ? 5 : 8))" "$([ "$i" = 1 ] && echo lead || echo follow)" >"$T_TMP/w.$i.out" 2>"$T_TMP/w.$i.err" &
	JPID[w.$i]=$!
	T_PIDS+=($!)
done
finished w 2
check "(w) the consumer got the part it held and the private batch as they are ($(grep -o 'sizes.*' "$T_TMP/w.2.out" | head -1))" \
	grep -q "does not match the next one; both go to the job as they are" "$T_TMP/w.2.err"
for i in 1 2; do
	check "(w) job $i: both epochs hold samples 0..59 in order, each batch padded as its collate function pads it" \
		cond "[ \"\$(grep -c 'in order True padded True' '$T_TMP/w.$i.out')\" = 2 ]"
done

# --- x: a consumer draws the random numbers its own loader would -------------------
# Each epoch, a job's own DataLoader draws from torch's generator: a new
# iterator's base seed (once for good with persistent workers) and its
# sampler's seed. A consumer runs no iterator of its own; it now makes the same
# draws, so its later torch.rand() values are those of the same job without
# the shim. Before, they differed from the first epoch on. --rng-probe records
# torch.rand() after each epoch; job 3 is job 2 without the shim. Job 1 trains
# slowly in epoch 0 (0.2 s a batch), so that job 2, 0.3 s behind it, finds
# the stream's first batches still in the ring (else it would make that head
# privately, with workers of its own, as a late joiner does: case d).
for pers in "" --persistent; do
	c=x${pers:+p}
	job "$c" 1 1 --barrier "$T_TMP/$c.go:2" --seed 1 --batch-size 16 --workers 2 $pers --epochs 3 --rng-probe \
		--sleep 0.2 --sleep-epochs 1
	job "$c" 2 1 --barrier "$T_TMP/$c.go:2" --start-delay 0.3 --seed 2 --batch-size 16 --workers 2 $pers --epochs 3 --rng-probe
	job "$c" 3 0 --seed 2 --batch-size 16 --workers 2 $pers --epochs 3 --rng-probe
	finished "$c" 3
	probes() { grep -o '"rng":[0-9.e-]*' "$T_TMP/$1.jsonl" | cut -d: -f2 | xargs; }
	check "($c) workers 2${pers:+, persistent}: the consumer started no worker (workers: $(wc -l <"$T_TMP/$c.2.jsonl.workers"))" \
		cond "[ ! -s '$T_TMP/$c.2.jsonl.workers' ]"
	check "($c) the consumer's torch.rand() after each epoch is the job's without the shim ($(probes "$c.2") / $(probes "$c.3"))" \
		cond "[ -n \"\$(probes $c.3)\" ] && [ \"\$(probes $c.2)\" = \"\$(probes $c.3)\" ]"
done

# --- xs, xo: a consumer that runs its own loader later, persistent workers --------------
# A persistent_workers loader makes one iterator for good, and draws its workers'
# base seed once, from torch's generator. A consumer makes that draw in its first
# epoch, as its own iterator would (x). When it later runs its own loader, the
# iterator it makes then must not draw again, and its workers get that first
# seed. xs: the producer (job 1) leaves after epoch 0; job 2, its consumer, is
# elected and produces epochs 1 and 2 with its own loader. xo: job 1 (patched,
# no workers) cannot carry its batches from epoch 1's fourth on; job 2 finishes
# that epoch privately and runs its own loader, unshared, in epoch 2. Job 3 is job 2 without
# the shim. Before, job 2's own iterator drew a second base seed: its torch.rand()
# after epoch 1 (xs) or 2 (xo) on, and its workers' seeds, were not the job's.
cat >"$T_TMP/late_job.py" <<'PY'
import os, runpy, sys
sys.argv = [os.environ["SHARE_JOB"]] + sys.argv[1:]
import tsshim_feed  # the layer, as the bootstrap put it on sys.path
plain, calls = tsshim_feed.describe_batch, [0]
def late(batch, torch):  # the producer's batches cannot be carried after the first CARRY
    calls[0] += 1
    if calls[0] > int(os.environ["CARRY"]):
        raise tsshim_feed.NotCarried("test: not carried from here on")
    return plain(batch, torch)
tsshim_feed.describe_batch = late
runpy.run_path(sys.argv[0], run_name="__main__")
PY
probes() { grep -o '"rng":[0-9.e-]*' "$T_TMP/$1.jsonl" | cut -d: -f2 | xargs; }
train_seeds() { # JOB N: the seeds of the last N train-loader workers it started
	grep '^train ' "$T_TMP/$1.jsonl.workers-seed" 2>/dev/null | tail -n "$2" | cut -d' ' -f3 | sort -n | xargs
}
for c in xs xo; do
	if [ "$c" = xs ]; then
		job xs 1 1 --barrier "$T_TMP/xs.go:2" --seed 1 --batch-size 16 --workers 2 --persistent --epochs 1 --rng-probe
	else
		JOB_PLAIN=$JOB
		JOB="$T_TMP/late_job.py"
		SHARE_JOB=$JOB_PLAIN CARRY=13 job xo 1 1 --barrier "$T_TMP/xo.go:2" --seed 1 --batch-size 16 --workers 0 --epochs 3
		JOB=$JOB_PLAIN
	fi
	job "$c" 2 1 --barrier "$T_TMP/$c.go:2" --start-delay 0.3 --seed 2 --batch-size 16 --workers 2 --persistent --epochs 3 --rng-probe
	job "$c" 3 0 --seed 2 --batch-size 16 --workers 2 --persistent --epochs 3 --rng-probe
	finished "$c" 3
	if [ "$c" = xs ]; then
		check "(xs) job 2 consumed epoch 0, then produced with its own loader (train workers: $(loader_workers "$T_TMP/xs.2.jsonl" train))" \
			cond "grep -q 'consumer of feed' '$T_TMP/xs.2.err' && grep -q 'producer of feed' '$T_TMP/xs.2.err' &&
				[ \"\$(loader_workers '$T_TMP/xs.2.jsonl' train)\" -gt 0 ]"
	else
		check "(xo) job 2 consumed, finished epoch 1 privately when its producer stopped sharing, then ran its own loader" \
			cond "grep -q 'consumer of feed' '$T_TMP/xo.2.err' && grep -q 'finishing the epoch privately' '$T_TMP/xo.2.err' &&
				grep -q 'sharing off for this loader: the producer found the batches cannot be shared' '$T_TMP/xo.2.err'"
	fi
	check "($c) job 2's torch.rand() after each epoch is the job's without the shim ($(probes "$c.2") / $(probes "$c.3"))" \
		cond "[ -n \"\$(probes $c.3)\" ] && [ \"\$(probes $c.2)\" = \"\$(probes $c.3)\" ]"
	check "($c) job 2's persistent workers have the seeds the job's own have ($(train_seeds "$c.2" 2) / $(train_seeds "$c.3" 2))" \
		cond "[ -n \"\$(train_seeds $c.3 2)\" ] && [ \"\$(train_seeds $c.2 2)\" = \"\$(train_seeds $c.3 2)\" ]"
done

# --- y: a loop that takes exactly len(loader) batches --------------------------------
# Job 2 never asks for the StopIteration after an epoch's last batch (range(len(dl)),
# zip, islice): its epoch is over all the same, not broken off. Before, it was
# taken for a job that broke out, and its next epoch began at the head, short by
# the batches the producer (faster, so ahead by the feed's depth) had published.
job y 1 1 --seed 1 --model a --batch-size 16 --workers 2 --epochs 3 --sleep 0.01 --barrier "$T_TMP/y.go:2"
job y 2 1 --seed 2 --model b --batch-size 16 --workers 2 --epochs 3 --sleep 0.08 --exact-len --barrier "$T_TMP/y.go:2"
finished y 2
verify y "len(loader) batches taken with next(), no StopIteration asked for: every epoch whole" $(recs y 2)

# --- z: a train loader whose sharing goes off, then a validation loader --------------
# Sample 30 of the train set is wider than those before: the producer cannot carry
# batch 3, and every job's train loader goes off sharing there, its feed closed.
# From train step 3 on, each job reads one validation batch per step (the
# validation loader's feed gets the handle number the train feed had) and the
# rest of the validation epoch after the train epoch's end. Job 1 produces the
# validation stream (its first batch out before the others read theirs), job 2
# reads it slowly, job 3 waits for each batch (TSSHIM_TIMEOUT_MS=50, job 1 pausing
# 0.2 s after each of its last validation batches). Before, the end of the train
# epoch released the closed feed's handle, that is the validation feed's: job 1's
# marked job 1 idle mid-epoch (job 3 took over its stream, job 1 was "no longer
# producer"); job 2's detached job 2's reader, which came back at the head, its
# validation epoch short by what job 1 had published meanwhile. Each job also
# counts the library calls made by such an end of epoch on a handle another of
# its feeds holds (tsshim_feed._Epoch.finish patched): there must be one such
# end, and no call (2 each before: tsshim_feed_role, then _set_idle or _detach).
cat >"$T_TMP/z_job.py" <<'PY'
import os, sys, time, torch
from torch.utils.data import Dataset, DataLoader
go, n, lead = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "lead"
pause, vpause = float(sys.argv[4]), float(sys.argv[5])  # after a train step; after a val batch past the train epoch
def arrive(name):
    os.makedirs(os.path.join(go, name), exist_ok=True)
    open(os.path.join(go, name, str(os.getpid())), "w").close()
def wait_for(name, count):  # at most 10 s: a job that does not come is a failure below, not a hang
    end = time.time() + 10
    while not os.path.isdir(os.path.join(go, name)) or len(os.listdir(os.path.join(go, name))) < count:
        if time.time() > end:
            print("not all jobs came to", name, flush=True)
            return
        time.sleep(0.005)
arrive("start")
wait_for("start", n)
if not lead:
    time.sleep(0.3)  # the leader opens the train feed first: it produces
import tsshim_feed  # the layer, as the bootstrap put it on sys.path
stale = []  # per end of an epoch whose handle another feed of ours holds: its library calls
plain_finish = tsshim_feed._Epoch.finish
def finish(self):
    if not any(f.h == self.h and f is not self.feed for f in tsshim_feed._feeds.values()):
        return plain_finish(self)
    calls, lib = [], self.lib
    class Counting:
        def __getattr__(_, name):
            fn = getattr(lib, name)
            def call(*a):
                calls.append(name)
                return fn(*a)
            return call
    self.lib = Counting()
    try:
        return plain_finish(self)
    finally:
        self.lib = lib
        stale.append(calls)
tsshim_feed._Epoch.finish = finish
class Train(Dataset):
    def __len__(self):
        return 60
    def __getitem__(self, i):
        return torch.full((4 if i < 30 else 5,), i, dtype=torch.int64)
class Val(Dataset):
    def __len__(self):
        return 40
    def __getitem__(self, i):
        return torch.full((3,), i, dtype=torch.int64)
tl = DataLoader(Train(), batch_size=10)
vl = DataLoader(Val(), batch_size=5)
def open_val(epoch):
    """The leader's validation epoch starts first (it produces the stream); the
    others open the loader's feed only then, and read its first batch before the
    leader goes on."""
    if lead:
        vit = iter(vl)
        first = next(vit)
        arrive("v%d" % epoch)
        wait_for("r%d" % epoch, n - 1)
    else:
        wait_for("v%d" % epoch, 1)
        vit = iter(vl)
        first = next(vit)
        arrive("r%d" % epoch)
    return vit, first[:, 0].tolist()
for epoch in range(2):
    train, val, vit = [], [], None
    for k, x in enumerate(tl):
        train += x[:, 0].tolist()
        if k >= 3:  # sharing is off for the train loader by now: its feed is closed
            if vit is None:
                vit, val = open_val(epoch)
            else:
                val += next(vit)[:, 0].tolist()
        time.sleep(0.4 if lead and epoch == 0 and k < 3 else pause)  # the others read batches 0-2 from the feed
    for v in vit:  # the rest of the validation epoch, after the train epoch's end
        val += v[:, 0].tolist()
        time.sleep(vpause)
    print("epoch", epoch, "train whole", train == list(range(60)), "val whole", val == list(range(40)),
          "" if val == list(range(40)) else "val %s" % val, flush=True)
print("stale finishes", len(stale), "calls", sum(map(len, stale)), *sum(stale, []), flush=True)
PY
z_pauses=("" "0.05 0.2" "0.3 0.05" "0 0")
for i in 1 2 3; do
	LD_PRELOAD="$TS_PRELOAD" TSSHIM_SESSION="$(session_name z)" TSSHIM_LOG=info TSSHIM_TIMEOUT_MS=50 \
		"${JOB_LIMIT[@]}" "$PY" "$T_TMP/z_job.py" "$T_TMP/z.go" 3 "$([ "$i" = 1 ] && echo lead || echo follow)" \
		${z_pauses[$i]} >"$T_TMP/z.$i.out" 2>"$T_TMP/z.$i.err" &
	JPID[z.$i]=$!
	T_PIDS+=($!)
done
finished z 3
for i in 1 2 3; do
	check "(z) job $i: both epochs' train and validation batches each sample once, in order" \
		cond "[ \"\$(grep -c '^epoch . train whole True val whole True' '$T_TMP/z.$i.out')\" = 2 ]" ||
		sed 's/^/#   /' "$T_TMP/z.$i.out" | head -n 6
done
z_notes=$(grep -h -o -E 'took over from idle member|no longer producer|evicted \(too slow\)' "$T_TMP"/z.[123].err | sort | uniq -c | xargs)
check "(z) no job took over the validation stream, was replaced as its producer or lost its place${z_notes:+ ($z_notes)}" \
	[ -z "$z_notes" ]
for i in 1 2 3; do
	check "(z) job $i: the train epoch's end, its feed closed, made no call on its handle, now the validation feed's ($(grep -h '^stale' "$T_TMP/z.$i.out"))" \
		grep -Eqx 'stale finishes [1-9][0-9]* calls 0' "$T_TMP/z.$i.out"
done

# --- m, n, o, p: GPU jobs (tsemu, the test device) -----------------------------------
# Each job uploads every training batch right after next(), as x.cuda() does
# (Debian's torch has no CUDA: share_job.py calls the runtime through
# ctypes), and reads it back. The layer registers each yielded batch with
# the C shim: the producer's uploads are kept in the feed's GPU ring, a
# consumer's are served from it device to device. A batch the job changed in
# place before uploading it must never be replaced by the ring's bytes:
#   m  nothing changed: the consumers' uploads come from the ring
#   n  the producer negates its images first: no image is served (its labels are)
#   o  the consumers negate theirs first: their images go from the host
#   p  every job uploads its images only (labels stay on the host): the
#      producer's batches, of which one tensor is never uploaded, are kept
#      with the tensor it uploads, and the consumers' images come from the ring
# tests/py/upload_check.py checks every batch's device bytes against the
# host's and where each job's bytes came from.
EMU="$PWD/$BUILD/emu"
if [ -e "$EMU/libcudart.so.13" ] && [ -e "$EMU/libcuda.so.1" ]; then
	export LD_LIBRARY_PATH="$EMU${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" TSEMU_DEVICES=1
	export TSEMU_STATS="$T_TMP/tsemu.stats" # one line per GPU job: see the end of m-w
	# Under ASan, no forked workers here: the test device runs streams on
	# threads, and gcc 12's ASan allocator is not fork-safe in a threaded
	# process (a worker hung in PyOS_AfterFork_Child -> malloc on ASan's
	# lock, 2 runs in 47; no tsshim frame). glibc's malloc is fork-safe.
	GPU_WORKERS=2
	[[ "$TS_PRELOAD" == *libasan* ]] && GPU_WORKERS=0
	for c in m n o p; do
		case $c in
		m) mut=() what="served" ;;
		n) mut=(--mutate-before-upload producer) what="producer-changed" ;;
		o) mut=(--mutate-before-upload consumer) what="consumer-changed" ;;
		p) mut=(--upload images) what="served" ;;
		esac
		bs=(64 48 100)
		for i in 1 2 3; do
			job "$c" "$i" 1 --seed "$i" --batch-size "${bs[$((i - 1))]}" --workers "$GPU_WORKERS" --epochs 2 \
				--barrier "$T_TMP/$c.go:3" --emu-cuda "$EMU/libcudart.so.13" "${mut[@]}"
		done
		finished "$c" 3
		verify "$c" "GPU jobs, batch sizes ${bs[*]}: one stream, complete epochs, labels paired" $(recs "$c" 3)
		if "$PY" tests/py/upload_check.py --expect "$what" $(recs "$c" 3) >"$T_TMP/$c.upload" 2>&1; then
			ok "($c) uploads ($what): $(grep -h -o '[0-9]* host-to-device, [0-9]* device-to-device' \
				"$T_TMP/$c.upload" | tr '\n' ';')"
		else
			not_ok "($c) uploads ($what): $(tail -n 1 "$T_TMP/$c.upload")"
			sed 's/^/#   /' "$T_TMP/$c.upload" | head -n 12
		fi
	done

	# --- q: GPU jobs, the producer killed mid-epoch -------------------------------
	# The successor makes the rest of the stream's epoch and reads it back like
	# any consumer: its upload of each batch it made fills the GPU ring (nobody
	# else uploads those as published), so the other consumers' uploads after
	# the takeover are still served device to device (before: all from the
	# host). It makes them without waiting on itself (before: one 100 ms read
	# slice per batch, 10 batches a second at most), which its debug line counts.
	for i in 1 2 3; do
		TSSHIM_LOG=debug job q "$i" 1 --seed "$i" --batch-size "$(( i == 3 ? 12 : 8 ))" --workers "$GPU_WORKERS" \
			--epochs 1 --sleep 0.05 --barrier "$T_TMP/q.go:3" --emu-cuda "$EMU/libcudart.so.13"
	done
	victim=
	if wait_for "$T_TMP/q.1.jsonl" '"loader":"train","epoch":0,"batch":2,' 60 &&
		wait_for "$T_TMP/q.2.jsonl" '"loader":"train","epoch":0,"batch":2,' 60 &&
		wait_for "$T_TMP/q.3.jsonl" '"loader":"train","epoch":0,"batch":2,' 60; then
		victim=$(grep -l '"role":1' "$T_TMP"/q.[123].jsonl | head -n 1 | sed 's/.*q\.\([123]\)\.jsonl/\1/')
	fi
	if [ -n "$victim" ]; then
		kill -KILL "$(job_pid q "$victim")"
		finished q 3 "$victim"
		verify q "GPU jobs, producer killed: the others' epochs complete, one stream" $(recs q 3)
		left=()
		for i in 1 2 3; do [ "$i" = "$victim" ] || left+=("$T_TMP/q.$i.jsonl"); done
		if "$PY" tests/py/upload_check.py --expect takeover "${left[@]}" >"$T_TMP/q.upload" 2>&1; then
			ok "(q) producer (job $victim) killed: $(grep -h -o '[0-9]* of its [0-9]* batches uploaded after the takeover served device to device' "$T_TMP/q.upload")"
		else
			not_ok "(q) producer (job $victim) killed: $(tail -n 1 "$T_TMP/q.upload")"
			sed 's/^/#   /' "$T_TMP/q.upload" | head -n 12
		fi
		made=$(grep -h -o '[0-9]* batches made as successor, [0-9]* waits for data while making them' \
			"$T_TMP"/q.[123].err | head -n 1)
		check "(q) the successor made the rest of the epoch without waiting on itself (${made:-no line})" \
			cond '[[ "$made" == *", 0 waits"* ]]'
	else
		not_ok "(q) the jobs did not all record 3 batches within 60 s, or none was producer"
		finished q 3
	fi

	# --- r: GPU jobs that fetch ahead ---------------------------------------------
	# Each job fetches its next batch before it uploads the one before, as
	# Lightning's prefetching fetcher does: the producer registers batch s+1
	# before it uploads batch s. It learns that at its first such upload and
	# from then on keeps both open. Before, every other batch was never kept
	# (its upload came after the next had been announced): at most half of a
	# consumer's batches could be served, in practice 3 of 25.
	for i in 1 2 3; do
		job r "$i" 1 --seed "$i" --batch-size "$(( i == 3 ? 12 : 8 ))" --workers "$GPU_WORKERS" --epochs 2 \
			--barrier "$T_TMP/r.go:3" --emu-cuda "$EMU/libcudart.so.13" --fetch-ahead
	done
	finished r 3
	verify r "GPU jobs fetching ahead: one stream, complete epochs, labels paired" $(recs r 3)
	if "$PY" tests/py/upload_check.py --expect served --min-served 0.75 $(recs r 3) >"$T_TMP/r.upload" 2>&1; then
		ok "(r) fetching ahead, consumers' batches served device to device: $(grep -h -o \
			'[0-9]* of [0-9]* batches served wholly' "$T_TMP/r.upload" | tr '\n' ';')"
	else
		not_ok "(r) fetching ahead: $(tail -n 1 "$T_TMP/r.upload")"
		sed 's/^/#   /' "$T_TMP/r.upload" | head -n 12
	fi

	# --- dv: GPU jobs on device 1 that never make it current ------------------------
	# As a job on cuda:1 that never calls set_device: device 0 is current when a
	# batch is registered, device 1 only around its uploads (PyTorch's device
	# guard). The producer learns the device its batches go to and keeps them
	# there; before, its ring buffers were made in device 0's context, every
	# upload was skipped and no consumer batch was served.
	for i in 1 2 3; do
		TSEMU_DEVICES=2 job dv "$i" 1 --seed "$i" --batch-size "$(( i == 3 ? 12 : 8 ))" --workers "$GPU_WORKERS" \
			--epochs 2 --barrier "$T_TMP/dv.go:3" --emu-cuda "$EMU/libcudart.so.13" --upload-device 1
	done
	finished dv 3
	verify dv "GPU jobs on device 1: one stream, complete epochs, labels paired" $(recs dv 3)
	if "$PY" tests/py/upload_check.py --expect served --min-served 0.75 $(recs dv 3) >"$T_TMP/dv.upload" 2>&1; then
		ok "(dv) jobs on device 1, consumers' batches served device to device: $(grep -h -o \
			'[0-9]* of [0-9]* batches served wholly' "$T_TMP/dv.upload" | tr '\n' ';')"
	else
		not_ok "(dv) jobs on device 1: $(tail -n 1 "$T_TMP/dv.upload")"
		sed 's/^/#   /' "$T_TMP/dv.upload" | head -n 12
	fi

	# --- px: the producer exits while a consumer's copy out of its ring is queued ---
	# Job 1 produces (job 2 starts 0.3 s later); job 2's device-to-device copies
	# are slow (TSEMU_D2D_GBPS: about 1 s for a batch's images; the bytes are
	# read at the end), so job 1, done with its epoch, exits while one of job
	# 2's copies out of its ring is queued. The exit takes job 1's ring buffers
	# (tsemu overwrites them), so the layer's close of its feeds at exit gives
	# up its slots and waits for job 2's hold first. Before, job 2 uploaded
	# batches whose device bytes were not its host bytes.
	TSSHIM_TIMEOUT_MS=3000 TSSHIM_LOG=debug job px 1 1 --barrier "$T_TMP/px.go:2" --seed 1 --batch-size 32 \
		--workers "$GPU_WORKERS" --epochs 1 --sleep 0.3 --emu-cuda "$EMU/libcudart.so.13"
	TSSHIM_TIMEOUT_MS=3000 TSEMU_D2D_GBPS=0.0004 job px 2 1 --barrier "$T_TMP/px.go:2" --seed 2 --batch-size 32 \
		--workers "$GPU_WORKERS" --epochs 1 --start-delay 0.3 --emu-cuda "$EMU/libcudart.so.13"
	finished px 2
	verify px "the producer exits while a consumer's copy is queued: one stream, complete epochs" $(recs px 2)
	if "$PY" tests/py/upload_check.py --expect exit $(recs px 2) >"$T_TMP/px.upload" 2>&1; then
		ok "(px) every batch right on the device; the consumer's $(grep -h -o 'roles [12]*, [0-9]* batches served wholly' \
			"$T_TMP/px.upload")"
	else
		not_ok "(px) $(tail -n 1 "$T_TMP/px.upload")"
		sed 's/^/#   /' "$T_TMP/px.upload" | head -n 12
	fi
	waitx=$(sed -n "s/.*waited \([0-9]*\) ms for consumers' copies out of our ring buffers.*/\1/p" "$T_TMP"/px.[12].err | xargs)
	check "(px) the producer waited for the consumer's copy before its context went (${waitx:-no wait} ms)" \
		cond '[ -n "$waitx" ]'

	# Every GPU job above: no producer freed a ring buffer a consumer still had
	# open (undefined on CUDA; tsemu counts it and overwrites the memory).
	nstats=$(grep -c . "$T_TMP/tsemu.stats" 2>/dev/null)
	freed_open=$(grep -o '"ipc_freed_while_open":[0-9]*' "$T_TMP/tsemu.stats" 2>/dev/null |
		awk -F: '{s += $2} END {print s + 0}')
	check "(m-dv) no ring buffer freed while a consumer had it open (tsemu, ${nstats:-0} jobs: $freed_open)" \
		cond '[ "${nstats:-0}" -gt 0 ] && [ "$freed_open" = 0 ]'
	# ... nor read by a consumer after its producer's exit took it (tsemu overwrites it then)
	read_lost=$(grep -o '"ipc_read_lost":[0-9]*' "$T_TMP/tsemu.stats" 2>/dev/null | awk -F: '{s += $2} END {print s + 0}')
	check "(m-dv) no copy read a ring buffer its producer had freed or lost at exit (tsemu ipc_read_lost: $read_lost)" \
		cond '[ "$read_lost" = 0 ]'
	unset TSEMU_STATS
else
	echo "# (m-dv) skipped: tsemu not built"
fi

# --- nothing left behind ----------------------------------------------------------
left=$(ls /dev/shm 2>/dev/null | grep -E "^(tsshim\.|tsshim-feed\.)$(id -u)\.t-$$-" | head -n 5)
check "every job gone: no session segment or feed file left in /dev/shm${left:+ (left: $left)}" [ -z "$left" ]

finish pytorch_share
