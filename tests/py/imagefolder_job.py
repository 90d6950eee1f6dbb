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


def wait_barrier(spec):
    """Start together: say we are ready in DIR, then wait for N of us."""
    d, n = spec.rsplit(":", 1)
    open(os.path.join(d, "ready.%d" % os.getpid()), "w").close()
    end = time.monotonic() + 60
    while len([f for f in os.listdir(d) if f.startswith("ready.")]) < int(n) and time.monotonic() < end:
        time.sleep(0.01)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("root", help="ImageFolder root, e.g. DATA/train")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--records", action="store_true", help="print one line per batch")
    ap.add_argument("--no-generator", action="store_true",
                    help="no generator of the loader's own: it draws from torch's default one")
    ap.add_argument("--model-draws", type=int, default=0,
                    help="draw this many numbers from torch's default generator before the loader is "
                         "iterated (a model's initialisation)")
    ap.add_argument("--step-draws", action="store_true",
                    help="draw from torch's default generator after every batch (a training step's "
                         "dropout) and print the job's generators after each epoch")
    ap.add_argument("--sleep", type=float, default=0.0, help="seconds of 'training' after every batch")
    ap.add_argument("--batches", type=int, default=0, help="leave each epoch after this many batches")
    ap.add_argument("--start-delay", type=float, default=0.0, help="sleep this long before the first iter()")
    ap.add_argument("--keep", action="store_true", help="keep every batch until the job ends")
    ap.add_argument("--barrier", metavar="DIR:N",
                    help="before the first iter(), wait (60 s at most) until N jobs are ready in DIR")
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
    g = None
    if not a.no_generator:
        g = torch.Generator()
        g.manual_seed(a.seed)
    dl = DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=a.workers, generator=g)
    if a.model_draws:
        torch.rand(a.model_draws)
    if a.barrier:
        wait_barrier(a.barrier)
    if a.start_delay:
        time.sleep(a.start_delay)

    total = hashlib.sha256()
    batches = samples = 0
    kept = []
    t0 = time.monotonic()
    for epoch in range(a.epochs):
        for i, (images, labels) in enumerate(dl):
            h = hashlib.sha256(images.numpy().tobytes())
            h.update(labels.numpy().tobytes())
            if a.step_draws:
                h.update(torch.rand(3).numpy().tobytes())
            total.update(h.digest())
            if a.records:
                print(f"batch {batches} epoch {epoch} n={len(labels)} {h.hexdigest()[:16]}", flush=True)
            batches += 1
            samples += len(labels)
            if a.keep:
                kept.append((images, labels))
            if a.sleep:
                time.sleep(a.sleep)
            if a.batches and i + 1 >= a.batches:
                break
        if a.step_draws:
            state = hashlib.sha256(torch.get_rng_state().numpy().tobytes())
            if g is not None:
                state.update(g.get_state().numpy().tobytes())
            print(f"epoch {epoch} generators {state.hexdigest()[:16]}", flush=True)
    wall = time.monotonic() - t0
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    print(f"job: batches={batches} samples={samples} checksum={total.hexdigest()[:32]} "
          f"cpu_s={cpu:.3f} wall_s={wall:.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
