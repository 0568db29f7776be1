"""Shared fixtures: event-loop flavours for the public API, a module's runtime, and the real models."""

from __future__ import annotations

import os

import pytest

import aiomnn
from aiomnn import models
from aiomnn.backends.cpu import vectors

# The CPU backend's numba loops compile in the background while numpy serves (backends/cpu/jit.py): which of
# the two ran would depend on timing. Tests compile them on first use, so each test knows what ran; the numpy
# paths are tested with AIOMNN_NUMBA=0 (tests/test_cpu_transformer.py).
os.environ.setdefault("AIOMNN_NUMBA", "wait")
# The vector width is chosen before numba loads (backends/cpu/vectors.py), as `import aiomnn` then a run would:
# test modules import numba themselves, which would leave the default width.
vectors.wide()

LOOPS = [pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"), pytest.param("asyncio", id="asyncio"),
         pytest.param("trio", id="trio")]


@pytest.fixture(params=LOOPS)
def anyio_backend(request):
    """Public-API tests run under uvloop, the stdlib asyncio loop and trio."""
    return request.param


@pytest.fixture(params=["wait", "0"], ids=["loop", "numpy"])
def loop_and_numpy(request, monkeypatch):
    """A test run twice: by the CPU's compiled loops (compiled on first use) and by numpy alone (AIOMNN_NUMBA=0);
    a module takes it with `pytestmark = pytest.mark.usefixtures("loop_and_numpy")`."""
    monkeypatch.setenv("AIOMNN_NUMBA", request.param)
    return request.param


@pytest.fixture(scope="module")
def runtime(request):
    """One runtime for the test module's CONFIG, shared by its tests."""
    info = aiomnn.create_runtime(request.module.CONFIG)
    yield info
    info.close()


def model_path(name: str):
    """A fetched real model; in CI a missing model is an error, elsewhere a skip."""
    try:
        return models.path(name)
    except FileNotFoundError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))


def _cuda_reason() -> str | None:
    """Why the CUDA tests cannot run here, or None."""
    try:
        import cupy  # noqa: F401
    except Exception as exc:
        return f"cupy is not importable here ({type(exc).__name__}: {exc})"
    from aiomnn.backends import cuda

    if not cuda.probe():
        return "cupy is installed but no CUDA device is visible"
    return None


GPU_REASON = _cuda_reason()
needs_gpu = pytest.mark.skipif(GPU_REASON is not None, reason=f"needs a CUDA GPU: {GPU_REASON}")
