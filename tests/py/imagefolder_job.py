"""A plain torchvision ImageFolder training-input job, as a user writes it.

Nothing here knows about tsshim. It iterates a DataLoader and prints, per
batch, a checksum of the image and label tensors, then one summary line:

    job: batches=N samples=M checksum=HEX cpu_s=X wall_s=Y

cpu_s counts this process and its DataLoader workers (user + system).
"""
import argparse
import hashlib
import os
import resource
import sys
import time

import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("root", help="ImageFolder root, e.g. DATA/train")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--records", action="store_true", help="print one line per batch")
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    torch.set_num_threads(1)
    tf = transforms.Compose([
        transforms.RandomResizedCrop(a.size),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    ds = datasets.ImageFolder(a.root, transform=tf)
    g = torch.Generator()
    g.manual_seed(a.seed)
    dl = DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=a.workers, generator=g)

    total = hashlib.sha256()
    batches = samples = 0
    t0 = time.monotonic()
    for epoch in range(a.epochs):
        for images, labels in dl:
            h = hashlib.sha256(images.numpy().tobytes())
            h.update(labels.numpy().tobytes())
            total.update(h.digest())
            if a.records:
                print(f"batch {batches} epoch {epoch} n={len(labels)} {h.hexdigest()[:16]}")
            batches += 1
            samples += len(labels)
    wall = time.monotonic() - t0
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    print(f"job: batches={batches} samples={samples} checksum={total.hexdigest()[:32]} "
          f"cpu_s={cpu:.3f} wall_s={wall:.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
