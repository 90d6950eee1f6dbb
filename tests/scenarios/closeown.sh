#!/usr/bin/env bash
# A program that closes descriptors it never opened (a daemon's loop over
# every number from 3, close_range, closefrom) after the shim joined its
# session: the shim's own descriptor is not the program's to close. Before,
# the close went through, the program's next files took the number, and the
# shim, which still held it for its session, closed the program's file in a
# forked child (the child's writes to it failed with EBADF) and at exit
# (a log written through stdio lost its buffered lines), and its segment
# was left in /dev/shm (its lock was gone). Now such a close answers EBADF,
# as without the shim, and close_range and closefrom close around it: the
# program's output, its log and what is left in /dev/shm are those of a run
# without the shim. The program's own files above the shim's descriptor are
# closed too (before, close_range(3, ~0u) and closefrom closed none of them:
# the last gap's end wrapped to 0), and flags close_range refuses are refused
# (EINVAL; before, 0).
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh

PROG=$PWD/$BUILD/tests/ts-closeown
for f in "$PROG" "$BUILD/libtsshim.so"; do
	[ -e "$f" ] || { echo "skip: $f not built"; exit 77; }
done
[ -w /dev/shm ] || { echo "skip: /dev/shm not writable"; exit 77; }
unset TSSHIM_MODE TSSHIM_LOG TSSHIM_SESSION

left() { ls /dev/shm | grep -c -- "$1"; }

for mode in close close_range closefrom; do
	timeout 30 "$PROG" $mode "$T_TMP/$mode.plain.log" >"$T_TMP/$mode.plain" 2>&1
	prc=$?
	sess=$(session_name "closeown-$mode")
	LD_PRELOAD="$TS_PRELOAD" TSSHIM_SESSION="$sess" timeout 30 "$PROG" $mode "$T_TMP/$mode.shim.log" \
		>"$T_TMP/$mode.shim" 2>&1
	src=$?
	check "$mode: the program's output under the shim is its output without it (rc $prc $src)" \
		cond '[ $prc = 0 ] && [ $src = 0 ] && cmp -s "$T_TMP/$mode.plain" "$T_TMP/$mode.shim"' ||
		diff "$T_TMP/$mode.plain" "$T_TMP/$mode.shim" | sed 's/^/#   /'
	check "$mode: its log holds the child's line and the buffered line flushed at exit, as without the shim" \
		cond 'printf "child line\nparent line\n" | cmp -s - "$T_TMP/$mode.shim.log" &&
		      cmp -s "$T_TMP/$mode.plain.log" "$T_TMP/$mode.shim.log"' ||
		sed 's/^/#   /' "$T_TMP/$mode.shim.log"
	check "$mode: nothing of its session is left in /dev/shm ($(left "$sess"))" [ "$(left "$sess")" = 0 ]
done

finish closeown
