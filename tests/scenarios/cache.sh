#!/usr/bin/env bash
# The shared decoded-image cache between real processes: four workers
# get/fill/commit over the same 200 keys (every hit checked byte for byte
# against the key's payload), one of them SIGKILLed in the middle of a
# fill. Nobody sees wrong bytes, nobody hangs, the dead fill is reclaimed,
# and the last process out removes the segment. Then the lock: a job stopped
# holding it is waited for, killed it is taken over (one repair), and a peer
# writing random bytes over it every 2 ms kills and hangs nobody.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh

TOOL=$PWD/$BUILD/tests/ts-cachetool
S=$(session_name cache)
CPATH=/dev/shm/tsshim-cache.$(id -u).$S
trap 'cleanup; rm -f "$CPATH" /dev/shm/tsshim-cache."$(id -u)".t-"$$"-*' EXIT

stat_of() { # FILE FIELD: the value of FIELD on the last stats line of FILE
	grep '^stats ' "$1" | tail -n 1 | grep -oE "(^| )$2=[0-9]+" | cut -d= -f2
}

# SESSION TAG: a user of SESSION's cache until its fifo ($HOLD_FD) is closed;
# its pid in HOLD, what it prints in $T_TMP/TAG.out
start_holder() {
	mkfifo "$T_TMP/$2.in"
	"$TOOL" hold "$1" <"$T_TMP/$2.in" >"$T_TMP/$2.out" 2>>"$T_TMP/stderr" &
	HOLD=$!
	T_PIDS+=("$HOLD")
	exec {HOLD_FD}>"$T_TMP/$2.in"
	check "a holder opened the cache ($2)" wait_for "$T_TMP/$2.out" '^holding' 10
}

# --- a holder keeps the segment alive across the whole run -------------------
start_holder "$S" hold
HOLD1=$HOLD HOLD1_FD=$HOLD_FD
check "segment is mode 0600" [ "$(stat -c %a "$CPATH" 2>/dev/null)" = 600 ]

# --- three workers and one that stalls mid-fill ------------------------------
WORKERS=()
for i in 1 2 3; do
	"$TOOL" work "$S" --seed "$i" --order-seed 7 --ops 4000 >"$T_TMP/w$i.out" 2>>"$T_TMP/stderr" &
	WORKERS+=($!)
	T_PIDS+=($!)
done
"$TOOL" work "$S" --seed 9 --order-seed 7 --ops 4000 --stall-at 15 >"$T_TMP/staller.out" 2>>"$T_TMP/stderr" &
STALLER=$!
T_PIDS+=("$STALLER")
check "the staller stopped in the middle of a fill" wait_for "$T_TMP/staller.out" '^stalled key=' 30
K=$(grep -oE 'stalled key=[0-9]+' "$T_TMP/staller.out" | cut -d= -f2)
echo "# staller $STALLER stalled on key ${K:-?}"
sleep 0.5 # the others meet the stalled fill while its filler is alive: they wait, then bypass
kill -KILL "$STALLER"
wait "$STALLER" 2>/dev/null
rc=$?
check "the staller was killed (exit $rc)" [ "$rc" = 137 ]

hits=0
for i in 1 2 3; do
	wait "${WORKERS[$((i - 1))]}"
	rc=$?
	check "worker $i finished with every hit byte-identical (exit $rc)" [ "$rc" = 0 ]
	check "worker $i reported bad=0" grep -q ' bad=0 ' "$T_TMP/w$i.out"
	m=$(grep -oE 'max_get_ms=[0-9]+' "$T_TMP/w$i.out" | cut -d= -f2)
	check "worker $i: no get took more than 2 s (max ${m:-?} ms)" [ "${m:-99999}" -lt 2000 ]
	h=$(grep -oE '^done .* hits=[0-9]+' "$T_TMP/w$i.out" | grep -oE 'hits=[0-9]+' | cut -d= -f2)
	hits=$((hits + ${h:-0}))
	grep '^done' "$T_TMP/w$i.out" | sed 's/^/# /'
done
check "workers shared decodes ($hits hits)" [ "$hits" -gt 1000 ]

# --- the dead fill is reclaimed, not waited for ---------------------------------
if [ -n "${K:-}" ]; then
	"$TOOL" probe "$S" --key "$K" --wait-ms 5000 >"$T_TMP/probe.out" 2>>"$T_TMP/stderr"
	rc=$?
	sed 's/^/# /' "$T_TMP/probe.out"
	check "probe of the stalled key succeeded (exit $rc)" [ "$rc" = 0 ]
	check "probe of the stalled key is a HIT or a FILL, not a wait for the dead" \
		grep -qE 'result=(HIT|FILL) ms=([0-9]|[0-9][0-9]|[0-9][0-9][0-9])$' "$T_TMP/probe.out"
	check "the killed filler's entry was reclaimed (reclaims=$(stat_of "$T_TMP/probe.out" reclaims))" \
		[ "$(stat_of "$T_TMP/probe.out" reclaims)" -ge 1 ]
	check "no fill left pending" [ "$(stat_of "$T_TMP/probe.out" filling)" = 0 ]
	check "evictions happened (the working set exceeds the budget)" [ "$(stat_of "$T_TMP/probe.out" evictions)" -gt 0 ]
fi
"$TOOL" stats "$S" >"$T_TMP/stats.out"
sed 's/^/# /' "$T_TMP/stats.out"
check "read-only view works while the holder is in" [ "$(stat_of "$T_TMP/stats.out" users)" -ge 1 ]

# --- the last one out (the killed one is reaped) removes the segment ----------
exec {HOLD1_FD}>&-
wait "$HOLD1"
check "holder exited cleanly" [ $? = 0 ]
check "the last process out removed the segment" [ ! -e "$CPATH" ]
# A temporary file whose creator is alive is one being made (other scenarios
# may run beside this one, tests/run.sh); one whose creator is gone is left.
left_temp() {
	local f pid
	for f in /dev/shm/tsshim-tmp."$(id -u)".*; do
		[ -e "$f" ] || continue
		pid=${f#/dev/shm/tsshim-tmp."$(id -u)".}; pid=${pid%%.*}
		kill -0 "$pid" 2>/dev/null || echo "$f"
	done
}
check "no temporary files left" [ -z "$(left_temp)" ]

# --- a process waiting for a filler in another process that gets killed ----------
# Big budget, few fills: nothing is evicted, so only get() can reclaim the entry.
S3=$(session_name cache3)
P3=/dev/shm/tsshim-cache.$(id -u).$S3
"$TOOL" work "$S3" --budget-mb 64 --ops 40 --stall-at 5 >"$T_TMP/st3.out" 2>>"$T_TMP/stderr" &
ST3=$!
T_PIDS+=("$ST3")
check "second staller stopped mid-fill" wait_for "$T_TMP/st3.out" '^stalled key=' 30
K3=$(grep -oE 'stalled key=[0-9]+' "$T_TMP/st3.out" | cut -d= -f2)
"$TOOL" probe "$S3" --key "${K3:-0}" --wait-ms 10000 >"$T_TMP/waiter.out" 2>>"$T_TMP/stderr" &
W3=$!
T_PIDS+=("$W3")
sleep 0.5
"$TOOL" stats "$S3" >"$T_TMP/st3.stats"
check "the waiter is waiting for the live filler" [ "$(stat_of "$T_TMP/st3.stats" waits)" = 1 ]
kill -KILL "$ST3"
wait "$ST3" 2>/dev/null
wait "$W3"
rc=$?
sed 's/^/# /' "$T_TMP/waiter.out"
ms=$(grep -oE 'result=[A-Z]+ ms=[0-9]+' "$T_TMP/waiter.out" | cut -d= -f3)
check "the waiter took the dead fill over (exit $rc)" grep -q 'result=FILL' "$T_TMP/waiter.out"
check "the waiter noticed the death at once (waited ${ms:-?} ms, killed after ~500)" \
	[ "${ms:-99999}" -ge 400 -a "${ms:-99999}" -lt 1500 ]
check "reclaimed by get(), exactly once" [ "$(stat_of "$T_TMP/waiter.out" reclaims)" = 1 ]
check "the waiter, last out, removed the segment (the dead staller is reaped)" [ ! -e "$P3" ]

# --- a job killed holding the lock; a peer scribbling over the lock ----------------
# The lock is one word naming its holder (core/shmlock.h): a holder that died
# is taken over and the index repaired; bytes a peer writes over it name
# nobody alive and are taken over the same way. (With the robust pthread
# mutex it replaced, such bytes were list links its unlock wrote through.)
S4=$(session_name cache4)
P4=/dev/shm/tsshim-cache.$(id -u).$S4
start_holder "$S4" hold4
"$TOOL" lock "$S4" >"$T_TMP/lock4.out" 2>>"$T_TMP/stderr" &
L4=$!
T_PIDS+=("$L4")
check "a job took the lock and stopped inside" wait_for "$T_TMP/lock4.out" '^locked' 10
"$TOOL" probe "$S4" --key 1 >"$T_TMP/probe4.out" 2>"$T_TMP/probe4.err"
rc=$?
"$TOOL" stats "$S4" >"$T_TMP/s4a.stats"
sed 's/^/# /' "$T_TMP/probe4.err"
check "while its holder lives, the lock is waited for, never taken over (probe exit $rc, repairs=$(stat_of "$T_TMP/s4a.stats" repairs))" \
	[ "$rc" = 1 -a "$(stat_of "$T_TMP/s4a.stats" repairs)" = 0 ]
check "the job that could not have it was told why" grep -q 'cache lock is held' "$T_TMP/probe4.err"
kill -KILL "$L4"
wait "$L4" 2>/dev/null
W4=()
for i in 1 2; do
	"$TOOL" work "$S4" --seed "$i" --ops 2000 >"$T_TMP/x$i.out" 2>>"$T_TMP/stderr" &
	W4+=($!)
	T_PIDS+=($!)
done
for i in 1 2; do
	wait "${W4[$((i - 1))]}"
	rc=$?
	m=$(grep -oE 'max_get_ms=[0-9]+' "$T_TMP/x$i.out" | cut -d= -f2)
	check "after the holder's death, worker $i finished with every hit byte-identical (exit $rc, max get ${m:-?} ms)" \
		[ "$rc" = 0 -a "${m:-99999}" -lt 2000 ]
done
"$TOOL" stats "$S4" >"$T_TMP/s4b.stats"
sed 's/^/# /' "$T_TMP/x1.out" "$T_TMP/s4b.stats"
check "the dead holder's lock was taken over, once (repairs=$(stat_of "$T_TMP/s4b.stats" repairs))" \
	[ "$(stat_of "$T_TMP/s4b.stats" repairs)" = 1 ]
# Two workers again, and a peer writing random bytes over the lock every 2 ms.
# A peer that writes the lock can put two jobs in the index at once, so the
# bytes are not what this checks: the jobs live, finish, and wait no longer
# than a get may.
W4=()
for i in 1 2; do
	"$TOOL" work "$S4" --seed "$((i + 2))" --ops 3000 >"$T_TMP/y$i.out" 2>>"$T_TMP/stderr" &
	W4+=($!)
	T_PIDS+=($!)
done
"$TOOL" scribble "$S4" --ops 300 --seed 5 >"$T_TMP/scribble.out" 2>>"$T_TMP/stderr"
check "the peer scribbled 300 times ($(cat "$T_TMP/scribble.out"))" grep -q '^scribbled n=300' "$T_TMP/scribble.out"
for i in 1 2; do
	wait "${W4[$((i - 1))]}"
	rc=$?
	m=$(grep -oE 'max_get_ms=[0-9]+' "$T_TMP/y$i.out" | cut -d= -f2)
	check "beside the scribbler, worker $i finished, no signal (exit $rc, max get ${m:-?} ms)" \
		[ "$rc" -lt 128 -a "${m:-99999}" -lt 2000 ]
done
"$TOOL" stats "$S4" >"$T_TMP/s4c.stats"
sed 's/^/# /' "$T_TMP/y1.out" "$T_TMP/s4c.stats"
check "scribbled locks were taken over (repairs=$(stat_of "$T_TMP/s4c.stats" repairs))" \
	[ "$(stat_of "$T_TMP/s4c.stats" repairs)" -gt 1 ]
INSPECT=$PWD/$BUILD/tsshim-inspect
"$INSPECT" "$S4" >"$T_TMP/s4.inspect" 2>&1
sed 's/^/# /' "$T_TMP/s4.inspect"
ij=$("$INSPECT" "$S4" --json 2>/dev/null | grep -oE '"repairs": *[0-9]+' | grep -oE '[0-9]+$')
check "tsshim-inspect shows the repairs ($ij in JSON, and a line of text)" \
	cond '[ "$ij" = "$(stat_of "$T_TMP/s4c.stats" repairs)" ] && grep -q "^  lock  *$ij repairs" "$T_TMP/s4.inspect"'
exec {HOLD_FD}>&-
wait "$HOLD"
check "the holder, last out, removed the segment (exit $?)" [ ! -e "$P4" ]

# --- without a holder: concurrent workers, the last one out removes it -------------
S2=$(session_name cache2)
P2=/dev/shm/tsshim-cache.$(id -u).$S2
"$TOOL" work "$S2" --seed 1 --ops 1500 >"$T_TMP/v1.out" 2>>"$T_TMP/stderr" &
V1=$!
"$TOOL" work "$S2" --seed 2 --ops 3000 >"$T_TMP/v2.out" 2>>"$T_TMP/stderr" &
V2=$!
T_PIDS+=("$V1" "$V2")
wait "$V1"; r1=$?
wait "$V2"; r2=$?
check "two workers without a holder: both clean (exit $r1 $r2)" [ "$r1:$r2" = 0:0 ]
check "the last worker out removed the segment" [ ! -e "$P2" ]

finish cache
