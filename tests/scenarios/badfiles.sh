#!/usr/bin/env bash
# Dataset files that are not what they seem (issue 7, bad input), with the
# shim in exact mode against the same job without it (tsshim-train): a file
# rewritten between two jobs that share the decode cache (the second must
# train on the new bytes), a JPEG reached through a symlink, a corrupt JPEG,
# a file replaced or deleted while the job runs (prefetch on, the cache
# holding the old decodes), and a file or a class directory the job may not
# read (same error, same exit).
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh
TRAIN="$PWD/$BUILD/tsshim-train"
MKDATA="$PWD/$BUILD/tsshim-mkdata"
CACHETOOL="$PWD/$BUILD/tests/ts-cachetool"
[ -x "$TRAIN" ] && [ -x "$MKDATA" ] && [ -x "$CACHETOOL" ] || { echo "needs tsshim-train, tsshim-mkdata, ts-cachetool"; exit 77; }
"$MKDATA" --classes 2 --train 6 --val 1 --seed 31 "$T_TMP/d" >/dev/null 2>&1 || exit 1
D=$T_TMP/d/train
ARGS=(--batch 4 --size 32 --epochs 1 --seed 2 --workers 2)
sum() { sed -n 's/.*trained_checksum=\([0-9a-f]*\).*/\1/p' "$1"; }
plain() { "$TRAIN" "${ARGS[@]}" "$@" >"$T_TMP/plain.out" 2>"$T_TMP/plain.err"; echo $? >"$T_TMP/plain.rc"; }
shim() { TSSHIM_MODE=exact TSSHIM_SESSION=$S LD_PRELOAD="$TS_PRELOAD" "$TRAIN" "${ARGS[@]}" "$@" \
	>"$T_TMP/shim.out" 2>"$T_TMP/shim.err"; echo $? >"$T_TMP/shim.rc"; }
errors() { # the job's error lines: not the shim's, not the timing line, pids masked
	grep -v -e '^tsshim\[' -e '^tsshim-train: wall ' "$1" | sed 's/pid [0-9]*/pid N/g'
}
same_run() { # the two runs: same exit, same checksum (if any), same error lines (the shim's own lines aside)
	[ "$(cat "$T_TMP/plain.rc")" = "$(cat "$T_TMP/shim.rc")" ] && [ "$(sum "$T_TMP/plain.out")" = "$(sum "$T_TMP/shim.out")" ] &&
		diff <(errors "$T_TMP/plain.err") <(errors "$T_TMP/shim.err") >/dev/null
}

# A holder keeps the session's decode cache alive between the jobs.
S=$(session_name bad)
mkfifo "$T_TMP/hold"
"$CACHETOOL" hold "$S" --budget-mb 64 <"$T_TMP/hold" >/dev/null 2>&1 &
exec 9>"$T_TMP/hold"

# 1. A file rewritten (same name, other bytes) after a job filled the cache.
plain "$D"; shim "$D"
check "a first shared run trains as without the shim ($(sum "$T_TMP/shim.out"))" same_run
cp "$T_TMP/plain.out" "$T_TMP/first.out"
victim=$(ls "$D/c001" | LC_ALL=C sort | sed -n 2p)
other=$(ls "$D/c000" | LC_ALL=C sort | sed -n 1p)
cp "$D/c000/$other" "$T_TMP/new.jpg" && mv "$T_TMP/new.jpg" "$D/c001/$victim" # new inode, other image
hits() { "$CACHETOOL" stats "$S" | sed -n 's/.* hits=\([0-9]*\).*/\1/p'; }
h0=$(hits)
plain "$D"; shim "$D"
check "after $victim was rewritten, the next job trains on its new bytes, not the cached decode" same_run
check "... while the other images came from the cache (hits $h0 -> $(hits))" [ "$(hits)" -gt "${h0:-0}" ]
check "... which changed what it trains on" [ "$(sum "$T_TMP/plain.out")" != "$(sum "$T_TMP/first.out")" ]

# 2. A file rewritten in place (same inode), then its mtime moved on.
cat "$D/c000/$other" >"$D/c001/$(ls "$D/c001" | LC_ALL=C sort | sed -n 3p)"
plain "$D"; shim "$D"
check "a file rewritten in place (same inode, new size and mtime): the new bytes" same_run

# 3. A JPEG reached through a symlink to a file outside the dataset.
mkdir -p "$T_TMP/outside"
mv "$D/c000/$other" "$T_TMP/outside/$other"
ln -s "$T_TMP/outside/$other" "$D/c000/$other"
plain "$D"; shim "$D"
check "a JPEG reached through a symlink: trained on as without the shim" same_run

# 4. A corrupt JPEG: the same libjpeg error and exit.
bad=$(ls "$D/c000" | LC_ALL=C sort | sed -n 3p)
head -c 2000 "$D/c000/$bad" >"$T_TMP/t" && mv "$T_TMP/t" "$D/c000/$bad"
plain "$D"; shim "$D"
check "a truncated JPEG: the same error and exit ($(cat "$T_TMP/shim.rc")) as without the shim" same_run
check "... naming the file" grep -q "$bad" "$T_TMP/shim.err"
rm -f "$D/c000/$bad"

# 5. A file replaced (rename) or deleted while the job runs, with prefetch on
# and the session's cache holding every image's old decode (the job before
# filled it). Deterministic: no shuffle, no workers (the main process decodes,
# so it is the member that prefetches), 0.4 s a batch; the dataset changes
# once the first batch is recorded, four batches before the job opens the
# victim, the last sample. The job without the shim gets the same change at
# the same point: whatever that run gets, the shim's must too.
SLOW=(--shuffle 0 --workers 0 --batch 2 --step-ms 400 --record "$T_TMP/rec")
# during KIND PLAIN|SHIM: run the slow job, do KIND once its first batch is
# recorded; the dataset is put back afterwards.
during() {
	local kind=$1 how=$2
	rm -f "$T_TMP/rec"
	cp -p "$late" "$T_TMP/late.orig"
	if [ "$how" = plain ]; then plain "$D" "${SLOW[@]}" & else
		TSSHIM_PREFETCH=warm TSSHIM_LOG=info shim "$D" "${SLOW[@]}" & fi
	local job=$!
	if wait_for "$T_TMP/rec" '^seq=0 ' 20; then
		case $kind in
		replace) cp "$D/c000/$(ls "$D/c000" | LC_ALL=C sort | sed -n 2p)" "$T_TMP/new.jpg" && mv "$T_TMP/new.jpg" "$late" ;;
		delete) rm -f "$late" ;;
		esac
		grep -c '^seq=' "$T_TMP/rec" >"$T_TMP/at.$how" # batches done when it changed
	fi
	wait $job
	mv "$T_TMP/late.orig" "$late"
}
late=$D/c001/$(ls "$D/c001" | LC_ALL=C sort | tail -n 1)
plain "$D" "${ARGS[@]}" --shuffle 0 --workers 0 --batch 2; cp "$T_TMP/plain.out" "$T_TMP/before.out"
shim "$D" --shuffle 0 --workers 0 --batch 2 # fills the cache with every image as it is now
h0=$(hits)
during replace plain; during replace shim
check "a file replaced (rename) while the job ran, after batch $(cat "$T_TMP/at.shim"): trained on its new bytes, as without the shim" same_run
check "... which changed what the job trained on (the change came before the file was opened)" \
	[ "$(sum "$T_TMP/plain.out")" != "$(sum "$T_TMP/before.out")" ]
n=$(sed -n 's/.* samples=\([0-9]*\) .*/\1/p' "$T_TMP/shim.out")
check "... every other image served from the cache's old decodes, not that one (hits $h0 -> $(hits), $n samples), prefetch on ($(grep -o 'prefetch: [0-9]* files' "$T_TMP/shim.err"))" \
	cond '[ "$(hits)" = $((h0 + n - 1)) ] && grep -q "prefetch: [1-9][0-9]* files" "$T_TMP/shim.err"'
during delete plain; during delete shim
check "a file deleted while the job ran, after batch $(cat "$T_TMP/at.shim"): the same error and exit ($(cat "$T_TMP/shim.rc")) as without the shim" same_run
check "... which named it ($(errors "$T_TMP/shim.err" | head -n 1 | cut -c 1-160))" \
	cond '[ "$(cat "$T_TMP/shim.rc")" != 0 ] && grep -qF "$(basename "$late")" "$T_TMP/shim.err"'

# 6. A file the job may not read (as another user: root reads everything).
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
	chmod -R a+rX "$T_TMP"
	unread=$(ls "$D/c001" | LC_ALL=C sort | sed -n 1p)
	chmod 000 "$D/c001/$unread"
	as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
	W=$(mktemp -d /tmp/tsshim-bad.XXXXXX); chmod 755 "$W"
	cp "$TRAIN" "$BUILD/libtsshim.so" "$W/"
	as_nobody "$W/tsshim-train" "${ARGS[@]}" "$D" >"$T_TMP/plain.out" 2>"$T_TMP/plain.err"; echo $? >"$T_TMP/plain.rc"
	as_nobody env TSSHIM_MODE=exact TSSHIM_SESSION="$S-n" LD_PRELOAD="$W/libtsshim.so" "$W/tsshim-train" "${ARGS[@]}" "$D" \
		>"$T_TMP/shim.out" 2>"$T_TMP/shim.err"; echo $? >"$T_TMP/shim.rc"
	check "an unreadable file: the same error and exit ($(cat "$T_TMP/shim.rc")) as without the shim" same_run
	chmod 644 "$D/c001/$unread"
	# A class directory the job may not list (000), or list but not enter (0644).
	for m in 000 644; do
		chmod $m "$D/c001"
		as_nobody "$W/tsshim-train" "${ARGS[@]}" "$D" >"$T_TMP/plain.out" 2>"$T_TMP/plain.err"; echo $? >"$T_TMP/plain.rc"
		as_nobody env TSSHIM_MODE=exact TSSHIM_SESSION="$S-n" LD_PRELOAD="$W/libtsshim.so" "$W/tsshim-train" "${ARGS[@]}" "$D" \
			>"$T_TMP/shim.out" 2>"$T_TMP/shim.err"; echo $? >"$T_TMP/shim.rc"
		check "a class directory of mode $m: the same error and exit ($(cat "$T_TMP/shim.rc")) as without the shim ($(errors "$T_TMP/shim.err" | head -n 1 | cut -c 1-150))" \
			cond 'same_run && [ "$(cat "$T_TMP/shim.rc")" != 0 ]'
		chmod 755 "$D/c001"
	done
	rm -rf "$W"
	rm -f /dev/shm/tsshim*.65534."$S"-n*
else
	echo "# not root: the unreadable-file case is skipped"
fi

exec 9>&-
wait
check "nothing of the session left in /dev/shm" [ -z "$(ls /dev/shm | grep -F ".$S")" ]
finish badfiles
