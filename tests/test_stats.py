"""Run statistics (Session.stats(), BatchingSession.stats()): runs counted by outcome, queue wait against
compute time, runs by backend, fallbacks and tuning events (OpenCL on PoCL where it is here).

The timing assertions are loose on purpose: they say that runs queued behind each other waited and that
computing took time, never how long.
"""

from __future__ import annotations

import threading

import anyio
import numpy as np
import pytest
from onnx import TensorProto, helper

import aiomnn
from aiomnn import tuning
from aiomnn.config import ForwardType
from aiomnn.runtime import probe

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _net(nodes: list, inputs: list[str], shape: list) -> aiomnn.Interpreter:
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in inputs],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return aiomnn.Interpreter.from_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
                                         .SerializeToString())


def relu_net() -> aiomnn.Interpreter:
    """y = relu(x + x), x of shape (n, 4): a run costs next to nothing."""
    return _net([helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])], ["x"], ["n", 4])


def matmul_net(size: int = 256, steps: int = 6) -> aiomnn.Interpreter:
    """y = x @ x @ ... (tanh between): a run that keeps a worker thread busy for a while, numpy's matmul alone."""
    nodes, prev = [], "x"
    for i in range(steps):
        nodes += [helper.make_node("MatMul", [prev, "x"], [f"m{i}"]), helper.make_node("Tanh", [f"m{i}"], [f"t{i}"])]
        prev = f"t{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    return _net(nodes, ["x"], [size, size])


def add_net() -> aiomnn.Interpreter:
    """y = a + b, both of any 2-D shape: shapes that cannot broadcast pass the feeds check and fail in planning."""
    return _net([helper.make_node("Add", ["a", "b"], ["y"])], ["a", "b"], ["n", "m"])


CPU = aiomnn.ScheduleConfig(type="cpu", num_threads=1)
X = np.ones((2, 4), np.float32)


async def test_a_new_session_has_counted_nothing():
    async with await relu_net().create_session(CPU) as s:
        st = s.stats()
        assert (st.runs, st.failed, st.cancelled, st.rejected, st.waiting, st.fallbacks) == (0, 0, 0, 0, 0, 0)
        assert st.queue_wait == st.compute == aiomnn.Durations(0, 0.0, 0.0) and st.compute.mean == 0.0
        assert dict(st.runs_by_backend) == {} and st.tuning_events == () and not st.tuning
        assert st.fallback_error is None


async def test_runs_are_counted_by_outcome():
    async with await relu_net().create_session(CPU) as s:
        for _ in range(3):
            await s.run({"x": X})
        # Refused by the feeds check: rejected, never queued, no failed run.
        with pytest.raises(aiomnn.InputError):
            await s.run({"x": np.ones((2, 5), np.float32)})  # dimension 1 must be 4
        with pytest.raises(aiomnn.InputError):
            await s.run({"z": X})
        # A kernel that raises once the run is taken up: a failed run.
        step = s.pipeline.segments[0].steps[-1]
        real = step.execution.on_execute

        def broken(inputs, outputs):
            step.execution.on_execute = real
            raise RuntimeError("injected kernel fault")

        step.execution.on_execute = broken
        with pytest.raises(aiomnn.BackendError):
            await s.run({"x": X})
        # Cancelled at its first await: a cancelled run, whose work ends in the background.
        with anyio.CancelScope() as scope:
            scope.cancel()
            await s.run({"x": X})
        out = await s.run({"x": X})  # the result is the run's, counting or not
        np.testing.assert_array_equal(out["y"], np.maximum(X + X, 0))
        st = s.stats()
        assert (st.runs, st.failed, st.cancelled, st.rejected) == (4, 1, 1, 2)
        assert st.queue_wait.count == st.compute.count == st.recent_compute.count == 4
        assert dict(st.runs_by_backend) == {ForwardType.CPU: 4}


async def test_a_shape_that_fails_in_planning_is_a_failed_run():
    """The feeds check passes (any 2-D shapes); planning finds that they cannot be added."""
    async with await add_net().create_session(CPU) as s:
        with pytest.raises(aiomnn.AiomnnError):
            await s.run({"a": np.ones((2, 3), np.float32), "b": np.ones((4, 5), np.float32)})
        await s.run({"a": np.ones((2, 3), np.float32), "b": np.ones((2, 3), np.float32)})
        st = s.stats()
        assert (st.runs, st.failed, st.rejected) == (1, 1, 0)


async def test_runs_queued_on_one_session_wait_and_compute():
    x = (np.random.default_rng(0).standard_normal((256, 256)) / 16).astype(np.float32)
    async with await matmul_net().create_session(CPU) as s:  # a fixed input shape: planned at creation
        await s.run({"x": x})
        outs = await _gather([s.run({"x": x}) for _ in range(4)])
        st = s.stats()
        assert st.runs == 5 and st.failed == st.cancelled == 0
        assert st.compute.total > 0 and st.compute.max > 0 and st.compute.max <= st.compute.total
        assert st.queue_wait.total > 0
        # The last of four runs gathered at once waits for the three before it, so the longest wait exceeds half
        # a run's mean compute time by far (about six times over): loose, whatever the machine's speed.
        assert st.queue_wait.max > st.compute.mean / 2
        assert st.recent_queue_wait.count == 5 and st.recent_queue_wait.total == pytest.approx(st.queue_wait.total)
        assert dict(st.runs_by_backend) == {ForwardType.CPU: st.runs}
        for out in outs:
            np.testing.assert_array_equal(out["y"], outs[0]["y"])


async def test_runs_waiting_for_a_busy_session_are_counted_and_wait_as_long():
    async with await relu_net().create_session(CPU) as s:
        await s.run({"x": X})
        async with anyio.create_task_group() as tg:
            async with s._lock:  # the session busy (as with a long run): runs queue behind it
                for _ in range(3):
                    tg.start_soon(s.run, {"x": X})
                with anyio.fail_after(30):
                    while s.stats().waiting < 3:
                        await anyio.sleep(0.001)
                await anyio.sleep(0.02)
                assert s.stats().waiting == 3 and s.stats().runs == 1
        st = s.stats()
        assert st.waiting == 0 and st.runs == 4
        assert st.queue_wait.max >= 0.01  # they waited at least the 20 ms the session was held: a lower bound


async def _gather(aws: list) -> list:
    results: list = [None] * len(aws)

    async def one(i, aw):
        results[i] = await aw

    async with anyio.create_task_group() as tg:
        for i, aw in enumerate(aws):
            tg.start_soon(one, i, aw)
    return results


async def test_a_closed_sessions_stats_are_its_final_counts():
    s = await relu_net().create_session(CPU)
    await s.run({"x": X})
    before = s.stats()
    await s.close()
    after = s.stats()
    assert after == before and after.runs == 1
    with pytest.raises(aiomnn.ClosedError):
        await s.run({"x": X})
    assert s.stats() == before  # a run on a closed session counts nowhere


async def test_stats_read_on_another_thread_while_runs_complete():
    async with await relu_net().create_session(CPU) as s:
        stop = threading.Event()
        seen: list[int] = []

        def scrape():
            while not stop.is_set():
                st = s.stats()
                assert st.queue_wait.count == st.runs == sum(st.runs_by_backend.values())
                seen.append(st.runs)

        reader = threading.Thread(target=scrape)
        reader.start()
        try:
            for _ in range(200):
                await s.run({"x": X})
        finally:
            stop.set()
            reader.join()
        assert seen == sorted(seen) and s.stats().runs == 200


@pytest.mark.parametrize("workers", [1, 2])
async def test_batching_counts_batches_and_their_sizes(workers):
    async with await relu_net().create_session(CPU) as s:
        async with aiomnn.BatchingSession(s, max_batch=4, max_delay_ms=20, workers=workers) as batched:
            sizes = [1] * 10 + [2, 3]
            feeds = [{"x": np.full((n, 4), i, np.float32)} for i, n in enumerate(sizes)]
            outs = await _gather([batched.run(f) for f in feeds])
            with pytest.raises(aiomnn.InputError):
                await batched.run({"x": np.ones((1, 5), np.float32)})
            st = batched.stats()
        for f, out in zip(feeds, outs):
            np.testing.assert_array_equal(out["y"], np.maximum(f["x"] * 2, 0))
        assert (st.requests, st.failed, st.rejected, st.waiting) == (len(sizes), 0, 1, 0)
        assert st.batches == batched.batches == sum(st.batch_sizes.values())
        assert sum(size * n for size, n in st.batch_sizes.items()) == sum(sizes)  # every row in one batch
        assert st.batches < len(sizes) and max(st.batch_sizes) > 1  # gathered, not one by one
        assert st.mean_batch_size == pytest.approx(sum(sizes) / st.batches)
        assert st.queue_wait.count == len(sizes) and st.queue_wait.total > 0
        assert len(st.sessions) == workers and st.sessions[0] == s.stats()
        assert sum(ss.runs for ss in st.sessions) == st.batches  # the sessions ran the batches, nothing else
        assert batched.stats() == st  # answers after the `async with` block, unchanged


# GPU tuning, on OpenCL (PoCL here) ---------------------------------------------------------------------
@pytest.fixture
def opencl():
    if not probe(ForwardType.OPENCL):
        pytest.skip("no OpenCL device here (PoCL: pip install pocl-binary-distribution)")
    return ForwardType.OPENCL


def tuned_net() -> aiomnn.Interpreter:
    """Two convs and their activations at a fixed shape: ops whose local sizes OpenCL tunes."""
    from .test_tuning import _model

    return aiomnn.Interpreter.from_bytes(_model())


TUNED_X = np.random.default_rng(1).standard_normal((1, 3, 12, 12)).astype(np.float32)


def _tuning_config(**kw) -> aiomnn.ScheduleConfig:
    return aiomnn.ScheduleConfig(type="opencl", backend_config=aiomnn.BackendConfig(tuning="fast"), num_threads=2,
                                 **kw)


def kinds(st: aiomnn.SessionStats) -> list[str]:
    return [e.kind for e in st.tuning_events]


async def test_tuning_in_the_background_is_started_finished_and_handed_off(opencl):
    from .test_tuning import Gate

    info = aiomnn.create_runtime(_tuning_config())
    gate = Gate()  # holds the job after its first op, so that a run lands on the CPU meanwhile
    info.runtimes[opencl].tuner.add_progress_callback(gate)
    try:
        session = await tuned_net().create_session(_tuning_config(), info)
        st = session.stats()
        assert st.tuning and kinds(st) == ["started"]
        await session.run({"x": TUNED_X})  # on the CPU backup, while tuning
        gate.release.set()
        await session.wait_async_resize()
        await session.run({"x": TUNED_X})  # on the GPU
        st = session.stats()
        assert not st.tuning and kinds(st) == ["started", "finished", "handoff"]
        times = [e.at for e in st.tuning_events]
        assert times == sorted(times)
        assert dict(st.runs_by_backend) == {ForwardType.CPU: 1, opencl: 1}
        await session.close()
        assert kinds(session.stats()) == ["started", "finished", "handoff"]  # nothing left to cancel
    finally:
        gate.release.set()
        info.close()


async def test_closing_a_tuning_session_notes_the_tuning_cancelled(opencl):
    from .test_tuning import Gate

    info = aiomnn.create_runtime(_tuning_config())
    gate = Gate()
    info.runtimes[opencl].tuner.add_progress_callback(gate)
    try:
        session = await tuned_net().create_session(_tuning_config(), info)
        job = session._tuning.job
        await session.close()
        gate.release.set()
        job.join(30)
        st = session.stats()
        assert kinds(st) == ["started", "cancelled"] and not st.tuning
    finally:
        gate.release.set()
        info.close()


async def test_a_crashing_tuning_job_is_noted_failed(opencl, monkeypatch):
    def broken(task, level, cancelled, gpu_clocks):
        raise RuntimeError("the device fell over")

    monkeypatch.setattr(tuning, "tune_task", broken)
    info = aiomnn.create_runtime(_tuning_config())
    try:
        async with await tuned_net().create_session(_tuning_config(), info) as session:
            await session.wait_async_resize()
            await session.run({"x": TUNED_X})
            st = session.stats()
            assert kinds(st) == ["started", "failed"] and "the device fell over" in st.tuning_events[-1].detail
            assert dict(st.runs_by_backend) == {ForwardType.CPU: 1}
    finally:
        info.close()


async def test_foreground_tuning_is_noted_too(opencl):
    info = aiomnn.create_runtime(_tuning_config(background_tuning=False))
    try:
        async with await tuned_net().create_session(_tuning_config(background_tuning=False), info) as session:
            await session.run({"x": TUNED_X})
            st = session.stats()
            assert kinds(st) == ["started", "finished"] and dict(st.runs_by_backend) == {opencl: 1}
    finally:
        info.close()


async def test_a_fallback_after_a_device_error_is_counted(opencl):
    from .test_faults import DriverFault

    config = aiomnn.ScheduleConfig(type="opencl", num_threads=2, fallback_on_error=True,
                                   backend_config=aiomnn.BackendConfig(tuning="none"))
    async with await tuned_net().create_session(config) as session:
        want = (await session.run({"x": TUNED_X}))["y"]
        with DriverFault(session.pipeline.main, "completion"):
            got = (await session.run({"x": TUNED_X}))["y"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
        st = session.stats()
        assert st.fallbacks == 1 and st.fallback_error is session.fallback_error is not None
        assert (st.runs, st.failed) == (2, 0)
        assert dict(st.runs_by_backend) == {opencl: 1, ForwardType.CPU: 1}  # the rerun counts on the backup
