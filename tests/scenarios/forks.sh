#!/usr/bin/env bash
# Forks while another thread is inside the shim (or the dynamic linker),
# with the slow part made slow on purpose (ts-forkcheck says in what order
# things ended):
#   - a forked child's tsshim_feed_close (Python's atexit in any os.fork()
#     child) while a parent thread was inside tsshim_feed_open, waiting for
#     the feed session's lock: returns (it hung for ever: the child waited on
#     a lock whose holder does not exist there);
#   - the host's fork() while a thread joins a session that a stopped
#     process keeps locked: returns at once (it waited for the join, up to
#     TSSHIM_TIMEOUT_MS);
#   - a vfork child's dup2 while a thread is in dlopen (a library with a
#     slow constructor): returns at once (a hook that resolved its libc
#     function on first use waited for the dynamic linker's lock);
#   - a member killed holding its session's lock while a child it forked
#     lives: the lock is free at once (it stayed until the child exited).
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
CHECK="$PWD/$BUILD/tests/ts-forkcheck"
[ -x "$CHECK" ] || { echo "needs ts-forkcheck"; exit 77; }
command -v flock >/dev/null || { echo "needs flock (util-linux)"; exit 77; }
export TSSHIM_TIMEOUT_MS=5000 TSSHIM_LOG=error

# locked PATH SECONDS: create PATH (ours, 0600) and hold its flock for SECONDS, in the background
locked() {
	(umask 077; : >"$1")
	flock -x "$1" sleep "$2" &
	LOCKER=$!
	for _ in $(seq 50); do flock -n -x "$1" true 2>/dev/null || return 0; sleep 0.05; done
}

S=$(session_name fk)
locked "$(seg_path "$S.fk")" 3
out=$(TSSHIM_SESSION=$S LD_PRELOAD="$TS_PRELOAD" "$CHECK" feedclose 2>"$T_TMP/feedclose.err")
check "a forked child's tsshim_feed_close returns while a parent thread waits in tsshim_feed_open ($out)" \
	[ "$out" = "child-close returned" ]
wait "$LOCKER"
rm -f "$(seg_path "$S.fk")"

S=$(session_name fj)
locked "$(seg_path "$S")" 3
out=$(TSSHIM_SESSION=$S LD_PRELOAD="$TS_PRELOAD" "$CHECK" joinfork 2>"$T_TMP/joinfork.err")
check "the host's fork() does not wait for a join that waits for a locked session ($out)" \
	[ "$out" = "fork-before-join" ]
wait "$LOCKER"
rm -f "$(seg_path "$S")"

# A member killed holding its session's lock (inside a join or leave) while a
# child it forked lives: the lock goes with the member. Before, the child's
# copy of the descriptor and its inherited mapping of the segment (a mapping
# holds its open file, and the lock with it) kept it until the child exited,
# and every joiner waited out TSSHIM_TIMEOUT_MS and went without the session.
S=$(session_name kh)
SEG=$(seg_path "$S")
TSSHIM_SESSION=$S LD_PRELOAD="$TS_PRELOAD" "$CHECK" killheld "$SEG" >"$T_TMP/killheld.out" 2>"$T_TMP/killheld.err" &
KP=$!
for _ in $(seq 100); do grep -q '^locked' "$T_TMP/killheld.out" && break; sleep 0.05; done
child=$(sed -n 's/^locked //p' "$T_TMP/killheld.out")
kill -9 "$KP" 2>/dev/null
wait "$KP" 2>/dev/null
freed=no
for _ in $(seq 20); do flock -n -x "$SEG" true 2>/dev/null && { freed=yes; break; }; sleep 0.05; done
alive=$([ -n "$child" ] && kill -0 "$child" 2>/dev/null && echo yes || echo no)
check "a member killed holding its session's lock: the lock is free within 1 s while its forked child lives (child ${child:-none} alive: $alive, lock free: $freed)" \
	cond '[ "$alive" = yes ] && [ "$freed" = yes ]'
[ -n "$child" ] && kill "$child" 2>/dev/null
rm -f "$SEG"

printf '#include <unistd.h>\n__attribute__((constructor)) static void slow(void) { sleep(2); }\n' >"$T_TMP/slow.c"
if cc -shared -fPIC -o "$T_TMP/slow.so" "$T_TMP/slow.c" 2>"$T_TMP/cc.err"; then
	out=$(LD_PRELOAD="$TS_PRELOAD" "$CHECK" vfork "$T_TMP/slow.so" 2>"$T_TMP/vfork.err")
	check "a vfork child's dup2 does not wait for another thread's dlopen ($out)" [ "$out" = "vfork-before-dlopen" ]
	out=$(LD_PRELOAD="$TS_PRELOAD" TSSHIM_MODE=off "$CHECK" vfork "$T_TMP/slow.so" 2>>"$T_TMP/vfork.err")
	check "... with TSSHIM_MODE=off too ($out)" [ "$out" = "vfork-before-dlopen" ]
else
	echo "# vfork: skipped (no C compiler for the slow library)"
fi

finish forks
