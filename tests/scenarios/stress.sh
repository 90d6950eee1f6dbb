#!/usr/bin/env bash
# The short form of `make stress` (tests/stress.py): a few rounds of real
# PyTorch jobs sharing a DataLoader, then of tsshim-train jobs sharing
# decodes in exact mode on the CUDA test device, hit by SIGKILL,
# SIGSTOP/SIGCONT, SIGINT and SIGTERM at random moments; each round must end
# without a hang, with every record proven (share_verify, trained_checksum)
# and nothing left in /dev/shm.
# STRESS_ROUNDS (default 3) and STRESS_SEED (default: random, printed).
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh
PY=${TS_PYTHON:-/usr/bin/python3} # TS_PYTHON: another Python with torch (another torch version)
"$PY" -c 'import torch, torchvision, PIL' 2>/dev/null || { echo "python3-torch/torchvision/pil not installed"; exit 77; }
MKDATA="$PWD/$BUILD/tsshim-mkdata"
[ -x "$MKDATA" ] || { echo "needs $MKDATA"; exit 77; }
"$MKDATA" --classes 4 --train 40 --val 4 --seed 7 "$T_TMP/data" >/dev/null 2>&1 || { echo "mkdata failed"; exit 1; }
# TS_PRELOAD: the shim, after the ASan runtime for an ASan build (tests/run.sh).
"$PY" tests/stress.py --data "$T_TMP/data" --lib "$TS_PRELOAD" --rounds "${STRESS_ROUNDS:-3}" \
	${STRESS_SEED:+--seed "$STRESS_SEED"} >"$T_TMP/stress.out" 2>&1
rc=$?
sed 's/^/# /' "$T_TMP/stress.out"
check "PyTorch jobs sharing a DataLoader: $(tail -n 1 "$T_TMP/stress.out")" [ $rc = 0 ]

# The same faults on 3 same-seed tsshim-train jobs sharing decodes (exact mode, test device).
if [ -x "$BUILD/tsshim-train" ] && [ -e "$BUILD/emu/libcudart.so.13" ]; then
	"$PY" tests/stress.py --train --build "$BUILD" --data "$T_TMP/data" --lib "$TS_PRELOAD" \
		--rounds "${STRESS_ROUNDS:-3}" ${STRESS_SEED:+--seed "$STRESS_SEED"} >"$T_TMP/train.out" 2>&1
	rc=$?
	sed 's/^/# /' "$T_TMP/train.out"
	check "tsshim-train in exact mode, survivors train on what they train on alone: $(tail -n 1 "$T_TMP/train.out")" [ $rc = 0 ]
fi
finish stress
