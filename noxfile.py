"""Nox sessions: one per package (discovered under executors/ and plugins/) and per job.

Every install goes through constraints.txt so that no session pulls the CUDA build of torch.

    nox -s tests        # the core's test suite
    nox -s lint         # ruff
    nox -s docs         # the docs site, warnings as errors
    nox -s demo         # examples/demo.py
    nox -s report       # the HTML report rendered in headless Chromium (from the system's packages)
    nox -s bench        # benchmarks/
    nox -s gpu-host-checks        # GPU code checked without a GPU (CUDA sources compiled with nvcc)
    nox -s gpu-host-checks-cuda   # with a CUDA build of torch, no GPU: cuDNN graphs validated
    nox -l              # also lists one session per executor and plugin package
"""

from __future__ import annotations

from pathlib import Path

import nox

ROOT = Path(__file__).parent
CONSTRAINTS = ("-c", str(ROOT / "constraints.txt"))
# PyTorch's CPU index: pip prefers its CPU build over PyPI's CUDA build of the same release.
TORCH_INDEX = ("--extra-index-url", "https://download.pytorch.org/whl/cpu")
nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True


def _install_core(session: nox.Session, extras: str = "test") -> None:
    session.install(*CONSTRAINTS, *TORCH_INDEX, "torch")
    session.install(*CONSTRAINTS, "-e", f".[{extras}]")


@nox.session
def tests(session: nox.Session) -> None:
    _install_core(session)
    session.run("pytest", "-q", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def docs(session: nox.Session) -> None:
    """The docs site, warnings as errors, and a check that the plugin API is fully documented."""
    _install_core(session, extras="docs")
    session.run("mkdocs", "build", "--strict", "--site-dir", "site", env={"NO_MKDOCS_2_WARNING": "1"})
    session.run("python", "scripts/check_api_reference.py", "site")


@nox.session
def demo(session: nox.Session) -> None:
    _install_core(session)
    session.run("python", "examples/demo.py")


@nox.session
def bench(session: nox.Session) -> None:
    _install_core(session)
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        session.run("python", str(script))


@nox.session
def report(session: nox.Session) -> None:
    """The HTML report checked in a real headless browser: Chromium from the system's packages
    (``apt-get install chromium``; ``THUNDER_CORE_TEST_BROWSER`` names another), which the tests
    load the report in and assert on what it renders."""
    browser = session.run("sh", "-c", "command -v chromium || command -v chromium-browser || true",
                          external=True, silent=True)  # fmt: skip
    if not (browser or "").strip():
        session.error("no Chromium: install it from the system's packages (apt-get install chromium)")
    _install_core(session)
    session.run("pytest", "-q", "-rs", "tests/test_report.py", *session.posargs)


@nox.session(name="gpu-host-checks")
def gpu_host_checks(session: nox.Session) -> None:
    """The checks of GPU code that need no GPU: every CUDA kernel the CuPy executor generates for a
    litgpt training step (and its RawKernel softmax) compiled with nvcc for sm_80 and sm_90 and
    with NVRTC (the compiler CuPy uses) for compute_80 and compute_90."""
    _install_core(session)
    session.install(*CONSTRAINTS, "-e", "executors/thunder-executor-cupy[test]", "litgpt")
    folder = ROOT / "executors" / "thunder-executor-cupy" / "tests"
    session.run(
        "pytest",
        "-q",
        str(folder / "test_cuda_sources.py"),
        str(folder / "test_cupy.py"),
        "-k",
        "nvcc or kernel",
    )


@nox.session(name="gpu-host-checks-cuda")
def gpu_host_checks_cuda(session: nox.Session) -> None:
    """The checks that need a CUDA build of torch (about 5.5 GB, in this session's own environment,
    never the default one) but no GPU: the cudnn executor's SDPA graphs described and validated by
    the installed cudnn-frontend."""
    session.install("torch==2.14.1")  # PyPI's CUDA build: no CPU index, no constraints file here
    session.install("-e", ".", "-e", "executors/thunder-executor-cudnn[test]", "nvidia-cudnn-frontend>=1.13")
    session.run("pytest", "-q", "-rs", "executors/thunder-executor-cudnn/tests")


def _package_sessions(kind: str) -> None:
    for package in sorted((ROOT / kind).glob("*/pyproject.toml")):
        folder = package.parent

        @nox.session(name=f"{kind}:{folder.name}")
        def package_tests(session: nox.Session, folder: Path = folder) -> None:
            _install_core(session)
            session.install(*CONSTRAINTS, "-e", f"{folder}[test]")
            session.run("pytest", "-q", str(folder / "tests"), *session.posargs)


_package_sessions("executors")
_package_sessions("plugins")
