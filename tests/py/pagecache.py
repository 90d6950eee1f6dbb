"""Page-cache residency of a directory tree, for the prefetch test.

    pagecache.py evict DIR      drop DIR's files from the page cache (fadvise)
    pagecache.py resident DIR   print the fraction of DIR's pages in memory (mincore)
"""
import ctypes
import mmap
import os
import sys

libc = ctypes.CDLL(None, use_errno=True)
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
PAGE = os.sysconf("SC_PAGE_SIZE")


def files(root):
    for d, _, names in os.walk(root):
        for n in sorted(names):
            p = os.path.join(d, n)
            if os.path.isfile(p) and os.path.getsize(p) > 0:
                yield p


def evict(root):
    for p in files(root):
        fd = os.open(p, os.O_RDONLY)
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def resident(root):
    total = res = 0
    for p in files(root):
        size = os.path.getsize(p)
        fd = os.open(p, os.O_RDONLY)
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        os.close(fd)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap " + p)
        pages = (size + PAGE - 1) // PAGE
        vec = (ctypes.c_ubyte * pages)()
        rc = libc.mincore(addr, size, vec)
        libc.munmap(addr, size)
        if rc != 0:
            raise OSError(ctypes.get_errno(), "mincore " + p)
        res += sum(v & 1 for v in vec)
        total += pages
    return res / total if total else 1.0


if __name__ == "__main__":
    cmd, root = sys.argv[1], sys.argv[2]
    if cmd == "evict":
        evict(root)
    else:
        print(f"{resident(root):.3f}")
