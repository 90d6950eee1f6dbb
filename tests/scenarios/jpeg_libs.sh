#!/usr/bin/env bash
# Two copies of libjpeg in one process: a program linked against the
# system's libjpeg.so.62 loads extension modules RTLD_LOCAL, each with its
# own copy (a stand-in that decodes every image to 4x2 bytes of 0xf7):
# under libjpeg-turbo's version nodes (the linker binds its calls to the
# global copy: versions match, files do not matter), under libjpeg 9's (they
# bind to its own), and without versions (the global copy). With the shim,
# whose exports the plugins' calls reach first, each decode must run in the
# copy it runs in without the shim, whole: before, the shim took the
# plugin's own copy, mixed it with the global one's source manager, and
# the process crashed. Each plugin is unloaded before the next is loaded,
# which glibc maps at the same address: a choice made for an unloaded
# plugin must not be reused for the next (before: a call into unmapped
# code). Last, dlsym of libjpeg's names from a program without libjpeg must
# find nothing, as without the shim.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh
PLUGINS="$PWD/$BUILD/tests/ts-jpegplugins"
MKDATA="$PWD/$BUILD/tsshim-mkdata"
T="$PWD/$BUILD/tests"
for f in "$PLUGINS" "$MKDATA" "$T/libts-jpegplugin62.so" "$T/libts-jpegplugin9.so" "$T/libts-jpegpluginnov.so"; do
	[ -e "$f" ] || { echo "$f not built"; exit 77; }
done
"$MKDATA" --classes 1 --train 1 --val 0 --seed 5 "$T_TMP/d" >/dev/null 2>&1 || exit 1
J=$(ls "$T_TMP"/d/train/*/*.jpg | sed -n 1p)
unset TSSHIM_MODE TSSHIM_LOG

run() { # NAME [ENV=VALUE...]: the program, plugins 9, 62, nov, 9
	local name=$1; shift
	env "$@" timeout 60 "$PLUGINS" "$J" "$T/libts-jpegplugin9.so" "$T/libts-jpegplugin62.so" \
		"$T/libts-jpegpluginnov.so" "$T/libts-jpegplugin9.so" >"$T_TMP/$name.out" 2>"$T_TMP/$name.err"
	local rc=$?
	[ $rc = 0 ] || sed 's/^/#   /' "$T_TMP/$name.out" "$T_TMP/$name.err" | head -20
	return $rc
}
line() { sed -n "s/^$2: //p" "$T_TMP/$1.out" | sed -n "${3:-1}p"; }

check "without the shim: the program and four plugin rounds decode" run plain
main=$(line plain main)
expect_plain() {
	[ -n "$main" ] && [ "$main" != "4x2 sum=5928" ] &&
		[ "$(line plain libts-jpegplugin9.so)" = "4x2 sum=5928 lib=own at=new" ] &&
		[ "$(line plain libts-jpegplugin62.so)" = "$main lib=global at=last" ] &&
		[ "$(line plain libts-jpegpluginnov.so)" = "$main lib=global at=last" ] &&
		[ "$(line plain libts-jpegplugin9.so 2)" = "4x2 sum=5928 lib=own at=last" ]
}
check "... libjpeg 9's versions: its own copy; turbo's versions or none: the global copy ($main); each plugin where the last was" \
	expect_plain || sed 's/^/#   /' "$T_TMP/plain.out"

same() { cmp -s "$T_TMP/plain.out" "$T_TMP/$1.out" || { diff "$T_TMP/plain.out" "$T_TMP/$1.out" | sed 's/^/#   /'; false; }; }
check "with the shim: it runs" run shim LD_PRELOAD="$TS_PRELOAD"
check "... every decode in the copy, at the size and sum, it has without the shim" same shim

# Exact mode: the program's decode fills the cache, and the two plugins
# bound to the same (global) copy are served from it: the shim knows
# which library decodes, as the cache key includes it.
S=$(session_name libs)
check "exact mode: it runs" run exact LD_PRELOAD="$TS_PRELOAD" TSSHIM_MODE=exact TSSHIM_SESSION="$S" TSSHIM_LOG=info
check "... the same output as without the shim" same exact
check "... the plugins on the global copy were served the program's decode (2 hits, 1 fill)" \
	grep -q 'decoded-image cache: 2 hits, 1 fills' "$T_TMP/exact.err"
# No global copy: Python (no libjpeg) loads each plugin with ctypes. Each
# decodes in its own copy whatever its versions, and its own dlsym probe
# (man dlsym's way: dlerror() after) finds libjpeg with no error pending.
pyhost() { # NAME [ENV=VALUE...]
	local name=$1; shift
	env "$@" timeout 60 /usr/bin/python3 -c 'import ctypes, sys
jpg = open(sys.argv[1], "rb").read()
for path in sys.argv[2:]:
    lib = ctypes.CDLL(path)
    w, h, s = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulong()
    r = lib.ts_jplugin_decode(jpg, len(jpg), ctypes.byref(w), ctypes.byref(h), ctypes.byref(s))
    print(path.rsplit("/", 1)[-1], r, "%ux%u" % (w.value, h.value), s.value,
          "own" if lib.ts_jplugin_fake_calls() else "global", "probe", lib.ts_jplugin_probe())' \
		"$J" "$T/libts-jpegplugin62.so" "$T/libts-jpegplugin9.so" "$T/libts-jpegpluginnov.so" \
		>"$T_TMP/$name.out" 2>"$T_TMP/$name.err"
}
py_want() {
	printf '%s 0 4x2 5928 own probe 1\n' libts-jpegplugin62.so libts-jpegplugin9.so libts-jpegpluginnov.so |
		cmp -s - "$T_TMP/$1.out" || sed 's/^/#   /' "$T_TMP/$1.out" "$T_TMP/$1.err"
}
pyhost pyplain
check "Python host, no global libjpeg, without the shim: every plugin decodes in its own copy, dlsym finds it" py_want pyplain
pyhost pyshim LD_PRELOAD="$TS_PRELOAD"
check "... with the shim: the same" py_want pyshim

# A probe: is libjpeg loaded? The shim exports libjpeg's names, so dlsym
# found ours where no libjpeg was loaded, and a call through it aborted the
# process. Python's ctypes asks from a program that links no libjpeg, before
# and after loading one RTLD_GLOBAL; in every mode the answers must be the
# ones without the shim.
probe() { # NAME [ENV=VALUE...]
	local name=$1; shift
	env "$@" timeout 60 /usr/bin/python3 -c 'import ctypes
lib = ctypes.CDLL(None)
print("before", hasattr(lib, "jpeg_read_header"), hasattr(lib, "jpeg_crop_scanline"))
ctypes.CDLL("libjpeg.so.62", mode=ctypes.RTLD_GLOBAL)
print("after", hasattr(lib, "jpeg_read_header"), hasattr(lib, "jpeg_crop_scanline"))' >"$T_TMP/$name.out" 2>"$T_TMP/$name.err"
}
probe_want() { printf 'before False False\nafter True True\n' | cmp -s - "$T_TMP/$1.out" ||
	sed 's/^/#   /' "$T_TMP/$1.out" "$T_TMP/$1.err"; }
if /usr/bin/python3 -c 'import ctypes; ctypes.CDLL("libjpeg.so.62")' 2>/dev/null; then
	probe noshim
	check "ctypes probe without the shim: no libjpeg, then one" probe_want noshim
	probe probe LD_PRELOAD="$TS_PRELOAD"
	check "... with the shim: the same answers" probe_want probe
	probe probeoff LD_PRELOAD="$TS_PRELOAD" TSSHIM_MODE=off
	check "... with the shim off: the same answers" probe_want probeoff
fi
finish jpeg_libs
