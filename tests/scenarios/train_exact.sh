#!/usr/bin/env bash
# The reference training program under the shim, exact mode: every batch it
# trains on is bit-identical to a run without the shim (workers forked or
# spawned, 0 to 3 of them, pinned or not, with validation), and three
# same-seed jobs at once decode each image once.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh
TRAIN="$PWD/$BUILD/tsshim-train"
MKDATA="$PWD/$BUILD/tsshim-mkdata"
CACHETOOL="$PWD/$BUILD/tests/ts-cachetool"
[ -x "$TRAIN" ] && [ -x "$MKDATA" ] || { echo "needs tsshim-train and tsshim-mkdata"; exit 77; }
"$MKDATA" --classes 4 --train 15 --val 3 --seed 21 "$T_TMP/data" >/dev/null 2>&1 || exit 1
NIMG=$(find "$T_TMP/data/train" -name '*.jpg' | wc -l)
export TSSHIM_MODE=exact
ARGS=(--batch 8 --size 64 --epochs 2 --seed 4 --val "$T_TMP/data/val" --val-every 5)
summary() { grep 'trained_checksum=' "$1"; }
stat_of() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" "$2"; }

"$TRAIN" "${ARGS[@]}" --workers 0 --record "$T_TMP/ref.rec" "$T_TMP/data/train" >"$T_TMP/ref.out" 2>&1
check "reference run without the shim" grep -q 'trained_checksum=' "$T_TMP/ref.out"

for cfg in "--workers 0" "--workers 2 --start fork" "--workers 3 --start spawn --pin" "--workers 2 --persistent-workers"; do
	S=$(session_name t$RANDOM)
	TSSHIM_SESSION=$S LD_PRELOAD="$TS_PRELOAD" "$TRAIN" "${ARGS[@]}" $cfg --record "$T_TMP/shim.rec" \
		"$T_TMP/data/train" >"$T_TMP/shim.out" 2>"$T_TMP/shim.err"
	check "$cfg: every batch record identical with the shim" cmp -s "$T_TMP/ref.rec" "$T_TMP/shim.rec"
	check "$cfg: same trained checksum" [ "$(summary "$T_TMP/shim.out")" = "$(summary "$T_TMP/ref.out")" ]
	check "$cfg: nothing left in /dev/shm" [ -z "$(ls /dev/shm | grep -E "^tsshim(-cache)?\.$(id -u)\.$S\$")" ]
done

# Three same-seed jobs at once, a holder keeping the cache's counters.
S=$(session_name three)
mkfifo "$T_TMP/fifo"
"$CACHETOOL" hold "$S" --budget-mb 512 <"$T_TMP/fifo" >/dev/null &
holder=$!
exec 9>"$T_TMP/fifo"
pids=()
for j in 1 2 3; do
	TSSHIM_SESSION=$S LD_PRELOAD="$TS_PRELOAD" "$TRAIN" --batch 8 --size 64 --epochs 1 --seed 4 --workers 2 \
		--record "$T_TMP/j$j.rec" "$T_TMP/data/train" >"$T_TMP/j$j.out" 2>&1 &
	pids+=($!)
done
wait "${pids[@]}"
"$TRAIN" --batch 8 --size 64 --epochs 1 --seed 4 --workers 2 --record "$T_TMP/one.rec" "$T_TMP/data/train" >/dev/null 2>&1
same=1
for j in 1 2 3; do cmp -s "$T_TMP/one.rec" "$T_TMP/j$j.rec" || same=0; done
check "3 same-seed jobs at once: each trained on exactly its own batches" [ "$same" = 1 ]
"$CACHETOOL" stats "$S" >"$T_TMP/stats"
exec 9>&-
wait "$holder"
fills=$(stat_of fills "$T_TMP/stats") hits=$(stat_of hits "$T_TMP/stats")
echo "# 3 jobs over $NIMG images: $fills real decodes, $hits served from the cache"
check "3 same-seed jobs: each image decoded once" [ "$fills" = "$NIMG" ]
check "3 same-seed jobs: the two others were served every image" [ "$hits" = $((2 * NIMG)) ]
finish train_exact
