# SPDX-License-Identifier: MIT
"""A PyTorch job alone in its session must behave as without the shim: small
programs, each printing what it sees (batches, random draws, errors), run by
tests/scenarios/alone.sh plainly and under the shim, and compared.

  python3 tests/py/alone_cases.py CASE

Each case is a way a differential run found the layer changing a job alone:
  reassign     it = iter(dl) again part-way through an epoch (the new
               iterator died of AttributeError: the old one left the feed)
  stopiter     the dataset raises StopIteration (an old idiom): the epoch
               ends there (the next epoch hung: the stream's was never ended)
  two_loaders  two loaders over one dataset, one left part-way: the other's
               next epoch (found its shared feed closed: another order)
  fork_child   a forked child iterates a loader (read the parent's feed:
               another order)
  atexit       an atexit handler iterates a loader after the layer's own
               handler closed its feeds (another order)
  copy         copy.deepcopy and pickle of a loader after an epoch (failed:
               the layer's state held ctypes handles)
  strings      batches holding strings: the loader is not shared, said at
               info, not on stderr at the default level (a warn line)
  interrupt    the dataset raises KeyboardInterrupt at one sample, caught
               by the loop (the iterator ended: every later next() a
               StopIteration; torch's goes on with the next batch)
  worker_error a worker's exception caught by the loop, which goes on: the
               epoch's workers are gone after it (exact mode kept them until
               the garbage collector ran, once in a forked worker of the
               next loader, where torch's __del__ failed on stderr)
  gpu          a job that uploads its batches to the test device (tsemu, 16
               MiB: alone.sh sets it up), then asks for 10 MiB more (the
               GPU ring kept its batches for nobody: the device memory it
               held made that cudaMalloc fail)
  threads      two threads, each iterating a loader of its own (its own
               generator) over one dataset (the process opened the feed
               twice, and one loader read the other's stream: half the runs)
  quiet        three epochs of 10 batches; with $QUIET_HOLD set, it then says
               "ready" there and waits for "go" (alone.sh counts what its
               feed published meanwhile: the first TSSHIM_DEPTH batches of
               each epoch, not every batch, about 0.17 ms of a tiny batch's
               making)
"""
import atexit
import copy
import os
import pickle
import sys
import threading
import time

if __name__ == "__main__" and sys.argv[1:] == ["atexit"]:
    # registered before torch is imported (which loads the layer, and its own
    # atexit handler): runs after the layer's, as such a job's final evaluation
    atexit.register(lambda: at_exit_eval())

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402


class Numbers(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([i])


class StopsAt3(Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        if i == 3:
            raise StopIteration
        return torch.tensor([i])


class Named(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.tensor([i]), "file%d.jpg" % i


def flat(batches):
    return [b.flatten().tolist() for b in batches]


def reassign():
    dl = DataLoader(Numbers(6), batch_size=2)
    it = iter(dl)
    print("first", next(it).tolist())
    it = iter(dl)  # the old iterator is dropped here, part-way
    print("again", [next(it).tolist() for _ in range(3)])


def stopiter():
    dl = DataLoader(StopsAt3(), batch_size=2)
    for ep in range(3):
        print("epoch", ep, flat(dl), flush=True)


def two_loaders():
    torch.manual_seed(0)
    ds = Numbers(12)
    a = DataLoader(ds, batch_size=4, shuffle=True)
    b = DataLoader(ds, batch_size=3, shuffle=True)
    print("b", flat(b))
    for x in a:
        print("a first", x.flatten().tolist())
        break
    print("b", flat(b))
    print("rand", torch.rand(1).item())


def fork_child():
    dl = DataLoader(Numbers(12), batch_size=4, shuffle=True)
    torch.manual_seed(0)
    print("parent", flat(dl), flush=True)
    pid = os.fork()
    if pid == 0:
        torch.manual_seed(1)
        print("child", flat(DataLoader(Numbers(12), batch_size=4, shuffle=True)), torch.rand(1).item(), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)


EXIT_DL = []


def at_exit():
    dl = DataLoader(Numbers(9), batch_size=3, shuffle=True)
    torch.manual_seed(0)
    print("main", flat(dl), flush=True)
    EXIT_DL.append(dl)


def at_exit_eval():
    torch.manual_seed(5)
    print("atexit", flat(EXIT_DL[0]), torch.rand(1).item(), flush=True)


def copies():
    dl = DataLoader(Numbers(8), batch_size=4)
    print("epoch", flat(dl))
    for name, f in (("deepcopy", lambda: copy.deepcopy(dl)), ("pickle", lambda: pickle.loads(pickle.dumps(dl)))):
        try:
            print(name, "ok", flat(f()))
        except Exception as e:
            print(name, "failed:", type(e).__name__, e)


def strings():
    for x, names in DataLoader(Named(), batch_size=2):
        print(x.flatten().tolist(), names)


class Interrupts(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 2:
            raise KeyboardInterrupt
        return torch.tensor([i])


def interrupt():
    it = iter(DataLoader(Interrupts(), batch_size=2))
    out = []
    for _ in range(5):
        try:
            out.append(next(it).flatten().tolist())
        except StopIteration:
            out.append("StopIteration")
        except KeyboardInterrupt:
            out.append("KeyboardInterrupt")
    print(out)


class Bad(Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        if i == 2:
            raise ValueError("bad sample")
        return torch.tensor([i])


def worker_error():
    import multiprocessing
    for k in range(3):
        it = iter(DataLoader(Bad(), batch_size=2, num_workers=2))
        out = []
        while True:
            try:
                out.append(next(it).flatten().tolist())
            except StopIteration:
                break
            except ValueError as e:
                out.append("%s: %s" % (type(e).__name__, str(e).splitlines()[-1]))
        print(out, "workers alive after the epoch:", len(multiprocessing.active_children()), flush=True)


class Images(Dataset):
    def __len__(self):
        return 512

    def __getitem__(self, i):
        return torch.full((3, 64, 64), float(i)), torch.tensor(i)


def gpu():
    import ctypes
    try:
        rt = ctypes.CDLL("libcudart.so.13")
    except OSError:
        print("no CUDA runtime")
        return
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    rt.cudaMalloc.argtypes = [ctypes.POINTER(vp), sz]
    rt.cudaMemcpyAsync.argtypes = [vp, vp, sz, ctypes.c_int, vp]
    rt.cudaStreamCreate.argtypes = [ctypes.POINTER(vp)]
    rt.cudaStreamSynchronize.argtypes = [vp]
    rt.cudaMemGetInfo.argtypes = [ctypes.POINTER(sz), ctypes.POINTER(sz)]

    def malloc(n):
        p = vp()
        return rt.cudaMalloc(ctypes.byref(p), n), p.value

    def free_now():
        f, t = sz(), sz()
        rt.cudaMemGetInfo(ctypes.byref(f), ctypes.byref(t))
        return f.value
    s = vp()
    rt.cudaStreamCreate(ctypes.byref(s))
    model = torch.zeros(1024)  # the model goes to the device first, as a training job's does
    rt.cudaMemcpyAsync(malloc(4096)[1], model.data_ptr(), 4096, 1, s)
    bufs = {}
    dl = DataLoader(Images(), batch_size=64, shuffle=True)
    for x, y in dl:
        for t in (x, y):
            n = t.numel() * t.element_size()
            if n not in bufs:
                bufs[n] = malloc(n)[1]
            rt.cudaMemcpyAsync(bufs[n], t.data_ptr(), n, 1, s)
        rt.cudaStreamSynchronize(s)
    print("free after the epoch:", free_now())
    del dl
    print("cudaMalloc(10 MiB):", malloc(10 << 20)[0])


class Slow(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.tensor([i])


def threads():
    res = {}

    def work(name, dl):
        res[name] = [flat(dl) for _ in range(2)]
    ts = []
    for k in range(2):
        g = torch.Generator()
        g.manual_seed(100 + k)
        dl = DataLoader(Slow(), batch_size=4, shuffle=True, generator=g)
        ts.append(threading.Thread(target=work, args=("loader%d" % k, dl)))
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for k in sorted(res):
        print(k, res[k])


def quiet():
    dl = DataLoader(Numbers(40), batch_size=4, shuffle=True)
    for ep in range(3):
        print("epoch", ep, sorted(sum(flat(dl), [])) == list(range(40)), flush=True)
    hold = os.environ.get("QUIET_HOLD")
    if hold:
        open(os.path.join(hold, "ready"), "w").close()
        t0 = time.monotonic()
        while not os.path.exists(os.path.join(hold, "go")) and time.monotonic() - t0 < 30:
            time.sleep(0.01)


CASES = {"reassign": reassign, "stopiter": stopiter, "two_loaders": two_loaders, "fork_child": fork_child,
         "atexit": at_exit, "copy": copies, "strings": strings, "interrupt": interrupt, "worker_error": worker_error, "gpu": gpu,
         "threads": threads, "quiet": quiet}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in CASES:
        sys.exit("usage: alone_cases.py %s" % "|".join(CASES))
    CASES[sys.argv[1]]()
