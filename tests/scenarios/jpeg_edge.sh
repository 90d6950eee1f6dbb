#!/usr/bin/env bash
# Legal but unusual libjpeg call sequences under exact mode, each compared
# with the same program without the shim, while the cache already holds the
# images: an object reset with the generic jpeg_abort and reused (same image
# with another DCT method, or another image), a buffer cut short by the
# program, RGB565 with and without dithering, and a file holding two JPEGs.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh
EDGE="$PWD/$BUILD/tests/ts-jpegedge"
MKDATA="$PWD/$BUILD/tsshim-mkdata"
CACHETOOL="$PWD/$BUILD/tests/ts-cachetool"
[ -x "$MKDATA" ] || { echo "needs tsshim-mkdata"; exit 77; }
"$MKDATA" --classes 2 --train 3 --val 1 --seed 9 "$T_TMP/d" >/dev/null 2>&1 || exit 1
# A: the largest file (a cut buffer must still hold more than the proven prefix)
A=$(ls -S "$T_TMP"/d/train/*/*.jpg | sed -n 1p)
B=$(ls -S "$T_TMP"/d/train/*/*.jpg | sed -n 2p)
cat "$A" "$B" >"$T_TMP/d/train/c000/zz-two.jpg"
S=$(session_name edge)
mkfifo "$T_TMP/fifo"
"$CACHETOOL" hold "$S" --budget-mb 256 <"$T_TMP/fifo" >/dev/null &
exec 9>"$T_TMP/fifo"
shim() { TSSHIM_MODE=exact TSSHIM_SESSION=$S LD_PRELOAD="$TS_PRELOAD" "$EDGE" "$@"; }
# Fill the cache with every image the cases touch, in every output they use.
for f in "$A" "$B" "$T_TMP/d/train/c000/zz-two.jpg"; do shim plain "$f" >/dev/null; shim dither "$f" >/dev/null; done
for args in "abort-reuse $A" "abort-other $A $B" "trunc $A" "dither $A" "concat $T_TMP/d/train/c000/zz-two.jpg"; do
	# shellcheck disable=SC2086
	want=$("$EDGE" $args 2>&1)
	# shellcheck disable=SC2086
	got=$(shim $args 2>&1)
	check "${args%% *}: same pixels, sizes and warnings as without the shim" [ "$want" = "$got" ]
	[ "$want" = "$got" ] || { echo "# want: $want"; echo "# got:  $got"; }
done
exec 9>&-
wait
finish jpeg_edge
