#!/usr/bin/env bash
# Ring across processes under randomized faults (SIGKILL and SIGSTOP of the
# producer at random points, consumers killed, late joiners): every consumer
# verifies its stream, nothing hangs, nothing is left behind.
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
exec "$BUILD/tests/ts-ring-chaos" --rounds "${TS_CHAOS_ROUNDS:-5}" ${TS_CHAOS_SEED:+--seed "$TS_CHAOS_SEED"}
