#!/usr/bin/env bash
# Runs every test: the Criterion unit suites (build/tests/test_*) and the
# multi-process scenarios (tests/scenarios/*.sh: exit 0 pass, 77 skip, else
# fail). Prints one line per suite and a final "N passed, M failed" line.
# TESTS=unit runs only the unit suites (make tsan).
#
# Two lanes. The PyTorch scenarios (LANE_HEAVY) run one after the other in a
# lane of their own while everything else runs in order beside them: run
# alone on a 2-core machine like CI's, pytorch_share used 309 s of CPU in 354 s
# (one core, the other idle), and the serial suite took 17m35s (CI: 1017 s);
# with the lanes, 10m44s-12m05s. Once through its list, the heavy lane takes
# the other lane's scenarios from the end of its list, each scenario run by
# whichever lane claims it first: in stop 48 the heavy lane's list took 584 s
# and the other's 856 s, one core idle for the last 272 s (make test 18m02s on
# a clean clone). Every scenario names its sessions,
# feeds and caches after its own pid (tests/lib.sh session_name) and looks at
# nothing else in /dev/shm, so lanes do not see each other. TEST_LANES=1 runs
# everything in one lane, in the old order; ASan builds do that by default
# (their scenarios run near their time limit already).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
TESTS=${TESTS:-all}
export BUILD

# A scenario still running after SCENARIO_LIMIT seconds fails (exit 124);
# instrumented jobs run two to three times slower (pytorch_share: about 5
# minutes plain, past 10 under make asan on 2 cores), so theirs is doubled.
# An ASan build of the shim must come after the ASan runtime in the preload
# list when it goes into programs that were not built with ASan.
SCENARIO_LIMIT=${SCENARIO_LIMIT:-600}
TS_PRELOAD="$PWD/$BUILD/libtsshim.so"
lanes_default=2
[ "$(nproc 2>/dev/null || echo 1)" -ge 2 ] || lanes_default=1
if ldd "$BUILD/libtsshim.so" 2>/dev/null | grep -q libasan; then
	SCENARIO_LIMIT=$((SCENARIO_LIMIT * 2))
	TS_PRELOAD="$(${CC:-cc} -print-file-name=libasan.so) $TS_PRELOAD"
	export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:verify_asan_link_order=0}
	export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
	lanes_default=1
fi
export TS_PRELOAD
TEST_LANES=${TEST_LANES:-$lanes_default}
LANE_HEAVY=${LANE_HEAVY:-pytorch_share exact_batches sequential}

logdir="$BUILD/test-logs"
results="$logdir/results"
mkdir -p "$logdir"
: >"$results"

# run_one NAME COMMAND...: one result line on stdout and in $results
# ("STATUS NAME"); a failure's log tail is printed at the end, so that two
# lanes' lines do not interleave with it.
run_one() {
	local name=$1; shift
	local log="$logdir/${name//\//_}.log" start=$SECONDS rc line
	"$@" >"$log" 2>&1
	rc=$?
	case $rc in
	0) line=$(printf 'PASS  %-28s %3ss' "$name" $((SECONDS - start))) ;;
	77) line=$(printf 'SKIP  %-28s %s' "$name" "$(tail -n 1 "$log")") ;;
	*) line=$(printf 'FAIL  %-28s (exit %d, %ss)' "$name" "$rc" $((SECONDS - start))) ;;
	esac
	echo "$line"
	echo "${line%% *} $name" >>"$results"
}

run_scenario() { # FILE
	run_one "scenario/$(basename "$1" .sh)" timeout "$SCENARIO_LIMIT" bash "$1"
}

is_heavy() { # FILE: whether it runs in the heavy lane
	local s=$(basename "$1" .sh) h
	for h in $LANE_HEAVY; do [ "$s" = "$h" ] && return 0; done
	return 1
}

# claim NAME: whether this lane takes scenario NAME (the first lane to ask does).
claims="$logdir/claims"
rm -rf "$claims"
mkdir -p "$claims"
claim() {
	mkdir "$claims/$1" 2>/dev/null
}

lane_pid=
if [ "$TESTS" != unit ] && [ "$TEST_LANES" -ge 2 ]; then
	# The heavy lane, then, from the end of the list, what the other lane has
	# not begun: both lanes busy to the end.
	(
		for s in tests/scenarios/*.sh; do is_heavy "$s" && claim "$(basename "$s")" && run_scenario "$s"; done
		mapfile -t rest < <(printf '%s\n' tests/scenarios/*.sh | sort -r)
		for s in "${rest[@]}"; do
			[ -f "$s" ] && claim "$(basename "$s")" && run_scenario "$s"
		done
	) &
	lane_pid=$!
	# Interrupted: the lane and the scenarios it runs (each under its own
	# timeout, which passes TERM on to the scenario) go too.
	trap 'pkill -TERM -P "$lane_pid" 2>/dev/null; pkill -TERM -P $$ 2>/dev/null; exit 130' INT TERM
fi

for t in "$BUILD"/tests/test_*; do
	[ -x "$t" ] || continue
	run_one "unit/$(basename "$t")" "$t" --jobs 1 --timeout 120
done
for s in tests/scenarios/*.sh; do
	[ "$TESTS" = unit ] && break
	[ -f "$s" ] || continue
	[ -n "$lane_pid" ] && is_heavy "$s" && continue
	claim "$(basename "$s")" || continue
	run_scenario "$s"
done
[ -n "$lane_pid" ] && wait "$lane_pid"

passed=$(grep -c '^PASS ' "$results")
failed=$(grep -c '^FAIL ' "$results")
skipped=$(grep -c '^SKIP ' "$results")
failures=$(awk '$1 == "FAIL" {print $2}' "$results" | xargs)
for name in $failures; do
	echo "--- $name: the end of $logdir/${name//\//_}.log"
	tail -n 30 "$logdir/${name//\//_}.log" | sed 's/^/      /'
done
# The checks that failed, with the lines they printed, last: CI keeps only the
# end of what ran, and a tail of 30 lines may not reach back to them.
for name in $failures; do
	echo "--- $name: what failed"
	awk '/^not ok|\[FAIL\]|Assertion [Ff]ailed/ {n = 6; print; next} n > 0 && /^(#|\[----\])/ {n--; print; next} {n = 0}' \
		"$logdir/${name//\//_}.log" | head -n 40 | sed 's/^/      /'
done
echo "logs: $logdir"
[ -z "$failures" ] || echo "failed: $failures"
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
