"""Testing tools for thunder_core and executor authors: OpInfo checks and the conformance kit.

Needs the ``expecttest`` package (PyTorch's OpInfo database imports it).
"""
