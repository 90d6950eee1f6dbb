#!/usr/bin/env bash
# Views that outlive their feed, through the shim's feed API (what the
# PyTorch layer uses): a consumer's batch tensors are views of the feed's
# slot files; a feed closed while they live turns them into private memory,
# and the program lets go of each later, from whatever thread drops its last
# tensor. ts-viewrelease closes a consumer handle in one thread while a
# second releases its views, 50 rounds of 4 views: every release must unmap
# its view. Before, a release that came after the close was refused (the
# handle was gone) and its memory stayed mapped for good (200 of 200 here),
# and one racing the close could read the feed being freed.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh
VR="$PWD/$BUILD/tests/ts-viewrelease"
[ -x "$VR" ] || { echo "needs ts-viewrelease"; exit 77; }
out=$(TSSHIM_SESSION="$(session_name vr)" LD_PRELOAD="$TS_PRELOAD" timeout 60 "$VR" 50 2>"$T_TMP/vr.err")
rc=$?
check "views released while and after their feed closes: all unmapped, none refused ($out)" \
	cond "[ $rc = 0 ] && [ '$out' = 'rounds 50 views 200 left-mapped 0 bad-release 0' ]"
[ $rc = 0 ] || tail -n 5 "$T_TMP/vr.err" | sed 's/^/#   /'

# The dataset index of each sample a read brought (tsshim_feed_read_ids), by
# which the PyTorch layer gathers what its epoch lacks from the stream: a
# copy read that comes in two calls (the first timed out with one batch) has
# every id, and a view its own. Before, the second call reset the first
# batch's ids to -1 ("copy -1 -1 -1 -1 20 21 22 23").
RI="$PWD/$BUILD/tests/ts-readids"
out=$(TSSHIM_SESSION="$(session_name ri)" LD_PRELOAD="$TS_PRELOAD" timeout 60 "$RI" 2>"$T_TMP/ri.err")
rc=$?
check "a read's sample ids, also when it came in two calls ($out)" \
	cond "[ $rc = 0 ] && [ '$out' = 'copy 10 11 12 13 20 21 22 23 view 30 31 32 33' ]"
[ $rc = 0 ] || tail -n 5 "$T_TMP/ri.err" | sed 's/^/#   /'
finish views
