"""Operations: prims and the torch-level symbols that decompose into them.

Importing this package registers every torch-level symbol in the table that capture
consults (``thunder_core.ops.registry``).
"""

from thunder_core.ops import (  # noqa: F401  (imported to register their symbols)
    composite,
    conversions,
    creation,
    effects,
    elementwise,
    indexing,
    leaves,
    nn,
    prims,
    reductions,
    shapes,
)
from thunder_core.ops._helpers import new_proxy
from thunder_core.ops.registry import TORCH_SYMBOLS, register_torch_op, torch_path

__all__ = ["TORCH_SYMBOLS", "new_proxy", "prims", "register_torch_op", "torch_path"]
