"""Settings for every test of the repository (core, executors, plugins)."""

import os

# Tests assert which executor ran an operation, so the claim order decides in them; the
# default, measuring each claim against its alternatives, is tested where a test asks for it
# (``select="measure"``) and in the model tests that name it.
os.environ.setdefault("THUNDER_CORE_SELECT", "priority")
