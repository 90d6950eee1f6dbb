# SPDX-License-Identifier: MIT
"""The PyTorch layer's own private loaders (shim/python/tsshim_feed.py), in a
plain Python process: what needs no shim and no feed.

Run by tests/scenarios/layer.sh with /usr/bin/python3 (needs torch):
  python3 tests/py/test_layer.py      (TSSHIM_PYDIR: the layer's directory)
"""
import ctypes
import multiprocessing.process
import multiprocessing.util
import os
import resource
import sys
import tempfile
import threading
import time
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.environ.get("TSSHIM_PYDIR") or os.path.join(HERE, "..", "..", "shim", "python")
sys.path.insert(0, os.path.abspath(PYDIR))

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import tsshim_feed  # noqa: E402

N = 64


class Squares(Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return torch.tensor([i * i])


def _abort(marks):
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file
    with open(marks, "a") as f:
        f.write("%d\n" % os.getpid())
    os.abort()


def abort_at_exit(worker_id):
    """worker_init_fn: the worker aborts as it exits, after its loop (fork and
    spawn alike), as one of case dw's did under make asan."""
    multiprocessing.util.Finalize(None, _abort, args=(os.environ["TEST_LAYER_MARKS"],), exitpriority=0)


class DroppedPrivateLoader(unittest.TestCase):
    def setUp(self):
        fd, self.marks = tempfile.mkstemp(prefix="test_layer.")
        os.close(fd)
        os.environ["TEST_LAYER_MARKS"] = self.marks

    def tearDown(self):
        os.unlink(self.marks)

    def drop_after_one_batch(self):
        """A private loader (2 workers that abort at exit) made by the layer, one
        batch taken, then closed on a thread of its own as _Pending drops one,
        while the main thread goes on (sleeps): the RuntimeError torch raised in it, or
        None; and how many workers aborted."""
        loader = DataLoader(Squares(), batch_size=4, shuffle=True, num_workers=2, worker_init_fn=abort_at_exit)
        st = tsshim_feed.LoaderState(loader, "0" * 16, "shareable")
        gen = st.remainder(loader, DataLoader.__iter__, torch.arange(N), 0)
        batch, cut, _ = next(gen)
        self.assertEqual(sorted(i * i for i in cut), sorted(batch.flatten().tolist()))
        closer = threading.Thread(target=gen.close, name="tsshim-private")
        raised = None
        # torch finds a dead worker only until the closing thread's join reaps
        # it: the join is made slow, so that a watched worker's death is always
        # seen (without it, the watched drop raised in 7 of 12 runs here; dw,
        # under make asan, failed in 1 of 31)
        plain_join = multiprocessing.process.BaseProcess.join

        def slow_join(proc, timeout=None):
            time.sleep(1)
            return plain_join(proc, timeout)
        multiprocessing.process.BaseProcess.join = slow_join
        try:
            closer.start()
            deadline = time.monotonic() + 20
            calm = None  # from when the closer is done and both workers aborted
            while time.monotonic() < deadline and (calm is None or time.monotonic() - calm < 0.5):
                try:
                    time.sleep(0.01)
                except RuntimeError as e:  # each watched worker's death, as it is seen
                    raised = raised or e
                if calm is None and not closer.is_alive() and self.aborted() == 2:
                    calm = time.monotonic()
        finally:
            multiprocessing.process.BaseProcess.join = plain_join
        return raised, self.aborted()

    def aborted(self):
        with open(self.marks) as f:
            return len(f.read().split())

    def test_its_workers_dying_do_not_raise_in_the_job(self):
        raised, aborted = self.drop_after_one_batch()
        self.assertEqual(aborted, 2, "the workers did not abort: this tested nothing")
        self.assertIsNone(raised, "a worker of a loader the layer dropped raised in the job's thread")

    def test_watched_they_would(self):
        """The premise: with its workers left in torch's watch (the layer before
        _unwatch_workers), the same drop raises in the job's thread."""
        plain = tsshim_feed._unwatch_workers
        tsshim_feed._unwatch_workers = lambda it: None
        try:
            raised, aborted = self.drop_after_one_batch()
        finally:
            tsshim_feed._unwatch_workers = plain
        self.assertEqual(aborted, 2)
        self.assertIsInstance(raised, RuntimeError)
        self.assertIn("killed by signal", str(raised))


class FakeFeedLib:
    """The C calls an epoch makes to learn what it lacks, answered from lists:
    the stream's epoch under way with `rest` not made yet, and `lost` noted as
    made before we joined and never read."""

    def __init__(self, rest, npub, lost):
        self.rest, self.npub, self.lost = rest, npub, lost

    @staticmethod
    def _put(ptr, ids):
        t = torch.tensor(ids, dtype=torch.int64)
        ctypes.memmove(ptr, t.data_ptr(), 8 * len(ids))

    def tsshim_feed_stream_state(self, h, epoch, ended, rest, nrest, npub, ms):
        epoch._obj.value, ended._obj.value = 3, 0
        self._put(rest, self.rest)
        nrest._obj.value, npub._obj.value = len(self.rest), self.npub
        return 0

    def tsshim_feed_lost(self, h, out, cap, n):
        self._put(out, self.lost)
        n._obj.value = len(self.lost)
        return 0


def fake_epoch(lib, nindex=20):
    feed = types.SimpleNamespace(lib=lib, h=0, stall_ms=1000, key="fake")
    st = types.SimpleNamespace(nindex=nindex, kind="random", epoch_samples=nindex, subset=None)
    return tsshim_feed._Epoch(DataLoader(Squares(), batch_size=4), None, st, feed)


class WhatAnEpochLacks(unittest.TestCase):
    """A joiner that came after the stream's epoch started notes what was made
    before it joined (published, or made by a producer alone) as lost."""

    def test_a_stream_that_stops_leaves_the_rest_and_the_head_to_make(self):
        """The producer stopped publishing (its loader raised, a batch it cannot
        carry): what we make privately is the stream's rest and the head we
        never read. Before, only the rest: the epoch ended 4 samples short."""
        ep = fake_epoch(FakeFeedLib(rest=list(range(10, 20)), npub=10, lost=[0, 1, 2, 3]))
        ep.loss_noted = True
        ep.plan_rest(None)
        rest, npub, carry, _ = ep.rest_plan
        self.assertEqual(rest.tolist(), [0, 1, 2, 3] + list(range(10, 20)))
        self.assertEqual(npub, 6)
        self.assertFalse(ep.loss_noted, "the loss is taken once")

    def test_what_was_made_privately_since_is_not_lost(self):
        """The head made privately (a joiner in index order catches up first) is
        given already: not lost again when the epoch ends after an eviction.
        Before, it was made twice (sequential.sh case pl: 528 samples)."""
        ep = fake_epoch(FakeFeedLib(rest=[], npub=0, lost=list(range(8))))
        ep.give(torch.tensor([0, 1, 2, 3]))
        ep.hold_carry(torch.tensor([4]), 1)
        self.assertEqual(ep.take_lost().tolist(), [5, 6, 7])


if __name__ == "__main__":
    unittest.main(verbosity=2)
