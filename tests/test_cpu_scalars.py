"""The compiled loops' scalar functions (backends/cpu/scalars.py) against float64 references, the special
values included."""

from __future__ import annotations

import numpy as np
import pytest

numba = pytest.importorskip("numba")

from aiomnn.backends.cpu import jit  # noqa: E402
from aiomnn.backends.cpu.scalars import FAST, activate  # noqa: E402

SPECIAL = np.array([-np.inf, -100, -89, -88.5, -50, -1, -0.0, 0, 1e-30, 1, 50, 88.5, 89, 100, np.inf, np.nan],
                   np.float32)


@numba.njit(fastmath=FAST, error_model="numpy")
def _activate(y, act, alpha, beta):
    activate(y, 0, y.size, act, alpha, beta)


def _reference(name: str, x: np.ndarray) -> np.ndarray:
    v = x.astype(np.float64)
    with np.errstate(all="ignore"):
        s = 1 / (1 + np.exp(-v))
        return v * s if name == "Swish" else s


@pytest.mark.parametrize("name", ["Swish", "Sigmoid"])
def test_sigmoid_and_swish(name):
    code, alpha, beta = jit.loop_activation((name, {}) if name != "Swish" else ("Swish", {"alpha": 1.0}))
    x = np.concatenate([SPECIAL, (np.random.default_rng(3).standard_normal(4096) * 8).astype(np.float32)])
    y = x.copy()
    _activate(y, code, alpha, beta)
    want = _reference(name, x)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))  # NaN in, NaN out; -inf * 0 is NaN for Swish
    ok = ~np.isnan(want)
    np.testing.assert_allclose(y[ok], want[ok], rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("name", ["Sigmoid", "Swish", "HardSigmoid", "HardSwish"])
def test_unary_ops_by_the_compiled_loop_match_numpys_way(name, monkeypatch):
    """The unary activations on float32 run the compiled loop (activations._looped) once it is built: the same
    values as their numpy way, NaN where it gives NaN."""
    from aiomnn.backends.cpu.ops import activations

    fn = {"Sigmoid": activations.sigmoid_, "Swish": activations.swish_, "HardSigmoid": activations.hard_sigmoid_,
          "HardSwish": activations.hard_swish_}[name]
    x = np.concatenate([SPECIAL, (np.random.default_rng(4).standard_normal(20000) * 8).astype(np.float32)])
    calls = []
    looped = activations._looped
    monkeypatch.setattr(activations, "_looped", lambda y, *a, **k: calls.append(1) or looped(y, *a, **k))
    fn(x.copy())
    assert jit.wait(300)
    got = fn(x.copy())
    with monkeypatch.context() as m, np.errstate(all="ignore"):  # inf * 0 is NaN, as run_segment lets it be
        m.setattr(activations, "_looped", lambda *a, **k: False)  # numpy's way
        want = fn(x.copy())
    assert calls and jit.jitted("activation") is not None
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=2e-6, atol=1e-7)


def test_half_loop_rounds_as_numpy_does(monkeypatch):
    """The loop `half` (float32 to the bits of half floats, for GPU inputs stored in fp16) against numpy's float16
    cast: ties to even, subnormal halves and their edge, overflow to infinity, infinities, NaN staying NaN; split
    in pieces at odd places."""
    monkeypatch.setenv("AIOMNN_NUMBA", "wait")
    if jit.jitted("half") is None:
        pytest.skip("no instruction rounds to half floats on this CPU")
    rng = np.random.default_rng(5)
    edges = np.concatenate([np.arange(0x33000000, 0x38900000, 997, dtype=np.uint32),  # zero to subnormal to normal
                            np.arange(0x477F0000, 0x47900000, 13, dtype=np.uint32),  # the largest half, overflow
                            np.arange(0x3F800000, 0x3F802000, 1, dtype=np.uint32)]).view(np.float32)  # ties near 1
    x = np.concatenate([edges, -edges, SPECIAL, rng.standard_normal(10001).astype(np.float32) * 1000,
                        np.array([3e38, -3e38, 65504, 65519.996, 65520, 2 ** -25, 2 ** -24 * 1.5], np.float32)])
    y = np.full(x.size, 0xDEAD, np.uint16)
    assert jit.split("half", x.size, x.size // 3 + 1, x, y) is not None
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    np.testing.assert_array_equal(y[~nan], want[~nan])
    assert np.isnan(y[nan].view(np.float16)).all()


def test_widen_loop_gives_every_half_float_as_numpy_does(monkeypatch):
    """The loop `widen` (half floats' bits to float32, for GPU outputs stored in fp16), over all 65536 of them in
    pieces split at odd places, and halves.widened, against numpy's cast: subnormals, infinities, signed zeros; NaN
    stays NaN. Without the loop (numba off), halves.widened is numpy's cast."""
    from aiomnn.backends.cpu import halves

    monkeypatch.setenv("AIOMNN_NUMBA", "wait")
    if jit.jitted("widen") is None:
        pytest.skip("no instruction widens half floats on this CPU")
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    y = np.full(bits.size, np.nan, np.float32)
    assert jit.split("widen", bits.size, bits.size // 3 + 1, bits, y) is not None
    want = bits.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(y.view(np.uint32)[~nan], want.view(np.uint32)[~nan])
    assert np.isnan(y[nan]).all()
    got = halves.widened(bits.view(np.float16).reshape(256, 256), np.dtype(np.float32))
    assert got.shape == (256, 256) and got.dtype == np.float32
    np.testing.assert_array_equal(got.reshape(-1).view(np.uint32)[~nan], want.view(np.uint32)[~nan])
    monkeypatch.setenv("AIOMNN_NUMBA", "0")
    np.testing.assert_array_equal(halves.widened(bits.view(np.float16), np.dtype(np.float32)), want)
