#!/usr/bin/env bash
# POSIX semantics under the shim: ts-posixcheck runs a fixed script of file
# operations (open/open64/openat/openat64/__open_2/__open64_2/__openat_2,
# read/__read_chk/pread/pread64/__pread64_chk/readv/preadv, lseek64,
# close/dup/dup2/dup3/close_range, fopen/fopen64/fread/fseek/ftell/fclose/fdopen/freopen/
# fmemopen), alone and from 4 threads at once, on .jpg and other files, and
# prints every return value, errno and hash of the bytes read. Its output,
# stderr and exit status must be the same without the shim, with it while no
# scope is known (.jpg files tracked), with the fixtures in TSSHIM_DATA, with
# TSSHIM_DATA elsewhere (pure pass-through), and in exact mode; the number of
# descriptors open at the end too.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh

CHECK=$PWD/$BUILD/tests/ts-posixcheck
if [ ! -x "$CHECK" ] || [ ! -f "$BUILD/libtsshim.so" ]; then
	echo "# $CHECK or $BUILD/libtsshim.so not built"
	echo "posix: skipped"
	exit 77
fi

DIR=$T_TMP/a
mkdir -p "$DIR"

# run NAME [VAR=VALUE...]: ts-posixcheck with that environment; output in $T_TMP/NAME.{out,err,rc}.
run() {
	local name=$1; shift
	env "$@" "$CHECK" "$DIR" >"$T_TMP/$name.out" 2>"$T_TMP/$name.err"
	echo $? >"$T_TMP/$name.rc"
}

run base
base_lines=$(wc -l <"$T_TMP/base.out")
check "ts-posixcheck runs without the shim (exit 0, $base_lines lines, nothing on stderr)" \
	sh -c "[ \"\$(cat '$T_TMP/base.rc')\" = 0 ] && [ ! -s '$T_TMP/base.err' ] && [ $base_lines -gt 500 ]"
check "without the shim: every thread printed the same lines each iteration" \
	sh -c "[ \$(grep -c '^== thread .*all identical: yes' '$T_TMP/base.out') = 4 ]"
check "without the shim: errno survives every successful call" \
	sh -c "! grep 'errno after=' '$T_TMP/base.out' | grep -qv 'errno after=SENTINEL'"
check "without the shim: no descriptor left open" \
	sh -c "grep -q '^fds after lone run: +0$' '$T_TMP/base.out' &&
	       [ \"\$(grep '^fds open at start' '$T_TMP/base.out' | cut -d: -f2)\" = \"\$(grep '^fds open at end' '$T_TMP/base.out' | cut -d: -f2)\" ]"

# The four thread blocks are the same script on the same kind of files.
blocks_same() {
	local f=$1 i
	awk -v d="$T_TMP" '/^== thread /{n=$3; next} /^fds open/{n=""} n!=""{print > (d "/blk" n)}' "$f"
	for i in 1 2 3; do cmp -s "$T_TMP/blk0" "$T_TMP/blk$i" || return 1; done
}
check "without the shim: the four threads printed the same lines" blocks_same "$T_TMP/base.out"

# The shim's hooks are what the program calls (LD_DEBUG shows the bindings;
# under ASan the program calls libasan's interceptor, which calls the shim).
LD_DEBUG=bindings LD_DEBUG_OUTPUT="$T_TMP/bind" LD_PRELOAD="$TS_PRELOAD" "$CHECK" "$DIR" >/dev/null 2>&1
cat "$T_TMP"/bind.* >"$T_TMP/bindings" 2>/dev/null
binds() { # FROM-PATTERN TO-PATTERN SYMBOL
	grep -q "binding file $1 \[.* to $2 \[.*: normal symbol \`$3'" "$T_TMP/bindings"
}
missing=
for sym in open open64 openat openat64 __open_2 __open64_2 __openat_2 read __read_chk pread pread64 \
	__pread64_chk readv preadv close dup dup2 dup3 fopen fopen64 fread fclose; do
	binds "$CHECK" '[^ ]*libtsshim\.so' "$sym" ||
		{ binds "$CHECK" '[^ ]*libasan[^ ]*' "$sym" && binds '[^ ]*libasan[^ ]*' '[^ ]*libtsshim\.so' "$sym"; } ||
		missing="$missing $sym"
done
check "every libc entry point the program calls binds to the shim${missing:+ (not:$missing)}" [ -z "$missing" ]

same_as_base() { # name description
	local name=$1 desc=$2
	if cmp -s "$T_TMP/base.out" "$T_TMP/$name.out" && cmp -s "$T_TMP/base.err" "$T_TMP/$name.err" &&
		cmp -s "$T_TMP/base.rc" "$T_TMP/$name.rc"; then
		ok "$desc: output, stderr and exit status identical ($base_lines lines)"
	else
		not_ok "$desc: differs from the run without the shim (exit $(cat "$T_TMP/base.rc") vs $(cat "$T_TMP/$name.rc"))"
		diff "$T_TMP/base.out" "$T_TMP/$name.out" | head -20 | sed 's/^/#   /'
		diff -u "$T_TMP/base.err" "$T_TMP/$name.err" | head -10 | sed 's/^/#   /'
	fi
	local a b
	a=$(grep '^fds open at end' "$T_TMP/base.out")
	b=$(grep '^fds open at end' "$T_TMP/$name.out")
	if [ -n "$b" ] && [ "$a" = "$b" ]; then
		ok "$desc: same number of descriptors open at the end (${b#*: })"
	else
		not_ok "$desc: descriptors open at the end: '${a#*: }' without the shim, '${b#*: }' with it"
	fi
}

run tracked LD_PRELOAD="$TS_PRELOAD"
same_as_base tracked "shim, no scope (.jpg files tracked)"
run inscope LD_PRELOAD="$TS_PRELOAD" TSSHIM_DATA="$DIR"
same_as_base inscope "shim, TSSHIM_DATA=the fixtures (every file tracked)"
run outscope LD_PRELOAD="$TS_PRELOAD" TSSHIM_DATA=/nonexistent
same_as_base outscope "shim, TSSHIM_DATA elsewhere (pass-through)"
run exact LD_PRELOAD="$TS_PRELOAD" TSSHIM_MODE=exact
same_as_base exact "shim, TSSHIM_MODE=exact"
run exactscope LD_PRELOAD="$TS_PRELOAD" TSSHIM_MODE=exact TSSHIM_DATA="$DIR"
same_as_base exactscope "shim, TSSHIM_MODE=exact with TSSHIM_DATA"

# Threads race each other harder on a second pass; nothing may change.
for i in 1 2 3; do
	run "again$i" LD_PRELOAD="$TS_PRELOAD" TSSHIM_DATA="$DIR"
	cmp -s "$T_TMP/base.out" "$T_TMP/again$i.out" || break
done
check "shim in scope, three more runs: identical each time" cmp -s "$T_TMP/base.out" "$T_TMP/again$i.out"

finish posix
