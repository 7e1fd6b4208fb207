"""Benchmarks: scripts that print measured figures (see benchmarks/README.md).

A benchmark's runs keep their backbone features in a feature store of their own, removed when it
exits, not in the user's cache (unless $PHOTOCLF_CACHE_DIR names one): their photos are
generated or temporary copies, and a store filled by an earlier benchmark would time warm runs.
"""

import atexit
import os
import shutil
import tempfile

if not os.environ.get("PHOTOCLF_CACHE_DIR"):
    _store = tempfile.mkdtemp(prefix="photoclf-benchmark-cache-")
    os.environ["PHOTOCLF_CACHE_DIR"] = _store
    atexit.register(shutil.rmtree, _store, ignore_errors=True)
