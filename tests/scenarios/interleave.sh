#!/usr/bin/env bash
# Two jobs that interleave a training and a validation loader (a validation
# batch every 3 training steps, the validation iterator made before the
# training loop) at different training batch sizes, 8 and 6. Job A opens the
# validation loader's feed first (its producer), job B the training one's; A,
# a consumer of training, needs B's next batch to fill its batch of 8, while
# B waits in validation for A's next batch. A job waiting in one feed now
# marks the feeds it produces idle while it makes no batch of them, and the
# other takes them over after the timeout. Before, both waited on each other
# for ever (3 of 3 runs, found by a differential run). Checked: both finish,
# each training epoch holds every sample once, every validation batch is the
# next of the loader in order, and nothing is left in /dev/shm.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
need_python "torch"
unset TSSHIM_MODE TSSHIM_LOG
cat >"$T_TMP/job.py" <<'PY'
import json, sys, time
import torch
from torch.utils.data import DataLoader, Dataset


class DS(Dataset):
    def __init__(self, n, off):
        self.n, self.off = n, off

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((3, 4, 4), float(i + self.off)), i % 5


bs, pause_before, pause_iter = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
train = DataLoader(DS(96, 0), batch_size=bs, shuffle=True, num_workers=2)
val = DataLoader(DS(40, 1000), batch_size=10, shuffle=False, num_workers=2)
time.sleep(pause_before)
for ep in range(2):
    vi, seen, vals = iter(val), [], []
    time.sleep(pause_iter if ep == 0 else 0)
    for k, (x, y) in enumerate(train):
        ids = x[:, 0, 0, 0].long().tolist()
        assert all(i % 5 == int(l) for i, l in zip(ids, y.tolist())), "labels"
        seen += ids
        if k % 3 == 0:
            vb = next(vi, None)
            if vb is None:
                vi = iter(val)
                vb = next(vi)
            vals.append(vb[0][:, 0, 0, 0].long().tolist())
        time.sleep(0.01)
    print(json.dumps({"ep": ep, "train": sorted(seen) == list(range(96)), "n": len(seen),
                      "val": all(v == list(range(1000 + 10 * (j % 4), 1010 + 10 * (j % 4))) for j, v in enumerate(vals))}))
PY
S=$(session_name interleave)
LD_PRELOAD="$TS_PRELOAD" TSSHIM_SESSION=$S TSSHIM_LOG=info timeout 60 "$PY" "$T_TMP/job.py" 8 0 1.0 \
	>"$T_TMP/a" 2>"$T_TMP/a.err" &
T_PIDS+=($!)
pa=$!
LD_PRELOAD="$TS_PRELOAD" TSSHIM_SESSION=$S TSSHIM_LOG=info timeout 60 "$PY" "$T_TMP/job.py" 6 0.5 0 \
	>"$T_TMP/b" 2>"$T_TMP/b.err" &
T_PIDS+=($!)
pb=$!
wait "$pa"; ra=$?
wait "$pb"; rb=$?
check "both jobs finished (exit $ra $rb; 124: they waited on each other until timeout killed them)" \
	cond "[ $ra = 0 ] && [ $rb = 0 ]"
for j in a b; do
	good=$(grep -c '"train": true, "n": 96, "val": true' "$T_TMP/$j")
	check "job $j: each training epoch held every sample once, and its validation batches in order ($good of 2 epochs)" \
		[ "$good" = 2 ] || sed 's/^/#   /' "$T_TMP/$j" "$T_TMP/$j.err" | tail -n 8
done
check "a feed was taken over from a job waiting in the other" grep -q "took over from idle member" "$T_TMP/a.err" "$T_TMP/b.err"
sleep 0.2
check "nothing of the session is left in /dev/shm" cond "! ls /dev/shm | grep -q -- '$S'"
finish interleave
