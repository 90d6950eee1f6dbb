#!/usr/bin/env bash
# tsshim-verify on hand-made records of one session (a producer and two
# consumers at other batch sizes): the good set passes; each kind of
# violation (a served sample that is not the stream's, an unpaired label, a
# device copy that differs, a sample trained twice, a shared validation
# batch, a record without share=, a stream batch published twice with other
# samples) fails naming it; unverifiable positions fail only with --strict;
# garbage input is reported, never a crash.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh

VERIFY=$PWD/$BUILD/tsshim-verify
TRAIN=$PWD/$BUILD/tsshim-train
MKDATA=$PWD/$BUILD/tsshim-mkdata
[ -x "$VERIFY" ] || { echo "not ok - $VERIFY not built"; exit 1; }

# The stream: the producer publishes batches of 4; sample k of stream batch
# f has the made-up hash h(f, k).
h() { printf '%08x%08x' $(($1 + 1)) $(($2 + 0xabc)); }
# stream F K COUNT: the hashes of COUNT samples from (F, K) on.
stream() {
	local p=$(($1 * 4 + $2)) i out=
	for ((i = 0; i < $3; i++)); do out="$out${out:+,}$(h $(((p + i) / 4)) $(((p + i) % 4)))"; done
	echo "$out"
}
# bline SEQ PHASE SHARE FSEQ FSAMP SH [EXTRA]: one batch line
bline() {
	local n ids
	n=$(($(echo "$6" | tr -cd , | wc -c) + 1))
	ids=$(seq -s, 0 $((n - 1)))
	echo "seq=$1 phase=$2 epoch=0 pass=0 iter=$1 n=$n ids=$ids labels=$ids img=0123456789abcdef" \
		"lbl=fedcba9876543210 share=$3${4:+ fseq=$4 fsamp=$5} sh=$6${7:+ $7}"
}
HDR='# tsshim-train record v1'
VAL=$(stream 9 0 2 | tr 0 7) # a validation batch's own samples

G=$T_TMP/good
mkdir -p "$G"
{
	echo "$HDR"
	bline 0 train pub 0 0 "$(stream 0 0 4)"
	bline 1 train pub 1 0 "$(stream 1 0 4)"
	bline 2 train pub 2 0 "$(stream 2 0 4)"
	bline 3 val own "" "" "$VAL"
} >"$G/producer.rec"
{ # batch 3: the second and third lines span two stream batches
	echo "$HDR"
	bline 0 train served 0 0 "$(stream 0 0 3)" "dsh=$(stream 0 0 3)"
	bline 1 train served 0 3 "$(stream 0 3 3)" "dsh=$(stream 0 3 3)"
	bline 2 train served 1 2 "$(stream 1 2 3)" "dsh=$(stream 1 2 3)"
	bline 3 val own "" "" "$VAL" "dsh=$VAL"
} >"$G/c3.rec"
{ # batch 6, the last batch of its epoch its own (the producer had stopped)
	echo "$HDR"
	bline 0 train served 0 0 "$(stream 0 0 6)"
	bline 1 train served 1 2 "$(stream 1 2 6)"
	bline 2 train own "" "" "$(stream 5 0 2 | tr 0 5)"
} >"$G/c6.rec"
GOOD=("$G/producer.rec" "$G/c3.rec" "$G/c6.rec")

# verify NAME ARGS...: run into $T_TMP/NAME.out; sets RC.
verify() {
	local name=$1; shift
	"$VERIFY" "$@" >"$T_TMP/$name.out" 2>&1
	RC=$?
}
says() { grep -q -- "$2" "$T_TMP/$1.out"; }
show() { sed 's/^/#   /' "$T_TMP/$1.out" | head -8; }

# --- usage ------------------------------------------------------------------------------
verify help --help
check "--help exits 0 and explains the checks" cond '[ $RC = 0 ] && says help "Usage: tsshim-verify" && says help "--strict"'
verify noargs
check "no RECORD: exit 2" cond '[ $RC = 2 ] && says noargs "no RECORD"'
verify missing "$G/producer.rec" "$T_TMP/no-such.rec"
check "a missing file: exit 2 naming it" cond '[ $RC = 2 ] && says missing "no-such.rec: No such file"'
verify badopt --frobnicate "$G/producer.rec"
check "unknown option: exit 2" [ $RC = 2 ]

# --- the good set ---------------------------------------------------------------------------
verify good "${GOOD[@]}"
check "good set: exit 0" [ $RC = 0 ] || show good
check "good set: summary counts (3 pub, 5 served spanning stream batches, 21 samples verified)" \
	says good 'files=3 lines=11 pub=3 served=5 own=3 samples_verified=21 unverifiable=0 problems=0: OK'
verify quiet --quiet "${GOOD[@]}"
check "--quiet: nothing on stdout when all holds" cond '[ $RC = 0 ] && [ ! -s "$T_TMP/quiet.out" ]'

# bad NAME PATTERN FILE SED: the good set with FILE edited by SED must exit
# 1 with PATTERN in the report.
bad() {
	local name=$1 pat=$2 file=$3 expr=$4 d=$T_TMP/$1
	mkdir -p "$d"
	cp "${GOOD[@]}" "$d/"
	sed -i -e "$expr" "$d/$file"
	verify "$name" "$d/producer.rec" "$d/c3.rec" "$d/c6.rec"
	if [ $RC = 1 ] && says "$name" "$pat" && says "$name" "problems=[1-9].*FAILED"; then
		ok "$name: exit 1, '$pat'"
	else
		not_ok "$name: exit $RC, expected 1 and '$pat'"; show "$name"
	fi
}
other=0badc0de0badc0de
bad wrong-sample "c3.rec:3: served sample 1 differs from the stream (image and label bytes): stream batch 1 sample 0 is $(h 1 0)" c3.rec \
	"3s/$(h 1 0)/$other/g"
# An image with another sample's label: its image+label hash is another one.
bad unpaired-label "c6.rec:3: served sample 5 differs from the stream (image and label bytes)" c6.rec \
	"3s/,$(h 2 3)\$/,$(h 2 3 | tr 0-9 1-90)/"
bad device-copy "c3.rec:4: device bytes differ from the host bytes" c3.rec "4s/dsh=\([0-9a-f]*\),/dsh=\1,$other,/;4s/,[0-9a-f]*\$//"
bad repeated "c3.rec:6: repeated sample: stream batch 0 sample 1 already trained on at line 2" c3.rec \
	"\$a $(bline 4 train served 0 1 "$(stream 0 1 2)")"
bad pub-repeated "producer.rec:.*repeated sample" producer.rec "\$a $(bline 4 train pub 1 0 "$(stream 1 0 4)")"
bad served-val "c6.rec:5: validation batch with share=served" c6.rec "\$a $(bline 3 val served 2 0 "$(stream 2 0 4)")"
bad no-share "c6.rec:2: record lacks share= fields: run tsshim-train with --tsshim (3 batch lines)" c6.rec \
	's/ share=.*//'
bad stream-conflict "c6.rec:5: stream batch 2 published again with other samples (first at .*producer.rec:4" c6.rec \
	"\$a $(bline 3 train pub 2 0 "$(stream 2 0 3),$other")"
bad pub-fsamp "share=pub with fsamp=1" producer.rec "2s/fsamp=0/fsamp=1/"
bad beyond "fsamp=4 beyond stream batch 1" c6.rec "3s/fsamp=2/fsamp=4/"

# --- unverifiable ----------------------------------------------------------------------------
# The producer was killed before recording stream batch 3: served samples
# from it can be checked against nothing.
U=$T_TMP/unver
mkdir -p "$U"
cp "${GOOD[@]}" "$U/"
bline 3 train served 2 2 "$(stream 2 2 4)" >>"$U/c3.rec"
verify unver "$U/producer.rec" "$U/c3.rec" "$U/c6.rec"
check "unverifiable positions: exit 0, counted (2 verified, 2 unverifiable)" \
	cond '[ $RC = 0 ] && says unver "served=6 own=3 samples_verified=23 unverifiable=2 problems=0: OK"' || show unver
verify unver-strict --strict "$U/producer.rec" "$U/c3.rec" "$U/c6.rec"
check "--strict: unverifiable positions fail (exit 1)" \
	cond '[ $RC = 1 ] && says unver-strict "c3.rec:6: unverifiable: 2 served samples from stream batch 3 sample 0"' ||
	show unver-strict

# --- garbage -------------------------------------------------------------------------------
J=$T_TMP/junk
mkdir -p "$J"
# (a first line of text: random bytes begin with '\n' or '#', an empty line or
# a comment, about one run in 128, and line 1 was then not reported)
{ echo "random bytes follow"; head -c 200000 /dev/urandom; } >"$J/random.rec"
{
	head -c 3000000 /dev/zero | tr '\0' x; echo
	echo "seq=0 phase=train n=2 share=pub fseq=0 fsamp=0 sh=zz"
	echo "seq=0 phase=train n=99999999999999999999 share=own sh=0123456789abcdef"
	echo "seq=0 phase=train n=2 share=own sh=0123456789abcdef,0123456789abcde"
	echo "seq=0 phase=train n=1 share=served sh=0123456789abcdef"
	echo "seq=0 phase=train n=1 share=maybe sh=0123456789abcdef"
	echo "seq=0 phase=train n=1 share=own sh=0123456789abcdef dsh=0123456789abcdef,0123456789abcdef"
	echo "seq= phase= n= share= fseq= fsamp= sh= dsh="
	printf 'seq=0 phase=train n=1 share=own sh=0123456789abcdef\0garbage\n'
	printf 'seq=0 phase=train n=1 share=pub fseq=9999999999999999999 fsamp=0 sh=0123456789abcdef\n'
	printf 'seq=1 phase=train n=2 share=served fseq=9999999999999999999 fsamp=0 sh=0123456789abcdef,0123456789abcdef\n'
	printf 'no newline at the end'
} >"$J/fields.rec"
verify junk "$J/random.rec" "$J/fields.rec"
check "garbage records: exit 1 with a report, no crash" cond '[ $RC = 1 ] && says junk "random.rec:1: not a batch line"' || show junk
verify junk-all --max-problems 1000 "$J/fields.rec"
check "--max-problems: every malformed line listed with its line number" \
	cond '[ $(grep -c "fields.rec:[0-9]*: malformed batch line" "$T_TMP/junk-all.out") = 7 ] &&
		says junk-all "pub=1 served=1 own=1 samples_verified=1 unverifiable=1 problems=10:"' || show junk-all
verify junk-cap --max-problems 2 "$J/random.rec" "$J/fields.rec"
check "problems beyond --max-problems are counted, not listed" \
	cond '[ $(grep -c "rec:[0-9]*: " "$T_TMP/junk-cap.out") = 2 ] && says junk-cap "more problems"'

# --- real records of tsshim-train --tsshim (no shim here: all share=own) ---------------------
if [ -x "$TRAIN" ] && [ -x "$MKDATA" ] &&
	"$MKDATA" --classes 2 --train 5 --val 2 --seed 4 "$T_TMP/data" >/dev/null 2>&1; then
	"$TRAIN" --tsshim --readback --size 16 --batch 3 --val "$T_TMP/data/val" --record "$T_TMP/real.rec" \
		"$T_TMP/data/train" >/dev/null 2>&1
	verify real "$T_TMP/real.rec"
	check "a tsshim-train --tsshim record without the shim verifies (all own)" \
		cond '[ $RC = 0 ] && says real "lines=6 pub=0 served=0 own=6 .*problems=0: OK"' || show real
	"$TRAIN" --size 16 --batch 3 --record "$T_TMP/plain.rec" "$T_TMP/data/train" >/dev/null 2>&1
	verify plain "$T_TMP/plain.rec"
	check "a record written without --tsshim fails: lacks share=" \
		cond '[ $RC = 1 ] && says plain "record lacks share= fields"'
fi

finish verify
