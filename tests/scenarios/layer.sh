#!/usr/bin/env bash
# The PyTorch layer's own private loaders, in a plain Python process (no shim,
# no feed): tests/py/test_layer.py. A private loader the layer drops has its
# workers taken out of torch's SIGCHLD watch first: one that dies on its way
# out (case dw under make asan: SIGABRT) must not raise in the job. What an
# epoch lacks, from the feed's answers (faked): the head a joiner never read
# joins the private rest when the stream stops; what it made privately since
# is not lost again.
# tests/py/test_exact.py: exact mode's stand-ins for a DataLoader iterator
# (its draws, index batches and a fallback iterator) against torch's own.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh

layer_py_tests "layer unit tests" tests/py/test_layer.py
layer_py_tests "exact mode's iterator stand-ins against torch's iterator" tests/py/test_exact.py
finish layer
