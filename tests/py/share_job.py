"""A plain PyTorch training job over a tsshim-mkdata dataset, as a user writes it.

Nothing here knows about tsshim except the recording, which the shared-loader
scenario (tests/scenarios/pytorch_share.sh) and its verifier
(tests/py/share_verify.py) read. It trains a tiny model (SGD: forward, loss,
backward, step) on torchvision ImageFolder(ROOT/train) with shuffle=True and,
with --val, iterates ImageFolder(ROOT/val) in order (shuffle=False) after
each training epoch. Transforms are deterministic, so every sample is known
by the sha1 of its image tensor.

Record (--record FILE): JSON lines, flushed one by one (a SIGKILLed job
leaves at most a partial last line):
  {"start": true, "pid": P, "args": {...}, "train_len": N, "val_len": M,
   "classes": [...]}                                       first line
  {"loader": "train"|"val", "epoch": e, "batch": i, "n": len,
   "h": [16 hex digits of sha1(float32 contiguous bytes of each sample)],
   "y": [labels], "loss": x, "t": monotonic seconds}       per yielded batch
    (with tsshim's PyTorch layer, train batches also carry "pv": how many of
    the batch's samples the layer made privately, the last ones, as for a
    late joiner's head; "gv": how many it gathered from the stream's next
    epoch, the ones just before those; and "role": the layer's role then,
    1 producer, 2 consumer)
  {"loader": ..., "epoch": e, "end": true, "batches": k, "len": len(loader)}
                                                           after each epoch
                                                           (+ "rng": torch.rand() with --rng-probe)
  {"done": true, "data_cpu_s": X, "main_data_cpu_s": Xm, "worker_cpu_s": Xw,
   "cpu_s": Y, "wall_s": Z, "workers_started": W,
   "workers_by_loader": {"train": Wt, "val": Wv}}          last line

CPU accounting:
  data_cpu_s    = main_data_cpu_s + worker_cpu_s, the CPU the TRAINING input
                  pipeline cost this job:
  main_data_cpu_s  this process's CPU (time.process_time: all its threads)
                  spent inside iter() and next() on the train loader;
  worker_cpu_s  the CPU of the train loader's worker processes: each worker
                  (fork or spawn alike) registers, from worker_init_fn, a
                  multiprocessing.util.Finalize that appends "PID LOADER CPU"
                  (its own getrusage(RUSAGE_SELF)) to FILE.workers-cpu when it
                  leaves its loop; a worker killed before that (rare: the
                  DataLoader terminates workers that do not leave in time)
                  is missing from the sum.
  cpu_s         all CPU of the job: getrusage(SELF) + getrusage(CHILDREN),
                  taken after the loaders are gone (workers joined).
  workers_started  worker processes started for this job's loaders: the
                  lines "PID LOADER" that worker_init_fn appended to
                  FILE.workers (truncated at start). worker_init_fn is a plain
                  module-level function; it finds the file and the loader name
                  in os.environ (SHARE_JOB_WORKERS, SHARE_JOB_LOADER), set
                  before each iter(): fork copies the environment, spawn
                  passes it on. Each worker also appends "LOADER ID SEED" to
                  FILE.workers-seed: its torch.initial_seed(), the iterator's
                  base seed + ID.

With --emu-cuda LIB (a CUDA runtime: tsemu, the test device, in the tests),
each training batch is uploaded right after next(), as `x.cuda()` would do it
(cudaMemcpyAsync host to device on a stream, through ctypes: Debian's torch
has no CUDA), then read back and compared with the host tensor. Batch lines
then also carry "dev": 1 when the device bytes equal the host bytes, "up"
(bytes uploaded), "xb" (of them, the images'), "h2d" (of them, the bytes that
went host to device: the rest was served device to device), "mut": 1 when the batch was
changed in place before its upload (--mutate-before-upload), and "role" (the
loader's role in the layer at that batch: 1 producer, 2 consumer, null not
shared); the done line carries "gpu": the runtime's h2d/d2d/peer byte counts
of this process since its first upload (a model-sized tensor, as a GPU job
moves its model before the loop: the shim serves batches only then).
With --torch-cuda the uploads are torch's own, x.to("cuda") on a real GPU
(scripts/gpu-check.sh): the same fields but "h2d", and "gpu" is null.

Prints one line at the end (training loader only):
  job: batches=N samples=M epochs=E cpu_s=X wall_s=Y startup_cpu_s=Z
(Z: this process's CPU before its first epoch: interpreter, torch, datasets, model)
"""
import argparse
import hashlib
import json
import os
import resource
import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, default_collate
from torchvision import datasets, transforms

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
ENV_WORKERS = "SHARE_JOB_WORKERS"
ENV_LOADER = "SHARE_JOB_LOADER"
ENV_MAIN = "SHARE_JOB_MAIN"  # the job's pid, for its workers' watchdog
ENV_WORKER_START = "SHARE_JOB_WORKER_START"  # --worker-start, for the workers


def make_transform(name):
    """The deterministic transforms; share_verify.py uses these very ones."""
    if name == "std":
        steps = [transforms.Resize(40), transforms.CenterCrop(32)]
    elif name == "other":
        steps = [transforms.Resize(40), transforms.CenterCrop(28), transforms.Resize(32)]
    elif name == "train224":  # the usual ImageNet training pipeline (random: not for the verifier)
        steps = [transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip()]
    else:
        raise ValueError("unknown transform %r" % name)
    return transforms.Compose(steps + [transforms.ToTensor(), transforms.Normalize(MEAN, STD)])


def sample_hash(t):
    """16 hex digits: sha1 of one sample's image tensor, float32 contiguous bytes."""
    t = t.detach().to("cpu", torch.float32).contiguous()
    return hashlib.sha1(t.numpy().tobytes()).hexdigest()[:16]


def make_model(kind, classes):
    if kind == "a":  # linear
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, classes))
    if kind == "b":  # small conv net
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(16, classes))
    if kind == "c":  # two-layer MLP
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 64), nn.ReLU(), nn.Linear(64, classes))
    raise ValueError("unknown model %r" % kind)


# --- worker bookkeeping: module-level, so spawn can pickle it by name -----------

def _worker_exit(path, loader):
    try:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        with open(path, "a") as f:
            f.write("%d %s %.6f\n" % (os.getpid(), loader, ru.ru_utime + ru.ru_stime))
    except OSError:
        pass


class JobWatchdog:
    """PyTorch's ManagerWatchdog, told the job's pid instead of taking
    os.getppid() when the worker loop starts: a worker that starts after its
    job died (killed while spawning it) takes init's pid as its manager's and
    never sees the death. Measured without the shim: 3 of 3 spawned workers of
    a job killed as they started were still waiting 12 s later; in stress.py
    under ASan (slow spawns) such workers outlived their round."""

    def __init__(self):
        self.manager_pid = int(os.environ.get(ENV_MAIN) or os.getppid())
        self.manager_dead = False

    def is_alive(self):
        if not self.manager_dead:
            self.manager_dead = os.getppid() != self.manager_pid
        return not self.manager_dead


def worker_init(worker_id):
    # _worker_loop makes its watchdog after calling us, by this global's name
    import torch.utils.data._utils.worker as torch_worker
    if os.name == "posix" and os.environ.get(ENV_MAIN):
        torch_worker.ManagerWatchdog = JobWatchdog
    start = float(os.environ.get(ENV_WORKER_START) or 0)
    if start > 0:
        time.sleep(start)
    path = os.environ.get(ENV_WORKERS)
    if not path:
        return
    loader = os.environ.get(ENV_LOADER, "?")
    with open(path, "a") as f:  # one short write in append mode: no interleaving
        f.write("%d %s\n" % (os.getpid(), loader))
    with open(path + "-seed", "a") as f:
        f.write("%s %d %d\n" % (loader, worker_id, torch.initial_seed()))
    import multiprocessing.util
    multiprocessing.util.Finalize(None, _worker_exit, args=(path + "-cpu", loader), exitpriority=100)


class JobLoader(DataLoader):
    """A DataLoader subclass, the way Lightning and friends write them."""

    def __init__(self, dataset, *args, **kwargs):
        self.job_iters = 0
        super().__init__(dataset, *args, **kwargs)

    def __iter__(self):
        self.job_iters += 1
        return super().__iter__()


class EmuUploads:
    """Batch uploads through a CUDA runtime loaded with ctypes, read back and compared."""

    H2D, D2H = 1, 2

    def __init__(self, lib, default_stream=False, queue_mb=0, device=0):
        import ctypes
        self.c = ctypes
        rt = self.rt = ctypes.CDLL(lib)
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        rt.cudaMalloc.argtypes = [ctypes.POINTER(vp), sz]
        rt.cudaMemcpy.argtypes = [vp, vp, sz, ctypes.c_int]
        rt.cudaMemcpyAsync.argtypes = [vp, vp, sz, ctypes.c_int, vp]
        rt.cudaStreamCreate.argtypes = [ctypes.POINTER(vp)]
        rt.cudaStreamSynchronize.argtypes = [vp]
        self.stream = vp()
        self.device = device  # uploads go there; device 0 is current otherwise, as with .to("cuda:1")
        if rt.cudaSetDevice(device) or (not default_stream and rt.cudaStreamCreate(ctypes.byref(self.stream))) \
                or rt.cudaSetDevice(0):
            raise SystemExit("emu-cuda: no device")
        self.bufs = {}
        self.queue = None
        if queue_mb:  # work queued on the stream before each batch upload (a training step's)
            rt.cudaHostAlloc.argtypes = [ctypes.POINTER(vp), sz, ctypes.c_uint]
            self.queue_n = int(queue_mb * 2**20)
            self.queue = vp()
            if rt.cudaHostAlloc(ctypes.byref(self.queue), self.queue_n, 0):
                raise SystemExit("emu-cuda: cudaHostAlloc failed")
        self.call_ms = 0.0
        self.upload(torch.zeros(1024))  # the model's parameters, as a GPU job moves them first
        self.base = self.stats(raw=True)  # counted apart: stats() are the batches' bytes

    def buf(self, n):
        if n not in self.bufs:
            p = self.c.c_void_p()
            if self.rt.cudaMalloc(self.c.byref(p), n):
                raise SystemExit("emu-cuda: cudaMalloc(%d) failed" % n)
            self.bufs[n] = p.value
        return self.bufs[n]

    def upload(self, t):
        """(device bytes == host bytes, bytes uploaded)"""
        if self.device == 0:
            return self._upload(t)
        self.rt.cudaSetDevice(self.device)  # PyTorch's device guard around a copy to cuda:N
        try:
            return self._upload(t)
        finally:
            self.rt.cudaSetDevice(0)

    def _upload(self, t):
        n = t.numel() * t.element_size()
        dev = self.buf(n)
        if self.queue is not None and \
                self.rt.cudaMemcpyAsync(self.buf(self.queue_n), self.queue, self.queue_n, self.H2D, self.stream):
            return False, n
        t0 = time.monotonic()
        if self.rt.cudaMemcpyAsync(dev, t.data_ptr(), n, self.H2D, self.stream):
            return False, n
        self.call_ms += (time.monotonic() - t0) * 1000
        if self.rt.cudaStreamSynchronize(self.stream):
            return False, n
        back = torch.empty_like(t)
        if self.rt.cudaMemcpy(back.data_ptr(), dev, n, self.D2H):
            return False, n
        return back.numpy().tobytes() == t.numpy().tobytes(), n

    def stats(self, raw=False):
        class St(self.c.Structure):  # struct tsemu_stats (tools/cudaemu/tsemu.h), then room to spare
            _fields_ = [("version", self.c.c_uint32), ("devices", self.c.c_uint32)] + \
                [(k, self.c.c_uint64) for k in ("h2d_bytes", "d2h_bytes", "d2d_bytes", "peer_bytes", "h2h_bytes")] + \
                [("rest", self.c.c_uint64 * 256)]
        st = St()
        self.rt.tsemu_stats(self.c.byref(st))
        out = {"h2d_bytes": st.h2d_bytes, "d2d_bytes": st.d2d_bytes, "peer_bytes": st.peer_bytes}
        return out if raw else {k: v - self.base[k] for k, v in out.items()}


class TorchUploads:
    """--torch-cuda: batch uploads as a GPU job makes them, x.to("cuda", non_blocking=pinned)
    through torch's own CUDA (a real GPU: scripts/gpu-check.sh), read back and
    compared. No copy counters: the shim's exit line (TSSHIM_LOG=debug) says how
    many uploads it served from the GPU ring."""

    def __init__(self, device=0, non_blocking=False):
        self.dev = torch.device("cuda", device)
        self.non_blocking = non_blocking
        self.call_ms = 0.0
        torch.zeros(1024).to(self.dev)  # the model's parameters, as a GPU job moves them first
        torch.cuda.synchronize(self.dev)

    def upload(self, t):
        """(device bytes == host bytes, bytes uploaded)"""
        n = t.numel() * t.element_size()
        t0 = time.monotonic()
        d = t.to(self.dev, non_blocking=self.non_blocking)
        self.call_ms += (time.monotonic() - t0) * 1000
        back = d.cpu()  # waits for the upload
        return back.numpy().tobytes() == t.numpy().tobytes(), n

    def stats(self, raw=False):
        return None


def dict_collate(samples):
    """--dict-batch: the batch as {"y": labels, "x": images}, in that order (not
    sorted), unpacked by position as `y, x = batch.values()`."""
    x, y = default_collate(samples)
    return {"y": y, "x": x}


def fetch_ahead(it):
    """The batches of `it`, each yielded once the next one has been fetched."""
    try:
        prev = next(it)
    except StopIteration:
        return
    for batch in it:
        yield prev
        prev = batch
    yield prev


def interrupt_at(k):
    """The k-th image loaded in this process raises KeyboardInterrupt, inside
    Pillow (where Ctrl-C lands most often in such a job): the dataset, its
    loader function and transform (the layer's key) stay what they are."""
    from PIL import Image
    convert, loads = Image.Image.convert, [0]

    def converting(self, *args, **kw):
        loads[0] += 1
        if loads[0] == k:
            raise KeyboardInterrupt
        return convert(self, *args, **kw)
    Image.Image.convert = converting


def layer_role():
    """The shared loader's role in tsshim's PyTorch layer (1 producer, 2 consumer), or None."""
    tf = sys.modules.get("tsshim_feed")
    for f in getattr(tf, "_feeds", {}).values():
        return f.role()
    return None


def layer_private(dl, what="private_samples"):
    """Samples of dl's shared epochs the layer made privately (gathered_samples:
    gathered from a later stream epoch) so far, or None."""
    st = dl.__dict__.get("_tsshim_state")
    return getattr(st, what, None)


class Recorder:
    def __init__(self, path):
        self.f = open(path, "w", buffering=1) if path else None

    def __call__(self, **obj):
        if self.f:
            self.f.write(json.dumps(obj, separators=(",", ":")) + "\n")
            self.f.flush()


def wait_barrier(spec):
    d, n = spec.rsplit(":", 1)
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(d)) < int(n) and time.monotonic() < deadline:
        time.sleep(0.01)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, help="tsshim-mkdata root (uses ROOT/train, ROOT/val with --val)")
    ap.add_argument("--seed", type=int, default=0, help="torch.manual_seed (default 0)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--val-batch-size", type=int, default=None, help="default: --batch-size")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--start-method", choices=["default", "fork", "spawn"], default="default",
                    help="multiprocessing_context of the loaders when --workers > 0")
    ap.add_argument("--persistent", action="store_true", help="persistent_workers (with --workers > 0)")
    ap.add_argument("--pin-memory", action="store_true")
    ap.add_argument("--drop-last", action="store_true")
    ap.add_argument("--model", choices=["a", "b", "c"], default="a",
                    help="a: linear, b: small conv net, c: two-layer MLP")
    ap.add_argument("--transform", choices=["std", "other", "train224"], default="std",
                    help="std: Resize(40) CenterCrop(32); other: Resize(40) CenterCrop(28) Resize(32); "
                         "train224: RandomResizedCrop(224) RandomHorizontalFlip (benchmarks); "
                         "all then ToTensor, Normalize")
    ap.add_argument("--subclass", action="store_true", help="use a DataLoader subclass")
    ap.add_argument("--val", action="store_true", help="validate (ROOT/val, in order) after each epoch")
    ap.add_argument("--scribble", action="store_true",
                    help="after training on a batch, overwrite it in place (x.zero_(), y.zero_()): "
                         "what the job does with its batch must never reach another job")
    ap.add_argument("--emu-cuda", metavar="LIB", help="upload each training batch through this CUDA runtime "
                    "(ctypes) and check the device bytes (see above)")
    ap.add_argument("--torch-cuda", action="store_true",
                    help="upload each training batch with torch's own CUDA (x.to('cuda'), non_blocking with "
                         "--pin-memory) instead, read it back and compare: a real GPU")
    ap.add_argument("--upload", choices=["all", "images"], default="all",
                    help="with --emu-cuda: upload images and labels, or the images only (labels stay on the host)")
    ap.add_argument("--mutate-before-upload", choices=["producer", "consumer"],
                    help="with --emu-cuda: in that role, change each batch in place (x.neg_()) before its upload")
    ap.add_argument("--break-after", type=int, default=0, metavar="N",
                    help="leave each training epoch after N batches")
    ap.add_argument("--exact-len", action="store_true",
                    help="take exactly len(loader) training batches with next() and never ask for the "
                         "StopIteration after them, as range(len(dl)), zip and islice loops do (a loader that "
                         "ends sooner fails the job, as it fails such a loop)")
    ap.add_argument("--sleep", type=float, default=0.0, metavar="S", help="sleep S seconds per training batch")
    ap.add_argument("--sleep-epochs", type=int, default=0, metavar="N",
                    help="--sleep only in the first N epochs (default 0: in all)")
    ap.add_argument("--break-epochs", type=int, default=0, metavar="N",
                    help="--break-after only in the first N epochs (default 0: in all)")
    ap.add_argument("--pause-after-first", type=float, default=0.0, metavar="S",
                    help="sleep S seconds after the first training epoch (a checkpoint)")
    ap.add_argument("--worker-start", type=float, default=0.0, metavar="S",
                    help="each loader worker sleeps S seconds as it starts (before its first batch), as a "
                         "worker that loads a large index or opens remote storage does")
    ap.add_argument("--interrupt-at", type=int, default=0, metavar="K",
                    help="the K-th image this process loads raises KeyboardInterrupt, as Ctrl-C there does "
                         "(with --workers 0: in the job's next()); the job does not catch it")
    ap.add_argument("--mark", metavar="FILE", help="create FILE once the first training batch is recorded")
    ap.add_argument("--after", metavar="FILE",
                    help="after the barrier, before the first epoch, wait (up to 60 s) for FILE")
    ap.add_argument("--start-delay", type=float, default=0.0, metavar="S",
                    help="sleep S seconds after the barrier, before the first epoch")
    ap.add_argument("--upload-device", type=int, default=0, metavar="N",
                    help="with --emu-cuda: upload to device N, made current around each upload only (device 0 "
                         "is current otherwise), as a job on cuda:N that never calls set_device")
    ap.add_argument("--default-stream", action="store_true",
                    help="with --emu-cuda: upload on the default stream (handle 0), as PyTorch's x.cuda() does")
    ap.add_argument("--queue-mb", type=float, default=0, metavar="MB",
                    help="with --emu-cuda: queue an async upload of MB (pinned) on the stream before each batch's, "
                         "as a training step queues work; the batch upload calls' time goes to the done line")
    ap.add_argument("--dict-batch", action="store_true",
                    help="collate to {\"y\": labels, \"x\": images} (in that order) and unpack by position")
    ap.add_argument("--fetch-ahead", action="store_true",
                    help="fetch each training batch before uploading the one before it, as Lightning's "
                         "prefetching fetcher does")
    ap.add_argument("--rng-probe", action="store_true",
                    help="after each training epoch draw torch.rand() and record it (\"rng\" in the end line): "
                         "what the job's later random numbers are, given the loader's own draws")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--record", metavar="FILE", help="JSON-lines record (see above)")
    ap.add_argument("--barrier", metavar="DIR:N",
                    help="before the first epoch, wait (up to 60 s) until N jobs reached DIR: "
                         "collocated jobs that start together, whatever their import times")
    a = ap.parse_args()
    if a.workers > 0 and a.start_method == "default" and "libasan" in os.environ.get("LD_PRELOAD", ""):
        # Under an ASan build of the shim the workers are spawned, not forked:
        # gcc 12's ASan allocator is not fork-safe in a threaded process (every
        # member has a heartbeat thread), and jobs hung in fork in make asan runs
        # (pytorch_share case e, stress.py, isolation). spawn is fork+exec with
        # nothing allocated between; the normal build forks, so forks stay tested.
        a.start_method = "spawn"
    if a.val_batch_size is None:
        a.val_batch_size = a.batch_size
    t0 = time.monotonic()
    os.environ[ENV_MAIN] = str(os.getpid())
    os.environ[ENV_WORKER_START] = str(a.worker_start)

    torch.manual_seed(a.seed)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    rec = Recorder(a.record)
    if a.record:
        os.environ[ENV_WORKERS] = a.record + ".workers"
        for p in (a.record + ".workers", a.record + ".workers-cpu", a.record + ".workers-seed"):
            open(p, "w").close()

    if a.interrupt_at:
        interrupt_at(a.interrupt_at)
    tf = make_transform(a.transform)
    train_ds = datasets.ImageFolder(os.path.join(a.root, "train"), transform=tf)
    val_ds = datasets.ImageFolder(os.path.join(a.root, "val"), transform=tf) if a.val else None

    cls = JobLoader if a.subclass else DataLoader

    def loader(ds, batch_size, shuffle):
        kw = dict(batch_size=batch_size, shuffle=shuffle, num_workers=a.workers, pin_memory=a.pin_memory,
                  drop_last=a.drop_last)
        if a.dict_batch:
            kw["collate_fn"] = dict_collate
        kw["worker_init_fn"] = worker_init  # every job: it is part of the loader's key (never runs without workers)
        if a.workers > 0:
            kw["persistent_workers"] = a.persistent
            if a.start_method != "default":
                kw["multiprocessing_context"] = a.start_method
        return cls(ds, **kw)

    train_dl = loader(train_ds, a.batch_size, True)
    val_dl = loader(val_ds, a.val_batch_size, False) if a.val else None
    rec(start=True, pid=os.getpid(), args=vars(a), train_len=len(train_ds),
        val_len=len(val_ds) if val_ds is not None else None, classes=train_ds.classes)

    model = make_model(a.model, len(train_ds.classes))
    if a.transform == "train224":  # the tiny models take 32x32 images
        model = nn.Sequential(nn.AdaptiveAvgPool2d(32), model)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    gpu = EmuUploads(a.emu_cuda, a.default_stream, a.queue_mb, a.upload_device) if a.emu_cuda else \
        TorchUploads(a.upload_device, a.pin_memory) if a.torch_cuda else None
    if a.barrier:
        wait_barrier(a.barrier)
    after_by = time.monotonic() + 60
    while a.after and not os.path.exists(a.after) and time.monotonic() < after_by:
        time.sleep(0.01)
    if a.start_delay > 0:
        time.sleep(a.start_delay)
    startup_cpu = time.process_time()  # Python, torch, datasets, model: before any loading

    batches = samples = 0
    data_cpu = 0.0
    for epoch in range(a.epochs):
        model.train()
        os.environ[ENV_LOADER] = "train"
        c = time.process_time()
        it = iter(train_dl)
        if a.fetch_ahead:
            it = fetch_ahead(it)
        data_cpu += time.process_time() - c
        i = 0
        pv_seen = layer_private(train_dl) or 0
        gv_seen = layer_private(train_dl, "gathered_samples") or 0
        while True:
            up = {}
            breaks = a.break_after and (a.break_epochs == 0 or epoch < a.break_epochs)
            if (breaks and i >= a.break_after) or (a.exact_len and i >= len(train_dl)):
                break
            c = time.process_time()
            if a.exact_len:  # no try: a loader that ends before len(loader) fails the job, as it would such a loop
                batch = next(it)
            else:
                try:
                    batch = next(it)
                except StopIteration:
                    data_cpu += time.process_time() - c
                    break
            data_cpu += time.process_time() - c
            pv_now = layer_private(train_dl)
            if pv_now is not None:  # samples of this batch the layer made privately
                up["pv"], pv_seen = pv_now - pv_seen, pv_now
            gv_now = layer_private(train_dl, "gathered_samples")
            if gv_now and gv_now != gv_seen:  # samples of this batch the layer gathered from the stream's next epoch
                up["gv"], gv_seen = gv_now - gv_seen, gv_now
            role = layer_role()
            if role is not None:
                up["role"] = role
            if a.dict_batch:
                y, x = batch.values()
            else:
                x, y = batch
            h = None
            if gpu:  # right after next(), as a training loop uploads (a producer's upload fills the ring)
                mut = a.mutate_before_upload == {1: "producer", 2: "consumer"}.get(role)
                if mut:
                    h = [sample_hash(s) for s in x]  # the batch as the loader yielded it
                    x.neg_()
                st0 = gpu.stats(raw=True)
                okx, nx = gpu.upload(x)
                oky, ny = gpu.upload(y) if a.upload == "all" else (True, 0)
                up.update(dev=int(okx and oky), up=nx + ny, xb=nx, mut=int(mut), role=role)
                if st0 is not None:
                    up["h2d"] = gpu.stats(raw=True)["h2d_bytes"] - st0["h2d_bytes"]
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            if rec.f:  # hashing costs CPU a benchmark must not count
                rec(loader="train", epoch=epoch, batch=i, n=len(y), h=h or [sample_hash(s) for s in x],
                    y=y.tolist(), loss=round(loss.item(), 6), t=round(time.monotonic(), 4), **up)
            if a.mark and not os.path.exists(a.mark):
                open(a.mark, "w").close()
            if a.scribble:
                x.zero_()
                y.zero_()
            i += 1
            batches += 1
            samples += len(y)
            if a.sleep > 0 and (a.sleep_epochs == 0 or epoch < a.sleep_epochs):
                time.sleep(a.sleep)
        del it
        probe = {"rng": round(torch.rand(()).item(), 9)} if a.rng_probe else {}
        rec(loader="train", epoch=epoch, end=True, batches=i, len=len(train_dl), **probe)
        if epoch == 0 and a.pause_after_first > 0:
            time.sleep(a.pause_after_first)

        if val_dl is not None:
            model.eval()
            os.environ[ENV_LOADER] = "val"
            j = 0
            with torch.no_grad():
                for x, y in val_dl:
                    loss = loss_fn(model(x), y)
                    if rec.f:
                        rec(loader="val", epoch=epoch, batch=j, n=len(y), h=[sample_hash(s) for s in x],
                            y=y.tolist(), loss=round(loss.item(), 6))
                    j += 1
            rec(loader="val", epoch=epoch, end=True, batches=j, len=len(val_dl))

    # Let the workers go (persistent ones live as long as their loader), so
    # that they are joined and counted in RUSAGE_CHILDREN.
    del train_dl, val_dl
    import gc
    gc.collect()
    wall = time.monotonic() - t0
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

    by_loader = {}
    worker_cpu = 0.0
    if a.record:
        for line in open(a.record + ".workers"):
            parts = line.split()
            if len(parts) == 2:
                by_loader[parts[1]] = by_loader.get(parts[1], 0) + 1
        for line in open(a.record + ".workers-cpu"):
            parts = line.split()
            if len(parts) == 3 and parts[1] == "train":
                worker_cpu += float(parts[2])
    rec(done=True, data_cpu_s=round(data_cpu + worker_cpu, 4), main_data_cpu_s=round(data_cpu, 4),
        worker_cpu_s=round(worker_cpu, 4), cpu_s=round(cpu, 4), wall_s=round(wall, 4),
        workers_started=sum(by_loader.values()), workers_by_loader=by_loader,
        **({"gpu": gpu.stats(), "upload_call_ms": round(gpu.call_ms, 1)} if gpu else {}))
    print(f"job: batches={batches} samples={samples} epochs={a.epochs} cpu_s={cpu:.3f} wall_s={wall:.3f} "
          f"startup_cpu_s={startup_cpu:.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
