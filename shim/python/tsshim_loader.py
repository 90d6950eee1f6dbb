# SPDX-License-Identifier: MIT
"""Which DataLoaders share (issue 4 item 2): a loader's sharing key.

fingerprint(loader) -> (key, why): key is 16 hex digits (a sha256 prefix) of
describe(loader), the same in every process that builds the same loader, or
None when the loader cannot share; why is one line saying which (for the
`info` notice and tsshim-inspect).

What enters the key: the dataset (class, the code of its methods when the
class is not torch's or torchvision's, and a description of its content that
does not read the data), its transforms (with the code of transform classes
of the user's own), the sampler KIND and the collate
function, and the worker_init_fn (which may set what the workers make);
with the code of the user's own, the module globals it reads
(args.scale: that attribute), the class attributes of the user's classes
(a list or a generator too, and those read off a class, Jitter.scales),
torch's default dtype and Pillow's LOAD_TRUNCATED_IMAGES: two jobs of one script that set them differently make
different batches. What does not: batch size, drop_last (each consumer cuts and drops
on its own; tsshim_feed adds the number of samples an epoch holds, which
drop_last can change, to the feed's key), num_workers, pin_memory,
persistent_workers, prefetch_factor,
the generator, the model, the DataLoader subclass.

Imported only once torch.utils.data is loaded; never imports torch or
torchvision itself (it looks them up in sys.modules).
"""
import dis
import enum
import hashlib
import json
import os
import sys
import types

_rngs_read = []  # the random generators the last fingerprint found the user's code reading (rng_state)
VERSION = 8  # bump when the description changes: old and new never share
_MAX_DEPTH = 8


class NotShareable(Exception):
    """The loader cannot share; the message is the one-line reason."""


def fingerprint(loader):
    """(key, why): key is 16 hex chars, or None with the reason in why."""
    del _rngs_read[:]
    try:
        parts = _describe(loader)
    except NotShareable as e:
        return None, str(e)
    except Exception as e:  # never fail the job: it just does not share
        return None, "no fingerprint: %s: %s" % (type(e).__name__, e)
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()[:16], "shareable"


def describe(loader):
    """The parts that go into the key, as a JSON-able dict.

    A loader that cannot share gives {"shareable": False, "why": reason}.
    """
    try:
        parts = _describe(loader)
    except NotShareable as e:
        return {"shareable": False, "why": str(e)}
    except Exception as e:
        return {"shareable": False, "why": "no fingerprint: %s: %s" % (type(e).__name__, e)}
    parts["shareable"] = True
    return parts


# --- the loader --------------------------------------------------------------

def _describe(loader):
    data = sys.modules.get("torch.utils.data")
    if data is None:
        raise NotShareable("torch.utils.data is not loaded")
    dataset = getattr(loader, "dataset", None)
    if dataset is None:
        raise NotShareable("loader has no dataset")
    if isinstance(dataset, data.IterableDataset):
        raise NotShareable("iterable dataset")
    batch_sampler = getattr(loader, "batch_sampler", None)
    sampler = getattr(loader, "sampler", None)
    if batch_sampler is None:
        # batch_size=None: samples one by one, nothing to cut along dim 0
        raise NotShareable("no automatic batching (batch_size=None)")
    if type(batch_sampler) is not data.BatchSampler or batch_sampler.sampler is not sampler:
        raise NotShareable("custom batch sampler %s" % _qualname(type(batch_sampler)))
    torch = sys.modules.get("torch")
    return {
        "v": VERSION,
        # torch.tensor(float) in the dataset's code makes this dtype
        "default_dtype": str(torch.get_default_dtype()) if torch is not None else None,
        "pillow": _pillow_settings(),
        "dataset": _dataset(dataset, 0),
        "sampler": _sampler(sampler, dataset, data),
        "collate": _collate(getattr(loader, "collate_fn", None), data),
        "worker_init": _worker_init(loader),
    }


def _pillow_settings():
    """Pillow's module setting that changes what a decode gives: a job that
    allows truncated images gets a padded one where another raises OSError
    (before, it consumed the other's batches and trained on; found by a
    differential run)."""
    m = sys.modules.get("PIL.ImageFile")  # not loaded yet (no plugin opened an image): its default
    return {"LOAD_TRUNCATED_IMAGES": bool(getattr(m, "LOAD_TRUNCATED_IMAGES", False))}


def _worker_init(loader):
    """The loader's worker_init_fn, or None: it may change what the workers make
    (a dataset attribute set per worker, an offset read from a global), so
    loaders with different ones never share. Whatever the number of workers:
    jobs of one script share whether they start workers or not (a consumer
    takes the producer's batches, made by its workers). functools.partial
    (Lightning's seeding) is its function and arguments."""
    fn = getattr(loader, "worker_init_fn", None)
    if fn is None:
        return None
    if type(fn).__name__ == "partial" and isinstance(getattr(fn, "keywords", None), dict):
        return ["partial", _worker_init_fn(fn.func),
                [_transform_value(a, 1, "worker_init_fn", "args") for a in fn.args],
                _transform_value(dict(fn.keywords), 1, "worker_init_fn", "keywords")]
    return _worker_init_fn(fn)


def _worker_init_fn(fn):
    d = _function(fn)
    if d is None:
        raise NotShareable("worker_init_fn %s is not a plain module-level function" % _callable_name(fn))
    return d


def _sampler(sampler, dataset, data):
    t = type(sampler)
    name = _qualname(t)
    if t is data.SequentialSampler and sampler.data_source is dataset:
        return "sequential"
    if t is data.RandomSampler and sampler.data_source is dataset:
        return "random(replacement=%s,num_samples=%d)" % (
            bool(sampler.replacement), int(sampler.num_samples))
    if t is data.SubsetRandomSampler:
        # shareable only with the very same indices (their order included)
        idx = sampler.indices
        if hasattr(idx, "tolist"):
            idx = idx.tolist()
        h = hashlib.sha256()
        n = 0
        for i in idx:
            if isinstance(i, bool) or not isinstance(i, int):
                raise NotShareable("sampler %s has non-integer indices" % name)
            h.update(b"%d," % i)
            n += 1
        return "subset_random(n=%d,indices=%s)" % (n, h.hexdigest()[:32])
    raise NotShareable("sampler %s is not shareable" % name)


def is_default_collate(fn, data):
    """torch's default_collate (or none given): samples stacked along dim 0."""
    impl = sys.modules.get("torch.utils.data._utils.collate")
    return fn is None or fn is getattr(data, "default_collate", None) or fn is getattr(impl, "default_collate", None)


def _collate(fn, data):
    if is_default_collate(fn, data):
        return "default"
    d = _function(fn)
    if d is None:
        raise NotShareable("collate function %s is not a plain module-level function"
                           % _callable_name(fn))
    return d


# --- the dataset -------------------------------------------------------------

_TRANSFORM_ATTRS = ("transform", "target_transform", "transforms")
_FOLDER_ATTRS = frozenset(("root", "loader", "extensions", "classes", "class_to_idx",
                           "samples", "targets", "imgs") + _TRANSFORM_ATTRS)


def _dataset(ds, depth):
    if depth > _MAX_DEPTH:
        raise NotShareable("dataset state cannot be described (nested too deep)")
    data = sys.modules["torch.utils.data"]
    if isinstance(ds, data.IterableDataset):
        raise NotShareable("iterable dataset")
    out = {"class": _qualname(type(ds))}
    code = _class_code(type(ds))
    if code:
        out["code"] = code
    try:
        out["len"] = len(ds)
    except Exception:
        raise NotShareable("dataset %s has no len()" % out["class"])
    attrs = getattr(ds, "__dict__", None)
    if attrs is None:
        raise NotShareable("dataset state cannot be described (%s has no __dict__)" % out["class"])
    skip = set(_TRANSFORM_ATTRS)
    folder = sys.modules.get("torchvision.datasets.folder")
    if folder is not None and isinstance(ds, folder.DatasetFolder):
        out["folder"] = _folder(ds, folder)
        skip = _FOLDER_ATTRS
    out["transforms"] = {a: _transform(attrs[a]) for a in _TRANSFORM_ATTRS if a in attrs}
    state = {}
    for k in sorted(attrs):
        if k in skip:
            continue
        try:
            state[k] = _value(attrs[k], depth + 1)
        except _Undescribable as e:
            raise NotShareable("dataset state cannot be described (%s.%s: %s)"
                               % (out["class"], k, e))
    if state:
        out["state"] = state
    return out


def _folder(ds, folder):
    """torchvision DatasetFolder/ImageFolder: root, samples, extensions, loader."""
    root = os.path.expanduser(os.fspath(ds.root))
    real_root = os.path.realpath(root)
    prefix = os.path.join(root, "")
    n = len(prefix)
    h = hashlib.sha256()
    count = 0
    samples = ds.samples  # in memory: nothing is read or stat'ed
    for i in range(0, len(samples), 65536):  # ~0.5 s for ImageNet's 1.28M
        lines = []
        for path, target in samples[i:i + 65536]:
            if type(path) is not str:
                path = os.fspath(path)
            if path.startswith(prefix):
                rel = path[n:]
            else:
                rel = os.path.relpath(os.path.realpath(path), real_root)
            lines.append("%s\0%d\n" % (rel, target))
        h.update("".join(lines).encode("utf-8", "surrogateescape"))
        count += len(lines)
    ext = getattr(ds, "extensions", None)
    load = getattr(ds, "loader", None)
    load_d = _function(load)
    if load_d is None:
        raise NotShareable("dataset loader %s is not a plain module-level function"
                           % _callable_name(load))
    out = {
        "root": real_root,
        "samples": count,
        "samples_sha": h.hexdigest()[:32],
        "classes": [str(c) for c in getattr(ds, "classes", [])],
        "extensions": sorted(ext) if isinstance(ext, (tuple, list)) else
        (None if ext is None else str(ext)),
        "loader": load_d,
    }
    if load is getattr(folder, "default_loader", None):
        tv = sys.modules.get("torchvision")
        if tv is not None and hasattr(tv, "get_image_backend"):
            out["image_backend"] = tv.get_image_backend()
    return out


class _Undescribable(Exception):
    pass


_SIMPLE = (str, int, float, bool, bytes, type(None))


def _value(v, depth):
    """A JSON-able, process-independent description of one attribute value."""
    if depth > _MAX_DEPTH:
        raise _Undescribable("nested too deep")
    if isinstance(v, float):
        return ["f", v.hex()]  # exact, and nan/inf survive JSON
    if isinstance(v, bytes):
        return ["b", hashlib.sha256(v).hexdigest()[:32]]
    if isinstance(v, _SIMPLE):
        return v
    if isinstance(v, os.PathLike):
        return ["path", os.path.realpath(os.fspath(v))]
    if isinstance(v, (tuple, list, range, set, frozenset)):
        if isinstance(v, range):
            return ["range", v.start, v.stop, v.step]
        items = [_value(x, depth + 1) for x in v]
        if isinstance(v, (set, frozenset)):
            items.sort(key=lambda x: json.dumps(x, sort_keys=True))
        tag = type(v).__name__ if type(v) in (tuple, list, set, frozenset) else _qualname(type(v))
        if len(items) > 64:  # long lists (indices, file lists): their hash
            blob = json.dumps(items, sort_keys=True, separators=(",", ":"))
            return [tag, len(items), hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()[:32]]
        return [tag, items]
    if type(v) is dict:
        if not all(isinstance(k, (str, int, bool, type(None))) for k in v):
            raise _Undescribable("dict with non-simple keys")
        return ["dict", sorted(([json.dumps(k), _value(x, depth + 1)] for k, x in v.items()),
                               key=lambda p: p[0])]
    data = sys.modules["torch.utils.data"]
    if isinstance(v, data.Dataset):  # Subset, ConcatDataset, wrappers
        return ["dataset", _dataset(v, depth + 1)]
    if isinstance(v, type):
        return ["class", _qualname(v)]
    if callable(v) and isinstance(v, (types.FunctionType, types.BuiltinFunctionType)):
        d = _function(v)
        if d is None:
            raise _Undescribable("%s is not a plain module-level function" % _callable_name(v))
        return ["function", d]
    if _is_torchvision_transform(v):
        return ["transform", _transform(v)]
    # tensors, arrays, open files, locks, arbitrary objects: we cannot say
    # what they hold without reading it, so the loader does not share
    raise _Undescribable("%s object" % _qualname(type(v)))


# --- transforms --------------------------------------------------------------

_LAMBDA_REASON = "transform has no stable description (a lambda, closure, bound method or partial)"


def _is_torchvision(cls):
    return getattr(cls, "__module__", "").startswith("torchvision.")


def _is_torchvision_transform(v):
    return type(v).__module__.startswith("torchvision.transforms")


def _transform(t):
    """A transform (tree) as the class, own code and state of every node. A
    repr misses parameters (ConvertImageDtype's dtype, RandomCrop's
    padding_mode, fill and pad_if_needed, RandomPerspective's distortion_scale
    are not printed, and torchvision 0.14's ElasticTransform prints none of
    its own), so every attribute enters the key; a node holding what cannot
    be described makes the loader unshareable. None stays None."""
    if t is None:
        return None
    return _transform_value(t, 0, "dataset", "transform")


def _transform_fn(fn):
    d = _function(fn)
    if d is None:
        raise NotShareable(_LAMBDA_REASON)
    return d


_module_internals = None  # what torch.nn.Module.__init__ puts in every module's __dict__


def _internals(torch):
    global _module_internals
    if _module_internals is None:
        _module_internals = frozenset(vars(torch.nn.Module()))
    return _module_internals


def _transform_node(t, depth):
    """{class, code (of the user's own classes), state}: every attribute of t."""
    if depth > _MAX_DEPTH:
        raise NotShareable(_LAMBDA_REASON)
    cls = type(t)
    out = {"class": _qualname(cls)}
    if not _is_library_class(cls):
        code = _class_code(cls)  # a transform class of the user's own: its repr is not its code
        if code:
            out["code"] = code
    attrs = getattr(t, "__dict__", None)
    if attrs is None:  # slots or a C type: state we cannot see
        raise NotShareable("transform state cannot be described (%s has no __dict__)" % out["class"])
    torch = sys.modules.get("torch")
    skip = frozenset()
    if torch is not None and isinstance(t, torch.nn.Module):
        skip = _internals(torch)  # hooks, flags; what a module holds is in the three below
        for k in ("_modules", "_parameters", "_buffers"):
            held = {n: v for n, v in (attrs.get(k) or {}).items() if v is not None}
            if held:
                out[k] = {n: _transform_value(v, depth + 1, out["class"], n) for n, v in sorted(held.items())}
    out["state"] = {k: _transform_value(attrs[k], depth + 1, out["class"], k)
                    for k in sorted(attrs) if k not in skip}
    return out


def _transform_value(v, depth, owner, name):
    """One attribute of a transform: simple values as _value has them, and
    what transforms hold besides (enums, dtypes, tensors, other transforms)."""
    if depth > _MAX_DEPTH:
        raise NotShareable(_LAMBDA_REASON)
    torch = sys.modules.get("torch")
    if v is None or isinstance(v, _SIMPLE):
        return _value(v, depth)
    if isinstance(v, enum.Enum):  # InterpolationMode
        return ["enum", _qualname(type(v)), v.name]
    if isinstance(v, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)) or \
            type(v).__name__ == "partial":
        return ["function", _transform_fn(v)]
    if torch is not None and isinstance(v, torch.dtype):
        return ["dtype", str(v)]
    if torch is not None and isinstance(v, torch.Tensor):
        c = v.detach().cpu().contiguous()
        raw = c.reshape(-1).view(torch.uint8)
        return ["tensor", str(c.dtype), list(c.shape), hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:32]]
    if isinstance(v, (list, tuple)):
        return [type(v).__name__, [_transform_value(x, depth + 1, owner, name) for x in v]]
    if type(v) is dict and all(type(k) is str for k in v):
        return ["dict", [[k, _transform_value(v[k], depth + 1, owner, name)] for k in sorted(v)]]
    if isinstance(v, type):
        return ["class", _qualname(v)]
    cls = type(v)
    if _is_torchvision(cls) or not _is_library_class(cls) or \
            (torch is not None and isinstance(v, torch.nn.Module)):
        return _transform_node(v, depth)
    raise NotShareable("transform state cannot be described (%s.%s: %s object)" % (owner, name, _qualname(cls)))


# --- functions ---------------------------------------------------------------

def _qualname(cls):
    return "%s.%s" % (getattr(cls, "__module__", "?"), getattr(cls, "__qualname__", cls.__name__))


def _callable_name(fn):
    return getattr(fn, "__qualname__", None) or _qualname(type(fn))


def _function(fn, seen=None):
    """module.qualname[#code hash] of a plain module-level function, else None.

    Lambdas, closures, nested functions, bound methods and partials are not
    plain (their state or identity is not visible by name). A Python
    function also carries a hash of its code and defaults: __main__.collate
    in two different scripts is not the same function."""
    if isinstance(fn, types.BuiltinFunctionType):
        owner = getattr(fn, "__self__", None)
        if owner is not None and not isinstance(owner, types.ModuleType):
            return None
        return "%s.%s" % (getattr(fn, "__module__", None) or getattr(owner, "__name__", "?"),
                          fn.__qualname__)
    if not isinstance(fn, types.FunctionType):
        return None
    qn = fn.__qualname__
    if fn.__name__ == "<lambda>" or "<locals>" in qn or "." in qn or fn.__closure__:
        return None
    mod = sys.modules.get(fn.__module__)
    if mod is None or getattr(mod, qn, None) is not fn:
        return None
    h = hashlib.sha256()
    try:
        _hash_function(fn, h, seen if seen is not None else set())
    except (_Undescribable, NotShareable):
        return None
    return "%s.%s#%s" % (fn.__module__, qn, h.hexdigest()[:16])


_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ("builtins", "typing", "abc", "collections")))


def _is_library_class(cls):
    """torch's, torchvision's or Python's own (typing.Generic is in every Dataset's MRO)"""
    m = getattr(cls, "__module__", None) or ""
    top = m.split(".", 1)[0]
    return top in ("torch", "torchvision") or top in _STDLIB


def _class_code(cls, seen=None):
    """Hash of the code of cls and its bases that are not torch's, torchvision's
    or builtins (methods, static and class methods, properties, simple class
    attributes), or None when there are none. Two scripts' __main__.MyData
    with different __getitem__ have one name and two codes: their batches
    differ, and so must their keys."""
    h = hashlib.sha256()
    own = False
    seen = seen if seen is not None else set()
    seen.add(id(cls))
    try:
        for c in cls.__mro__:
            if _is_library_class(c):
                continue
            own = True
            h.update(_qualname(c).encode("utf-8", "surrogatepass") + b"\0")
            for name in sorted(c.__dict__):
                v = c.__dict__[name]
                if isinstance(v, (staticmethod, classmethod)):
                    v = v.__func__
                fns = [v.fget, v.fset, v.fdel] if isinstance(v, property) else [v]
                for f in fns:
                    if isinstance(f, types.FunctionType):
                        h.update(name.encode("utf-8", "surrogatepass") + b"\0")
                        _hash_function(f, h, seen)
                    elif not name.startswith("__") and not isinstance(f, (type, property, types.ModuleType,
                                                                         types.MemberDescriptorType,
                                                                         types.GetSetDescriptorType)):
                        # what the methods read off the class as data (Jitter.scales, a
                        # generator, a transform object): before, only simple values
                        # entered, and jobs that set a tuple differently shared each
                        # other's batches
                        h.update(json.dumps([name, _class_attr(f, _qualname(c), name, seen)], sort_keys=True)
                                 .encode("utf-8", "surrogatepass"))
    except (_Undescribable, NotShareable) as e:
        raise NotShareable("the code of %s cannot be described (%s)" % (_qualname(cls), e))
    return h.hexdigest()[:16] if own else None


def _class_attr(v, owner, name, seen):
    """A class attribute that is not a method: data as a global is (_global_value);
    a callable object (a transform, a partial) by its state, as a transform is."""
    if callable(v) and not isinstance(v, (types.BuiltinFunctionType, types.MethodType, types.BuiltinMethodType)):
        try:
            return _transform_value(v, 1, owner, name)
        except (_Undescribable, NotShareable):
            return ["object", _qualname(type(v))]
    return _global_value(v, seen)


def _global_reads(code, depth=0):
    """The module globals code reads, each with the attributes read straight
    off it: {("args", ("scale",)), ("SCALE", ())}. From the bytecode, so an
    attribute of self that has a global's name is not taken for it."""
    if depth > _MAX_DEPTH:
        raise _Undescribable("code nested too deep")
    out = set()
    ins = list(dis.get_instructions(code))
    for k, i in enumerate(ins):
        if i.opname not in ("LOAD_GLOBAL", "LOAD_NAME") or not isinstance(i.argval, str):
            continue
        path = []
        for j in ins[k + 1:]:
            if j.opname not in ("LOAD_ATTR", "LOAD_METHOD") or not isinstance(j.argval, str):
                break
            path.append(j.argval)
        out.add((i.argval, tuple(path)))
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _global_reads(c, depth + 1)
    return out


def _hash_globals(code, globs, h, seen):
    """Hash what the module globals that code reads hold (_global_value): a
    dataset whose __getitem__ scales by SCALE = args.scale makes other
    batches when the script is run with another --scale, and must not share.
    Attributes are followed into data (args.scale) and into modules of the
    user's own (config.OFFSET), not into a library's (torch.tensor) nor into
    a method: CFG.get("offset") describes CFG, what it answers from. Code
    that reads the environment (os.environ, os.getenv) has the variables its
    string constants name described too."""
    env = False
    for name, path in sorted(_global_reads(code)):
        if name not in globs:
            continue  # a builtin (len, range), or a global not set yet
        v, read = globs[name], []
        for attr in path:
            if v is os and attr in ("environ", "getenv", "getenvb", "environb"):
                env = True
            if isinstance(v, type) or callable(v) or \
                    (isinstance(v, types.ModuleType) and _is_library_module(v.__name__)):
                break  # torch.tensor, np.random.rand, T.Compose: the module or class says it
            try:
                nxt = getattr(v, attr)
            except Exception:
                break
            if callable(nxt) and not isinstance(nxt, type) and not isinstance(v, types.ModuleType):
                break  # a method of v's (CFG.get): v is what it answers from
            v = nxt
            read.append(attr)
        if v is os.environ or v is getattr(os, "getenv", None):
            env = True
        h.update(json.dumps([name, read, _global_value(v, seen)], sort_keys=True).encode("utf-8", "surrogatepass"))
    if env:
        names = sorted(c for c in _str_consts(code) if c and len(c) <= 256 and c.replace("_", "A").isalnum())
        h.update(json.dumps(["environ", [[n, os.environ.get(n)] for n in names]]).encode("utf-8", "surrogatepass"))


def _str_consts(code, depth=0):
    """The string constants of code and the code nested in it."""
    out = set()
    if depth > _MAX_DEPTH:
        return out
    for c in code.co_consts:
        if isinstance(c, str):
            out.add(c)
        elif isinstance(c, types.CodeType):
            out |= _str_consts(c, depth + 1)
    return out


_RNG_TYPES = (("random", "Random"), ("numpy.random", "Generator"), ("numpy.random", "RandomState"),
              ("numpy.random._generator", "Generator"), ("numpy.random.mtrand", "RandomState"),
              ("torch", "Generator"), ("torch._C", "Generator"))


def _is_rng(v):
    t = type(v)
    for c in t.__mro__:
        if (getattr(c, "__module__", None), c.__name__) in _RNG_TYPES:
            return True
    return False


def rng_state():
    """A digest of the state of the random generators the last fingerprint()
    found the user's code reading as globals (random.Random, numpy's, a
    torch.Generator), or None when there were none. Not in the sharing key:
    in socket mode consumers take the producer's random draws, as they take
    its seeds. Exact mode puts it in its epoch key: a seeded generator a
    transform reads repeats its draws without the shim (forked workers
    inherit it), so jobs whose generators stand elsewhere make other epochs."""
    if not _rngs_read:
        return None
    h = hashlib.sha256()
    for g in _rngs_read:
        try:
            if hasattr(g, "getstate") and not hasattr(g, "bit_generator"):
                st = g.getstate()  # random.Random
            elif hasattr(g, "bit_generator"):
                st = g.bit_generator.state  # numpy Generator
            elif hasattr(g, "get_state") and callable(g.get_state):
                st = g.get_state()  # numpy RandomState, torch.Generator
            else:
                st = None
            if hasattr(st, "numpy"):
                st = st.numpy().tobytes()
            h.update(repr(st).encode("utf-8", "surrogatepass"))
        except Exception as e:  # its state cannot be had: never the same twice
            h.update(os.urandom(16) + repr(e).encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:32]


def _is_library_module(modname):
    """torch's, torchvision's, Python's own, or an installed package's (under
    site-packages or dist-packages): not the user's code."""
    top = (modname or "").split(".", 1)[0]
    if top in ("torch", "torchvision", "numpy", "PIL") or top in _STDLIB:
        return True
    mod = sys.modules.get(top)
    f = getattr(mod, "__file__", None) or ""
    return "site-packages" in f or "dist-packages" in f


def _global_value(v, seen):
    """A description of a global's value for the key: modules and the
    libraries' classes and functions by name; the user's own classes and
    functions by their code (and the globals it reads in turn); tensors and
    arrays by their bytes; data as attributes are (_value); the libraries'
    other objects (a logger, a lock, a random generator: no data of the
    batches) by their type. Anything else of the user's own that cannot be
    described keeps the loader from sharing."""
    if isinstance(v, types.ModuleType):
        return ["module", v.__name__]
    if isinstance(v, type):
        if _is_library_class(v) or _is_library_module(getattr(v, "__module__", None)) or id(v) in seen:
            return ["class", _qualname(v)]
        return ["class", _qualname(v), _class_code(v, seen)]
    if isinstance(v, types.FunctionType):
        qn = "%s.%s" % (v.__module__, v.__qualname__)
        if _is_library_module(v.__module__) or id(v) in seen:
            return ["function", qn]
        seen.add(id(v))
        h = hashlib.sha256()
        _hash_function(v, h, seen)
        return ["function", qn, h.hexdigest()[:16]]
    if isinstance(v, (types.BuiltinFunctionType, types.MethodType, types.BuiltinMethodType)):
        return ["callable", _callable_name(v)]
    torch, np = sys.modules.get("torch"), sys.modules.get("numpy")
    if torch is not None and isinstance(v, torch.Tensor):
        t = v.detach().cpu().contiguous()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return ["tensor", str(t.dtype), list(t.shape), hashlib.sha256(raw).hexdigest()[:32]]
    if np is not None and isinstance(v, np.ndarray):
        return ["ndarray", str(v.dtype), list(v.shape), hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()[:32]]
    if _is_rng(v):
        _rngs_read.append(v)  # its state enters exact mode's epoch key (rng_state), not the sharing key
        return ["rng", _qualname(type(v))]
    try:
        return _value(v, 1)
    except _Undescribable:
        pass
    t = type(v)
    if _is_library_class(t) or _is_library_module(getattr(t, "__module__", None)):
        state = getattr(v, "__dict__", None)
        if t.__module__ in ("argparse", "types") and isinstance(state, dict):  # Namespace, SimpleNamespace
            return ["object", _qualname(t), _value(dict(state), 1)]
        return ["object", _qualname(t)]
    state = getattr(v, "__dict__", None)
    if not isinstance(state, dict):
        raise NotShareable("a global the dataset's code reads holds a %s object that cannot be described"
                           % _qualname(t))
    if id(v) in seen:
        return ["object", _qualname(t)]
    seen.add(id(v))
    code = _class_code(t, seen) if id(t) not in seen else None
    return ["object", _qualname(t), code, _value(dict(state), 1)]


def _hash_function(fn, h, seen):
    """Hash what a Python function computes with: its code, the module globals
    that code reads, its defaults."""
    _hash_code(fn.__code__, h, 0)
    _hash_globals(fn.__code__, fn.__globals__, h, seen)
    h.update(json.dumps([_value(d, 1) for d in (fn.__defaults__ or ())]).encode())
    h.update(json.dumps(sorted((k, _value(d, 1)) for k, d in (fn.__kwdefaults__ or {}).items())).encode())


def _hash_code(code, h, depth):
    if depth > _MAX_DEPTH:
        raise _Undescribable("code nested too deep")
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _hash_code(c, h, depth + 1)
        elif isinstance(c, frozenset):  # its repr's order depends on PYTHONHASHSEED
            h.update(repr(sorted(repr(x) for x in c)).encode("utf-8", "surrogatepass"))
        else:
            h.update(repr(c).encode("utf-8", "surrogatepass"))
        h.update(b"\0")
