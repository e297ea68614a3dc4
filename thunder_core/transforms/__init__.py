"""Trace transforms: each a function ``Trace -> Trace`` with one job."""
