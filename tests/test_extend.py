"""The plugin API surface: versioned, deprecations warn, every public name resolves."""

from __future__ import annotations

import pytest

import thunder_core
from thunder_core import extend


def test_api_version_is_thunder_cores_major_minor():
    assert extend.API_VERSION == ".".join(thunder_core.__version__.split(".")[:2])


def test_every_public_name_resolves():
    missing = [name for name in extend.__all__ if not hasattr(extend, name)]
    assert not missing


def test_a_deprecated_name_warns_and_still_works():
    with pytest.warns(DeprecationWarning, match="use thunder_core.extend.autograd_fallback"):
        old = extend.fallback_rule
    assert old is extend.autograd_fallback
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        extend.not_a_name  # noqa: B018


def test_get_symbol_names_torch_level_ops_and_prims():
    import torch

    assert extend.get_symbol("add") is extend.symbol_for(torch.add)
    assert extend.get_symbol("prims.exp").is_prim
    with pytest.raises(KeyError, match="no thunder_core symbol named 'addd'"):
        extend.get_symbol("addd")
