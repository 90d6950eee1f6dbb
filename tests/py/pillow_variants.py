"""Decode every JPEG under ROOT the ways Pillow users do, twice, and print a
digest per decode: plain load (RGBX raw mode in libjpeg), draft() scaling
to 1/2, 1/4, 1/8, draft to grayscale and to YCbCr, and convert()."""
import hashlib
import os
import sys

from PIL import Image


def variants(path):
    with open(path, "rb") as f:
        im = Image.open(f)
        im.load()
        yield "load", im
    for scale in (2, 4, 8):
        with open(path, "rb") as f:
            im = Image.open(f)
            im.draft(im.mode, (im.width // scale, im.height // scale))
            im.load()
            yield f"draft-1/{scale}", im
    for mode in ("L", "YCbCr"):
        with open(path, "rb") as f:
            im = Image.open(f)
            im.draft(mode, im.size)
            im.load()
            yield f"draft-{mode}", im
    with open(path, "rb") as f:
        yield "convert-RGB", Image.open(f).convert("RGB")


root = sys.argv[1]
for rep in range(int(sys.argv[2]) if len(sys.argv) > 2 else 1):
    for d, _, names in sorted(os.walk(root)):
        for n in sorted(names):
            if n.endswith(".jpg"):
                p = os.path.join(d, n)
                for name, im in variants(p):
                    print(p, name, im.mode, im.size, hashlib.md5(im.tobytes()).hexdigest())
