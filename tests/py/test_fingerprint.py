# SPDX-License-Identifier: MIT
"""Loader fingerprints (issue 4 item 2): shim/python/tsshim_loader.py.

Run by tests/scenarios/fingerprint.sh with /usr/bin/python3 (needs torch,
torchvision, PIL):  python3 tests/py/test_fingerprint.py [PYDIR]
PYDIR holds tsshim_loader.py (default: shim/python next to this file).
`--key NAME ROOT` prints the key of loader NAME over ROOT (for the
cross-process check) and exits.
"""
import os
import subprocess
import sys
import tempfile
import time
import unittest
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.environ.get("TSSHIM_PYDIR") or os.path.join(HERE, "..", "..", "shim", "python")
sys.path.insert(0, os.path.abspath(PYDIR))

import torch  # noqa: E402
import torchvision.transforms as T  # noqa: E402
from PIL import Image  # noqa: E402
from torch.utils.data import (DataLoader, Dataset, IterableDataset, BatchSampler,  # noqa: E402
                              SequentialSampler, SubsetRandomSampler, WeightedRandomSampler)
from torch.utils.data.distributed import DistributedSampler  # noqa: E402
from torchvision.datasets import ImageFolder  # noqa: E402

import tsshim_loader  # noqa: E402

warnings.filterwarnings("ignore", message="This DataLoader will create")

ROOT = None  # the temp dataset: ROOT/train/{cat,dog}, ROOT/val/{cat,dog}


def make_images(root):
    for split, n in (("train", 4), ("val", 2)):
        for cls in ("cat", "dog"):
            d = os.path.join(root, split, cls)
            os.makedirs(d, exist_ok=True)
            for i in range(n):
                Image.new("RGB", (8, 8), (i * 40, 10, 200)).save(os.path.join(d, "%d.jpg" % i))


def train_tf(size=224, p=0.5):
    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(p), T.ToTensor(),
                      T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])


def my_collate(batch):  # module-level: shareable
    return torch.utils.data.default_collate(batch)


def add_one(x):
    return x + 1


WORKER_OFFSET = 0.0


def seed_worker(worker_id, rank=0):
    torch.utils.data.get_worker_info().dataset.offset = WORKER_OFFSET + rank


class MyLoader(DataLoader):  # as Lightning/Accelerate subclass it
    pass


class Numbers(Dataset):  # a generic map-style dataset
    def __init__(self, n, scale=1.0, name="nums", extra=None):
        self.n, self.scale, self.name = n, scale, name
        if extra is not None:
            self.extra = extra

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([i * self.scale])


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(10))


def loader(name, root):
    """The loader definitions shared by this process and the subprocess."""
    train = ImageFolder(os.path.join(root, "train"), transform=train_tf())
    if name == "train":
        return DataLoader(train, batch_size=64, shuffle=True, num_workers=2)
    if name == "val":
        val = ImageFolder(os.path.join(root, "val"),
                          transform=T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor()]))
        return DataLoader(val, batch_size=64)
    raise KeyError(name)


def key(ld):
    k, why = tsshim_loader.fingerprint(ld)
    return k


class Fingerprint(unittest.TestCase):
    def shareable(self, ld):
        k, why = tsshim_loader.fingerprint(ld)
        self.assertIsNotNone(k, "expected a key, got None: %s" % why)
        self.assertRegex(k, r"^[0-9a-f]{16}$")
        self.assertEqual(why, "shareable")
        return k

    def refused(self, ld, reason):
        k, why = tsshim_loader.fingerprint(ld)
        self.assertIsNone(k, "expected no key (%s), got %s" % (reason, k))
        self.assertIn(reason, why)
        self.assertNotIn("\n", why)
        d = tsshim_loader.describe(ld)
        self.assertFalse(d["shareable"])
        self.assertEqual(d["why"], why)

    def ds(self, split="train", **kw):
        kw.setdefault("transform", train_tf())
        return ImageFolder(os.path.join(ROOT, split), **kw)

    def test_same_key_in_another_process(self):
        mine = {n: self.shareable(loader(n, ROOT)) for n in ("train", "val")}
        for n in ("train", "val"):
            env = dict(os.environ, PYTHONHASHSEED="12345" if n == "train" else "999")
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--key", n, ROOT],
                                 env=env, stdout=subprocess.PIPE, check=True, timeout=120)
            self.assertEqual(out.stdout.decode().strip(), mine[n], n)

    def test_loader_settings_do_not_enter_the_key(self):
        base = self.shareable(DataLoader(self.ds(), batch_size=64, shuffle=True))
        for kw in (dict(batch_size=32), dict(batch_size=100, num_workers=4),
                   dict(batch_size=64, pin_memory=True), dict(batch_size=48, drop_last=True),
                   dict(batch_size=64, num_workers=2, persistent_workers=True, prefetch_factor=4)):
            self.assertEqual(self.shareable(DataLoader(self.ds(), shuffle=True, **kw)), base, kw)

    def test_the_worker_init_fn_its_workers_run(self):
        """A worker_init_fn may set what the workers make (a dataset attribute per
        worker, an offset read from a global): found by a differential run, two
        jobs whose functions set different offsets shared, one trained on the
        other's samples. The function enters the key (its code, what it reads,
        a partial's arguments); the number of workers does not."""
        import functools

        def key(**kw):
            return self.shareable(DataLoader(self.ds(), batch_size=8, shuffle=True, **kw))
        plain = key(num_workers=2)
        seeded = key(num_workers=2, worker_init_fn=seed_worker)
        self.assertNotEqual(seeded, plain)
        self.assertEqual(key(num_workers=4, worker_init_fn=seed_worker), seeded)
        self.assertEqual(key(worker_init_fn=seed_worker), seeded, "a job of the script without workers")
        self.assertNotEqual(key(num_workers=2, worker_init_fn=add_one), seeded)
        p0 = key(num_workers=2, worker_init_fn=functools.partial(seed_worker, rank=0))
        self.assertEqual(key(num_workers=2, worker_init_fn=functools.partial(seed_worker, rank=0)), p0)
        self.assertNotEqual(key(num_workers=2, worker_init_fn=functools.partial(seed_worker, rank=1)), p0)
        global WORKER_OFFSET
        old, WORKER_OFFSET = WORKER_OFFSET, 1000.0
        try:
            self.assertNotEqual(key(num_workers=2, worker_init_fn=seed_worker), seeded, "a global it reads")
        finally:
            WORKER_OFFSET = old
        self.refused(DataLoader(self.ds(), batch_size=8, num_workers=2, worker_init_fn=lambda w: None),
                     "worker_init_fn")

    def test_train_and_val_differ(self):
        t, v = self.shareable(loader("train", ROOT)), self.shareable(loader("val", ROOT))
        self.assertNotEqual(t, v)
        # same transforms and sampler, only the root differs
        a = self.shareable(DataLoader(self.ds("train"), batch_size=8))
        b = self.shareable(DataLoader(self.ds("val"), batch_size=8))
        self.assertNotEqual(a, b)

    def test_transform_parameters(self):
        base = self.shareable(DataLoader(self.ds(transform=train_tf(224, 0.5)), batch_size=8))
        self.assertEqual(self.shareable(
            DataLoader(self.ds(transform=train_tf(224, 0.5)), batch_size=8)), base)
        for tf in (train_tf(192, 0.5), train_tf(224, 0.3), None):
            self.assertNotEqual(self.shareable(DataLoader(self.ds(transform=tf), batch_size=8)),
                                base, repr(tf))
        tt = self.shareable(DataLoader(self.ds(target_transform=add_one), batch_size=8))
        self.assertNotEqual(tt, base)

    def test_lambda_transforms_refused(self):
        why = "transform has no stable description"
        self.refused(DataLoader(self.ds(transform=lambda x: x), batch_size=8), why)
        # torchvision's Lambda prints as "Lambda()" whatever it holds
        self.refused(DataLoader(self.ds(transform=T.Compose([T.ToTensor(), T.Lambda(lambda x: x)])),
                                batch_size=8), why)
        self.refused(DataLoader(self.ds(target_transform=lambda y: y), batch_size=8), why)

        class Bound:
            def __init__(self):
                self.scale = 2

            def apply(self, x):
                return x
        self.refused(DataLoader(self.ds(transform=Bound().apply), batch_size=8), why)
        # a module-level function inside Lambda() is fine, and is told apart
        a = self.shareable(DataLoader(self.ds(transform=T.Compose([T.ToTensor(), T.Lambda(add_one)])),
                                      batch_size=8))
        b = self.shareable(DataLoader(self.ds(transform=T.Compose([T.ToTensor(), T.Lambda(my_collate)])),
                                      batch_size=8))
        self.assertNotEqual(a, b)

    def test_sampler_kind(self):
        seq = self.shareable(DataLoader(self.ds(), batch_size=8))
        rnd = self.shareable(DataLoader(self.ds(), batch_size=8, shuffle=True))
        self.assertNotEqual(seq, rnd)
        ds = self.ds()
        self.assertEqual(self.shareable(DataLoader(ds, batch_size=8, sampler=SequentialSampler(ds))), seq)
        # a sampler over another dataset object: not the loader's own order
        self.refused(DataLoader(self.ds(), batch_size=8, sampler=SequentialSampler(self.ds())),
                     "is not shareable")
        sub1 = self.shareable(DataLoader(self.ds(), batch_size=8, sampler=SubsetRandomSampler([0, 2, 4])))
        sub2 = self.shareable(DataLoader(self.ds(), batch_size=8, sampler=SubsetRandomSampler([0, 2, 4])))
        sub3 = self.shareable(DataLoader(self.ds(), batch_size=8, sampler=SubsetRandomSampler([0, 2, 5])))
        self.assertEqual(sub1, sub2)
        self.assertNotEqual(sub1, sub3)
        self.assertNotEqual(sub1, rnd)

    def test_stateful_samplers_refused(self):
        ds = self.ds()
        self.refused(DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds, num_replicas=1, rank=0)),
                     "sampler torch.utils.data.distributed.DistributedSampler is not shareable")
        self.refused(DataLoader(ds, batch_size=8, sampler=WeightedRandomSampler([1.0] * len(ds), len(ds))),
                     "WeightedRandomSampler is not shareable")
        self.refused(DataLoader(ds, batch_sampler=[[0, 1], [2, 3]]), "custom batch sampler")
        self.refused(DataLoader(ds, batch_sampler=BatchSampler(SequentialSampler(ds), 4, False)),
                     "custom batch sampler")
        self.refused(DataLoader(ds, batch_size=None), "no automatic batching")

    def test_iterable_dataset_refused(self):
        self.refused(DataLoader(Stream(), batch_size=4), "iterable dataset")

    def test_collate(self):
        ds = self.ds()
        base = self.shareable(DataLoader(ds, batch_size=8))
        self.assertEqual(self.shareable(
            DataLoader(ds, batch_size=8, collate_fn=torch.utils.data.default_collate)), base)
        self.refused(DataLoader(ds, batch_size=8, collate_fn=lambda b: b),
                     "<lambda> is not a plain module-level function")
        mine = self.shareable(DataLoader(ds, batch_size=8, collate_fn=my_collate))
        self.assertNotEqual(mine, base)

        def local(b):
            return b
        self.refused(DataLoader(ds, batch_size=8, collate_fn=local), "not a plain module-level")

    def test_added_file_changes_key(self):
        before = self.shareable(DataLoader(self.ds(), batch_size=8))
        extra = os.path.join(ROOT, "train", "dog", "new.jpg")
        Image.new("RGB", (8, 8)).save(extra)
        try:
            after = self.shareable(DataLoader(self.ds(), batch_size=8))
        finally:
            os.unlink(extra)
        self.assertNotEqual(before, after)
        self.assertEqual(self.shareable(DataLoader(self.ds(), batch_size=8)), before)
        # same number of files, one renamed: the sample list still differs
        a, b = (os.path.join(ROOT, "train", "dog", n) for n in ("0.jpg", "9.jpg"))
        os.rename(a, b)
        try:
            renamed = self.shareable(DataLoader(self.ds(), batch_size=8))
        finally:
            os.rename(b, a)
        self.assertNotEqual(renamed, before)

    def test_subclass_same_key(self):
        for kw in (dict(batch_size=8), dict(batch_size=16, shuffle=True, num_workers=2)):
            self.assertEqual(self.shareable(MyLoader(self.ds(), **kw)),
                             self.shareable(DataLoader(self.ds(), **kw)), kw)

    def test_generic_dataset(self):
        a = self.shareable(DataLoader(Numbers(10), batch_size=4))
        self.assertEqual(self.shareable(DataLoader(Numbers(10), batch_size=5)), a)
        self.assertNotEqual(self.shareable(DataLoader(Numbers(11), batch_size=4)), a)
        self.assertNotEqual(self.shareable(DataLoader(Numbers(10, scale=2.0), batch_size=4)), a)
        self.assertNotEqual(self.shareable(DataLoader(Numbers(10, extra=("x", 1)), batch_size=4)), a)
        why = "dataset state cannot be described"
        self.refused(DataLoader(Numbers(10, extra=torch.zeros(3)), batch_size=4), why)
        with open(__file__) as f:
            self.refused(DataLoader(Numbers(10, extra=f), batch_size=4), why)
        # wrappers: Subset of an ImageFolder
        s1 = self.shareable(DataLoader(torch.utils.data.Subset(self.ds(), [0, 1, 2]), batch_size=2))
        s2 = self.shareable(DataLoader(torch.utils.data.Subset(self.ds(), [0, 1, 3]), batch_size=2))
        self.assertNotEqual(s1, s2)
        self.refused(DataLoader(torch.utils.data.Subset(self.ds(transform=lambda x: x), [0]),
                                batch_size=2), "transform has no stable description")

    def test_dataset_and_transform_code(self):
        """Two scripts' __main__.MyData (or transform class) that differ only in
        code: one name, different batches, so different keys."""
        def cls(body, base="Dataset", name="MyData"):
            ns = {}
            exec("import torch\nfrom torch.utils.data import Dataset\n"
                 "class %s(%s):\n%s" % (name, base, body), ns)
            ns[name].__module__, ns[name].__qualname__ = "__main__", name
            return ns[name]
        body = ("    def __init__(self, n): self.n = n\n"
                "    def __len__(self): return self.n\n"
                "    def __getitem__(self, i): return torch.tensor([i * %d])\n")
        one, two, again = cls(body % 1), cls(body % 2), cls(body % 1)
        k1 = self.shareable(DataLoader(one(8), batch_size=4))
        self.assertNotEqual(self.shareable(DataLoader(two(8), batch_size=4)), k1)
        self.assertEqual(self.shareable(DataLoader(again(8), batch_size=4)), k1)
        # a subclass that changes nothing but a method of its own
        sub_body = "    def __getitem__(self, i): return torch.tensor([i + 1])\n"
        ns = {"MyData": one}
        exec("import torch\nclass Sub(MyData):\n" + sub_body, ns)
        ns["Sub"].__module__ = "__main__"
        self.assertNotEqual(self.shareable(DataLoader(ns["Sub"](8), batch_size=4)), k1)
        # a transform class of the user's own: same repr, other code
        tbody = ("    def __repr__(self): return 'Scale()'\n"
                 "    def __call__(self, x): return x * %d\n")
        t1, t2 = cls(tbody % 1, base="object", name="Scale"), cls(tbody % 2, base="object", name="Scale")
        a = self.shareable(DataLoader(self.ds(transform=T.Compose([T.ToTensor(), t1()])), batch_size=4))
        b = self.shareable(DataLoader(self.ds(transform=T.Compose([T.ToTensor(), t2()])), batch_size=4))
        self.assertNotEqual(a, b)
        self.assertEqual(self.shareable(DataLoader(self.ds(transform=T.Compose([T.ToTensor(), t1()])),
                                                   batch_size=4)), a)
        # torchvision's own classes carry no code hash: same key across installs of the layer
        self.assertNotIn("code", tsshim_loader.describe(DataLoader(self.ds(), batch_size=4))["dataset"])

    def test_class_attributes_and_pillow_settings(self):
        """What a class of the user's own holds as data (a tuple, a list, a
        transform object, a generator), read as self.size or off the class
        (Jitter.scales), and Pillow's LOAD_TRUNCATED_IMAGES, set differently by
        two runs of one script: different batches, so different keys. Before,
        only simple class attributes entered, and neither setting did: each
        job trained on the other's batches (found by two differential runs)."""
        import numpy as np
        from PIL import ImageFile

        class Sized(Dataset):
            size = (4, 4)
            resize = T.Resize(4)

            def __len__(self):
                return 8

            def __getitem__(self, i):
                return self.resize(torch.zeros((1,) + self.size))

        class Jitter:
            scales = [1.0]
            rng = np.random.default_rng(0)

            def __call__(self, x):
                return x * Jitter.scales[0] + float(Jitter.rng.random())

        for cls in (Sized, Jitter):
            cls.__module__ = "__main__"
        k = self.shareable(DataLoader(Sized(), batch_size=4))
        Sized.size = (6, 6)
        k_size = self.shareable(DataLoader(Sized(), batch_size=4))
        Sized.resize = T.Resize(6)
        k_resize = self.shareable(DataLoader(Sized(), batch_size=4))
        self.assertEqual(len({k, k_size, k_resize}), 3)
        Sized.size, Sized.resize = (4, 4), T.Resize(4)
        self.assertEqual(self.shareable(DataLoader(Sized(), batch_size=4)), k)

        def jit():
            return DataLoader(self.ds(transform=T.Compose([T.ToTensor(), Jitter()])), batch_size=4)
        j = self.shareable(jit())
        Jitter.scales = [2.0, 3.0]
        self.assertNotEqual(self.shareable(jit()), j)
        Jitter.scales = [1.0]
        self.assertEqual(self.shareable(jit()), j)

        was = ImageFile.LOAD_TRUNCATED_IMAGES
        plain = self.shareable(DataLoader(self.ds(), batch_size=4))
        try:
            ImageFile.LOAD_TRUNCATED_IMAGES = not was
            self.assertNotEqual(self.shareable(DataLoader(self.ds(), batch_size=4)), plain)
        finally:
            ImageFile.LOAD_TRUNCATED_IMAGES = was

    def test_globals_the_code_reads(self):
        """Two runs of one script that set a module global the dataset's code
        reads differently (SCALE = args.scale, a config object's field, a
        helper function's constant, a mean tensor) make different batches:
        different keys. What the code does not read, a library object and a
        global of the same name as an attribute of self do not count; torch's
        default dtype does."""
        import argparse

        def make(scale, lr, mean, helper_k, cfg_scale):
            ns = {"SCALE": scale, "args": argparse.Namespace(scale=scale, lr=lr),
                  "MEAN": torch.tensor(mean), "K": helper_k, "n": 1000 + lr,
                  "LOCK": __import__("threading").Lock(), "CFG": type("Cfg", (), {})()}
            ns["CFG"].scale = cfg_scale
            exec("import torch\nfrom torch.utils.data import Dataset\n"
                 "def helper(x): return x * K\n"
                 "class G(Dataset):\n"
                 "    def __init__(self, n): self.n = n\n"
                 "    def __len__(self): return self.n\n"
                 "    def __getitem__(self, i):\n"
                 "        with LOCK: pass\n"
                 "        return torch.tensor([helper(i) * SCALE * args.scale * CFG.scale]) - MEAN\n", ns)
            ns["G"].__module__, ns["G"].__qualname__ = "__main__", "G"
            ns["helper"].__module__ = "__main__"
            return DataLoader(ns["G"](8), batch_size=4)
        base = dict(scale=1.0, lr=0.1, mean=[0.5], helper_k=3, cfg_scale=2)
        k = self.shareable(make(**base))
        self.assertEqual(self.shareable(make(**base)), k)
        # what the code does not read: args.lr, and n (read as self.n, not the global)
        self.assertEqual(self.shareable(make(**dict(base, lr=0.01))), k)
        for change in (dict(scale=2.0), dict(mean=[0.4]), dict(helper_k=4), dict(cfg_scale=3)):
            self.assertNotEqual(self.shareable(make(**dict(base, **change))), k, change)
        was = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            self.assertNotEqual(self.shareable(make(**base)), k)
        finally:
            torch.set_default_dtype(was)

    def test_globals_through_methods_modules_and_the_environment(self):
        """CFG.get("offset") describes CFG; config.OFFSET, an attribute of a module
        of the user's own, by value; os.environ.get("NAME") the variable NAME; a
        seeded generator the code reads is not in the key (socket mode takes the
        producer's draws) but in rng_state(), which exact mode's key holds."""
        import random
        import types as pytypes

        def make(cfg, offset, env, seed):
            mod = pytypes.ModuleType("usercfg")
            mod.__file__ = "/home/user/usercfg.py"
            mod.OFFSET = offset
            sys.modules["usercfg"] = mod
            os.environ["TSSHIM_TEST_OFFSET"] = env
            ns = {"CFG": dict(cfg), "usercfg": mod, "os": os, "RNG": random.Random(seed)}
            exec("import torch\nfrom torch.utils.data import Dataset\n"
                 "class H(Dataset):\n"
                 "    def __len__(self): return 8\n"
                 "    def __getitem__(self, i):\n"
                 "        k = CFG.get('offset') + usercfg.OFFSET + float(os.environ.get('TSSHIM_TEST_OFFSET'))\n"
                 "        return torch.tensor([i + k + RNG.random()])\n", ns)
            ns["H"].__module__, ns["H"].__qualname__ = "__main__", "H"
            dl = DataLoader(ns["H"](), batch_size=4)
            k = self.shareable(dl)
            return k, tsshim_loader.rng_state()
        try:
            base = dict(cfg={"offset": 1}, offset=2, env="3", seed=4)
            k, r = make(**base)
            self.assertIsNotNone(r)
            for change in (dict(cfg={"offset": 5}), dict(offset=6), dict(env="7")):
                self.assertNotEqual(make(**dict(base, **change))[0], k, change)
            k2, r2 = make(**dict(base, seed=8))
            self.assertEqual(k2, k, "a generator's state is not in the sharing key")
            self.assertNotEqual(r2, r, "but it is in rng_state()")
            self.assertEqual(make(**base), (k, r))
        finally:
            os.environ.pop("TSSHIM_TEST_OFFSET", None)
            sys.modules.pop("usercfg", None)

    def test_describe(self):
        d = tsshim_loader.describe(loader("train", ROOT))
        self.assertTrue(d["shareable"])
        self.assertEqual(d["sampler"], "random(replacement=False,num_samples=8)")
        self.assertEqual(d["collate"], "default")
        f = d["dataset"]["folder"]
        self.assertEqual(f["root"], os.path.realpath(os.path.join(ROOT, "train")))
        self.assertEqual((f["samples"], f["classes"]), (8, ["cat", "dog"]))
        first = d["dataset"]["transforms"]["transform"]["state"]["transforms"][1][0]
        self.assertEqual(first["class"], "torchvision.transforms.transforms.RandomResizedCrop")
        self.assertEqual(first["state"]["size"], ["tuple", [224, 224]])

    def test_transform_state_not_printed(self):
        """Parameters a transform's repr does not show still tell loaders apart
        (they made different batches under one key), and an object whose state
        we cannot see makes the loader unshareable."""
        def k(*tfs):
            return self.shareable(DataLoader(self.ds(transform=T.Compose(list(tfs))), batch_size=4))
        big = torch.arange(1600.0).reshape(40, 40)
        big2 = big.clone()
        big2[20, 20] = -1.0
        pairs = [
            (T.ConvertImageDtype(torch.float16), T.ConvertImageDtype(torch.float64)),
            (T.RandomCrop(4, padding=2), T.RandomCrop(4, padding=2, padding_mode="reflect")),
            (T.RandomCrop(4, padding=2), T.RandomCrop(4, padding=2, fill=7)),
            (T.RandomCrop(4), T.RandomCrop(4, pad_if_needed=True)),
            (T.RandomPerspective(0.2), T.RandomPerspective(0.7)),
            (T.ElasticTransform(alpha=30.0), T.ElasticTransform(alpha=60.0)),
            (T.LinearTransformation(big, torch.zeros(40)), T.LinearTransformation(big2, torch.zeros(40))),
            (T.RandomApply(torch.nn.ModuleList([T.RandomCrop(4, fill=1)])),
             T.RandomApply(torch.nn.ModuleList([T.RandomCrop(4, fill=2)]))),
        ]
        for a, b in pairs:
            ka, kb = k(T.ToTensor(), a), k(T.ToTensor(), b)
            self.assertNotEqual(ka, kb, "%r / %r" % (a, b))
            self.assertEqual(k(T.ToTensor(), a), ka, repr(a))  # the same transform built again
        # an object of the user's own: its code and attributes describe it
        class Scale:
            def __init__(self, f):
                self.f = f

            def __call__(self, x):
                return x * self.f
        self.assertEqual(k(T.ToTensor(), Scale(2)), k(T.ToTensor(), Scale(2)))
        self.assertNotEqual(k(T.ToTensor(), Scale(2)), k(T.ToTensor(), Scale(3)))
        import threading
        self.refused(DataLoader(self.ds(transform=T.Compose([T.ToTensor(), Scale(threading.Lock())])),
                                batch_size=4), "transform state cannot be described")

        class Slotted:
            __slots__ = ("f",)

            def __call__(self, x):
                return x
        self.refused(DataLoader(self.ds(transform=Slotted()), batch_size=4),
                     "transform state cannot be described")


def main():
    global ROOT
    if len(sys.argv) == 4 and sys.argv[1] == "--key":
        print(key(loader(sys.argv[2], sys.argv[3])))
        return 0
    with tempfile.TemporaryDirectory(prefix="tsshim-fp.") as root:
        ROOT = root
        make_images(root)
        t0 = time.time()
        prog = unittest.main(argv=[sys.argv[0], "-v"], exit=False)
        print("fingerprint tests: %.1f s" % (time.time() - t0))
        return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
