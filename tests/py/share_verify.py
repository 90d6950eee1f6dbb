"""Verify the records of share_job.py runs (tests/scenarios/pytorch_share.sh).

Knows every sample without any shim: it applies share_job.py's deterministic
transforms (std and other) to every image of DIR/train and DIR/val, in a plain
process, in ImageFolder order, and maps the 16-hex sha1 of each image tensor
to (split, transform, index, label). Then, per record (one job) and loader:

  samples   every hash is an image of the loader's split (train loader: train,
            val loader: val), made with the job's transform; its recorded
            label is that image's class;
  epochs    no sample twice within an epoch; an epoch with its "end" line has
            len(loader) batches and holds every image of its split once
            (drop_last: len(loader)*batch distinct ones; --break-after N:
            exactly min(N, len(loader)) batches; in --mode shared a job's
            FIRST training epoch may be short: a late joiner's, which must be
            a suffix of the stream's epoch, see below; the shim makes it whole
            now, with the head made privately); epochs numbered
            0, 1, ... in order, batches 0, 1, ... in order; a job with its
            "done" line completed all its --epochs;
  batches   n == the job's batch size (--val-batch-size for val) except the
            last batch of an epoch: smaller, never empty (drop_last: full);
  val       every val epoch is the val split in ImageFolder order
            (shuffle=False), in both modes;
  records   cut off by SIGKILL (no "done" line): checked up to where they end;
            a partial last line is ignored; the unfinished last epoch may be
            short.

--mode shared (default) adds the cross-job check of the training loader: all
jobs saw one stream. Each job's training epoch e is stream epoch a_job + e;
a_job is found by content (the alignment under which the job's epochs agree
with those of jobs already placed, most samples in common). Aligned epochs are
windows of one permutation of the train split: a complete epoch is the whole
of it, a job's first epoch may lack a head (late join), an unfinished last
epoch or a --break-after / drop_last epoch may lack a tail. Any two jobs'
epochs at the same stream epoch must agree sample by sample wherever both
cover the same position; so complete epochs are identical, a late joiner's
first epoch equals a suffix of the others' epoch (and must be compared with
at least one other job's), a killed job's partial epoch equals a prefix.
An epoch whose record says the layer made samples of it privately (the
batches' "pv" fields: a job that began it where the ring no longer held
the stream epoch's start reads that epoch's rest, then makes its head) is
compared by the part read from the stream, placed at the stream epoch's
end; complete, it must hold exactly as many private samples as that part
lacks. Samples of that head it gathered from the next stream epoch (the
"gv" fields) must be that epoch's, in its order, wherever another job read
it, and the job's next epoch must be a later one. The stream may have
moved on meanwhile: the job's later epochs are
placed anew (runs of a job follow one another in the stream). Such a later
run that the job produced itself (every batch "role" 1: the others had left)
may have been read by no other job: it is then noted, not compared.
--mode plain: only the per-job checks.

--expect-workers-zero RECORD (repeatable): that job started no DataLoader
worker (its "done" line, else RECORD.workers). --expect-one-producer: for the
train loader, and the val loader if any job recorded one, exactly one job
started workers for it.

Prints one line per problem ("FAIL record loader=.. epoch=.. batch=..: ..."),
notes ("note: ..."), then "verify: OK (jobs=.. epochs=.. batches=..
samples=..)" and exit 0, or "verify: FAILED (N problems)" and exit 1 (2: usage
or dataset error).
"""
import argparse
import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TRANSFORMS = ("std", "other")
TABLE_VERSION = 1
MAX_SAME = 8  # problems of one kind per (record, loader, epoch) before "N more"


# --- the table: hash -> image ----------------------------------------------------

def _images(root, split):
    """ImageFolder order: (relative path, label) of DIR/split, and the classes."""
    from torchvision.datasets import ImageFolder
    ds = ImageFolder(os.path.join(root, split))
    return [(os.path.relpath(p, root), y) for p, y in ds.samples], ds.classes


def _signature(root):
    sig = hashlib.sha1(("v%d" % TABLE_VERSION).encode())
    with open(os.path.join(HERE, "share_job.py"), "rb") as f:  # the transforms live there
        sig.update(f.read())
    for split in ("train", "val"):
        base = os.path.join(root, split)
        for dirpath, dirnames, filenames in sorted(os.walk(base)):
            dirnames.sort()
            for fn in sorted(filenames):
                st = os.stat(os.path.join(dirpath, fn))
                sig.update(("%s/%s %d %d\n" % (dirpath, fn, st.st_size, st.st_mtime_ns)).encode())
    return sig.hexdigest()


class Table:
    """images[split] = [(relpath, label)]; seq[(split, tf)] = [hash] in ImageFolder order;
    where[hash] = [(split, tf, index, label)]."""

    def __init__(self, images, seq):
        self.images = images
        self.seq = seq
        self.where = {}
        for (split, tf), hs in seq.items():
            for i, h in enumerate(hs):
                self.where.setdefault(h, []).append((split, tf, i, images[split][i][1]))

    def size(self, split):
        return len(self.images.get(split, []))

    def to_json(self):
        return {"images": self.images, "seq": {"%s/%s" % k: v for k, v in self.seq.items()}}

    @classmethod
    def from_json(cls, d):
        return cls({k: [tuple(x) for x in v] for k, v in d["images"].items()},
                   {tuple(k.split("/")): v for k, v in d["seq"].items()})


def build_table(root, cache=None):
    """The hash table of DIR (train and val), from cache when its signature matches."""
    sig = _signature(root)
    if cache and os.path.exists(cache):
        try:
            with open(cache) as f:
                d = json.load(f)
            if d.get("signature") == sig:
                return Table.from_json(d["table"])
        except (OSError, ValueError, KeyError):
            pass
    sys.path.insert(0, HERE)
    import share_job
    from torchvision.datasets.folder import default_loader
    tfs = {name: share_job.make_transform(name) for name in TRANSFORMS}
    images, seq = {}, {}
    for split in ("train", "val"):
        if not os.path.isdir(os.path.join(root, split)):
            images[split] = []
            continue
        images[split], _ = _images(root, split)
        for name in TRANSFORMS:
            seq[(split, name)] = []
        for rel, _y in images[split]:
            img = default_loader(os.path.join(root, rel))
            for name in TRANSFORMS:
                seq[(split, name)].append(share_job.sample_hash(tfs[name](img)))
    table = Table(images, seq)
    if cache:
        tmp = "%s.%d.tmp" % (cache, os.getpid())
        with open(tmp, "w") as f:
            json.dump({"signature": sig, "table": table.to_json()}, f)
        os.replace(tmp, cache)
    return table


# --- records ---------------------------------------------------------------------

class Epoch:
    def __init__(self, loader, epoch):
        self.loader, self.epoch = loader, epoch
        self.batches = []  # batch dicts in record order
        self.end = None  # the "end" line
        self.after_end = 0  # batch lines after the end line

    def seq(self):
        return [h for b in self.batches for h in b.get("h", [])]

    def batch_of(self):
        return [b.get("batch") for b in self.batches for _ in b.get("h", [])]


class Record:
    def __init__(self, path, name=None):
        self.path = path
        self.name = name or os.path.basename(path)
        self.start = None
        self.done = None
        self.epochs = {"train": [], "val": []}  # [Epoch] in record order
        self.partial_line = False
        self.bad_lines = []  # (line number, text)

    def args(self, key, default=None):
        if self.start and isinstance(self.start.get("args"), dict):
            return self.start["args"].get(key, default)
        return default

    def batch_size(self, loader):
        bs = self.args("val_batch_size" if loader == "val" else "batch_size")
        if bs is None and loader == "val":
            bs = self.args("batch_size")
        if bs is None:  # no header: the first batch's size
            for ep in self.epochs[loader]:
                if ep.batches:
                    return ep.batches[0].get("n")
        return bs

    def workers(self, loader=None):
        """Workers started (for one loader, or all); None when unknown."""
        if self.done is not None and "workers_started" in self.done:
            if loader is None:
                return self.done["workers_started"]
            return (self.done.get("workers_by_loader") or {}).get(loader, 0)
        try:
            with open(self.path + ".workers") as f:
                rows = [ln.split() for ln in f if ln.strip()]
        except OSError:
            return None
        return sum(1 for r in rows if loader is None or (len(r) > 1 and r[1] == loader))


def read_record(path, name=None):
    rec = Record(path, name)
    with open(path, "rb") as f:
        data = f.read().decode("utf-8", "replace")
    lines = data.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    cur = {}
    for no, line in enumerate(lines, 1):
        try:
            d = json.loads(line)
            if not isinstance(d, dict):
                raise ValueError("not an object")
        except ValueError:
            if no == len(lines):
                rec.partial_line = True  # cut off mid-write
            else:
                rec.bad_lines.append((no, line[:80]))
            continue
        if d.get("start"):
            rec.start = d
        elif d.get("done"):
            rec.done = d
        elif d.get("loader") in rec.epochs:
            loader, e = d["loader"], d.get("epoch")
            ep = cur.get(loader)
            if ep is None or ep.epoch != e:
                ep = Epoch(loader, e)
                rec.epochs[loader].append(ep)
                cur[loader] = ep
            if d.get("end"):
                ep.end = d
            elif ep.end is not None:
                ep.after_end += 1
            else:
                ep.batches.append(d)
        else:
            rec.bad_lines.append((no, line[:80]))
    return rec


# --- reporting -------------------------------------------------------------------

class Report:
    def __init__(self, out):
        self.out = out
        self.count = 0
        self.kinds = {}

    def fail(self, rec, msg, loader=None, epoch=None, batch=None, kind=None):
        self.count += 1
        key = (rec, loader, epoch, kind or msg.split(":")[0])
        n = self.kinds[key] = self.kinds.get(key, 0) + 1
        if n > MAX_SAME:
            return
        where = rec
        if loader is not None:
            where += " loader=%s" % loader
        if epoch is not None:
            where += " epoch=%s" % epoch
        if batch is not None:
            where += " batch=%s" % batch
        self.out.write("FAIL %s: %s\n" % (where, msg))

    def note(self, msg):
        self.out.write("note: %s\n" % msg)

    def flush_more(self):
        for (rec, loader, epoch, kind), n in self.kinds.items():
            if n > MAX_SAME:
                self.out.write("FAIL %s loader=%s epoch=%s: %d more problems like '%s'\n"
                               % (rec, loader, epoch, n - MAX_SAME, kind))


# --- per-job checks --------------------------------------------------------------

def check_record(rec, table, mode, rep, stats):
    name = rec.name
    for no, text in rec.bad_lines:
        rep.fail(name, "line %d is not a record line: %r" % (no, text))
    if rec.partial_line:
        rep.note("%s: partial last line ignored" % name)
    if rec.start is None:
        rep.note("%s: no start line (batch size taken from the first batch)" % name)
    if rec.done is None:
        rep.note("%s: no done line: cut off, checked up to where it ends" % name)
    tf = rec.args("transform")
    drop_last = bool(rec.args("drop_last", False))
    break_after = int(rec.args("break_after", 0) or 0)
    break_epochs = int(rec.args("break_epochs", 0) or 0)  # --break-after only in the first N epochs
    nepochs = rec.args("epochs")
    for loader in ("train", "val"):
        eps = rec.epochs[loader]
        if not eps:
            continue
        split = loader
        N = table.size(split)
        bs = rec.batch_size(loader)
        L = (N // bs if drop_last else -(-N // bs)) if bs else None
        want_order = table.seq.get((split, tf or "std"))
        for k, ep in enumerate(eps):
            e = ep.epoch
            last_of_record = k == len(eps) - 1
            if e != k:
                rep.fail(name, "epoch numbered %s, expected %d (epochs out of order or repeated)" % (e, k),
                         loader, e, kind="numbering")
            if ep.after_end:
                rep.fail(name, "%d batch lines after the epoch's end line" % ep.after_end, loader, e)
            seen = {}
            for j, b in enumerate(ep.batches):
                bi = b.get("batch")
                if bi != j:
                    rep.fail(name, "batch numbered %s, expected %d" % (bi, j), loader, e, bi, kind="numbering")
                hs, ys, n = b.get("h") or [], b.get("y") or [], b.get("n")
                if not (n == len(hs) == len(ys)):
                    rep.fail(name, "n=%s but %d hashes and %d labels" % (n, len(hs), len(ys)), loader, e, bi)
                if len(hs) == 0:
                    rep.fail(name, "empty batch", loader, e, bi)
                last = j == len(ep.batches) - 1
                if bs:
                    if last and (ep.end is not None or last_of_record):
                        if len(hs) > bs or (drop_last and ep.end is not None and len(hs) != bs):
                            rep.fail(name, "last batch has %d samples, batch size %d%s" % (
                                len(hs), bs, " with drop_last" if drop_last else ""), loader, e, bi, kind="size")
                    elif len(hs) != bs:
                        rep.fail(name, "batch has %d samples, batch size %d (only an epoch's last may differ)"
                                 % (len(hs), bs), loader, e, bi, kind="size")
                for h, y in zip(hs, ys):
                    places = table.where.get(h)
                    if not places:
                        rep.fail(name, "unknown sample %s: no image of train/ or val/ gives it (std or other)" % h,
                                 loader, e, bi, kind="unknown")
                        continue
                    mine = [p for p in places if p[0] == split]
                    if not mine:
                        rep.fail(name, "sample %s is %s image #%d, not a %s image" % (h, places[0][0], places[0][2],
                                                                                       split), loader, e, bi, kind="split")
                        continue
                    if tf and not any(p[1] == tf for p in mine):
                        rep.fail(name, "sample %s was made with transform %s, the job uses %s" % (h, mine[0][1], tf),
                                 loader, e, bi, kind="transform")
                    if not any(p[3] == y for p in mine):
                        rep.fail(name, "label %s paired with sample %s (%s, class %d)" % (
                            y, h, table.images[split][mine[0][2]][0], mine[0][3]), loader, e, bi, kind="label")
                    if h in seen:
                        rep.fail(name, "sample %s twice in the epoch (batches %s and %s)" % (h, seen[h], bi),
                                 loader, e, bi, kind="duplicate")
                    else:
                        seen[h] = bi
            seq = ep.seq()
            stats["batches"] += len(ep.batches)
            stats["samples"] += len(seq)
            if ep.end is None:
                if not last_of_record or rec.done is not None:
                    rep.fail(name, "epoch has no end line", loader, e)
                elif loader == "val" and want_order is not None and seq != want_order[:len(seq)]:
                    rep.fail(name, "unfinished val epoch is not a prefix of the val split in order", loader, e)
                continue
            stats["epochs"] += 1
            if ep.end.get("batches") != len(ep.batches):
                rep.fail(name, "end line says %s batches, %d recorded" % (ep.end.get("batches"), len(ep.batches)),
                         loader, e)
            if L is not None and ep.end.get("len") != L:
                rep.fail(name, "len(loader)=%s, expected %d for %d images at batch size %d"
                         % (ep.end.get("len"), L, N, bs), loader, e)
            L_job = ep.end.get("len") if isinstance(ep.end.get("len"), int) else L
            if loader == "train" and break_after and (not break_epochs or k < break_epochs):
                want = min(break_after, L_job)
                # shared: a job that broke out starts its next epoch at the stream's
                # head, so an epoch may end early where the stream's epoch ends
                if len(ep.batches) != want and not (mode == "shared" and 0 < len(ep.batches) < want):
                    rep.fail(name, "%d batches with --break-after %d (len %d): expected %d"
                             % (len(ep.batches), break_after, L_job, want), loader, e)
                ep.short_break = len(ep.batches) < want
                continue
            missing = [i for i, h in enumerate(table.seq.get((split, tf or "std"), [])) if h not in seen]
            full = len(ep.batches) == L_job and len(seq) == (L_job * bs if drop_last else N)
            if mode == "shared" and loader == "train" and k == 0 and not full and len(ep.batches) <= L_job:
                ep.short_first = True  # a late joiner's: the cross-job check places it
                continue
            if len(ep.batches) != L_job:
                rep.fail(name, "%d batches in a complete epoch, len(loader)=%s" % (len(ep.batches), L_job), loader, e)
            if drop_last:
                if len(seen) != L_job * bs:
                    rep.fail(name, "%d distinct samples with drop_last, expected %d" % (len(seen), L_job * bs),
                             loader, e)
            elif missing:
                rep.fail(name, "%d of %d %s images missing from a complete epoch, e.g. #%d %s" % (
                    len(missing), N, split, missing[0], table.images[split][missing[0]][0]), loader, e)
            if loader == "val" and want_order is not None and seq != want_order[:len(seq)]:
                i = next((i for i, (a, b) in enumerate(zip(seq, want_order)) if a != b), min(len(seq), len(want_order)))
                rep.fail(name, "val epoch is not the val split in ImageFolder order (first difference at sample %d)" % i,
                         loader, e)
        ends = sum(1 for ep in eps if ep.end is not None)
        if rec.done is not None and isinstance(nepochs, int) and ends != nepochs:
            rep.fail(name, "%d complete epochs, the job ran --epochs %d" % (ends, nepochs), loader)
    if rec.done is None and not any(rec.epochs.values()) and rec.start is None:
        rep.fail(name, "empty record")


# --- the cross-job check (shared mode) -------------------------------------------

class View:
    """A job's training epoch as a window [start, start+len) of a stream epoch of N samples."""

    def __init__(self, rec, k, ep, N, shared_first, tail_cut):
        self.rec, self.k, self.ep = rec, k, ep
        self.seq = ep.seq()
        self.batch = ep.batch_of()
        self.pos = {}
        for i, h in enumerate(self.seq):
            self.pos.setdefault(h, i)
        head_cut = shared_first
        if not head_cut:
            self.start = 0
        elif not tail_cut:
            self.start = N - len(self.seq)
        else:
            self.start = None  # both ends may be cut: placed by content
        self.N = N
        self.private = 0  # samples of the epoch's head, made privately after its suffix (rotate)
        self.gathered = []  # of them, those gathered from the next stream epoch, in its order (find_rotated)

    def rotate(self, at):
        """The epoch's first N - at samples are stream positions at..N-1, the
        rest made privately (find_rotated): compare the stream part only."""
        self.private = len(self.seq) - (self.N - at)
        self.seq = self.seq[:self.N - at]
        self.batch = self.batch[:self.N - at]
        self.pos = {}
        for i, h in enumerate(self.seq):
            self.pos.setdefault(h, i)
        self.start = at


def compare(a, b):
    """(ok, common, message, batch): can a and b be windows of one stream epoch?
    batch: b's batch where they first disagree (None when ok or unknown)."""
    N = a.N
    common = [h for h in a.seq if h in b.pos]
    sa, sb = a.start, b.start
    if sa is None or sb is None:  # place the unplaced one(s) by the samples in common
        if not common:
            if sa is None and sb is None:
                room = len(a.seq) + len(b.seq) <= N
            else:  # the placed one leaves room for the other on one side
                s, placed, other = (sa, a, b) if sb is None else (sb, b, a)
                room = max(s, N - s - len(placed.seq)) >= len(other.seq)
            if room:
                return True, 0, "", None
            return False, 0, "%s and %s have no sample in common but cannot both fit in one epoch" % (
                a.rec.name, b.rec.name), None
        # one stream position per common sample: sa + a.pos[h] == sb + b.pos[h],
        # so d = a.pos[h] - b.pos[h] == sb - sa is the same for all of them
        d = a.pos[common[0]] - b.pos[common[0]]
        for h in common:
            if a.pos[h] - b.pos[h] != d:
                return False, len(common), ("order differs: %s follows %s by %d samples in %s (batch %s) but by %d "
                                            "in %s (batch %s)" % (h, common[0], a.pos[h] - a.pos[common[0]],
                                                                  a.rec.name, a.batch[a.pos[h]],
                                                                  b.pos[h] - b.pos[common[0]], b.rec.name,
                                                                  b.batch[b.pos[h]])), b.batch[b.pos[h]]
        if sa is None and sb is None:
            sa = max(0, -d)
            sb = sa + d
        elif sa is None:
            sa = sb - d
        else:
            sb = sa + d
        if max(sa + len(a.seq), sb + len(b.seq)) - min(sa, sb) > N:
            return False, len(common), "%s and %s together span more than an epoch" % (
                a.rec.name, b.rec.name), None
    for v, s in ((a, sa), (b, sb)):
        if s < 0 or s + len(v.seq) > N:
            return False, len(common), "%s's epoch does not fit the stream epoch (positions %d..%d of %d)" % (
                v.rec.name, s, s + len(v.seq), N), None
    lo, hi = max(sa, sb), min(sa + len(a.seq), sb + len(b.seq))
    for p in range(lo, hi):
        ha, hb = a.seq[p - sa], b.seq[p - sb]
        if ha != hb:
            hint = ""
            if hb in a.pos:
                hint = "; %s's sample is at stream position %d in %s" % (b.rec.name, sa + a.pos[hb], a.rec.name)
            return False, len(common), ("at stream position %d %s has %s (its batch %s) and %s has %s (its batch %s)%s"
                                        % (p, a.rec.name, ha, a.batch[p - sa], b.rec.name, hb, b.batch[p - sb],
                                           hint)), b.batch[p - sb]
    for h in common:  # a sample both have, outside the positions both cover
        if sa + a.pos[h] != sb + b.pos[h]:
            return False, len(common), ("sample %s is at stream position %d in %s (its batch %s) but %d in %s "
                                        "(its batch %s)" % (h, sa + a.pos[h], a.rec.name, a.batch[a.pos[h]],
                                                            sb + b.pos[h], b.rec.name, b.batch[b.pos[h]])), \
                b.batch[b.pos[h]]
    return True, len(common), "", None


def check_shared(recs, table, rep):
    N = table.size("train")
    jobs, breakers = [], []
    for rec in recs:
        eps = rec.epochs["train"]
        drop_last = bool(rec.args("drop_last", False))
        brk = bool(rec.args("break_after", 0))
        brk_epochs = int(rec.args("break_epochs", 0) or 0) if brk else 0
        if brk:  # checked window by window at the end
            breakers.append((rec, eps[:brk_epochs] if brk_epochs else eps))
            if not brk_epochs:
                continue
        views = []
        for k, ep in enumerate(eps):
            if not ep.batches or k < brk_epochs:
                continue
            tail_cut = (brk and not brk_epochs) or drop_last or ep.end is None
            views.append(View(rec, k, ep, N, k == 0, tail_cut))
        if views:
            jobs.append((rec, views))
    find_rotated(jobs, N, rep)
    check_breakers(breakers, jobs, rep)
    # A job that made an epoch's head privately may find the stream epochs
    # after it gone by meanwhile: its epochs are aligned in runs, each run
    # after such an epoch placed on its own (never against its own job).
    runs = []
    for rec, views in jobs:
        run = []
        for v in views:
            run.append(v)
            if v.private:
                runs.append((rec, run))
                run = []
        if run:
            runs.append((rec, run))
    # a later run that the job produced itself, batch by batch: only an
    # alignment under which its epochs agree places it (none: noted below).
    # Later: after another run of the job, or after epochs it broke out of
    # (--break-epochs: checked apart, in check_breakers)
    broke = {id(rec) for rec, eps in breakers if any(ep.batches for ep in eps)}
    alone = {j for j, (rec, views) in enumerate(runs)
             if (any(r is rec for r, _ in runs[:j]) or id(rec) in broke)
             and all(b.get("role") == 1 for v in views for b in v.ep.batches)}
    jobs = runs
    if len({id(rec) for rec, _ in jobs}) < 2:
        for rec, views in jobs:
            if getattr(views[0].ep, "short_first", False):
                rep.fail(rec.name, "short first epoch (%d samples) and no other job to confirm it is a late join"
                         % len(views[0].seq), "train", views[0].ep.epoch)
        return

    def index(views):
        return {v.k: v for v in views}

    def alignment(vj, vk):
        """Best d (j's epoch e <-> k's epoch e+d): (score, d) or None."""
        ij, ik = index(vj), index(vk)
        best = None
        for d in range(-max(ij), max(ik) + 1):
            good = bad = common = 0
            for e, v in ij.items():
                w = ik.get(e + d)
                if w is None:
                    continue
                ok, c, _, _ = compare(w, v)
                common += c
                if ok:
                    good += 1
                else:
                    bad += 1
            if common == 0:
                continue
            # all aligned epochs agree: most samples in common; else the most
            # agreeing epochs, the smallest offset (so that a job that does
            # not share is compared epoch by epoch, and its differences shown)
            score = (bad == 0, good, common if bad == 0 else 0, -abs(d))
            if best is None or score > best[0]:
                best = (score, d)
        return best

    def span(j):
        return min(v.k for v in jobs[j][1]), max(v.k for v in jobs[j][1])

    def in_order(j, at):
        """Run j placed at `at` comes after its job's earlier runs placed so far, before its later ones."""
        lo, hi = span(j)
        for i, ai in placed.items():
            if jobs[i][0] is jobs[j][0] and ((i < j and at + lo <= ai + span(i)[1]) or
                                             (i > j and at + hi >= ai + span(i)[0])):
                return False
        return True

    def after_previous(j):
        """The first place for run j after its job's placed earlier runs where no
        other job's placed epoch stands."""
        lo, hi = span(j)
        at = max(ai + span(i)[1] for i, ai in placed.items() if jobs[i][0] is jobs[j][0] and i < j) + 1 - lo
        taken = {ak + e for k, ak in placed.items() if jobs[k][0] is not jobs[j][0]
                 for e in range(span(k)[0], span(k)[1] + 1)}
        while any(at + e in taken for e in range(lo, hi + 1)):
            at += 1
        return at

    # root: a job's first run (a later one is placed after it), most complete
    # epochs, then the first given
    order = sorted(range(len(jobs)), key=lambda i: (any(jobs[k][0] is jobs[i][0] for k in range(i)),
                                                     -sum(1 for v in jobs[i][1] if v.ep.end is not None), i))
    placed = {order[0]: 0}
    while len(placed) < len(jobs):
        best = None
        for j in range(len(jobs)):
            if j in placed:
                continue
            for k, ak in placed.items():
                if jobs[k][0] is jobs[j][0]:
                    continue
                r = alignment(jobs[j][1], jobs[k][1])
                if r and j in alone and not (r[0][0] and r[0][1]):
                    continue
                # an alignment whose epochs disagree is no evidence of where a run
                # stands: not one that puts it before its own job's previous run
                if r and not (r[0][0] and r[0][1]) and not in_order(j, ak + r[1]):
                    continue
                if r and (best is None or r[0] > best[0]):
                    best = (r[0], j, ak + r[1])
        if best is None:
            # A run after a private epoch that no placed job's epochs match (the
            # stream epochs it read were read by no job placed so far: every job
            # that read the one before made it partly privately, say, and its
            # producer died): after its job's previous run, where nobody else
            # stands, so that the other jobs' runs of those epochs align with it.
            nxt = next((j for j in range(len(jobs)) if j not in placed and j not in alone and
                        any(jobs[i][0] is jobs[j][0] and i < j for i in placed)), None)
            if nxt is not None:
                placed[nxt] = after_previous(nxt)
                rec, views = jobs[nxt]
                rep.note("%s epochs %d..%d: no job placed so far read these stream epochs; placed after its "
                         "previous ones" % (rec.name, views[0].ep.epoch, views[-1].ep.epoch))
                continue
            for j in range(len(jobs)):
                if j in placed:
                    continue
                rec, views = jobs[j]
                if any(jobs[k][0] is rec for k in placed) or (id(rec) in broke and j in alone):  # a later run
                    rep.note("%s epochs %d..%d: no other job read these stream epochs%s; not compared"
                             % (rec.name, views[0].ep.epoch, views[-1].ep.epoch,
                                " (it produced them)" if j in alone else ""))
                else:
                    rep.fail(rec.name, "its training epochs have no sample in common with any other job's "
                             "epochs: not in the shared stream", "train")
            break
        placed[best[1]] = best[2]

    confirmed = set()
    items = sorted(placed.items())
    for x in range(len(items)):
        for y in range(x + 1, len(items)):
            (j, aj), (k, ak) = items[x], items[y]
            if jobs[j][0] is jobs[k][0]:
                continue
            ij, ik = index(jobs[j][1]), index(jobs[k][1])
            for e, v in ij.items():
                w = ik.get(e + aj - ak)
                if w is None:
                    continue
                ok, c, msg, batch = compare(v, w)
                if not ok:
                    rep.fail(jobs[k][0].name, "differs from %s epoch %s (stream epoch %d): %s"
                             % (jobs[j][0].name, v.ep.epoch, aj + e, msg), "train", w.ep.epoch, batch, kind="stream")
                elif c:
                    confirmed.add((j, e))
                    confirmed.add((k, w.k))
    for j in placed:
        rec, views = jobs[j]
        v = views[0]
        if getattr(v.ep, "short_first", False) and (j, v.k) not in confirmed:
            rep.fail(rec.name, "short first epoch (%d samples) that no other job's epoch confirms as a late join"
                     % len(v.seq), "train", v.ep.epoch)
    if placed:
        lo = min(placed.values())
        rep.note("stream epochs per job: " + ", ".join(
            "%s %d..%d" % (jobs[j][0].name, a - lo + min(v.k for v in jobs[j][1]),
                           a - lo + max(v.k for v in jobs[j][1])) for j, a in sorted(placed.items())))
    check_gathered(jobs, placed, rep)
    last = {}  # a job's runs follow one another in the stream
    for j in range(len(jobs)):
        if j not in placed:
            continue
        rec, views = jobs[j]
        first = placed[j] + min(v.k for v in views)
        if id(rec) in last and first <= last[id(rec)]:
            rep.fail(rec.name, "epoch %d is stream epoch %d, not after its previous epoch's %d"
                     % (views[0].ep.epoch, first - min(placed.values()), last[id(rec)] - min(placed.values())),
                     "train", views[0].ep.epoch, kind="stream")
        last[id(rec)] = placed[j] + max(v.k for v in views)


def find_rotated(jobs, N, rep):
    """A job that begins an epoch where the ring no longer holds the stream
    epoch's start (a late joiner) reads the rest of that stream epoch, then
    makes its head privately, or gathers part of it from the next stream
    epoch. Its record says which samples the layer made privately (the
    batches' "pv" fields: the last pv samples of the batch, and all of every
    batch after it) and which it gathered ("gv": the gv samples before
    those). Such an epoch is compared by its stream part only, placed at the
    stream epoch's end; when complete, its private and gathered samples must
    be exactly as many as the stream part lacks (the per-job check saw every
    sample once, so they are that head); the gathered ones are checked
    against the next stream epoch (check_gathered). An epoch rotated without
    such a record is a consumer off by some samples."""
    for _, views in jobs:
        for v in views:
            pv = sum(b.get("pv", 0) + b.get("gv", 0) for b in v.ep.batches)
            if not pv:
                continue
            stream = 0
            for b in v.ep.batches:
                n, p = len(b.get("h", [])), b.get("pv", 0) + b.get("gv", 0)
                stream += n - min(p, n)
                if p:
                    break
            complete = v.ep.end is not None and len(v.seq) == N
            if stream == 0 or stream >= len(v.seq) or (complete and pv != N - stream):
                continue
            # a batch holds what it read from the stream, then what it gathered, then what was made
            gathered = [h for b in v.ep.batches if b.get("gv")
                        for h in b.get("h", [])[len(b.get("h", [])) - b.get("pv", 0) - b["gv"]:
                                                len(b.get("h", [])) - b.get("pv", 0)]]
            rep.note("%s epoch %d: stream positions %d..%d, then %d samples made privately%s"
                     % (v.rec.name, v.ep.epoch, N - stream, N - 1, len(v.seq) - stream - len(gathered),
                        " and %d gathered from the next stream epoch" % len(gathered) if gathered else ""))
            v.rotate(N - stream)
            v.gathered = gathered


def check_gathered(jobs, placed, rep):
    """An epoch that gathered the end of its head from the next stream epoch
    (find_rotated): each gathered sample is one of that stream epoch, in its
    order, wherever another job's epoch there covers it; and the job's next
    epoch is a later stream epoch still (the rest of that one is not its)."""
    at = {}  # stream epoch -> views of it
    for j, a in placed.items():
        for v in jobs[j][1]:
            at.setdefault(a + v.k, []).append(v)
    for j, a in placed.items():
        rec, views = jobs[j]
        for v in views:
            if not v.gathered:
                continue
            s = a + v.k
            others = [w for w in at.get(s + 1, []) if w.rec is not rec]
            if not others:
                rep.note("%s epoch %d: no other job read the stream epoch it gathered from; not compared"
                         % (rec.name, v.ep.epoch))
            for w in others:
                if w.start is None:
                    continue
                pos = [w.start + w.pos[h] for h in v.gathered if h in w.pos]
                whole = w.start == 0 and len(w.seq) == w.N
                if any(b <= x for x, b in zip(pos, pos[1:])) or (whole and len(pos) < len(v.gathered)):
                    rep.fail(rec.name, "its %d gathered samples are not %s's next stream epoch's, in its order "
                             "(%d of them there)" % (len(v.gathered), w.rec.name, len(pos)), "train",
                             v.ep.epoch, kind="stream")
                    break
    for j, a in placed.items():  # a job's runs are in order: the one after a gathering epoch skips a stream epoch
        rec, views = jobs[j]
        nxt = min((k for k in placed if k > j and jobs[k][0] is rec), default=None)
        if not views[-1].gathered or nxt is None:
            continue
        s, first = a + views[-1].k, jobs[nxt][1][0]
        if placed[nxt] + first.k <= s + 1:
            rep.fail(rec.name, "epoch %d is stream epoch %d, which its epoch %d gathered from"
                     % (first.ep.epoch, placed[nxt] + first.k - min(placed.values()), views[-1].ep.epoch),
                     "train", first.ep.epoch, kind="stream")


def check_breakers(breakers, jobs, rep):
    """A job that breaks out of its epochs re-attaches at the stream's head: each
    of its epochs must be a contiguous run of another job's epoch (a late
    joiner's too); when it ended early, the run ends where that job's complete
    epoch ends. An epoch that no other job saw a part of is noted, not judged."""
    views = [v for _, vs in jobs for v in vs]
    for rec, eps in breakers:
        for ep in eps:
            seq = ep.seq()
            if not seq:
                continue
            short = getattr(ep, "short_break", False)
            found = False
            for w in views:
                if w.rec is rec:
                    continue
                i = w.pos.get(seq[0])
                if i is None or w.seq[i:i + len(seq)] != seq:
                    continue
                if short and w.ep.end is not None and w.start == 0 and i + len(seq) != len(w.seq):
                    continue
                found = True
                break
            if found:
                continue
            partial = [w for w in views if sum(1 for h in seq if h in w.pos) >= 2 and w.ep.end is not None
                       and w.start == 0 and not getattr(w.ep, "short_first", False)]
            if short and partial:
                rep.fail(rec.name, "short epoch after --break-after does not end where the stream epoch ends",
                         "train", ep.epoch, kind="stream")
            else:
                rep.note("%s epoch %d: not a contiguous run of another job's epoch; not compared"
                         % (rec.name, ep.epoch))


# --- main ------------------------------------------------------------------------

def verify(records, table, mode="shared", workers_zero=(), one_producer=False, out=sys.stdout):
    """records: [Record]; returns the number of problems, prints the report."""
    rep = Report(out)
    stats = {"batches": 0, "samples": 0, "epochs": 0}
    if table.size("train") == 0:
        rep.fail("dataset", "no training images")
    for h, places in table.where.items():
        if len(places) > 1:
            rep.note("dataset: %d images give the same tensor %s (ambiguous)" % (len(places), h))
    for rec in records:
        check_record(rec, table, mode, rep, stats)
    if mode == "shared":
        check_shared(records, table, rep)
    by_name = {r.name: r for r in records}
    by_path = {os.path.abspath(r.path): r for r in records}
    for w in workers_zero:
        r = by_path.get(os.path.abspath(w)) or by_name.get(w) or by_name.get(os.path.basename(w))
        if r is None:
            r = read_record(w)
        n = r.workers()
        if n is None:
            rep.fail(r.name, "workers started unknown (no done line, no .workers file)")
        elif n != 0:
            rep.fail(r.name, "started %d DataLoader workers, expected none (a consumer)" % n)
    if one_producer:
        for loader in ("train", "val"):
            if loader == "val" and not any(r.epochs["val"] for r in records):
                continue
            counts = [(r.name, r.workers(loader)) for r in records]
            with_workers = [n for n, c in counts if c]
            if any(c is None for _, c in counts) or len(with_workers) != 1:
                rep.fail("jobs", "%s loader: %d jobs started workers (%s), expected exactly one producer" % (
                    loader, len(with_workers), ", ".join("%s=%s" % nc for nc in counts)))
    rep.flush_more()
    if rep.count:
        out.write("verify: FAILED (%d problems)\n" % rep.count)
    else:
        out.write("verify: OK (jobs=%d epochs=%d batches=%d samples=%d)\n"
                  % (len(records), stats["epochs"], stats["batches"], stats["samples"]))
    return rep.count


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("records", nargs="+", metavar="RECORD", help="share_job.py --record files")
    ap.add_argument("--root", required=True, help="the tsshim-mkdata root the jobs used (DIR/train, DIR/val)")
    ap.add_argument("--mode", choices=["shared", "plain"], default="shared",
                    help="shared: also check that all jobs saw one stream (default); plain: per-job checks only")
    ap.add_argument("--cache", metavar="FILE", help="keep the hash table here (rebuilt when DIR or the transforms change)")
    ap.add_argument("--expect-workers-zero", action="append", default=[], metavar="RECORD",
                    help="this job must have started no DataLoader worker (repeatable)")
    ap.add_argument("--expect-one-producer", action="store_true",
                    help="exactly one job started workers, per loader")
    a = ap.parse_args(argv)
    if not os.path.isdir(os.path.join(a.root, "train")):
        print("share_verify: %s/train: not a directory" % a.root, file=sys.stderr)
        return 2
    table = build_table(a.root, a.cache)
    recs = []
    for p in a.records:
        try:
            recs.append(read_record(p))
        except OSError as e:
            print("share_verify: %s: %s" % (p, e.strerror), file=sys.stderr)
            return 2
    names = [r.name for r in recs]
    if len(set(names)) != len(names):
        for r in recs:
            r.name = r.path
    n = verify(recs, table, a.mode, a.expect_workers_zero, a.expect_one_producer)
    return 1 if n else 0


if __name__ == "__main__":
    sys.exit(main())
