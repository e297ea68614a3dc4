import os

# A decomposition that does not fit its op is an error in tests (users get a silent leaf).
os.environ.setdefault("THUNDER_CORE_CHECK_DECOMPOSITIONS", "1")
