"""``thunder_core.jit``: the user-facing compiler entry points."""
