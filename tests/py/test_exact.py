# SPDX-License-Identifier: MIT
"""Exact mode's stand-ins for a DataLoader iterator (shim/python/tsshim_exact.py),
checked against torch's own iterator in a plain Python process (no shim):

  _Mirror        draws from the job's generators what the iterator draws, at
                 the same points, and yields the index batches it would
  _Generators    own_iter(): the iterator made from copies of the generators
                 as they stood gives the same batches and touches no job
                 generator; restore() undoes draws made since
  _default_start_method  the start method of a loader that names none, the
                 same before and after the process's first child, fixing
                 nothing (each check in a fresh interpreter)

Run by tests/scenarios/layer.sh with /usr/bin/python3 (needs torch):
  python3 tests/py/test_exact.py      (TSSHIM_PYDIR: the layer's directory)
"""
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.environ.get("TSSHIM_PYDIR") or os.path.join(HERE, "..", "..", "shim", "python")
sys.path.insert(0, os.path.abspath(PYDIR))

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset, SubsetRandomSampler  # noqa: E402

import tsshim_exact  # noqa: E402
import tsshim_feed  # noqa: E402

N = 50


class Noisy(Dataset):
    """Each sample draws from the worker's torch generator, as an augmentation does."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return torch.tensor([float(i)]) + torch.rand(1), i


def states(loader):
    """torch's default generator and the loader's, as bytes."""
    g = loader.generator
    return (torch.get_rng_state().numpy().tobytes(), None if g is None else g.get_state().numpy().tobytes())


def make(kind):
    if kind == "default":  # no generator: shuffling draws from torch's default one
        return DataLoader(Noisy(), batch_size=4, shuffle=True, num_workers=2)
    if kind == "own":  # the loader's generator drives the sampler, to its end
        g = torch.Generator()
        g.manual_seed(5)
        return DataLoader(Noisy(), batch_size=4, shuffle=True, num_workers=2, generator=g)
    if kind == "subset":
        return DataLoader(Noisy(), batch_size=3, sampler=SubsetRandomSampler(list(range(0, N, 2))),
                          num_workers=2, prefetch_factor=3)
    if kind == "sequential":
        return DataLoader(Noisy(), batch_size=7, num_workers=2, drop_last=True)
    raise ValueError(kind)


KINDS = ("default", "own", "subset", "sequential")


def real_run(loader, take=None):
    """(batches, index batches, generator states after) of torch's own iterator
    taken for `take` batches (all when None), with a draw after each batch."""
    rec = tsshim_feed.RecordingBatchSampler(loader.batch_sampler)
    rec.recording = True
    inner = loader.batch_sampler
    object.__setattr__(loader, "batch_sampler", rec)
    try:
        it = iter(loader)
    finally:
        object.__setattr__(loader, "batch_sampler", inner)
    out, steps = [], []
    for k, b in enumerate(it):
        out.append(b)
        steps.append(torch.rand(1).item())  # the job's training step draws between batches
        if take is not None and k + 1 >= take:
            break
    del it
    return out, list(rec.notes)[:len(out)], steps, states(loader)


class Mirror(unittest.TestCase):
    def check(self, kind, take=None):
        torch.manual_seed(3)
        loader = make(kind)
        before_default = torch.get_rng_state()
        before_gen = None if loader.generator is None else loader.generator.get_state()
        batches, idx, steps, after = real_run(loader, take)
        # the same job again, from the same state, with the mirror in the iterator's place
        torch.set_rng_state(before_default)
        if before_gen is not None:
            loader.generator.set_state(before_gen)
        m = tsshim_exact._Mirror(loader, torch)
        got, msteps = [], []
        for _ in range(len(batches)):
            got.append(m.take())
            m.put()
            msteps.append(torch.rand(1).item())
        self.assertEqual(got, idx, "%s: the mirror's index batches are the iterator's" % kind)
        self.assertEqual(msteps, steps, "%s: draws between batches see the same generator" % kind)
        self.assertEqual(states(loader), after, "%s: generators end where the iterator leaves them" % kind)

    def test_whole_epochs(self):
        for kind in KINDS:
            self.check(kind)

    def test_epochs_left_early(self):
        # With the loader's own generator the sampler draws again at its end, as it
        # makes its last batch (the 13th of "own"): the iterator gets there with
        # prefetch_factor * num_workers = 4 batches asked ahead, so after the job's
        # 9th batch; leaving after the 8th it never does, and neither may the mirror.
        for kind in KINDS:
            for take in (3, 8, 9, 11):
                self.check(kind, take=take)

    def test_premise_the_mirror_without_the_base_seed_draw_is_caught(self):
        torch.manual_seed(3)
        loader = make("default")
        before = torch.get_rng_state()
        _, idx, _, after = real_run(loader)
        torch.set_rng_state(before)
        it = iter(loader._index_sampler)  # the sampler's draws without the base seed's before them
        self.assertNotEqual([list(next(it))], idx[:1], "a mirror off by one draw must give other batches")


class OwnIter(unittest.TestCase):
    def test_the_batches_of_the_iterator_made_at_iter_and_no_job_generator_touched(self):
        for kind in KINDS:
            torch.manual_seed(3)
            loader = make(kind)
            gens = tsshim_exact._Generators(loader, torch)
            batches, _, _, _ = real_run(loader)
            now = states(loader)
            again = list(gens.own_iter(loader, type(loader).__iter__))
            self.assertEqual(states(loader), now, "%s: own_iter drew from the job's generators" % kind)
            self.assertEqual(len(again), len(batches))
            for a, b in zip(again, batches):
                self.assertTrue(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]),
                                "%s: own_iter's batches are the iterator's at iter()" % kind)

    def test_restore_undoes_the_draws(self):
        for kind in KINDS:
            torch.manual_seed(3)
            loader = make(kind)
            was = states(loader)
            gens = tsshim_exact._Generators(loader, torch)
            m = tsshim_exact._Mirror(loader, torch)
            for _ in range(3):
                m.put()
            torch.rand(2)
            gens.restore(loader)
            self.assertEqual(states(loader), was, "%s: restore puts the generators back" % kind)


def fresh(code):
    """Run code in a fresh interpreter that imported the layer: its printed lines."""
    pre = "import sys; sys.path.insert(0, %r); import multiprocessing as mp, tsshim_exact as ex\n" % os.path.abspath(PYDIR)
    out = subprocess.run([sys.executable, "-c", pre + code], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise AssertionError(out.stderr)
    return out.stdout.split()


class StartMethod(unittest.TestCase):
    def test_the_same_before_and_after_the_first_child(self):
        # get_start_method(allow_none=True) is None until the first child starts:
        # jobs that made an epoch with workers keyed the next one apart from those
        # that had read theirs from a feed (exact_batches case same: 5 feeds, not 3)
        before, after = fresh("print(ex._default_start_method())\n"
                              "p = mp.Process(target=print); p.start(); p.join()\n"
                              "print(ex._default_start_method())")
        self.assertEqual(before, after)
        self.assertEqual(before, fresh("p = mp.Process(target=print); p.start(); p.join()\n"
                                       "print(mp.get_start_method())")[0])

    def test_a_named_context_keys_as_the_default_of_that_name(self):
        # multiprocessing_context="fork" makes the workers the default makes on
        # Linux: they shared nothing before (keyed "fork" and "default:fork")
        named = DataLoader(Noisy(), batch_size=4, num_workers=2,
                           multiprocessing_context=tsshim_exact._default_start_method())
        plain = DataLoader(Noisy(), batch_size=4, num_workers=2)
        self.assertEqual(tsshim_exact.ExactState(named).static["context"],
                         tsshim_exact.ExactState(plain).static["context"])

    def test_the_jobs_own_and_nothing_fixed(self):
        # the job's set_start_method, made after ours was asked, still works and is seen
        got = fresh("a = ex._default_start_method()\n"
                    "other = 'spawn' if a != 'spawn' else 'fork'\n"
                    "mp.set_start_method(other)\n"
                    "print(a, other, ex._default_start_method())")
        self.assertNotEqual(got[0], got[1])
        self.assertEqual(got[2], got[1])


if __name__ == "__main__":
    unittest.main(verbosity=2)
