"""Lifecycle (issue 25): nothing leaks, nothing crashes at exit, forks are safe, closed means ClosedError.

Each backend available here runs the same checks (CPU always; OpenCL on PoCL and Vulkan on lavapipe in CI;
CUDA on a GPU machine):
- many sessions dropped without close: threads, RSS and (Vulkan) devices come back near where they started,
  and each dropped session warned (ResourceWarning), as an unclosed file does;
- a child process that uses the backend and closes nothing exits with status 0 and nothing on stderr;
- a session made before os.fork() either works in the child (CPU) or raises ForkError there: never a hang.
Processes that exit or fork run as subprocesses, so pytest's own process never forks with threads running.
"""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest

import aiomnn
from aiomnn.cli import demo_model
from aiomnn.config import ForwardType
from aiomnn.runtime import probe

MODEL = demo_model(channels=4, classes=3)
X = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
#: Sessions dropped per backend, 1000 each: (on a shared runtime, on a runtime of their own). A runtime of its
#: own costs a device context and its programs built again (about 1.4 s each on PoCL here), so few do.
DROPS = {"cpu": (400, 600), "opencl": (992, 8), "vulkan": (980, 20), "cuda": (900, 100)}
#: How far RSS may grow over the last 4/5 of them, in MB. A device runtime's driver state (lavapipe's
#: compiled pipelines, say) leaves the allocator's heap a little larger each time, converging, and more so
#: late in the whole suite's process, whose heap thousands of tests have fragmented. The bound for GPU kinds
#: still sits far below the leak the issue reported, which grew by tens of MB a session
#: (benchmarks/RESULTS.md, "Dropped sessions").
RSS_BOUND = {"cpu": 25, "opencl": 150, "vulkan": 150, "cuda": 150}


def on(kinds):
    return [pytest.param(k, marks=pytest.mark.skipif(k != "cpu" and not probe(ForwardType(k)),
                                                      reason=f"no {k} device here")) for k in kinds]


ALL = on(["cpu", "opencl", "vulkan", "cuda"])
GPUS = on(["opencl", "vulkan", "cuda"])


def config(kind: str, **kw) -> aiomnn.ScheduleConfig:
    return aiomnn.ScheduleConfig(type=kind, num_threads=2, backend_config=aiomnn.BackendConfig(tuning="none"), **kw)


def native_threads() -> int:
    """Every thread of the process, those that drivers start outside Python's threading module included."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def live_vulkan_devices() -> int:
    """Vulkan runtimes whose device is still open (one waiter thread each)."""
    return sum(t.name == "aiomnn-vulkan-waiter" for t in threading.enumerate())


def settle(until, timeout: float = 10.0) -> None:
    """Collect, and give the reaper thread time to release what was collected, until `until()` holds."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        if until() or time.monotonic() > deadline:
            return
        time.sleep(0.05)


# Dropped sessions ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ALL)
def test_dropped_sessions_release_everything(kind):
    shared, owned = DROPS[kind]
    n = shared + owned
    net = aiomnn.Interpreter.from_bytes(MODEL)
    info = aiomnn.create_runtime(config(kind))

    async def one(close: bool, i: int = 0) -> None:
        s = await net.create_session(config(kind), None if i % max(1, n // max(1, owned)) == 0 else info)
        await s.run({"image": X})
        if close:
            await s.close()

    async def main() -> tuple[int, float, float]:
        await one(True)  # warm: imports, the driver, the kernel caches, the shared runtime's threads
        await one(True, 1)
        await one(False)
        settle(lambda: False, 0.2)
        threads, devices = native_threads(), live_vulkan_devices()
        start = time.monotonic()
        for i in range(n):
            await one(False, i)
            if i % 20 == 19:
                gc.collect()
            if i == n // 5:  # malloc's per-thread arenas grow over the first sessions, then RSS stays flat
                settle(lambda: False, 0.1)
                rss = rss_mb()
        seconds = time.monotonic() - start
        settle(lambda: native_threads() <= threads + 2 and live_vulkan_devices() <= devices)
        assert native_threads() <= threads + 2, (threads, native_threads())
        assert live_vulkan_devices() <= devices
        grew = rss_mb() - rss
        assert grew < RSS_BOUND[kind], f"RSS grew by {grew:.0f} MB over the last {n - n // 5} of {n} dropped {kind} sessions"
        return threads, grew, seconds

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        try:
            threads, grew, seconds = asyncio.run(main())
        finally:
            info.close()
        gc.collect()
    unclosed = [w for w in caught if issubclass(w.category, ResourceWarning) and "unclosed aiomnn session" in
                str(w.message)]
    assert len(unclosed) == n + 1, len(unclosed)
    print(f"{kind}: {n} dropped sessions ({owned} on a runtime of their own) in {seconds:.1f} s; threads back to {native_threads()} "
          f"(from {threads}), RSS +{grew:.0f} MB over the last {n - n // 5}")


def unclosed_cpu_session() -> aiomnn.Session:
    """A CPU session on a runtime of its own, run once and left open."""
    async def make():
        s = await aiomnn.Interpreter.from_bytes(MODEL).create_session(config("cpu"))
        await s.run({"image": X})
        return s

    return asyncio.run(make())


def test_an_unclosed_session_warns_and_releases_its_runtime():
    s = unclosed_cpu_session()
    info = s.runtime_info
    with pytest.warns(ResourceWarning, match="unclosed aiomnn session on cpu"):
        del s
        gc.collect()
    settle(lambda: info.closed)
    assert info.closed and info.cpu.closed


def test_an_unclosed_session_is_released_under_a_raising_warnings_filter(monkeypatch):
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    s = unclosed_cpu_session()
    info = s.runtime_info
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        del s
        gc.collect()
    assert [type(u.exc_value) for u in unraisable] == [ResourceWarning]
    settle(lambda: info.closed)
    assert info.closed


def test_cpu_pool_helpers_end_when_the_pool_is_dropped():
    from aiomnn.backends.cpu.threads import Pool

    def helpers() -> int:
        return sum(t.name == "aiomnn-cpu-helper" for t in threading.enumerate())

    before = helpers()
    pool = Pool(3)

    def work(i):
        time.sleep(0.005)

    with pool.running():
        pool.run(8, work)
    assert pool.helpers >= 1
    del pool
    settle(lambda: helpers() == before, 5)
    assert helpers() == before


# Exit ------------------------------------------------------------------------------------------------------
CHILD = """
import asyncio, sys
import numpy as np
import aiomnn
from aiomnn.cli import demo_model

kind, close = sys.argv[1], sys.argv[2] == "close"
config = aiomnn.ScheduleConfig(type=kind, num_threads=2, backend_config=aiomnn.BackendConfig(tuning="none"))
x = np.ones((1, 3, 64, 64), np.float32)

async def main():
    net = aiomnn.Interpreter.from_bytes(demo_model(channels=4, classes=3))
    info = aiomnn.create_runtime(config)
    s = await net.create_session(config, info)            # a shared runtime
    own = await net.create_session(config)                # one that made its own
    await s.run({"image": x})
    await own.run({"image": x})
    try:                                                  # a failed run
        await s.run({"image": np.ones((1, 3, 64), np.float32)})
    except aiomnn.InputError:
        pass
    task = asyncio.ensure_future(s.run({"image": x * 2}))  # a cancelled run
    await asyncio.sleep(0)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    await s.run({"image": x})
    if close:
        await s.close()
        await own.close()
        async with info:
            pass
    print("ok")

asyncio.run(main())
"""


@pytest.mark.parametrize("close", ["close", "open"])
@pytest.mark.parametrize("kind", ALL)
def test_child_process_exits_cleanly(kind, close):
    r = subprocess.run([sys.executable, "-c", CHILD, kind, close], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "ok"
    assert r.stderr == ""


# Fork ------------------------------------------------------------------------------------------------------
FORK = """
import asyncio, os, sys, time
import numpy as np
import aiomnn
from aiomnn.cli import demo_model

kind = sys.argv[1]
config = aiomnn.ScheduleConfig(type=kind, num_threads=2, backend_config=aiomnn.BackendConfig(tuning="none"))
x = np.ones((1, 3, 64, 64), np.float32)
net = aiomnn.Interpreter.from_bytes(demo_model(channels=4, classes=3))

async def make():
    s = await net.create_session(config)
    return s, (await s.run({"image": x}))["probs"]

s, want = asyncio.run(make())
# backends/cpu/jit.py compiles numba kernels on a background thread under a module lock that a fork can leave
# held in the child (not yet fork-safe): let it finish first.
from aiomnn.backends.cpu import jit
jit.wait(60)
pid = os.fork()
if pid == 0:
    try:
        got = asyncio.run(s.run({"image": x}))["probs"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        got = asyncio.run(s.run({"image": np.ones((2, 3, 64, 64), np.float32)}))["probs"]  # a new shape
        os._exit(0)
    except aiomnn.ForkError as exc:
        print("ForkError:", exc, flush=True)
        os._exit(3)
    except BaseException as exc:
        print("child failed:", type(exc).__name__, exc, flush=True)
        os._exit(1)
deadline = time.monotonic() + 30
while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    if time.monotonic() > deadline:
        os.kill(pid, 9)
        print("child hung")
        sys.exit(1)
    time.sleep(0.02)
code = os.waitstatus_to_exitcode(status)
print("child", code)
asyncio.run(s.run({"image": x}))  # the parent's session is untouched
asyncio.run(s.close())
"""


@pytest.mark.parametrize("kind", ALL)
def test_fork(kind):
    r = subprocess.run([sys.executable, "-c", FORK, kind], capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    if kind == "cpu":
        assert "child 0" in r.stdout, r.stdout  # CPU sessions work in the child
    else:
        assert "child 0" in r.stdout or "child 3" in r.stdout and "create the runtime" in r.stdout, r.stdout


# Closed (fault 4) ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ALL)
def test_closed_runtime_raises_closed_error(kind):
    net = aiomnn.Interpreter.from_bytes(MODEL)

    async def main():
        info = aiomnn.create_runtime(config(kind))
        s = await net.create_session(config(kind), info)
        await s.run({"image": X})
        info.close()
        with pytest.raises(aiomnn.ClosedError, match="runtime is closed"):
            await s.run({"image": X})  # the same shape
        with pytest.raises(aiomnn.ClosedError, match="runtime is closed"):
            await s.run({"image": np.concatenate([X, X])})  # a new shape
        with pytest.raises(aiomnn.ClosedError, match="runtime is closed"):
            await s.resize({"image": (3, 3, 64, 64)})
        with pytest.raises(aiomnn.ClosedError, match="runtime is closed"):
            await net.create_session(config(kind), info)
        with pytest.raises(aiomnn.ClosedError):
            info.runtime_for(config(kind))
        with pytest.raises(aiomnn.ClosedError):
            info.set_cache_file("x.json")
        await s.close()
        with pytest.raises(aiomnn.ClosedError, match="session is closed"):
            await s.run({"image": X})

    asyncio.run(main())


def test_runtime_info_is_a_context_manager():
    net = aiomnn.Interpreter.from_bytes(MODEL)
    with aiomnn.create_runtime(config("cpu")) as info:
        assert not info.closed
    assert info.closed and info.cpu.closed

    async def main():
        async with aiomnn.create_runtime(config("cpu")) as info:
            async with await net.create_session(config("cpu"), info) as s:
                await s.run({"image": X})
        assert info.closed
        with pytest.raises(aiomnn.ClosedError):
            await s.run({"image": X})

    asyncio.run(main())


def test_errors_are_exported():
    assert issubclass(aiomnn.ClosedError, aiomnn.AiomnnError)
    assert issubclass(aiomnn.ForkError, aiomnn.AiomnnError)


# Settings reach later runtimes (fault 5) --------------------------------------------------------------------
@pytest.mark.parametrize("kind", GPUS)
@pytest.mark.parametrize("when", ["before", "after"])
def test_runtime_settings_reach_backends_made_later(kind, when, tmp_path):
    seen = []
    path = tmp_path / "tuning.json"
    with aiomnn.create_runtime(aiomnn.ScheduleConfig(type="cpu")) as info:
        if when == "after":
            rt = info.runtime_for(config(kind))
        info.set_cache_file(path)
        info.add_tuning_callback(seen.append)
        if when == "before":
            rt = info.runtime_for(config(kind))  # made after the settings
        assert rt.type is ForwardType(kind)
        assert rt.cache_file == os.fspath(path)
        assert seen.append in rt.tuner._callbacks


TUNING_CHILD = """
import asyncio, sys, time
import numpy as np
import aiomnn
from aiomnn.cli import demo_model

kind, how, cache = sys.argv[1], sys.argv[2], sys.argv[3]
if how == "corrupt":
    open(cache, "w").write("{not json")
config = aiomnn.ScheduleConfig(type=kind, num_threads=2, backend_config=aiomnn.BackendConfig(tuning="fast"))
x = np.ones((1, 3, 64, 64), np.float32)

async def main():
    net = aiomnn.Interpreter.from_bytes(demo_model(channels=4, classes=3))
    info = aiomnn.create_runtime(config)
    info.set_cache_file(cache)
    if how == "in-flight":
        info.add_tuning_callback(lambda progress: time.sleep(0.2))  # keeps the job busy until exit
    s = await net.create_session(config, info)
    await s.run({"image": x})
    if how != "in-flight":
        await s.wait_async_resize()
        await s.run({"image": x})
    print("ok", s.has_async_work())

asyncio.run(main())
"""


@pytest.mark.parametrize("how", ["in-flight", "corrupt"])
@pytest.mark.parametrize("kind", GPUS)
def test_child_process_exits_cleanly_around_tuning(kind, how, tmp_path):
    """Tuning still running at exit; a corrupt cache, then tuning to its end: the exit is clean each time (an
    OpenCL process on NVIDIA aborted after its last line here, a pyopencl callback thread meeting the
    interpreter's teardown)."""
    env = dict(os.environ, AIOMNN_VULKAN_TUNE_CPU="1")
    r = subprocess.run([sys.executable, "-c", TUNING_CHILD, kind, how, str(tmp_path / "tuning.json")],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("ok")
    said = [line for line in r.stderr.splitlines() if not line.startswith("ignoring the tuning cache")]
    assert said == [], r.stderr  # the corrupt cache is named, once, and nothing else is said
