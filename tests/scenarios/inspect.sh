#!/usr/bin/env bash
# tsshim-inspect against real segments: list and detail (text and JSON),
# --watch, --clean (dead sessions go, live and unreadable ones stay), and
# damaged segments (bad magic, other layout, checksum, truncated, bad depth,
# foreign uid, nonsense shared state, unsafe mode, FIFO): exit 1 with one
# line of reason, never a crash or a hang, and nothing is modified.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh

SEGTOOL=$PWD/$BUILD/tests/ts-segtool
for f in "$INSPECT" "$SEGTOOL"; do
	[ -x "$f" ] || { echo "skip: $f not built"; exit 77; }
done
command -v python3 >/dev/null || { echo "skip: python3 missing"; exit 77; }
[ -w /dev/shm ] || { echo "skip: /dev/shm not writable"; exit 77; }

PREFIX=$(session_name inspect-)

# run_inspect ARGS...: sets RC, OUT (stdout), ERR (stderr); 10 s at most.
run_inspect() {
	timeout 10 "$INSPECT" "$@" >"$T_TMP/out" 2>"$T_TMP/err"
	RC=$?
	OUT=$(cat "$T_TMP/out")
	ERR=$(cat "$T_TMP/err")
}

# py EXPR: evaluate EXPR with `d` = the JSON document in $OUT; prints the result.
py() { python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(($1))" <<<"$OUT" 2>&1; }

# cond 'SHELL CONDITION': for checks that need && between commands.

one_line() { [ -n "$1" ] && [ "$(printf '%s\n' "$1" | wc -l)" = 1 ]; }

# join VAR SESSION [args]: a ts-segtool member that holds for 2 minutes.
join() {
	local __var=$1 sess=$2; shift 2
	local out
	out=$(mktemp "$T_TMP/member.XXXXXX")
	"$SEGTOOL" join "$sess" --hold-ms 120000 "$@" >"$out" 2>&1 &
	local pid=$!
	T_PIDS+=("$pid")
	wait_for "$out" '^joined slot=' 10 || echo "# member $pid of $sess did not join: $(cat "$out")"
	printf -v "$__var" '%s' "$pid"
}

# --- usage -------------------------------------------------------------------
run_inspect --help
check "--help exits 0 and documents the exit status" \
	[ "$RC" = 0 -a -n "$(grep -i 'exit status' <<<"$OUT")" -a -z "$ERR" ]
run_inspect --frobnicate
check "unknown option: exit 2, usage on stderr" [ "$RC" = 2 -a -z "$OUT" -a -n "$(grep usage: <<<"$ERR")" ]
run_inspect -xh
check "unknown short option in a cluster: exit 2, named ('-x', not the program)" \
	[ "$RC" = 2 -a -n "$(grep -F "unknown option '-x'" <<<"$ERR")" ]
run_inspect --count 2
check "--count without --watch: exit 2" [ "$RC" = 2 ]
run_inspect --watch --interval
check "--interval without a value: exit 2" [ "$RC" = 2 ]
run_inspect --watch --interval -1
check "negative --interval: exit 2" [ "$RC" = 2 ]
run_inspect a b
check "two NAMEs: exit 2" [ "$RC" = 2 ]

# --- empty -------------------------------------------------------------------
run_inspect
check "list exits 0 and shows none of this run's sessions" [ "$RC" = 0 -a -z "$(grep -F "$PREFIX" <<<"$OUT")" ]
run_inspect --json
check "JSON list: schema 1, none of this run's sessions" \
	[ "$RC" = 0 -a "$(py "d['schema'], sum(s['name'].startswith('$PREFIX') for s in d['sessions'])")" = "(1, 0)" ]
run_inspect "${PREFIX}nope"
check "missing NAME: exit 1, one line saying so" cond '[ "$RC" = 1 -a -z "$OUT" ] && one_line "$ERR" && grep -q "no session" <<<"$ERR"'
check "missing NAME: no segment created" [ ! -e "$(seg_path "${PREFIX}nope")" ]
run_inspect '../etc/passwd'
check "invalid NAME: exit 1, one line" cond '[ "$RC" = 1 ] && one_line "$ERR" && grep -q "invalid session name" <<<"$ERR"'

# --- two members: one producer, one consumer -------------------------------------
PAIR=${PREFIX}pair
join A "$PAIR"
join B "$PAIR"
run_inspect "$PAIR" --json
check "JSON session: schema 1, name, path, state open" \
	[ "$RC:$(py "d['schema'], d['session']['name'], d['session']['path'], d['session']['state']")" = \
	  "0:(1, '$PAIR', '$(seg_path "$PAIR")', 'open')" ]
check "JSON session: 2 live members, 1 producer (pid $A) + 1 consumer (pid $B)" \
	[ "$(py "sorted((m['role'], m['pid'], m['state']) for m in d['session']['members'])")" = \
	  "[('consumer', $B, 'live'), ('producer', $A, 'live')]" ]
check "JSON session: producer object names pid $A" [ "$(py "d['session']['producer']['pid']")" = "$A" ]
check "JSON session: depth 4, timeout 1000, 4 ring slots, counters present" \
	[ "$(py "d['session']['depth'], d['session']['timeout_ms'], len(d['session']['ring']['slots']), sorted(d['session']['counters'])")" = \
	  "(4, 1000, 4, ['batches_shared', 'bytes_not_copied', 'cpu_ns_saved', 'decodes_shared', 'decodes_skipped', 'evictions', 'takeovers'])" ]
check "JSON session: heartbeats are recent" [ "$(py "all(m['heartbeat_age_ms'] < 1000 for m in d['session']['members'])")" = True ]
run_inspect --json
check "JSON list: the pair with 2 members, producer $A" \
	[ "$(py "[(s['members'], s['live'], s['producer_pid']) for s in d['sessions'] if s['name'] == '$PAIR']")" = "[(2, 2, $A)]" ]
run_inspect "$PAIR"
check "text session: a producer line for $A and a consumer line for $B" cond '[ "$RC" = 0 ] && grep -Eq "^ +[0-9]+ +$A +producer +live" <<<"$OUT" && grep -Eq "^ +[0-9]+ +$B +consumer +live" <<<"$OUT"'
check "text session: ring and counters sections" cond 'grep -q "^ring" <<<"$OUT" && grep -q "bytes not copied" <<<"$OUT"'
run_inspect
check "text list: one row for the pair" [ "$(grep -Ec "^$PAIR +2 \(2 live\) +$A +[0-9]+ +open" <<<"$OUT")" = 1 ]

# --- watch -------------------------------------------------------------------
run_inspect --watch --interval 0.1 --count 2 "$PAIR"
check "--watch --count 2: exits 0 after 2 screens" [ "$RC" = 0 -a "$(grep -o $'\e\[2J' <<<"$OUT" | wc -l)" = 2 ]
run_inspect --watch --json --interval 0.05 --count 3
check "--watch --json --count 3: three JSON lines" \
	[ "$RC" = 0 -a "$(python3 -c 'import json,sys; print(sum(json.loads(l)["schema"] == 1 for l in sys.stdin))' <<<"$OUT")" = 3 ]
for sig in TERM INT; do
	# Python restores SIGINT's default disposition, which bash takes away from background jobs.
	rc=$(python3 - "$INSPECT" "$PAIR" "$sig" <<'EOF'
import signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_DFL)
p = subprocess.Popen([sys.argv[1], "--watch", "--interval", "0.2", sys.argv[2]], stdout=subprocess.DEVNULL)
time.sleep(0.5)
p.send_signal(getattr(signal, "SIG" + sys.argv[3]))
try:
    print(p.wait(timeout=5))
except subprocess.TimeoutExpired:
    p.kill()
    print("hang")
EOF
)
	check "--watch stops cleanly on SIG$sig (exit 0)" [ "$rc" = 0 ]
done

# --- damaged segments -----------------------------------------------------------
declare -A REASON=([magic]='magic' [version]='another tsshim build' [checksum]='checksum'
	[truncate]='truncated' [depth]='depth' [uid]='uid [0-9]+')
GOOD=${PREFIX}planted
"$SEGTOOL" plant "$GOOD"
run_inspect "$GOOD" --json
check "a planted well-formed segment reads fine (no members, no producer)" \
	[ "$RC:$(py "len(d['session']['members']), d['session']['producer']")" = "0:(0, None)" ]
for how in magic version checksum truncate depth uid; do
	S=${PREFIX}bad-$how
	"$SEGTOOL" plant "$S" && "$SEGTOOL" corrupt "$S" "$how"
	sum_before=$(md5sum <"$(seg_path "$S")")
	run_inspect "$S"
	check "$how: exit 1 with one line naming the problem" cond '[ "$RC" = 1 -a -z "$OUT" ] && one_line "$ERR" && grep -Eq "${REASON[$how]}" <<<"$ERR"'
	run_inspect --json "$S"
	check "$how: --json exits 1 too, nothing on stdout" cond '[ "$RC" = 1 -a -z "$OUT" ] && one_line "$ERR"'
	run_inspect
	check "$how: list exits 0 and shows it as corrupt" cond '[ "$RC" = 0 ] && grep -Eq "^$S +corrupt: .*${REASON[$how]}" <<<"$OUT"'
	run_inspect --json
	check "$how: JSON list entry has state corrupt and the reason" \
		[ "$RC" = 0 -a "$(py "[s['state'] for s in d['sessions'] if s['name'] == '$S' and __import__('re').search('${REASON[$how]}', s['error'])]")" = "['corrupt']" ]
	check "$how: inspect left the segment unchanged" [ "$(md5sum <"$(seg_path "$S")")" = "$sum_before" ]
done

S=${PREFIX}garbage
"$SEGTOOL" plant "$S" && "$SEGTOOL" corrupt "$S" garbage
sum_before=$(md5sum <"$(seg_path "$S")")
run_inspect "$S" --json
check "nonsense shared state: exit 0, valid JSON" [ "$RC" = 0 -a "$(py "d['schema']")" = 1 ]
check "nonsense shared state: out-of-range producer shown as none" [ "$(py "d['session']['producer']")" = None ]
check "nonsense shared state: bad writer, npos and slot state flagged per slot" \
	[ "$(py "[('error' in s) for s in d['session']['ring']['slots'][:4]]")" = "[True, True, True, False]" ]
check "nonsense shared state: impossible members shown dead" \
	[ "$(py "[m['state'] for m in d['session']['members']]")" = "['dead', 'dead']" ]
run_inspect "$S"
check "nonsense shared state: text view exits 0 and flags the slots" cond '[ "$RC" = 0 ] && grep -q "out of range" <<<"$OUT"'
check "nonsense shared state: segment unchanged" [ "$(md5sum <"$(seg_path "$S")")" = "$sum_before" ]

UNSAFE=${PREFIX}mode644
"$SEGTOOL" plant "$UNSAFE" --mode 0644
run_inspect "$UNSAFE"
check "planted 0644 segment refused: exit 1, one line" cond '[ "$RC" = 1 ] && one_line "$ERR" && grep -q refused <<<"$ERR"'
run_inspect
check "planted 0644 segment: listed as corrupt (refused)" grep -Eq "^$UNSAFE +corrupt: refused" <<<"$OUT"

FIFO=${PREFIX}fifo
"$SEGTOOL" plant "$FIFO" --fifo
run_inspect "$FIFO"
check "FIFO at a session path: exit 1, no hang" cond '[ "$RC" = 1 ] && one_line "$ERR"'
run_inspect
check "FIFO at a session path: the list completes" cond '[ "$RC" = 0 ] && grep -Eq "^$FIFO +corrupt:" <<<"$OUT"'

if [ "$(id -u)" = 0 ]; then
	S=${PREFIX}foreign
	"$SEGTOOL" plant "$S" --uid 65534
	run_inspect "$S"
	check "segment owned by another uid refused: exit 1, one line" cond '[ "$RC" = 1 ] && one_line "$ERR" && grep -q refused <<<"$ERR"'
else
	ok "# skip foreign-owned file (chown needs root)"
fi

# --- clean -------------------------------------------------------------------
DEAD=${PREFIX}dead
LIVE=${PREFIX}live
SLEEPY=${PREFIX}sleepy
join D1 "$DEAD"
join D2 "$DEAD"
join L1 "$LIVE"
join Z1 "$SLEEPY" --timeout-ms 200
kill -KILL "$D1" "$D2"; wait "$D1" "$D2" 2>/dev/null
kill -STOP "$Z1"
sleep 0.5
run_inspect "$DEAD" --json
check "after SIGKILL of both members: both shown dead" [ "$(py "[m['state'] for m in d['session']['members']]")" = "['dead', 'dead']" ]
run_inspect "$SLEEPY" --json
check "a SIGSTOPped member shows as stale" [ "$(py "[m['state'] for m in d['session']['members']]")" = "['stale']" ]
run_inspect "$LIVE" --json
live_before=$(py "[(m['slot'], m['pid'], m['role']) for m in d['session']['members']], d['session']['producer']['epoch']")
# What a DataLoader feed keeps beside its segment (core/feed.h): a ledger and
# batch files named after the session; they go with a dead session, and a
# live session's stay.
feed_file() { echo "/dev/shm/tsshim-feed.$(id -u).$1.18eaf2f07c44d400.$2"; }
for f in "$(feed_file "$DEAD" ledger)" "$(feed_file "$DEAD" w0.e1.s0.g0)" "$(feed_file "$LIVE" ledger)"; do
	(umask 077; : >"$f")
done
# Decoded-image caches: one whose only user was killed, one in use. No
# session segment names them; before, --clean saw neither ("nothing to
# clean") and the dead one's /dev/shm stayed for good.
CACHETOOL=$PWD/$BUILD/tests/ts-cachetool
cache_file() { echo "/dev/shm/tsshim-cache.$(id -u).$1"; }
hold_cache() { # hold_cache VAR NAME FD: a user of NAME's cache until FD closes; its pid in VAR
	local __var=$1 out
	out=$(mktemp "$T_TMP/cache.XXXXXX")
	mkfifo "$out.in"
	"$CACHETOOL" hold "$2" --budget-mb 8 <"$out.in" >"$out" 2>&1 &
	local pid=$!
	T_PIDS+=("$pid")
	eval "exec $3>\"\$out.in\""
	wait_for "$out" '^holding' 10 || echo "# cache user of $2 did not start: $(cat "$out")"
	printf -v "$__var" '%s' "$pid"
}
hold_cache CD "${PREFIX}cdead" 7
kill -KILL "$CD"; wait "$CD" 2>/dev/null; exec 7>&-
hold_cache CL "${PREFIX}clive" 8
run_inspect --clean
check "--clean exits 0" [ "$RC" = 0 ]
check "--clean removed the cache whose users are all dead, and says so" \
	cond '[ ! -e "$(cache_file "${PREFIX}cdead")" ] && grep -Eq "^removed +${PREFIX}cdead: decoded-image cache" <<<"$OUT"'
check "--clean left the cache in use" [ -e "$(cache_file "${PREFIX}clive")" ]
exec 8>&-
check "--clean removed the dead session and says so" cond '[ ! -e "$(seg_path "$DEAD")" ] && grep -Eq "^removed +$DEAD" <<<"$OUT"'
check "--clean left the live session and says so" cond '[ -e "$(seg_path "$LIVE")" ] && grep -Eq "^left +$LIVE \(has live members\)" <<<"$OUT"'
check "--clean removed the dead session's feed files" cond '[ ! -e "$(feed_file "$DEAD" ledger)" -a ! -e "$(feed_file "$DEAD" w0.e1.s0.g0)" ]'
check "--clean left the live session's feed files" [ -e "$(feed_file "$LIVE" ledger)" ]
rm -f "$(feed_file "$LIVE" ledger)"
check "--clean left the session of a stopped (stale, alive) member" [ -e "$(seg_path "$SLEEPY")" ]
check "--clean left the unsafe 0644 file alone" cond '[ -e "$(seg_path "$UNSAFE")" ] && grep -Eq "^left +$UNSAFE \(corrupt: refused" <<<"$OUT"'
check "--clean left the corrupt segment alone" [ -e "$(seg_path "${PREFIX}bad-magic")" ]
run_inspect "$LIVE" --json
check "--clean did not change the live session" \
	[ "$(py "[(m['slot'], m['pid'], m['role']) for m in d['session']['members']], d['session']['producer']['epoch']")" = "$live_before" ]
kill -CONT "$Z1"
join D3 "$DEAD"
kill -KILL "$D3"; wait "$D3" 2>/dev/null
run_inspect --clean --json "$DEAD"
got=$(py "d['schema'], d['clean']['removed'], d['clean']['left']")
want="0:(1, ['$DEAD'], [])"
check "--clean --json NAME: removes only NAME, reported in JSON" \
	cond '[ "$RC:$got" = "$want" -a ! -e "$(seg_path "$DEAD")" ]'
kill -TERM "$L1"; wait "$L1"
check "a member leaving on SIGTERM exits 0 and removes its segment" [ $? = 0 -a ! -e "$(seg_path "$LIVE")" ]

finish inspect
