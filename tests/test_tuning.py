"""Background GPU tuning with CPU fallback, end to end on each GPU backend (PoCL and lavapipe
here, CUDA where a GPU is), and the tuning cache.

The lifecycle: a session whose ops need tuning serves its first runs on the CPU while
one background job tunes; wait_async_resize() ends on the GPU; the results go to the
cache file, so a second runtime with that file starts on the GPU at once.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.util
import json
import logging
import os
import stat
import subprocess
import sys
import threading
import types

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import aiomnn
from aiomnn import clocks, tuning, tuning_cache
from aiomnn.config import ForwardType


@pytest.fixture
def anyio_backend():
    return "asyncio"


# The cache alone: no device needed ----------------------------------------------------------------
def test_cache_round_trip_is_atomic_and_private(tmp_path):
    path = tmp_path / "cache.json"
    cache = tuning_cache.TuningCache("dev A")
    cache.load(str(path))
    cache.put("k1", [8, 8, 1], 12e-6)
    cache.save()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    doc = json.loads(path.read_text())
    assert doc["schema"] == tuning_cache.SCHEMA and doc["version"] == tuning_cache.VERSION
    assert doc["devices"]["dev A"]["k1"]["choice"] == [8, 8, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.json", "cache.json.lock"]  # no temporary file

    other = tuning_cache.TuningCache("dev B")  # another device keeps dev A's entries when it writes
    other.load(str(path))
    assert "k1" not in other
    other.put("k2", None, None)
    other.save()
    again = tuning_cache.TuningCache("dev A")
    again.load(str(path))
    assert again.get("k1")["choice"] == [8, 8, 1] and "k2" not in again


def test_caches_sharing_a_file_keep_each_others_entries(tmp_path):
    """Runtimes (or processes) that tune at once and save to one file: every entry survives."""
    path = str(tmp_path / "cache.json")
    caches = [tuning_cache.TuningCache("dev A" if i % 2 else "dev B") for i in range(8)]
    for i, cache in enumerate(caches):
        cache.load(path)  # all load the same (absent) file, then tune different keys
        cache.put(f"k{i}", i, 1e-6)
    threads = [threading.Thread(target=c.save) for c in caches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for device in ("dev A", "dev B"):
        merged = tuning_cache.TuningCache(device)
        merged.load(path)
        keys = [f"k{i}" for i in range(8) if (i % 2 == 1) == (device == "dev A")]
        assert len(merged) == 4 and all(k in merged for k in keys)
    mine = tuning_cache.TuningCache("dev A")  # a newer result for a key replaces the file's
    mine.load(path)
    mine.put("k1", "better", 1e-7)
    mine.save()
    again = tuning_cache.TuningCache("dev A")
    again.load(path)
    assert again.get("k1")["choice"] == "better" and "k3" in again


@pytest.mark.parametrize("content", [b"{not json", b'{"schema": "aiomnn-tuning-cache", "version": 1, "devi',
                                     b'{"schema": "someone-else", "version": 1, "devices": {}}',
                                     b'{"schema": "aiomnn-tuning-cache", "version": 99, "devices": {}}',
                                     b'{"schema": "aiomnn-tuning-cache", "version": 1, "devices": {"d": {"k": 3}}}',
                                     b"\xff\xfe\x00", b"[]"],
                         ids=["garbage", "truncated", "foreign", "future", "malformed", "binary", "list"])
def test_bad_cache_is_ignored_with_a_warning_and_rewritten(tmp_path, caplog, content):
    path = tmp_path / "cache.json"
    path.write_bytes(content)
    cache = tuning_cache.TuningCache("dev")
    with caplog.at_level(logging.WARNING, logger="aiomnn.tuning"):
        cache.load(str(path))
    assert len(cache) == 0
    assert any("ignoring the tuning cache" in r.getMessage() for r in caplog.records)
    cache.save()  # rewritten even before anything new is tuned
    assert json.loads(path.read_text())["schema"] == tuning_cache.SCHEMA


# The lifecycle on OpenCL --------------------------------------------------------------------------
@pytest.fixture(params=["opencl", "vulkan", "cuda"])
def kind(request, monkeypatch) -> ForwardType:
    """Each GPU backend found here; CPU devices (PoCL, lavapipe) count, and tune like GPUs."""
    from aiomnn.runtime import probe

    kind = ForwardType(request.param)
    if not probe(kind):
        pytest.skip(f"no {kind} device here")
    monkeypatch.setenv("AIOMNN_VULKAN_TUNE_CPU", "1")
    return kind


def _model() -> bytes:
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((4, 8, 1, 1)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["b"]),
             helper.make_node("Sigmoid", ["b"], ["y"])]
    graph = helper.make_graph(nodes, "tune", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _reference(x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    model = _model()
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _config(kind: ForwardType, **kw) -> aiomnn.ScheduleConfig:
    return aiomnn.ScheduleConfig(type=kind, backend_config=aiomnn.BackendConfig(tuning="fast"), num_threads=2, **kw)


class Gate:
    """A progress callback that holds the tuning job after its first task until released."""

    def __init__(self):
        self.release = threading.Event()
        self.reports: list[tuning.Progress] = []

    def __call__(self, progress: tuning.Progress) -> None:
        self.reports.append(progress)
        self.release.wait(60)


X = np.random.default_rng(1).standard_normal((1, 3, 12, 12)).astype(np.float32)


@contextlib.contextmanager
def _gated(kind: ForwardType):
    """The test model, its config, a runtime, and a Gate that holds the runtime's tuning job; at the block's end
    the gate opens and the runtime closes."""
    net = aiomnn.Interpreter.from_bytes(_model())
    config = _config(kind)
    info = aiomnn.create_runtime(config)
    gate = Gate()
    info.runtimes[kind].tuner.add_progress_callback(gate)
    try:
        yield net, config, info, gate
    finally:
        gate.release.set()
        info.close()


@pytest.mark.anyio
async def test_cpu_first_then_gpu_then_warm_cache(kind, tmp_path):
    pytest.importorskip("onnxruntime")
    want = _reference(X)
    path = tmp_path / "tuning.json"
    with _gated(kind) as (net, config, info, gate):
        info.set_cache_file(path)
        session = await net.create_session(config, info)
        assert session.has_async_work()
        out = await session.run({"x": X})  # served at once, on the CPU
        assert session.backend_types == [ForwardType.CPU]
        assert session.has_async_work()
        np.testing.assert_allclose(out["y"], want, rtol=1e-4, atol=1e-5)

        gate.release.set()
        await session.wait_async_resize()
        assert not session.has_async_work()
        assert session.backend_types == [kind]
        out = await session.run({"x": X})
        assert session.backend_types == [kind]
        np.testing.assert_allclose(out["y"], want, rtol=1e-4, atol=1e-5)
        assert gate.reports and gate.reports[-1].done == gate.reports[-1].total
        await session.close()

    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    doc = json.loads(path.read_text())
    (entries,) = doc["devices"].values()
    assert len(entries) == 2 and all(e["choice"] is not None for e in entries.values())

    # A fresh process with the warm cache goes straight to the GPU.
    code = (
        "import asyncio, sys, aiomnn, numpy as np\n"
        "async def main():\n"
        f"    config = aiomnn.ScheduleConfig(type='{kind}', backend_config=aiomnn.BackendConfig(tuning='fast'))\n"
        "    info = aiomnn.create_runtime(config)\n"
        "    info.set_cache_file(sys.argv[1])\n"
        "    net = aiomnn.Interpreter.from_bytes(open(sys.argv[2], 'rb').read())\n"
        "    s = await net.create_session(config, info)\n"
        "    busy, types = s.has_async_work(), [t.value for t in s.backend_types]\n"
        "    await s.run({'x': np.zeros((1, 3, 12, 12), np.float32)})\n"
        "    print(busy, types, [t.value for t in s.backend_types])\n"
        "    await s.close(); info.close()\n"
        "asyncio.run(main())\n")
    (tmp_path / "model.onnx").write_bytes(_model())
    done = subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "model.onnx")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == f"False ['{kind}'] ['{kind}']"

    # So does a fresh runtime in this process.
    info = aiomnn.create_runtime(config)
    info.set_cache_file(path)
    try:
        session = await net.create_session(config, info)
        assert not session.has_async_work()
        assert session.backend_types == [kind]
        out = await session.run({"x": X})
        assert session.backend_types == [kind]
        np.testing.assert_allclose(out["y"], want, rtol=1e-4, atol=1e-5)
        await session.wait_async_resize()  # nothing to wait for
        await session.close()
    finally:
        info.close()


@pytest.mark.anyio
async def test_corrupt_cache_is_ignored_and_rewritten(kind, tmp_path, caplog):
    path = tmp_path / "tuning.json"
    path.write_text('{"schema": "aiomnn-tuning-cache", "version": 1, "devices": {"x": ')
    net = aiomnn.Interpreter.from_bytes(_model())
    config = _config(kind)
    info = aiomnn.create_runtime(config)
    try:
        with caplog.at_level(logging.WARNING, logger="aiomnn.tuning"):
            info.set_cache_file(path)
        assert any("ignoring the tuning cache" in r.getMessage() for r in caplog.records)
        session = await net.create_session(config, info)
        assert session.has_async_work()
        await session.wait_async_resize()
        assert session.backend_types == [kind]
        await session.close()
    finally:
        info.close()
    doc = json.loads(path.read_text())
    assert doc["schema"] == tuning_cache.SCHEMA and len(next(iter(doc["devices"].values()))) == 2


@pytest.mark.anyio
async def test_sessions_share_one_tuning_job(kind, tmp_path):
    with _gated(kind) as (net, config, info, gate):
        tuner = info.runtimes[kind].tuner
        first = await net.create_session(config, info)
        second = await net.create_session(config, info)
        assert first._tuning.job is second._tuning.job  # one job per runtime
        await first.close()  # the other session still waits: the job goes on
        assert not second._tuning.job.cancelled.is_set()
        gate.release.set()
        await second.wait_async_resize()
        assert second.backend_types == [kind] and len(tuner.cache) == 2
        await second.close()


@pytest.mark.anyio
async def test_closing_the_session_cancels_tuning(kind, tmp_path):
    with _gated(kind) as (net, config, info, gate):
        info.set_cache_file(tmp_path / "tuning.json")
        tuner = info.runtimes[kind].tuner
        session = await net.create_session(config, info)
        assert session.has_async_work()
        job = session._tuning.job
        await session.close()
        assert job.cancelled.is_set()
        gate.release.set()
        job.join(30)
        assert job.done and not job.succeeded
        assert len(tuner.cache) < 2  # it stopped before the second op


@pytest.mark.anyio
async def test_closing_the_runtime_cancels_tuning(kind, tmp_path):
    with _gated(kind) as (net, config, info, gate):
        session = await net.create_session(config, info)
        job = session._tuning.job
        threading.Timer(0.5, gate.release.set).start()
        info.close()  # cancels, and waits for the job's thread
        assert job.done and job.cancelled.is_set()
        gate.release.set()
        await session.close()


@pytest.mark.anyio
async def test_foreground_tuning_resizes_straight_onto_the_gpu(kind, tmp_path):
    net = aiomnn.Interpreter.from_bytes(_model())
    config = _config(kind, background_tuning=False)
    info = aiomnn.create_runtime(config)
    info.set_cache_file(tmp_path / "tuning.json")
    try:
        session = await net.create_session(config, info)
        assert not session.has_async_work()
        assert session.backend_types == [kind]
        assert len(info.runtimes[kind].tuner.cache) == 2
        await session.close()
    finally:
        info.close()
    assert (tmp_path / "tuning.json").exists()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", pytest.param("trio", marks=pytest.mark.skipif(
    importlib.util.find_spec("trio") is None, reason="trio is not installed"))])
async def test_max_tuning_number_caps_the_ops_tuned(kind, tmp_path, anyio_backend):
    net = aiomnn.Interpreter.from_bytes(_model())
    config = _config(kind, max_tuning_number=1)
    info = aiomnn.create_runtime(config)
    try:
        session = await net.create_session(config, info)
        await session.wait_async_resize()
        assert session.backend_types == [kind]  # the untuned op runs with its default local size
        cache = info.runtimes[kind].tuner.cache
        entries = [cache.get(k) for k in list(cache._entries)]
        assert sum(e["us"] is not None for e in entries) == 1  # one op was timed
        assert len(entries) > 1  # the others keep their default, recorded so a warm cache needs no tuning
        await session.close()
    finally:
        info.close()


@pytest.mark.anyio
async def test_the_costliest_ops_are_tuned_first(monkeypatch):
    """Past max_tuning_number, the ops that cost the most are the ones tuned, wherever they are in the graph: here
    a 3x3 conv after a Relu of 32 values (on Vulkan, whose tuning tasks carry their cost)."""
    from aiomnn.runtime import probe

    if not probe(ForwardType.VULKAN):
        pytest.skip("no Vulkan device here")
    monkeypatch.setenv("AIOMNN_VULKAN_TUNE_CPU", "1")
    w = (np.random.default_rng(0).standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["y1"]), helper.make_node("Conv", ["z", "w"], ["y2"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "cost", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4]),
                                              helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 3, 12, 12])],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, None) for y in ("y1", "y2")],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    config = _config(ForwardType.VULKAN, max_tuning_number=1)
    info = aiomnn.create_runtime(config)
    try:
        async with await aiomnn.Interpreter.from_bytes(model).create_session(config, info) as session:
            await session.wait_async_resize()
            cache = info.runtimes[ForwardType.VULKAN].tuner.cache
            timed = {k.split("@")[0]: cache.get(k)["us"] is not None for k in list(cache._entries)}
        convs = [k for k in timed if k.startswith("vulkan/conv")]
        assert timed.get("vulkan/unary") is False and len(convs) == 1 and timed[convs[0]], timed
    finally:
        info.close()


def test_a_job_prepares_every_task_before_timing_the_first(tmp_path):
    """Compiles start for all tasks at once, and timing waits until they are done, then runs back to back (the
    device would idle through each task's compiles otherwise, and its clocks fall). Cancelling stops the wait."""
    events = []
    compiles = []

    class Task:
        def __init__(self, key):
            self.key = self.label = key

        def candidates(self, limit):
            return ["a", "b"][:limit]

        def prepare(self, limit):
            events.append(("prepare", self.key, limit))
            compiles.append(concurrent.futures.Future())
            return compiles[-1:]

        @contextlib.contextmanager
        def timer(self):
            yield lambda candidate, samples: events.append(("time", self.key, candidate)) or 1e-6

    def finish():
        events.append(("compiled",))
        for f in compiles:
            f.set_result(None)

    tuner = tuning.Tuner("fake device", "fake", gpu=False)
    tuner.set_cache_file(str(tmp_path / "cache.json"))
    threading.Timer(0.2, finish).start()
    tuner.run_now([Task("t1"), Task("t2")], tuning.Level(2, 1), threading.Event())
    assert events[:3] == [("prepare", "t1", 2), ("prepare", "t2", 2), ("compiled",)]
    assert [e[1] for e in events[3:]] == ["t1", "t1", "t2", "t2"]

    cancelled = threading.Event()
    threading.Timer(0.2, cancelled.set).start()
    with pytest.raises(tuning.TuningCancelled):  # its compiles never end
        tuner.run_now([Task("t3")], tuning.Level(2, 1), cancelled)


def test_a_cold_gpu_is_kept_busy_until_its_clocks_are_up(monkeypatch):
    """Before timing anything on a GPU that has idled, the job times one candidate in long batches until its time
    stops falling. Here a fake device whose clocks step up after 0.6 s of it (an H100's did), on a fake clock."""
    now = [0.0]
    monkeypatch.setattr(clocks, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    batches = []

    def measure(candidate, samples):
        batches.append(samples)
        now[0] += 0.01
        return 100e-6 if now[0] < 0.6 else 20e-6

    gpu = clocks.Clocks(gpu=True)
    gpu.warm(measure, "default", threading.Event())
    assert batches[0] == 1 and batches[1] == round(clocks.Clocks.BATCH_S / 100e-6)  # batches of about 5 ms
    assert 0.6 + clocks.Clocks.SETTLED_S <= now[0] < clocks.Clocks.MOST_S  # past the step, then settled
    n = len(batches)
    gpu.warm(measure, "default", threading.Event())  # timed moments ago: still warm
    now[0] += clocks.Clocks.IDLE_S
    clocks.Clocks(gpu=False).warm(measure, "default", threading.Event())  # a CPU device has no such governor
    assert len(batches) == n
    gpu.warm(measure, "default", threading.Event())  # idle for long enough: cold again
    assert len(batches) > n

    def failing(candidate, samples):
        if samples > 1:
            raise RuntimeError("the device fell over")
        return 1e-4

    now[0] += clocks.Clocks.IDLE_S
    gpu.warm(failing, "default", threading.Event())  # no error escapes: timing the candidate meets it again


@pytest.mark.anyio
@pytest.mark.parametrize("room", [True, False])
async def test_vulkan_times_large_launches_with_cold_caches(monkeypatch, room):
    """On a GPU, a launch of COLD_ABOVE bytes or more is timed with a buffer written before each timed dispatch;
    where the device has no room for that buffer, the launch is timed warm, and tuning goes on. Here on lavapipe
    passed off as a GPU, with every launch counted large and a 1 MB buffer."""
    import dataclasses

    from aiomnn.runtime import probe

    if not probe(ForwardType.VULKAN):
        pytest.skip("no Vulkan device here")
    from aiomnn.backends.vulkan import tune

    monkeypatch.setenv("AIOMNN_VULKAN_TUNE_CPU", "1")
    monkeypatch.setattr(tune, "COLD_ABOVE", 0)
    monkeypatch.setattr(tune, "FLUSH_BYTES", 1 << 20)
    config = _config(ForwardType.VULKAN)
    info = aiomnn.create_runtime(config)
    try:
        ctx = info.runtimes[ForwardType.VULKAN].ctx
        monkeypatch.setattr(ctx, "info", dataclasses.replace(ctx.info, is_gpu=True))
        made = []
        device_buffer = ctx.device_buffer

        def counted(size):
            if size == tune.FLUSH_BYTES:
                made.append(size)
                if not room:
                    raise MemoryError("no room for it")
            return device_buffer(size)

        monkeypatch.setattr(ctx, "device_buffer", counted)
        async with await aiomnn.Interpreter.from_bytes(_model()).create_session(config, info) as session:
            await session.wait_async_resize()
            assert session.backend_types == [ForwardType.VULKAN]
            async with await aiomnn.Interpreter.from_bytes(_model()).create_session(_config(ForwardType.CPU)) as cpu:
                want = await cpu.run({"x": X})
            got = await session.run({"x": X})
            np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-5)
        entries = info.runtimes[ForwardType.VULKAN].tuner.cache._entries
        assert made and sum(e["us"] is not None for e in entries.values()) >= len(made)
    finally:
        info.close()


@pytest.mark.anyio
async def test_a_crashing_tuning_job_leaves_the_session_on_the_cpu(kind, monkeypatch, caplog):
    def broken(task, level, cancelled, gpu_clocks):
        raise RuntimeError("the device fell over")

    monkeypatch.setattr(tuning, "tune_task", broken)
    net = aiomnn.Interpreter.from_bytes(_model())
    config = _config(kind)
    info = aiomnn.create_runtime(config)
    try:
        with caplog.at_level(logging.ERROR, logger="aiomnn.tuning"):
            session = await net.create_session(config, info)
            await session.wait_async_resize()
        assert not session.has_async_work()
        assert session.backend_types == [ForwardType.CPU]
        assert any("the device fell over" in r.getMessage() for r in caplog.records)
        await session.run({"x": X})
        assert session.backend_types == [ForwardType.CPU]
        await session.close()
    finally:
        info.close()


@pytest.mark.anyio
async def test_tuning_none_never_tunes(kind):
    net = aiomnn.Interpreter.from_bytes(_model())
    config = aiomnn.ScheduleConfig(type=kind, backend_config=aiomnn.BackendConfig(tuning="none"))
    info = aiomnn.create_runtime(config)
    try:
        session = await net.create_session(config, info)
        assert not session.has_async_work() and session.backend_types == [kind]
        assert len(info.runtimes[kind].tuner.cache) == 0
        await session.close()
    finally:
        info.close()


def test_cli_run_shows_tuning_progress_and_writes_the_cache(kind, tmp_path, capsys):
    from aiomnn.cli import main

    model, cache = tmp_path / "model.onnx", tmp_path / "tuning.json"
    model.write_bytes(_model())
    assert main(["run", str(model), "--backend", kind.value, "--tuning", "fast", "--cache", str(cache)]) == 0
    out, err = capsys.readouterr()
    assert "backend: cpu" in out and "runs are served on the CPU meanwhile" in out
    assert f"tuning done and saved to {cache}; backend: {kind.value}" in out
    assert "tuning [" in err and "2/2" in err
    assert len(next(iter(json.loads(cache.read_text())["devices"].values()))) == 2
    # Warm now: straight to the GPU, nothing to tune.
    assert main(["run", str(model), "--backend", kind.value, "--tuning", "fast", "--cache", str(cache)]) == 0
    out, err = capsys.readouterr()
    assert f"backend: {kind.value}" in out and "tuning" not in out + err
