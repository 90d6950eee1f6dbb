#!/usr/bin/env bash
# The PyTorch layer's own private loaders, in a plain Python process (no shim,
# no feed): tests/py/test_layer.py. A private loader the layer drops has its
# workers taken out of torch's SIGCHLD watch first: one that dies on its way
# out (case dw under make asan: SIGABRT) must not raise in the job.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh

layer_py_tests "layer unit tests" tests/py/test_layer.py
finish layer
