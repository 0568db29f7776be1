"""Cancellation, timeouts, the worker-thread cap and dynamic batching."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import anyio
import numpy as np
import pytest
from onnx import TensorProto, helper

import aiomnn

pytestmark = pytest.mark.anyio


def chain_model(depth: int = 40) -> bytes:
    """y = relu(x * 1.0001 + x ...): enough elementwise work on a big tensor to take a while."""
    nodes, prev = [], "x"
    for i in range(depth):
        nodes.append(helper.make_node("Add", [prev, "x"], [f"a{i}"]))
        nodes.append(helper.make_node("Mul", [f"a{i}", "k"], [f"m{i}"]))
        prev = f"m{i}"
    nodes.append(helper.make_node("Relu", [prev], ["y"]))
    k = helper.make_tensor("k", TensorProto.FLOAT, [], [0.5])
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1 << 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1 << 16])], [k])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.fixture(scope="module")
def net():
    return aiomnn.Interpreter.from_bytes(chain_model())


def feed(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((n, 1 << 16)).astype(np.float32)}


async def test_cancel_while_running_in_a_worker_thread(net):
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu")) as s:
        big, small = feed(32, 1), feed(2, 2)
        want_small = (await s.run(small))["y"]
        t0 = time.perf_counter()
        await s.run(big)
        full = time.perf_counter() - t0
        with anyio.move_on_after(full / 10) as scope:
            await s.run(big)
        cancelled_after = time.perf_counter() - t0 - full
        assert scope.cancelled_caught
        assert cancelled_after < full / 2, "the caller was not released promptly"
        np.testing.assert_array_equal((await s.run(small))["y"], want_small)


async def test_cancel_while_queued_behind_another_run(net):
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu")) as s:
        big, small = feed(32, 3), feed(2, 4)
        want_big = (await s.run(big))["y"]
        want_small = (await s.run(small))["y"]
        results = {}

        async def first():
            results["big"] = (await s.run(big))["y"]

        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            await anyio.sleep(0.001)
            with anyio.move_on_after(0.001) as scope:
                await s.run(small)  # queued behind `first`
            assert scope.cancelled_caught
        np.testing.assert_array_equal(results["big"], want_big)
        np.testing.assert_array_equal((await s.run(small))["y"], want_small)


async def test_fail_after_raises_timeout_and_the_session_recovers(net):
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu")) as s:
        small = feed(2, 5)
        want = (await s.run(small))["y"]
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.0005):
                await s.run(feed(32, 6))
        np.testing.assert_array_equal((await s.run(small))["y"], want)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_asyncio_wait_for(net, anyio_backend):
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu")) as s:
        small = feed(2, 7)
        want = (await s.run(small))["y"]
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(s.run(feed(32, 8)), 0.0005)
        np.testing.assert_array_equal((await asyncio.wait_for(s.run(small), 30))["y"], want)


async def test_worker_threads_are_capped(net):
    runtime = aiomnn.create_runtime([aiomnn.ScheduleConfig(type="cpu", num_threads=2)])
    try:
        sessions = [await net.create_session(aiomnn.ScheduleConfig(type="cpu"), runtime) for _ in range(4)]
        peak = 0

        async def call(i):
            nonlocal peak
            await sessions[i % 4].run(feed(1, i))
            peak = max(peak, sum(t.name.startswith("aiomnn-cpu") for t in threading.enumerate()))

        async with anyio.create_task_group() as tg:
            for i in range(100):
                tg.start_soon(call, i)
        assert 1 <= peak <= 2
        for s in sessions:
            await s.close()
    finally:
        runtime.close()


@pytest.mark.parametrize("workers", [1, 2])
async def test_batching_gives_each_caller_its_own_result(net, workers):
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu")) as s:
        feeds = [feed(1, 100 + i) for i in range(16)]
        want = [(await s.run(f))["y"] for f in feeds]
        got: dict[int, np.ndarray] = {}
        async with aiomnn.BatchingSession(s, max_batch=8, max_delay_ms=20, workers=workers) as batched:

            async def call(i):
                got[i] = (await batched.run(feeds[i]))["y"]

            async def cancelled_caller():
                with anyio.move_on_after(0.002):
                    await batched.run(feed(1, 999))

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancelled_caller)
                for i in range(16):
                    tg.start_soon(call, i)
            assert batched.batches < 16
            clones = batched._clones
        assert len(clones) == workers - 1 and all(c._closed for c in clones)
        for i in range(16):
            np.testing.assert_allclose(got[i], want[i], rtol=1e-5)
        np.testing.assert_array_equal((await s.run(feeds[0]))["y"], want[0])  # the session itself stays open


async def test_batching_results_outlive_the_next_batch():
    """Batches are stacked into one reused buffer; an output that is the input itself must still be
    each caller's own copy, untouched by the batches after it."""
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
    net = aiomnn.Interpreter.from_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
                                        .SerializeToString())
    got = {}
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu")) as s, \
            aiomnn.BatchingSession(s, max_batch=4, max_delay_ms=20) as batched:

        async def call(i):
            got[i] = (await batched.run({"x": np.full((1, 4), i, np.float32)}))["y"]

        for wave in range(3):
            async with anyio.create_task_group() as tg:
                for i in range(4 * wave, 4 * wave + 4):
                    tg.start_soon(call, i)
        assert batched.batches < 12
    for i in range(12):
        np.testing.assert_array_equal(got[i], np.full((1, 4), i, np.float32))


async def test_batching_needs_a_dynamic_batch_dimension():
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    net = aiomnn.Interpreter.from_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
                                        .SerializeToString())
    async with await net.create_session() as s:
        with pytest.raises(aiomnn.AiomnnError, match="dynamic batch"):
            aiomnn.BatchingSession(s)


async def test_clone_shares_weights_and_runs_on_its_own(net):
    s = await net.create_session(aiomnn.ScheduleConfig(type="cpu"))
    twin = await s.clone()
    assert twin._graph is s._graph  # the same constant tensors, not copies
    assert twin.pipeline is not s.pipeline  # its own activations
    a, b = feed(4, 11), feed(4, 12)
    want_a, want_b = (await s.run(a))["y"], (await s.run(b))["y"]
    got = {}

    async def call(key, session, f):
        got[key] = (await session.run(f))["y"]

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "a", s, a)
        tg.start_soon(call, "b", twin, b)
    np.testing.assert_array_equal(got["a"], want_a)
    np.testing.assert_array_equal(got["b"], want_b)
    await s.close()  # the clone keeps the runtime they share alive
    np.testing.assert_array_equal((await twin.run(a))["y"], want_a)
    await twin.close()
    assert twin.runtime_info.closed


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="thread priorities are a Linux feature here")
@pytest.mark.parametrize("power,nice", [("normal", 10), ("high", 0)])
async def test_workers_yield_the_cpu_to_the_event_loop(net, power, nice):
    """CPU workers run at nice 10, so the loop's thread gets a core at once when it wakes;
    BackendConfig(power="high") keeps them at the loop's priority."""
    config = aiomnn.ScheduleConfig(type="cpu", num_threads=2, backend_config=aiomnn.BackendConfig(power=power))
    async with await net.create_session(config) as s:
        await s.run(feed(1))  # plans
        seen = {}
        real = s.pipeline.segments[0].steps[0].execution.on_execute

        def probe(inputs, outputs):
            seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            return real(inputs, outputs)

        s.pipeline.segments[0].steps[0].execution.on_execute = probe
        await s.run(feed(1))
    assert seen["nice"] - os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == nice


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="thread priorities are a Linux feature here")
def test_helper_threads_started_by_a_worker_sit_at_the_workers_level():
    """A thread starts at its creator's nice level: a kernel's helper threads, started from a niced worker, must
    not go lower still."""
    from concurrent.futures import ThreadPoolExecutor

    from aiomnn.backends.cpu.threads import Pool, lower_priority

    pool = Pool(2, nice=10)
    seen = set()

    def work(i):
        seen.add(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        time.sleep(0.01)  # long enough for the helper to take a share

    with ThreadPoolExecutor(1, initializer=lower_priority, initargs=(10,)) as worker:
        worker.submit(pool.run, 8, work).result()
    assert pool.helpers == 1
    pool.close()
    assert seen == {os.getpriority(os.PRIO_PROCESS, os.getpid()) + 10}, seen


@pytest.mark.parametrize("power,yields", [("normal", True), ("high", False)])
async def test_workers_below_the_loop_give_their_core_away_between_kernels(net, power, yields, monkeypatch):
    """A niced worker calls sched_yield between kernels (at most every YIELD_EVERY), so the loop's thread,
    woken on its core, gets in; power="high" workers keep the loop's priority and never yield."""
    from aiomnn.backends.cpu import backend as cpu_backend

    calls = []
    monkeypatch.setattr(cpu_backend, "_sched_yield", lambda: calls.append(1))
    monkeypatch.setattr(cpu_backend, "YIELD_EVERY", 0.0)
    config = aiomnn.ScheduleConfig(type="cpu", num_threads=2, backend_config=aiomnn.BackendConfig(power=power))
    async with await net.create_session(config) as s:
        await s.run(feed(1))
        steps = sum(len(seg.steps) for seg in s.pipeline.segments)
    assert len(calls) == (steps if yields else 0)
