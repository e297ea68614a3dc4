"""Executors: who runs each operation of a trace."""
