#!/usr/bin/env bash
# memcheck on the code that reads shared memory written by others: a ring
# producer and consumer, and tsshim-inspect on a live session.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh
command -v valgrind >/dev/null || { echo "valgrind not installed"; exit 77; }
ldd "$BUILD/tsshim-inspect" | grep -q libasan && { echo "ASan build: memcheck does not apply"; exit 77; }

VG=(valgrind -q --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite)
RING=$PWD/$BUILD/tests/ts-ring
S=$(session_name vg)

"${VG[@]}" "$RING" --session "$S" --produce-us 2000 >"$T_TMP/p" 2>&1 &
P=$!; T_PIDS+=("$P")
sleep 1
"${VG[@]}" "$RING" --session "$S" --batch 100 --max-samples 3000 >"$T_TMP/c" 2>&1 &
C=$!; T_PIDS+=("$C")
sleep 1
"${VG[@]}" "$INSPECT" "$S" --json >"$T_TMP/i" 2>"$T_TMP/i.err"
check "inspect NAME --json memcheck-clean" [ $? = 0 ]
"${VG[@]}" "$INSPECT" >/dev/null 2>>"$T_TMP/i.err"
check "inspect (list) memcheck-clean" [ $? = 0 ]
wait "$C"; rc=$?
check "ring consumer memcheck-clean and verified its stream" cond '[ "$rc" = 0 ] && grep -q "^done samples=3000" "$T_TMP/c"'
kill -TERM "$P"; wait "$P"; rc=$?
check "ring producer memcheck-clean" [ "$rc" = 0 ]
[ "$T_FAILED" = 0 ] || cat "$T_TMP/p" "$T_TMP/c" "$T_TMP/i.err"
finish valgrind
