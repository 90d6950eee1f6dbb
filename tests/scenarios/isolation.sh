#!/usr/bin/env bash
# Sessions of two users never meet (issue 7, isolation): root and a second
# account (nobody, uid 65534) run members of the session of the same name,
# each gets its own segment, private to its owner; tsshim-inspect shows each
# user only their own sessions; a segment planted under the other user's
# name is refused with one line and the program goes on; no shared-memory
# object is ever readable by another user. Needs root (exit 77 otherwise).
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh
[ "$(id -u)" = 0 ] || { echo "needs root to run a second user"; exit 77; }
command -v setpriv >/dev/null || { echo "needs setpriv (util-linux)"; exit 77; }
OTHER=65534
as_other() { setpriv --reuid=$OTHER --regid=$OTHER --clear-groups "$@"; }

# The other user may not be able to read the build tree: a world-readable copy.
D=$(mktemp -d /tmp/tsshim-iso.XXXXXX)
chmod 755 "$D"
cp "$BUILD/libtsshim.so" "$MEMBER" "$INSPECT" "$D/"
chmod 755 "$D"/*
PRE=${TS_PRELOAD/$PWD\/$BUILD\/libtsshim.so/$D/libtsshim.so}
trap 'rm -rf "$D"; rm -f /dev/shm/tsshim.$OTHER.t-$$-*; cleanup' EXIT

S=$(session_name iso)
ROOT_SEG=/dev/shm/tsshim.0.$S
OTHER_SEG=/dev/shm/tsshim.$OTHER.$S

start_member A "$S"
wait_for "$T_TMP/$A.out" '^join=0'
# exec all the way down: $! is then the member itself
(exec setpriv --reuid=$OTHER --regid=$OTHER --clear-groups env LD_PRELOAD="$PRE" TSSHIM_SESSION="$S" \
	"$D/ts-member" >"$T_TMP/other.out" 2>"$T_TMP/other.err") &
OPID=$!
T_PIDS+=("$OPID")
wait_for "$T_TMP/other.out" '^join=' 10
check "the other user's member of '$S' joins a session of its own, as its producer" \
	grep -q '^join=0 role=producer' "$T_TMP/other.out"
check "root's member is still the producer of root's '$S' (nothing moved)" [ "$(last_role "$A")" = producer ]
check "two segments, one per user: $ROOT_SEG and $OTHER_SEG" cond '[ -f "$ROOT_SEG" ] && [ -f "$OTHER_SEG" ]'
check "each owned by its user, mode 0600" \
	cond '[ "$(stat -c %u:%a "$ROOT_SEG")" = 0:600 ] && [ "$(stat -c %u:%a "$OTHER_SEG")" = $OTHER:600 ]'

# tsshim-inspect shows each user their own sessions only.
as_other "$D/tsshim-inspect" --json >"$T_TMP/other.list" 2>&1
"$INSPECT" --json >"$T_TMP/root.list" 2>&1
names() { python3 -c 'import json,sys
for s in json.load(open(sys.argv[1]))["sessions"]: print(s["name"], s["path"])' "$1"; }
check "the other user's list: its '$S', at its own path, and nothing of root's" \
	cond '[ "$(names "$T_TMP/other.list" | grep -c " /dev/shm/tsshim\.0\.")" = 0 ] && names "$T_TMP/other.list" | grep -qx "$S $OTHER_SEG"'
check "root's list: its '$S' only, not the other user's" \
	cond '[ "$(names "$T_TMP/root.list" | grep -c "tsshim\.$OTHER\.")" = 0 ] && names "$T_TMP/root.list" | grep -qx "$S $ROOT_SEG"'
as_other "$D/tsshim-inspect" "$S" --json >"$T_TMP/other.one" 2>&1
check "the other user's detail view of '$S' shows its own member, not root's" \
	cond 'python3 -c "import json,sys; s=json.load(open(sys.argv[1]))[\"session\"]; sys.exit(0 if [m[\"pid\"] for m in s[\"members\"]] == [int(sys.argv[2])] else 1)" "$T_TMP/other.one" "$OPID"'
kill -TERM "$OPID"
wait "$OPID" 2>/dev/null
check "the other user's segment goes with its last member; root's stays" cond '[ ! -e "$OTHER_SEG" ] && [ -f "$ROOT_SEG" ]'
as_other "$D/tsshim-inspect" "$S" >"$T_TMP/other.none" 2>&1
rc=$?
check "root's session is invisible to the other user by name too (exit $rc: no session)" \
	cond '[ $rc = 1 ] && grep -q "no session" "$T_TMP/other.none"'

# A segment planted under the other user's name, by root: refused, one line.
P=$(session_name planted)
: >"/dev/shm/tsshim.$OTHER.$P"
chmod 600 "/dev/shm/tsshim.$OTHER.$P"
out=$(as_other env LD_PRELOAD="$PRE" TSSHIM_SESSION="$P" "$D/ts-member" --hold-ms 0 2>"$T_TMP/planted.err")
rc=$?
check "a segment root planted under the other user's name: join refused, the program exits 0 ($out)" \
	cond '[ $rc = 0 ] && [[ "$out" == join=-* ]]'
check "... with one line saying why ($(cat "$T_TMP/planted.err"))" \
	cond '[ "$(grep -c . "$T_TMP/planted.err")" = 1 ] && grep -q "cannot join session .*Permission denied" "$T_TMP/planted.err"'
check "... and the planted file left as it was" [ "$(stat -c %u:%s "/dev/shm/tsshim.$OTHER.$P")" = 0:0 ]
rm -f "/dev/shm/tsshim.$OTHER.$P"

# Its own file, but readable by others (0644): not trusted either.
: >"/dev/shm/tsshim.$OTHER.$P"
chown $OTHER:$OTHER "/dev/shm/tsshim.$OTHER.$P"
chmod 644 "/dev/shm/tsshim.$OTHER.$P"
out=$(as_other env LD_PRELOAD="$PRE" TSSHIM_SESSION="$P" "$D/ts-member" --hold-ms 0 2>"$T_TMP/open.err")
rc=$?
check "a segment of its own name but mode 0644: refused, the program exits 0 ($(head -c 120 "$T_TMP/open.err"))" \
	cond '[ $rc = 0 ] && [[ "$out" == join=-* ]] && [ "$(grep -c . "$T_TMP/open.err")" = 1 ]'
rm -f "/dev/shm/tsshim.$OTHER.$P"

# A symlink planted at its path, pointing at a file of root's: never followed.
echo keep >"$T_TMP/target"
ln -s "$T_TMP/target" "/dev/shm/tsshim.$OTHER.$P"
out=$(as_other env LD_PRELOAD="$PRE" TSSHIM_SESSION="$P" "$D/ts-member" --hold-ms 0 2>"$T_TMP/link.err")
rc=$?
check "a symlink at its segment path: refused, the program exits 0, the target untouched" \
	cond '[ $rc = 0 ] && [[ "$out" == join=-* ]] && [ "$(cat "$T_TMP/target")" = keep ]'
rm -f "/dev/shm/tsshim.$OTHER.$P"

# Nothing tsshim made is readable by others, whoever made it.
bad=$(find /dev/shm -maxdepth 1 -name 'tsshim*' -perm /077 2>/dev/null | head -n 3)
check "no tsshim object in /dev/shm is readable or writable by group or others${bad:+ ($bad)}" [ -z "$bad" ]

kill -TERM "$A"
wait "$A" 2>/dev/null
finish isolation
