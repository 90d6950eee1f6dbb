# SPDX-License-Identifier: MIT
"""tsshim's Python start-up bootstrap (issue 4; PRODUCT.md section 4).

libtsshim.so, preloaded into a Python interpreter, puts this file's directory
first on PYTHONPATH (shim/bootstrap.c), so site.py imports this module as
`sitecustomize`. In this order it:

 1. gives the program the user's PYTHONPATH back in os.environ (and so to
    every child process): the shim added its entry only to get here;
 2. if the C shim is really loaded in this process and TSSHIM_PYTHON is not
    0, puts a finder first on sys.meta_path that waits for the import of
    torch.utils.data (which `import torch` does); silent otherwise;
 3. runs the sitecustomize this one shadows (Debian ships one; pyenv none),
    which then stands in sys.modules['sitecustomize'] as without us. Its
    errors propagate unchanged, so site.py prints the same "Error in
    sitecustomize" line it would print without tsshim. Where there is none,
    this import fails as it would without us (ModuleNotFoundError, which
    site.py passes over in silence), so that sys.modules holds no
    sitecustomize and a later `import sitecustomize` looks afresh: before,
    it found this module, and a program's own, put on sys.path later, never
    ran.

Python 2 (a `python` bootstrap.c could not tell from 3's): step 1, then its
sitecustomize through imp, and no layer.

Start-up cost matters (budget: 20 ms, PRODUCT.md section 6): only sys and os
are imported (site.py has already imported both); the layer itself,
tsshim_hook.py, is compiled and imported only when torch.utils.data is. Our
directory stays on sys.path (spawned DataLoader workers may import
tsshim_hook); it holds only the layer's own modules.
"""
import os
import sys

# importlib.machinery and importlib.util re-export these; the frozen modules
# are always loaded, so using them costs no import at start-up.
try:
    from _frozen_importlib import module_from_spec as _module_from_spec
    from _frozen_importlib_external import PathFinder as _PathFinder
except ImportError:
    try:
        from importlib.machinery import PathFinder as _PathFinder
        from importlib.util import module_from_spec as _module_from_spec
    except ImportError:  # Python 2: _tsshim_py2
        _PathFinder = _module_from_spec = None

_TARGET = "torch.utils.data"


def _run_file_module(name, path):
    """Import `name` from the directories in `path` only; None if not there."""
    spec = _PathFinder.find_spec(name, path)
    if spec is None or spec.loader is None:
        return None
    module = _module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)  # as a failed import leaves it
        raise
    return module


def _hook_module(here):
    # By path, not through sys.path: the program may have changed sys.path.
    return sys.modules.get("tsshim_hook") or _run_file_module("tsshim_hook", [here])


class _TsshimFinder:
    """Waits for torch.utils.data; tsshim_hook does the work from then on."""

    _tsshim_finder = True  # how every copy of the bootstrap recognises it

    def __init__(self, here):
        self.here = here

    def find_spec(self, name, path=None, target=None):
        if name != _TARGET:
            return None
        try:
            return _hook_module(self.here).find_spec(name, path, target)
        except Exception as e:  # never break the job for the layer
            sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
            _warn("Python layer not loaded: %r" % (e,))
            return None


def _warn(msg):
    if os.environ.get("TSSHIM_LOG", "warn") != "error":
        sys.stderr.write("tsshim[%d]: %s\n" % (os.getpid(), msg))


def _shim_loaded():
    # /proc/self/maps is the truth and costs far less than importing ctypes.
    try:
        with open("/proc/self/maps", "rb") as f:
            return b"/libtsshim" in f.read()
    except OSError:
        return "libtsshim" in os.environ.get("LD_PRELOAD", "")


def _restore_pythonpath(here):
    # 1. PYTHONPATH: only undo what is ours, i.e. when our directory is its
    # first entry. bootstrap.c keeps the original in _TSSHIM_ORIG_PYTHONPATH
    # when there was one (even empty); none means it was unset. A PYTHONPATH
    # the user built by hand with our directory first loses just that entry.
    pp = os.environ.get("PYTHONPATH")
    if pp is not None:
        first, _, rest = pp.partition(os.pathsep)
        if first and os.path.abspath(first) == here:
            orig = os.environ.pop("_TSSHIM_ORIG_PYTHONPATH", None)
            if orig is not None:
                os.environ["PYTHONPATH"] = orig
            elif rest:
                os.environ["PYTHONPATH"] = rest
            else:
                del os.environ["PYTHONPATH"]


def _not_found():
    # as the import of a module that does not exist fails
    try:
        return ModuleNotFoundError("No module named 'sitecustomize'", name="sitecustomize")
    except NameError:  # Python 2
        return ImportError("No module named sitecustomize")


def _tsshim_py2(here):
    _restore_pythonpath(here)
    import imp
    try:
        found = imp.find_module("sitecustomize", [p for p in sys.path if os.path.abspath(p) != here])
    except ImportError:
        raise _not_found()
    del sys.modules["sitecustomize"]  # its own module, not this one run again
    try:
        imp.load_module("sitecustomize", *found)
    finally:
        if found[0]:
            found[0].close()


def _tsshim_bootstrap():
    here = os.path.dirname(os.path.abspath(__file__))
    _restore_pythonpath(here)

    # 2. The hook, only where the C shim is loaded (PYTHONPATH is inherited
    # by programs that run without it), and only once per process.
    if os.environ.get("TSSHIM_PYTHON", "1") != "0" and _shim_loaded():
        try:
            if _TARGET in sys.modules:  # imported before us: hook it now
                _hook_module(here).install()
            elif not any(getattr(f, "_tsshim_finder", False) for f in sys.meta_path):
                sys.meta_path.insert(0, _TsshimFinder(here))
        except Exception as e:
            _warn("Python layer not loaded: %r" % (e,))

    # 3. The shadowed sitecustomize: the next one on sys.path after ours.
    # site.py's import of this module ends by taking whatever
    # sys.modules['sitecustomize'] then holds: the shadowed module.
    if _run_file_module("sitecustomize", [p for p in sys.path if os.path.abspath(p) != here]) is None:
        _hide_from_later_imports(here)
        raise _not_found()


class _WithoutBootstrap:
    """Our directory's finder, without this module: a later `import
    sitecustomize` looks only where it would without us."""

    def __init__(self, inner):
        self.inner = inner

    def find_spec(self, name, target=None):
        return None if name == "sitecustomize" else self.inner.find_spec(name, target)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


def _hide_from_later_imports(here):
    for p in sys.path:
        f = sys.path_importer_cache.get(p)
        if f is not None and os.path.abspath(p) == here and not isinstance(f, _WithoutBootstrap):
            sys.path_importer_cache[p] = _WithoutBootstrap(f)


if _PathFinder is None:
    _tsshim_py2(os.path.dirname(os.path.abspath(__file__)))
else:
    _tsshim_bootstrap()
