"""The on-disk cache: captured traces and measured executor choices reused by later processes.

Whether an entry was used is asserted through ``cache_info(...).disk_hits`` and its reasons,
never through timing; every result is compared with eager PyTorch in the process that made it.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import threading
import warnings

import pytest
import torch
from models import hf_llama, litgpt_gpt, token_batch
from torch import nn

import thunder_core
from thunder_core.disk_cache import DiskCache
from thunder_core.jit.trace_data import trace_from_data, trace_to_data


@pytest.fixture(autouse=True)
def _traces_on_disk(monkeypatch):
    """Traces are stored only when asked for (``cache_traces``); these tests ask, through the
    environment, which the processes they start inherit."""
    monkeypatch.setenv("THUNDER_CORE_CACHE_TRACES", "1")


# A program a user would run twice: a small litgpt model, one training step, checked against eager.
TRAINING_SCRIPT = """
import copy, json, sys, torch, thunder_core
from litgpt.config import Config
from litgpt.model import GPT

config = Config(name="disk-cache-test", block_size=32, vocab_size=128, padded_vocab_size=128, n_layer=3,
                n_head=4, n_query_groups=4, n_embd=32, intermediate_size=64, bias=False,
                norm_class_name="RMSNorm", mlp_class_name="LLaMAMLP", rotary_percentage=1.0,
                parallel_residual=False)
torch.manual_seed(0)
model = GPT(config)
reference = copy.deepcopy(model)
idx = torch.randint(0, 128, (2, 17), generator=torch.Generator().manual_seed(0))
jitted = thunder_core.jit(model, select=sys.argv[1])
for m in (jitted, reference):
    logits = m(idx[:, :-1])
    torch.nn.functional.cross_entropy(logits.reshape(-1, 128), idx[:, 1:].reshape(-1)).backward()
torch.testing.assert_close(jitted(idx[:, :-1]), reference(idx[:, :-1]))
for (name, p), q in zip(model.named_parameters(), reference.parameters()):
    torch.testing.assert_close(p.grad, q.grad, msg=name)
info = thunder_core.cache_info(jitted)
print(json.dumps({"disk_hits": info.disk_hits, "reasons": info.reasons,
                  "explain": str(thunder_core.explain(jitted))}))
"""


def _run(script_path, *args, env=None) -> dict:
    done = subprocess.run(
        [sys.executable, str(script_path), *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _script(tmp_path, text: str, name: str = "program.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_a_trace_stored_by_one_process_is_used_by_the_next(tmp_path):
    script = _script(tmp_path, TRAINING_SCRIPT)
    first = _run(script, "priority")
    second = _run(script, "priority")
    assert first["disk_hits"] == 0 and first["reasons"] == ["first call"]
    assert second["disk_hits"] == 1
    assert second["reasons"] == ["first call; captured trace from the disk cache"]


def test_measured_executor_choices_are_taken_by_the_next_process(tmp_path):
    script = _script(tmp_path, TRAINING_SCRIPT)
    env = {"THUNDER_CORE_EXECUTORS": "inductor"}
    pytest.importorskip("thunder_executor_inductor", reason="the inductor executor package is not installed")
    first = _run(script, "measure", env=env)
    assert "measured" in first["explain"] and "earlier process" not in first["explain"]
    second = _run(script, "measure", env=env)
    assert second["disk_hits"] == 1
    assert "measured by an earlier process on this machine, from the disk cache" in second["explain"]


def test_an_edited_source_file_is_not_used(tmp_path):
    helper = _script(tmp_path, "import torch\n\ndef act(x):\n    return torch.sin(x)\n", "helper.py")
    script = _script(
        tmp_path,
        """
        import json, torch, thunder_core
        import helper

        def f(x):
            return helper.act(x) * 2

        x = torch.randn(8)
        jf = thunder_core.jit(f)
        torch.testing.assert_close(jf(x), f(x))
        info = thunder_core.cache_info(jf)
        print(json.dumps({"disk_hits": info.disk_hits, "reasons": info.reasons}))
        """,
    )
    assert _run(script)["disk_hits"] == 0
    assert _run(script)["disk_hits"] == 1
    # The jitted function, its key and the names it reads are the same: only the file tells.
    helper.write_text(helper.read_text().replace("torch.sin", "torch.cos"))
    edited = _run(script)
    assert edited["disk_hits"] == 0
    assert "stale" in edited["reasons"][0] and "the code of act (helper) changed" in edited["reasons"][0]


def test_a_changed_global_value_is_not_used(tmp_path):
    script = _script(
        tmp_path,
        """
        import json, os, torch, thunder_core

        SCALE = float(os.environ["SCALE"])

        def f(x):
            return x * SCALE if SCALE > 1 else x - SCALE

        x = torch.randn(8)
        jf = thunder_core.jit(f)
        torch.testing.assert_close(jf(x), f(x))
        info = thunder_core.cache_info(jf)
        print(json.dumps({"disk_hits": info.disk_hits, "reasons": info.reasons}))
        """,
    )
    assert _run(script, env={"SCALE": "3.0"})["disk_hits"] == 0
    assert _run(script, env={"SCALE": "3.0"})["disk_hits"] == 1
    changed = _run(script, env={"SCALE": "0.5"})
    assert changed["disk_hits"] == 0
    assert "global SCALE" in changed["reasons"][0]


class _Block(nn.Module):
    def __init__(self, width: int, scale: float):
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)
        self.scale = scale

    def forward(self, x):
        return x + self.scale * torch.relu(self.linear(self.norm(x)))


class _Stack(nn.Module):
    def __init__(self, scale: float = 0.5):
        super().__init__()
        self.layers = nn.ModuleList(_Block(16, scale) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x.sum(-1)


def _train_once(model, x):
    out = model(x)
    out.sum().backward()
    return out


def test_a_new_jit_of_an_equal_model_in_the_same_process_uses_the_entry():
    torch.manual_seed(0)
    x = torch.randn(4, 16, requires_grad=True)
    first = thunder_core.jit(_Stack())
    _train_once(first, x)
    model = _Stack()
    reference = _Stack()
    reference.load_state_dict(model.state_dict())
    second = thunder_core.jit(model)
    torch.testing.assert_close(_train_once(second, x), _train_once(reference, x))
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert thunder_core.cache_info(first).disk_hits == 0
    assert thunder_core.cache_info(second).disk_hits == 1


def test_a_module_attribute_that_differs_is_captured_again():
    x = torch.randn(4, 16)
    thunder_core.jit(_Stack(scale=0.5))(x)
    other = _Stack(scale=2.0)
    jitted = thunder_core.jit(other)
    torch.testing.assert_close(jitted(x), other(x))
    assert thunder_core.cache_info(jitted).disk_hits == 0


def _entries(kind: str = "traces") -> list:
    root = os.environ["THUNDER_CORE_CACHE_DIR"]
    folder = os.path.join(root, f"{kind}-v1")
    return sorted(os.path.join(folder, n) for n in os.listdir(folder)) if os.path.isdir(folder) else []


def test_a_damaged_entry_is_ignored_with_one_warning():
    def f(x):
        return torch.tanh(x) + 1

    x = torch.randn(5)
    thunder_core.jit(f)(x)
    (entry,) = _entries()
    with open(entry, "r+b") as file:  # one changed byte in the body
        data = bytearray(file.read())
        data[-10] ^= 0x01
        file.seek(0)
        file.write(data)
    for attempt in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            jf = thunder_core.jit(f)
            torch.testing.assert_close(jf(x), f(x))
        if attempt == 0:
            assert thunder_core.cache_info(jf).disk_hits == 0
            assert any("damaged or foreign compile cache entry" in str(w.message) for w in caught)
        else:  # replaced by the recompile: used, and nothing to warn about
            assert not any("compile cache" in str(w.message) for w in caught)
            assert thunder_core.cache_info(jf).disk_hits == 1


def test_concurrent_writers_leave_a_whole_entry(tmp_path):
    """Two processes store the same entry over and over while this one reads it: every read is
    one whole document (or none yet), never a mix."""
    writer = _script(
        tmp_path,
        f"""
        import sys
        from thunder_core.disk_cache import DiskCache
        cache = DiskCache.open({str(tmp_path / "shared")!r}, "traces")
        for i in range(200):
            cache.store("entry", {{"writer": sys.argv[1], "payload": [sys.argv[1]] * 20000}})
        print("{{}}")
        """,
        "writer.py",
    )
    processes = [
        subprocess.Popen([sys.executable, str(writer), name], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for name in ("a", "b")
    ]
    cache = DiskCache.open(str(tmp_path / "shared"), "traces")
    seen = set()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a damaged read would warn
        while any(p.poll() is None for p in processes):
            body = cache.load("entry")
            if body is not None:
                assert set(body["payload"]) == {body["writer"]}
                seen.add(body["writer"])
    for p in processes:
        assert p.wait() == 0, p.stderr.read().decode()[-2000:]
    assert cache.load("entry")["writer"] in ("a", "b")
    assert seen
    assert not [n for n in os.listdir(cache.directory) if n.startswith(".tmp-")]


def test_two_processes_compiling_at_once_leave_a_usable_cache(tmp_path):
    script = _script(tmp_path, TRAINING_SCRIPT)
    env = {**os.environ}
    processes = [
        subprocess.Popen(
            [sys.executable, str(script), "priority"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(2)
    ]
    for p in processes:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err.decode()[-3000:]
    assert _run(script, "priority")["disk_hits"] == 1


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_the_disk_cache_can_be_turned_off(how, monkeypatch):
    def f(x):
        return x.exp()

    directory = os.environ["THUNDER_CORE_CACHE_DIR"]  # this test's own, where entries would go
    thunder_core.jit(f)(torch.randn(3))  # stores an entry there
    assert len(_entries()) == 1
    if how == "environment":
        monkeypatch.setenv("THUNDER_CORE_CACHE_DIR", "off")
        jf = thunder_core.jit(f)
    else:
        jf = thunder_core.jit(f, cache_dir=None)
    jf(torch.randn(3))  # the entry is there, but not read
    assert thunder_core.cache_info(jf).disk_hits == 0
    assert len(os.listdir(os.path.join(directory, "traces-v1"))) == 1


def test_cache_dir_moves_the_cache(tmp_path):
    def f(x):
        return x.exp() * 3

    thunder_core.jit(f, cache_dir=tmp_path / "mine")(torch.randn(3))
    assert len(os.listdir(tmp_path / "mine" / "traces-v1")) == 1
    jf = thunder_core.jit(f, cache_dir=str(tmp_path / "mine"))
    jf(torch.randn(3))
    assert thunder_core.cache_info(jf).disk_hits == 1


def test_a_directory_others_can_write_is_refused_with_a_warning(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)

    def f(x):
        return x * 5

    with pytest.warns(UserWarning, match="can be written by other users"):
        jf = thunder_core.jit(f, cache_dir=shared)
        jf(torch.randn(3))
    torch.testing.assert_close(jf(torch.ones(3)), torch.full((3,), 5.0))
    assert not (shared / "traces-v1").exists() or not os.listdir(shared / "traces-v1")


def test_the_directory_is_created_private(tmp_path):
    thunder_core.jit(lambda x: x + 1, cache_dir=tmp_path / "new")(torch.randn(2))
    mode = stat.S_IMODE(os.stat(tmp_path / "new" / "traces-v1").st_mode)
    assert mode & 0o077 == 0


def test_a_program_reading_a_global_tensor_is_not_stored():
    table = torch.randn(4)

    def f(x):
        return x + table

    jf = thunder_core.jit(f)
    jf(torch.randn(4))
    assert _entries() == []
    assert "not stored in the disk cache" in str(thunder_core.explain(jf))
    table.add_(1)  # the live tensor is read on every call, from memory
    x = torch.randn(4)
    torch.testing.assert_close(thunder_core.jit(f)(x), x + table)


def test_a_program_in_exec_made_code_is_not_stored():
    namespace = {"torch": torch}
    exec("def g(x):\n    return x * 7\n", namespace)  # no source file to check it against
    jf = thunder_core.jit(namespace["g"])
    jf(torch.randn(3))
    assert _entries() == []


def test_the_torch_state_is_part_of_the_key():
    def f(x):
        return x @ x.T

    x = torch.randn(4, 4)
    thunder_core.jit(f)(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        jf = thunder_core.jit(f)
        out = jf(x)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out, f(x))
    assert thunder_core.cache_info(jf).disk_hits == 0


@pytest.mark.parametrize(
    "make",
    [
        lambda: (litgpt_gpt(n_layer=2), (token_batch(2, 16),)),
        lambda: (hf_llama(n_layer=2), (token_batch(2, 16),)),
        lambda: (
            nn.Sequential(
                nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 36, 4)
            ),
            (torch.randn(2, 3, 8, 8),),
        ),
        lambda: (
            nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0),
            (torch.randn(2, 5, 32),),
        ),
    ],
    ids=["litgpt", "hf_llama", "conv_bn", "transformer_encoder_layer"],
)
def test_stored_traces_print_as_the_captured_ones(make):
    """The independent check of the serialization: a trace rebuilt from its JSON prints exactly as
    the trace capture made (every symbol, argument, metadata and source line), and the model
    loaded from the disk cache gives eager's result."""
    torch.manual_seed(0)
    model, args = make()
    jitted = thunder_core.jit(model)
    jitted(*args)
    captured = jitted._forward.last_compiled().captured
    rebuilt = trace_from_data(json.loads(json.dumps(trace_to_data(captured))))
    rebuilt.provenance = captured.provenance
    assert rebuilt.python() == captured.python()
    again = thunder_core.jit(model)
    out, expected = again(*args), model(*args)
    # transformers imports inside functions (what such code reads is not recorded): not stored
    stored = not isinstance(model, tuple(_hf_classes()))
    assert thunder_core.cache_info(again).disk_hits == (1 if stored else 0)
    expected = getattr(expected, "logits", expected)
    torch.testing.assert_close(getattr(out, "logits", out), expected)


def test_threads_compiling_the_same_program_share_the_cache():
    def f(x):
        return torch.sigmoid(x) * 2

    x = torch.randn(16)
    results, errors = [], []

    def work():
        try:
            results.append(thunder_core.jit(f)(x))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for r in results:
        torch.testing.assert_close(r, f(x))


class _TwoMethods(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(6, 6)

    def forward(self, x):
        return torch.relu(self.linear(x))

    def other(self, x):
        return torch.sigmoid(self.linear(x))


def test_two_methods_of_one_module_are_two_programs():
    model = _TwoMethods()
    x = torch.randn(3, 6)
    thunder_core.jit(model.forward)(x)
    other = thunder_core.jit(model.other)
    torch.testing.assert_close(other(x), model.other(x))
    assert thunder_core.cache_info(other).disk_hits == 0
    again = thunder_core.jit(model.other)
    torch.testing.assert_close(again(x), model.other(x))
    assert thunder_core.cache_info(again).disk_hits == 1


# Programs whose result depends on what differs between two processes; each runs twice with the
# same setting (the second uses the entry) and once with another (it must not).
_PROCESS_STATE_PROGRAMS = {
    "argv": (
        """
        import sys
        def f(x):
            return x.relu() if "--relu" in sys.argv else x.abs()
        """,
        (["--relu"], {}),
        (["--abs"], {}),
    ),
    "set_member": (
        """
        import os
        def double(x):
            return x * 2
        def triple(x):
            return x * 3
        ACTS = {double} if os.environ["WHICH"] == "d" else {triple}
        def f(x):
            for act in ACTS:
                x = act(x)
            return x
        """,
        ([], {"WHICH": "d"}),
        ([], {"WHICH": "t"}),
    ),
    "bound_builtin": (
        """
        import os
        TABLE = {"a": float(os.environ["SCALE"])}
        lookup = TABLE.get
        def f(x):
            return x * lookup("a")
        """,
        ([], {"SCALE": "2"}),
        ([], {"SCALE": "3"}),
    ),
}


@pytest.mark.parametrize("case", sorted(_PROCESS_STATE_PROGRAMS))
def test_state_that_differs_between_processes_is_compared(tmp_path, case):
    body, same, other = _PROCESS_STATE_PROGRAMS[case]
    script = _script(
        tmp_path,
        "import json, torch, thunder_core\n"
        + textwrap.dedent(body)
        + textwrap.dedent(
            """
            x = torch.tensor([-1.0, 2.0])
            jf = thunder_core.jit(f)
            torch.testing.assert_close(jf(x), f(x))
            print(json.dumps({"disk_hits": thunder_core.cache_info(jf).disk_hits}))
            """
        ),
    )
    first = _run(script, *same[0], env=same[1])["disk_hits"]
    second = _run(script, *same[0], env=same[1])["disk_hits"]
    assert _run(script, *other[0], env=other[1])["disk_hits"] == 0  # and it gave eager's result
    assert first == 0
    assert second == (0 if case == "bound_builtin" else 1)  # a bound builtin's state is not seen: not stored


def test_another_checkout_of_the_same_modules_is_other_code(tmp_path):
    for name, factor in (("a", 2), ("b", 3)):
        folder = tmp_path / name
        folder.mkdir()
        _script(
            folder,
            f"import torch\n\nclass Inner(torch.nn.Module):\n    def forward(self, x):\n        return x * {factor}\n",
            "layers.py",
        )
        _script(
            folder,
            """
            import json, torch, thunder_core
            from layers import Inner

            class Net(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.inner = Inner()

                def forward(self, x):
                    return self.inner(x) + 1

            net = Net()
            x = torch.ones(2)
            jitted = thunder_core.jit(net)
            torch.testing.assert_close(jitted(x), net(x))
            print(json.dumps({"disk_hits": thunder_core.cache_info(jitted).disk_hits}))
            """,
            "train.py",
        )
    assert _run(tmp_path / "a" / "train.py")["disk_hits"] == 0
    assert _run(tmp_path / "a" / "train.py")["disk_hits"] == 1
    assert _run(tmp_path / "b" / "train.py")["disk_hits"] == 0


def test_an_entry_that_matches_its_hash_but_not_this_torch_is_a_miss():
    def f(x):
        return torch.tanh(x) * 3

    x = torch.randn(4)
    thunder_core.jit(f)(x)
    (entry,) = _entries()
    header, _, text = open(entry, "rb").read().partition(b"\n")
    body = json.loads(text)
    for proxy in body["trace"]["proxies"].values():
        proxy[4] = "bogus"  # a device this torch does not know
    text = json.dumps(body).encode()
    header = json.dumps({"format": 1, "sha256": __import__("hashlib").sha256(text).hexdigest()}).encode()
    open(entry, "wb").write(header + b"\n" + text)
    jf = thunder_core.jit(f)
    torch.testing.assert_close(jf(x), f(x))
    info = thunder_core.cache_info(jf)
    assert info.disk_hits == 0 and "could not be used" in info.reasons[0]


def test_the_root_is_created_private_under_a_permissive_umask(tmp_path):
    previous = os.umask(0o002)
    try:
        jf = thunder_core.jit(lambda x: x - 1, cache_dir=tmp_path / "root")
        jf(torch.randn(2))
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(tmp_path / "root").st_mode) & 0o077 == 0
    assert len(os.listdir(tmp_path / "root" / "traces-v1")) == 1


def test_traces_are_not_stored_unless_asked(monkeypatch):
    monkeypatch.delenv("THUNDER_CORE_CACHE_TRACES")

    def f(x):
        return x.cos() * 2

    thunder_core.jit(f)(torch.randn(3))
    jf = thunder_core.jit(f)
    jf(torch.randn(3))
    assert _entries() == [] and thunder_core.cache_info(jf).disk_hits == 0
    again = thunder_core.jit(f, cache_traces=True)
    again(torch.randn(3))
    assert len(_entries()) == 1


# Programs a second review found reusing a stored trace wrongly; each now compiles anew.
_REVIEWED = {
    "method_default": """
        class M(torch.nn.Module):
            def forward(self, x, temperature=S):
                return x * temperature
        m = M()
        run = thunder_core.jit(m)
        reference = m
        """,
    "function_attribute": """
        def act(x):
            return x * act.scale
        act.scale = S
        def reference(x):
            return act(x)
        run = thunder_core.jit(reference)
        """,
    "closure_argument": """
        def make(s):
            return lambda x: x * s
        def g(x, fn):
            return fn(x)
        reference = lambda x: g(x, make(S))  # noqa: E731
        jg = thunder_core.jit(g)
        run = lambda x: jg(x, make(S))  # noqa: E731
        """,
    "enum_value": """
        import enum
        class Mode(enum.Enum):
            A = S
        def g(x, mode):
            return x * mode.value
        reference = lambda x: g(x, Mode.A)  # noqa: E731
        jg = thunder_core.jit(g)
        run = lambda x: jg(x, Mode.A)  # noqa: E731
        """,
    "int_or_float": """
        FACTORS = (2, 3) if S == 2.0 else (2.0, 3)
        def reference(x):
            return x * FACTORS[0]
        run = thunder_core.jit(reference)
        """,
    "local_import": """
        import types, sys
        config = types.ModuleType("config_of_test")
        config.SCALE = S
        sys.modules["config_of_test"] = config
        def reference(x):
            from config_of_test import SCALE
            return x * SCALE
        run = thunder_core.jit(reference)
        """,
}


@pytest.mark.parametrize("case", sorted(_REVIEWED))
def test_values_a_second_process_may_hold_differently_are_compared(tmp_path, case):
    script = _script(
        tmp_path,
        "import json, os, torch, thunder_core\nS = float(os.environ['SCALE'])\n"
        + textwrap.dedent(_REVIEWED[case])
        + textwrap.dedent(
            """
            x = torch.arange(4)
            out = run(x)
            torch.testing.assert_close(out, reference(x))
            print(json.dumps({"dtype": str(out.dtype)}))
            """
        ),
    )
    _run(script, env={"SCALE": "2"})
    _run(script, env={"SCALE": "3"})  # asserts eager's result (and dtype) inside


def _hf_classes():
    from transformers import PreTrainedModel

    return [PreTrainedModel]
