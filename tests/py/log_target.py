"""The shim's log lines go only to the stderr the program started with.

log_target.py pipe PROG...   run PROG with stderr a pipe whose reader is gone; print its exit status
log_target.py FILE           close fd 2, open FILE (it gets number 2), decode $JPEG with Pillow
"""
import os, subprocess, sys
mode, prog = sys.argv[1], sys.argv[2:]
if mode == "pipe":
    # stderr a pipe whose reader is gone: the shim's line must not kill the program
    r, w = os.pipe()
    os.close(r)
    p = subprocess.run(prog, stderr=w)
    print(p.returncode)
else:
    # fd 2 closed and reused for the program's own file after start
    out = mode
    os.close(2)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    assert fd == 2, fd
    os.write(2, b"DATA\n")
    from PIL import Image
    Image.open(os.environ["JPEG"]).load()
    os.write(2, b"END\n")
