# SPDX-License-Identifier: MIT
"""A job whose batches cost next to nothing to make: what the DataLoader
layer costs a batch shows whole (scripts/bench.py, configuration tiny1).

  python3 tests/py/tiny_job.py [--batches N] [--batch-size B] [--barrier DIR:N]

An in-memory dataset of 40,000 samples of 16 floats and a label, shuffled,
no workers; N batches (10,000 by default, one epoch at batch size 4) taken
in epochs, each checked whole. Prints
  job: batches=N samples=M startup_cpu_s=Z
"""
import argparse
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Tiny(Dataset):
    def __len__(self):
        return 40000

    def __getitem__(self, i):
        return torch.full((16,), float(i)), i


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=10000)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--barrier", metavar="DIR:N", help="wait for N jobs to reach DIR before the first batch")
    a = ap.parse_args()
    startup_cpu = time.process_time()
    dl = DataLoader(Tiny(), batch_size=a.batch_size, shuffle=True)
    if a.barrier:
        d, n = a.barrier.rsplit(":", 1)
        os.makedirs(d, exist_ok=True)
        open(os.path.join(d, str(os.getpid())), "w").close()
        deadline = time.monotonic() + 60
        while len(os.listdir(d)) < int(n) and time.monotonic() < deadline:
            time.sleep(0.01)
    batches = samples = 0
    while batches < a.batches:
        for x, y in dl:
            if not bool((x[:, 0] == y.to(x.dtype)).all()):
                sys.exit("tiny_job: a sample and its label disagree")
            batches += 1
            samples += len(y)
            if batches == a.batches:
                break
    print("job: batches=%d samples=%d startup_cpu_s=%.3f" % (batches, samples, startup_cpu))


if __name__ == "__main__":
    main()
