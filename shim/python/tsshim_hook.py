# SPDX-License-Identifier: MIT
"""tsshim's PyTorch layer (issue 4), loaded when torch.utils.data is imported.

sitecustomize.py's finder hands us the import of torch.utils.data (which
`import torch` itself does): find_spec() wraps the real loader so that
on_torch_data(module) runs once the module has run; then every tsshim finder
leaves sys.meta_path. This module is imported only then, so a program that
never imports torch pays nothing for it, and we never import torch.

Everything here is idempotent (the bootstrap may run twice) and never fails
the job: an error leaves the program with its own DataLoader and one line.
"""
import os
import sys
import traceback

TARGET = "torch.utils.data"
_LEVELS = {"error": 0, "warn": 1, "info": 2, "debug": 3}
_busy = False


def log(level, msg):
    """One "tsshim[pid]: ..." line on stderr, if TSSHIM_LOG lets it through."""
    if _LEVELS[level] > _LEVELS.get(os.environ.get("TSSHIM_LOG", "warn"), 1):
        return
    try:
        os.write(2, ("tsshim[%d]: %s\n" % (os.getpid(), msg)).encode("utf-8", "replace"))
    except OSError:
        pass


def where(e):
    """ " (at FILE:LINE in FUNC[; raised in FILE:LINE in FUNC])": the innermost
    frame of e's traceback in the layer's own files, and the innermost of all
    where that is elsewhere (torch, a peer's data); "" without a traceback."""
    frames = traceback.extract_tb(e.__traceback__) if e.__traceback__ is not None else []
    if not frames:
        return ""
    here = os.path.dirname(os.path.abspath(__file__))
    ours = [f for f in frames if os.path.dirname(os.path.abspath(f.filename)) == here]

    def spot(f):
        return "%s:%d in %s" % (os.path.basename(f.filename), f.lineno, f.name)

    text = " (at %s" % spot(ours[-1]) if ours else " (raised in %s" % spot(frames[-1])
    if ours and frames[-1] is not ours[-1]:
        text += "; raised in %s" % spot(frames[-1])
    return text + ")"


def on_torch_data(module):
    """torch.utils.data has just been imported: hook its DataLoader, once."""
    cls = getattr(module, "DataLoader", None)
    if cls is None:
        log("info", "%s has no DataLoader: the Python layer stays off" % TARGET)
        return
    if cls.__dict__.get("_tsshim_hooked"):
        return
    mode = os.environ.get("TSSHIM_MODE", "auto")
    if mode not in ("auto", "socket", "exact"):
        log("debug", "TSSHIM_MODE=%s: DataLoaders are not shared" % mode)
        return
    orig_iter = cls.__iter__
    exact = mode == "exact"  # whole batches only between jobs whose epochs are the same (tsshim_exact)

    def __iter__(self):
        it = None
        try:
            if exact:
                import tsshim_exact
                it = tsshim_exact.iterate(self, orig_iter)
            else:
                import tsshim_feed
                it = tsshim_feed.iterate(self, orig_iter)
        except Exception as e:  # the job runs on with its own DataLoader
            log("warn", "DataLoader sharing failed (%s: %s%s); this loader runs on its own"
                % (type(e).__name__, e, where(e)))
            try:
                self.__dict__["_tsshim_state"] = None
                self.__dict__["_tsshim_private"] = True
            except Exception:
                pass
        return it if it is not None else orig_iter(self)

    __iter__.__wrapped__ = orig_iter
    __iter__.__doc__ = orig_iter.__doc__
    cls.__iter__ = __iter__
    cls._tsshim_hooked = True
    import atexit
    atexit.register(_close_feeds)
    os.register_at_fork(after_in_child=_forget_feeds)
    log("debug", "%s imported: DataLoader hooked" % TARGET)


def _close_feeds():
    mod = sys.modules.get("tsshim_feed")
    if mod is not None:
        mod.close_all()


def _forget_feeds():
    mod = sys.modules.get("tsshim_feed")
    if mod is not None:
        mod.forget_all()


def install():
    """torch.utils.data is already imported: hook it now."""
    _fire(sys.modules[TARGET])


def _fire(module):
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "_tsshim_finder", False)]
    try:
        on_torch_data(module)
    except Exception as e:  # the job runs on with its own DataLoader
        log("warn", "DataLoader not hooked: %r" % (e,))


class _Loader:
    """The real loader of torch.utils.data, plus a call once it has run.

    Everything but exec_module goes to the real loader; after exec_module
    the module and its spec get the real loader back, so nothing shows
    afterwards that we were there.
    """

    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):
        if name == "_loader":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self._loader, name)

    def exec_module(self, module):
        try:
            self._loader.exec_module(module)
        finally:
            if getattr(module, "__loader__", None) is self:
                module.__loader__ = self._loader
            spec = getattr(module, "__spec__", None)
            if spec is not None and spec.loader is self:
                spec.loader = self._loader
        _fire(module)  # not reached if the import failed: a retry is hooked too


def find_spec(name, path=None, target=None):
    """The spec the finders after ours give for `name`, its loader wrapped."""
    global _busy
    if name != TARGET or _busy:
        return None
    _busy = True
    try:
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if find is None or getattr(finder, "_tsshim_finder", False):
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
    finally:
        _busy = False
    if spec is None or not hasattr(spec.loader, "exec_module"):
        return None  # nothing we can wrap: the import goes on without us
    spec.loader = _Loader(spec.loader)
    log("debug", "hooking the import of %s" % TARGET)
    return spec
