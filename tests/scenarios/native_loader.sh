#!/usr/bin/env bash
# A native program's loader, followed to its uploads (shim/native.c): a job
# that uploads the batches its workers pass it by descriptor, without
# tsshim_batch(), is told once that they go from the host, and nothing it
# trains on changes; a job that calls tsshim_batch(), loads in its main
# process, runs in exact mode or is a Python interpreter is not; uploads of
# other bytes, of zeroed objects or of files that are not shared memory are
# not taken for batches, and the look ends after TS_OBJSEEN_TRIES of them.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh

TRAIN=$PWD/$BUILD/tsshim-train
MKDATA=$PWD/$BUILD/tsshim-mkdata
FDUP=$PWD/$BUILD/tests/ts-fdupload
EMU=$PWD/$BUILD/emu
for f in "$TRAIN" "$MKDATA" "$FDUP" "$EMU/libcudart.so.13" "$BUILD/libtsshim.so"; do
	[ -e "$f" ] || { echo "skip: $f not built"; exit 77; }
done
[ -w /dev/shm ] || { echo "skip: /dev/shm not writable"; exit 77; }
export LD_LIBRARY_PATH=$EMU TSEMU_DEVICES=1
unset TSSHIM_MODE TSSHIM_LOG TSSHIM_SESSION

D=$T_TMP/data
if ! "$MKDATA" --classes 4 --train 12 --val 4 --seed 3 "$D" >"$T_TMP/mkdata.out" 2>&1; then
	cat "$T_TMP/mkdata.out"; echo "not ok - tsshim-mkdata failed"; exit 1
fi
SESS=$(session_name native)
NOTICE='uploads its loader workers. batches itself'

# train NAME [ENV=VALUE...] -- ARGS...: tsshim-train --device cuda under the
# shim (NAME "plain": without it); stdout, stderr in $T_TMP/NAME.*
train() {
	local name=$1 envs=(); shift
	while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
	shift
	[ "$name" = plain ] || envs=(LD_PRELOAD="$TS_PRELOAD" TSSHIM_SESSION="$SESS-$name" "${envs[@]}")
	env "${envs[@]}" timeout 60 "$TRAIN" --device cuda --size 16 --batch 8 --epochs 2 --seed 4 \
		--record "$T_TMP/$name.rec" "$@" "$D/train" >"$T_TMP/$name.out" 2>"$T_TMP/$name.err"
}
notices() { grep -c "$NOTICE" "$T_TMP/$1.err"; }
checksum() { sed -n 's/.*trained_checksum=\([0-9a-f]*\).*/\1/p' "$T_TMP/$1.out"; }

train plain -- --workers 2
check "without the shim: the job runs (rc $?)" [ -n "$(checksum plain)" ]
want=$(checksum plain)

# told once, whichever way the batch reaches the upload; trains as without the shim
for v in "fork posix pageable:--workers 2" "spawn memfd pinned:--workers 2 --start spawn --shm memfd --pin" \
	"persistent, pinned:--workers 3 --persistent-workers --pin"; do
	name=${v%%:*} args=${v#*:}
	n=${name//[ ,]/_}
	# shellcheck disable=SC2086 # args is a list of options
	train "$n" -- $args
	rc=$?
	check "$name: told once ($(notices "$n") lines)" [ "$(notices "$n")" = 1 ] || sed 's/^/#   /' "$T_TMP/$n.err"
	check "$name: trains what it trains without the shim (rc $rc)" \
		cond '[ $rc = 0 ] && [ "$(checksum "$n")" = "$want" ] && cmp -s "$T_TMP/plain.rec" "$T_TMP/$n.rec"'
done

# not told: it says what its batches are, has no workers, or exact mode
# (its validation batches, not handed to the shim, are uploaded from its workers' objects too)
train api -- --workers 2 --tsshim --val "$D/val"
check "tsshim_batch() called: not told, not for its validation batches either (rc $?)" [ "$(notices api)" = 0 ]
train w0 -- --workers 0
check "no workers, no objects passed: not told (rc $?)" [ "$(notices w0)" = 0 ]
train exact TSSHIM_MODE=exact -- --workers 2
check "exact mode (every job's own batches anyway): not told (rc $?)" [ "$(notices exact)" = 0 ]

# fdup NAME ARGS...: ts-fdupload under the shim, debug lines on
fdup() {
	local name=$1; shift
	env LD_PRELOAD="$TS_PRELOAD" TSSHIM_SESSION="$SESS-$name" TSSHIM_LOG=debug TMPDIR="$FILEDIR" \
		timeout 60 "$FDUP" "$@" >"$T_TMP/$name.out" 2>"$T_TMP/$name.err"
	FRC=$?
}
FILEDIR=$PWD/$BUILD/tests # a file system of the build, not shared memory (checked below)
fdup memfd memfd random object 3
check "a memfd object uploaded from its mapping: told, bytes unchanged (rc $FRC)" \
	cond '[ $FRC = 0 ] && [ "$(notices memfd)" = 1 ]'
fdup copy posix random copy 3
check "a shm_open object uploaded from a copy: told, bytes unchanged (rc $FRC)" \
	cond '[ $FRC = 0 ] && [ "$(notices copy)" = 1 ]'
fdup mmsg memfd random object 3 recvmmsg
check "a memfd object taken with recvmmsg, uploaded from its mapping: told, bytes unchanged (rc $FRC)" \
	cond '[ $FRC = 0 ] && [ "$(notices mmsg)" = 1 ]'
fdup dflt posix random copy 3 default
check "a shm_open object uploaded from a copy by a cudaMemcpyDefault copy: told, bytes unchanged (rc $FRC)" \
	cond '[ $FRC = 0 ] && [ "$(notices dflt)" = 1 ]'
fdup zeros memfd zeros object 3
check "zeroed objects (they would match any zeroed buffer): not told (rc $FRC)" \
	cond '[ $FRC = 0 ] && [ "$(notices zeros)" = 0 ]'
if [ "$(stat -f -c %T "$FILEDIR" 2>/dev/null)" != tmpfs ]; then
	fdup file file random object 3
	check "a file that is not shared memory: not told (rc $FRC)" cond '[ $FRC = 0 ] && [ "$(notices file)" = 0 ]'
else
	echo "# $FILEDIR is tmpfs: the file case is skipped"
fi
fdup other memfd random other 300
check "uploads of other bytes: not told, the look ends after 256 of them (rc $FRC)" \
	cond '[ $FRC = 0 ] && [ "$(notices other)" = 0 ] && grep -q "not looking any more" "$T_TMP/other.err"' ||
	sed 's/^/#   /' "$T_TMP/other.err"

# a Python interpreter: its DataLoader layer speaks for its loaders
cat >"$T_TMP/py_loader.py" <<'EOF'
import ctypes, mmap, os, socket, sys
a, b = socket.socketpair()
n = 65536
if os.fork() == 0:
    fd = os.memfd_create("py-batch")
    os.ftruncate(fd, n)
    os.pwrite(fd, os.urandom(n), 0)
    socket.send_fds(b, [b"b"], [fd])
    os._exit(0)
msg, fds, _, _ = socket.recv_fds(a, 1, 1)
m = mmap.mmap(fds[0], n, prot=mmap.PROT_READ)
buf = ctypes.create_string_buffer(m[:], n)
rt = ctypes.CDLL("libcudart.so.13")
dev = ctypes.c_void_p()
assert rt.cudaMalloc(ctypes.byref(dev), ctypes.c_size_t(n)) == 0
assert rt.cudaMemcpy(dev, buf, ctypes.c_size_t(n), 1) == 0
os.wait()
print("uploaded")
EOF
if command -v python3 >/dev/null && python3 -c 'import socket; socket.send_fds' 2>/dev/null; then
	env LD_PRELOAD="$TS_PRELOAD" TSSHIM_SESSION="$SESS-py" timeout 60 python3 "$T_TMP/py_loader.py" \
		>"$T_TMP/py.out" 2>"$T_TMP/py.err"
	prc=$?
	check "a Python interpreter: not told (rc $prc)" cond '[ $prc = 0 ] && [ "$(notices py)" = 0 ]' ||
		sed 's/^/#   /' "$T_TMP/py.err"
else
	echo "# python3 with socket.send_fds missing: the Python case is skipped"
fi

finish native_loader
