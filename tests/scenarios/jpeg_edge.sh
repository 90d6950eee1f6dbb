#!/usr/bin/env bash
# Legal but unusual libjpeg call sequences under exact mode, each compared
# with the same program without the shim, while the cache already holds the
# images: an object reset with the generic jpeg_abort and reused (same image
# with another DCT method, or another image), a fill given up with the
# generic jpeg_abort, hits ended by the generic jpeg_destroy, a buffer cut short by the
# program, a file of which the program read only a prefix (before, served the
# whole cached image instead of the partial decode), a finish before the last
# row, RGB565 with and without dithering, a file holding two JPEGs, Pillow's
# incremental feeding of progressive images (libjpeg suspends in
# start_decompress) on a fill, a hit, a crop after the hit, and a bypass (image
# larger than the cache), descriptors reused by freopen or closed by a vfork
# child, and a file rewritten in place (its mtime put back, or while it is read).
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
# RW: rewritten in place by its cases (rewrite-mtime, rewrite-open), A again after each
RW=$T_TMP/d/train/c000/zz-rewritten.jpg
cp "$A" "$RW"
# P: a progressive image (start_decompress reads all its scans, so it suspends)
P=$(awk -F'\t' '$7 == "progressive" { print $1; exit }' "$T_TMP/d/manifest.tsv")
[ -n "$P" ] && P=$T_TMP/d/$P
# COM: A with a comment holding FF D9 before its EOI, then B; PCOM the same
# with P (a hit's finish took that FF D9 for the end: the source stood inside
# A, and B was "Not a JPEG file")
com() { /usr/bin/python3 -c 'import sys
a, b = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
open(sys.argv[3], "wb").write(a[:-2] + bytes([0xFF, 0xFE, 0, 6, 0xFF, 0xD9, 0, 0]) + a[-2:] + b)' "$@"; }
COM=$T_TMP/d/train/c000/zz-com.jpg
com "$A" "$B" "$COM"
PCOM=
[ -n "$P" ] && PCOM=$T_TMP/d/train/c000/zz-pcom.jpg && com "$P" "$B" "$PCOM"
# BIG: progressive and larger decoded (1200x1000x3) than a 1 MiB cache can hold;
# noise, so that the file too is larger than Pillow's 64 KiB chunks (~650 KB)
/usr/bin/python3 -c 'import sys; from PIL import Image
Image.merge("RGB", [Image.effect_noise((1200, 1000), s) for s in (20, 30, 40)]).save(sys.argv[1], quality=90, progressive=True)' \
	"$T_TMP/d/train/c001/zz-big.jpg" 2>/dev/null || echo "# no Pillow: no large progressive image"
S=$(session_name edge)
mkfifo "$T_TMP/fifo"
"$CACHETOOL" hold "$S" --budget-mb 256 <"$T_TMP/fifo" >/dev/null &
exec 9>"$T_TMP/fifo"
shim() { TSSHIM_MODE=exact TSSHIM_SESSION=$S LD_PRELOAD="$TS_PRELOAD" "$EDGE" "$@"; }
# Fill the cache with every image the cases touch, in every output they use.
for f in "$A" "$B" "$T_TMP/d/train/c000/zz-two.jpg" ${P:+"$P"} "$COM" ${PCOM:+"$PCOM"}; do
	shim plain "$f" >/dev/null
	shim dither "$f" >/dev/null
done
shim nofancy "$A" >/dev/null # fills the image without fancy upsampling: skip, crop-late and overread hit it
# prefix-open: a prefix handed to libjpeg's memory source while the file is
# still open where the read ended (was served the whole image: the memory
# source never gets more); chunk-mod: read in 4 KiB chunks, then changed past
# the first (was served the clean image: only the first read was hashed).
# On a hit: skip (rows skipped, then read, without fancy upsampling) decodes
# for real from there (a review saw skipped-then-read rows of the merged
# upsampler differ from a whole decode's; these files do not show it, so
# this one is a check, not a regression test); crop-late (a crop after rows were read: libjpeg's
# JERR_BAD_STATE; it was accepted); overread (rows asked past the last:
# libjpeg's JWRN_TOO_MUCH_DATA warning; it was none). rewrite-mtime: a file
# rewritten in place, the same size, its mtime put back as cp -p does (was
# served the old image: the key held no ctime); rewrite-open: rewritten while
# it is read, after its first read (was served the old image: its identity
# was taken at that read, and the later reads were not checked). consume:
# jpeg_consume_input after a hit's last row (it never reached EOI: 50 calls
# answering JPEG_REACHED_SOS, a loop without a cap spins for ever) and
# jpeg_input_complete (0 for a progressive image whose real start read it
# whole). COM, PCOM: both images of the file, from memory and through a
# source of the program's own that reads 4 KiB at a time (fdsrc: a hit's
# finish left that source at its first chunk, and the second image failed).
for args in "rewrite-mtime $RW" "rewrite-open $RW" "abort-reuse $A" "abort-other $A $B" "trunc $A" "prefix $A" "prefix-open $A" "chunked $A" "chunk-mod $A" "skip $A" "crop-late $A" "overread $A" "early $A" "dither $A" "concat $T_TMP/d/train/c000/zz-two.jpg" "consume $A" ${P:+"consume $P"} "concat $COM" ${PCOM:+"concat $PCOM"} \
	"fdsrc $COM 2" ${PCOM:+"fdsrc $PCOM 2"} "fdsrc $T_TMP/d/train/c000/zz-two.jpg 2"; do
	# shellcheck disable=SC2086
	want=$("$EDGE" $args 2>&1)
	# shellcheck disable=SC2086
	got=$(shim $args 2>&1)
	check "${args%% *}: same pixels, sizes and warnings as without the shim" [ "$want" = "$got" ]
	[ "$want" = "$got" ] || { echo "# want: $want"; echo "# got:  $got"; }
done
TSSHIM_LOG=debug shim chunked "$A" >/dev/null 2>"$T_TMP/chunked.err"
check "chunked: a file read in 4 KiB chunks, unchanged, is still proven (every read hashed as it came)" \
	grep -q "proven dataset file" "$T_TMP/chunked.err"
if [ -n "$P" ]; then
	hits() { grep -o '[0-9]* hits' "$1" | cut -d' ' -f1; } # the session's count at exit
	want=$("$EDGE" suspend "$P" 2>/dev/null)
	got=$(TSSHIM_LOG=info shim suspend "$P" 2>"$T_TMP/susp1.err")
	check "suspend (Pillow's chunked feeding), fill: same pixels as without the shim" [ "$want" = "$got" ]
	got=$(TSSHIM_LOG=info shim suspend "$P" 2>"$T_TMP/susp2.err")
	check "suspend, hit: same pixels as without the shim" [ "$want" = "$got" ]
	check "suspend, hit: served from the cache (session hits $(hits "$T_TMP/susp1.err") -> $(hits "$T_TMP/susp2.err"))" \
		[ "$(hits "$T_TMP/susp2.err")" = $(($(hits "$T_TMP/susp1.err") + 1)) ]
	# Cropped after start_decompress returned: the crop needs a real start,
	# which for a progressive image reads every scan. Before, the hit came
	# before any of them had arrived, the real start suspended inside the
	# crop, and libjpeg failed ("Improper call in state 203").
	want=$("$EDGE" suspend-crop "$P" 2>/dev/null)
	got=$(shim suspend-crop "$P" 2>/dev/null)
	check "suspend-crop: cropped after a hit as without the shim ($got)" [ "$want" = "$got" ]
	# The same from a program that does not link jpeg_crop_scanline but
	# looks it up with dlsym when it crops, after the start. It links dlsym,
	# so it may crop: the real start runs before the hit. Before, the hit
	# came first, the crop's real start suspended, and libjpeg failed.
	want=$("$EDGE-dlcrop" suspend-crop "$P" 2>/dev/null)
	got=$(TSSHIM_LOG=debug TSSHIM_MODE=exact TSSHIM_SESSION=$S LD_PRELOAD="$TS_PRELOAD" "$EDGE-dlcrop" suspend-crop "$P" \
		2>"$T_TMP/dlcrop.err")
	check "suspend-crop, the crop looked up with dlsym: as without the shim ($got)" [ "$want" = "$got" ]
	check "... a hit, after the real start" cond 'grep -q "a hit waits for the real start" "$T_TMP/dlcrop.err" &&
		[ "$(hits "$T_TMP/dlcrop.err")" -gt "$(hits "$T_TMP/susp2.err")" ]'
	[ "$want" = "$got" ] || { echo "# want: $want"; echo "# got:  $got"; }
fi
# The generic jpeg_abort and jpeg_destroy called by the program (libjpeg
# calls them itself too, from the calls the shim hooks: those pass through).
# generic-abort gives up a fill half-way with jpeg_abort and decodes the image
# again on another object: before, the fill stayed open until the process
# exited, and that decode waited for it (1 s here) and decoded privately.
# generic-destroy ends 300 hits with jpeg_destroy at objects of their own
# addresses: before, each kept its hit's decoded copy (299632 KiB).
stat4() { "$CACHETOOL" stats "$S" | grep -oE " $1=[0-9]+" | cut -d= -f2; }
bw0=$(stat4 bypass_wait) ab0=$(stat4 aborts)
want=$("$EDGE" generic-abort "$A" 2>&1)
got=$(shim generic-abort "$A" 2>&1)
bw1=$(stat4 bypass_wait) ab1=$(stat4 aborts)
check "generic-abort: same pixels as without the shim ($got)" [ "$want" = "$got" ]
check "generic-abort: the fill the program gave up was aborted at its jpeg_abort, not waited for (aborts $ab0 -> $ab1, bypass_wait $bw0 -> $bw1)" \
	[ "$bw1" = "$bw0" -a "$ab1" = $((ab0 + 1)) ]
want=$("$EDGE" generic-destroy "$A" 300 2>/dev/null)
got=$(shim generic-destroy "$A" 300 2>"$T_TMP/gd.err")
grew=$(sed -n 's/.*resident set grew \([0-9]*\) KiB.*/\1/p' "$T_TMP/gd.err")
check "generic-destroy: same pixels as without the shim ($got)" [ "$want" = "$got" ]
check "generic-destroy: 300 hits ended by jpeg_destroy keep none of their copies (resident set grew ${grew:-?} KiB)" \
	[ "${grew:-999999}" -lt 32768 ]

# A program forks while it decodes X (a fill in progress); the child destroys
# its copy of the object. The fill is the parent's: before, the child's
# destroy aborted it, the range went to the next images of a 2 MiB cache while
# the parent still wrote X's rows into it, and a later hit served them.
"$MKDATA" --classes 1 --train 8 --val 0 --seed 11 "$T_TMP/f" >/dev/null 2>&1 || exit 1
FX=$(ls "$T_TMP"/f/train/*/*.jpg | sed -n 1p)
FY=$(ls "$T_TMP"/f/train/*/*.jpg | sed -n '2,8p' | xargs)
# shellcheck disable=SC2086
want=$("$EDGE" fork "$FX" $FY 2>&1)
# shellcheck disable=SC2086
got=$(TSSHIM_MODE=exact TSSHIM_CACHE_MB=2 TSSHIM_SESSION="$S-fork" LD_PRELOAD="$TS_PRELOAD" "$EDGE" fork "$FX" $FY 2>&1)
check "fork mid-decode, the child destroys its copy: every later hit as decoded ($got)" \
	[ "$want" = "$got" ]

# A descriptor reused behind the hooks (freopen closes A and opens B under
# A's number): B's bytes must not be proven as A (two images of one size: the
# same key but for the file). Before, B was cached under A's identity, and A
# decoded later was a hit with B's pixels.
read -r FA FB < <(awk -F'\t' 'NR > 1 { k = $4 "x" $5; if (k in seen) { print seen[k], $1; exit } seen[k] = $1 }' \
	"$T_TMP/f/manifest.tsv")
want=$("$EDGE" freopen "$T_TMP/f/$FA" "$T_TMP/f/$FB" 2>&1)
got=$(shim freopen "$T_TMP/f/$FA" "$T_TMP/f/$FB" 2>&1)
check "freopen: B read through A's reused descriptor is not cached as A ($(echo "$got" | xargs))" [ "$want" = "$got" ]
[ "$want" = "$got" ] || { echo "# want: $want"; echo "# got:  $got"; }

# The descriptor table follows freopen after a read (before, B stayed under
# A's stale entry and was never proven, so never shared), and a vfork child's
# close_range is not the parent's (it shares our memory until its exec:
# before, it untracked every file the parent had open).
fshim() { TSSHIM_MODE=exact TSSHIM_SESSION="$S-f" TSSHIM_DATA="$T_TMP/f" TSSHIM_LOG=debug LD_PRELOAD="$TS_PRELOAD" "$EDGE" "$@"; }
want=$("$EDGE" freopen-read "$T_TMP/f/$FA" "$T_TMP/f/$FB" 2>&1)
got=$(fshim freopen-read "$T_TMP/f/$FA" "$T_TMP/f/$FB" 2>"$T_TMP/fr.err")
check "freopen after a read: B decoded as without the shim, and proven B's" \
	cond '[ "$want" = "$got" ] && grep -q "$FB: proven dataset file" "$T_TMP/fr.err"'
want=$("$EDGE" vfork "$T_TMP/f/$FA" 2>&1)
got=$(fshim vfork "$T_TMP/f/$FA" 2>"$T_TMP/vf.err")
check "a vfork child's close_range leaves the parent's files tracked: proven, same pixels" \
	cond '[ "$want" = "$got" ] && grep -q "$FA: proven dataset file" "$T_TMP/vf.err"'

if [ -f "$T_TMP/d/train/c001/zz-big.jpg" ]; then
	big=$T_TMP/d/train/c001/zz-big.jpg
	# Fed in parts (Pillow: 64 KiB, ts-jpegedge: 4 KiB), progressive: a hit
	# before the real start only where the code cannot crop. Pillow never
	# links jpeg_crop_scanline: its hit is early (0.29 ms a decode here, against
	# 3.5 ms when the real start reads every scan first).
	late="a hit waits for the real start"
	TSSHIM_LOG=debug shim suspend "$big" >/dev/null 2>"$T_TMP/late.err"
	check "progressive fed in parts to code that links the crop: the real start runs first" \
		grep -q "$late" "$T_TMP/late.err"
	TSSHIM_MODE=exact TSSHIM_SESSION=$S TSSHIM_LOG=debug LD_PRELOAD="$TS_PRELOAD" /usr/bin/python3 -c \
		'import sys; from PIL import Image; [Image.open(sys.argv[1]).load() for _ in range(2)]' "$big" \
		2>"$T_TMP/pil.err"
	check "the same decoded by Pillow (no crop): the hit is early" \
		cond 'grep -q "zz-big.jpg: proven" "$T_TMP/pil.err" && ! grep -q "$late" "$T_TMP/pil.err"'
	want=$("$EDGE" suspend "$big" 2>/dev/null)
	got=$(TSSHIM_MODE=exact TSSHIM_CACHE_MB=1 TSSHIM_SESSION="$S-small" LD_PRELOAD="$TS_PRELOAD" "$EDGE" suspend "$big" 2>/dev/null)
	check "suspend, bypass (decode larger than the cache): decoded as without the shim" [ "$want" = "$got" ]
	[ "$want" = "$got" ] || { echo "# want: $want"; echo "# got:  $got"; }
fi
# counts: rows a jpeg_read_scanlines call gives on a hit, asking 64, 3, and
# 1, 2, 5, 8 in turn, in five outputs, 4:2:0 (fancy upsampling: context
# rows, 4 rows at an iMCU row's end), progressive, 4:4:4 and 4:2:2: those
# libjpeg gives (a hit gave every row asked for: 64 a call). Last: its
# fills (A at 1/2) would leave generic-abort nothing to abort.
/usr/bin/python3 -c 'import sys; from PIL import Image
im = Image.open(sys.argv[1]).convert("RGB")
im.save(sys.argv[2], subsampling=0, quality=90); im.crop((0, 0, 301, 203)).save(sys.argv[3], subsampling=1)' \
	"$A" "$T_TMP/d/train/c001/zz-444.jpg" "$T_TMP/d/train/c001/zz-422.jpg" 2>/dev/null || echo "# no Pillow: 4:2:0 only"
bad= n=0
for f in "$A" ${P:+"$P"} "$T_TMP"/d/train/c001/zz-4*.jpg; do
	for v in plain nofancy half 3/8 gray; do
		shim counts "$f" $v >/dev/null
		want=$("$EDGE" counts "$f" $v 2>&1)
		got=$(shim counts "$f" $v 2>&1)
		n=$((n + 1))
		[ "$want" = "$got" ] || { bad="$bad ${f##*/}:$v"; echo "# want: ${want:0:160}"; echo "# got:  ${got:0:160}"; }
	done
done
check "counts: rows a call, on hits, as without the shim ($n images and outputs${bad:+; not$bad})" [ -z "$bad" ]
exec 9>&-
wait
finish jpeg_edge
