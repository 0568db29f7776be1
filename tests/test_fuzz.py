"""Fuzzed models and inputs: a correct result or a clear AiomnnError, never anything else."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import aiomnn
from aiomnn.cli import demo_model

DEMO = demo_model(channels=4, classes=3)
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def load_and_run(data: bytes) -> str:
    """Load, create a session and run once; the outcome's class name."""
    try:
        net = aiomnn.Interpreter.from_bytes(data)
    except aiomnn.ModelError:
        return "ModelError"

    async def session_and_run():
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu")) as s:
            feeds = {}
            for name, (shape, dtype) in net.inputs.items():
                dims = [d if isinstance(d, int) and 0 < d < 128 else 1 for d in (shape or [])]
                feeds[name] = np.zeros(dims, dtype=dtype or np.float32)
            await s.run(feeds)

    try:
        asyncio.run(session_and_run())
    except aiomnn.AiomnnError as exc:
        return type(exc).__name__
    return "ok"


@FUZZ
@given(st.data())
def test_bit_flipped_models(data):
    buf = bytearray(DEMO)
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] ^= 1 << data.draw(st.integers(0, 7))
    assert load_and_run(bytes(buf)) in {"ok", "ModelError", "UnsupportedOpError", "InputError", "BackendError"}


@FUZZ
@given(st.integers(0, len(DEMO) - 1))
def test_truncated_models(n):
    assert load_and_run(DEMO[:n]) in {"ModelError", "UnsupportedOpError", "InputError", "ok"}


@FUZZ
@given(st.binary(max_size=256))
def test_random_bytes(data):
    assert load_and_run(data) in {"ModelError", "UnsupportedOpError", "InputError", "ok"}


DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32, np.int8, np.uint8, np.bool_, np.complex64]


@pytest.fixture(scope="module")
def session():
    loop = asyncio.new_event_loop()
    net = aiomnn.Interpreter.from_bytes(DEMO)
    s = loop.run_until_complete(net.create_session(aiomnn.ScheduleConfig(type="cpu")))
    yield loop, s
    loop.run_until_complete(s.close())
    loop.close()


@FUZZ
@given(dtype=st.sampled_from(DTYPES), shape=st.lists(st.integers(0, 70), min_size=0, max_size=5),
       fill=st.sampled_from([0.0, np.nan, np.inf, -np.inf, 1e30]))
def test_bad_inputs_get_a_result_or_an_input_error(session, dtype, shape, fill):
    loop, s = session
    assume(int(np.prod(shape)) <= 1 << 20)
    with np.errstate(invalid="ignore", over="ignore"):
        x = np.full(shape, fill).astype(dtype) if dtype is not np.bool_ else np.zeros(shape, bool)
    try:
        out = loop.run_until_complete(s.run({"image": x}))
    except aiomnn.InputError:
        pass
    else:
        assert x.dtype == np.float32 and out["probs"].shape == (shape[0], 3)
    good = np.zeros((1, 3, 64, 64), np.float32)
    assert loop.run_until_complete(s.run({"image": good}))["probs"].shape == (1, 3)
