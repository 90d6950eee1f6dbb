#!/usr/bin/env bash
# Loaders whose batches are not samples along dim 0, or whose workers set the
# data, beside a job of the same script at another batch size or setting
# (tests/py/collate_job.py; 64 samples, batch sizes 8 and 12, shuffled, 2 epochs,
# each epoch taken as range(len(loader)) next() calls):
#   seqfirst  a collate that stacks sequence first, [T, B] (T = 12)
#   seqsame   the same, the job at batch size 12 (T = B) starting first: it produces
#   twoview   a collate that concatenates two views, [2B, ...]
#   filter    a collate that drops the samples the dataset returns as None
#   winit     a worker_init_fn that sets an offset read from $OFF (0 and 1000)
# Each job's epochs must be its own: len(loader) batches, its batch shapes, its
# samples paired with their labels and data, every sample once (sample order
# aside: a consumer takes the stream's). Before, the stream was cut along the
# collate's dim 0: seqfirst's consumer got 12 batches of 8 time steps of the
# producer's sequences against len 8, a filtering collate's consumer died of
# StopIteration after 5 of 6 batches, and the winit jobs shared: one trained
# on the other's offset (found by a differential run). Now a batch whose dim 0
# is not its samples is not published (sharing goes off for that loader, each
# job runs its own), nor one of a collate function of the user's own with another
# dimension of that length (seqsame: which holds the samples is not known; before,
# its consumer got time steps as samples), and a loader's worker_init_fn is part
# of its key.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh
need_python torch
JOB="$PWD/tests/py/collate_job.py"
unset TSSHIM_MODE
export TSSHIM_LOG=info

for case in seqfirst seqsame twoview filter winit; do
	shape=$case order=()
	[ "$case" = seqsame ] && shape=seqfirst
	mkdir -p "$T_TMP/$case.bar"
	for i in 1 2; do
		bs=8; off=0; [ "$i" = 2 ] && { bs=12; off=1000; }
		# seqsame: job 1 starts once job 2 has made its first batch (it produces).
		# A fixed head start lost the race on a loaded 2-core CI machine.
		[ "$case" = seqsame ] && order=(--after "$T_TMP/seqsame.first") &&
			[ "$i" = 2 ] && order=(--mark "$T_TMP/seqsame.first")
		OFF=$off env -u LD_PRELOAD timeout 120 "$PY" "$JOB" --shape $shape --batch-size $bs --seed $i --sleep 0 \
			--out "$T_TMP/$case.plain.$i" >/dev/null 2>&1
		OFF=$off LD_PRELOAD="$TS_PRELOAD" TSSHIM_SESSION="$(session_name $case)" timeout 120 "$PY" "$JOB" \
			--shape $shape --batch-size $bs --seed $i "${order[@]}" --barrier "$T_TMP/$case.bar:2" \
			--out "$T_TMP/$case.$i" \
			>/dev/null 2>"$T_TMP/$case.$i.err" &
		eval "pid$i=\$!"
		T_PIDS+=($!)
	done
	wait "$pid1"; rc1=$?
	wait "$pid2"; rc2=$?
	check "($case) both jobs exited 0 ($rc1 $rc2)" [ "$rc1" = 0 ] && [ "$rc2" = 0 ] ||
		tail -n 3 "$T_TMP/$case.1.err" "$T_TMP/$case.2.err" | sed 's/^/#   /'
	out=$("$PY" - "$shape" "$T_TMP/$case" <<'PYV'
import json, sys
shape, base = sys.argv[1], sys.argv[2]
bad = []
for i in (1, 2):
    plain = [json.loads(l) for l in open("%s.plain.%d" % (base, i))]
    try:
        shim = [json.loads(l) for l in open("%s.%d" % (base, i))]
    except OSError:
        shim = []
    if len(shim) != len(plain) or not plain:
        bad.append("job %d: %d epochs, %d without the shim" % (i, len(shim), len(plain)))
        continue
    for p, s in zip(plain, shim):
        for k in ("len", "batches", "ids", "paired") + (() if shape == "filter" else ("shapes",)):
            if p[k] != s[k]:
                v = s[k] if k != "ids" else "%d samples" % len(s[k])
                bad.append("job %d epoch %d: %s %s, plain %s" % (i, s["epoch"], k, v,
                                                               p[k] if k != "ids" else len(p[k])))
print("; ".join(bad[:3]) if bad else "each job's epochs as its own: len, batches, shapes, samples, pairing")
sys.exit(1 if bad else 0)
PYV
)
	check "($case) $out" [ $? = 0 ]
done
check "(seqfirst) the producer said why it does not share: $(grep -ho "the batch's first dimension[^;]*" "$T_TMP"/seqfirst.?.err | head -n 1)" \
	grep -qE "the batch's first dimension \(12\) is not its 8 samples|which holds the samples is not known" \
	"$T_TMP/seqfirst.1.err" "$T_TMP/seqfirst.2.err"
check "(seqsame) job 2, producing, said why it does not share: $(grep -ho "the collate function's batch has[^;]*" "$T_TMP/seqsame.2.err" | head -n 1)" \
	grep -q "the collate function's batch has 12 along its first dimension and another" "$T_TMP/seqsame.2.err"

finish collate_dims
