"""Throwaway plugin packages, written to a folder and pip-installed for real by the plugin tests."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

GOOD_EXECUTOR = """
import torch
from thunder_core.plugins import Availability, hookimpl

CALLS = []


@hookimpl
def thunder_core_probe():
    return Availability.ok()


@hookimpl
def thunder_core_register_executor(register):
    from thunder_core import OperatorExecutor, Rejection

    executor = OperatorExecutor("goodex")

    def add(a, b, *, alpha=None):
        CALLS.append("add")
        return torch.add(a, b) if alpha is None else torch.add(a, b, alpha=alpha)

    def float32_only(a, b, *, alpha=None):
        tensors = [x for x in (a, b) if isinstance(x, torch.Tensor)]
        if all(t.dtype == torch.float32 for t in tensors):
            return True
        return Rejection("goodex only runs float32")

    executor.register_implementation(torch.add, add, checker=float32_only)
    register(executor)
"""

# An executor with its own gradient rule, built the way GPU attention executors are: the rule
# records a forward symbol and a backward symbol of the executor, whose metas make new proxies.
RULE_EXECUTOR = """
import math

import torch
from thunder_core.plugins import Availability, hookimpl

CALLS = []


def _forward(q, k, v, scale, causal):
    CALLS.append("forward")
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    return out, torch.zeros(q.shape[:-1] + (1,), dtype=torch.float32)  # "statistics" for the backward


def _backward(grad, q, k, v, out, stats, scale, causal):
    CALLS.append("backward")
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    with torch.enable_grad():
        again = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    return torch.autograd.grad(again, (q, k, v), grad)


@hookimpl
def thunder_core_probe():
    return Availability.ok()


@hookimpl
def thunder_core_register_executor(register):
    from thunder_core.extend import OperatorExecutor, Symbol, get_symbol, new_tensor_proxy

    def forward_meta(q, k, v, scale, causal):
        return new_tensor_proxy(q.shape, q.dtype, q.device), new_tensor_proxy(q.shape[:-1] + (1,), torch.float32, q.device)

    def backward_meta(grad, q, k, v, out, stats, scale, causal):
        return tuple(new_tensor_proxy(x.shape, x.dtype, x.device) for x in (q, k, v))

    forward = Symbol("ruleex_forward", _forward, "ruleex_forward", meta=forward_meta)
    backward = Symbol("ruleex_backward", _backward, "ruleex_backward", meta=backward_meta)

    def inference(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        return _forward(q, k, v, scale, is_causal)[0]

    def vjp(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
        out, stats = forward(q, k, v, scale, is_causal)

        def pullback(g):
            return list(zip((q, k, v), backward(g, q, k, v, out, stats, scale, is_causal)))

        return out, pullback

    def plain_call(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        return attn_mask is None and dropout_p == 0.0 and not enable_gqa

    executor = OperatorExecutor("ruleex")
    executor.register_implementation(
        get_symbol("scaled_dot_product_attention"), inference, checker=plain_call, grad=vjp
    )
    executor.register_implementation(forward, _forward)
    executor.register_implementation(backward, _backward)
    register(executor)
"""

GOOD_FUSION = """
from thunder_core.plugins import hookimpl

COMPILED = []


@hookimpl
def thunder_core_declare_options(declare):
    declare("min_region_size", int, 2, "fewest operations worth a region")


@hookimpl
def thunder_core_register_executor(register):
    from thunder_core import FusionExecutor

    class PythonFusion(FusionExecutor):
        def compile_region(self, region):
            COMPILED.append([b.symbol.name for b in region.bound_symbols])
            return region.as_trace(f"goodfuse_region_{len(COMPILED)}").python_callable()

    executor = PythonFusion("goodfuse")
    for name in ("add", "mul", "exp", "neg"):
        executor.register_supported(name)
    register(executor)
"""


def _failing_fusion(name: str, where: str) -> str:
    """A fusion executor of add/mul that raises while compiling, on the first run, or in its pass."""
    return f'''
from thunder_core.plugins import hookimpl

CALLS = []


@hookimpl
def thunder_core_register_executor(register):
    from thunder_core import FusionExecutor

    class Failing(FusionExecutor):
        def compile_region(self, region):
            CALLS.append("compile")
            if "{where}" == "compile":
                raise RuntimeError("nvrtc: out of registers")

            def run(*args):
                CALLS.append("run")
                raise ValueError("kernel launch failed")

            return run

        def fusion_pass(self, trace, options=None):
            if "{where}" == "pass":
                raise KeyError("unexpected symbol")
            return super().fusion_pass(trace, options)

    executor = Failing("{name}")
    for op in ("add", "mul"):
        executor.register_supported(op)
    register(executor)
'''


FAILING_OPERATOR = """
import torch
from thunder_core.plugins import hookimpl

CALLS = []


@hookimpl
def thunder_core_register_executor(register):
    from thunder_core import OperatorExecutor

    executor = OperatorExecutor("failop")

    def mul(a, b):
        CALLS.append("mul")
        raise RuntimeError("illegal memory access")

    executor.register_implementation("mul", mul)
    register(executor)
"""

FAILING_RANDOM_OPERATOR = """
import torch
from thunder_core.plugins import hookimpl

CALLS = []


@hookimpl
def thunder_core_register_executor(register):
    from thunder_core import OperatorExecutor

    executor = OperatorExecutor("failrandom")

    def randn_like(x, **kwargs):
        CALLS.append("randn_like")
        torch.randn_like(x, **kwargs)  # the draw happened: the generator moved on
        raise RuntimeError("kernel launch failed after drawing")

    executor.register_implementation(torch.randn_like, randn_like)
    register(executor)
"""


OPTIONED_EXECUTOR = """
import torch
from thunder_core.plugins import hookimpl

CALLS = []


@hookimpl
def thunder_core_declare_options(declare):
    declare("tag", str, "default", "recorded by every call")


@hookimpl
def thunder_core_register_executor(register):
    from thunder_core.extend import OperatorExecutor, get_symbol

    class Tagged(OperatorExecutor):
        def __init__(self, tag="default"):
            super().__init__("optex")
            self.tag = tag

            def sub(a, b, *, alpha=None):
                CALLS.append(self.tag)
                return torch.sub(a, b) if alpha is None else torch.sub(a, b, alpha=alpha)

            self.register_implementation(get_symbol("sub"), sub)

        def with_options(self, options):
            return Tagged(options["tag"])

    register(Tagged())
"""


def _claiming(name: str) -> str:
    return f'''
import torch
from thunder_core.plugins import hookimpl

CALLS = []


@hookimpl
def thunder_core_register_executor(register):
    from thunder_core import OperatorExecutor

    executor = OperatorExecutor("{name}")

    def add(a, b, *, alpha=None):
        CALLS.append("{name}")
        return torch.add(a, b) if alpha is None else torch.add(a, b, alpha=alpha)

    executor.register_implementation("add", add)
    register(executor)
'''


# (distribution, group, entry point name, entry point value, {module path: source}, extra requirements)
MODULE_PLUGIN = """
import torch
from thunder_core.extend import ModuleExtension
from thunder_core.plugins import hookimpl

PREPARED = []


class Scaled(ModuleExtension):
    name = "weightscale"

    def __init__(self, factor):
        self.factor = factor
        self.paused = False

    def bind(self, names, proxies):
        if self.paused:
            return proxies
        return [p * self.factor if n.endswith("weight") else p for n, p in zip(names, proxies)]

    def cache_key(self):
        return self.paused

    def describe(self):
        return {"weightscale": "paused" if self.paused else "scaling"}

    def no_sync(self):
        extension = self

        class Paused:
            def __enter__(self):
                extension.paused = True

            def __exit__(self, *exc):
                extension.paused = False

        return Paused()


@hookimpl
def thunder_core_declare_options(declare):
    declare("factor", float, 2.0, "what every weight is multiplied by")


@hookimpl
def thunder_core_register_module_transform(register):
    def prepare(module, options):
        PREPARED.append(type(module).__name__)
        return Scaled(options["factor"])

    register(prepare, name="scale")
"""

PLUGIN_EXECUTOR = """
import torch
from thunder_core.plugins import hookimpl

CALLS = []


@hookimpl
def thunder_core_declare_options(declare):
    declare("scale", float, 1.0, "what the plugin's mul multiplies its result by")


@hookimpl
def thunder_core_register_executor(register):
    from thunder_core import OperatorExecutor

    class Scaling(OperatorExecutor):
        def with_options(self, options):
            executor = Scaling(f"pluginexec")
            scale = options["scale"]

            def mul(a, b):
                CALLS.append(scale)
                return torch.mul(a, b)

            executor.register_implementation(torch.mul, mul)
            return executor

    register(Scaling("pluginexec"))
"""

SLOW_FUSION = """
import time

from thunder_core.plugins import hookimpl

RUNS = []


@hookimpl
def thunder_core_register_executor(register):
    from thunder_core import FusionExecutor

    class SlowFusion(FusionExecutor):
        \"\"\"Claims what goodfuse claims, and more, and computes it right, but slowly.\"\"\"

        def compile_region(self, region):
            run_region = region.as_trace("slowfuse_region").python_callable()

            def run(*args):
                RUNS.append(len(region.bound_symbols))
                time.sleep(0.003)
                return run_region(*args)

            return run

    executor = SlowFusion("slowfuse")
    for name in ("add", "mul", "exp", "neg", "sin"):
        executor.register_supported(name)
    register(executor)
"""

LATE_PROBE = """
import os
from thunder_core.plugins import Availability, hookimpl


@hookimpl
def thunder_core_probe():
    if os.environ.get("TC_LATE_READY"):
        return Availability.ok()
    return Availability.missing("the late resource is not ready", "set TC_LATE_READY")
"""

PACKAGES = [
    ("tc-goodex", "executors", "goodex", "tc_goodex", {"tc_goodex/__init__.py": GOOD_EXECUTOR}, []),
    ("tc-ruleex", "executors", "ruleex", "tc_ruleex", {"tc_ruleex/__init__.py": RULE_EXECUTOR}, []),
    ("tc-goodfuse", "executors", "goodfuse", "tc_goodfuse", {"tc_goodfuse/__init__.py": GOOD_FUSION}, []),
    ("tc-slowfuse", "executors", "slowfuse", "tc_slowfuse", {"tc_slowfuse/__init__.py": SLOW_FUSION}, []),
    (
        "tc-broken-import",
        "executors",
        "brokenimport",
        "tc_broken_import",
        {"tc_broken_import/__init__.py": "import not_a_real_dependency_xyz\n"},
        [],
    ),
    (
        "tc-raises-register",
        "executors",
        "raisesregister",
        "tc_raises_register",
        {
            "tc_raises_register/__init__.py": (
                "from thunder_core.plugins import hookimpl\n\n@hookimpl\n"
                "def thunder_core_register_executor(register):\n"
                "    raise RuntimeError('cannot initialize the device context')\n"
            )
        },
        [],
    ),
    (
        "tc-unavailable",
        "executors",
        "unavailable",
        "tc_unavailable",
        {
            "tc_unavailable/__init__.py": (
                "from thunder_core.plugins import Availability, hookimpl\n\n@hookimpl\n"
                "def thunder_core_probe():\n"
                "    return Availability.missing('no FancyAccelerator device found', "
                "'run on a machine with a FancyAccelerator')\n\n"
                "@hookimpl\ndef thunder_core_register_executor(register):\n"
                "    raise AssertionError('register must not run when unavailable')\n"
            )
        },
        [],
    ),
    (
        "tc-incompatible",
        "executors",
        "incompatible",
        "tc_incompatible",
        {
            "tc_incompatible/__init__.py": "raise AssertionError('an incompatible plugin must not be imported')\n"
        },
        ["thunder-core>=99"],
    ),
    (
        "tc-failcompile",
        "executors",
        "failcompile",
        "tc_failcompile",
        {"tc_failcompile/__init__.py": _failing_fusion("failcompile", "compile")},
        [],
    ),
    (
        "tc-failrun",
        "executors",
        "failrun",
        "tc_failrun",
        {"tc_failrun/__init__.py": _failing_fusion("failrun", "run")},
        [],
    ),
    (
        "tc-failpass",
        "executors",
        "failpass",
        "tc_failpass",
        {"tc_failpass/__init__.py": _failing_fusion("failpass", "pass")},
        [],
    ),
    ("tc-failop", "executors", "failop", "tc_failop", {"tc_failop/__init__.py": FAILING_OPERATOR}, []),
    (
        "tc-failrandom",
        "executors",
        "failrandom",
        "tc_failrandom",
        {"tc_failrandom/__init__.py": FAILING_RANDOM_OPERATOR},
        [],
    ),
    ("tc-optex", "executors", "optex", "tc_optex", {"tc_optex/__init__.py": OPTIONED_EXECUTOR}, []),
    ("tc-claim-a", "executors", "claima", "tc_claim_a", {"tc_claim_a/__init__.py": _claiming("claima")}, []),
    ("tc-claim-b", "executors", "claimb", "tc_claim_b", {"tc_claim_b/__init__.py": _claiming("claimb")}, []),
    # The entry point still names the module's old name (as after a rename in an editable install).
    ("tc-stale", "executors", "stale", "tc_stale_old", {"tc_stale_new/__init__.py": "X = 1\n"}, []),
    (
        "tc-misspelled",
        "executors",
        "misspelled",
        "tc_misspelled",
        {
            "tc_misspelled/__init__.py": (
                "from thunder_core.plugins import Availability, hookimpl\n\n@hookimpl\n"
                "def thunder_core_prob():\n    return Availability.ok()\n"
            )
        },
        [],
    ),
    (
        "tc-mistyped",
        "executors",
        "mistyped",
        "tc_mistyped",
        {
            "tc_mistyped/__init__.py": (
                "from thunder_core.plugins import hookimpl\n\n@hookimpl\n"
                "def thunder_core_register_executor(registr):\n    pass\n"
            )
        },
        [],
    ),
    (
        "tc-weightscale",
        "plugins",
        "weightscale",
        "tc_weightscale",
        {"tc_weightscale/__init__.py": MODULE_PLUGIN},
        [],
    ),
    (
        "tc-pluginexec",
        "plugins",
        "pluginexec",
        "tc_pluginexec",
        {"tc_pluginexec/__init__.py": PLUGIN_EXECUTOR},
        [],
    ),
    ("tc-lateprobe", "plugins", "lateprobe", "tc_lateprobe", {"tc_lateprobe/__init__.py": LATE_PROBE}, []),
    (
        "tc-failtransform",
        "plugins",
        "failtransform",
        "tc_failtransform",
        {
            "tc_failtransform/__init__.py": (
                "from thunder_core.plugins import hookimpl\n\n@hookimpl\n"
                "def thunder_core_register_module_transform(register):\n"
                "    def shard(module, options):\n"
                "        raise RuntimeError('no process group to shard over')\n"
                "    register(shard, name='shard')\n"
            )
        },
        [],
    ),
    (
        "tc-goodplugin",
        "plugins",
        "goodplugin",
        "tc_goodplugin",
        {
            "tc_goodplugin/__init__.py": (
                "from thunder_core.plugins import hookimpl\n\nSEEN = []\n\n"
                "@hookimpl\ndef thunder_core_declare_options(declare):\n"
                "    declare('tag', str, 'hello', 'a label recorded by the pass')\n\n"
                "@hookimpl\ndef thunder_core_register_passes(register):\n"
                "    def count_ops(trace, options):\n"
                "        SEEN.append((options['tag'], len(trace.bound_symbols)))\n"
                "        return trace\n"
                "    register('after_capture', count_ops)\n"
            )
        },
        [],
    ),
]


def write_package(root: Path, distribution, group, ep_name, ep_value, files, requires) -> Path:
    folder = root / distribution
    packages = sorted({path.split("/")[0] for path in files})
    deps = ", ".join(f'"{r}"' for r in requires)
    (folder).mkdir(parents=True)
    (folder / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [build-system]
            requires = ["setuptools>=68"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "{distribution}"
            version = "1.2.3"
            dependencies = [{deps}]

            [project.entry-points."thunder_core.{group}"]
            {ep_name} = "{ep_value}"

            [tool.setuptools]
            packages = {packages!r}
            """
        ).replace("'", '"')
    )
    for path, source in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(source)
    return folder


def install_all(root: Path, packages: list | None = None) -> list[str]:
    """Install ``packages`` (specs like ``PACKAGES``', by default all of them) from ``root``."""
    packages = PACKAGES if packages is None else packages
    folders = [write_package(root, *spec) for spec in packages]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            *map(str, folders),
        ],
        check=True,
    )
    return [spec[0] for spec in packages]


def uninstall_all(distributions: list[str]) -> None:
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", *distributions], check=False)
