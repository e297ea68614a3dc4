"""Settings for every test of the repository (core, executors, plugins)."""

import atexit
import os
import shutil
import tempfile

import pytest

# Tests assert which executor ran an operation, so the claim order decides in them; the
# default, measuring each claim against its alternatives, is tested where a test asks for it
# (``select="measure"``) and in the model tests that name it.
os.environ.setdefault("THUNDER_CORE_SELECT", "priority")

# Programs jitted while tests are collected get a private cache of the session (never the user's).
os.environ["THUNDER_CORE_CACHE_DIR"] = tempfile.mkdtemp(prefix="thunder_core_test_cache_")
atexit.register(shutil.rmtree, os.environ["THUNDER_CORE_CACHE_DIR"], ignore_errors=True)


@pytest.fixture(autouse=True)
def _own_disk_cache(tmp_path_factory, monkeypatch):
    """Each test starts with an empty on-disk cache of its own (``THUNDER_CORE_CACHE_DIR``): what
    an earlier test stored (traces, measured executor choices) never changes what a test sees.
    Processes a test starts inherit it."""
    monkeypatch.setenv("THUNDER_CORE_CACHE_DIR", str(tmp_path_factory.mktemp("thunder_core_cache")))
