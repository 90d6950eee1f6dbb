#!/usr/bin/env bash
# A collate function that returns its images channels_last (N, C, H, W with
# the channels innermost), as jobs that train in that layout do: a consumer's
# batches are channels_last too, the same values, in socket mode (two jobs at
# batch sizes 8 and 6) and in exact mode (two same-seed jobs, whole batches).
# Before, they came contiguous: is_contiguous() and .view() answered otherwise
# than without the shim, and the layout's speed was lost (found by a
# differential run). Each job checks every batch: its layout, each sample's
# values against its index, its labels, every sample once an epoch.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
need_python "torch"
unset TSSHIM_MODE TSSHIM_LOG
cat >"$T_TMP/job.py" <<'PY'
import json, os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset


class DS(Dataset):
    def __len__(self):
        return 48

    def __getitem__(self, i):
        return torch.arange(3 * 4 * 5, dtype=torch.float32).view(3, 4, 5) + 1000 * i, i % 7


def collate(samples):
    x = torch.stack([s[0] for s in samples]).contiguous(memory_format=torch.channels_last)
    return x, torch.tensor([s[1] for s in samples])


bs = int(sys.argv[1])
torch.manual_seed(3)
dl = DataLoader(DS(), batch_size=bs, shuffle=True, num_workers=2, collate_fn=collate)
d, n = sys.argv[2].rsplit(":", 1)  # a barrier: the jobs begin together
open(os.path.join(d, str(os.getpid())), "w").close()
t0 = time.time()
while len(os.listdir(d)) < int(n) and time.time() - t0 < 30:
    time.sleep(0.005)
base = torch.arange(3 * 4 * 5, dtype=torch.float32).view(3, 4, 5)
for ep in range(2):
    seen, good = [], True
    for x, y in dl:
        good &= x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        for s, l in zip(x, y.tolist()):
            i = int(s[0, 0, 0].item()) // 1000
            good &= torch.equal(s, base + 1000 * i) and l == i % 7
            seen.append(i)
        time.sleep(0.02)
    print(json.dumps({"ep": ep, "good": bool(good), "all": sorted(seen) == list(range(48))}))
PY
for mode in socket exact; do
	S=$(session_name "layout-$mode")
	mkdir -p "$T_TMP/go.$mode"
	bsb=6; [ $mode = exact ] && bsb=8
	pids=()
	for bs in 8 $bsb; do
		LD_PRELOAD="$TS_PRELOAD" TSSHIM_MODE=$mode TSSHIM_SESSION=$S TSSHIM_LOG=info timeout 60 \
			"$PY" "$T_TMP/job.py" $bs "$T_TMP/go.$mode:2" >"$T_TMP/$mode.$bs.${#pids[@]}" 2>"$T_TMP/$mode.$bs.${#pids[@]}.err" &
		T_PIDS+=($!)
		pids+=($!)
	done
	rc=0
	for p in "${pids[@]}"; do wait "$p" || rc=$?; done
	check "($mode) both jobs finished (exit $rc)" [ "$rc" = 0 ]
	good=$(cat "$T_TMP/$mode".*[0-9] | grep -c '"good": true, "all": true')
	check "($mode) every batch channels_last, its samples and labels right, every sample once ($good of 4 epochs)" \
		[ "$good" = 4 ] || cat "$T_TMP/$mode".*[0-9] | sed 's/^/#   /'
	reads=$(cat "$T_TMP/$mode".*.err | grep -c "consumer of feed")
	check "($mode) a job read the other's batches ($reads consumer lines)" [ "$reads" -ge 1 ]
	sleep 0.2
	check "($mode) nothing of the session is left in /dev/shm" cond "! ls /dev/shm | grep -q -- '$S'"
done
finish layout
