#!/usr/bin/env bash
# tsshim-train, the reference training program, on its own (no shim): the
# same seed and options give the same per-batch record and trained_checksum
# whatever the workers, start method, persistence, pinning and shared-memory
# kind; sampler, batching, --break-after, --val-every and labels do what
# --help says; dead workers, corrupt files, a missing CUDA runtime and ^C
# end the job quickly with a clear message.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh

TRAIN=$PWD/$BUILD/tsshim-train
MKDATA=$PWD/$BUILD/tsshim-mkdata
[ -x "$TRAIN" ] || { echo "not ok - $TRAIN not built"; exit 1; }
[ -x "$MKDATA" ] || { echo "needs tsshim-mkdata ($MKDATA not built)"; exit 77; }

D=$T_TMP/data
if ! "$MKDATA" --classes 4 --train 12 --val 4 --seed 3 "$D" >"$T_TMP/mkdata.out" 2>&1; then
	cat "$T_TMP/mkdata.out"; echo "not ok - tsshim-mkdata failed"; exit 1
fi
N=48 NVAL=16 # 4 classes x 12, 4 x 4

# train NAME ARGS...: run into $T_TMP/NAME.{rec,out,err}; sets RC.
train() {
	local name=$1; shift
	"$TRAIN" --record "$T_TMP/$name.rec" "$@" >"$T_TMP/$name.out" 2>"$T_TMP/$name.err"
	RC=$?
	[ "$RC" = 0 ] || { echo "# $name exited $RC:"; sed 's/^/#   /' "$T_TMP/$name.err" | head -5; }
}
summary() { cat "$T_TMP/$1.out"; }
checksum() { sed -n 's/.*trained_checksum=\([0-9a-f]*\).*/\1/p' "$T_TMP/$1.out"; }
lines() { grep -v '^#' "$T_TMP/$1.rec"; } # batch lines only
field() { # the value of KEY in each line on stdin
	awk -v k="$1=" '{ for (i = 1; i <= NF; i++) if (index($i, k) == 1) { print substr($i, length(k) + 1); break } }'
}

# --- help and usage -----------------------------------------------------------
"$TRAIN" --help >"$T_TMP/help" 2>&1
check "--help exits 0" [ $? = 0 ]
missing=
for o in val limit val-limit size batch val-batch workers start persistent-workers prefetch shm timeout pin \
	seed shuffle epochs device cudart step-ms val-step-ms step-spin val-every break-after readback tsshim record help \
	graph capture-thread; do
	grep -q -- "--$o" "$T_TMP/help" || missing="$missing --$o"
done
check "--help explains every option${missing:+ (missing:$missing)}" [ -z "$missing" ]
"$TRAIN" --batch 0 "$D/train" >/dev/null 2>"$T_TMP/usage.err"
rc=$?
check "bad value: exit 2 with a clear message" cond '[ $rc = 2 ] && grep -q -- "--batch: expected an integer" "$T_TMP/usage.err"'
# refused WANT ARG...: exit 2, and stderr says WANT. Before: --gpu was named
# '----gpu', -xy named the program, 0x10 and ' 5' were milliseconds.
refused() {
	local want=$1 rc
	shift
	"$TRAIN" "$@" "$D/train" >/dev/null 2>"$T_TMP/usage.err"
	rc=$?
	check "usage: '$*' is refused, naming it" cond '[ $rc = 2 ] && grep -qF -- "$want" "$T_TMP/usage.err"'
}
refused "--gpu: expected" --gpu 99
refused "unknown option '-x'" -xy
refused "--step-ms: expected" --step-ms 0x10
refused "--step-ms: expected" --step-ms " 5"
refused "--seed: expected" --seed 18446744073709551616
refused "--graph and --capture-thread need --device cuda --pin --workers 0" --graph --device cuda --workers 0
refused "--graph and --capture-thread: not with --upload-pattern side-stream" \
	--capture-thread --device cuda --pin --workers 0 --upload-pattern side-stream
"$TRAIN" --seed 18446744073709551615 --help >/dev/null 2>&1
check "usage: the largest seed (2^64-1) is a seed" [ $? = 0 ]

# --- determinism across loader configurations -------------------------------------
shm_count() { local f n=0; for f in /dev/shm/train_*; do [ -e "$f" ] && n=$((n + 1)); done; echo $n; }
shm_before=$(shm_count)
COMMON=(--size 32 --batch 5 --epochs 2 --seed 11 --val "$D/val" --val-every 4 "$D/train")
train ref --workers 0 "${COMMON[@]}"
check "reference run (--workers 0) succeeds" [ "$RC" = 0 ]
check "summary line: batches=20 samples=96 trained_checksum=HEX" \
	grep -qE '^tsshim-train: batches=20 samples=96 trained_checksum=[0-9a-f]{16}$' "$T_TMP/ref.out"
check "timing line on stderr" grep -qE '^tsshim-train: wall [0-9.]+ s, [0-9.]+ train samples/s' "$T_TMP/ref.err"
check "record ends with the summary" grep -q "^# end batches=20 samples=96 trained_checksum=$(checksum ref)\$" "$T_TMP/ref.rec"

i=0
for v in "--workers 1" "--workers 3" "--workers 2 --start spawn" "--workers 2 --persistent-workers" \
	"--workers 2 --pin" "--workers 0 --pin" "--workers 3 --start spawn --persistent-workers --pin" \
	"--workers 2 --shm memfd --prefetch 1" "--workers 4 --prefetch 4 --pin --persistent-workers"; do
	i=$((i + 1))
	# shellcheck disable=SC2086
	train "v$i" $v "${COMMON[@]}"
	if [ "$RC" = 0 ] && cmp -s "$T_TMP/ref.rec" "$T_TMP/v$i.rec" && cmp -s "$T_TMP/ref.out" "$T_TMP/v$i.out"; then
		ok "$v: same records and trained_checksum as --workers 0"
	else
		not_ok "$v: differs from --workers 0 (exit $RC)"
		diff "$T_TMP/ref.rec" "$T_TMP/v$i.rec" | head -4 | cut -c1-160
	fi
done
shm_after=$(shm_count)
check "no shared-memory object left in /dev/shm" [ "$shm_before" = "$shm_after" ]

train seed2 --workers 2 --size 32 --batch 5 --epochs 2 --seed 12 --val "$D/val" --val-every 4 "$D/train"
check "another seed: another trained_checksum" cond '[ -n "$(checksum seed2)" ] && [ "$(checksum seed2)" != "$(checksum ref)" ]'
check "another seed: another sample order" \
	[ "$(lines ref | grep phase=train | field ids)" != "$(lines seed2 | grep phase=train | field ids)" ]

# --- --tsshim without the shim --------------------------------------------------------
# tsshim_batch is a weak reference: NULL here, so every batch stays the
# job's own and only the record gains fields.
if command -v nm >/dev/null; then
	check "tsshim_batch is a dynamic weak reference" cond 'nm -D "$TRAIN" | grep -qE "^ +w tsshim_batch$"'
fi
train ts --tsshim --readback --workers 2 --pin "${COMMON[@]}"
check "--tsshim without the shim: same trained_checksum" cond '[ "$RC" = 0 ] && [ "$(checksum ts)" = "$(checksum ref)" ]'
check "--tsshim: share=own on every batch line (train and val)" \
	cond '[ "$(lines ts | wc -l)" = 44 ] && [ "$(lines ts | grep -vc " share=own sh=")" = 0 ]'
sh_ok() { # every line: sh= holds n hashes of 16 hex digits; dsh= equals it
	lines ts | awk '{ n = sh = dsh = ""
		for (i = 1; i <= NF; i++) {
			if ($i ~ /^n=/) n = substr($i, 3)
			if ($i ~ /^sh=/) sh = substr($i, 4)
			if ($i ~ /^dsh=/) dsh = substr($i, 5)
		}
		k = split(sh, h, ",")
		for (j = 1; j <= k; j++) if (length(h[j]) != 16 || h[j] ~ /[^0-9a-f]/) bad++
		if (k != n || dsh != sh) bad++ }
		END { exit bad > 0 }'
}
check "--tsshim: sh= has n per-sample hashes; with --readback dsh= equals sh=" sh_ok
train rb --readback --workers 2 --pin "${COMMON[@]}"
check "--tsshim: the other fields are unchanged" \
	[ "$(lines ts | sed 's/ share=.*//')" = "$(lines rb)" ]
check "--tsshim: the header names the loader (train.<fingerprint>.<size>)" \
	grep -qE '^# tsshim_loader=train\.[0-9a-f]{16}\.32$' "$T_TMP/ts.rec"

# --- --tsshim with a stand-in for the shim ---------------------------------------------
# A preloaded tsshim_batch that publishes the job's even calls and serves
# the odd ones (zeroed images, label 7): served bytes must be what is
# uploaded, checksummed and recorded, whatever buffers the batch is in
# (worker shared memory, the pinned copy, --workers 0 memory).
FAKE=$T_TMP/libfakebatch.so
cat >"$T_TMP/fakebatch.c" <<'CEOF'
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tsshim.h"
static uint64_t calls;
int tsshim_batch(const char *loader, unsigned npos, void *const *data, const size_t *bytes, size_t n,
		 const int64_t *ids, uint64_t nindex, unsigned flags, struct tsshim_where *where)
{
	FILE *f = fopen(getenv("FAKE_LOG"), "a");
	fprintf(f, "%s npos=%u n=%zu nindex=%" PRIu64 " flags=%u ids=", loader, npos, n, nindex, flags);
	for (size_t i = 0; i < n; i++)
		fprintf(f, i ? ",%" PRId64 : "%" PRId64, ids[i]);
	fprintf(f, " bytes=%zu,%zu\n", bytes[0], bytes[1]);
	fclose(f);
	where->seq = calls;
	where->sample = 0;
	if (calls++ % 2 == 0)
		return TSSHIM_BATCH_PUBLISHED;
	memset(data[0], 0, bytes[0]);
	for (size_t i = 0; i < n; i++)
		((int64_t *)data[1])[i] = 7;
	return TSSHIM_BATCH_SERVED;
}
CEOF
if ${CC:-cc} -shared -fPIC -Iinclude -o "$FAKE" "$T_TMP/fakebatch.c" 2>"$T_TMP/fake.err"; then
	for v in "--workers 2" "--workers 2 --pin" "--workers 0"; do
		name=fake${v// /}
		rm -f "$T_TMP/$name.log"
		# shellcheck disable=SC2086
		FAKE_LOG=$T_TMP/$name.log LD_PRELOAD=$FAKE train "$name" --tsshim --readback $v "${COMMON[@]}"
		# even job batches published as they are, odd ones served: zeros, labels 7
		fake_ok() {
			lines "$name" | grep phase=train | awk -v r="$T_TMP/ts.rec" '
				BEGIN { while ((getline l < r) > 0) if (l ~ /phase=train/) { split(l, a, " "); img[a[1]] = a[9] } }
				{ k = substr($1, 5); t++
				  if (t % 2 == 1 && !($0 ~ / share=pub fseq=[0-9]+ fsamp=0 sh=/ && $9 == img[$1])) bad++
				  if (t % 2 == 0 && !($0 ~ / share=served fseq=[0-9]+ fsamp=0 sh=/ && $8 ~ /^labels=7(,7)*$/)) bad++ }
				END { exit !(t == 20 && !bad) }'
		}
		check "fake shim, $v: pub lines keep the job's batch, served lines record the served bytes" fake_ok
		check "fake shim, $v: validation stays own, dsh= equals sh=, another trained_checksum" \
			cond '[ "$(lines "$name" | grep phase=val | grep -vc " share=own ")" = 0 ] &&
				[ "$(lines "$name" | sed -n "s/.* sh=\([^ ]*\) dsh=\([^ ]*\)\$/\1 \2/p" | awk "\$1 != \$2" | wc -l)" = 0 ] &&
				[ "$(lines "$name" | grep -c " dsh=")" = 44 ] &&
				[ -n "$(checksum "$name")" ] && [ "$(checksum "$name")" != "$(checksum ref)" ]'
	done
	loader=$(sed -n 's/^# tsshim_loader=//p' "$T_TMP/ts.rec")
	calls_ok() { # one call per training batch: the loader, ids, sizes and flags as documented
		[ "$(wc -l <"$T_TMP/fake--workers2--pin.log")" = 20 ] &&
			[ "$(cut -d' ' -f1-4 "$T_TMP/fake--workers2--pin.log" | sort -u)" = "$loader npos=2 n=3 nindex=$N
$loader npos=2 n=5 nindex=$N" ] &&
			[ "$(sed 's/.* flags=\([0-9]*\) ids=\([^ ]*\) .*/\2 \1/' "$T_TMP/fake--workers2--pin.log")" = \
				"$(lines ts | grep phase=train | awk '{ f = ($5 == "iter=0") + 2 * ($5 == "iter=9"); print substr($7, 5), f }')" ]
	}
	check "fake shim: tsshim_batch gets the loader, 2 positions, the batch's ids, nindex and FIRST/LAST" calls_ok
else
	echo "# skipped: --tsshim with a stand-in shim (no C compiler: $(head -1 "$T_TMP/fake.err"))"
fi

# --- batching and sampling ---------------------------------------------------------
ok_epochs=1
for e in 0 1; do
	ns=$(lines ref | grep "phase=train epoch=$e " | field n | tr '\n' ' ')
	[ "$ns" = "5 5 5 5 5 5 5 5 5 3 " ] || { ok_epochs=0; echo "# epoch $e batch sizes: $ns"; }
	ids=$(lines ref | grep "phase=train epoch=$e " | field ids | tr ',' '\n' | sort -n | tr '\n' ' ')
	[ "$ids" = "$(seq 0 $((N - 1)) | tr '\n' ' ')" ] || { ok_epochs=0; echo "# epoch $e ids are not a permutation"; }
done
check "ceil($N/5)=10 batches per epoch, last one of 3, every sample once" [ "$ok_epochs" = 1 ]
check "epochs are shuffled differently" \
	[ "$(lines ref | grep 'phase=train epoch=0 ' | field ids)" != "$(lines ref | grep 'phase=train epoch=1 ' | field ids)" ]
check "seq counts every batch of the job from 0" \
	[ "$(lines ref | field seq | tr '\n' ' ')" = "$(seq 0 $(($(lines ref | wc -l) - 1)) | tr '\n' ' ')" ]

train seq --workers 2 --shuffle 0 --size 32 --batch 7 --epochs 2 "$D/train"
want=$(seq 0 $((N - 1)) | tr '\n' ',')
in_order() {
	[ "$(lines seq | grep 'epoch=0 ' | field ids | tr '\n' ',')" = "$want" ] &&
		[ "$(lines seq | grep 'epoch=1 ' | field ids | tr '\n' ',')" = "$want" ]
}
check "--shuffle 0: sample ids in dataset order, every epoch" in_order
check "--batch 7: 7 batches per epoch, the last of 6" \
	[ "$(lines seq | grep 'epoch=0 ' | field n | tr '\n' ' ')" = "7 7 7 7 7 7 6 " ]

train lim --workers 2 --limit 17 --size 32 --batch 5 "$D/train"
limited() {
	[ "$(lines lim | field n | tr '\n' ' ')" = "5 5 5 2 " ] &&
		[ "$(lines lim | field ids | tr ',' '\n' | sort -n | tr '\n' ' ')" = "$(seq 0 16 | tr '\n' ' ')" ]
}
check "--limit 17: batches of 5 5 5 2 over ids 0..16" limited

# --break-after: K batches per epoch, same with workers (non-persistent and persistent) as without
train brk0 --workers 0 --break-after 3 --size 32 --batch 5 --epochs 3 --seed 11 "$D/train"
broke_off() {
	[ "$(lines brk0 | field epoch | tr '\n' ' ')" = "0 0 0 1 1 1 2 2 2 " ] && grep -q 'batches=9 samples=45 ' "$T_TMP/brk0.out"
}
check "--break-after 3: 3 batches in each of 3 epochs" broke_off
train brk1 --workers 3 --break-after 3 --size 32 --batch 5 --epochs 3 --seed 11 "$D/train"
train brk2 --workers 3 --persistent-workers --pin --break-after 3 --size 32 --batch 5 --epochs 3 --seed 11 "$D/train"
check "--break-after with workers (restarted or persistent): same records" \
	cond 'cmp -s "$T_TMP/brk0.rec" "$T_TMP/brk1.rec" && cmp -s "$T_TMP/brk0.rec" "$T_TMP/brk2.rec"'
check "--break-after: each epoch starts the sampler's permutation of its epoch" \
	[ "$(lines brk0 | grep 'epoch=1 ' | head -1 | field ids)" = "$(lines ref | grep 'phase=train epoch=1 ' | head -1 | field ids)" ]

# --- validation ------------------------------------------------------------------------
# 2 epochs x 10 batches, --val-every 4: after job batches 4, 8, 12, 16 and
# at both epoch ends (batch 20 is an epoch's last: no extra pass) = 6 passes.
val_passes() {
	[ "$(lines ref | grep phase=val | field pass | uniq | tr '\n' ' ')" = "0 1 2 3 4 5 " ] &&
		[ "$(lines ref | grep 'phase=val' | field n | tr '\n' ' ')" = "$(for p in 1 2 3 4 5 6; do printf '5 5 5 1 '; done)" ]
}
check "--val-every 4: 6 validation passes of 4 batches (5 5 5 1)" val_passes
check "validation runs after job batches 4, 8, 12, 16 and each epoch end" \
	[ "$(lines ref | awk '/phase=train/ {t++} /phase=val/ && /iter=0 / {printf "%d ", t}')" = "4 8 10 12 16 20 " ]
check "validation is never shuffled" \
	[ "$(lines ref | grep 'phase=val' | grep ' pass=3 ' | field ids | tr '\n' ',')" = "$(seq 0 $((NVAL - 1)) | tr '\n' ',')" ]
check "every validation pass uploads the same bytes" \
	[ "$(lines ref | grep phase=val | awk '{print $5, $9, $10}' | sort -u | wc -l)" = 4 ]
train noval --workers 2 --size 32 --batch 5 --epochs 2 --seed 11 "$D/train"
check "validation does not change the trained_checksum" [ "$(checksum noval)" = "$(checksum ref)" ]
check "nor the training batches" \
	[ "$(lines noval | cut -d' ' -f2- )" = "$(lines ref | grep phase=train | cut -d' ' -f2-)" ]

# --- labels -----------------------------------------------------------------------------
# id -> class index, from the directory listing (ImageFolder order)
mkmap() {
	local dir=$1 c=0 id=0 cls
	while IFS= read -r cls; do
		[ -d "$dir/$cls" ] || continue
		while IFS= read -r _; do
			echo "$id $c"; id=$((id + 1))
		done < <(find -L "$dir/$cls" -maxdepth 1 -type f \( -iname '*.jpg' -o -iname '*.jpeg' \) -printf '%f\n' | LC_ALL=C sort)
		c=$((c + 1))
	done < <(ls -1 "$dir" | LC_ALL=C sort)
}
mkmap "$D/train" >"$T_TMP/train.map"
mkmap "$D/val" >"$T_TMP/val.map"
labels_ok() { # map phase rec -> "checked bad"
	awk -v ph="phase=$2" 'NR == FNR { lab[$1] = $2; next }
		/^#/ || $2 != ph { next }
		{ ids = $7; ls = $8; sub(/^ids=/, "", ids); sub(/^labels=/, "", ls)
		  n = split(ids, a, ","); split(ls, b, ",")
		  for (i = 1; i <= n; i++) { checked++; if (!(a[i] in lab) || lab[a[i]] != b[i]) bad++ } }
		END { print checked + 0, bad + 0 }' "$1" "$3"
}
check "training labels are the class directory of each sample id ($(labels_ok "$T_TMP/train.map" train "$T_TMP/ref.rec"))" \
	[ "$(labels_ok "$T_TMP/train.map" train "$T_TMP/ref.rec")" = "96 0" ]
check "validation labels too ($(labels_ok "$T_TMP/val.map" val "$T_TMP/ref.rec"))" \
	[ "$(labels_ok "$T_TMP/val.map" val "$T_TMP/ref.rec")" = "96 0" ]

# --- an independent re-implementation ------------------------------------------------------
# torchvision (ImageFolder, resized_crop, hflip, to_tensor, Normalize,
# Resize + CenterCrop, DataLoader) plus the sampler, generators and XXH64
# as documented in tools/train_hash.h and tools/train_image.h: every
# training batch, the first validation pass and the trained_checksum of the
# reference run must come out byte for byte.
PY=
for p in /usr/bin/python3 python3; do
	"$p" -c 'import torchvision' 2>/dev/null && { PY=$p; break; }
done
if [ -n "$PY" ]; then
	cat >"$T_TMP/recompute.py" <<'PYEOF'
# argv: record train_root val_root size batch seed epochs
import math, struct, sys
import torch, torchvision.transforms as T, torchvision.transforms.functional as F
from torchvision.datasets import ImageFolder

M = (1 << 64) - 1
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                      0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)
def rotl(x, r): return ((x << r) | (x >> (64 - r))) & M
def rnd(a, v): return (rotl((a + v * P2) & M, 31) * P1) & M
def xxh64(b, seed=0):
    n, p = len(b), 0
    if n >= 32:
        v = [(seed + P1 + P2) & M, (seed + P2) & M, seed, (seed - P1) & M]
        w = struct.unpack_from('<%dQ' % (n // 32 * 4), b)
        for i in range(0, len(w), 4):
            v = [rnd(v[0], w[i]), rnd(v[1], w[i + 1]), rnd(v[2], w[i + 2]), rnd(v[3], w[i + 3])]
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M
        for x in v:
            h = ((h ^ rnd(0, x)) * P1 + P4) & M
        p = n // 32 * 32
    else:
        h = (seed + P5) & M
    h = (h + n) & M
    while p + 8 <= n:
        h = (rotl(h ^ rnd(0, struct.unpack_from('<Q', b, p)[0]), 27) * P1 + P4) & M; p += 8
    if p + 4 <= n:
        h = (rotl(h ^ (struct.unpack_from('<I', b, p)[0] * P1 & M), 23) * P2 + P3) & M; p += 4
    while p < n:
        h = (rotl(h ^ (b[p] * P5 & M), 11) * P1) & M; p += 1
    h ^= h >> 33; h = h * P2 & M; h ^= h >> 29; h = h * P3 & M; h ^= h >> 32
    return h

def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    return z ^ (z >> 31)
class SM:
    def __init__(s, state): s.s = state & M
    def next(s): s.s = (s.s + 0x9E3779B97F4A7C15) & M; return mix64(s.s)
    def unit(s): return (s.next() >> 11) * 2.0 ** -53

def permutation(n, seed, epoch):
    a, g = list(range(n)), SM(seed + epoch)
    for i in range(n - 1, 0, -1):
        j = g.next() % (i + 1); a[i], a[j] = a[j], a[i]
    return a

norm = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
def train_sample(img, S, seed, epoch, idx):
    g = SM(mix64(mix64(mix64(seed) ^ epoch) ^ idx))
    W, H = img.size; area = float(W * H); lr0, lr1 = math.log(3.0 / 4.0), math.log(4.0 / 3.0)
    for _ in range(10):
        target = area * (0.08 + (1.0 - 0.08) * g.unit())
        aspect = math.exp(lr0 + (lr1 - lr0) * g.unit())
        w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < w <= W and 0 < h <= H:
            t = g.next() % (H - h + 1); l = g.next() % (W - w + 1); break
    else:
        r = W / H
        if r < 3.0 / 4.0: w = W; h = int(round(w / (3.0 / 4.0)))
        elif r > 4.0 / 3.0: h = H; w = int(round(h * (4.0 / 3.0)))
        else: w, h = W, H
        t, l = (H - h) // 2, (W - w) // 2
    flip = g.unit() < 0.5
    im = F.resized_crop(img, t, l, h, w, [S, S])
    if flip: im = F.hflip(im)
    return norm(F.to_tensor(im))

rec, troot, vroot, S, B, seed, epochs = sys.argv[1], sys.argv[2], sys.argv[3], *map(int, sys.argv[4:8])
lines = [dict(kv.split('=', 1) for kv in l.split()) for l in open(rec) if not l.startswith('#')]
tds, vds = ImageFolder(troot), ImageFolder(vroot, T.Compose([T.Resize(S * 256 // 224), T.CenterCrop(S), T.ToTensor(), norm]))
bad, trained, nb = 0, bytearray(), 0
def check(l, x, y, what):
    global bad
    xi, yi = xxh64(x.numpy().tobytes()), xxh64(y.numpy().astype('<i8').tobytes())
    if '%016x' % xi != l['img'] or '%016x' % yi != l['lbl']:
        bad += 1; print('# %s seq=%s differs' % (what, l['seq']))
for e in range(epochs):
    order = permutation(len(tds), seed, e)
    tl = [l for l in lines if l['phase'] == 'train' and l['epoch'] == str(e)]
    for k, l in enumerate(tl):
        ids = order[k * B:(k + 1) * B]
        if l['ids'] != ','.join(map(str, ids)): bad += 1; print('# ids differ at seq', l['seq'])
        x = torch.stack([train_sample(tds.loader(tds.samples[i][0]), S, seed, e, i) for i in ids])
        y = torch.tensor([tds.samples[i][1] for i in ids], dtype=torch.int64)
        check(l, x, y, 'train'); trained += x.numpy().tobytes() + y.numpy().astype('<i8').tobytes(); nb += 1
vl = [l for l in lines if l['phase'] == 'val' and l['pass'] == '0']
for l, (x, y) in zip(vl, torch.utils.data.DataLoader(vds, batch_size=B, shuffle=False)):
    check(l, x, y, 'val'); nb += 1
end = [l for l in open(rec) if l.startswith('# end ')][0]
if 'trained_checksum=%016x' % xxh64(bytes(trained)) not in end: bad += 1; print('# trained_checksum differs')
print('%d batches recomputed, %d differ' % (nb, bad))
PYEOF
	out=$("$PY" "$T_TMP/recompute.py" "$T_TMP/ref.rec" "$D/train" "$D/val" 32 5 11 2 2>&1)
	check "torchvision + the documented generators reproduce every batch and trained_checksum ($(echo "$out" | tail -n 1))" \
		[ "$(echo "$out" | tail -n 1)" = "24 batches recomputed, 0 differ" ] || echo "$out" | tail -n 5 | sed 's/^/#   /'
else
	echo "# skipped: recomputing batches with torchvision (no python3 with torchvision)"
fi

# --- failures ---------------------------------------------------------------------------
alive_children() { local k n=0; for k in "$@"; do kill -0 "$k" 2>/dev/null && n=$((n + 1)); done; echo $n; }

# kill_worker NAME ARGS...: SIGKILL one worker mid-run; the job must end
# non-zero within 5 s, name the worker and leave no process behind.
kill_worker() {
	local name=$1; shift
	"$TRAIN" --record "$T_TMP/$name.rec" "$@" >"$T_TMP/$name.out" 2>"$T_TMP/$name.err" &
	local p=$! kids victim t0 i rc
	T_PIDS+=("$p")
	wait_for "$T_TMP/$name.rec" '^seq=3 ' 20 || { not_ok "$name: the job did not start"; return; }
	kids=$(pgrep -P "$p" | tr '\n' ' ')
	victim=$(echo "$kids" | awk '{print $2}')
	t0=$(date +%s%N)
	kill -KILL "$victim"
	for ((i = 0; i < 100; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
	wait "$p"; rc=$?
	local ms=$((($(date +%s%N) - t0) / 1000000))
	if [ "$rc" != 0 ] && [ "$ms" -lt 5000 ] &&
		grep -qE "worker [0-9]+ \(pid $victim\) was killed by signal 9" "$T_TMP/$name.err" &&
		[ "$(alive_children $kids)" = 0 ]; then
		ok "$name: worker killed with SIGKILL: exit $rc after ${ms} ms, named, no process left"
	else
		not_ok "$name: worker $victim killed: exit $rc after ${ms} ms, $(alive_children $kids) left; stderr:"
		sed 's/^/#   /' "$T_TMP/$name.err"
	fi
}
LONG=(--size 32 --batch 2 --epochs 100 --step-ms 5 "$D/train")
kill_worker kill-fork --workers 3 "${LONG[@]}"
kill_worker kill-spawn --workers 3 --start spawn --persistent-workers --pin "${LONG[@]}"

"$TRAIN" --workers 2 --timeout 1 --record "$T_TMP/stop.rec" "${LONG[@]}" >/dev/null 2>"$T_TMP/stop.err" &
p=$!; T_PIDS+=("$p")
wait_for "$T_TMP/stop.rec" '^seq=1 ' 20
kids=$(pgrep -P "$p" | tr '\n' ' ')
kill -STOP $kids 2>/dev/null
wait "$p"; rc=$?
kill -KILL $kids 2>/dev/null
check "--timeout 1 with stopped workers: exit 1, 'timed out'" cond '[ "$rc" = 1 ] && grep -q "timed out after 1 s" "$T_TMP/stop.err"'

"$TRAIN" --workers 2 --record "$T_TMP/int.rec" "${LONG[@]}" >/dev/null 2>"$T_TMP/int.err" &
p=$!; T_PIDS+=("$p")
wait_for "$T_TMP/int.rec" '^seq=2 ' 20
kids=$(pgrep -P "$p" | tr '\n' ' ')
kill -INT "$p"
wait "$p"; rc=$?
check "SIGINT: exit 130, 'interrupted', workers gone" \
	cond '[ "$rc" = 130 ] && grep -q interrupted "$T_TMP/int.err" && [ "$(alive_children $kids)" = 0 ]'

# a truncated and a non-JPEG file: the job stops with their names
B=$T_TMP/bad
mkdir -p "$B" && cp -r "$D/train" "$B/"
victim=$(ls "$B/train/c001" | LC_ALL=C sort | sed -n 3p)
head -c 3000 "$B/train/c001/$victim" >"$B/t" && mv "$B/t" "$B/train/c001/$victim"
for w in 0 2; do
	"$TRAIN" --workers $w --size 32 --shuffle 0 "$B/train" >/dev/null 2>"$T_TMP/bad$w.err"; rc=$?
	check "truncated JPEG, --workers $w: exit 1 naming the file" \
		cond '[ "$rc" = 1 ] && grep -q "$B/train/c001/$victim: corrupt or unsupported JPEG: Premature end" "$T_TMP/bad$w.err"'
done
echo "not a jpeg" >"$B/train/c000/00000.jpg"
"$TRAIN" --workers 2 --start spawn --size 32 --shuffle 0 "$B/train" >/dev/null 2>"$T_TMP/bad.err"; rc=$?
check "not a JPEG at all, spawned workers: exit 1 naming the file" \
	cond '[ "$rc" = 1 ] && grep -q "$B/train/c000/00000.jpg: corrupt or unsupported JPEG: Not a JPEG file" "$T_TMP/bad.err"'
"$TRAIN" --size 32 "$T_TMP/nonexistent" >/dev/null 2>"$T_TMP/nodir.err"; rc=$?
check "missing dataset: exit 1 naming it" \
	cond '[ "$rc" = 1 ] && grep -q "$T_TMP/nonexistent: cannot open directory: No such file" "$T_TMP/nodir.err"'

"$TRAIN" --device cuda --cudart "$T_TMP/no/libcudart.so.13" --size 32 "$D/train" >/dev/null 2>"$T_TMP/cuda.err"; rc=$?
check "--device cuda without a CUDA runtime: exit 1, 'no CUDA runtime found'" \
	cond '[ "$rc" = 1 ] && grep -q "no CUDA runtime found" "$T_TMP/cuda.err"'

# --- memcheck ------------------------------------------------------------------------------
if command -v valgrind >/dev/null && ! ldd "$TRAIN" | grep -q libasan; then
	valgrind -q --error-exitcode=9 --leak-check=full --show-leak-kinds=all --errors-for-leak-kinds=all \
		"$TRAIN" --workers 0 --pin --limit 12 --size 32 --batch 5 --epochs 2 --val "$D/val" --val-limit 6 \
		--record "$T_TMP/vg.rec" "$D/train" >"$T_TMP/vg.out" 2>"$T_TMP/vg.err"
	rc=$?
	check "--workers 0 under valgrind: no error, nothing left allocated" [ "$rc" = 0 ] || sed 's/^/#   /' "$T_TMP/vg.err" | head -20
fi

finish train
