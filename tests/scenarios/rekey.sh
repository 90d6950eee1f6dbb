#!/usr/bin/env bash
# A loader whose transforms change between epochs (progressive resizing: the
# Resize of job 2 goes from 32 to 16 pixels at its second epoch) leaves the
# batches of the jobs whose loaders stood alike before: its key is worked out
# at every iter(). Two jobs, 2 workers each, the loader with a generator of
# its own; in exact mode each job's records (per batch: shape, labels, every
# sample's hash; random draws after each epoch) equal its plain run's, and in
# socket mode each job's images have its own size in every epoch. Before, the
# key of the first iter() held for good: in exact mode the consumer of epoch 1
# trained on the other job's images, the other size (4 of 4 batches, 4 of 4
# runs, found by a differential run); in socket mode the same.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh
need_python "torch, torchvision"
MKDATA="$PWD/$BUILD/tsshim-mkdata"
[ -x "$MKDATA" ] || { echo "needs $MKDATA"; exit 77; }
"$MKDATA" --classes 2 --train 8 --val 1 --seed 5 "$T_TMP/data" >/dev/null 2>&1 || { echo "mkdata failed"; exit 1; }
unset TSSHIM_MODE TSSHIM_LOG
cat >"$T_TMP/job.py" <<'PY'
import hashlib, json, os, sys, time
import torch, torchvision, torchvision.transforms as T
from torch.utils.data import DataLoader
size2 = int(sys.argv[2])
torch.manual_seed(0)
ds = torchvision.datasets.ImageFolder(sys.argv[1], transform=T.Compose([T.Resize((32, 32)), T.ToTensor()]))
g = torch.Generator()
g.manual_seed(0)
dl = DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, generator=g)
bar = os.environ.get("BARRIER")  # DIR:N: the jobs begin together
if bar:
    d, n = bar.rsplit(":", 1)
    open(os.path.join(d, str(os.getpid())), "w").close()
    t0 = time.time()
    while len(os.listdir(d)) < int(n) and time.time() - t0 < 30:
        time.sleep(0.005)
for ep in range(3):
    if ep == 1:
        ds.transform.transforms[0].size = (size2, size2)
    for x, y in dl:
        print(json.dumps({"ep": ep, "shape": list(x.shape), "y": y.tolist(),
                          "x": [hashlib.sha256(s.numpy().tobytes()).hexdigest()[:12] for s in x]}))
    print(json.dumps({"ep": ep, "rng": torch.rand(1).item()}))
PY
for i in 1 2; do
	size=32; [ "$i" = 2 ] && size=16
	env -u LD_PRELOAD timeout 120 "$PY" "$T_TMP/job.py" "$T_TMP/data/train" $size >"$T_TMP/plain.$i" 2>/dev/null
done
for mode in exact socket; do
	mkdir -p "$T_TMP/bar.$mode"
	for i in 1 2; do
		size=32; [ "$i" = 2 ] && size=16
		BARRIER="$T_TMP/bar.$mode:2" LD_PRELOAD="$TS_PRELOAD" TSSHIM_MODE=$mode TSSHIM_LOG=info \
			TSSHIM_SESSION="$(session_name "$mode")" timeout 120 "$PY" "$T_TMP/job.py" "$T_TMP/data/train" $size \
			>"$T_TMP/$mode.$i" 2>"$T_TMP/$mode.$i.err" &
		T_PIDS+=($!)
		eval "pid$i=\$!"
	done
	wait "$pid1"; rc1=$?
	wait "$pid2"; rc2=$?
	check "($mode) both jobs finished (exit $rc1 $rc2)" cond "[ $rc1 = 0 ] && [ $rc2 = 0 ]"
	if [ $mode = exact ]; then
		for i in 1 2; do
			n=$(diff "$T_TMP/plain.$i" "$T_TMP/exact.$i" | grep -c '^>')
			check "(exact) job $i trained on exactly its own batches, its draws its own ($n records differ)" [ "$n" = 0 ]
		done
	else
		s1=$(grep -c '"shape": \[[0-9]*, 3, 32, 32\]' "$T_TMP/socket.1")
		s2=$(grep -c '"shape": \[[0-9]*, 3, 32, 32\]' "$T_TMP/socket.2")
		t2=$(grep -c '"shape": \[[0-9]*, 3, 16, 16\]' "$T_TMP/socket.2")
		check "(socket) job 1's batches all 32 pixels ($s1 of 12), job 2's 32 in its first epoch and 16 after ($s2 and $t2 of 4 and 8)" \
			cond "[ '$s1' = 12 ] && [ '$s2' = 4 ] && [ '$t2' = 8 ]"
	fi
done
finish rekey
