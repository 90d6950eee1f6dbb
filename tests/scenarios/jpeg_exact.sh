#!/usr/bin/env bash
# Exact mode serves decodes byte-identical to the real decoder: every file of
# a generated dataset (baseline, progressive, gray, 4:4:4, odd sizes) in every
# output variant (scales 1/1..1/8; RGB, RGBX, gray, YCbCr; DCT methods; fancy
# upsampling on/off) decoded without the shim, then twice under it (a real
# decode that fills the cache, then a hit), through libjpeg directly and
# through Pillow.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh
MKDATA="$PWD/$BUILD/tsshim-mkdata"
[ -x "$MKDATA" ] || { echo "needs tsshim-mkdata"; exit 77; }
CHECK="$PWD/$BUILD/tests/ts-jpegcheck"
CACHETOOL="$PWD/$BUILD/tests/ts-cachetool"
"$MKDATA" --classes 5 --train 10 --val 1 --seed 13 "$T_TMP/data" >/dev/null 2>&1 || exit 1
DATA="$T_TMP/data/train"
# Damaged files among the good ones: truncated (libjpeg warns and pads),
# garbage after a valid header, and not a JPEG at all.
f=$(find "$DATA" -name '*.jpg' | sort | head -n 1)
head -c 20000 "$f" >"$DATA/c000/zz-truncated.jpg"
{ head -c 2000 "$f"; head -c 30000 /dev/urandom; } >"$DATA/c000/zz-garbage.jpg"
head -c 5000 /dev/urandom >"$DATA/c000/zz-notjpeg.jpg"
stat_of() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" "$2"; }

# with a holder keeping the cache (and its counters) alive: hold SESSION
hold() {
	mkfifo "$T_TMP/fifo.$1"
	"$CACHETOOL" hold "$1" --budget-mb 1024 <"$T_TMP/fifo.$1" >/dev/null &
	HOLDER=$!
	exec 9>"$T_TMP/fifo.$1"
}
release() { "$CACHETOOL" stats "$1" >"$T_TMP/stats.$1"; exec 9>&-; wait "$HOLDER"; }

# --- libjpeg directly ----------------------------------------------------------
S=$(session_name jpeg)
"$CHECK" "$DATA" >"$T_TMP/ref"
hold "$S"
TSSHIM_MODE=exact TSSHIM_SESSION=$S LD_PRELOAD="$TS_PRELOAD" "$CHECK" --passes 2 "$DATA" >"$T_TMP/shim"
release "$S"
total=$(wc -l <"$T_TMP/ref")
errors=$(grep -c ' error ' "$T_TMP/ref")
check "libjpeg: the real decode under the shim (fill) matches without it ($total decodes)" \
	cmp -s <(awk '$3 == 0' "$T_TMP/shim") "$T_TMP/ref"
check "libjpeg: every cached decode (hit) is byte-identical to the real one" \
	cmp -s <(awk '$3 == 1 {$3 = 0; print}' "$T_TMP/shim") "$T_TMP/ref"
hits=$(stat_of hits "$T_TMP/stats.$S")
clean=$(grep -c 'warnings=0$' "$T_TMP/ref")
echo "# libjpeg: $total decodes per pass, $errors failed, $((total - errors - clean)) with warnings, $hits hits"
check "libjpeg: the second pass was served from the cache, except decodes that warned ($hits of $clean)" [ "$hits" = "$clean" ]
check "libjpeg: refused conversions and corrupt files give the same libjpeg error or warnings under the shim" \
	[ "$(grep -c ' error ' "$T_TMP/shim")" = $((2 * errors)) ]
check "libjpeg: damaged files decode (or fail) exactly as without the shim" \
	cmp -s <(grep zz- "$T_TMP/shim" | awk '{$3 = 0; print}' | sort -u) <(grep zz- "$T_TMP/ref" | sort)

# --- Pillow ----------------------------------------------------------------------
PY=/usr/bin/python3
if "$PY" -c 'import PIL' 2>/dev/null; then
	S=$(session_name pil)
	rm -f "$DATA"/c000/zz-* # Pillow raises on them; libjpeg covered them above
	"$PY" tests/py/pillow_variants.py "$DATA" 1 >"$T_TMP/pref"
	hold "$S"
	TSSHIM_MODE=exact TSSHIM_SESSION=$S LD_PRELOAD="$TS_PRELOAD" "$PY" tests/py/pillow_variants.py "$DATA" 2 >"$T_TMP/pshim"
	release "$S"
	n=$(wc -l <"$T_TMP/pref")
	check "Pillow: $n decodes (load, draft scales, gray, YCbCr, convert) identical, both passes" \
		cmp -s "$T_TMP/pshim" <(cat "$T_TMP/pref" "$T_TMP/pref")
	hits=$(stat_of hits "$T_TMP/stats.$S")
	echo "# Pillow: $n decodes per pass, $hits served from the cache"
	check "Pillow: the second pass was served from the cache ($hits hits)" [ "$hits" -ge "$n" ]
else
	echo "# python3-pil not installed: Pillow part skipped"
fi
finish jpeg_exact
