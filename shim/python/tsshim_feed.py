# SPDX-License-Identifier: MIT
"""DataLoader sharing (issue 4): what iterating a hooked DataLoader does.

The mechanism lives in the C shim (core/feed.c, reached through ctypes on the
library that is already loaded); this module decides, per epoch, which of
three things the job's iteration is:

  producer   the job's own DataLoader runs for real (same RNG draws, same
             batches as without the shim); every batch is also published to
             the loader's feed, then yielded unchanged.
  consumer   no worker starts, no file is read: batches are cut from the
             feed at the job's own batch size, in the stream's order, until
             the stream's epoch ends.
  successor  a consumer that became producer mid-epoch (the producer died,
             left, or sat idle longer than TSSHIM_TIMEOUT_MS): it produces
             exactly the samples of the stream's epoch not published yet,
             with a private DataLoader built from the job's own settings,
             and reads them back like any consumer.

Any failure turns sharing off for the loader, with one notice: the rest of
the epoch is the samples the job was not given yet (a private loader makes
them), and later epochs are the job's own DataLoader's; user exceptions pass
through as is.
"""
import collections
import ctypes
import errno
import hashlib
import itertools
import json
import os
import sys
import threading
import time
import weakref

import tsshim_hook as hook

ROLE_PRODUCER, ROLE_CONSUMER = 1, 2
EOE = 1
UNSHAREABLE = 1
SLICE_MS = 100          # longest C call: Ctrl-C is served at least this often
MAX_POS = 16
SCHEMA_MAX = 8192

_lib = None
_feeds = {}             # key -> _Feed, one per key and process
_feeds_lock = threading.Lock()  # threads of a job iterating loaders of one key (feed_for, _run)
_no_feeds = False  # close_all ran (the interpreter is exiting), or a forked child: no feed opens


class Fallback(Exception):
    """Sharing cannot go on: the message says why (one notice)."""


class NotCarried(Exception):
    """A batch the feed cannot carry."""


class NotProducer(Exception):
    """Replaced as producer while we were about to produce."""


class _Unshareable(Fallback):
    """The producer gave up publishing (it found its batches cannot be shared)."""


class _Hold:
    """What producer_waits_too_long knows of a private part under way: when it last
    looked, how many samples the batch since then held, the seconds a
    sample takes (the job's step included), since when the producer waits.
    Before the first batch is made, pace is the least it can be: the job's
    step alone (LoaderState.step_floor) over the batch size, or None."""

    def __init__(self, pace=None):
        self.t = None
        self.made = 0
        self.pace = pace
        self.since = None


class _Pending:
    """next(src) for a private batch, run on a thread of its own while the main
    thread looks at the producer (private_rest): a multiprocess loader's first
    batch waits for its workers to start, which may take longer than the
    stall time, and nothing the job does tells how long. Only the loader's
    iterator machinery runs on that thread (the batch comes from a worker; the
    iterator is made, its workers started, on the job's thread). drop(): the
    batch is not wanted; src is closed (its workers stopped) once next()
    returns, on that thread, without the job waiting for it."""

    def __init__(self, src):
        self.src, self.out, self.dropped = src, None, False
        self.lock, self.done = threading.Lock(), threading.Event()
        threading.Thread(target=self.run, name="tsshim-private", daemon=True).start()

    def run(self):
        try:
            self.out = (_user(next, self.src), None)
        except BaseException as e:  # StopIteration and _UserError included: the job's thread raises them
            self.out = (None, e)
        with self.lock:
            self.done.set()
            dropped = self.dropped
        if dropped:
            self.close()

    def result(self):
        batch, exc = self.out
        if exc is not None:
            raise exc
        return batch

    def drop(self):
        with self.lock:
            self.dropped = True
            done = self.done.is_set()
        if done:
            self.close()

    def close(self):
        try:
            self.src.close()
        except Exception as e:
            hook.log("debug", "a private loader dropped did not close: %s: %s" % (type(e).__name__, e))


class _GatherNow(Exception):
    """A private batch under way outlasts what the producer may wait on our place
    (watched_next): the rest is gathered from the stream's next epoch."""


class _PlaceLost(Exception):
    """Evicted while reading the stream epoch after ours for what ours lacks
    (gather) or past its rest (skip_to_epoch_start): that place is gone, and
    the head is no substitute for it."""


class _EpochGone(Exception):
    """Evicted, and the stream's epoch we were reading is over: what is ahead
    of us in the feed belongs to a later one."""


class _Gap(Exception):
    """Evicted in mid-epoch of a loader in index order: what the stream
    published while we were away comes next (catch_up), not at the epoch's end."""


class _Restart(Exception):
    """Evicted before this epoch read anything (its place was taken while the job
    did other things, a validation loader's between passes): the epoch begins
    afresh, as at iter()."""


class _Unordered(Exception):
    """The stream at our place is not the sample our epoch needs next, in index
    order: the rest of the epoch is made privately (catch_up)."""


class _UserError(Exception):
    """What the job's own code (its dataset, collate function, sampler, workers)
    raised inside the layer: it reaches the job as it is (_run), and is never
    taken for a failure of the layer, which any other exception is."""

    def __init__(self, exc):
        super().__init__()
        self.exc = exc


class _Delegate:
    """Yielded once by an epoch's generator that does not run the epoch itself:
    SharedIter hands every next() to it (DataLoader's own iterator) from then on."""

    def __init__(self, it):
        self.it = it


class _Raised:
    """Yielded by an epoch's generator for an exception of the job's own loader
    that the job sees at this next() while its iterator goes on (SharedIter
    raises it): an exception raised through a generator would end it."""

    def __init__(self, exc):
        self.exc = exc


def _why_off(e):
    """The one-line reason sharing goes off for a layer exception e."""
    if isinstance(e, Fallback):
        return str(e)
    if isinstance(e, NotCarried):
        return "batches cannot be shared: %s" % e
    # a fault of the layer, not the job's: where it was is what a report needs
    return "internal error: %s: %s%s" % (type(e).__name__, e, hook.where(e))


def _off_level(e):
    """How loudly sharing going off for e is said: a batch the stream cannot
    carry (strings, a 0-d tensor) is the job's choice, said at info as a
    loader left alone at its first iter() is; failures at warn."""
    return "info" if isinstance(e, NotCarried) else "warn"


def _user_or_interrupt(fn, *args):
    """_user(fn, *args), where a KeyboardInterrupt (Ctrl-C, or an alarm's handler
    that raises it) or SystemExit inside the job's own loader is the job's too:
    it reaches the job at this next() and the iterator goes on, as torch's does.
    Raised through the epoch's generator, it ended it (every later next() a
    StopIteration, the epoch cut short)."""
    try:
        return _user(fn, *args)
    except (KeyboardInterrupt, SystemExit) as e:
        raise _UserError(e) from e


def _user(fn, *args):
    """fn(*args), where fn runs the job's own code (see _UserError)."""
    try:
        return fn(*args)
    except StopIteration:
        raise
    except Exception as e:
        raise _UserError(e) from e


# --- the C side ----------------------------------------------------------------

def _bind():
    global _lib
    if _lib is not None:
        return _lib or None
    _lib = False
    try:
        lib = ctypes.CDLL(None)
        lib.tsshim_feed_open
    except (OSError, AttributeError):
        return None  # the shim is not loaded: the layer stays silent
    u32, u64, i32, vp, cp = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p
    pu64, pi32, pu32 = ctypes.POINTER(u64), ctypes.POINTER(i32), ctypes.POINTER(u32)
    sig = {
        "open": (i32, [cp, cp, u64]), "open_why": (cp, []), "close": (None, [i32]), "role": (i32, [i32]),
        "timeout_ms": (i32, [i32]), "stall_ms": (i32, [i32]),
        "take_idle": (i32, [i32]), "set_idle": (i32, [i32, i32]), "idle_while_away": (i32, [i32, i32]),
        "flags": (i32, [i32]), "set_unshareable": (i32, [i32]),
        "publish": (i32, [i32, u32, u32, u64, pu64, ctypes.POINTER(vp), vp, u64, cp, u32, u64, u32]),
        "evict_laggards": (i32, [i32]), "evict_away": (i32, [i32, u32]), "set_away": (i32, [i32, i32]),
        "stream_state": (i32, [i32, pu64, pi32, vp, pu64, pu64, u32]),
        "attach": (i32, [i32, i32]), "detach": (i32, [i32]), "at_head": (i32, [i32]),
        "holds_producer": (i32, [i32]),
        "next": (i32, [i32, u32, pu32, pu64, pu64, pu64, ctypes.c_char_p, pu32]),
        "read": (i32, [i32, u32, pu64, ctypes.POINTER(vp), pu64, pi32, u32]),
        "read_view": (i32, [i32, u32, pu64, ctypes.POINTER(vp), pu64, pi32, pu64, u32]),
        "release_view": (i32, [i32, u64]),
        "served": (i32, [i32, u64, u64]),
        "gpu": (i32, [i32]),
        "others": (i32, [i32]),
        "made": (i32, [i32, u32, u64, ctypes.POINTER(ctypes.c_int64), u64, u64]),
        "gpu_published": (i32, [i32, u32, ctypes.POINTER(vp), pu64]),
        "gpu_read": (i32, [i32, u32, ctypes.POINTER(vp), pu64, i32]),
        "epoch_begin": (i32, [i32]), "note_loss": (i32, [i32]), "lost": (i32, [i32, vp, u64, pu64]),
        "read_ids": (i32, [i32, vp, u64, pu64]),
        "next_index": (i32, [i32, u32, ctypes.POINTER(ctypes.c_int64)]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, "tsshim_feed_" + name)
        fn.restype, fn.argtypes = res, args
    _lib = lib
    return lib


def _err(ret):
    return errno.errorcode.get(-ret, str(ret))


class _Feed:
    """One loader key's feed in this process (a member of its session)."""

    def __init__(self, lib, key, label, nindex):
        self.lib, self.key = lib, key
        self.h = lib.tsshim_feed_open(key.encode(), label.encode("utf-8", "replace")[:95], nindex)
        if self.h < 0:
            why = lib.tsshim_feed_open_why() or b""
            raise Fallback("cannot open feed %s: %s%s" % (key, _err(self.h),
                                                          ": " + why.decode("utf-8", "replace") if why else ""))
        self.timeout_ms = max(10, lib.tsshim_feed_timeout_ms(self.h))
        # how long we wait on a consumer that does not read: the ring's own rule
        self.stall_ms = max(self.timeout_ms, lib.tsshim_feed_stall_ms(self.h))
        self.busy = False   # an iterator of ours is running on it
        self.active = False  # ... and is inside next() now (not suspended between batches)
        self.attached = False
        self.broke_off = False  # we left an epoch half-way: next time, on from the head
        self.reattach = False   # our place may be past the start of our next epoch (epoch_gone)
        self.skip_to_next = False  # our place is inside a stream epoch our last one gathered from (gather)

    def role(self):
        return self.lib.tsshim_feed_role(self.h)

    def close(self):
        if self.h >= 0:
            self.lib.tsshim_feed_close(self.h)
        self.h = -1
        self.attached = False


def feed_for(key, label, nindex):
    lib = _bind()
    if lib is None:
        return None
    with _feeds_lock:  # two threads' loaders of one key: one feed, one member (the process)
        f = _feeds.get(key)
        if f is None or f.h < 0:
            f = _feeds[key] = _Feed(lib, key, label, nindex)
        return f


def close_all():
    """At exit (atexit): every feed closed, for good. A loader iterated after
    this (an atexit handler of the job's that ran after ours) runs on its own,
    as without the shim: before, it found its feed closed, sharing went off
    part-way, and its epoch came from a private loader in another order."""
    global _no_feeds
    _no_feeds = True
    for f in list(_feeds.values()):
        f.close()
    _feeds.clear()


def forget_all():
    """In a forked child (os.register_at_fork): the parent's feeds are the
    parent's, forgotten, not closed (the C side lets go of its state in a
    child itself), and the C side opens no feed in a forked child (ECHILD):
    its loaders run on their own, as without the shim. Before, the child
    read the parent's handles (EBADF), and its epoch came from a private
    loader in another order."""
    global _no_feeds
    _no_feeds = True
    for f in list(_feeds.values()):
        f.h = -1
        f.attached = False
        f.busy = f.active = False
    _feeds.clear()


# --- waits across feeds ----------------------------------------------------------
#
# A job iterates one loader at a time. While it waits in one feed (for data, or
# for a slot as producer), the others it is not iterating are marked away, so
# that their producers need not wait the stall time (ten timeouts) on its place
# there: it may be waiting on them through this feed. A job validating every K
# steps (its validation loader's producer, waiting on the other job's place
# there) and one validating after its epoch (waiting in the training feed for
# that producer's next batch) waited on each other for 10 s an epoch before
# the eviction broke it (pytorch_share case vk).

#
# The feeds we produce are marked idle meanwhile, unless an iterator of ours is
# inside next() on one (another thread's): one whose epoch is only suspended
# between our batches is not being made either. A consumer waiting there takes
# it over after the timeout. Two jobs interleaving a training and a validation
# loader at different batch sizes, each the producer of the loader the other
# was waiting on, waited on each other for ever (found by a differential run).

AWAY_MS = 200    # away that long, a laggard is evicted at once: it loses its place, and makes it up
_away = set()    # handles of our feeds marked away
_idle = set()    # handles of feeds we produce, marked idle while we wait in another


def waiting_in(h):
    """A wait in feed h goes on: the feeds of ours no iterator of ours reads are
    away, and those we produce and make no batch of now are idle."""
    for f in list(_feeds.values()):
        if f.h < 0 or f.h == h:
            continue
        if not f.busy and f.h not in _away:
            _away.add(f.h)
            f.lib.tsshim_feed_set_away(f.h, 1)
        if not f.active and f.h not in _idle and f.lib.tsshim_feed_idle_while_away(f.h, 1) == 1:
            _idle.add(f.h)


def done_waiting():
    """The wait is over: back from every feed marked away or idle."""
    if _away and _lib is not None:
        for h in _away:
            _lib.tsshim_feed_set_away(h, 0)  # a handle closed since answers an error: nothing to clear
        _away.clear()
    if _idle and _lib is not None:
        for h in _idle:
            _lib.tsshim_feed_idle_while_away(h, 0)  # only our mark: a successor's stays
        _idle.clear()


def not_away(feed):
    """An iterator of ours reads feed now."""
    if feed.h in _away:
        _away.discard(feed.h)
        feed.lib.tsshim_feed_set_away(feed.h, 0)


# --- batches as positions --------------------------------------------------------

def _flatten(batch, torch, leaves):
    """(schema node, leaves appended): tensors along dim 0 in nested tuples/lists/dicts."""
    if isinstance(batch, torch.Tensor):
        if batch.device.type != "cpu" or batch.dim() < 1 or batch.is_sparse or batch.is_quantized:
            raise NotCarried("batch holds a %s tensor of shape %s" % (batch.device.type, tuple(batch.shape)))
        node = {"t": len(leaves), "dtype": str(batch.dtype).replace("torch.", "")}
        if batch.dim() == 4 and not batch.is_contiguous() and batch.is_contiguous(memory_format=torch.channels_last):
            # carried as its bytes lie (N, H, W, C), and given back channels_last:
            # before, a consumer's batch came contiguous (is_contiguous(), .view()
            # answered otherwise, and the layout's speed was lost)
            batch = batch.permute(0, 2, 3, 1)
            node["perm"] = [0, 3, 1, 2]
        leaves.append(batch)
        node["shape"] = list(batch.shape[1:])
        return node
    if isinstance(batch, tuple) and not hasattr(batch, "_fields"):
        return {"tuple": [_flatten(x, torch, leaves) for x in batch]}
    if isinstance(batch, list):
        return {"list": [_flatten(x, torch, leaves) for x in batch]}
    if type(batch) is dict and all(type(k) is str for k in batch):
        keys = list(batch)  # the collate function's order: batch.values() is unpacked by position
        return {"dict": keys, "v": [_flatten(batch[k], torch, leaves) for k in keys]}
    raise NotCarried("batch holds a %s (the feed carries tensors in tuples, lists and dicts)"
                     % type(batch).__name__)


def _build(node, leaves):
    if "t" in node:
        t = leaves[node["t"]]
        return t.permute(*node["perm"]) if "perm" in node else t  # stream_layout checked it
    if "tuple" in node:
        return tuple(_build(x, leaves) for x in node["tuple"])
    if "list" in node:
        return [_build(x, leaves) for x in node["list"]]
    return {k: _build(v, leaves) for k, v in zip(node["dict"], node["v"])}


def _tensor_nodes(node, out):
    if "t" in node:
        out.append(node)
    for k in ("tuple", "list", "v"):
        for x in node.get(k, ()):
            _tensor_nodes(x, out)
    return out


def describe_batch(batch, torch):
    """(schema bytes, contiguous leaves, nsamples) of a collated batch."""
    leaves = []
    node = _flatten(batch, torch, leaves)
    if not leaves or len(leaves) > MAX_POS:
        raise NotCarried("batch has %d tensors (1..%d carried)" % (len(leaves), MAX_POS))
    n = leaves[0].shape[0]
    if n == 0 or any(t.shape[0] != n for t in leaves) or any(t.numel() == 0 for t in leaves):
        raise NotCarried("batch tensors do not share a non-empty first dimension")
    schema = json.dumps(node, sort_keys=True, separators=(",", ":")).encode()
    if len(schema) > SCHEMA_MAX:
        raise NotCarried("batch structure too large to describe")
    return schema, [t.contiguous() for t in leaves], n


def stream_layout(node, sample_bytes, torch):
    """(tensor nodes in position order, their dtypes) of a stream's schema node,
    checked against the bytes per sample the slot says; Fallback if they disagree."""
    nodes = _tensor_nodes(node, [])
    nodes.sort(key=lambda n: n["t"])
    dtypes = [getattr(torch, n.get("dtype", "?"), None) for n in nodes]
    if len(nodes) != len(sample_bytes):
        raise Fallback("the stream's schema names %d tensors, its batches hold %d" % (len(nodes), len(sample_bytes)))
    if not all(isinstance(dt, torch.dtype) for dt in dtypes):  # a newer torch's, or a peer's garbage
        raise Fallback("the stream's tensors have a dtype this torch does not know: %s"
                       % ", ".join(str(n.get("dtype")) for n in nodes))
    for n, dt, sb in zip(nodes, dtypes, sample_bytes):
        if "perm" in n and n["perm"] != [0, 3, 1, 2] or "perm" in n and len(n.get("shape", ())) != 3:
            raise Fallback("the stream's schema has a layout this layer does not make")
        per = torch.empty((), dtype=dt).element_size()
        for d in n["shape"]:
            per *= d
        if per != sb:
            raise Fallback("stream's sample size disagrees with its schema")
    return nodes, dtypes


def view_tensors(lib, h, view_id, ptr, got, n, nodes, dtypes, torch):
    """The n samples of a view (tsshim_feed_read_view: ptr, got per position)
    as tensors of the stream's layout. One storage per tensor, as the job's own
    batch has (pickling one, or sending it through a queue, carries that
    tensor, not the whole slot). Each keeps its buffer alive; when the last
    buffer goes, the view is released."""
    npos = len(nodes)
    left = [npos]

    def one_gone():
        left[0] -= 1
        if left[0] == 0:
            lib.tsshim_feed_release_view(h, view_id)
    bufs = [(ctypes.c_char * max(1, got[p])).from_address(ptr[p]) for p in range(npos)]
    for b in bufs:
        weakref.finalize(b, one_gone)
    if n == 0:
        return []
    return [torch.frombuffer(b, dtype=torch.uint8)[:got[p]].view(dt).view([n] + nd["shape"])
            for p, (b, nd, dt) in enumerate(zip(bufs, nodes, dtypes))]


def _join(carry, batch, torch):
    """The part of a batch we hold, (schema node, tensors), followed by the
    samples of `batch`, or None when their structure, dtypes or sample shapes differ."""
    try:
        schema, more, _ = describe_batch(batch, torch)
    except NotCarried:
        return None
    if schema != json.dumps(carry[0], sort_keys=True, separators=(",", ":")).encode():
        return None
    return _build(carry[0], [torch.cat([a, b]) for a, b in zip(carry[1], more)])


def _proc_cpu_ns(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * 1000000000 // os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0


# --- recording which indices each batch holds ----------------------------------

class RecordingBatchSampler:
    """Stands in for the loader's batch sampler while its iterator is made:
    the same batches, the same RNG draws, and a note of each batch's indices
    (batches arrive in order, so the notes line up with them)."""

    def __init__(self, inner):
        self.inner = inner
        self.notes = collections.deque()
        # Only while the layer produces from the iterator: a persistent_workers
        # iterator keeps this sampler for good, and every epoch it runs unshared
        # would otherwise pile up notes nobody reads.
        self.recording = False

    def __iter__(self):
        for b in self.inner:
            if self.recording:
                self.notes.append(list(b))
            yield b

    def __len__(self):
        return len(self.inner)


def with_batch_sampler(loader, sampler, make):
    """make() (an iterator of the loader) while loader.batch_sampler is sampler.
    DataLoader refuses batch_sampler changes after __init__; it is put back at once."""
    inner = loader.batch_sampler
    object.__setattr__(loader, "batch_sampler", sampler)
    try:
        return make()
    finally:
        object.__setattr__(loader, "batch_sampler", inner)


def publish_leaves(lib, h, stall_ms, leaves, n, schema, idx, eoe, stream_epoch, cpu_ns):
    """tsshim_feed_publish of a described batch (describe_batch), in slices of
    SLICE_MS; a consumer that stops reading for the stall time is evicted (it
    loses its place, not we our job). The call's last result."""
    npos = len(leaves)
    lens = (ctypes.c_uint64 * npos)(*[t.numel() * t.element_size() for t in leaves])
    srcs = (ctypes.c_void_p * npos)(*[t.data_ptr() for t in leaves])
    waited = 0
    while True:
        ret = lib.tsshim_feed_publish(h, npos, EOE if eoe else 0, n, lens, srcs,
                                      idx.data_ptr() if idx is not None else None,
                                      stream_epoch, schema, len(schema), cpu_ns, SLICE_MS)
        if ret != -errno.ETIMEDOUT:
            done_waiting()
            return ret
        waited += SLICE_MS
        waiting_in(h)
        lib.tsshim_feed_evict_away(h, AWAY_MS)
        if waited >= stall_ms:
            lib.tsshim_feed_evict_laggards(h)
            waited = 0


def read_ids(lib, h, n, torch):
    """The dataset indices of the n samples the last read brought, or None."""
    out = torch.empty(max(1, n), dtype=torch.int64)
    got = ctypes.c_uint64()
    if lib.tsshim_feed_read_ids(h, out.data_ptr(), n, ctypes.byref(got)) or got.value != n:
        return None
    return out[:n]


# --- one epoch -------------------------------------------------------------------

class SharedIter:
    """What iter(loader) returns for a loader that shares.

    The generator doing the work holds no reference to this object, so when
    the program drops the iterator (a `break` out of the for loop) it is
    closed at once and releases what it holds, as DataLoader's own iterator
    shuts its workers down at once."""

    def __init__(self, loader, state, orig_iter, gen=None, on_close=None):
        self._len = len(loader)
        # gen: batches of another mechanism's making (tsshim_exact), yielded as ours are;
        # on_close: what closing gen does not release when gen never started
        self._gen = gen if gen is not None else _run(loader, state, orig_iter, self._len)
        self._on_close = on_close

    def __iter__(self):
        return self

    def __next__(self):
        item = next(self._gen)
        if type(item) is _Raised:
            # Not `raise item.exc`: the traceback would hold this frame, whose item
            # holds the exception, a cycle that kept the epoch's iterator, and its
            # workers, alive until the garbage collector ran (in a forked worker of
            # the next loader, once, where its __del__ failed).
            exc, item = item.exc, None
            try:
                raise exc
            finally:
                exc = None
        if type(item) is _Delegate:
            # the loader's own iterator from here on: its exceptions, and its
            # StopIteration, reach the job as they do without the shim
            self._gen = item.it
            return next(self._gen)
        return item

    def __len__(self):
        return self._len

    def close(self):
        try:
            close = getattr(self._gen, "close", None)  # a delegate (DataLoader's own) has none
            if close is not None:
                close()
        finally:
            if self._on_close is not None:
                self._on_close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _run(loader, st, orig_iter, length):
    # The feed as it is now, at the first next(): the iterator this one
    # replaced (it = iter(dl) again, part-way) may have left it since iter().
    feed = None if st.disabled or _no_feeds else _open_feed(loader, st)
    yielded = 0
    with _feeds_lock:  # another thread's iterator of the same key may be starting now
        mine = feed is not None and not feed.busy
        if mine:
            feed.busy = True
    if not mine:
        # sharing went off, or a second live iterator of the same loader: it runs
        # on its own, SharedIter handing next() to that iterator from here on
        yield _Delegate(st.own_iter(loader, orig_iter) if feed is not None
                        else _unshared(loader, st, orig_iter) or orig_iter(loader))
        return
    not_away(feed)
    feed.active = True
    ep = _Epoch(loader, orig_iter, st, feed)
    user_exc = None
    try:
        try:
            for batch in ep.batches():
                yielded += 1
                feed.active = False
                yield batch
                feed.active = True
            return
        except _UserError as u:
            user_exc = u.exc  # raised below, outside this handler: its own context and cause kept
        except Fallback as e:
            st.disable(str(e))
            if ep.rest_plan is not None:
                # we had read all that was published: the rest of the stream's epoch,
                # made privately, completes ours (no sample twice, none lost)
                yield from ep.private_rest()
                return
        except Exception as e:  # NotCarried, or a fault of the layer (or of a peer's data it did not foresee)
            st.disable(_why_off(e), _off_level(e))
        if user_exc is not None:
            raise user_exc
        rest = length - yielded
        if rest > 0:
            yield from ep.unshared_rest(rest)
    finally:
        try:
            ep.finish()
        except Exception as e:  # releasing must not fail the job either
            hook.log("warn", "DataLoader layer: leaving the epoch failed: %s: %s%s"
                     % (type(e).__name__, e, hook.where(e)))
        feed.busy = feed.active = False


class _Epoch:
    def __init__(self, loader, orig_iter, st, feed):
        self.loader, self.orig_iter, self.st, self.feed = loader, orig_iter, st, feed
        self.lib, self.h = feed.lib, feed.h
        self.torch = sys.modules["torch"]
        self.source = None        # (iterator of (batch, indices), stream epoch) while producing
        self.real_open = False    # the job's own loader makes this epoch (we are its producer)
        self.schema = None
        self.stream_epoch = 0
        self.waited_ms = 0
        self.done_clean = False
        self.yielded = 0
        self.viewed = self.copied = 0  # consumer batches without / with a copy
        self.made = 0             # batches made as successor
        self.self_waits = 0       # slices spent waiting for data while we had batches to make
        self.gpu = False          # the process uses CUDA: yielded batches are registered for upload
        self.rest_plan = None     # (indices to make, samples published, carried batch part, what they are)
        self.pending = None       # (got, bytes per sample of position 0) of a copying read under way
        self.drawn = False        # this epoch drew what the job's own iterator would (own_draws)
        self.loss_noted = False   # evicted in mid-epoch: what we missed is made privately at its end
        self.loss_why = "published while it was away"
        self.layout = None        # (schema node, tensor nodes, dtypes, bytes per sample) of the stream (consume)
        self.gathering = False    # reading the stream's next epoch for what ours lacks (gather)
        self.skipping = False     # reading past the rest of a stream epoch (skip_to_epoch_start)
        self.given = None         # samples handed to the job this epoch (give); False: not known
        self.to_give, self.to_give_n = [], 0  # given, not yet in self.given (given_now)
        self.carry_ids = None     # dataset indices of the part of a batch we hold (carry), or None
        self.fresh = False        # consume has read nothing of this epoch yet: an eviction is a fresh start

    # -- what this epoch handed to the job --
    def give(self, ids):
        """Note the samples of a batch we hand to the job now (ids: their dataset
        indices, a tensor or a list; None, or any not an index: not known, and a fallback runs the
        job's own loader as before). What an epoch was given is what
        unshared_rest leaves out when the layer fails part-way."""
        if self.given is False:
            return
        if ids is None:
            self.given, self.to_give = False, []
            return
        # noted in bulk (given_now): a mask update a batch cost a tiny batch's
        # making again (36 us a batch)
        self.to_give.append(ids)
        self.to_give_n += len(ids)
        if self.to_give_n >= 4096:
            self.given_now()

    def given_now(self):
        """What give() noted so far: a mask over the dataset, None (nothing
        given yet) or False (not known)."""
        torch, n = self.torch, self.st.nindex
        if self.to_give and self.given is not False:
            parts = [x for x in self.to_give if isinstance(x, torch.Tensor)]
            lists = [x for x in self.to_give if not isinstance(x, torch.Tensor)]
            try:
                if lists:  # a producer's batches' indices, as its sampler gave them
                    parts.append(torch.tensor(list(itertools.chain.from_iterable(lists)), dtype=torch.int64))
                ids = torch.cat(parts)
            except (TypeError, ValueError, OverflowError, RuntimeError):  # not dataset positions
                ids = None
            if ids is None or len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= n):
                self.given = False
            else:
                if self.given is None:
                    self.given = torch.zeros(n, dtype=torch.bool)
                self.given[ids] = True
        self.to_give, self.to_give_n = [], 0
        return self.given

    def give_carry(self, cut=None):
        """give() for the part of a batch we held (its ids as hold_carry noted
        them: none noted is not known), joined to the batch of `cut` if given."""
        torch = self.torch
        ids, self.carry_ids = self.carry_ids, None
        if ids is not None and cut is not None:
            ids = torch.cat([ids, torch.as_tensor(cut, dtype=torch.int64)])
        self.give(ids)

    def hold_carry(self, ids, n):
        """We now hold the part of a batch (n samples; none when n is 0) whose
        samples are ids (None: not known)."""
        self.carry_ids = ids[:n] if ids is not None and n else None

    def unshared_rest(self, nbatches):
        """The rest of the epoch once sharing went off part-way (the layer failed):
        the samples of the job's epoch it was not given yet, made by a private
        loader, so the epoch holds every sample once, as without the shim. When
        that is not known (a batch whose samples the stream did not say), the
        job's own loader restarts for the epoch's remaining nbatches, as before,
        and may repeat samples of it."""
        torch, st = self.torch, self.st
        if self.given_now() is False or not nbatches:
            yield from itertools.islice(st.own_iter(self.loader, self.orig_iter), nbatches)
            return
        given = self.given if self.given is not None else torch.zeros(st.nindex, dtype=torch.bool)
        left = (~given).nonzero().flatten()
        npub = int(given.sum())
        if st.kind == "subset":
            npub = int(given[st.subset].sum())
        try:
            src = st.remainder(self.loader, self.orig_iter, left, npub)
        except Fallback:  # nothing left of it
            return
        hook.log("warn", "DataLoader layer: the rest of this epoch (%d samples it was not given yet) "
                 "is made by a private loader" % (st.epoch_samples - npub))
        for batch, _, _ in src:
            yield batch

    # -- helpers --
    def role(self):
        return self.lib.tsshim_feed_role(self.h)

    def attach(self, at_epoch_start=False):
        """At the head; or, when we start iterating afresh, at the start of the stream's
        current epoch while the ring still holds it (so that epoch is ours whole)."""
        ret = self.lib.tsshim_feed_attach(self.h, 1 if at_epoch_start else 0)
        if ret:
            raise Fallback("cannot attach to the feed: %s" % _err(ret))
        self.feed.attached = True
        self.feed.skip_to_next = False

    def finish(self):
        """End of the epoch, or the job broke out of it: release what we hold."""
        if self.viewed or self.copied:
            hook.log("debug", "feed %s: epoch read, %d batches without a copy, %d copied"
                     % (self.feed.key, self.viewed, self.copied))
        if self.made:
            hook.log("debug", "feed %s: %d batches made as successor, %d waits for data while making them"
                     % (self.feed.key, self.made, self.self_waits))
        if self.source is not None:
            self.source = None
        if self.real_open and self.st.rec is not None:
            self.st.rec.recording = False
            self.st.rec.notes.clear()
        if self.feed.h != self.h:
            # sharing went off during the epoch: our handle was closed, and may
            # be another loader's feed's by now (a validation loop's)
            return
        if self.real_open and not self.done_clean and self.role() == ROLE_PRODUCER and \
                self.lib.tsshim_feed_others(self.h) == 0:
            # We broke out of our own epoch and nobody reads the stream: nobody needs
            # the rest of it. Leave the feed, so that our next iter() starts a fresh
            # epoch from our own loader, as without the shim (staying, we would make
            # the rest of this one privately, a short epoch in another order).
            hook.log("debug", "feed %s: left the epoch early, alone in the feed: leaving it" % self.feed.key)
            self.st.leave_feed()
            return
        if self.role() == ROLE_PRODUCER:
            self.lib.tsshim_feed_set_idle(self.h, 1)
        if not self.done_clean and self.feed.attached:
            self.lib.tsshim_feed_detach(self.h)
            self.feed.attached = False
            self.feed.broke_off = True

    def stream_state(self, want_rest):
        """(stream epoch, ended, indices left, samples published). As producer this
        first claims the next slot (a fence against a replaced predecessor's late
        publish), waiting for consumers like a publish; NotProducer if replaced."""
        e, ended = ctypes.c_uint64(), ctypes.c_int()
        nrest, npub = ctypes.c_uint64(), ctypes.c_uint64()
        rest = self.torch.empty(self.st.nindex if want_rest else 0, dtype=self.torch.int64)
        waited = 0
        while True:
            ret = self.lib.tsshim_feed_stream_state(self.h, ctypes.byref(e), ctypes.byref(ended),
                                                   rest.data_ptr() if want_rest else None,
                                                   ctypes.byref(nrest), ctypes.byref(npub), SLICE_MS)
            if ret != -errno.ETIMEDOUT:
                break
            waited += SLICE_MS
            waiting_in(self.h)
            self.lib.tsshim_feed_evict_away(self.h, AWAY_MS)
            if waited >= self.feed.stall_ms:
                self.lib.tsshim_feed_evict_laggards(self.h)
                waited = 0
        done_waiting()
        # EDEADLK: elected with batches of our predecessor unread at our place (it
        # ended while we trained): those are ours to read first, like a consumer's
        if ret in (-errno.EPERM, -errno.EDEADLK):
            raise NotProducer()
        if ret:
            raise Fallback("cannot read the stream's state: %s" % _err(ret))
        return e.value, bool(ended.value), rest[:nrest.value], npub.value

    def publish(self, batch, indices, eoe, cpu_ns):
        """The batch's contiguous tensors once published; False: replaced as producer."""
        schema, leaves, n, idx = self.carried(batch, indices)
        ret = publish_leaves(self.lib, self.h, self.feed.stall_ms, leaves, n, schema, idx, eoe, self.stream_epoch,
                             cpu_ns)
        # EPERM: replaced while we worked. EDEADLK: elected again, but behind our own
        # place in the ring (a successor published while we were stopped): either way
        # the stream goes on without this batch and we read it like everyone else.
        if ret in (-errno.EPERM, -errno.EDEADLK):
            return False
        if ret:
            self.lib.tsshim_feed_set_unshareable(self.h)
            raise Fallback("cannot publish a batch: %s" % _err(ret))
        return leaves  # the batch as published (what the job uploads)

    def carried(self, batch, indices):
        """(schema, contiguous tensors, samples, indices as a tensor) of a batch the
        stream can carry; NotCarried when it cannot."""
        schema, leaves, n = describe_batch(batch, self.torch)
        if self.schema is None:
            self.schema = schema
        elif schema != self.schema:
            raise NotCarried("batch structure or sample shape changed between batches")
        idx = indices
        if idx is not None and not isinstance(idx, self.torch.Tensor):
            idx = self.torch.tensor(indices, dtype=self.torch.int64)
        if idx is not None and idx.numel() != n:
            # The collate function's dim 0 is not the batch's samples (sequence
            # first, two views concatenated, samples filtered out): the stream,
            # cut along dim 0 at other batch sizes, would split and mix them.
            raise NotCarried("the batch's first dimension (%d) is not its %d samples (the collate function "
                             "transposes, repeats or filters them)" % (n, idx.numel()))
        if self.st.custom_collate and all(n in t.shape[1:] for t in leaves):
            # A function of the user's own that put the samples along another
            # dimension of the same length (a sequence-first [T, B] with T = B)
            # would pass the check above: which dimension holds them is not known.
            # One tensor without such a dimension (the labels, [B]) tells: its
            # samples, and so every tensor's, are along dim 0.
            raise NotCarried("the collate function's batch has %d along its first dimension and another: "
                             "which holds the samples is not known" % n)
        return schema, leaves, n, idx

    def skip_own(self, batch_bytes):
        """Move our reader past the batch we just published (no copy)."""
        npos = len(batch_bytes)
        want = (ctypes.c_uint64 * npos)(*batch_bytes)
        got = (ctypes.c_uint64 * npos)()
        eoe = ctypes.c_int()
        ret = self.lib.tsshim_feed_read(self.h, npos, want, None, got, ctypes.byref(eoe), 0)
        if ret or got[0] != want[0]:
            self.attach()  # lost our place: start again at the head

    def register_upload(self, leaves, lens, published=False, view=False):
        """Tell the C shim that these tensors are the stream's batch, so that their
        upload is kept in (producer) or served from (consumer) the feed's GPU ring.
        The shim checks at the upload that their bytes did not change meanwhile."""
        if not self.gpu or not leaves:
            return
        npos = len(leaves)
        ptrs = (ctypes.c_void_p * npos)(*[t.data_ptr() for t in leaves])
        sizes = (ctypes.c_uint64 * npos)(*lens)
        if published:
            self.lib.tsshim_feed_gpu_published(self.h, npos, ptrs, sizes)
        else:
            self.lib.tsshim_feed_gpu_read(self.h, npos, ptrs, sizes, 1 if view else 0)

    def own_draws(self):
        """Draw the random numbers the job's own iterator would draw for this epoch,
        though it does not run: a new iterator's base seed (once for good with
        persistent workers), then its sampler's, which the samplers we share take
        all at their first batch (RandomSampler's seed, SubsetRandomSampler's
        permutation). So the job's later torch.rand() is what it is without the
        shim. Nothing here may fail the job."""
        if self.drawn:
            return
        self.drawn = True
        torch, loader, st = self.torch, self.loader, self.st
        try:
            persistent = loader.persistent_workers and loader.num_workers > 0
            if not (persistent and st.own_iter_made):
                if persistent:
                    # the draw its one iterator would make: that iterator, made
                    # later, must get this seed and not draw again (own_iter)
                    st.base_gen = _generator_copy(loader.generator, torch)
                torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
            st.own_iter_made = True
            sampler = getattr(loader, "_index_sampler", loader.batch_sampler)
            next(iter(sampler), None)
        except Exception as e:
            hook.log("debug", "feed %s: the loader's own random draws failed: %s: %s"
                     % (self.feed.key, type(e).__name__, e))

    # -- the epoch --
    def batches(self):
        # a CUDA job (the driver is loaded by now when the model is on the GPU)
        self.gpu = self.lib.tsshim_feed_gpu(self.h) == 1
        self.lib.tsshim_feed_epoch_begin(self.h)  # what this epoch reads or publishes is noted
        if self.feed.attached and self.feed.reattach:
            # our place was taken where the stream was when our last epoch found its
            # stream epoch over (epoch_gone): not necessarily an epoch's start
            self.lib.tsshim_feed_detach(self.h)
            self.feed.attached = False
        self.feed.reattach = False
        if self.feed.attached and self.feed.skip_to_next:
            self.skip_to_epoch_start()
        if not self.feed.attached:
            broke_off, self.feed.broke_off = self.feed.broke_off, False
            self.attach(at_epoch_start=not broke_off)
            self.note_head()
            if broke_off and self.role() == ROLE_PRODUCER:
                # We produce, and broke out of our last epoch while others read the
                # stream (finish): the rest of that stream epoch is theirs, not a
                # new epoch of ours (it was: a short epoch, and a loop taking
                # len(loader) batches died of StopIteration). Make it for them,
                # reading past it; our epoch is the next stream epoch, from our own
                # loader, whole, as without the shim.
                self.skip_to_epoch_start()
        if self.role() == ROLE_PRODUCER:
            self.lib.tsshim_feed_set_idle(self.h, 0)
            try:
                epoch, ended, _, _ = self.stream_state(False)
            except NotProducer:
                ended = False
            if ended and self.lib.tsshim_feed_at_head(self.h) == 1:
                self.stream_epoch = epoch + 1
                yield from self.produce_real()
                return
        try:
            yield from self.consume()
        except _SwitchToReal:
            # we became producer while waiting at the head of a finished stream epoch
            if not self.yielded:
                yield from self.produce_real()

    def produce_real(self):
        """This epoch runs on the job's own DataLoader; each batch is also published."""
        loader = self.loader
        real, rec = _user(self.st.real_iter, loader, self.orig_iter)
        self.real_open = True
        self.drawn = True  # the job's own iterator drew them
        nb = len(real) if hasattr(real, "__len__") else None
        workers = lambda: [w.pid for w in getattr(real, "_workers", []) if w.pid]  # noqa: E731
        k = 0
        publishing = True
        alone = False  # the last batch was made with nobody else in the feed
        while True:
            t0 = time.process_time_ns()
            w0 = None if alone else sum(_proc_cpu_ns(p) for p in workers())
            try:
                batch = _user_or_interrupt(next, real)
            except StopIteration:
                if publishing and nb is not None and k < nb:
                    # The job's own loader ended its epoch early (its dataset raised
                    # StopIteration, as an old idiom does): so does the job's, as
                    # without the shim. The stream cannot end an epoch short (its
                    # consumers, and our next epoch, waited for batches that never
                    # came: a hang): it stops here, as for an exception below.
                    self.lib.tsshim_feed_set_unshareable(self.h)
                    self.st.disable("the job's loader ended its epoch after %d of %d batches; the stream "
                                    "stops here" % (k, nb), level="info")
                break
            except _UserError as u:
                # The job's own loader failed this batch (its dataset raised): the job
                # sees the exception at this next(), as without the shim, and may go on
                # with the next batch. The stream cannot (its consumers would wait for a
                # batch that never comes): it stops here, and they make the rest of its
                # epoch privately, as when a publish fails.
                if rec.notes:
                    rec.notes.popleft()  # the failed batch's indices
                k += 1
                if publishing:
                    exc_name = type(u.exc).__name__
                    if isinstance(u.exc, (KeyboardInterrupt, SystemExit)):
                        # The job was interrupted (Ctrl-C, an alarm's handler), not failed
                        # by its data: the stream need not stop. Leaving the feed (below)
                        # hands it on as a producer that exits does: a consumer makes the
                        # rest of the stream's epoch, this batch included (before, the
                        # stream stopped, and every consumer ran its own loader for the
                        # rest of its training). The job, if it goes on, runs its own.
                        why = "the job was interrupted (%s) in its loader; the stream goes on without it" % exc_name
                    else:
                        self.lib.tsshim_feed_set_unshareable(self.h)
                        why = "the job's loader raised %s; the stream stops here" % exc_name
                    self.st.disable(why, level="info")
                    publishing = None
                yield _Raised(u.exc)
                continue
            indices = rec.notes.popleft() if rec.notes else None
            eoe = nb is not None and k == nb - 1
            k += 1
            # Nobody else in the feed: past the epoch's first few (the ring's
            # depth, for a job started a moment after this one), the batch is only
            # noted (what a joiner or a successor must know of the stream's epoch),
            # not published. A job alone pays for no copy, no description of its
            # batch, no look at its workers' CPU (before: 10,000 tiny batches took
            # 2.0-2.4 s against 0.4-0.55 s without the shim).
            made, ids = 0, None
            if publishing and indices:
                n = len(indices)
                try:
                    ids = (ctypes.c_int64 * n)(*indices)
                except (TypeError, OverflowError):  # not dataset positions: publish says so
                    ids = None
                if ids is not None:
                    made = self.lib.tsshim_feed_made(self.h, EOE if eoe else 0, n, ids, self.stream_epoch, k - 1)
            alone = made == 1
            if publishing and not alone:
                cost = time.process_time_ns() - t0
                if w0 is not None:  # not looked at after a batch made alone: the main process's only
                    cost += max(0, sum(_proc_cpu_ns(p) for p in workers()) - w0)
                try:
                    ok = self.publish(batch, indices, eoe, cost)
                except Exception as e:  # Fallback, NotCarried, or a fault of the layer
                    # consumers see the flag and finish the epoch on their own; ours goes on
                    # from our own loader, unshared: no sample twice, none lost
                    self.lib.tsshim_feed_set_unshareable(self.h)
                    self.st.disable(_why_off(e), _off_level(e))
                    publishing = ok = None
                if ok:
                    leaves = ok
                    lens = [t.numel() * t.element_size() for t in leaves]
                    self.skip_own(lens)
                    self.register_upload(leaves, lens, published=True)
                elif ok is False:
                    # replaced while we worked: the successor produces the rest of the
                    # epoch, this batch included, and we read it like everyone else
                    hook.log("info", "feed %s: no longer producer; reading the rest of the epoch"
                             % self.feed.key)
                    del real
                    try:
                        yield from self.consume()
                    except _SwitchToReal:
                        # we lost our place while away (evicted) and the stream's epoch
                        # has ended since: like any evicted reader, our epoch lacks what
                        # was published meanwhile, and ends here
                        hook.log("info", "feed %s: the stream's epoch ended while we were away; "
                                 "this epoch ends after %d batches" % (self.feed.key, k - 1))
                    return
            if eoe:
                # Whole before the last batch goes out: a loop that takes exactly
                # len(loader) batches (range(len(dl)), zip, islice) closes us on
                # this yield and never asks for the StopIteration after it.
                self.done_clean = True
            self.give(indices)
            yield batch
        self.done_clean = True

    def consume(self):
        """Batches cut from the feed at our batch size, until the stream's epoch ends."""
        torch, loader = self.torch, self.loader
        bs = loader.batch_size
        pin = bool(loader.pin_memory) and torch.cuda.is_available()
        self.fresh = True
        while True:
            if self.loss_noted and self.in_order():
                # we joined where the ring no longer held the epoch's start: its head comes first
                yield from self.catch_up(None)
                if self.done_clean:
                    return
            try:
                node, sample_bytes = self.next_info()
                break
            except _Restart:
                self.attach(at_epoch_start=True)
                self.note_head()
            except (_EpochGone, _Gap) as e:
                if (yield from self.place_lost(e, None)):
                    return
        self.fresh = False
        nodes, dtypes = stream_layout(node, sample_bytes, torch)
        npos = len(nodes)
        self.layout = (node, nodes, dtypes, sample_bytes)
        want = (ctypes.c_uint64 * npos)(*[bs * sb for sb in sample_bytes[:npos]])
        while True:
            got = (ctypes.c_uint64 * npos)()
            eoe = ctypes.c_int()
            # no copy when the batch lies in one slot of the feed (pinned batches are copied)
            try:
                leaves = None if pin else self.read_view(npos, want, got, eoe, nodes, dtypes, sample_bytes)
            except (_EpochGone, _Gap) as e:  # a view is all or nothing: nothing was read
                if (yield from self.place_lost(e, None)):
                    return
                continue
            viewed = leaves is not None
            if not viewed:
                outs = [torch.empty([bs] + n["shape"], dtype=dt, pin_memory=pin) for n, dt in zip(nodes, dtypes)]
                dst = (ctypes.c_void_p * npos)(*[t.data_ptr() for t in outs])
                self.pending = (got, sample_bytes[0])
                try:
                    self.retry(lambda ms: self.lib.tsshim_feed_read(self.h, npos, want, dst, got, ctypes.byref(eoe),
                                                                    ms))
                except _Unshareable:
                    n = got[0] // sample_bytes[0]
                    self.hold_carry(self.read_ids(n) if n else None, n)
                    self.plan_rest((node, [t[:n] for t in outs]) if n else None)
                    raise
                except (_EpochGone, _Gap) as e:
                    n = got[0] // sample_bytes[0]
                    self.pending = None
                    self.hold_carry(self.read_ids(n) if n else None, n)
                    if (yield from self.place_lost(e, (node, [t[:n] for t in outs]) if n else None)):
                        return
                    continue
                finally:
                    self.pending = None
                n = got[0] // sample_bytes[0]
                leaves = [t[:n] if n < bs else t for t in outs]
            self.waited_ms = 0
            n = got[0] // sample_bytes[0]
            ids = self.read_ids(n) if n else None  # what the job is given (give)
            if eoe.value:
                # whole before its last batch goes out: a loop that takes exactly
                # len(loader) batches closes us on that yield (produce_real)
                self.done_clean = True
                lost = self.take_lost() if self.loss_noted else None
                if lost is not None and len(lost) and n < bs:
                    # the epoch's last, partial batch is the first of what we make privately
                    self.hold_carry(ids, n)
                    self.finish_lost(lost, (node, leaves) if n else None)
                    yield from self.private_rest()
                    return
            else:
                lost = None
            if n and (n == bs or not loader.drop_last):
                self.register_upload(leaves, list(got), view=viewed)
                self.yielded += 1
                if viewed:
                    self.viewed += 1
                else:
                    self.copied += 1
                self.lib.tsshim_feed_served(self.h, 1, n)
                self.own_draws()  # before our first batch, not before a switch to our own loader
                out = time.monotonic()
                self.give(ids)
                yield _build(node, leaves)
                self.st.note_step(time.monotonic() - out)
            del leaves
            if eoe.value:
                if lost is not None and len(lost):
                    self.finish_lost(lost, None)
                    yield from self.private_rest()
                return

    def note_head(self):
        """Just attached to begin an epoch: where the ring no longer held the stream
        epoch's start (a late joiner, a job that broke out of its last epoch or left
        it to make part of it privately), note what the stream had published of it.
        The samples of that head we do not read are made privately at the stream
        epoch's end, as an evicted reader's are: the job's epoch holds every sample
        once, len(loader) batches, as without the shim (a loop of range(len(dl))
        next() calls never meets a StopIteration)."""
        noted = self.lib.tsshim_feed_note_loss(self.h)
        if noted == 1:
            self.loss_noted = True
            self.loss_why = "made before it joined"
        elif noted == 2:
            # the stream is between epochs: what is ahead of us is the next one, whole
            self.lib.tsshim_feed_epoch_begin(self.h)

    def place_lost(self, e, carry):
        """Evicted while reading (e), holding the part of a batch `carry`: the
        stream's epoch is over (_EpochGone), or, in index order, what we missed
        comes next (_Gap). True when our epoch ended here."""
        if isinstance(e, _EpochGone):
            yield from self.epoch_gone(carry)
            return True
        yield from self.catch_up(carry)
        return self.done_clean

    def in_order(self):
        """Our epoch keeps the loader's index order (SequentialSampler: a job may
        pair its outputs with dataset positions), and we know what it was given."""
        return self.st.kind == "sequential" and self.given_now() is not False

    def had_mask(self, carry):
        """The samples this epoch has had, given or held (carry), as a mask over
        the dataset; None when that is not known."""
        if self.given_now() is False:
            return None
        had = self.given.clone() if self.given is not None else self.torch.zeros(self.st.nindex, dtype=self.torch.bool)
        if carry:
            ids = self.carry_ids
            if ids is None or len(ids) != carry[1][0].shape[0] or bool((ids < 0).any()):
                return None
            had[ids] = True
        return had

    def had(self, carry):
        """a when the samples this epoch has had are 0..a-1, as in index order; else None."""
        had = self.had_mask(carry)
        if had is None:
            return None
        a = int(had.sum())
        return a if bool(had[:a].all()) else None

    def make_privately(self, plan, carry, why):
        """The samples of plan (dataset indices, in the order made), after the
        part of a batch we hold, from a private loader (private_rest)."""
        self.rest_plan = (plan, self.st.epoch_samples - len(plan), carry, why)
        for batch in self.private_rest(may_gather=False, log=False):
            self.yielded += 1
            yield batch
        self.rest_plan = None

    def holding(self):
        """We still hold a place in our feed."""
        return self.feed.attached and self.feed.h == self.h

    def catch_up(self, carry):
        """A loader in index order keeps it. What the stream published of this
        epoch while we were not reading it (before we joined, or while we were
        away) is made privately now, in order, while we keep our place (the
        producer waits on it as on any slow reader, and private_rest leaves it
        once that wait grows too long); then the stream's samples we made
        already are read past, and we read on from the one after. The private
        part ends at a whole batch (up to a batch more than we lacked), so the
        stream is read on in whole batches. Where that cannot be done in order,
        the rest of the epoch is made privately (private_to_end). Sets done_clean
        when the epoch ended here."""
        torch, st, bs = self.torch, self.st, self.loader.batch_size
        self.fresh = False  # what we make is this epoch's: an eviction from here is a loss
        lost = self.take_lost()
        while True:
            a = self.had(carry)
            if a is None or lost is None:
                yield from self.private_to_end(carry, "not known in order")
                return
            b = max(a, int(lost.max()) + 1) if len(lost) else a
            n0 = carry[1][0].shape[0] if carry else 0
            m = a + -(-(b - a + n0) // bs) * bs - n0 if b - a + n0 else a
            m = min(m, st.epoch_samples)  # drop_last: our epoch ends at its last whole batch
            if m > a:
                hook.log("info", "feed %s: making %d samples privately (%s), in order, then reading on"
                         % (self.feed.key, m - a, self.loss_why))
                yield from self.make_privately(torch.arange(a, m), carry, self.loss_why)
                carry = None
                if not self.holding():  # we left our place: nobody waits on us
                    yield from self.private_to_end(None, "its place left")
                    return
            try:
                if self.read_past(m):
                    self.done_clean = True
                return
            except _Gap:  # evicted again meanwhile: what it missed comes next, the same way
                lost = self.take_lost()
            except (_EpochGone, _SwitchToReal, _Unordered, _Unshareable) as e:
                yield from self.private_to_end(None, "the stream moved on (%s)" % type(e).__name__.strip("_"))
                return

    def read_past(self, m):
        """Read past the stream's samples below m (we made them privately), to
        the sample m, or, our epoch ending at m, past the end of the stream's
        (True). _Unordered when the stream at our place is not where our epoch
        goes on."""
        npos, ns, se = ctypes.c_uint32(), ctypes.c_uint64(), ctypes.c_uint64()
        sb = (ctypes.c_uint64 * MAX_POS)()
        buf = ctypes.create_string_buffer(SCHEMA_MAX)
        slen = ctypes.c_uint32()
        idx = ctypes.c_int64()
        end = m >= self.st.epoch_samples
        while True:
            self.retry(lambda ms: self.lib.tsshim_feed_next_index(self.h, ms, ctypes.byref(idx)))
            j = idx.value
            if j < 0 or (not end and j > m):
                raise _Unordered()
            if j == m and not end:
                return False
            self.retry(lambda ms: self.lib.tsshim_feed_next(self.h, ms, ctypes.byref(npos), ctypes.byref(ns),
                                                         ctypes.byref(se), sb, buf, ctypes.byref(slen)))
            k = max(1, self.st.nindex - j) if end else m - j
            want = (ctypes.c_uint64 * npos.value)(*[k * sb[p] for p in range(npos.value)])
            got = (ctypes.c_uint64 * npos.value)()
            eoe = ctypes.c_int()
            self.retry(lambda ms: self.lib.tsshim_feed_read(self.h, npos.value, want, None, got,
                                                            ctypes.byref(eoe), ms))
            if eoe.value:
                if end:
                    return True
                raise _Unordered()

    def private_to_end(self, carry, why):
        """The rest of this epoch, made privately in index order: what it has not
        had yet (after the part of a batch we hold). We leave our place: our
        next epoch joins the stream afresh."""
        if self.holding():
            self.lib.tsshim_feed_detach(self.h)
            self.feed.attached = False
        self.done_clean = True
        had = self.had_mask(carry)
        if had is None:  # the part of a batch we hold is not known: what was given is
            had = self.had_mask(None)
        rest = (~had[:self.st.epoch_samples]).nonzero().flatten()  # drop_last: the whole batches' samples
        hook.log("info", "feed %s: the rest of this epoch is made privately, in order (%s)" % (self.feed.key, why))
        yield from self.make_privately(rest, carry, why)

    def take_lost(self):
        """At the end of an epoch that lost its place: the samples published while
        we were away that we never read (an index tensor), or None."""
        torch = self.torch
        self.loss_noted = False
        out = torch.empty(self.st.nindex, dtype=torch.int64)
        n = ctypes.c_uint64()
        if self.lib.tsshim_feed_lost(self.h, out.data_ptr(), self.st.nindex, ctypes.byref(n)):
            return None
        lost = out[:n.value]
        # The C side counts what we read or published; what we made privately
        # since (a joiner's head, caught up first) is ours too, not lost. Before,
        # a joiner evicted later made its head twice (sequential.sh pl: 528 samples
        # in a 400-sample epoch).
        given = self.given_now()
        if len(lost) and given is not None and given is not False:
            keep = ~given[lost]
            if self.carry_ids is not None:
                keep &= ~torch.isin(lost, self.carry_ids)
            lost = lost[keep]
        return lost

    def epoch_gone(self, carry):
        """Evicted, and the stream's epoch we were reading ended while we were away:
        the epoch ends here. Its samples we never read are made privately (the part
        of a batch we hold first) when the layer knows them: every sample of the
        dataset, or of the subset, once; with drop_last, as many of them as the
        epoch lacks (those it would drop are any, in a shuffled epoch, and the
        last, in order), when it knows what it was given. Otherwise the epoch
        ends short."""
        torch = self.torch
        self.done_clean = True
        lost = self.take_lost()
        st = self.st
        known = st.epoch_samples == (len(st.subset) if st.kind == "subset" else st.nindex)
        if lost is not None and st.kind == "subset":
            lost = lost[torch.isin(lost, st.subset)]
        mask = self.had_mask(carry) if not known else None
        had = int(mask.sum()) if mask is not None else None
        if lost is None or not len(lost) or (not known and (had is None or had >= st.epoch_samples)):
            hook.log("info", "feed %s: the stream's epoch ended while we were away; this epoch ends short"
                     % self.feed.key)
            self.lib.tsshim_feed_detach(self.h)
            self.feed.attached = False
            if carry and (carry[1][0].shape[0] == self.loader.batch_size or not self.loader.drop_last):
                self.give_carry()
                yield _build(*carry)
            return
        hook.log("info", "feed %s: the stream's epoch ended while we were away; this epoch ends here, "
                 "and what we never read of it is made privately" % self.feed.key)
        self.attach(at_epoch_start=True)  # the stream's newest epoch's start, while the ring holds it
        self.feed.reattach = True  # else the head: our next epoch notes what it lacks (batches)
        self.finish_lost(lost, carry)
        if not known:  # drop_last: the first epoch_samples - had of them (remainder)
            self.rest_plan = (lost, had, carry, self.loss_why)
        yield from self.private_rest()

    def finish_lost(self, lost, carry):
        """Make the lost samples privately (private_rest). We stay attached where
        our next epoch begins (the stream's next epoch's start): the producer
        waits on us meanwhile as on any slow reader, the stall time at most (an
        eviction then is noted like this one)."""
        self.rest_plan = (lost, self.st.epoch_samples - len(lost), carry, self.loss_why)

    def retry(self, call):
        """A feed call made in slices of up to SLICE_MS (call(ms)): waits serve
        on_wait (takeover, Ctrl-C), an eviction continues at the head; any other
        result is returned, errors but -EXDEV raise Fallback. A successor that
        still has batches to make does not wait on itself: it looks, and makes
        the next one when there is nothing to read."""
        while True:
            ms = 0 if self.making_rest() else SLICE_MS
            ret = call(ms)
            if ret == -errno.ETIMEDOUT:
                if ms:
                    waiting_in(self.h)
                self.on_wait(ms)
            elif ret == -errno.ESTALE:  # evicted while we were away: on from the head
                if self.skipping or self.gathering:
                    raise _PlaceLost()
                if self.fresh:
                    raise _Restart()
                self.attach()
                noted = self.lib.tsshim_feed_note_loss(self.h)
                if noted in (1, 2):
                    self.loss_why = "published while it was away"
                if noted == 2:
                    raise _EpochGone()
                if noted == 1 and self.in_order():
                    raise _Gap()
                if noted == 1:
                    self.loss_noted = True
                    hook.log("info", "feed %s: evicted (too slow); continuing at the head, and what was "
                             "published meanwhile is made privately at the epoch's end" % self.feed.key)
                else:
                    hook.log("info", "feed %s: evicted (too slow); continuing at the head" % self.feed.key)
            elif ret == -errno.ENOTCONN:
                self.attach()
            elif ret in (0, -errno.EXDEV):
                done_waiting()
                return ret
            else:
                raise Fallback("reading the feed failed: %s" % _err(ret))

    def read_view(self, npos, want, got, eoe, nodes, dtypes, sample_bytes):
        """The next batch as tensors over a private mapping of the slot it lies in
        (no copy; released when the last of them is freed), or None: it spans
        slots, and the caller copies it."""
        torch = self.torch
        ptr = (ctypes.c_void_p * npos)()
        vid = ctypes.c_uint64()
        try:
            ret = self.retry(lambda ms: self.lib.tsshim_feed_read_view(self.h, npos, want, ptr, got,
                                                                       ctypes.byref(eoe), ctypes.byref(vid), ms))
        except _Unshareable:
            self.plan_rest(None)  # a view is all or nothing: nothing was read
            raise
        if ret:
            return None  # -EXDEV
        return view_tensors(self.lib, self.h, vid.value, ptr, got, got[0] // sample_bytes[0], nodes, dtypes, torch)

    def next_info(self):
        """Wait for the batch at our position: (schema node, bytes per sample per position)."""
        npos, ns, se = ctypes.c_uint32(), ctypes.c_uint64(), ctypes.c_uint64()
        sb = (ctypes.c_uint64 * MAX_POS)()
        buf = ctypes.create_string_buffer(SCHEMA_MAX)
        slen = ctypes.c_uint32()
        try:
            self.retry(lambda ms: self.lib.tsshim_feed_next(self.h, ms, ctypes.byref(npos), ctypes.byref(ns),
                                                         ctypes.byref(se), sb, buf, ctypes.byref(slen)))
        except _Unshareable:
            self.plan_rest(None)  # waiting at the head: we read all that was published
            raise
        try:
            node = json.loads(buf.raw[:slen.value].decode())
        except ValueError:
            raise Fallback("the stream's schema is not readable")
        return node, list(sb)[:npos.value]

    def making_rest(self):
        """We produce the stream and have batches of its epoch still to make (or
        have not started making them: on_wait starts at once)."""
        return self.source not in ("done", "real") and self.role() == ROLE_PRODUCER

    def on_wait(self, waited_ms):
        """No data yet: is someone producing? Otherwise we do."""
        if self.lib.tsshim_feed_flags(self.h) & UNSHAREABLE:
            raise _Unshareable("the producer found the batches cannot be shared")
        self.waited_ms += waited_ms
        role = self.role()
        if role != ROLE_PRODUCER and self.waited_ms >= self.feed.timeout_ms:
            if self.lib.tsshim_feed_take_idle(self.h) == 1:
                role = ROLE_PRODUCER
        if role != ROLE_PRODUCER:
            return
        self.lib.tsshim_feed_set_idle(self.h, 0)
        if waited_ms and self.source not in (None, "done", "real"):
            self.self_waits += 1  # retry() should not have waited: we had batches to make
        if self.source is None:
            self.start_source()
        if self.source is not None and self.source != "done":
            self.produce_one()

    def plan_rest(self, carry):
        """The producer stopped publishing while we waited for data at the head: we
        read all it published of the stream's epoch. Note what is left of that epoch
        (and the part of a batch we hold), for private_rest once the feed is closed."""
        try:
            _, ended, rest, npub = self.stream_state(True)
        except (Fallback, NotProducer):
            return
        if not ended:
            lost = self.take_lost() if self.loss_noted else None
            if lost is not None and len(lost):
                # what the stream had made before we joined (or while we were away)
                # is ours to make too: before, that epoch ended short of it
                if self.st.kind == "subset":
                    lost = lost[self.torch.isin(lost, self.st.subset)]
                rest = self.torch.cat([lost, rest]).sort().values  # disjoint: made, and not
                npub -= len(lost)
            self.rest_plan = (rest, npub, carry, "nobody published")

    def private_rest(self, may_gather=True, log=True):
        """The rest of the stream's epoch from a private DataLoader (nothing published),
        cut at our batch size after the part of a batch we carry. While we hold our
        place at the stream's next epoch start, and the producer would wait on it
        too long, the samples not made yet are gathered from that epoch (gather)."""
        rest, npub, carry, which = self.rest_plan
        torch, bs = self.torch, self.loader.batch_size
        self.own_draws()  # the private loader draws from a generator of its own
        n0 = carry[1][0].shape[0] if carry else 0
        plan = []
        # its batches come from workers: waited for on a thread (_Pending), the iterator made here
        start = [] if self.loader.num_workers > 0 else None
        try:
            src = self.st.remainder(self.loader, self.orig_iter, rest, npub, first=bs - n0,
                                    pin=bool(self.loader.pin_memory), plan=plan, start=start)
        except Fallback:  # nothing left: what we carry is the epoch's last batch
            if carry:
                self.give_carry()
                yield _build(*carry)
            return
        left = max(0, self.st.epoch_samples - npub)
        if log:
            hook.log("info", "feed %s: finishing the epoch privately (%d samples %s)" % (self.feed.key, left, which))
        floor = self.st.step_floor()
        hold = _Hold(floor / bs if floor is not None and bs else None)
        made = []
        while True:
            if self.producer_waits_too_long(hold, left):
                why = "the %d samples we have left to make take about %.1f s" % (left, left * hold.pace)
                if may_gather and self.can_gather():
                    src.close()  # its workers stop now; what they made ahead is dropped
                    yield from self.gather(self.lacking(plan, made), carry, why)
                    return
                self.leave_place(why)
            try:
                if start:
                    start[0]()
                    batch, cut, _ = self.watched_next(src, hold, left, may_gather)
                else:
                    batch, cut, _ = _user(next, src)
            except StopIteration:
                break
            except _GatherNow as g:
                yield from self.gather(self.lacking(plan, made), carry, str(g))
                return
            made.extend(cut)
            hold.made = 0 if type(batch) is _Raised else len(cut)
            self.st.private_samples += hold.made
            left = max(0, left - hold.made)
            if type(batch) is _Raised:  # the job sees it at this next(), and goes on
                if carry:
                    self.give_carry()
                    yield _build(*carry)
                    carry = None
                yield batch
                continue
            if carry:
                joined = _join(carry, batch, torch)
                if joined is None:
                    # The collate function shapes each batch (padding to its
                    # longest sample, say): the part we hold cannot be glued to
                    # this one, so the job gets both, short, and loses nothing.
                    hook.log("info", "feed %s: the part of a batch held does not match the next one; "
                             "both go to the job as they are" % self.feed.key)
                    if not self.loader.drop_last:
                        self.give_carry()
                        yield _build(*carry)
                    self.carry_ids = None
                    self.give(torch.as_tensor(cut, dtype=torch.int64))
                else:
                    batch = joined
                    self.give_carry(cut)
                carry = None
            else:
                self.give(torch.as_tensor(cut, dtype=torch.int64))
            yield batch

    def producer_waits_too_long(self, hold, left):
        """Making part of our epoch privately (left samples to go), we keep our
        place at the stream's next epoch start, so that the next epoch is
        shared whole and we are in step with the stream from then on. Once
        the producer waits on that place, we keep it only while its wait so
        far and what we have left, at our pace (the job's step included),
        fit in half the stall time: a short wait once, for every epoch after
        it shared whole. True when they do not: nobody waits on a job that
        is not reading (private_rest gathers the rest from the stream, or
        leaves the place). Before the first batch is made, the job's step
        alone stands for that pace (_Hold): a job whose steps alone outlast
        the budget decides at once, without making a batch first (that batch
        starts the private loader's workers). While a batch is under way, the
        rule is looked at again as time passes (watched_next)."""
        now = time.monotonic()
        prev, hold.t = hold.t, now
        if prev is not None and hold.made:
            hold.pace = (now - prev) / hold.made
        waited = self.producer_waited(hold, prev if prev is not None else now, now)
        if waited is None or hold.pace is None:
            return False  # not waiting; or one batch more, to know our pace
        return waited + left * hold.pace > self.feed.stall_ms / 2000.0

    def producer_waited(self, hold, look, now):
        """Seconds the producer has waited on our place by now, or None when it
        does not: from our first look that found it waiting, or from the look
        before it (look), since it may have waited since then."""
        if not self.feed.attached or self.feed.h != self.h:
            return None
        if self.lib.tsshim_feed_holds_producer(self.h) != 1:
            hold.since = None
            return None
        if hold.since is None:
            hold.since = look
        return now - hold.since

    def watched_next(self, src, hold, left, may_gather):
        """next(src) for a private loader whose batches come from its workers,
        looking at the producer every 20 ms meanwhile: while the batch is under
        way, the rule of producer_waits_too_long still holds as time passes
        (batch_overdue). The first batch waits for the workers to start, which
        nothing before it tells: spawned workers that load a large index may
        take longer than the stall time, and the producer, waiting on our place,
        evicted us meanwhile. Raises _GatherNow (the batch dropped) when we
        gather instead; leaves the place, and waits on, when we cannot."""
        t0 = look = time.monotonic()
        try:
            pending = _Pending(src)
        except RuntimeError as e:  # no thread to be had (a limit, the interpreter exiting): wait here
            hook.log("debug", "a private batch is waited for on the job's thread: %s" % e)
            return _user(next, src)
        try:
            while not pending.done.wait(0.02):
                if not self.batch_overdue(hold, left, t0, look):
                    look = time.monotonic()
                    continue
                why = "our private loader has not made its next batch in %.1f s (%d samples left to make)" \
                    % (time.monotonic() - t0, left)
                if may_gather and self.can_gather():
                    raise _GatherNow(why)
                self.leave_place(why)
        except BaseException:
            pending.drop()  # _GatherNow, or the job interrupted (KeyboardInterrupt)
            raise
        return pending.result()

    def batch_overdue(self, hold, left, t0, look):
        """A private batch asked for at t0 is under way (we last looked at look):
        True when the producer's wait on our place so far, and what we have
        left at our pace less what this batch has taken so far, no longer fit
        in half the stall time. With no pace known yet (the first batch of a
        job whose steps we have not seen), the wait alone decides."""
        now = time.monotonic()
        waited = self.producer_waited(hold, look, now)
        if waited is None:
            return False
        rest = 0.0
        if hold.pace is not None:
            k = min(left, self.loader.batch_size)
            rest = max((left - k) * hold.pace, left * hold.pace - (now - t0))
        return waited + rest > self.feed.stall_ms / 2000.0

    def lacking(self, plan, made):
        """The dataset indices of plan (what the private loader was to make) not made."""
        torch = self.torch
        need = torch.as_tensor(plan, dtype=torch.int64)
        if made:
            need = need[~torch.isin(need, torch.as_tensor(made, dtype=torch.int64))]
        return need

    def leave_place(self, why):
        """Detach: our next epoch begins where the stream is then, and what it
        lacks of it is made privately the same way."""
        self.lib.tsshim_feed_detach(self.h)
        self.feed.attached = False
        hook.log("info", "feed %s: the producer waits on our place, and %s: leaving it" % (self.feed.key, why))

    def can_gather(self):
        """We hold a place in the stream (where its next epoch begins, when we
        read this one to its end) and know the stream's layout."""
        return self.feed.attached and self.feed.h == self.h and self.layout is not None

    def read_ids(self, n):
        """The dataset indices of the n samples the last read brought, or None."""
        return read_ids(self.lib, self.h, n, self.torch)

    def gather(self, need, carry, why):
        """The samples our epoch still lacks (need: dataset indices), picked out
        of the stream's next epoch as it comes, in its order, cut at our batch
        size after the part of a batch we carry: the stream epoch holds each of
        them once, so the job's epoch is whole, none made here, and nobody waits
        on us. The rest of that stream epoch is not ours: our next epoch begins
        at the one after it (skip_to_epoch_start), in step with the stream.
        Once that stream epoch ends, or the stream stops, what is still missing
        is made privately. Gathered batches are uploaded from the host."""
        torch, bs, st = self.torch, self.loader.batch_size, self.st
        node, nodes, dtypes, sample_bytes = self.layout
        npos = len(nodes)
        want = (ctypes.c_uint64 * npos)(*[bs * sb for sb in sample_bytes])
        hook.log("info", "feed %s: the producer waits on our place, and %s: gathering them from the stream's "
                 "next epoch" % (self.feed.key, why))
        # what is still missing, over the dataset: a chunk costs its own length, not the epoch's
        missing = torch.zeros(st.nindex, dtype=torch.bool)
        missing[need] = True
        left = len(need)
        parts = [[t] for t in carry[1]] if carry else [[] for _ in range(npos)]
        have = from_carry = carry[1][0].shape[0] if carry else 0
        # the dataset indices of what parts holds, while known (give)
        idparts = ([self.carry_ids] if self.carry_ids is not None else None) if carry else []
        self.carry_ids = None
        passed, at_start, why = 0, False, None
        self.gathering = True
        try:
            while left:
                got = (ctypes.c_uint64 * npos)()
                eoe = ctypes.c_int()
                try:
                    leaves = self.read_view(npos, want, got, eoe, nodes, dtypes, sample_bytes)
                    if leaves is None:  # it spans slots: copied
                        outs = [torch.empty([bs] + n["shape"], dtype=dt) for n, dt in zip(nodes, dtypes)]
                        dst = (ctypes.c_void_p * npos)(*[t.data_ptr() for t in outs])
                        self.retry(lambda ms: self.lib.tsshim_feed_read(self.h, npos, want, dst, got,
                                                                        ctypes.byref(eoe), ms))
                        leaves = [t[:got[0] // sample_bytes[0]] for t in outs]
                except _SwitchToReal:  # we produce, at the head of an ended stream epoch: a start
                    at_start, why = True, "the stream's epoch ended"
                    break
                except _PlaceLost:  # our next epoch begins afresh
                    self.lib.tsshim_feed_detach(self.h)
                    self.feed.attached = False
                    why = "evicted (too slow) while gathering"
                    break
                except Fallback as e:
                    why = str(e)
                    break
                self.waited_ms = 0
                n = got[0] // sample_bytes[0]
                at_start = bool(eoe.value)
                ids = self.read_ids(n)
                if ids is None or bool((ids < 0).any()) or bool((ids >= st.nindex).any()):
                    why = "the stream does not say which samples it holds"
                    break
                take = missing[ids].nonzero().flatten()
                if self.in_order():
                    take = self.next_in_order(ids, take, missing)
                passed += n - len(take)
                if len(take):
                    for p in range(npos):
                        parts[p].append(leaves[p].index_select(0, take))
                    if idparts is not None:
                        idparts.append(ids[take])
                    missing[ids[take]] = False
                    left -= len(take)
                    have += len(take)
                del leaves
                while have >= bs or (have and not left):
                    k = min(bs, have)
                    whole = [torch.cat(q) if len(q) > 1 else q[0] for q in parts]
                    parts = [[t[k:]] for t in whole]
                    wids = torch.cat(idparts) if idparts is not None else None  # have > 0: a part at least
                    idparts = [wids[k:]] if wids is not None else None
                    have -= k
                    mine = k - min(k, from_carry)
                    from_carry -= k - mine
                    st.gathered_samples += mine
                    self.lib.tsshim_feed_served(self.h, 1, mine)
                    if k == bs or not self.loader.drop_last:
                        self.yielded += 1
                        self.copied += 1
                        self.give(wids[:k] if wids is not None else None)
                        yield _build(node, [t[:k] for t in whole])
                if at_start:
                    if left:
                        why = "the stream's epoch ended"
                    break
        finally:
            self.gathering = False
            # also when the job leaves the epoch here: the rest of that stream epoch is not its next
            # (where we are is known now, also after epoch_gone's attach)
            self.feed.skip_to_next = self.feed.attached and not at_start
            self.feed.reattach = False
        hook.log("debug", "feed %s: gathered, %d samples passed over, %d missing%s"
                 % (self.feed.key, passed, left, " (%s)" % why if why else ""))
        if not left:
            return
        need = missing.nonzero().flatten()
        # made privately, after what we hold
        hook.log("info", "feed %s: %d samples not gathered (%s)" % (self.feed.key, len(need), why))
        carry = (node, [torch.cat(q) if len(q) > 1 else q[0] for q in parts]) if have else None
        self.hold_carry(torch.cat(idparts) if idparts else None, have)
        st.gathered_samples += have - from_carry  # they go out with the first batch made
        self.lib.tsshim_feed_served(self.h, 1 if have > from_carry else 0, have - from_carry)
        self.rest_plan = (need, st.epoch_samples - len(need), carry, "not gathered")
        yield from self.private_rest(may_gather=False)

    def next_in_order(self, ids, take, missing):
        """Of the samples gather would take (positions take of ids), those that
        continue our epoch in index order: each the least still missing when
        it comes. The others are passed over (made privately at the end)."""
        left = missing.nonzero().flatten().tolist()
        keep, k = [], 0
        for j in take.tolist():
            while k < len(left) and left[k] < int(ids[j]):
                k = len(left)  # one missing before this sample was passed over: nothing after it fits
            if k < len(left) and left[k] == int(ids[j]):
                keep.append(j)
                k += 1
        return self.torch.as_tensor(keep, dtype=self.torch.int64)

    def skip_to_epoch_start(self):
        """Our last epoch gathered its end from the stream epoch our place is in:
        the rest of that one is not ours. Read past it (no copy), so that this
        epoch begins where the next stream epoch does, whole and in step."""
        self.feed.skip_to_next = False
        npos, ns, se = ctypes.c_uint32(), ctypes.c_uint64(), ctypes.c_uint64()
        sb = (ctypes.c_uint64 * MAX_POS)()
        buf = ctypes.create_string_buffer(SCHEMA_MAX)
        slen = ctypes.c_uint32()
        self.skipping = True
        lost = False
        try:
            self.retry(lambda ms: self.lib.tsshim_feed_next(self.h, ms, ctypes.byref(npos), ctypes.byref(ns),
                                                         ctypes.byref(se), sb, buf, ctypes.byref(slen)))
            want = (ctypes.c_uint64 * npos.value)(*[self.st.nindex * sb[p] for p in range(npos.value)])
            eoe = ctypes.c_int()
            while not eoe.value:
                got = (ctypes.c_uint64 * npos.value)()
                self.retry(lambda ms: self.lib.tsshim_feed_read(self.h, npos.value, want, None, got,
                                                                ctypes.byref(eoe), ms))
        except _SwitchToReal:
            pass  # we produce, and the stream epoch has ended: the next begins here
        except _PlaceLost:
            lost = True
        finally:
            self.skipping = False
            self.waited_ms = 0
        self.lib.tsshim_feed_epoch_begin(self.h)  # what we read past is not this epoch's
        if lost:  # evicted meanwhile: as any epoch that begins afresh (what it notes is kept)
            hook.log("info", "feed %s: evicted (too slow) before this epoch; it begins afresh" % self.feed.key)
            self.attach(at_epoch_start=True)
            self.note_head()

    def start_source(self):
        try:
            epoch, ended, rest, npub = self.stream_state(True)
        except NotProducer:
            return  # replaced meanwhile: we wait like any consumer
        if ended:
            # the stream is between epochs and we are at its head: our own loader runs
            # this epoch (the generator above switches to produce_real)
            self.stream_epoch = epoch + 1
            self.source = "real"
            raise _SwitchToReal()
        self.stream_epoch = epoch
        # We are at the head with part of a batch read: our first batch completes
        # it, so each read after it is exactly one of ours (no copy, and the
        # upload of it can fill the GPU ring: feed_api.c, keep_read)
        held = self.pending[0][0] // self.pending[1] if self.pending else 0
        first = self.loader.batch_size - held if 0 < held < self.loader.batch_size else None
        self.source = self.st.remainder(self.loader, self.orig_iter, rest, npub, first=first)
        hook.log("info", "feed %s: producing the rest of stream epoch %d (%d samples)"
                 % (self.feed.key, epoch, max(0, self.st.epoch_samples - npub)))

    def produce_one(self):
        t0 = time.process_time_ns()
        try:
            batch, indices, last = _user(next, self.source)
        except StopIteration:
            self.source = "done"
            return
        if type(batch) is _Raised:
            # The stream cannot skip it: it stops here (consumers finish the epoch
            # privately) and so do we, from the rest of the stream's epoch: our
            # private loader meets the sample again, and the job sees the
            # exception at that next() and may go on, as without the shim.
            self.source = "done"
            self.lib.tsshim_feed_set_unshareable(self.h)
            raise _Unshareable("the job's loader raised %s making the stream's batch; the stream stops here"
                               % type(batch.exc).__name__)
        if not self.publish(batch, indices, last, time.process_time_ns() - t0):
            self.source = None  # replaced meanwhile: the new producer goes on
            return
        self.made += 1


class _SwitchToReal(Exception):
    pass


# --- per loader ------------------------------------------------------------------

def _custom_collate(loader):
    """The loader's collate function is not torch's default_collate (which stacks
    samples along dim 0)."""
    import tsshim_loader
    return not tsshim_loader.is_default_collate(getattr(loader, "collate_fn", None), sys.modules["torch.utils.data"])


def _epoch_samples(loader):
    n = len(loader.sampler)
    return n // loader.batch_size * loader.batch_size if loader.drop_last else n


class LoaderState:
    """What the layer knows of one DataLoader object (kept on it)."""

    def __reduce__(self):
        # A copy or a pickle of the loader (copy.deepcopy, torch.save) begins
        # afresh: the feed is this process's, and ctypes handles do not pickle
        # (both failed). NoneType() is None, with no module of ours to import:
        # the pickle loads where the shim is not.
        return (type(None), ())

    def __init__(self, loader, key, why):
        self.fp = key  # the key fingerprint() gave (iterate compares it at every iter())
        self.key, self.why = key, why
        self.disabled = None if key else why
        self.feed = None
        self.announced = False
        self.rec = None
        self.own_iter_made = False  # an iterator of the loader's own was made (really, or its draws)
        self.base_gen = None        # persistent workers: the generator as own_draws found it (own_iter)
        self.private_samples = 0    # samples of shared epochs made privately (private_rest), for tests
        self.gathered_samples = 0   # samples of shared epochs gathered from a later stream epoch (gather)
        self.steps = collections.deque(maxlen=8)  # the job's last steps on shared batches, s (note_step)
        self.custom_collate = _custom_collate(loader)  # its batches' dim 0 is the samples only by checking
        if key:
            data = sys.modules["torch.utils.data"]
            self.nindex = len(loader.dataset)
            self.epoch_samples = _epoch_samples(loader)
            s = loader.sampler
            if type(s) is data.SequentialSampler:
                self.kind = "sequential"
            elif type(s) is data.RandomSampler and not s.replacement and s.num_samples == self.nindex:
                self.kind = "random"
            elif type(s) is data.SubsetRandomSampler:
                self.kind = "subset"
                self.subset = sys.modules["torch"].as_tensor(list(s.indices), dtype=sys.modules["torch"].int64)
            else:
                self.disabled = self.why = "sampler draws with replacement or not once per sample " \
                    "(a successor could not finish its epoch exactly)"
                self.key = None

    def note_step(self, s):
        """The job spent s seconds between our yield of a shared batch and its next
        next(): its step, which no batch it makes privately can take less than."""
        self.steps.append(s)

    def step_floor(self):
        """The shortest of the job's recent steps, or None: a lower bound on
        what each batch made privately costs (making it, then the step)."""
        return min(self.steps) if self.steps else None

    def disable(self, why, level="warn"):
        """Sharing off for this loader, for good. A failure says so at warn; what the
        job itself does (its loader raised, ended early, or makes batches the stream
        cannot carry: strings, a 0-d tensor) at info, as a loader left alone at its
        first iter() is (the job sees its own exceptions anyway)."""
        if self.disabled:
            return
        self.disabled = why
        hook.log(level, "DataLoader sharing off for this loader: %s; it runs on its own" % why)
        self.leave_feed()

    def leave_feed(self):
        """Close our feed (iterate() opens it again at the next iter())."""
        if self.feed is not None:
            _feeds.pop(self.feed.key, None)
            self.feed.close()
            self.feed = None

    def real_iter(self, loader, orig_iter):
        """The loader's own iterator, its batch sampler recorded."""
        if self.rec is None or self.rec.inner is not loader.batch_sampler:
            self.rec = RecordingBatchSampler(loader.batch_sampler)
        self.rec.notes.clear()
        self.rec.recording = True
        it = with_batch_sampler(loader, self.rec, lambda: self.own_iter(loader, orig_iter))
        self.own_iter_made = True
        return it, self.rec

    def own_iter(self, loader, orig_iter):
        """orig_iter(loader): the loader's own iterator. A persistent_workers loader
        makes one iterator for good, which draws its workers' base seed from the
        loader's generator. When own_draws made that draw already (we consumed its
        first epochs), the iterator made now (we produce, or run on our own) gets
        the same seed from a copy of the generator as it was then: the job's
        generator is not drawn from twice, as without the shim."""
        gen, self.base_gen = self.base_gen, None
        if gen is None or getattr(loader, "_iterator", None) is not None:
            return orig_iter(loader)
        mine = loader.generator
        object.__setattr__(loader, "generator", gen)
        try:
            return orig_iter(loader)
        finally:
            object.__setattr__(loader, "generator", mine)

    def remainder(self, loader, orig_iter, rest, npub, first=None, pin=False, plan=None, start=None):
        """(batch, indices, last) for the samples of the stream epoch not published yet,
        in batches of the loader's size (the first one of `first` samples if given;
        pinned if asked: batches the job trains on, not ones it publishes). The
        indices it will make, in order, are appended to plan if given. start, a
        list if given, receives a function that makes the private loader's
        iterator (its workers start) on the thread that calls it, if the first
        next() has not: called before a next() run on another thread
        (_Pending). It is made no earlier: shutting down workers that are still
        starting waits for them (5 s a worker)."""
        torch = sys.modules["torch"]
        data = sys.modules["torch.utils.data"]
        count = self.epoch_samples - npub
        if count <= 0:
            raise Fallback("stream epoch has no samples left but was never ended")
        g = torch.Generator()
        g.manual_seed(int.from_bytes(os.urandom(7), "little"))
        idx = rest
        if self.kind == "subset":
            idx = idx[torch.isin(idx, self.subset)]
        if self.kind != "sequential":
            idx = idx[torch.randperm(len(idx), generator=g)]
        idx = idx[:count].tolist()
        if plan is not None:
            plan.extend(idx)
        bs = loader.batch_size
        cuts, at = [], 0
        while at < len(idx):
            size = first if first and not cuts else bs
            cuts.append(idx[at:at + size])
            at += size
        kw = dict(batch_sampler=cuts, num_workers=loader.num_workers, pin_memory=pin,
                  collate_fn=loader.collate_fn, worker_init_fn=loader.worker_init_fn,
                  multiprocessing_context=loader.multiprocessing_context, generator=g,
                  timeout=loader.timeout)
        if loader.num_workers > 0:
            kw["prefetch_factor"] = loader.prefetch_factor
        private = data.DataLoader(loader.dataset, **kw)
        private._tsshim_private = True

        iters = []  # the private iterator, once made

        def make():
            """The private iterator, made once (gen; start)."""
            if not iters:
                iters.append(orig_iter(private))

        if start is not None:
            start.append(lambda: _user(make))

        def gen():
            make()
            try:
                for k, cut in enumerate(cuts):
                    try:
                        batch = next(iters[0])
                    except StopIteration:
                        return
                    except Exception as e:  # the job's dataset raised: its iterator goes on
                        batch = _Raised(e)
                    yield batch, cut, k == len(cuts) - 1
            finally:
                if iters:
                    _unwatch_workers(iters[0])
                iters.clear()  # closed: its workers stop now, on the thread that closes it
        return gen()


def _unwatch_workers(it):
    """Take a private iterator's workers out of torch's SIGCHLD watch before it
    is shut down. For a watched worker that dies other than by exiting 0, torch
    raises in the main thread, wherever the job then is; a private loader the
    layer closes before its end (its batches no longer wanted) is the layer's,
    and how its workers go is not the job's business. Under make asan a worker
    of the dropped loader of case dw aborted on its way out, and the error,
    raised in the job's thread while it read the stream, turned sharing off. An
    iterator run to its end has unwatched its workers itself."""
    if not getattr(it, "_worker_pids_set", False):
        return
    try:
        sys.modules["torch.utils.data"]._utils.signal_handling._remove_worker_pids(id(it))
        it._worker_pids_set = False
    except Exception as e:  # a torch without them: its workers stay watched, as before
        hook.log("debug", "a private loader's workers stay watched: %s: %s" % (type(e).__name__, e))


def _generator_copy(gen, torch):
    """A generator in the state of gen (torch's default one for None), or None
    when it cannot be copied."""
    try:
        src = gen if gen is not None else torch.default_generator
        copy = torch.Generator(device=src.device)
        copy.set_state(src.get_state())
        return copy
    except Exception as e:
        hook.log("debug", "the loader's generator cannot be copied: %s: %s" % (type(e).__name__, e))
        return None


def iterate(loader, orig_iter):
    """iter(loader) when it shares, else None (the caller runs orig_iter)."""
    if loader.__dict__.get("_tsshim_private"):
        return None
    st = loader.__dict__.get("_tsshim_state")
    if _no_feeds:
        return _unshared(loader, st, orig_iter) if st is not None else None
    # The key at every iter(): a job may change its transforms, its dataset or a
    # global they read between epochs (progressive resizing). Its loader then
    # makes other batches than the jobs whose loaders stood alike before, and
    # moves to the feed of its new key. Before, it stayed in the old one, and a
    # consumer trained on another size of image (a differential run, exact mode).
    import tsshim_loader
    key, why = tsshim_loader.fingerprint(loader)
    if key:
        e = _epoch_samples(loader)
        key = hashlib.sha256(("%s:%d" % (key, e)).encode()).hexdigest()[:16]
    if st is None or st.fp != key:
        if st is not None:
            st.leave_feed()
        old, st = st, LoaderState(loader, key, why)
        if old is not None:  # what its own iterator drew already is the loader's, whatever its key
            st.own_iter_made, st.base_gen = old.own_iter_made, old.base_gen
        loader.__dict__["_tsshim_state"] = st
        if st.disabled:
            hook.log("info", "DataLoader not shared: %s" % st.why)
    if st.disabled or _open_feed(loader, st) is None:
        return _unshared(loader, st, orig_iter)
    return SharedIter(loader, st, orig_iter)


def _open_feed(loader, st):
    """The loader's feed, opened if it has none or its one was closed (another
    loader of the same key in this process left it: they share one), or None:
    sharing is off for the loader (st.disabled says why)."""
    if st.feed is not None and st.feed.h >= 0:
        return st.feed
    st.feed = None
    try:
        st.feed = feed_for(st.key, _label(loader, st), st.nindex)
    except Fallback as e:
        st.disable(str(e))
        return None
    if st.feed is None:  # the C shim is not loaded here
        st.disabled = "tsshim not loaded"
        return None
    if not st.announced:
        hook.log("info", "DataLoader shares as feed %s (%s)" % (st.key, _label(loader, st)))
        st.announced = True
    return st.feed


def _unshared(loader, st, orig_iter):
    """None (the caller runs orig_iter), or the loader's own iterator when it must be
    made through own_iter (own_draws drew its persistent workers' seed already)."""
    if st.base_gen is None:
        return None
    try:
        return st.own_iter(loader, orig_iter)
    except Exception:
        return None  # the caller's own orig_iter makes it again: the job sees what fails there


def _label(loader, st):
    ds = loader.dataset
    root = getattr(ds, "root", None)
    return "%s%s samples=%d" % (type(ds).__name__, " " + str(root) if root is not None else "",
                                st.epoch_samples)
