"""A long compile shows what it is doing on a terminal, and nothing elsewhere or when turned off."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import textwrap
import time

import pytest

from thunder_core.plugins.config import resolve
from thunder_core.plugins.errors import ConfigError

_PROGRAM = textwrap.dedent(
    """
    import sys
    import torch
    import thunder_core
    import thunder_core.progress

    thunder_core.progress.DELAY = 0.0  # show at once: the test's compile is short
    sys.path.insert(0, {tests!r})
    from models import litgpt_gpt

    torch.manual_seed(0)
    model = litgpt_gpt()
    x = torch.randint(0, 64, (2, 8))
    out = thunder_core.jit(model, executors=["torch"])(x)
    assert torch.allclose(out, model(x), atol=1e-5)
    print("same as eager", flush=True)
    """
).format(tests=os.path.dirname(__file__))


def _run(stderr_is_terminal: bool, setting: str | None) -> tuple[str, str]:
    """The program's stdout and stderr, stderr a pseudo-terminal or a pipe."""
    env = {k: v for k, v in os.environ.items() if k != "THUNDER_CORE_PROGRESS"}
    env["THUNDER_CORE_CACHE_DIR"] = "off"  # every run captures (a later one would read the trace from disk)
    if setting is not None:
        env["THUNDER_CORE_PROGRESS"] = setting
    if not stderr_is_terminal:
        done = subprocess.run(
            [sys.executable, "-c", _PROGRAM], capture_output=True, text=True, env=env, timeout=300
        )
        assert done.returncode == 0, done.stderr
        return done.stdout, done.stderr
    controller, terminal = pty.openpty()
    fcntl.ioctl(
        terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 200, 0, 0)
    )  # rows, columns: a real window
    process = subprocess.Popen(
        [sys.executable, "-c", _PROGRAM], stdout=subprocess.PIPE, stderr=terminal, env=env, text=True
    )
    os.close(terminal)
    written = b""
    deadline = time.monotonic() + 300  # bounded, even if the program hangs
    while True:
        ready, _, _ = select.select([controller], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            process.kill()
            break
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the program closed the terminal's other end
            break
        if not chunk:
            break
        written += chunk
    stdout = process.stdout.read()
    assert process.wait(timeout=300) == 0, written.decode(errors="replace")
    os.close(controller)
    return stdout, written.decode(errors="replace")


def test_a_compile_on_a_terminal_shows_its_stage_and_the_blocks_captured():
    stdout, terminal = _run(stderr_is_terminal=True, setting=None)
    assert "same as eager" in stdout
    assert "thunder_core: compiling" in terminal
    assert "blocks captured: 2" in terminal  # litgpt_gpt has two layers
    assert "assigning executors" in terminal


def test_nothing_is_shown_when_stderr_is_not_a_terminal():
    stdout, stderr = _run(stderr_is_terminal=False, setting=None)
    assert "same as eager" in stdout and "thunder_core: compiling" not in stderr


def test_progress_never_turns_it_off_on_a_terminal_and_always_shows_it_anywhere():
    stdout, terminal = _run(stderr_is_terminal=True, setting="never")
    assert "same as eager" in stdout and "thunder_core: compiling" not in terminal
    stdout, stderr = _run(stderr_is_terminal=False, setting="always")
    assert "same as eager" in stdout and "blocks captured: 2" in stderr


def test_an_unknown_progress_setting_names_the_choices(monkeypatch):
    monkeypatch.setenv("THUNDER_CORE_PROGRESS", "loud")
    with pytest.raises(
        ConfigError, match=r"THUNDER_CORE_PROGRESS: progress must be one of \['auto', 'never', 'always'\]"
    ):
        resolve()


class _BrokenStream:
    """A stderr whose reader went away: every write fails."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")

    def isatty(self):
        return True


def test_a_stderr_that_fails_to_write_stops_the_display_not_the_compile(monkeypatch):
    import thunder_core.progress as progress

    monkeypatch.setattr(progress, "DELAY", 0.0)
    monkeypatch.setattr(progress, "REDRAW", 0.01)
    monkeypatch.setattr(sys, "stderr", _BrokenStream())
    with progress.compiling("f", "always"):
        time.sleep(0.1)  # the display thread tries to draw, and redraw
        progress.stage("compiling inductor regions")
        progress.count("inductor regions")
        time.sleep(0.05)
    assert progress._current.get() is None  # the next compile reports again
    with progress.compiling("g", "never"):
        progress.stage("capturing")
