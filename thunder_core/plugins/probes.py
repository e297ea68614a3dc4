"""Cheap checks for ``thunder_core_probe`` hooks: is a library there, is a device there.

Each returns None when the requirement is met, else a sentence saying what is missing, so a
probe can list every problem at once::

    problems = [p for p in (library("cudnn", "nvidia-cudnn-frontend", ">=1.5"), cuda_device((8, 0))) if p]
    if problems:
        return Availability.missing("; ".join(problems), "pip install ... on a machine with ...")
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version


def library(module: str, distribution: str, versions: str = "") -> str | None:
    """``module`` importable (found without importing it) from ``distribution`` in ``versions``."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return f"{distribution} is not installed (no module {module!r})"
    if versions:
        try:
            version = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            return f"module {module!r} is there but not from {distribution}"
        try:
            if Version(version) not in SpecifierSet(versions, prereleases=True):
                return f"{distribution} {version} is outside the supported range {versions}"
        except InvalidVersion:
            return f"{distribution} has an unreadable version {version!r}"
    return None


def cuda_device(min_capability: tuple[int, int] | None = None) -> str | None:
    """A CUDA device usable by torch, of at least ``min_capability`` (major, minor)."""
    import torch

    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            return f"torch {torch.__version__} is a CPU-only build (no CUDA)"
        return "no CUDA device (torch.cuda.is_available() is False)"
    if min_capability is not None:
        capability = torch.cuda.get_device_capability()
        if capability < min_capability:
            name = torch.cuda.get_device_name()
            return (
                f"{name} has compute capability {capability[0]}.{capability[1]}; "
                f"{min_capability[0]}.{min_capability[1]} or newer is needed"
            )
    return None


def availability(problems, remedy: str):
    """``Availability.ok()`` if every check passed (None), else missing with all problems and ``remedy``."""
    from thunder_core.plugins.hookspecs import Availability

    found = [p for p in problems if p]
    return Availability.missing("; ".join(found), remedy) if found else Availability.ok()
