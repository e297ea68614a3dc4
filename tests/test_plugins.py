"""The plugin system, tested with real packages pip-installed into this environment."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest
import torch
from plugin_packages import install_all, uninstall_all

import thunder_core
from thunder_core import ConfigError, PluginError
from thunder_core.executors import selection
from thunder_core.plugins.manager import plugin_manager, reset_plugin_manager

ENV = ("THUNDER_CORE_EXECUTORS", "THUNDER_CORE_PLUGINS", "THUNDER_CORE_DISABLE", "THUNDER_CORE_NO_AUTOLOAD",
       "THUNDER_CORE_CONFIG", "THUNDER_CORE_STRICT")  # fmt: skip


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    distributions = install_all(tmp_path_factory.mktemp("plugin_packages"))
    reset_plugin_manager()
    yield distributions
    uninstall_all(distributions)
    reset_plugin_manager()


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path, installed):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # no pyproject.toml with a [tool.thunder-core] table here
    yield


def _cli_rows() -> dict:
    """``python -m thunder_core plugins --json``, run for real, by plugin name."""
    done = subprocess.run(
        [sys.executable, "-m", "thunder_core", "plugins", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {row["name"]: row for row in json.loads(done.stdout)}


def add(a, b):
    return a + b


def _eager_ok(jfn):
    a, b = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(jfn(a, b), a + b)


EXPECTED = {
    "goodex": ("available", ""),
    "ruleex": ("available", ""),
    "goodfuse": ("available", ""),
    "claima": ("available", ""),
    "claimb": ("available", ""),
    "failcompile": ("available", ""),
    "failrun": ("available", ""),
    "failpass": ("available", ""),
    "failop": ("available", ""),
    "failrandom": ("available", ""),
    "optex": ("available", ""),
    "goodplugin": ("available", ""),
    "weightscale": ("available", ""),
    "pluginexec": ("available", ""),
    "failtransform": ("available", ""),
    "lateprobe": ("unavailable", "the late resource is not ready"),
    "brokenimport": ("broken", "ModuleNotFoundError at import: No module named 'not_a_real_dependency_xyz'"),
    "raisesregister": ("broken", "RuntimeError at register: cannot initialize the device context"),
    "unavailable": ("unavailable", "no FancyAccelerator device found"),
    "incompatible": ("incompatible", "built for thunder-core>=99, but this is thunder-core"),
    "stale": ("stale", "its entry point names module 'tc_stale_old', which no longer exists"),
    "misspelled": ("broken", "defines thunder_core_prob(), which is not a thunder_core hook (misspelled?)"),
    "mistyped": ("broken", "invalid hook"),
}


def test_every_package_gets_its_status_and_reason_from_the_api():
    manager = plugin_manager()
    for name, (status, reason) in EXPECTED.items():
        info = manager.load(manager.plugins[name])
        assert info.status == status, (name, info.explanation())
        assert reason in info.reason, (name, info.reason)
        assert info.distribution.startswith("tc-") and info.version == "1.2.3"
    assert "registr" in manager.plugins["mistyped"].reason
    assert manager.plugins["unavailable"].remedy == "run on a machine with a FancyAccelerator"


def test_the_cli_reports_the_same_statuses():
    rows = _cli_rows()
    for name, (status, reason) in EXPECTED.items():
        assert rows[name]["status"] == status and reason in rows[name]["reason"], rows[name]
        assert rows[name]["distribution"].startswith("tc-")
    table = subprocess.run(["thunder-core", "plugins"], capture_output=True, text=True, check=True).stdout
    assert "tc-unavailable" in table and "no FancyAccelerator device found" in table
    assert "run on a machine with a FancyAccelerator" in table


def test_working_executor_claims_add_in_the_trace_and_in_explain():
    module = importlib.import_module("tc_goodex")
    jfn = thunder_core.jit(add, executors=["goodex"])
    before = len(module.CALLS)
    _eager_ok(jfn)
    assert len(module.CALLS) == before + 1  # goodex's kernel really ran
    assert "goodex_add(a, b)" in thunder_core.last_traces(jfn)[-1].python()
    (report,) = thunder_core.explain(jfn).for_symbol("torch.add")
    assert report.executor == "goodex"


class _AttentionBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.proj = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)

    def forward(self, x):
        q, k, v = self.qkv(x).view(2, 8, 3, 2, 8).permute(2, 0, 3, 1, 4)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(2, 8, 16))


@pytest.mark.parametrize("where", ["inside a model", "returned"])
def test_an_executors_own_gradient_rule_carries_the_gradient_through_its_symbols(where):
    # The rule records the executor's forward and backward symbols, whose hand-written metas make
    # proxies with new_tensor_proxy's default requires_grad=False: the gradient must still flow
    # through them to everything before the attention (once it did not: the weights before it got
    # no gradient and a returned output had no grad_fn, without an error).
    module = importlib.import_module("tc_ruleex")
    torch.manual_seed(0)
    module.CALLS.clear()
    if where == "returned":
        q, k, v = (torch.randn(2, 4, 8, 8, requires_grad=True) for _ in range(3))
        attention = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
        out = thunder_core.jit(attention, executors=["ruleex"])(q, k, v)
        g = torch.randn_like(out)
        actual = torch.autograd.grad(out, (q, k, v), g)
        expected = torch.autograd.grad(attention(q, k, v), (q, k, v), g)
    else:
        block, x = _AttentionBlock(), torch.randn(2, 8, 16)
        thunder_core.jit(block, executors=["ruleex"])(x).square().sum().backward()
        actual = [p.grad for p in block.parameters()]
        block.zero_grad()
        block(x).square().sum().backward()
        expected = [p.grad for p in block.parameters()]
    torch.testing.assert_close(actual, expected)
    assert "forward" in module.CALLS and "backward" in module.CALLS  # the executor's own kernels ran


def test_checker_rejection_reason_shows_in_explain():
    jfn = thunder_core.jit(add, executors=["goodex"])
    a = torch.randn(3, dtype=torch.float64)
    torch.testing.assert_close(jfn(a, a), a + a)
    (report,) = thunder_core.explain(jfn).for_symbol("torch.add")
    assert report.executor == "torch" and report.declined == {"goodex": "goodex only runs float32"}
    text = str(thunder_core.explain(jfn))
    assert "goodex: goodex only runs float32" in text


def test_broken_and_unavailable_plugins_do_not_break_jit_by_default():
    jfn = thunder_core.jit(add)  # every available executor, in default priority
    _eager_ok(jfn)
    not_used = thunder_core.explain(jfn).not_used
    assert not_used["brokenimport"].startswith("broken")
    assert not_used["unavailable"] == "unavailable: no FancyAccelerator device found"
    assert not_used["incompatible"].startswith("incompatible")
    assert not_used["stale"].startswith("stale")


@pytest.mark.parametrize(
    "name", ["brokenimport", "raisesregister", "unavailable", "incompatible", "stale", "misspelled"]
)
def test_asking_for_a_failing_plugin_by_name_raises_its_reason(name):
    with pytest.raises(PluginError) as info:
        thunder_core.jit(add, executors=[name])
    assert EXPECTED[name][1] in str(info.value)
    assert f"executor {name!r}" in str(info.value) and "tc-" in str(info.value)


def test_strict_mode_turns_every_problem_into_an_error(monkeypatch):
    monkeypatch.setenv("THUNDER_CORE_STRICT", "1")
    with pytest.raises(PluginError, match="THUNDER_CORE_STRICT"):
        thunder_core.jit(add, executors=["goodex"])


@pytest.mark.parametrize("autoload", [False, True], ids=["named elsewhere", "auto-loaded"])
def test_strict_mode_refuses_a_plugin_whose_register_hook_fails(monkeypatch, autoload):
    monkeypatch.setenv("THUNDER_CORE_STRICT", "1")
    others = [n for n, (status, _) in EXPECTED.items() if status != "available" and n != "raisesregister"]
    monkeypatch.setenv("THUNDER_CORE_DISABLE", ",".join(others))
    if autoload:
        monkeypatch.delenv("THUNDER_CORE_NO_AUTOLOAD", raising=False)
    with pytest.raises(PluginError, match="THUNDER_CORE_STRICT.*RuntimeError at register"):
        thunder_core.jit(add) if autoload else thunder_core.jit(add, executors=["goodex"])


def test_two_executors_claiming_the_same_op_config_file_decides(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.thunder-core]\nexecutors = ["claimb", "claima"]\n')
    jfn = thunder_core.jit(add)
    _eager_ok(jfn)
    (report,) = thunder_core.explain(jfn).for_symbol("torch.add")
    assert report.executor == "claimb"
    assert thunder_core.explain(jfn).executors == ["claimb", "claima", "torch"]


@pytest.mark.parametrize(
    "text",
    [
        '[tool."thunder-core"]\nexecutors = ["claimb"]\n',
        '[tool]\nthunder-core = { executors = ["claimb"] }\n',
        'tool.thunder-core.executors = ["claimb"]\n',
        "[tool . 'thunder-core' ]\nexecutors = ['claimb']\n",
        '[project]\nname = "app"\ndependencies = ["thunder-core>=0.1"]\n\n[tool.thunder-core]\nexecutors = ["claimb"]\n',
    ],
)
def test_every_toml_spelling_of_the_table_is_read(tmp_path, text):
    from thunder_core.plugins.config import find_config_file

    (tmp_path / "pyproject.toml").write_text(text)
    assert find_config_file(tmp_path) == (tmp_path / "pyproject.toml", {"executors": ["claimb"]})


def test_a_pyproject_that_only_depends_on_thunder_core_configures_nothing(tmp_path):
    from thunder_core.plugins.config import find_config_file

    (tmp_path / "pyproject.toml").write_text('[project]\nname = "app"\ndependencies = ["thunder-core"]\n')
    assert find_config_file(tmp_path) == (tmp_path / "pyproject.toml", {})
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "app"\nbroken = \n')  # not parsed at all
    assert find_config_file(tmp_path) == (tmp_path / "pyproject.toml", {})


def test_precedence_api_over_environment_over_config(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.thunder-core]\nexecutors = ["claimb", "claima"]\n')
    monkeypatch.setenv("THUNDER_CORE_EXECUTORS", "claima,claimb")
    env_job = thunder_core.jit(add)
    _eager_ok(env_job)
    assert thunder_core.explain(env_job).for_symbol("torch.add")[0].executor == "claima"
    api_job = thunder_core.jit(add, executors=["goodex", "claimb"])
    _eager_ok(api_job)
    assert thunder_core.explain(api_job).for_symbol("torch.add")[0].executor == "goodex"


def test_a_config_file_named_by_the_environment(tmp_path, monkeypatch):
    config = tmp_path / "job.toml"
    config.write_text('executors = ["claima"]\ndisable = ["goodfuse"]\n')
    monkeypatch.setenv("THUNDER_CORE_CONFIG", str(config))
    jfn = thunder_core.jit(add)
    _eager_ok(jfn)
    explanation = thunder_core.explain(jfn)
    assert explanation.executors == ["claima", "torch"]
    assert explanation.not_used["goodfuse"] == f"disabled by config file {config}"


def test_disable_from_environment_and_default_priority(monkeypatch):
    # Real executors of this repository may be installed too: leave only goodex to claim add.
    others = [n for n in plugin_manager().names("executor") if n not in ("goodex", "torch", "python")]
    monkeypatch.setenv("THUNDER_CORE_DISABLE", ",".join(others))
    jfn = thunder_core.jit(add)
    _eager_ok(jfn)
    explanation = thunder_core.explain(jfn)
    assert explanation.for_symbol("torch.add")[0].executor == "goodex"
    assert explanation.not_used["claima"] == "disabled by THUNDER_CORE_DISABLE"


def test_disabled_plugins_show_as_disabled_in_the_cli(monkeypatch):
    monkeypatch.setenv("THUNDER_CORE_DISABLE", "claimb")
    rows = _cli_rows()
    assert rows["claimb"]["status"] == "disabled"
    assert rows["claimb"]["reason"] == "disabled by THUNDER_CORE_DISABLE"


def test_the_torch_executor_can_be_disabled_by_name():
    jfn = thunder_core.jit(add, executors=["goodex"], disable=["torch"])
    _eager_ok(jfn)  # goodex claims the only op
    assert thunder_core.explain(jfn).executors == ["goodex"]
    with pytest.raises(
        thunder_core.ThunderCoreError, match=r"no executor takes torch.mul.*goodex: no implementation"
    ):
        thunder_core.jit(lambda a, b: a * b, executors=["goodex"], disable=["torch"])(
            torch.randn(2), torch.randn(2)
        )


def test_no_autoload_uses_only_the_core_executors(monkeypatch):
    monkeypatch.setenv("THUNDER_CORE_NO_AUTOLOAD", "1")
    jfn = thunder_core.jit(add)
    _eager_ok(jfn)
    assert thunder_core.explain(jfn).executors == ["torch"]


def test_unknown_names_and_keys_are_errors_that_list_the_known_ones(tmp_path):
    with pytest.raises(
        ConfigError, match=r"unknown executor 'nvfusr'; the installed executors are \[.*'goodex'"
    ):
        thunder_core.jit(add, executors=["nvfusr"])
    (tmp_path / "pyproject.toml").write_text('[tool.thunder-core]\nexecutor = ["goodex"]\n')
    with pytest.raises(ConfigError, match=r"(?s)unknown key\(s\) \[.executor.\].*executors: ordered list"):
        thunder_core.jit(add)


def test_fusion_executor_fuses_neighbours_and_compiles_each_region_once():
    module = importlib.import_module("tc_goodfuse")

    def chain(x, y):
        z = torch.exp(x + y) * 2
        return torch.nn.functional.gelu(z) + z  # gelu is not fusible: it splits the regions

    jfn = thunder_core.jit(chain, executors=["goodfuse"])
    x, y = torch.randn(5), torch.randn(5)
    before = len(module.COMPILED)
    for _ in range(3):
        torch.testing.assert_close(jfn(x, y), chain(x, y))
    assert module.COMPILED[before:] == [["add", "exp", "mul"]]  # compiled once; the lone add stays with torch
    final = thunder_core.last_traces(jfn)[-1].python()
    assert "goodfuse_fusion_" in final and "torch.nn.functional.gelu" in final


def test_transform_plugin_pass_runs_with_its_options():
    module = importlib.import_module("tc_goodplugin")
    jfn = thunder_core.jit(add, plugins=["goodplugin"], options={"goodplugin": {"tag": "job-7"}})
    _eager_ok(jfn)
    assert module.SEEN[-1] == ("job-7", 1)
    assert any(
        "goodplugin.count_ops (after_capture)" in str(t.provenance) for t in thunder_core.last_traces(jfn)
    )
    with pytest.raises(
        ConfigError, match=r"unknown option\(s\) \['tga'\] for 'goodplugin'; it declares \{'tag'"
    ):
        thunder_core.jit(add, plugins=["goodplugin"], options={"goodplugin": {"tga": "x"}})
    with pytest.raises(ConfigError, match="must be a str"):
        thunder_core.jit(add, plugins=["goodplugin"], options={"goodplugin": {"tag": 3}})


def test_a_module_transform_prepares_the_module_and_its_extension_shapes_the_trace():
    plugin = importlib.import_module("tc_weightscale")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    jm = thunder_core.jit(model, plugins=["weightscale"], options={"weightscale": {"factor": 3.0}})
    assert plugin.PREPARED[-1] == "Sequential" and len(jm.extensions) == 1
    x = torch.randn(5, 4)

    def scaled(m, x):  # eager: what the model computes with every weight times 3
        h = torch.tanh(torch.nn.functional.linear(x, 3 * m[0].weight, m[0].bias))
        return torch.nn.functional.linear(h, 3 * m[2].weight, m[2].bias)

    out = jm(x)
    torch.testing.assert_close(out, scaled(model, x))
    out.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    scaled(model, x).sum().backward()
    for got, expected in zip(grads, (p.grad for p in model.parameters())):
        torch.testing.assert_close(got, expected)  # the gradient reaches the original parameters

    with jm.no_sync():  # the extension's context changes its cache key: another entry
        torch.testing.assert_close(jm(x), model(x))
    torch.testing.assert_close(jm(x), scaled(model, x))
    info = thunder_core.cache_info(jm)
    assert info.entries == 2 and "weightscale: scaling -> paused" in info.reasons[1]


def test_an_executor_a_selected_plugin_registers_claims_first_with_the_plugins_options():
    plugin = importlib.import_module("tc_pluginexec")

    def f(a, b):
        return torch.mul(a, b) + 1

    a, b = torch.randn(4), torch.randn(4)
    jfn = thunder_core.jit(
        f, executors=["torch"], plugins=["pluginexec"], options={"pluginexec": {"scale": 2.0}}
    )
    torch.testing.assert_close(jfn(a, b), a * b + 1)
    assert plugin.CALLS == [2.0]  # it ran, configured with this job's options
    assert "pluginexec" in str(thunder_core.explain(jfn))
    plugin.CALLS.clear()
    torch.testing.assert_close(thunder_core.jit(f, executors=["torch"])(a, b), a * b + 1)
    assert not plugin.CALLS  # not selected: not used


def test_no_sync_without_a_synchronizing_plugin_changes_nothing():
    jm = thunder_core.jit(torch.nn.Linear(3, 3))
    x = torch.randn(2, 3)
    with jm.no_sync():
        torch.testing.assert_close(jm(x), jm._model(x))
    assert thunder_core.cache_info(jm).entries == 1


def test_a_failing_module_transform_is_an_error_naming_the_plugin():
    with pytest.raises(
        PluginError, match=r"module transform failtransform\.shard failed: RuntimeError: no process group"
    ):
        thunder_core.jit(torch.nn.Linear(2, 2), plugins=["failtransform"])
    _eager_ok(thunder_core.jit(add, plugins=["failtransform"]))  # a function has no module to transform


def test_the_torch_compile_front_end_refuses_plugins_that_change_the_module():
    model = torch.nn.Linear(3, 3)
    compiled = torch.compile(model, backend="thunder_core", options={"plugins": ["weightscale"]})
    with pytest.raises(Exception, match="change the module itself.*thunder_core.jit"):
        compiled(torch.randn(2, 3))


def test_an_unavailable_plugin_is_probed_again_when_a_job_asks_for_it(monkeypatch):
    with pytest.raises(PluginError, match="the late resource is not ready. To fix: set TC_LATE_READY"):
        thunder_core.jit(add, plugins=["lateprobe"])
    monkeypatch.setenv("TC_LATE_READY", "1")  # e.g. a process group initialized after import
    _eager_ok(thunder_core.jit(add, plugins=["lateprobe"]))
    assert plugin_manager().plugins["lateprobe"].status == "available"


def test_import_thunder_core_imports_no_plugin_module():
    # How long the import takes is measured by benchmarks/import_time.py, not asserted here.
    code = (
        "import sys, json; import torch; import thunder_core; "
        "print(json.dumps([m for m in sys.modules if m.startswith(('tc_', 'thunder_executor_', 'thunder_plugin_'))]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == []


def _mul_add(a, b):
    return a * b + b


@pytest.mark.parametrize(
    "name, when",
    [
        ("failcompile", "failed compiling a region"),
        ("failrun", "failed on its first run"),
        ("failpass", "failed in its fusion pass"),
        ("failop", "failed on its first run"),
    ],
)
def test_a_failing_executor_gives_its_work_back_to_torch(name, when):
    from thunder_core.executors import failures

    failures._warned.clear()  # each failure warns once per process
    module = importlib.import_module(f"tc_{name}")
    module.CALLS.clear()
    jfn = thunder_core.jit(_mul_add, executors=[name])
    a, b = torch.randn(4), torch.randn(4)
    with pytest.warns(RuntimeWarning, match=rf"executor '{name}' {when} \(.*torch.mul.*\)"):
        torch.testing.assert_close(jfn(a, b), a * b + b)
    torch.testing.assert_close(jfn(a, b), a * b + b)  # and later calls
    if name != "failpass":
        assert module.CALLS, "the executor was really asked"
    calls = len(module.CALLS)
    jfn(a, b)
    assert len(module.CALLS) == calls, "after a failure the executor is not called again"
    explanation = thunder_core.explain(jfn)
    assert f"{name} failed" in str(explanation)
    assert all(r.executor == "torch" for r in explanation.operations if r.executor != "(decomposed)")


@pytest.mark.parametrize("name", ["failcompile", "failrun", "failop"])
def test_strict_mode_makes_an_executor_failure_an_error(name, monkeypatch):
    from thunder_core.executors.failures import ExecutorFailure

    monkeypatch.setenv("THUNDER_CORE_STRICT", "1")
    broken = [n for n, (status, _) in EXPECTED.items() if status not in ("available",)]
    monkeypatch.setenv("THUNDER_CORE_DISABLE", ",".join(broken))  # strict mode also refuses broken plugins
    jfn = thunder_core.jit(_mul_add, executors=[name])
    with pytest.raises(ExecutorFailure, match=name):
        jfn(torch.randn(4), torch.randn(4))


def _noisy(x):
    return x + torch.randn_like(x)


def test_an_executor_failing_after_its_effect_is_an_error_not_a_second_run():
    """A failed first run of a random draw (or an in-place update) may already have applied its
    effect; running it again with torch would draw twice and move the stream off eager's."""
    from thunder_core.executors.failures import ExecutorFailure

    module = importlib.import_module("tc_failrandom")
    module.CALLS.clear()
    jfn = thunder_core.jit(_noisy, executors=["failrandom"])
    with pytest.raises(ExecutorFailure, match="may have applied part of that effect"):
        jfn(torch.zeros(3))
    assert module.CALLS == ["randn_like"]


def test_two_jobs_with_different_options_do_not_share_state():
    a, b = torch.randn(4), torch.randn(4)
    small = thunder_core.jit(_mul_add, executors=["goodfuse"], options={"goodfuse": {"min_region_size": 1}})
    large = thunder_core.jit(_mul_add, executors=["goodfuse"], options={"goodfuse": {"min_region_size": 5}})
    torch.testing.assert_close(small(a, b), a * b + b)
    torch.testing.assert_close(large(a, b), a * b + b)
    assert "goodfuse_fusion_1" in thunder_core.last_traces(small)[-1].python()
    assert "goodfuse_fusion" not in thunder_core.last_traces(large)[-1].python()
    assert "below goodfuse's min_region_size (5)" in str(thunder_core.explain(large))


def test_new_executor_template_installs_and_claims_add(tmp_path):
    done = subprocess.run(
        ["thunder-core", "new-executor", "tmplcheck", "--directory", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    package = tmp_path / "thunder-executor-tmplcheck"
    assert (package / "tests" / "test_conformance.py").is_file()
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", str(package)],
        check=True,
    )
    try:
        reset_plugin_manager()
        jfn = thunder_core.jit(add, executors=["tmplcheck"])
        _eager_ok(jfn)
        assert thunder_core.explain(jfn).for_symbol("torch.add")[0].executor == "tmplcheck"
        # the package's own tests pass as generated
        tests = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", str(package / "tests" / "test_executor.py")],
            capture_output=True,
            text=True,
        )
        assert tests.returncode == 0, tests.stdout[-2000:]
    finally:
        subprocess.run(
            [sys.executable, "-m", "pip", "uninstall", "-q", "-y", "thunder-executor-tmplcheck"], check=False
        )
        reset_plugin_manager()


def test_options_reach_an_operator_executor_per_job():
    module = importlib.import_module("tc_optex")
    module.CALLS.clear()
    a, b = torch.randn(3), torch.randn(3)
    first = thunder_core.jit(lambda x, y: x - y, executors=["optex"], options={"optex": {"tag": "first"}})
    second = thunder_core.jit(lambda x, y: x - y, executors=["optex"], options={"optex": {"tag": "second"}})
    torch.testing.assert_close(first(a, b), a - b)
    torch.testing.assert_close(second(a, b), a - b)
    torch.testing.assert_close(first(a, b), a - b)
    assert module.CALLS == ["first", "second", "first"]


def test_attention_stays_whole_when_a_fusion_executor_claims_part_of_its_decomposition():
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))

    def attention(q, k, v):
        return (torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) * 2).exp()

    jfn = thunder_core.jit(attention, executors=["goodfuse"])
    torch.testing.assert_close(jfn(q, k, v), attention(q, k, v))
    (report,) = thunder_core.explain(jfn).for_symbol("torch.nn.functional.scaled_dot_product_attention")
    assert report.executor == "torch"  # eager's fused kernel, not a materialized matmul-softmax
    assert "goodfuse" in {r.executor for r in thunder_core.explain(jfn).operations}


def _exp_chain(a, b):
    return torch.exp(a * b + b).neg() * a


def test_a_slow_executor_loses_its_regions_to_a_faster_one_when_measured(monkeypatch):
    """slowfuse claims first (claim order) but runs 3 ms slower: measured (the default), goodfuse
    wins the region, the generated code calls goodfuse's from then on, explain shows the timings."""
    monkeypatch.delenv("THUNDER_CORE_SELECT", raising=False)  # the test suite's own setting
    slow = importlib.import_module("tc_slowfuse")
    good = importlib.import_module("tc_goodfuse")
    slow.RUNS.clear()
    good.COMPILED.clear()
    jfn = thunder_core.jit(_exp_chain, executors=["slowfuse", "goodfuse"])
    a, b = torch.randn(8), torch.randn(8)
    torch.testing.assert_close(jfn(a, b), _exp_chain(a, b))
    assert slow.RUNS, "slowfuse's region was never timed"
    assert good.COMPILED == [["mul", "add", "exp", "neg", "mul"]], good.COMPILED
    runs_after_first_call = len(slow.RUNS)
    for _ in range(3):
        torch.testing.assert_close(jfn(a, b), _exp_chain(a, b))
    assert len(slow.RUNS) == runs_after_first_call, "the slower executor still runs after the choice"
    report = thunder_core.explain(jfn).for_symbol("torch.exp")[0]
    # goodfuse's region and torch run the same Python: either may be the faster, never slowfuse
    assert report.executor in ("goodfuse", "torch"), report
    assert report.declined["slowfuse"] == f"claimed it, but {report.executor} ran faster"
    assert "measured slowfuse" in report.note and "goodfuse" in report.note, report.note
    assert f"{report.executor} kept" in report.note, report.note


def test_the_claimant_keeps_a_claim_that_another_candidate_beats_by_less_than_the_margin():
    """A gap within SWITCH_MARGIN is noise to a few timed rounds, and switching executors for it
    can cost a new process more than it saves: the claim as made stays."""
    near = 1 - selection.SWITCH_MARGIN / 2
    far = 1 - selection.SWITCH_MARGIN * 2
    assert selection._fastest({"inductor": 1.0, "numba": near, "torch": 1.5}, "inductor") == "inductor"
    assert selection._fastest({"inductor": 1.0, "numba": far, "torch": 1.5}, "inductor") == "numba"
    assert selection._fastest({"inductor": 1.0, "torch": 0.5}, "inductor") == "torch"
    # the claimant failed its first run: the fastest of the rest
    assert selection._fastest({"numba": 1.0, "torch": 0.99}, "inductor") == "torch"
    kept = selection.Selection("inductor", {"inductor": 1e-3, "numba": near * 1e-3}, {})
    assert str(kept).endswith("inductor kept (the claimant; numba was faster by less than 10%)"), str(kept)


def _three_layers(x, w):
    x = x @ w  # each region between two matmuls
    for _ in range(3):
        x = _exp_chain(x, x) @ w  # the matmul, claimed by neither, separates the regions
    return x


def test_identical_claims_are_measured_once_per_process(monkeypatch):
    """Three layers make three identical regions: the first is measured, the other two take its
    winner without timing slowfuse again, and explain says where their timings come from."""
    monkeypatch.delenv("THUNDER_CORE_SELECT", raising=False)
    slow = importlib.import_module("tc_slowfuse")
    slow.RUNS.clear()
    x, w = torch.randn(5, 7) * 0.1, torch.randn(7, 7) * 0.1  # shapes no other test measures
    jfn = thunder_core.jit(_three_layers, executors=["slowfuse", "goodfuse"])
    torch.testing.assert_close(jfn(x, w), _three_layers(x, w))
    reports = thunder_core.explain(jfn).for_symbol("torch.exp")
    assert len(reports) == 3 and all(r.executor in ("goodfuse", "torch") for r in reports), reports
    assert ["identical claim earlier" in r.note for r in reports] == [False, True, True], reports
    assert 0 < len(slow.RUNS) <= 1 + selection.MAX_ROUNDS, slow.RUNS  # one region's warm-up and rounds
    runs = len(slow.RUNS)
    again = thunder_core.jit(_three_layers, executors=["slowfuse", "goodfuse"], dynamic=False)
    torch.testing.assert_close(again(x, w), _three_layers(x, w))
    assert len(slow.RUNS) == runs  # a second job in the process: nothing measured again
    for _ in range(
        2
    ):  # a recompile with fixed sizes: its regions compile, and are measured, at its second call
        torch.testing.assert_close(again(x[:4], w), _three_layers(x[:4], w))
    assert len(slow.RUNS) > runs  # other shapes: measured afresh


def test_a_claim_torch_won_before_goes_into_the_next_program_as_torch_calls(monkeypatch):
    """Once torch has beaten a claim, an identical claim of a later program (another entry of a
    decoding loop, another job) is compiled as the torch calls themselves: no region callable
    around them, slowfuse not run, and explain says why."""
    monkeypatch.delenv("THUNDER_CORE_SELECT", raising=False)
    slow = importlib.import_module("tc_slowfuse")
    slow.RUNS.clear()
    a, b = torch.randn(6, 3), torch.randn(6, 3)  # shapes no other test measures
    big = torch.randn(64, 64)  # a matmul sets the program's peak: torch's intermediates fit below it

    def beside_a_matmul(a, b, big):
        total = (big @ big).sum()
        return _exp_chain(a, b) + total

    first = thunder_core.jit(beside_a_matmul, executors=["slowfuse"])
    torch.testing.assert_close(first(a, b, big), beside_a_matmul(a, b, big))
    assert "slowfuse_fusion" in thunder_core.last_traces(first)[-1].python()  # measured through its region
    assert thunder_core.explain(first).for_symbol("torch.exp")[0].executor == "torch"
    runs = len(slow.RUNS)
    second = thunder_core.jit(beside_a_matmul, executors=["slowfuse"])
    for _ in range(2):
        torch.testing.assert_close(second(a, b, big), beside_a_matmul(a, b, big))
    program = thunder_core.last_traces(second)[-1].python()
    assert "slowfuse_fusion" not in program and "torch.exp(" in program, program
    assert len(slow.RUNS) == runs  # neither measured nor run again
    report = thunder_core.explain(second).for_symbol("torch.exp")[0]
    assert report.executor == "torch" and report.declined["slowfuse"] == "claimed it, but torch ran faster"
    assert "identical claim earlier" in report.note, report.note


def test_an_operator_claim_torch_won_before_goes_into_the_next_program_whole(monkeypatch):
    """An operator executor's claim keeps the operation's decomposition beside it; given to torch
    it runs as torch's own operation, not as those parts."""
    monkeypatch.delenv("THUNDER_CORE_SELECT", raising=False)
    monkeypatch.setattr(
        selection, "_fastest", lambda seconds, claimed: "torch"
    )  # torch wins each measurement
    goodex = importlib.import_module("tc_goodex")
    a, b = torch.randn(3, 11), torch.randn(3, 11)  # shapes no other test measures

    def add_twice(x, y):
        return torch.add(x, y) * 2

    first = thunder_core.jit(add_twice, executors=["goodex"])
    torch.testing.assert_close(first(a, b), add_twice(a, b))
    goodex.CALLS.clear()
    second = thunder_core.jit(add_twice, executors=["goodex"])
    torch.testing.assert_close(second(a, b), add_twice(a, b))
    code = [line.strip() for line in _program_lines(second)]
    assert any("= torch.add(" in line for line in code) and not any("prims." in line for line in code), code
    assert goodex.CALLS == []
    assert thunder_core.explain(second).for_symbol("torch.add")[0].executor == "torch"


def _program_lines(jfn) -> list[str]:
    """The generated program's statements, without the comments that show decompositions."""
    lines = thunder_core.last_traces(jfn)[-1].python().splitlines()
    return [line for line in lines if line.startswith("  ") and not line.strip().startswith("#")]


def test_priority_keeps_the_claim_order_without_measuring(monkeypatch):
    slow = importlib.import_module("tc_slowfuse")
    good = importlib.import_module("tc_goodfuse")
    a, b = torch.randn(8), torch.randn(8)
    for how in ("argument", "environment"):
        slow.RUNS.clear()
        good.COMPILED.clear()
        if how == "argument":
            jfn = thunder_core.jit(_exp_chain, executors=["slowfuse", "goodfuse"], select="priority")
        else:
            monkeypatch.setenv("THUNDER_CORE_SELECT", "priority")
            jfn = thunder_core.jit(_exp_chain, executors=["slowfuse", "goodfuse"])
        for calls in range(1, 4):
            torch.testing.assert_close(jfn(a, b), _exp_chain(a, b))
            assert slow.RUNS == [5] * calls, (how, slow.RUNS)
        assert good.COMPILED == []
        report = thunder_core.explain(jfn).for_symbol("torch.exp")[0]
        assert report.executor == "slowfuse" and "measured" not in report.note


def test_a_candidate_that_fails_drops_out_of_the_measurement():
    """failrun's region raises on its first run: measured, the others run it, and explain says why."""
    jfn = thunder_core.jit(_mul_add, executors=["failrun", "goodfuse"], select="measure")
    a, b = torch.randn(4), torch.randn(4)
    with pytest.warns(RuntimeWarning, match="failrun"):
        torch.testing.assert_close(jfn(a, b), a * b + b)
    torch.testing.assert_close(jfn(a, b), a * b + b)
    report = thunder_core.explain(jfn).for_symbol("torch.mul")[0]
    assert report.executor in ("goodfuse", "torch") and "kernel launch failed" in report.declined["failrun"]


def test_select_is_checked_and_reaches_the_torch_compile_front_end(monkeypatch):
    with pytest.raises(ConfigError, match=r"select must be one of \['measure', 'priority'\]"):
        thunder_core.jit(add, select="fastest")
    monkeypatch.setenv("THUNDER_CORE_SELECT", "sometimes")
    with pytest.raises(ConfigError, match="THUNDER_CORE_SELECT: select must be one of"):
        thunder_core.jit(add)
    monkeypatch.delenv("THUNDER_CORE_SELECT")
    slow = importlib.import_module("tc_slowfuse")
    slow.RUNS.clear()
    compiled = torch.compile(
        _exp_chain,
        backend="thunder_core",
        options={"executors": ["slowfuse", "goodfuse"], "select": "priority"},
    )
    a, b = torch.randn(8), torch.randn(8)
    for _ in range(2):
        torch.testing.assert_close(compiled(a, b), _exp_chain(a, b))
    assert slow.RUNS == [5, 5]


def test_an_operator_executor_is_measured_against_torch_with_the_call_as_written():
    """goodex's add (an operator executor's implementation), called with a keyword argument,
    timed against torch's add: either may win; the result is eager's and explain shows both."""
    module = importlib.import_module("tc_goodex")

    def add_scaled(a, b):
        return torch.add(a, b, alpha=2.0)

    jfn = thunder_core.jit(add_scaled, executors=["goodex"], select="measure")
    a, b = torch.randn(4), torch.randn(4)
    before = len(module.CALLS)
    for _ in range(3):
        torch.testing.assert_close(jfn(a, b), a + 2.0 * b)
    assert len(module.CALLS) > before  # goodex's kernel ran while being measured
    report = thunder_core.explain(jfn).for_symbol("torch.add")[0]
    assert "measured goodex" in report.note and "torch" in report.note, report.note
    assert report.executor in ("goodex", "torch")
