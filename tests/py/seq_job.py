"""A job of tests/scenarios/sequential.sh: a DataLoader in index order
(shuffle=False) over samples that carry their own index. Writes one JSON line
per epoch: the dataset indices in the order the job got them, how many
batches, whether every sample was paired with its label, and how many
samples tsshim's layer made privately in it (pv) so far."""
import argparse
import json
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Numbered(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((32,), float(i)), i


def wait_file(path, limit=60.0):
    t0 = time.monotonic()
    while not os.path.exists(path) and time.monotonic() - t0 < limit:
        time.sleep(0.01)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True, help="JSON lines, one per epoch")
    ap.add_argument("--n", type=int, default=400, help="samples (default 400)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--drop-last", action="store_true")
    ap.add_argument("--sleep", type=float, default=0.0, help="seconds per batch")
    ap.add_argument("--go", help="wait for this file before the first iter()")
    ap.add_argument("--mark", action="append", default=[],
                    help="PATH:K: write our pid to PATH after K batches of epoch 0 (may be repeated)")
    ap.add_argument("--wait", help="PATH:K: after K batches of epoch 0, wait (up to 60 s) for PATH")
    args = ap.parse_args()
    dl = DataLoader(Numbered(args.n), batch_size=args.batch_size, shuffle=False, num_workers=args.workers,
                    drop_last=args.drop_last)
    marks = [(p, int(k)) for p, k in (m.rsplit(":", 1) for m in args.mark)]
    wait, wait_at = args.wait.rsplit(":", 1) if args.wait else (None, 0)
    if args.go:
        wait_file(args.go)
    out = open(args.out, "w", buffering=1)
    for ep in range(args.epochs):
        ids, paired, batches = [], True, 0
        for x, y in dl:
            paired = paired and x[:, 0].long().tolist() == y.tolist()
            ids += y.tolist()
            batches += 1
            for mark, after in marks:
                if ep == 0 and batches == after:
                    with open(mark + ".tmp", "w") as f:
                        f.write("%d\n" % os.getpid())
                    os.rename(mark + ".tmp", mark)
            if wait and ep == 0 and batches == int(wait_at):
                wait_file(wait)
            print(ep, batches, flush=True)  # progress: epoch, batches so far
            time.sleep(args.sleep)
        st = dl.__dict__.get("_tsshim_state")
        out.write(json.dumps({"epoch": ep, "ids": ids, "batches": batches, "paired": paired,
                              "pv": getattr(st, "private_samples", None)}) + "\n")


if __name__ == "__main__":
    main()
