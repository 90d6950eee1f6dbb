# SPDX-License-Identifier: MIT
"""Exact mode at the DataLoader (TSSHIM_MODE=exact): whole batches shared
between jobs whose loaders make the same epoch, byte for byte.

A DataLoader with workers makes an epoch out of
  - its dataset, transforms, sampler kind and collate function (the key of
    tsshim_loader, which holds the code of the job's own classes and
    functions),
  - the generators its iterator draws from, as they stand when it is made:
    the workers' base seed, then the sampler's seed or permutation (batch i
    goes to worker i mod num_workers, whose torch, random and numpy
    generators are seeded from the base seed before worker_init_fn runs),
  - its batch size, drop_last, worker count, worker_init_fn and start method,
  - the Python, torch, torchvision, Pillow and numpy it runs with.
Two iterations that agree on all of them (the epoch key below) make the same
batches. The first job to make such an iterator (the producer) runs its own
DataLoader and publishes every batch with its dataset indices into a feed of
that key; the others (consumers) read those batches, without a worker or a
file read of their own.

What a consumer still does as its own iterator would:
  - Its random draws: the base seed, then its batch sampler, driven as the
    real iterator drives it (prefetch_factor * num_workers batches of indices
    when the iterator is made, one more with every batch it hands out), so
    the job's generators stand where they would without the shim. Those
    index batches are also what each batch read is checked against.
  - When the feed cannot give it its next batch (the producer died, left,
    stalled; the batch read is not the one its sampler expects), the rest of
    the epoch comes from the job's own DataLoader made from copies of the
    generators as they stood at iter(): it makes the batches given already
    once more (that is how its workers' generators get where they were) and
    drops them. Slower, still exact.

Not shared (one `info` line; the decoded-image cache still serves them): no
workers (batches are then made in the job's own thread, between its own
random draws), persistent workers (a worker's generators carry over from
epochs the consumer did not run), unordered delivery, loaders the socket key
refuses.
"""
import collections
import ctypes
import errno
import hashlib
import json
import sys
import time

import tsshim_feed as feedmod
import tsshim_hook as hook

VERSION = 1            # bump when the epoch key changes: old and new never share
WAIT_TIMEOUTS = 5      # a consumer waits this many TSSHIM_TIMEOUT_MS for a batch, then makes its own


class _Stop(Exception):
    """The feed cannot give this epoch's next batch: the rest is the job's own."""


def _versions():
    out = {"python": sys.version}
    for name in ("torch", "torchvision", "PIL", "numpy"):
        m = sys.modules.get(name)
        if m is not None:
            out[name] = [str(getattr(m, "__version__", "?")), str(getattr(m, "__file__", "?"))]
    return out


class ExactState:
    """What exact mode knows of one DataLoader (kept on it): the parts of its epoch
    key that come from the loader, or why it does not share. Worked out again at
    every iter(): a job may change its transforms, its dataset or a global they
    read between epochs (progressive resizing, a curriculum), and two jobs whose
    loaders stood alike at their first epoch no longer make the same later ones."""

    def __init__(self, loader):
        self.static = None
        self.iters = 0          # iterators made of this loader: part of each epoch's key
        self.why = self._eligible(loader)

    __reduce__ = feedmod.LoaderState.__reduce__  # a copy or a pickle of the loader begins afresh

    def _eligible(self, loader):
        import tsshim_loader
        key, why = tsshim_loader.fingerprint(loader)
        if not key:
            return why
        if loader.num_workers <= 0:
            return "no workers (its batches are made between the job's own random draws)"
        if loader.persistent_workers:
            return "persistent workers (their generators carry over from earlier epochs)"
        if not getattr(loader, "in_order", True):
            return "in_order=False (batches come in the order workers finish them)"
        wif = loader.worker_init_fn
        wif_d = None if wif is None else tsshim_loader._function(wif)
        if wif is not None and wif_d is None:
            return "worker_init_fn %s is not a plain module-level function" % tsshim_loader._callable_name(wif)
        ctx = loader.multiprocessing_context
        if ctx is None:
            ctx = _default_start_method()  # the same workers as a context of that name
        else:
            ctx = getattr(ctx, "_name", type(ctx).__name__)
        self.static = {
            "v": VERSION, "key": key, "len": len(loader), "nindex": len(loader.dataset),
            "batch_size": loader.batch_size, "drop_last": bool(loader.drop_last),
            "workers": loader.num_workers, "worker_init": wif_d,
            "context": ctx,
            # seeded generators the user's code reads as globals: forked workers inherit them
            "rngs": tsshim_loader.rng_state(),
            "versions": _versions(),
        }
        self.nindex = len(loader.dataset)
        return None


def _default_start_method():
    """The start method of a loader without a multiprocessing_context: the one
    the job set, else the platform's. Not get_start_method(allow_none=True)
    alone: it is None until the process starts its first child, so a job that
    had made an epoch with its workers keyed its next one apart from jobs that
    had read theirs from its feed, and they stopped sharing after the first
    epoch. Nor allow_none=False: that fixes the default, and a later
    set_start_method of the job's would fail."""
    try:
        import multiprocessing.context as mpc
        dc = mpc._default_context
        return dc.get_start_method(allow_none=True) or dc._default_context._name
    except Exception:
        return "?"


class _Generators:
    """The generators a loader's iterator draws from, as they stand now: the
    loader's (the base seed; torch's default one when None) and the sampler's
    (when it has one)."""

    def __init__(self, loader, torch):
        self.torch = torch
        self.default = torch.get_rng_state()
        self.loader_gen = self._copy(loader.generator)
        s = loader.sampler
        self.has_sampler_gen = hasattr(s, "generator")
        sg = getattr(s, "generator", None)
        self.same = sg is not None and sg is loader.generator
        self.sampler_gen = self.loader_gen if self.same else self._copy(sg)
        # torch's default generator is drawn from only where one of them is None
        # (a RandomSampler without one draws its seed from it): a job that gives
        # its DataLoader a generator of its own shares whatever its model drew
        self.uses_default = loader.generator is None or (self.has_sampler_gen and sg is None)

    def _copy(self, g):
        if g is None:
            return None
        c = self.torch.Generator(device=g.device)
        c.set_state(g.get_state())
        return c

    def digest(self):
        h = hashlib.sha256()
        h.update(self.default.numpy().tobytes() if self.uses_default else b"default unused")
        for g in (self.loader_gen, self.sampler_gen):
            h.update(b"\0none" if g is None else b"\0" + g.get_state().numpy().tobytes())
        h.update(b"same" if self.same else b"apart")
        return h.hexdigest()

    def restore(self, loader):
        """Put the job's generators back as they stood (what we drew is undone)."""
        self.torch.set_rng_state(self.default)
        if loader.generator is not None and self.loader_gen is not None:
            loader.generator.set_state(self.loader_gen.get_state())
        sg = getattr(loader.sampler, "generator", None)
        if sg is not None and not self.same and self.sampler_gen is not None:
            sg.set_state(self.sampler_gen.get_state())

    def own_iter(self, loader, orig_iter):
        """The loader's own iterator, made from fresh copies of the generators as
        they stood: every draw it makes is its own, none touches the job's. Its
        draws from torch's default generator all come while it is made (the base
        seed, the sampler's seed or permutation at its first batch), and the
        default state is put back after."""
        torch = self.torch
        now = torch.get_rng_state()
        lg, sg = self._copy(self.loader_gen), None
        if self.has_sampler_gen:
            sg = lg if self.same else self._copy(self.sampler_gen)
        mine_lg, s = loader.generator, loader.sampler
        mine_sg = getattr(s, "generator", None)
        torch.set_rng_state(self.default)
        object.__setattr__(loader, "generator", lg)
        if self.has_sampler_gen:
            object.__setattr__(s, "generator", sg)
        try:
            return orig_iter(loader)
        finally:
            object.__setattr__(loader, "generator", mine_lg)
            if self.has_sampler_gen:
                object.__setattr__(s, "generator", mine_sg)
            torch.set_rng_state(now)


class _Mirror:
    """The job's batch sampler driven as its own multiprocessing iterator drives
    it: the same draws from the job's generators at the same points, and the
    index batches that come out (what each batch must hold)."""

    def __init__(self, loader, torch):
        # _BaseDataLoaderIter.__init__: the base seed, then _reset primes the prefetch loop
        torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
        self.it = iter(loader._index_sampler)
        self.expected = collections.deque()
        self.done = False
        for _ in range(loader.prefetch_factor * loader.num_workers):
            self.put()

    def put(self):
        """_try_put_index: one more batch of indices (the real one does it as each batch comes)."""
        if self.done:
            return
        try:
            self.expected.append(list(next(self.it)))
        except StopIteration:
            self.done = True

    def take(self):
        return self.expected.popleft() if self.expected else None


def iterate(loader, orig_iter):
    """iter(loader) in exact mode: an iterator of ours, or None (the caller runs orig_iter)."""
    if loader.__dict__.get("_tsshim_private"):
        return None
    st = loader.__dict__.get("_tsshim_exact")
    if st is None:
        st = loader.__dict__["_tsshim_exact"] = ExactState(loader)
        if st.why:
            hook.log("info", "DataLoader batches not shared in exact mode: %s; "
                     "its decodes are still shared" % st.why)
    else:
        was = st.why
        st.why = st._eligible(loader)  # the loader as it stands now (ExactState)
        if st.why and st.why != was:
            hook.log("info", "DataLoader batches not shared in exact mode: %s; "
                     "its decodes are still shared" % st.why)
    if st.why:
        return None
    lib = feedmod._bind()
    if lib is None:
        return None
    torch = sys.modules["torch"]
    gens = _Generators(loader, torch)
    st.iters += 1
    parts = dict(st.static, gens=gens.digest(), iter=st.iters)
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    key = "x" + hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()[:15]
    if key in feedmod._feeds:  # this process makes that very epoch already (two loaders alike)
        return None
    try:
        feed = feedmod._Feed(lib, key, _label(loader), st.nindex)
    except feedmod.Fallback as e:
        hook.log("info", "DataLoader batches not shared in exact mode: %s" % e)
        return None
    feedmod._feeds[key] = feed  # closed at exit if the epoch is not over by then
    try:
        ep = _ExactEpoch(loader, orig_iter, st, feed, gens, torch)
    except BaseException:
        # the job's own iterator is made next (the hook) and must draw as without us
        _close(feed)
        gens.restore(loader)
        raise
    return feedmod.SharedIter(loader, None, None, gen=ep.run(), on_close=lambda: _close(feed))


def _close(feed):
    """Leave an epoch's feed (again: a no-op)."""
    if feedmod._feeds.get(feed.key) is feed:
        del feedmod._feeds[feed.key]
    feed.close()


def _label(loader):
    ds = loader.dataset
    root = getattr(ds, "root", None)
    return "exact %s%s batch=%d" % (type(ds).__name__, " " + str(root) if root is not None else "",
                                    loader.batch_size)


class _ExactEpoch:
    """One iteration of the loader in exact mode, as producer or consumer. Made at
    iter(), so that its random draws come where the job's own iterator makes them."""

    def __init__(self, loader, orig_iter, st, feed, gens, torch):
        self.loader, self.orig_iter, self.st, self.feed = loader, orig_iter, st, feed
        self.gens, self.torch = gens, torch
        self.lib, self.h = feed.lib, feed.h
        self.nb = len(loader)
        self.producer = feed.role() == feedmod.ROLE_PRODUCER
        self.real = self.rec = self.mirror = None
        self.attach_failed = None  # why the consumer cannot read the feed at all
        if self.producer:
            self.real, self.rec = self._recorded_iter()
        else:
            self.mirror = _Mirror(loader, torch)
            self.lib.tsshim_feed_epoch_begin(self.h)  # the reads note their samples' indices (read_ids)
            ret = self.lib.tsshim_feed_attach(self.h, 1)  # at the stream epoch's first batch
            if ret:
                self.attach_failed = "cannot attach to the feed: %s" % feedmod._err(ret)
        self.served = self.copied = 0

    def _recorded_iter(self):
        """The job's own iterator (its own draws), its batch sampler recorded."""
        loader = self.loader
        rec = feedmod.RecordingBatchSampler(loader.batch_sampler)
        rec.recording = True
        return feedmod.with_batch_sampler(loader, rec, lambda: self.orig_iter(loader)), rec

    def run(self):
        try:
            if self.producer:
                yield from self.produce()
            else:
                yield from self.consume()
        finally:
            _close(self.feed)
            if not self.producer:
                hook.log("info", "exact feed %s: iteration %d of this loader: %d of %d batches read from the feed%s"
                         % (self.feed.key, self.st.iters, self.served, self.nb,
                            " (%d of them copied: the job held every view the feed lends)" % self.copied
                            if self.copied else ""))

    # -- producer --
    def produce(self):
        real, rec = self.real, self.rec
        publishing = True
        k = 0
        while k < self.nb:
            t0 = time.process_time_ns()
            try:
                batch = next(real)
            except StopIteration:
                break
            except (Exception, KeyboardInterrupt, SystemExit) as e:
                # the job's dataset raised (or Ctrl-C came, or an alarm's handler
                # raised, while it waited): the job sees it at this next(), as without
                # the shim, and may go on; the stream stops here (its consumers make
                # the rest on their own, this batch's exception included). An
                # interrupt may have come while the batch was waited for: it still
                # comes, so it is not counted (one from the dataset lost its batch:
                # the loop meets the StopIteration one next() sooner).
                if rec.notes:
                    rec.notes.popleft()
                if publishing:
                    self.lib.tsshim_feed_set_unshareable(self.h)
                    publishing = False
                if isinstance(e, Exception):
                    k += 1
                yield feedmod._Raised(e)
                continue
            indices = rec.notes.popleft() if rec.notes else None
            if publishing and k == 0 and self.lib.tsshim_feed_others(self.h) == 0:
                # Nobody to read it: a job alone pays nothing. One who comes later
                # would miss this batch and make its epoch itself anyway; the flag
                # tells it so at once.
                self.lib.tsshim_feed_set_unshareable(self.h)
                publishing = False
            if publishing:
                try:
                    publishing = self.publish(batch, indices, k == self.nb - 1, time.process_time_ns() - t0)
                except Exception as e:  # NotCarried, Fallback, or a fault of ours: the job goes on unshared
                    self.lib.tsshim_feed_set_unshareable(self.h)
                    hook.log("info", "exact feed %s: batches not published: %s"
                             % (self.feed.key, feedmod._why_off(e)))
                    publishing = False
            k += 1
            yield batch
        else:
            # Ask once more, as a for loop over it does: its StopIteration shuts its
            # workers down now. Left to its __del__, an exception the job caught
            # (its traceback holds the iterator's frames, in a cycle of torch's own)
            # kept them alive until the garbage collector ran, once inside a forked
            # worker of the next loader, where that __del__ failed.
            try:
                next(real)
            except Exception:  # its StopIteration, or an exception of the job's it raised as it ended
                pass

    def publish(self, batch, indices, last, cpu_ns):
        """Publish one batch; False: not any more (we were replaced)."""
        torch = self.torch
        schema, leaves, n = feedmod.describe_batch(batch, torch)
        if indices is None or len(indices) != n:
            raise feedmod.NotCarried("a batch's dataset indices are not known")
        idx = torch.tensor(indices, dtype=torch.int64)
        ret = feedmod.publish_leaves(self.lib, self.h, self.feed.stall_ms, leaves, n, schema, idx, last, 0, cpu_ns)
        if ret in (-errno.EPERM, -errno.EDEADLK):
            return False
        if ret:
            raise feedmod.Fallback("cannot publish a batch: %s" % feedmod._err(ret))
        return True

    # -- consumer --
    def consume(self):
        k = 0
        why = self.attach_failed
        if why is None:
            try:
                for batch in self.read_all():
                    k += 1
                    self.mirror.put()  # the real iterator's put as it hands out a batch
                    yield batch
                return
            except _Stop as e:
                why = str(e)
            except Exception as e:  # a fault of ours: the job's own loader makes the rest
                why = feedmod._why_off(e)
            self.lib.tsshim_feed_detach(self.h)
        if k < self.nb:
            yield from self.own_rest(k, why)

    def own_rest(self, k, why):
        """The epoch's batches from k on, from the job's own DataLoader made afresh
        (its first k batches made again and dropped)."""
        hook.log("info", "exact feed %s: %s; batches %d-%d are the job's own (%d made again first)"
                 % (self.feed.key, why, k, self.nb - 1, k))
        it = self.gens.own_iter(self.loader, self.orig_iter)
        for _ in range(k):
            try:
                next(it)
            except StopIteration:
                return
            except Exception:  # the job was given this batch, or the dataset's error for it
                pass
        while True:
            try:
                batch = next(it)
            except StopIteration:
                return
            except (Exception, KeyboardInterrupt, SystemExit) as e:  # the job's dataset raised: the iterator goes on, as torch's does
                batch = feedmod._Raised(e)
            self.mirror.put()
            yield batch

    def read_all(self):
        torch, lib, h = self.torch, self.lib, self.h
        pin = bool(self.loader.pin_memory) and torch.cuda.is_available()
        seen = None  # (schema node, bytes per sample) whose layout nodes, dtypes are
        for k in range(self.nb):
            node, ns, sample_bytes = self.next_info()
            if seen != (node, sample_bytes):
                nodes, dtypes = feedmod.stream_layout(node, sample_bytes, torch)
                seen = (node, sample_bytes)
            expected = self.mirror.take()
            if expected is None or ns != len(expected):
                raise _Stop("batch %d holds %d samples, the job's sampler %s"
                            % (k, ns, "none" if expected is None else len(expected)))
            npos = len(nodes)
            want = (ctypes.c_uint64 * npos)(*[ns * sb for sb in sample_bytes])
            got = (ctypes.c_uint64 * npos)()
            ptr = (ctypes.c_void_p * npos)()
            vid, eoe = ctypes.c_uint64(), ctypes.c_int()
            ret = self.wait(lambda ms: lib.tsshim_feed_read_view(h, npos, want, ptr, got, ctypes.byref(eoe),
                                                                 ctypes.byref(vid), ms))
            if ret == 0:
                leaves = feedmod.view_tensors(lib, h, vid.value, ptr, got, ns, nodes, dtypes, torch)
            else:  # -EXDEV: the job holds too many of our views (it keeps its batches): a copy
                leaves = [torch.empty([ns] + nd["shape"], dtype=dt) for nd, dt in zip(nodes, dtypes)]
                dst = (ctypes.c_void_p * npos)(*[t.data_ptr() for t in leaves])
                self.wait(lambda ms: lib.tsshim_feed_read(h, npos, want, dst, got, ctypes.byref(eoe), ms))
                self.copied += 1
            if any(got[p] != want[p] for p in range(npos)):
                raise _Stop("batch %d was not whole in the feed" % k)
            ids = self.read_ids(ns)
            if ids != expected:
                raise _Stop("batch %d is not the one the job's sampler made" % k)
            if bool(eoe.value) != (k == self.nb - 1):
                raise _Stop("the stream's epoch ends at batch %d, the job's at %d" % (k, self.nb - 1))
            if pin:
                leaves = [t.pin_memory() for t in leaves]
            lib.tsshim_feed_served(h, 1, ns)
            self.served += 1
            yield feedmod._build(node, leaves)
            del leaves

    def read_ids(self, n):
        ids = feedmod.read_ids(self.lib, self.h, n, self.torch)
        if ids is None:
            raise _Stop("the feed did not say which samples a batch holds")
        return ids.tolist()

    def next_info(self):
        npos, ns, se = ctypes.c_uint32(), ctypes.c_uint64(), ctypes.c_uint64()
        sb = (ctypes.c_uint64 * feedmod.MAX_POS)()
        buf = ctypes.create_string_buffer(feedmod.SCHEMA_MAX)
        slen = ctypes.c_uint32()
        self.wait(lambda ms: self.lib.tsshim_feed_next(self.h, ms, ctypes.byref(npos), ctypes.byref(ns),
                                                       ctypes.byref(se), sb, buf, ctypes.byref(slen)))
        try:
            node = json.loads(buf.raw[:slen.value].decode())
        except ValueError:
            raise _Stop("the stream's schema is not readable")
        if se.value != 0:
            raise _Stop("the feed holds a second epoch")
        return node, ns.value, list(sb)[:npos.value]

    def wait(self, call):
        """call(ms) in slices of SLICE_MS (Ctrl-C is served between them) until it
        gives data; _Stop when nobody will: the producer gave up publishing, we
        were elected producer (ours died or left with the epoch unpublished), we
        were evicted, or WAIT_TIMEOUTS timeouts went by."""
        waited = 0
        limit = WAIT_TIMEOUTS * self.feed.timeout_ms
        while True:
            ret = call(feedmod.SLICE_MS)
            if ret in (0, -errno.EXDEV):
                return ret
            if ret != -errno.ETIMEDOUT:
                raise _Stop("reading the feed failed: %s" % feedmod._err(ret))
            if self.lib.tsshim_feed_flags(self.h) & feedmod.UNSHAREABLE:
                raise _Stop("the producer stopped publishing")
            if self.lib.tsshim_feed_role(self.h) == feedmod.ROLE_PRODUCER:
                # Elected after the call's last look: what the producer published
                # before it left is still ours (the ring's look after an election
                # sees every batch that will come).
                ret = call(0)
                if ret in (0, -errno.EXDEV):
                    return ret
                # nobody publishes the rest now: say so to the others at once
                self.lib.tsshim_feed_set_unshareable(self.h)
                raise _Stop("the producer is gone")
            waited += feedmod.SLICE_MS
            if waited >= limit:
                raise _Stop("no batch for %d ms" % waited)
