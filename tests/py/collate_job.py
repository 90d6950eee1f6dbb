"""A job of tests/scenarios/collate_dims.sh: a shuffled DataLoader whose batches
are not samples along dim 0 (--shape seqfirst: sequence first, [T, B];
twoview: two views concatenated, [2B, ...]; filter: a collate that drops the
samples the dataset returns as None) or whose workers set the data
(winit: a worker_init_fn sets an offset read from $OFF). Writes one JSON line
per epoch: len(loader), the batches taken (range(len(loader)) next() calls,
as training loops do), their shapes, the dataset indices of their samples and
whether every sample was paired with its label and its own data."""
import argparse
import json
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset, default_collate, get_worker_info

OFF = float(os.environ.get("OFF", "0"))


class Items(Dataset):
    def __init__(self, shape, n=64):
        self.shape, self.n, self.offset = shape, n, 0.0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.shape == "seqfirst":
            return torch.arange(12) + 1000 * i, torch.full((12,), i)
        if self.shape == "filter" and i % 10 == 3:
            return None
        return torch.full((3,), i + self.offset), i


def seq_first(samples):
    return torch.stack([a for a, _ in samples], 1), torch.stack([b for _, b in samples], 1)


def two_views(samples):
    x, y = default_collate(samples)
    return torch.cat([x, x + 0.5]), torch.cat([y, y])


def drop_none(samples):
    return default_collate([s for s in samples if s is not None])


def set_offset(worker_id):
    get_worker_info().dataset.offset = OFF


def ids_of(shape, x, y):
    """(dataset indices, paired) of one batch."""
    if shape == "seqfirst":
        ids = y[0].tolist()
        t = torch.arange(x.shape[0]).unsqueeze(1)
        return ids, bool((x == 1000 * y + t).all()) and bool((y == y[0]).all())
    if shape == "twoview":
        b = x.shape[0] // 2
        ids = y[:b].tolist()
        ok = bool((y[:b] == y[b:]).all()) and bool((x[:b, 0] == y[:b]).all()) and \
            bool((x[b:, 0] == y[b:] + 0.5).all())
        return ids, ok
    return y.tolist(), bool((x[:, 0] - y == OFF).all())


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shape", required=True, choices=["seqfirst", "twoview", "filter", "winit"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--start-delay", type=float, default=0.0, help="seconds before the first iter()")
    ap.add_argument("--barrier", metavar="DIR:N", help="before the first iter(), wait for N jobs to reach DIR")
    ap.add_argument("--after", metavar="FILE", help="before the first iter(), wait (up to 60 s) for FILE")
    ap.add_argument("--mark", metavar="FILE", help="create FILE once the first batch is made")
    ap.add_argument("--sleep", type=float, default=0.1, help="seconds per batch (default 0.1)")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    kw = {"seqfirst": dict(collate_fn=seq_first), "twoview": dict(collate_fn=two_views),
          "filter": dict(collate_fn=drop_none),
          "winit": dict(num_workers=2, worker_init_fn=set_offset)}[args.shape]
    dl = DataLoader(Items(args.shape), batch_size=args.batch_size, shuffle=True, **kw)
    out = open(args.out, "w", buffering=1)
    if args.barrier:
        d, n = args.barrier.rsplit(":", 1)
        open(os.path.join(d, str(os.getpid())), "w").close()
        t0 = time.monotonic()
        while len(os.listdir(d)) < int(n) and time.monotonic() - t0 < 30:
            time.sleep(0.005)
    time.sleep(args.start_delay)
    t0 = time.monotonic()
    while args.after and not os.path.exists(args.after) and time.monotonic() - t0 < 60:
        time.sleep(0.005)
    for ep in range(args.epochs):
        it = iter(dl)
        ids, paired, shapes = [], True, []
        for _ in range(len(dl)):
            x, y = next(it)
            got, ok = ids_of(args.shape, x, y)
            ids += got
            paired = paired and ok
            shapes.append(list(x.shape))
            if args.mark and not os.path.exists(args.mark):
                open(args.mark, "w").close()
            time.sleep(args.sleep)
        out.write(json.dumps({"epoch": ep, "len": len(dl), "batches": len(shapes), "shapes": shapes,
                              "ids": sorted(ids), "paired": paired}) + "\n")


if __name__ == "__main__":
    main()
