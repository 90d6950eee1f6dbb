#!/usr/bin/env bash
# A consumer's upload that the GPU ring serves answers what CUDA answers
# without the shim, where that is not success (issue 5, item 2: everything
# else passes through untouched). ts-servedge runs each case on a batch the
# shim says it serves; without the shim, on any batch; the two transcripts
# (every CUDA answer, the runtime's last error, what the device holds) must
# be the same:
#  - a synchronous upload while a capture bars the thread (another thread's
#    in global mode, or its own): CUDA refuses it and invalidates the
#    capture; served, it succeeded and the capture went on to make a graph;
#  - an upload one sample past the end of its allocation, served from two
#    ring pieces: CUDA refuses it and writes nothing; served, the first
#    piece was written before the second was refused;
#  - a consumer on device 0 served from device 1 that had enabled peer
#    access and then reset its device: its enable after a served upload was
#    answered "already enabled" (a note of its enable outlived the reset).
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh

EDGE=$PWD/$BUILD/tests/ts-servedge
EMU=$PWD/$BUILD/emu
for f in "$EDGE" "$EMU/libcudart.so.13" "$BUILD/libtsshim.so"; do
	[ -e "$f" ] || { echo "skip: $f not built"; exit 77; }
done
[ -w /dev/shm ] || { echo "skip: /dev/shm not writable"; exit 77; }
export LD_LIBRARY_PATH=$EMU TSEMU_DEVICES=2
unset TSSHIM_MODE TSSHIM_LOG TSSHIM_SESSION

# edge NAME PRODUCER_DEVICE CASES [ENV=VALUE...]: the consumer alone without
# the shim ($T_TMP/NAME.plain), then beside a producer under the shim
# ($T_TMP/NAME.shim; its stderr in NAME.err)
edge() {
	local name=$1 dev=$2 cases=$3 sess
	shift 3
	sess=$(session_name "edge-$name")
	env "$@" timeout 60 "$EDGE" cons 40 "$cases" >"$T_TMP/$name.plain" 2>"$T_TMP/$name.plainerr"
	PLAIN_RC=$?
	env LD_PRELOAD="$TS_PRELOAD" TSSHIM_SESSION="$sess" TS_DEVICE="$dev" \
		timeout 60 "$EDGE" prod 40 >"$T_TMP/$name.prod" 2>&1 &
	local prod=$!
	T_PIDS+=("$prod")
	sleep 0.05
	env "$@" LD_PRELOAD="$TS_PRELOAD" TSSHIM_SESSION="$sess" TSSHIM_LOG=info \
		timeout 60 "$EDGE" cons 40 "$cases" >"$T_TMP/$name.shim" 2>"$T_TMP/$name.err"
	SHIM_RC=$?
	wait "$prod"
	PROD_RC=$?
}
served() { sed -n 's/.*cases=\([0-9]*\) served=\([0-9]*\).*/\1 \2/p' "$T_TMP/$1.err"; }
same() { # NAME: the transcripts are equal; else show them side by side
	cmp -s "$T_TMP/$1.plain" "$T_TMP/$1.shim" && return 0
	diff "$T_TMP/$1.plain" "$T_TMP/$1.shim" | sed 's/^/#   /'
	return 1
}

# one device; the consumer's 6 samples a batch are cut from two of the
# producer's batches of 4, so an upload is served in two pieces
edge one 0 normal,capture-other,capture-own,overflow TS_SAMPLES=6
check "one device: both jobs ran (rc $PLAIN_RC $SHIM_RC $PROD_RC), and every case ran on a served upload ($(served one))" \
	cond '[ $PLAIN_RC = 0 ] && [ $SHIM_RC = 0 ] && [ $PROD_RC = 0 ] && [ "$(served one)" = "4 4" ]' ||
	sed 's/^/#   /' "$T_TMP/one.err"
check "... premise: without the shim, CUDA refuses the barred uploads (900) and the one past the end (1), writing nothing" \
	cond '[ $(grep -c "upload: 900 (last error 900)" "$T_TMP/one.plain") = 2 ] &&
	      grep -q "upload past the end: 1 (last error 1)" "$T_TMP/one.plain" &&
	      grep -q "bytes written: 0$" "$T_TMP/one.plain"'
check "served uploads answer as CUDA does: the captures' bar, their invalidation, nothing written past a refusal" same one

# the producer on device 1: the consumer's uploads are peer copies
edge peer 1 normal,peer TS_PEER_RESET=1
check "two devices: both jobs ran (rc $PLAIN_RC $SHIM_RC $PROD_RC), and both cases on served uploads ($(served peer))" \
	cond '[ $PLAIN_RC = 0 ] && [ $SHIM_RC = 0 ] && [ $PROD_RC = 0 ] && [ "$(served peer)" = "2 2" ]' ||
	sed 's/^/#   /' "$T_TMP/peer.err"
check "peer access enabled, the device reset, then served from the peer: the program's enable and disable answer as CUDA's" \
	same peer

finish serve_edge
