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
trap 'rm -rf "$D"; rm -f /dev/shm/tsshim*.$OTHER.t-$$-* /dev/shm/tsshim*.0.t-$$-*; cleanup' EXIT

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

# --- The decoded-image cache (exact mode, tsshim-train) -----------------------
TRAIN="$PWD/$BUILD/tsshim-train"
MKDATA="$PWD/$BUILD/tsshim-mkdata"
cp "$TRAIN" "$D/"
chmod 755 "$D/tsshim-train"
"$MKDATA" --classes 2 --train 6 --val 1 --seed 9 "$D/data" >/dev/null 2>&1
chmod -R a+rX "$D/data"
TARGS=(--batch 4 --size 32 --epochs 2 --seed 3 --workers 2)
sum() { sed -n 's/.*trained_checksum=\([0-9a-f]*\).*/\1/p' "$1"; }
"$D/tsshim-train" "${TARGS[@]}" "$D/data/train" >"$T_TMP/tref.out" 2>/dev/null
REF=$(sum "$T_TMP/tref.out")
# train WHO NAME SESSION [ARGS...]: tsshim-train as root or the other user, exact
# mode, with the shim; $T_TMP/NAME.out, .err, .rc.
train() {
	local who=$1 name=$2 sess=$3; shift 3
	local run=(env); [ "$who" = other ] && run=(setpriv --reuid="$OTHER" --regid="$OTHER" --clear-groups env)
	"${run[@]}" TSSHIM_MODE=exact TSSHIM_SESSION="$sess" TSSHIM_CACHE_MB=64 LD_PRELOAD="$PRE" \
		"$D/tsshim-train" "${TARGS[@]}" "$@" "$D/data/train" >"$T_TMP/$name.out" 2>"$T_TMP/$name.err"
	echo $? >"$T_TMP/$name.rc"
}
shimlines() { grep -c '^tsshim\[' "$1"; }

# Both users at once, one session name: each its own cache, each right.
C=$(session_name cache)
ROOT_C=/dev/shm/tsshim-cache.0.$C OTHER_C=/dev/shm/tsshim-cache.$OTHER.$C
TSSHIM_LOG=info train root croot "$C" --step-ms 150 &
rpid=$!
TSSHIM_LOG=info train other cother "$C" --step-ms 150 &
opid=$!
for ((i = 0; i < 500; i++)); do [ -f "$ROOT_C" ] && [ -f "$OTHER_C" ] && break; sleep 0.01; done
modes="$(stat -c %u:%a "$ROOT_C" 2>&1) $(stat -c %u:%a "$OTHER_C" 2>&1)"
wait $rpid $opid
check "root and the other user in cache session '$C' at once: two caches, each its user's, 0600 ($modes)" \
	[ "$modes" = "0:600 $OTHER:600" ]
hits() { sed -n 's/.*removed, last out: \([0-9]*\) hits, \([0-9]*\) fills.*/\1 \2/p' "$1"; }
check "... each job trained as without the shim ($REF; rc $(cat "$T_TMP/croot.rc") $(cat "$T_TMP/cother.rc"))" \
	cond '[ "$(sum "$T_TMP/croot.out")" = "$REF" ] && [ "$(sum "$T_TMP/cother.out")" = "$REF" ]'
check "... each from its own cache: 12 fills, then 12 hits in epoch 2 (root: $(hits "$T_TMP/croot.err"), other: $(hits "$T_TMP/cother.err"))" \
	cond '[ "$(hits "$T_TMP/croot.err")" = "12 12" ] && [ "$(hits "$T_TMP/cother.err")" = "12 12" ]'
check "... and both caches removed at the end" cond '[ ! -e "$ROOT_C" ] && [ ! -e "$OTHER_C" ]'

# planted_cache WHO PATH DESCRIPTION: a job of WHO finds PATH planted: it runs
# without the cache, right, with one line naming it; the planted object stays.
planted_cache() {
	local who=$1 path=$2 d=$3 before
	before=$(stat -c %u:%a:%s:%F "$path"; readlink "$path")
	train "$who" planted "$P"
	check "$d: the job exits 0 and trains as without the shim ($(sum "$T_TMP/planted.out"))" \
		cond '[ "$(cat "$T_TMP/planted.rc")" = 0 ] && [ "$(sum "$T_TMP/planted.out")" = "$REF" ]'
	check "... with one line naming it ($(grep "^tsshim\[" "$T_TMP/planted.err" | head -n 1 | cut -c 1-200))" \
		cond '[ "$(shimlines "$T_TMP/planted.err")" = 1 ] && grep -qF "$path: refused: " "$T_TMP/planted.err"'
	check "... the planted object left as it was" [ "$(stat -c %u:%a:%s:%F "$path"; readlink "$path")" = "$before" ]
	rm -f "$path"
}
P=$(session_name cplant)
echo planted >"/dev/shm/tsshim-cache.$OTHER.$P"
chmod 600 "/dev/shm/tsshim-cache.$OTHER.$P"
planted_cache other "/dev/shm/tsshim-cache.$OTHER.$P" "a cache root planted under the other user's name"
# The other user's own cache, linked under root's name (by the other user).
mkfifo "$T_TMP/chold"; chmod 666 "$T_TMP/chold"
cp "$PWD/$BUILD/tests/ts-cachetool" "$D/"; chmod 755 "$D/ts-cachetool"
as_other "$D/ts-cachetool" hold "$P-real" --budget-mb 16 <"$T_TMP/chold" >/dev/null 2>&1 &
holder=$!
exec 8>"$T_TMP/chold"
for ((i = 0; i < 300; i++)); do [ -f "/dev/shm/tsshim-cache.$OTHER.$P-real" ] && break; sleep 0.01; done
as_other ln "/dev/shm/tsshim-cache.$OTHER.$P-real" "/dev/shm/tsshim-cache.0.$P"
planted_cache root "/dev/shm/tsshim-cache.0.$P" "a valid cache of the other user's, linked under root's name"
exec 8>&-
wait "$holder"
echo planted >"/dev/shm/tsshim-cache.$OTHER.$P"
chown $OTHER:$OTHER "/dev/shm/tsshim-cache.$OTHER.$P"
chmod 644 "/dev/shm/tsshim-cache.$OTHER.$P"
planted_cache other "/dev/shm/tsshim-cache.$OTHER.$P" "a cache of the other user's own but mode 0644"
echo keep >"$T_TMP/ctarget"
as_other ln -s "$T_TMP/ctarget" "/dev/shm/tsshim-cache.0.$P"
planted_cache root "/dev/shm/tsshim-cache.0.$P" "a symlink the other user planted at root's cache path"
check "... its target untouched" [ "$(cat "$T_TMP/ctarget")" = keep ]

# --- A shared PyTorch DataLoader's feed (tsshim-feed.<uid>.<session>...) -----
PY=/usr/bin/python3
if "$PY" -c 'import torch, torchvision, PIL' 2>/dev/null; then
	cp -r "$BUILD/python" "$PWD/tests/py/share_job.py" "$D/"
	chmod -R a+rX "$D"
	mkdir "$D/o"
	chown $OTHER "$D/o"
	VERIFY=(timeout 120 "$PY" "$PWD/tests/py/share_verify.py" --root "$D/data" --cache "$T_TMP/table.json")
	# pyjob WHO NAME SESSION [ARGS...]: share_job.py in the background, as root or
	# the other user, with the shim; record $D/o/NAME.jsonl, $T_TMP/NAME.err.
	pyjob() {
		local who=$1 name=$2 sess=$3; shift 3
		local run=(env); [ "$who" = other ] && run=(setpriv --reuid="$OTHER" --regid="$OTHER" --clear-groups env)
		"${run[@]}" TSSHIM_SESSION="$sess" TSSHIM_LOG="${PYLOG:-warn}" LD_PRELOAD="$PRE" timeout -s ABRT 120 \
			"$PY" "$D/share_job.py" --root "$D/data" --workers 2 --epochs 2 --batch-size 4 \
			--record "$D/o/$name.jsonl" "$@" >/dev/null 2>"$T_TMP/$name.err" &
		JOBS+=($!)
		T_PIDS+=($!)
	}
	jobs_ok() { # every job of JOBS exited 0
		local p rc=0
		for p in "${JOBS[@]}"; do wait "$p" || rc=1; done
		JOBS=()
		return $rc
	}
	JOBS=()
	# Both users at once, one session name, two jobs each: two feeds.
	F=$(session_name feed)
	PYLOG=info pyjob root fr1 "$F" --seed 1 --sleep 0.2 --barrier "$D/o/fr:2"
	PYLOG=info pyjob root fr2 "$F" --seed 2 --sleep 0.2 --barrier "$D/o/fr:2"
	PYLOG=info pyjob other fo1 "$F" --seed 3 --sleep 0.2 --barrier "$D/o/fo:2"
	PYLOG=info pyjob other fo2 "$F" --seed 4 --sleep 0.2 --barrier "$D/o/fo:2"
	for ((i = 0; i < 3000; i++)); do
		# each user's first batch published
		ls /dev/shm/tsshim-feed.0."$F".*.s0.g0 /dev/shm/tsshim-feed.$OTHER."$F".*.s0.g0 >/dev/null 2>&1 && break
		sleep 0.01
	done
	(cd /dev/shm && stat -c '%U %a %n' tsshim*."$F".*) >"$T_TMP/feed.ls" 2>&1
	check "root and the other user's jobs in session '$F' at once all finished" jobs_ok
	KEY=$(sed -n 's/.*DataLoader shares as feed \([0-9a-f]*\) .*/\1/p' "$T_TMP/fr1.err" | head -n 1)
	fobjs() { grep -cE "^$1 600 tsshim[a-z-]*\.$2\.$F\.$KEY(\.|\$)" "$T_TMP/feed.ls"; }
	check "... each user's feed files and feed segment are its own, 0600 (root $(fobjs root 0), other $(fobjs nobody $OTHER) of $(grep -c . "$T_TMP/feed.ls"))" \
		cond '[ -n "$KEY" ] && [ "$(fobjs root 0)" -ge 3 ] && [ "$(fobjs nobody $OTHER)" -ge 3 ] && [ $(($(fobjs root 0) + $(fobjs nobody $OTHER))) = "$(grep -c . "$T_TMP/feed.ls")" ]'
	"${VERIFY[@]}" --expect-one-producer "$D/o/fr1.jsonl" "$D/o/fr2.jsonl" >"$T_TMP/vr" 2>&1
	check "... root's two jobs shared one stream, one producer ($(tail -n 1 "$T_TMP/vr"))" grep -q 'verify: OK' "$T_TMP/vr"
	"${VERIFY[@]}" --expect-one-producer "$D/o/fo1.jsonl" "$D/o/fo2.jsonl" >"$T_TMP/vo" 2>&1
	check "... the other user's two, their own ($(tail -n 1 "$T_TMP/vo"))" grep -q 'verify: OK' "$T_TMP/vo"
	check "... nothing of '$F' left in /dev/shm" [ -z "$(ls /dev/shm | grep -F ".$F.")" ]

	# refused_feed NAME... : each job exited 0, said why in one line, and trained
	# on its own loader (every epoch whole, labels right).
	refused_feed() {
		local d=$1 pat=$2 n; shift 2
		check "$d: the jobs finish" jobs_ok
		for n in "$@"; do
			check "... $n: one line ($(grep '^tsshim\[' "$T_TMP/$n.err" | head -n 1 | cut -c 1-230))" \
				cond '[ "$(grep -c "^tsshim\[" "$T_TMP/$n.err")" = 1 ] && grep -qE "$pat" "$T_TMP/$n.err"'
		done
		"${VERIFY[@]}" --mode plain $(for n in "$@"; do echo "$D/o/$n.jsonl"; done) >"$T_TMP/vp" 2>&1
		check "... each trained on its own DataLoader, right ($(tail -n 1 "$T_TMP/vp"))" grep -q 'verify: OK' "$T_TMP/vp"
	}
	if [ -n "$KEY" ]; then
		# A feed segment root planted under the other user's name.
		Q=$(session_name fplant)
		echo planted >"/dev/shm/tsshim.$OTHER.$Q.$KEY"
		chmod 600 "/dev/shm/tsshim.$OTHER.$Q.$KEY"
		pyjob other fp1 "$Q" --barrier "$D/o/fp:2"
		pyjob other fp2 "$Q" --barrier "$D/o/fp:2"
		refused_feed "a feed segment root planted under the other user's name" \
			"cannot open feed $KEY: EACCES: .*tsshim\.$OTHER\.$Q\.$KEY: Permission denied" fp1 fp2
		check "... left as it was" [ "$(stat -c %u:%s "/dev/shm/tsshim.$OTHER.$Q.$KEY")" = 0:8 ]
		rm -f "/dev/shm/tsshim.$OTHER.$Q.$KEY"
		# A symlink the other user planted at root's feed segment path.
		as_other ln -s "$T_TMP/ctarget" "/dev/shm/tsshim.0.$Q.$KEY"
		pyjob root fs1 "$Q" --barrier "$D/o/fs:2"
		pyjob root fs2 "$Q" --barrier "$D/o/fs:2"
		refused_feed "a symlink the other user planted at root's feed segment path" \
			"cannot open feed $KEY: ELOOP: .*tsshim\.0\.$Q\.$KEY" fs1 fs2
		check "... its target untouched" [ "$(cat "$T_TMP/ctarget")" = keep ]
		rm -f "/dev/shm/tsshim.0.$Q.$KEY"
		# The ledger of the other user's live feed replaced by root's file, then
		# by its own file with mode 0644: the job that joins next refuses it.
		# Both start at once and meet once torch is imported; the joiner then
		# waits 2 s, in which the ledger is replaced (started only after the
		# replacement, an import slowed by ASan brought it after the producer's
		# end: it made a feed of its own and said nothing).
		for how in root 0644; do
			Q=$(session_name "l$how")
			pyjob other "lp$how" "$Q" --sleep 0.8 --barrier "$D/o/l$how:2" # 5 s: the joiner comes well before the end
			pyjob other "lc$how" "$Q" --barrier "$D/o/l$how:2" --start-delay 2
			for ((i = 0; i < 3000; i++)); do
				L=$(ls /dev/shm/tsshim-feed.$OTHER."$Q".*.ledger 2>/dev/null) && [ -n "$L" ] && break
				sleep 0.01
			done
			echo planted >"$T_TMP/ledger"
			if [ "$how" = root ]; then chmod 600 "$T_TMP/ledger"; else chown $OTHER "$T_TMP/ledger"; chmod 644 "$T_TMP/ledger"; fi
			mv "$T_TMP/ledger" "$L"
			refused_feed "the other user's feed ledger replaced by $([ $how = root ] && echo "a file of root's" || echo "its own file, mode 0644")" \
				"cannot open feed $KEY: EACCES: $L refused: not a 0600 file owned by uid $OTHER" "lc$how"
			check "... while its producer trained on" cond '[ "$(grep -c "\"end\":true" "$D/o/lp$how.jsonl")" = 2 ]'
			rm -f "$L"
		done
	fi
else
	echo "# python3-torch/torchvision/pil not installed: the feed cases are skipped"
fi

# Nothing tsshim made is readable by others, whoever made it.
bad=$(find /dev/shm -maxdepth 1 -name 'tsshim*' -perm /077 2>/dev/null | head -n 3)
check "no tsshim object in /dev/shm is readable or writable by group or others${bad:+ ($bad)}" [ -z "$bad" ]

kill -TERM "$A"
wait "$A" 2>/dev/null
finish isolation
