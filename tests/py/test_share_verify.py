"""Self checks of share_verify.py: hand-made records that break each rule.

    /usr/bin/python3 tests/py/test_share_verify.py [-v]

Needs torch, torchvision, PIL. Makes a tiny dataset (tsshim-mkdata
--classes 2 --train 3 --val 1 when $BUILD/tsshim-mkdata exists, else a few
PIL-drawn JPEGs in the same ImageFolder layout), builds records by hand from
the verifier's own hash table, and checks that share_verify reports what each
one breaks, and passes the good ones. One real share_job.py run (2 epochs,
--val, 1 fork worker) is verified end to end through the command line.
"""
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

import share_verify as sv  # noqa: E402

ROOT = TMP = TABLE = None


def make_dataset(root):
    mkdata = os.path.join(REPO, os.environ.get("BUILD", "build"), "tsshim-mkdata")
    if os.access(mkdata, os.X_OK):
        subprocess.run([mkdata, "--classes", "2", "--train", "3", "--val", "1", "--seed", "7", root],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return
    from PIL import Image
    for split, n in (("train", 3), ("val", 1)):
        for c in range(2):
            d = os.path.join(root, split, "c%03d" % c)
            os.makedirs(d)
            for i in range(n):
                Image.new("RGB", (60 + 7 * i, 50), (40 + 100 * c, 30 * i, 90 + 50 * (split == "val"))).save(
                    os.path.join(d, "%05d.jpg" % i))


def setUpModule():
    global ROOT, TMP, TABLE
    TMP = tempfile.mkdtemp(prefix="share-verify-test.")
    ROOT = os.path.join(TMP, "data")
    make_dataset(ROOT)
    TABLE = sv.build_table(ROOT, os.path.join(TMP, "table.json"))


def tearDownModule():
    shutil.rmtree(TMP, ignore_errors=True)


def H(i, split="train", tf="std"):
    return TABLE.seq[(split, tf)][i]


def Y(i, split="train"):
    return TABLE.images[split][i][1]


def marked(job, epoch, batch=None, **fields):
    """Set fields on that train batch (every one of the epoch when batch is
    None): pv, samples the layer made privately; gv, samples it gathered from
    the next stream epoch; role, its role then."""
    for d in job.lines:
        if d.get("loader") == "train" and d.get("epoch") == epoch and "h" in d and batch in (None, d.get("batch")):
            d.update(fields)
    return job


class Job:
    """Writes a record the way share_job.py does. epochs: a list of index lists
    (train order per epoch); val: write an in-order val epoch after each."""

    n = 0

    def __init__(self, epochs, bs=2, val=False, val_order=None, done=True, workers=0, tf="std", **args):
        Job.n += 1
        self.path = os.path.join(TMP, "job%d.jsonl" % Job.n)
        self.lines = []
        a = dict(batch_size=bs, val_batch_size=bs, epochs=len(epochs), transform=tf, drop_last=False,
                 break_after=0, val=val)
        a.update(args)
        self.lines.append({"start": True, "pid": 1000 + Job.n, "args": a, "train_len": TABLE.size("train")})
        nval = TABLE.size("val")
        for e, order in enumerate(epochs):
            self.epoch("train", e, order, a["batch_size"], tf)
            if val:
                self.epoch("val", e, val_order if val_order is not None else list(range(nval)), a["val_batch_size"],
                           tf, split="val")
        if done:
            self.lines.append({"done": True, "data_cpu_s": 0.1, "cpu_s": 1.0, "wall_s": 1.0,
                               "workers_started": workers, "workers_by_loader": {"train": workers} if workers else {}})

    def epoch(self, loader, e, order, bs, tf, split="train", end=True):
        k = 0
        for k, i in enumerate(range(0, len(order), bs)):
            idx = order[i:i + bs]
            self.lines.append({"loader": loader, "epoch": e, "batch": k, "n": len(idx),
                               "h": [H(j, split, tf) for j in idx], "y": [Y(j, split) for j in idx]})
        nb = -(-len(order) // bs)
        if end:
            self.lines.append({"loader": loader, "epoch": e, "end": True, "batches": nb,
                               "len": -(-TABLE.size(split) // bs)})

    def batches(self, loader="train"):
        return [d for d in self.lines if d.get("loader") == loader and "h" in d]

    def write(self, tail=""):
        with open(self.path, "w") as f:
            for d in self.lines:
                f.write(json.dumps(d) + "\n")
            f.write(tail)
        return self.path


def run(jobs, mode="shared", **kw):
    recs = [sv.read_record(j.write() if isinstance(j, Job) else j) for j in jobs]
    out = io.StringIO()
    n = sv.verify(recs, TABLE, mode, out=out, **kw)
    return n, out.getvalue()


P0 = [3, 0, 5, 1, 4, 2]  # the stream's epoch 0 (N = 6)
P1 = [2, 4, 0, 1, 5, 3]  # and epoch 1
P2 = [5, 4, 3, 2, 1, 0]  # other orders
P3 = [1, 3, 5, 0, 2, 4]


class Good(unittest.TestCase):
    def test_shared_any_batch_size(self):
        n, out = run([Job([P0, P1], bs=2), Job([P0, P1], bs=4), Job([P0, P1], bs=5, val=True)])
        self.assertEqual(n, 0, out)
        self.assertIn("verify: OK (jobs=3 epochs=8 ", out)

    def test_plain_own_orders(self):
        n, out = run([Job([P0, P1]), Job([P1, P0], bs=3)], mode="plain")
        self.assertEqual(n, 0, out)

    def test_late_joiner_and_takeover(self):
        late = Job([P0[2:], P1, [0, 1, 2, 3, 4, 5]], bs=4)  # joins at sample 2; its epoch 2 is its own
        n, out = run([Job([P0, P1]), late])
        self.assertEqual(n, 0, out)

    def test_late_joiner_one_epoch_later(self):
        n, out = run([Job([P0, P1], bs=3), Job([P1[4:]], bs=1)])
        self.assertEqual(n, 0, out)

    def test_killed_producer_partial_prefix(self):
        killed = Job([P0, P1[:3]], done=False, workers=2)  # SIGKILLed in its epoch 1, batch 1
        killed.lines = [d for d in killed.lines if not (d.get("epoch") == 1 and d.get("end"))]
        path = killed.write(tail='{"loader": "train", "epoch": 1, "bat')
        n, out = run([path, Job([P0, P1]), Job([P0, P1], bs=3)])
        self.assertEqual(n, 0, out)
        self.assertIn("partial last line ignored", out)

    def test_killed_late_joiner_window(self):
        # joined at sample 2 and SIGKILLed after 3 samples: a window of the stream epoch
        w = Job([P0[2:5]], bs=1, done=False)
        w.lines = [d for d in w.lines if not d.get("end")]
        n, out = run([Job([P0, P1]), w.write(), Job([P0, P1], bs=4)])
        self.assertEqual(n, 0, out)

    def test_late_joiner_makes_its_head_privately(self):
        # joined at sample 2: reads 2..5 from the stream, then makes 0 and 1 privately
        j = marked(Job([P0[2:] + [P0[1], P0[0]], P1]), 0, 2, pv=2)
        n, out = run([Job([P0, P1]), j, Job([P0, P1], bs=3)])
        self.assertEqual(n, 0, out)
        self.assertIn("stream positions 2..5, then 2 samples made privately", out)

    def test_late_joiner_finds_the_next_stream_epoch_gone(self):
        # making its head took longer than the stream's epoch 1: its next epoch is epoch 2
        j = marked(Job([P0[2:] + [P0[1], P0[0]], P2]), 0, 2, pv=2)
        n, out = run([Job([P0, P1, P2]), j])
        self.assertEqual(n, 0, out)
        self.assertIn("%s 2..2" % os.path.basename(j.path), out)

    def test_late_joiner_produces_its_next_epoch_alone(self):
        # the others ended while it made its head: it produced its next epoch,
        # in its own order, and nobody read it
        j = marked(marked(Job([P0[2:] + [P0[1], P0[0]], P2]), 0, 2, pv=2), 1, role=1)
        n, out = run([Job([P0, P1]), j])
        self.assertEqual(n, 0, out)
        self.assertIn("%s epochs 1..1: no other job read these stream epochs (it produced them)"
                      % os.path.basename(j.path), out)

    def test_late_joiner_gathers_its_head_from_the_next_epoch(self):
        # joined at sample 3: reads 3..5, makes P0[2] privately, then gathers
        # P0[0] and P0[1] from the stream's epoch 1 (in its order: 0, then 3);
        # its next epoch is the stream's epoch 2
        j = marked(marked(Job([P0[3:] + [P0[2], 0, 3], P2]), 0, 1, pv=1), 0, 2, gv=2)
        n, out = run([Job([P0, P1, P2]), j, Job([P0, P1, P2], bs=4)])
        self.assertEqual(n, 0, out)
        self.assertIn("stream positions 3..5, then 1 samples made privately and 2 gathered from the next stream "
                      "epoch", out)
        self.assertIn("%s 0..0, %s 2..2" % (os.path.basename(j.path), os.path.basename(j.path)), out)
        # the end of what it gathered (5, 3) went out with a sample it made after it (0: one the
        # stream epoch lacked, dropped with its last batch, say): gathered first, then made
        j = marked(Job([P0[3:] + [5, 3, 0], P2], bs=3), 0, 1, gv=2, pv=1)
        n, out = run([Job([P0, P1, P2]), j])
        self.assertEqual(n, 0, out)
        self.assertIn("then 1 samples made privately and 2 gathered from the next stream epoch", out)

    def test_late_joiner_killed_while_making_its_head(self):
        w = marked(Job([P0[2:] + [P0[1]]], bs=2, done=False), 0, 2, pv=1)
        w.lines = [d for d in w.lines if not d.get("end")]
        n, out = run([Job([P0, P1]), w, Job([P0, P1], bs=3)])
        self.assertEqual(n, 0, out)

    def test_late_joiners_both_make_their_heads_and_the_producer_dies(self):
        # pytorch_share case e, once: the producer is killed right after its
        # epoch 0; both late joiners made their heads privately, and one of them
        # produces the next epochs (role 1), which the other reads. No run links
        # stream epoch 0 to 1; before, the verifier placed the later runs at
        # epoch 0 and failed them ("differs from", "not after its previous")
        killed = Job([P0], done=False, workers=2)
        killed.lines = [d for d in killed.lines if not d.get("end")]
        j1 = marked(marked(marked(Job([P0[3:] + [P0[2], P0[1], P0[0]], P1, P2]), 0, 1, pv=1), 0, 2, pv=2), 1,
                    role=2)
        marked(j1, 2, role=2)
        j3 = marked(marked(marked(Job([P0[2:] + [P0[1], P0[0]], P1, P2]), 0, 2, pv=2), 1, role=1), 2, role=1)
        n, out = run([killed.write(), j1, j3])
        self.assertEqual(n, 0, out)
        self.assertIn("no job placed so far read these stream epochs; placed after its previous ones", out)
        self.assertIn("%s 1..2" % os.path.basename(j3.path), out)
        # the same records with the second run of one joiner out of the stream's order: still caught
        j3 = marked(marked(marked(Job([P0[2:] + [P0[1], P0[0]], P2, P1]), 0, 2, pv=2), 1, role=1), 2, role=1)
        n, out = run([killed.write(), j1, j3])
        self.assertGreater(n, 0, out)
        self.assertIn("differs from", out)

    def test_break_after(self):
        j = Job([P0[:4], P1[:4]], bs=2, break_after=2)
        n, out = run([j, Job([P0, P1])])
        self.assertEqual(n, 0, out)

    def test_break_in_the_first_epoch_only(self):
        j = Job([P0[:4], P1], bs=2, break_after=2, break_epochs=1)
        n, out = run([j, Job([P0, P1])])
        self.assertEqual(n, 0, out)

    def test_breaker_produces_its_next_epochs_alone(self):
        # it broke out of its first epoch (a checkpoint after it); the others
        # ended meanwhile, so it produced its next epochs, in its own order
        j = marked(marked(Job([P0[:4], P2, P3], bs=2, break_after=2, break_epochs=1), 1, role=1), 2, role=1)
        n, out = run([Job([P0, P1]), j])
        self.assertEqual(n, 0, out)
        self.assertIn("%s epochs 1..2: no other job read these stream epochs (it produced them)"
                      % os.path.basename(j.path), out)

    def test_workers(self):
        prod, cons = Job([P0], workers=2), Job([P0])
        n, out = run([prod, cons], workers_zero=[cons.path], one_producer=True)
        self.assertEqual(n, 0, out)


class Broken(unittest.TestCase):
    def fails(self, jobs, *needles, mode="shared", **kw):
        n, out = run(jobs, mode=mode, **kw)
        self.assertGreater(n, 0, out)
        self.assertIn("verify: FAILED (%d problems)" % n, out)
        for s in needles:
            self.assertIn(s, out)
        return out

    def test_duplicate_sample(self):
        out = self.fails([Job([[3, 0, 5, 3, 4, 2]])], "twice in the epoch", "missing", mode="plain")
        self.assertIn("loader=train epoch=0 batch=1", out)

    def test_wrong_label(self):
        j = Job([P0, P1])
        b = j.batches()[1]
        b["y"][0] = 1 - b["y"][0]
        out = self.fails([j], "label %d paired with sample %s" % (b["y"][0], b["h"][0]), mode="plain")
        self.assertIn("epoch=0 batch=1", out)

    def test_missing_sample(self):
        self.fails([Job([P0, P1[:5]])], "1 of 6 train images missing", mode="plain")
        # shared: a short later epoch is missing samples; a short first epoch
        # that is not a suffix of the others' is not a late join
        self.fails([Job([P0, P1[:5]]), Job([P0, P1])], "1 of 6 train images missing")
        self.fails([Job([P0[:5], P1]), Job([P0, P1])], "differs from", "stream position")

    def test_consumer_shifted_by_one(self):
        shifted = [P0[1:] + P0[:1], P1[1:] + P1[:1]]
        out = self.fails([Job([P0, P1]), Job([P0, P1], bs=3), Job(shifted, bs=3)], "differs from")
        self.assertIn("job", out.split("FAIL ", 1)[1].split(":")[0])
        self.assertEqual(run([Job([P0, P1]), Job(shifted)], mode="plain")[0], 0)

    def test_consumer_swapped_pair(self):
        swapped = [[3, 0, 5, 1, 2, 4], P1]
        self.fails([Job([P0, P1]), Job(swapped)], "stream position 4")

    def test_truncated_record_not_a_prefix(self):
        cut = Job([P0, [4, 0, 2]], done=False)
        cut.lines = [d for d in cut.lines if not (d.get("epoch") == 1 and d.get("end"))]
        path = cut.write(tail='{"loader":')
        self.fails([path, Job([P0, P1])], "differs from", "stream epoch 1")

    def test_truncated_record_with_done_needs_end_lines(self):
        j = Job([P0, P1])
        j.lines = [d for d in j.lines if not (d.get("epoch") == 1 and d.get("end"))]
        self.fails([j], "epoch has no end line", mode="plain")

    def test_killed_late_joiner_bad_window(self):
        w = Job([[P0[2], P0[4], P0[5]]], bs=1, done=False)
        w.lines = [d for d in w.lines if not d.get("end")]
        self.fails([Job([P0, P1]), w.write()], "order differs")

    def test_late_joiner_head_not_what_it_made(self):
        # rotated by 2, but the record says 1 sample was made privately
        j = marked(Job([P0[2:] + [P0[1], P0[0]], P1]), 0, 2, pv=1)
        self.fails([Job([P0, P1]), j], "differs from")
        # 2 made privately, but the part read from the stream is not the stream's suffix
        j = marked(Job([[P0[3], P0[2]] + P0[4:] + [P0[1], P0[0]], P1]), 0, 2, pv=2)
        self.fails([Job([P0, P1]), j], "differs from")
        # killed while making it: what it read of the stream must still be the suffix
        w = marked(Job([[P0[3], P0[2], P0[4], P0[5], P0[1]]], bs=2, done=False), 0, 2, pv=1)
        w.lines = [d for d in w.lines if not d.get("end")]
        self.fails([Job([P0, P1]), w], "differs from")

    def test_gathered_head_not_the_next_epochs(self):
        # gathered out of the stream's order
        j = marked(marked(Job([P0[3:] + [P0[2], 3, 0], P2]), 0, 1, pv=1), 0, 2, gv=2)
        self.fails([Job([P0, P1, P2]), j], "2 gathered samples are not", "in its order")
        # its next epoch is the stream epoch it gathered from (it read it twice)
        j = marked(marked(Job([P0[3:] + [P0[2], 0, 3], P1]), 0, 1, pv=1), 0, 2, gv=2)
        self.fails([Job([P0, P1, P2]), j], "epoch 1 is stream epoch 1, which its epoch 0 gathered from")

    def test_epochs_after_a_private_head_go_back_in_the_stream(self):
        j = marked(Job([P1[2:] + [P1[1], P1[0]], P0]), 0, 2, pv=2)
        self.fails([Job([P0, P1, P2]), j], "not after its previous epoch's")

    def test_epoch_after_a_private_head_neither_read_nor_produced(self):
        # its next epoch is nobody's: as a consumer (or with no role known) it
        # must be the stream's; produced, it must still be produced whole
        for role in (2, None):
            j = marked(marked(Job([P0[2:] + [P0[1], P0[0]], P2]), 0, 2, pv=2), 1, role=role)
            self.fails([Job([P0, P1]), j], "differs from", "stream epoch 1")
        j = marked(marked(Job([P0[2:] + [P0[1], P0[0]], P2[:5]]), 0, 2, pv=2), 1, role=1)
        self.fails([Job([P0, P1]), j], "1 of 6 train images missing")

    def test_breaker_next_epochs_neither_read_nor_produced(self):
        # as test_breaker_produces_its_next_epochs_alone, but read as a consumer:
        # they must be the stream's
        j = marked(marked(Job([P0[:4], P2, P3], bs=2, break_after=2, break_epochs=1), 1, role=2), 2, role=2)
        self.fails([Job([P0, P1]), j], "differs from", "stream epoch 1")

    def test_late_joiner_not_a_suffix(self):
        self.fails([Job([P0, P1]), Job([P0[1:4], P1], bs=1)], "differs from")

    def test_late_joiner_next_epoch_differs(self):
        self.fails([Job([P0, P1]), Job([P0[2:], P2], bs=2)], "differs from", "stream epoch 1")
        # a late joiner's first epoch must be placed against another job's
        self.fails([Job([P0, P1]), Job([P0[2:], P0], bs=2)], "no other job's epoch confirms as a late join")

    def test_short_first_epoch_alone(self):
        self.fails([Job([P0[2:], P1])], "no other job to confirm")

    def test_not_shared_at_all(self):
        out = self.fails([Job([P0, P1]), Job([P2, P3])], "differs from")
        self.assertIn("epoch=0", out)
        self.assertIn("epoch=1", out)

    def test_wrong_split_and_unknown(self):
        j = Job([P0])
        j.lines[1]["h"][0] = H(0, "val")
        j.lines[2]["h"][1] = "0123456789abcdef"
        self.fails([j], "not a train image", "unknown sample 0123456789abcdef", mode="plain")

    def test_wrong_transform(self):
        j = Job([P0])
        j.lines[1]["h"][0] = H(P0[0], "train", "other")
        self.fails([j], "made with transform other, the job uses std", mode="plain")

    def test_batch_sizes(self):
        j = Job([P0])
        j.lines[1:4] = [{"loader": "train", "epoch": 0, "batch": 0, "n": 1, "h": [H(3)], "y": [Y(3)]},
                        {"loader": "train", "epoch": 0, "batch": 1, "n": 2, "h": [H(0), H(5)], "y": [Y(0), Y(5)]},
                        {"loader": "train", "epoch": 0, "batch": 2, "n": 3, "h": [H(1), H(4), H(2)],
                         "y": [Y(1), Y(4), Y(2)]}]
        self.fails([j], "batch has 1 samples, batch size 2", "last batch has 3 samples", mode="plain")

    def test_missing_epoch(self):
        j = Job([P0, P1])
        j.lines[0]["args"]["epochs"] = 3
        self.fails([j], "2 complete epochs, the job ran --epochs 3", mode="plain")

    def test_val_order(self):
        self.fails([Job([P0], val=True, val_order=[1, 0])], "val epoch is not the val split in ImageFolder order",
                   mode="plain")

    def test_whole_epoch_after_the_breaking_ones(self):
        j = Job([P0[:4], P1[:5]], bs=2, break_after=2, break_epochs=1)
        self.fails([j, Job([P0, P1])], "1 of 6 train images missing")

    def test_break_after_count(self):
        self.fails([Job([P0[:2]], bs=2, break_after=2)], "1 batches with --break-after 2", mode="plain")

    def test_workers_expectations(self):
        a, b = Job([P0], workers=2), Job([P0], workers=2)
        self.fails([a, b], "started 2 DataLoader workers, expected none",
                   "train loader: 2 jobs started workers", workers_zero=[b.path], one_producer=True)


class EndToEnd(unittest.TestCase):
    def test_real_job_and_cli(self):
        rec = os.path.join(TMP, "real.jsonl")
        r = subprocess.run([sys.executable, os.path.join(HERE, "share_job.py"), "--root", ROOT, "--seed", "3",
                            "--batch-size", "4", "--epochs", "2", "--workers", "1", "--val", "--model", "b",
                            "--record", rec], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"job: batches=4 samples=12 epochs=2 cpu_s=[0-9.]+ wall_s=[0-9.]+")
        with open(rec) as f:
            done = json.loads(f.read().splitlines()[-1])
        self.assertEqual(done["workers_started"], 4)  # 1 worker per epoch, train and val
        v = os.path.join(HERE, "share_verify.py")
        cache = os.path.join(TMP, "table.json")
        r = subprocess.run([sys.executable, v, "--root", ROOT, "--mode", "plain", "--cache", cache, rec],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("verify: OK (jobs=1 epochs=4 batches=6 samples=16)", r.stdout)
        r = subprocess.run([sys.executable, v, "--root", ROOT, "--cache", cache, "--expect-workers-zero", rec, rec],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("started 4 DataLoader workers, expected none", r.stdout)
        r = subprocess.run([sys.executable, v, "--help"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0)
        self.assertIn("--expect-workers-zero", r.stdout)


if __name__ == "__main__":
    unittest.main()
