#!/usr/bin/env bash
# tsshim-mkdata: the synthetic dataset the data-path tests and benchmarks
# train on. Layout and counts per split and class; byte-identical output for
# the same seed at any --threads, different output for another seed; the
# manifest checked independently (FNV-1a recomputed in Python, JPEG headers
# parsed in Python, Pillow's decode hashed) and by --verify, which must also
# catch a changed, missing or unlisted file and a row whose split or class
# contradicts its path; kinds, sizes and file sizes as documented; --help,
# usage errors (exit 2), non-empty ROOT refused without --force, a ROOT that
# is a file, --force replacing an earlier dataset and nothing else; a failed
# write (file size limit) or an interrupted run (SIGINT, SIGTERM) leaving ROOT
# as it was, a dead run's staging directory removed, a live one's refused.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh

MK=$PWD/$BUILD/tsshim-mkdata
[ -x "$MK" ] || { echo "skip: $MK not built"; exit 77; }
command -v python3 >/dev/null || { echo "skip: python3 missing"; exit 77; }

# A python3 with Pillow, if any (the Debian one may not be first in PATH).
PIL_PY=
for py in python3 /usr/bin/python3; do
	if "$py" -c 'import PIL' 2>/dev/null; then PIL_PY=$py; break; fi
done

CLASSES=3 TRAIN=16 VAL=4
N=$((CLASSES * (TRAIN + VAL)))
OPTS=(--classes "$CLASSES" --train "$TRAIN" --val "$VAL")

# mk ARGS...: runs the tool; sets RC; stdout in $T_TMP/out, stderr in $T_TMP/err.
mk() {
	timeout 120 "$MK" "$@" >"$T_TMP/out" 2>"$T_TMP/err"
	RC=$?
}

# --- help and usage -----------------------------------------------------------
mk --help
check "--help exits 0" [ "$RC" -eq 0 ]
check "--help documents every option and the manifest" \
	bash -c 'for w in --classes --train --val --seed --quality --threads --force --verify \
		manifest.tsv file_fnv1a64 decode_fnv1a64 progressive gray 444 odd; do
		grep -q -- "$w" "$1" || { echo "# --help lacks $w"; exit 1; }; done' _ "$T_TMP/out"

usage_case() { # description, args...
	local d=$1; shift
	mk "$@"
	if [ "$RC" -eq 2 ] && [ -s "$T_TMP/err" ] && [ ! -s "$T_TMP/out" ]; then
		ok "usage error exits 2: $d"
	else
		not_ok "usage error exits 2: $d (rc $RC: $(head -c 200 "$T_TMP/err"))"
	fi
}
usage_case "no ROOT"
usage_case "unknown option" --bogus "$T_TMP/u"
usage_case "--classes 0" --classes 0 "$T_TMP/u"
usage_case "--quality 101" --quality 101 "$T_TMP/u"
usage_case "--threads abc" --threads abc "$T_TMP/u"
usage_case "--train -1" --train -1 "$T_TMP/u"
usage_case "two ROOTs" "$T_TMP/u" "$T_TMP/v"
usage_case "nothing to write" --train 0 --val 0 "$T_TMP/u"
usage_case "--verify with generation options" --verify --classes 3 "$T_TMP/u"
check "usage errors create nothing" [ ! -e "$T_TMP/u" ]

# --- generate -----------------------------------------------------------------
A=$T_TMP/a B=$T_TMP/b C=$T_TMP/c
mk "${OPTS[@]}" --seed 7 --threads 1 "$A"
check "generate exits 0" [ "$RC" -eq 0 ]
check "summary line on stdout" \
	grep -qE "^mkdata: wrote $N images \([0-9.]+ MB\) to $A in [0-9.]+ s$" "$T_TMP/out"
check "progress on stderr (not a TTY: lines, the last one complete)" \
	bash -c 'tail -n 1 "$1" | grep -qE "^mkdata: $2/$2 images, [0-9]+ MB, [0-9]+ img/s$" &&
		[ "$(wc -l <"$1")" -le 11 ]' _ "$T_TMP/err" "$N"

layout_ok() {
	local root=$1 split n c f i want
	for split in train val; do
		n=$TRAIN; [ "$split" = val ] && n=$VAL
		want=$(for ((c = 0; c < CLASSES; c++)); do printf 'c%03d\n' "$c"; done)
		[ "$(ls "$root/$split")" = "$want" ] || { echo "# $split: $(ls "$root/$split" | tr '\n' ' ')"; return 1; }
		for ((c = 0; c < CLASSES; c++)); do
			want=$(for ((i = 0; i < n; i++)); do printf '%05d.jpg\n' "$i"; done)
			f=$(ls "$root/$split/$(printf c%03d "$c")")
			[ "$f" = "$want" ] || { echo "# $split/c$c: $(echo "$f" | wc -l) files"; return 1; }
		done
	done
	[ "$(ls "$root")" = "$(printf 'manifest.tsv\ntrain\nval')" ] || { echo "# ROOT: $(ls "$root")"; return 1; }
}
check "layout: train/cNNN/NNNNN.jpg and val/..., counts per class, nothing else" layout_ok "$A"

# --- the manifest, checked without the tool ---------------------------------------
# Prints PASS/FAIL lines: description, then for FAIL the reason.
# report FILE RC WHAT: turn a checker's PASS/FAIL lines into ok/not_ok; a
# checker that crashed is one more failure, with its last line.
report() {
	local status desc
	while read -r status desc; do
		case $status in
		PASS) ok "$desc" ;;
		FAIL) not_ok "$desc" ;;
		esac
	done <"$1"
	[ "$2" -eq 0 ] || not_ok "$3 ran to the end (exit $2: $(tail -n 1 "$1"))"
}

python3 - "$A" "$CLASSES" "$TRAIN" "$VAL" >"$T_TMP/py.out" 2>&1 <<'EOF'
import os, sys
root, classes, ntrain, nval = sys.argv[1], *map(int, sys.argv[2:])

def report(ok, desc, why=""):
    print(("PASS " if ok else "FAIL ") + desc + ("" if ok else ": " + why))

def fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h

def sof(data):
    """(progressive, width, height, [(h, v) per component]) from the SOF marker."""
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            raise ValueError("bad marker at %d" % i)
        m = data[i + 1]
        n = int.from_bytes(data[i + 2:i + 4], "big")
        if m in (0xC0, 0xC1, 0xC2):
            s = data[i + 4:i + 4 + n]
            h, w, nc = int.from_bytes(s[1:3], "big"), int.from_bytes(s[3:5], "big"), s[5]
            samp = [(s[6 + 3 * k + 1] >> 4, s[6 + 3 * k + 1] & 15) for k in range(nc)]
            return m == 0xC2, w, h, samp
        i += 2 + n
    raise ValueError("no SOF marker")

lines = open(os.path.join(root, "manifest.tsv")).read().split("\n")
report(lines[0] == "path\tsplit\tclass\twidth\theight\tcomponents\tkind\tbytes\tfile_fnv1a64\tdecode_fnv1a64",
       "manifest header", repr(lines[0]))
report(lines[-1] == "", "manifest ends with a newline")
rows = [l.split("\t") for l in lines[1:-1]]
paths = [r[0] for r in rows]
report(paths == sorted(paths) and len(set(paths)) == len(paths), "manifest sorted by path, no duplicates")
want = sorted("%s/c%03d/%05d.jpg" % (s, c, i) for s, n in (("train", ntrain), ("val", nval))
              for c in range(classes) for i in range(n))
report(paths == want, "manifest lists exactly the expected files", "%d rows" % len(rows))

bad_cols, bad_size, bad_hash, bad_hdr = [], [], [], []
kinds = {}
normal, sizes_by_kind, bytes_500x375 = [], {}, []
total_bytes = total_px = 0
for r in rows:
    if len(r) != 10:
        bad_cols.append(r[0]); continue
    path, split, cls, w, h, comps, kind, size, fh, dh = r
    w, h, comps, size = int(w), int(h), int(comps), int(size)
    if split != path.split("/")[0] or int(cls) != int(path.split("/")[1][1:]) or \
       len(fh) != 16 or len(dh) != 16:
        bad_cols.append(path)
    data = open(os.path.join(root, path), "rb").read()
    if len(data) != size:
        bad_size.append(path)
    if "%016x" % fnv1a64(data) != fh:
        bad_hash.append(path)
    prog, jw, jh, samp = sof(data)
    c420 = len(samp) == 3 and samp[0] == (2, 2) and samp[1:] == [(1, 1), (1, 1)]
    c444 = len(samp) == 3 and all(s == (1, 1) for s in samp)
    expect = {"baseline": not prog and c420, "progressive": prog and c420,
              "gray": not prog and len(samp) == 1, "444": not prog and c444,
              "odd": not prog and c420 and w % 2 == 1 and h % 2 == 1}.get(kind, False)
    if not expect or (jw, jh) != (w, h) or len(samp) != comps:
        bad_hdr.append("%s (%s, SOF %s %dx%d %s)" % (path, kind, "C2" if prog else "C0", jw, jh, samp))
    kinds[kind] = kinds.get(kind, 0) + 1
    if kind != "odd":
        normal.append((w, h))
    if (w, h) == (500, 375) and kind in ("baseline", "progressive", "444"):
        bytes_500x375.append(size)
    total_bytes += size
    total_px += w * h
report(not bad_cols, "manifest columns well-formed and consistent with the path", " ".join(bad_cols[:5]))
report(not bad_size, "manifest sizes match the files", " ".join(bad_size[:5]))
report(not bad_hash, "manifest file hashes match FNV-1a 64 computed in Python", " ".join(bad_hash[:5]))
report(not bad_hdr, "JPEG headers match each kind (SOF0/SOF2, components, sampling, odd sides)",
       "; ".join(bad_hdr[:3]))
n = len(rows)
report(all(kinds.get(k, 0) >= 1 for k in ("baseline", "progressive", "gray", "444", "odd")),
       "every kind present", repr(kinds))
report(0.10 <= kinds.get("progressive", 0) / n <= 0.30 and kinds.get("baseline", 0) / n >= 0.45,
       "mostly baseline, about 20% progressive", repr(kinds))
report(kinds.get("gray", 0) / n <= 0.10 and kinds.get("odd", 0) / n <= 0.12,
       "gray and odd are a few percent", repr(kinds))
report(all(300 <= w <= 600 and 300 <= h <= 600 for w, h in normal),
       "sides within 300..600 except the odd kind", repr([s for s in normal if not (300 <= min(s) and max(s) <= 600)][:5]))
imagenet = sum(1 for s in normal if s in ((500, 375), (375, 500)))
report(imagenet >= 0.4 * len(normal), "biased toward 500x375 / 375x500", "%d of %d" % (imagenet, len(normal)))
bpp = 8 * total_bytes / total_px
report(2.5 <= bpp <= 8, "bits per pixel like ImageNet photos at q85 (2.5..8)", "%.2f" % bpp)
if bytes_500x375:
    avg = sum(bytes_500x375) / len(bytes_500x375)
    report(70e3 <= avg <= 180e3, "average 500x375 colour file 70..180 KB (%.0f KB)" % (avg / 1e3), "%.0f" % avg)
EOF
report "$T_TMP/py.out" $? "the Python manifest check"

# --- Pillow agrees (optional) --------------------------------------------------------
if [ -n "$PIL_PY" ]; then
	"$PIL_PY" - "$A" >"$T_TMP/pil.out" 2>&1 <<'EOF'
import os, sys
from PIL import Image
root = sys.argv[1]
def fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h
rows = [l.split("\t") for l in open(os.path.join(root, "manifest.tsv")).read().split("\n")[1:-1]]
smallest = {}
for r in rows:
    w, h = int(r[3]), int(r[4])
    if r[6] not in smallest or w * h < int(smallest[r[6]][3]) * int(smallest[r[6]][4]):
        smallest[r[6]] = r
for kind, r in sorted(smallest.items()):
    im = Image.open(os.path.join(root, r[0]))
    want_mode = "L" if r[5] == "1" else "RGB"
    ok = im.size == (int(r[3]), int(r[4])) and im.mode == want_mode and \
         bool(im.info.get("progressive")) == (kind == "progressive")
    print(("PASS " if ok else "FAIL ") + "Pillow opens %s %s: size, mode, progressive flag" % (kind, r[0]) +
          ("" if ok else ": %s %s %s" % (im.size, im.mode, im.info.get("progressive"))))
    got = "%016x" % fnv1a64(im.tobytes())
    ok = got == r[9]
    print(("PASS " if ok else "FAIL ") + "Pillow's decode of %s hashes to decode_fnv1a64" % kind +
          ("" if ok else ": %s, manifest %s" % (got, r[9])))
EOF
	report "$T_TMP/pil.out" $? "the Pillow check"
else
	echo "# Pillow not installed: Pillow checks skipped"
fi

# --- determinism -------------------------------------------------------------------
mk "${OPTS[@]}" --seed 7 --threads 3 "$B"
check "same seed, --threads 3: exits 0" [ "$RC" -eq 0 ]
check "same seed, different --threads: identical manifests" cmp -s "$A/manifest.tsv" "$B/manifest.tsv"
check "same seed, different --threads: every file byte-identical" diff -rq "$A" "$B"
mk "${OPTS[@]}" --seed 8 --threads 2 "$C"
check "another seed: exits 0" [ "$RC" -eq 0 ]
check "another seed: no file in common" \
	bash -c '! cut -f9 "$1" | sort | comm -12 - <(cut -f9 "$2" | sort) | grep -v file_fnv1a64 | grep -q .' \
	_ "$A/manifest.tsv" "$C/manifest.tsv"
check "another seed: different images" bash -c '! cmp -s "$1/train/c000/00000.jpg" "$2/train/c000/00000.jpg"' _ "$A" "$C"

# --- --verify ------------------------------------------------------------------------
mk --verify "$A"
check "--verify of a fresh dataset exits 0" [ "$RC" -eq 0 ]
check "--verify reports every image and the decode time" \
	bash -c 'grep -q "^mkdata: verified $2 images" "$1" && grep -q "decode CPU ms/image" "$1"' _ "$T_TMP/out" "$N"

cp -r "$B" "$T_TMP/t"
printf '\x00' | dd of="$T_TMP/t/train/c001/00003.jpg" bs=1 seek=20000 conv=notrunc status=none
mk --verify --threads 2 "$T_TMP/t"
check "--verify: a changed byte fails and names the file" \
	bash -c '[ "$1" -eq 1 ] && grep -q "train/c001/00003.jpg" "$2"' _ "$RC" "$T_TMP/err"
cp "$B/train/c001/00003.jpg" "$T_TMP/t/train/c001/00003.jpg"
GONE=val/c002/$(printf %05d $((VAL - 1))).jpg
rm "$T_TMP/t/$GONE"
cp "$B/val/c000/00000.jpg" "$T_TMP/t/val/c000/extra.jpg"
mk --verify "$T_TMP/t"
check "--verify: a missing file and an unlisted file fail, both named" \
	bash -c '[ "$1" -eq 1 ] && grep -q "$3: cannot read" "$2" && grep -q "val/c000/extra.jpg: not in the manifest" "$2"' \
	_ "$RC" "$T_TMP/err" "$GONE"
mk --verify "$T_TMP/nonexistent"
check "--verify of a directory without a manifest exits 1" [ "$RC" -eq 1 ]

# A trainer takes the label from the path, a checker of the data from the
# columns: a row whose split or class contradicts its path is a failure.
cp -r "$B" "$T_TMP/rows"
ROW=train/c001/00003.jpg
for edit in '$3 = 2' '$2 = "val"'; do
	awk -F'\t' -v OFS='\t' -v row="$ROW" "\$1 == row { $edit } 1" "$B/manifest.tsv" \
		>"$T_TMP/rows/manifest.tsv"
	mk --verify "$T_TMP/rows"
	check "--verify: a row changed with { $edit } contradicts its path: fails, names the row" \
		bash -c '[ "$1" -eq 1 ] && grep -q "^tsshim-mkdata: $3: .*not under" "$2"' \
		_ "$RC" "$T_TMP/err" "$ROW"
done

# --- non-empty ROOT and --force ----------------------------------------------------------
cp "$A/manifest.tsv" "$T_TMP/manifest.before"
mk "${OPTS[@]}" --seed 9 "$A"
check "non-empty ROOT refused without --force (exit 1, says --force)" \
	bash -c '[ "$1" -eq 1 ] && grep -q -- "--force" "$2"' _ "$RC" "$T_TMP/err"
check "refused run changed nothing" cmp -s "$A/manifest.tsv" "$T_TMP/manifest.before"
mkdir -p "$T_TMP/other" && echo keep >"$T_TMP/other/notes.txt"
mk --classes 1 --train 1 --val 0 "$T_TMP/other"
check "ROOT with an unrelated file refused without --force" [ "$RC" -eq 1 ]
: >"$T_TMP/afile"
mk --classes 1 --train 1 --val 0 "$T_TMP/afile"
check "a ROOT that is a file: exit 1, says it is not a directory" \
	bash -c '[ "$1" -eq 1 ] && grep -qx "tsshim-mkdata: $3 exists and is not a directory" "$2"' \
	_ "$RC" "$T_TMP/err" "$T_TMP/afile"

echo keep >"$A/notes.txt"
mk --classes 2 --train 3 --val 1 --seed 9 --force "$A"
check "--force over an earlier, bigger dataset exits 0" [ "$RC" -eq 0 ]
check "--force removed the earlier dataset's stale classes and images" \
	bash -c '[ ! -e "$1/train/c002" ] && [ ! -e "$1/val/c002" ] && [ ! -e "$1/train/c000/00003.jpg" ] &&
		[ "$(ls "$1/train/c000" | wc -l)" -eq 3 ]' _ "$A"
check "--force left unrelated files alone" grep -q keep "$A/notes.txt"
mk --verify "$A"
check "the dataset written with --force verifies" [ "$RC" -eq 0 ]
check "--quality changes the files" bash -c '
	"$1" --classes 1 --train 2 --val 0 --quality 60 "$2/q60" >/dev/null 2>&1 &&
	"$1" --classes 1 --train 2 --val 0 --quality 85 "$2/q85" >/dev/null 2>&1 &&
	[ "$(stat -c %s "$2/q60/train/c000/00000.jpg")" -lt "$(stat -c %s "$2/q85/train/c000/00000.jpg")" ]' _ "$MK" "$T_TMP"

# --- failed and interrupted runs leave ROOT as it was ---------------------------------
# A write that fails halfway (the file size limit; SIGXFSZ ignored, so write
# returns EFBIG): no truncated image, no temporary file, no partial dataset.
L=$T_TMP/lim
(trap '' XFSZ; ulimit -f 100; exec "$MK" --classes 2 --train 20 --val 0 --threads 1 "$L") \
	>"$T_TMP/out" 2>"$T_TMP/err"
RC=$?
check "a write over the file size limit fails (exit 1, says why)" \
	bash -c '[ "$1" -eq 1 ] && grep -q "File too large" "$2"' _ "$RC" "$T_TMP/err"
check "... leaves no truncated image (every .jpg ends with EOI) and no temporary file" \
	bash -c 'for f in $(find "$1" -name "*.jpg" 2>/dev/null); do
		[ "$(tail -c 2 "$f" | od -An -tx1 | tr -d " \n")" = ffd9 ] || { echo "# truncated: $f"; exit 1; }
	done; ! find "$1" -name ".*.tmp.*" 2>/dev/null | grep .' _ "$L"
check "... leaves no partial dataset (ROOT, made by the run, removed again)" [ ! -e "$L" ]

# interrupt SIG ROOT [ARGS...]: start a run into ROOT, send SIG once it has
# written some images (polled, up to 30 s); sets RC. env restores SIGINT,
# which a shell ignores in a background job (and mkdata leaves ignored).
interrupt() {
	local sig=$1 root=$2 pid i; shift 2
	env --default-signal=INT "$MK" --classes 4 --train 200 --val 0 --threads 2 "$@" "$root" \
		>"$T_TMP/out" 2>"$T_TMP/err" &
	pid=$!
	T_PIDS+=("$pid")
	for ((i = 0; i < 3000; i++)); do
		[ "$(find "$root" -name "*.jpg" 2>/dev/null | wc -l)" -ge 20 ] && break
		sleep 0.01
	done
	kill -"$sig" "$pid"
	wait "$pid"
	RC=$?
}
I=$T_TMP/int
mkdir "$I"
interrupt INT "$I"
check "SIGINT: the run ends by SIGINT and says so" \
	bash -c '[ "$1" -eq 130 ] && grep -q "interrupted by SIGINT" "$2"' _ "$RC" "$T_TMP/err"
check "SIGINT: ROOT left as it was (empty: no train/, val/ or staging directory)" \
	bash -c '[ -z "$(ls -A "$1")" ] || { echo "# ROOT holds: $(ls -A "$1")"; exit 1; }' _ "$I"
mk --classes 1 --train 2 --val 0 "$I"
check "SIGINT: a rerun without --force succeeds" [ "$RC" -eq 0 ]

F=$T_TMP/intforce
"$MK" --classes 1 --train 2 --val 0 "$F" >/dev/null 2>&1
cp "$F/manifest.tsv" "$T_TMP/manifest.before"
interrupt TERM "$F" --force
check "SIGTERM with --force: the run ends by SIGTERM and says so" \
	bash -c '[ "$1" -eq 143 ] && grep -q "interrupted by SIGTERM" "$2"' _ "$RC" "$T_TMP/err"
check "SIGTERM with --force: the earlier dataset is intact, no staging directory left" \
	bash -c 'cmp -s "$1/manifest.tsv" "$2" && [ "$(ls -A "$1")" = "$(printf "manifest.tsv\ntrain")" ] &&
		"$3" --verify "$1" >/dev/null 2>&1' _ "$F" "$T_TMP/manifest.before" "$MK"

# A staging directory of a run that died (SIGKILL) is removed; one of a live
# run (this shell stands for it) makes the run refuse ROOT.
S=$T_TMP/stale
DEAD=$(cat /proc/sys/kernel/pid_max) # never a process id
mkdir -p "$S/.mkdata.tmp.$DEAD/train/c000" && echo x >"$S/.mkdata.tmp.$DEAD/train/c000/00000.jpg"
mk --classes 1 --train 2 --val 0 "$S"
check "a dead run's staging directory: removed (and said), the run succeeds without --force" \
	bash -c '[ "$1" -eq 0 ] && grep -q "removed .*\.mkdata\.tmp\.$3, left by an interrupted run" "$2" &&
		[ "$(ls -A "$4")" = "$(printf "manifest.tsv\ntrain")" ]' _ "$RC" "$T_TMP/err" "$DEAD" "$S"
LV=$T_TMP/live
mkdir -p "$LV/.mkdata.tmp.$$"
mk --force --classes 1 --train 2 --val 0 "$LV"
check "a live run's staging directory: refused even with --force, names the process" \
	bash -c '[ "$1" -eq 1 ] && grep -q "another run (pid $3)" "$2" &&
		[ "$(ls -A "$4")" = ".mkdata.tmp.$3" ]' _ "$RC" "$T_TMP/err" "$$" "$LV"

finish mkdata
