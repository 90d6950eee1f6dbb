#!/usr/bin/env bash
# Static analysis (make lint): cppcheck and clang-tidy over core/, shim/,
# tools/ and tools/cudaemu/, with the checked-in configurations
# (.cppcheck-suppressions, .clang-tidy). Both must be clean: any finding
# fails. Compile flags come from the Makefile (LINT_CPPFLAGS); run alone, the
# same defaults are used. Exit 0 clean, 1 findings, 77 a tool is missing.
set -u
cd "$(dirname "$0")/.."
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
FLAGS=${LINT_CPPFLAGS:-"-D_GNU_SOURCE -Iinclude -Icore -Ishim -isystem $CUDA_HOME/include"}
JOBS=${JOBS:-$(nproc)}
CPPCHECK=${CPPCHECK:-cppcheck}
CLANG_TIDY=${CLANG_TIDY:-clang-tidy}

for t in "$CPPCHECK" "$CLANG_TIDY"; do
	command -v "$t" >/dev/null || { echo "static: $t not installed"; exit 77; }
done
[ -f "$CUDA_HOME/include/cuda.h" ] || { echo "static: no CUDA headers under $CUDA_HOME"; exit 77; }

SRC=(core/*.c shim/*.c tools/*.c tools/cudaemu/*.c)
rc=0

# cppcheck: bug classes (warning, performance, portability) plus the style
# checks that find real mistakes; the pure-style ones and the false positives
# are listed, each with its reason, in .cppcheck-suppressions. Only the
# tree's own headers are read (-I without system paths): the configuration
# checked is the one the Makefile builds (-D_GNU_SOURCE, x86-64 Linux).
start=$SECONDS
# shellcheck disable=SC2086
if ! "$CPPCHECK" -q -j "$JOBS" --std=c11 --platform=unix64 --library=posix --library=gnu \
	--enable=warning,style,performance,portability --inline-suppr \
	--suppressions-list=.cppcheck-suppressions --error-exitcode=1 \
	-D_GNU_SOURCE -D__x86_64__ -D__linux__ '-DElfW(type)=Elf64_##type' -Iinclude -Icore -Ishim -Itools/cudaemu \
	--template='{file}:{line}: {severity} [{id}] {message}' "${SRC[@]}"; then
	rc=1
fi
echo "static: cppcheck $([ $rc = 0 ] && echo clean || echo FINDINGS) (${#SRC[@]} files, $((SECONDS - start))s)"

# clang-tidy: checks in .clang-tidy, warnings are errors; one file per job.
tidy_one() {
	local extra=
	# shellcheck disable=SC2086
	"$CLANG_TIDY" --quiet $extra "$1" -- -std=gnu11 -pthread $FLAGS
}
export -f tidy_one
export CLANG_TIDY FLAGS
start=$SECONDS
out=$(mktemp)
if ! printf '%s\n' "${SRC[@]}" | xargs -P "$JOBS" -I{} bash -c 'tidy_one "$1"' _ {} >"$out" 2>&1; then
	grep -v -E '^[0-9]+ warnings? (and [0-9]+ errors? )?generated\.$|^Suppressed [0-9]+ warnings|^Use -header-filter' "$out"
	echo "static: clang-tidy FINDINGS ($((SECONDS - start))s)"
	rc=1
else
	echo "static: clang-tidy clean (${#SRC[@]} files, $((SECONDS - start))s)"
fi
rm -f "$out"
exit $rc
