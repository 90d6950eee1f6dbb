#!/usr/bin/env bash
# Shared memory at its size limit (issue 7, fault injection): jobs run in a
# private mount namespace whose /dev/shm is a tmpfs of a few MiB, so that the
# shim's objects do not fit. Whatever does not fit, the jobs must train as
# without the shim, say so in one line, and leave nothing behind:
#   torch  two PyTorch jobs sharing a DataLoader (no workers: torch itself
#          needs no /dev/shm then). A feed's batch files never take more than a
#          quarter of /dev/shm (the job's workers need the rest): in 2700 KiB
#          the session segments fit, the first batch file does not, and
#          nothing is published; in 6 MiB the first fits, the second does not:
#          the producer's publish fails mid-epoch (ENOSPC), it finishes its
#          epoch from its own loader, and the consumer, which had read all
#          that was published, makes the rest of that stream epoch privately.
#          Every epoch of each job whole, no sample twice (share_verify
#          --mode plain).
#   exact  three same-seed tsshim-train jobs in exact mode, in 2 MiB (the
#          decoded-image cache does not fit: decoding privately; its jobs'
#          workers still find the shared memory they need), in 12 MiB (the
#          cache's default budget is a quarter of /dev/shm: it fits and is
#          hit) and in 12 MiB with TSSHIM_CACHE_MB=64 (more than a quarter:
#          refused): the trained checksum of each is the one without the shim.
#   views  a consumer that keeps every batch it reads (views of the feed's
#          slot files, which keep files the producer replaced): views stop at
#          a quarter of /dev/shm, the rest is copied; no publish fails.
#   lie    a peer rewrote the cache's shared mark of how far its file is
#          reserved (ts-cachetool lie), then /dev/shm filled up: a fill in
#          another process must bypass, not write into pages that do not
#          exist (SIGBUS in the host program before each process reserved
#          its chunks itself).
# Needs root (a mount namespace); exit 77 otherwise.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
[ "$(id -u)" = 0 ] || { echo "needs root for a private /dev/shm"; exit 77; }
command -v unshare >/dev/null || { echo "needs unshare (util-linux)"; exit 77; }
unshare -m --propagation private true 2>/dev/null || { echo "cannot make a mount namespace here"; exit 77; }
TRAIN="$PWD/$BUILD/tsshim-train"
MKDATA="$PWD/$BUILD/tsshim-mkdata"
[ -x "$TRAIN" ] && [ -x "$MKDATA" ] || { echo "needs tsshim-train and tsshim-mkdata"; exit 77; }
unset TSSHIM_MODE TSSHIM_CACHE_MB TSSHIM_DEPTH
export TSSHIM_LOG=info

# in_small_shm SIZE CMD...: run CMD with /dev/shm a fresh tmpfs of SIZE; then
# print "left N": the objects still in that /dev/shm once CMD is done.
in_small_shm() {
	local size=$1; shift
	unshare -m --propagation private bash -c '
		mount -t tmpfs -o "size=$1,mode=1777" tmpfs /dev/shm || exit 9
		shift
		"$@"
		echo "left $(ls -A /dev/shm | wc -l)"' in_small_shm "$size" "$@"
}

# --- torch ------------------------------------------------------------------------
PY=/usr/bin/python3
if "$PY" -c 'import torch, torchvision, PIL' 2>/dev/null; then
	"$MKDATA" --classes 4 --train 40 --val 4 --seed 7 "$T_TMP/data" >/dev/null 2>&1 || { echo "mkdata failed"; exit 1; }
	torch_jobs() { # RECORD DIR: two jobs sharing a loader, in the background; wait
		local i
		for i in 1 2; do
			LD_PRELOAD="$TS_PRELOAD" TSSHIM_SESSION="$SESS_T" timeout -s ABRT 120 "$PY" \
				tests/py/share_job.py --root "$DATA" --record "$1/$i.jsonl" --seed "$i" \
				--batch-size 64 --workers 0 --epochs 2 --barrier "$1/go:2" >"$1/$i.out" 2>"$1/$i.err" &
		done
		local bad=0
		for i in 1 2; do wait -n || bad=1; done
		return $bad
	}
	# (the jobs run in a fresh bash inside the namespace: it gets them exported)
	SESS_T=$(session_name full) DATA="$T_TMP/data"
	export -f torch_jobs
	export TS_PRELOAD PY SESS_T DATA
	# 2700k: the sessions fit, the first batch file (~1 MiB) does not (more than a
	# quarter of /dev/shm): nothing is ever published. 6m: the first fits in the
	# quarter, the second does not: the consumer has read all there was.
	for size in 2700k 6m; do
		d="$T_TMP/torch-$size"
		mkdir -p "$d"
		in_small_shm "$size" torch_jobs "$d" >"$d.out" 2>&1
		rc=$?
		check "torch, $size: both jobs exit 0" [ "$rc" = 0 ] ||
			tail -n 20 "$d/1.err" "$d/2.err" | sed 's/^/#   /'
		check "torch, $size: nothing of theirs left in that /dev/shm ($(grep '^left' "$d.out"))" \
			grep -qx 'left 0' "$d.out"
		cat "$d/1.err" "$d/2.err" >"$d.err"
		check "torch, $size: the producer's batches would take more than a quarter of /dev/shm: said once, and its publish failed (ENOSPC), said once" \
			cond "[ \"\$(grep -c 'of batches would be more than a quarter of /dev/shm' '$d.err')\" = 1 ] &&
			      [ \"\$(grep -c 'sharing off for this loader: cannot publish a batch: ENOSPC' '$d.err')\" = 1 ]"
		[ "$size" = 6m ] &&
			check "torch, $size: the consumer made the rest of the stream's epoch privately, said once" \
				cond "[ \"\$(grep -c 'finishing the epoch privately' '$d.err')\" = 1 ]"
		if timeout 120 "$PY" tests/py/share_verify.py --mode plain --root "$T_TMP/data" \
			"$d/1.jsonl" "$d/2.jsonl" >"$d.verify" 2>&1; then
			ok "torch, $size: every epoch of each job whole, no sample twice, labels paired: $(tail -n 1 "$d.verify")"
		else
			not_ok "torch, $size: share_verify --mode plain: $(tail -n 1 "$d.verify")"
			grep -v '^verify:' "$d.verify" | head -n 8 | sed 's/^/#   /'
		fi
	done
else
	echo "# torch: skipped (python3-torch/torchvision/pil not installed)"
fi

# --- views ----------------------------------------------------------------------------
# A consumer that keeps every batch it reads as a view keeps the slot files
# they lie in: one the producer replaced is unlinked, and its pages stay as
# long as the view. Views stop (the batch is copied into the program's memory)
# once the files they keep would pass a quarter of /dev/shm. Before, 40 kept
# 512 KiB batches filled a 16 MiB /dev/shm: the producer's publish 23 failed
# with ENOSPC, and so would every other job's DataLoader workers.
VIEWKEEP="$PWD/$BUILD/tests/ts-viewkeep"
if [ -x "$VIEWKEEP" ]; then
	out=$(in_small_shm 16m "$VIEWKEEP" 40 2>&1)
	used=$(sed -n 's/.* max_used_kib \([0-9]*\) .*/\1/p' <<<"$out")
	check "views, 16m: 40 batches kept, views then copies, /dev/shm at most half used, nothing left ($(echo "$out" | xargs))" \
		cond "grep -q '^published 40 views [1-9][0-9]* copies [1-9][0-9]* .* error none\$' <<<\"\$out\" &&
		      [ \"\${used:-99999}\" -le 8192 ] && grep -qx 'left 0' <<<\"\$out\""
else
	echo "# views: skipped (ts-viewkeep not built)"
fi

# --- exact ------------------------------------------------------------------------
"$MKDATA" --classes 3 --train 8 --val 2 --seed 3 "$T_TMP/tdata" >/dev/null 2>&1 || { echo "mkdata failed"; exit 1; }
TDATA="$T_TMP/tdata/train" # the jobs: tsshim-train --batch 8 --size 64 --epochs 2 --seed 4 --workers 2
"$TRAIN" --batch 8 --size 64 --epochs 2 --seed 4 --workers 2 "$TDATA" >"$T_TMP/ref.out" 2>&1 ||
	{ echo "tsshim-train alone failed"; exit 1; }
REF=$(sed -n 's/.*trained_checksum=\([0-9a-f]*\).*/\1/p' "$T_TMP/ref.out")
exact_jobs() { # DIR: three same-seed jobs in exact mode; wait
	local i bad=0
	for i in 1 2 3; do
		env ${CACHE_MB:+TSSHIM_CACHE_MB=$CACHE_MB} TSSHIM_MODE=exact TSSHIM_SESSION="$SESS_X" \
			LD_PRELOAD="$TS_PRELOAD" timeout 60 "$TRAIN" --batch 8 --size 64 --epochs 2 --seed 4 --workers 2 "$TDATA" >"$1/$i.out" 2>"$1/$i.err" &
	done
	for i in 1 2 3; do wait -n || bad=1; done
	return $bad
}
SESS_X=$(session_name fullx)
export -f exact_jobs
export TS_PRELOAD TRAIN TDATA SESS_X
# 12m+64: TSSHIM_CACHE_MB=64 asks for more than a quarter of that /dev/shm: refused
for size in 2m 12m 12m+64; do
	d="$T_TMP/exact-$size"
	mkdir -p "$d"
	CACHE_MB=${size#*+}
	[ "$CACHE_MB" = "$size" ] && CACHE_MB=
	export CACHE_MB
	in_small_shm "${size%+*}" exact_jobs "$d" >"$d.out" 2>&1
	rc=$?
	sums=$(sed -n 's/.*trained_checksum=\([0-9a-f]*\).*/\1/p' "$d"/?.out | sort -u | xargs)
	check "exact, $size: the three jobs exit 0 with the checksum of a job without the shim ($sums vs $REF)" \
		cond "[ $rc = 0 ] && [ '$sums' = '$REF' ]" ||
		for i in 1 2 3; do echo "#   job $i: $(grep -v '^tsshim' "$d/$i.err" | tail -n 2 | xargs)"; done
	check "exact, $size: nothing left in that /dev/shm ($(grep '^left' "$d.out"))" grep -qx 'left 0' "$d.out"
	cat "$d"/?.err >"$d.err"
	if [ "$size" != 12m ]; then
		check "exact, $size: the cache did not fit, and each job said so once" \
			cond "[ \"\$(grep -c 'decoded-image cache of session .* unavailable: .*No space left' '$d.err')\" = 3 ]"
	else
		hits=$(sed -n 's/.*removed, last out: \([0-9]*\) hits.*/\1/p' "$d.err" | head -n 1)
		check "exact, 12m: a cache of a quarter of /dev/shm (3 MiB) fit and was hit (${hits:-no} hits)" \
			cond "grep -q \"decoded-image cache of session '.*': 3 MiB\" '$d.err' && [ '${hits:-0}' -gt 0 ]"
	fi
done

# --- lie ------------------------------------------------------------------------
CACHETOOL="$PWD/$BUILD/tests/ts-cachetool"
if [ -x "$CACHETOOL" ]; then
	lie_case() { # a holder keeps the cache; the liar; /dev/shm filled; a probe
		local s=$1
		# hold stays until its stdin, our end of the coprocess pipe, is closed
		coproc HOLD { "$CACHETOOL" hold "$s" --budget-mb 3 >/dev/null 2>&1; }
		local h=$HOLD_PID i
		for i in $(seq 50); do [ -e "/dev/shm/tsshim-cache.$(id -u).$s" ] && break; sleep 0.1; done
		"$CACHETOOL" lie "$s" --budget-mb 3
		dd if=/dev/zero of=/dev/shm/filler bs=64k 2>/dev/null
		"$CACHETOOL" probe "$s" --budget-mb 3 --key 1
		echo "probe rc $?"
		exec {HOLD[1]}>&-
		wait "$h" 2>/dev/null
		rm -f /dev/shm/filler
	}
	export -f lie_case
	export CACHETOOL
	in_small_shm 12m lie_case "$(session_name lie)" >"$T_TMP/lie.out" 2>&1
	check "lie: a fill over the lied reservation on a full /dev/shm bypasses, the holder still a user ($(grep -o 'result=[A-Z]*' "$T_TMP/lie.out"), $(grep -o 'users=[0-9]*' "$T_TMP/lie.out"), $(grep -o 'probe rc [0-9]*' "$T_TMP/lie.out"))" \
		cond "grep -q '^lied hwm=' '$T_TMP/lie.out' && grep -q 'result=BYPASS' '$T_TMP/lie.out' &&
		      grep -q ' users=2 ' '$T_TMP/lie.out' && grep -qx 'probe rc 0' '$T_TMP/lie.out'"
	check "lie: nothing left in that /dev/shm ($(grep '^left' "$T_TMP/lie.out"))" grep -qx 'left 0' "$T_TMP/lie.out"
else
	echo "# lie: skipped (no ts-cachetool)"
fi

finish shmfull
