#!/usr/bin/env bash
# Loader fingerprints (issue 4 item 2): which DataLoaders share. Runs
# tests/py/test_fingerprint.py against the layer as built: same key in
# another process, loader settings ignored, train/val, transforms, sampler
# kinds, collate, refusals with their reason, subclasses.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh

layer_py_tests "fingerprint unit tests" tests/py/test_fingerprint.py "torch, torchvision, PIL"
finish fingerprint
