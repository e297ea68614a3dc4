import os

# A decomposition that does not fit its op is an error in tests (users get a silent leaf).
os.environ.setdefault("THUNDER_CORE_CHECK_DECOMPOSITIONS", "1")
# The core's tests test the core: executor packages installed beside it (the test command
# installs every package of the repository) are used only where a test names them.
os.environ.setdefault("THUNDER_CORE_NO_AUTOLOAD", "1")
