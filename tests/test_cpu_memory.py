"""The CPU memory policy: freed memory kept for reuse (no page faults), or malloc left alone.

The policy is process-wide, so each case runs in a fresh interpreter: it jits a function on
CPU tensors, then allocates and frees ten 4 MiB tensors several times and counts the page
faults those rounds cost against a fixed mmap threshold, under which every round faults again.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

import thunder_core

SCRIPT = r"""
import json, resource, torch, thunder_core

f = thunder_core.jit(lambda a: a * 2)
f(torch.ones(4))

def round_trip():
    tensors = [torch.empty(1 << 20).fill_(1.0) for _ in range(10)]
    del tensors

round_trip(); round_trip()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    round_trip()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"notes": thunder_core.explain(f).notes, "faults": faults}))
"""

glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="the keep policy sets glibc's malloc thresholds; other C libraries are left alone",
)


def _run(**env) -> dict:
    skipped = ("GLIBC_TUNABLES", "THUNDER_CORE_CPU_MEMORY")
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in skipped}
    environment["THUNDER_CORE_NO_AUTOLOAD"] = "1"  # no executor warm-up thread beside the counted rounds
    environment.update(env)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=environment, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@glibc_only
def test_freed_memory_is_kept_for_reuse_by_default():
    kept = _run()
    released = _run(THUNDER_CORE_CPU_MEMORY="release")
    assert any("kept for reuse" in note for note in kept["notes"])
    assert not any(note.startswith("cpu memory") for note in released["notes"])
    # How many faults glibc's default costs depends on its adaptive thresholds and the heap's
    # layout (tens of thousands on one machine, about a thousand on another); a fixed threshold
    # unmaps every 4 MiB block on free, so 5 rounds fault each page again (about 51,000 faults).
    # It is also the user's own malloc setting, which the policy leaves alone.
    returned = _run(MALLOC_MMAP_THRESHOLD_="131072")
    assert any("left as MALLOC_MMAP_THRESHOLD_ configures it" in note for note in returned["notes"])
    assert returned["faults"] > 5_000
    assert kept["faults"] < returned["faults"] / 20


def test_a_wrong_cpu_memory_value_names_the_choices(monkeypatch):
    monkeypatch.setenv("THUNDER_CORE_CPU_MEMORY", "cache")
    with pytest.raises(thunder_core.ConfigError, match=r"THUNDER_CORE_CPU_MEMORY: cpu_memory must be one of"):
        thunder_core.jit(lambda a: a + 1)
