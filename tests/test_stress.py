"""Stress: sessions over two real models, many concurrent runs with random shapes and cancellations.

Every completed result must equal the sequential result bit for bit (within
1e-5 relative error, ||a - b|| / ||b||, through dynamic batching), and no run
may hang. CI runs a
scaled-down count; set AIOMNN_STRESS_RUNS=2000 for the full one.
"""

from __future__ import annotations

import contextlib
import os
import random

import anyio
import numpy as np
import pytest

import aiomnn

from .conftest import model_path

RUNS = int(os.environ.get("AIOMNN_STRESS_RUNS", "120"))
WIDTHS = {"rec": (160, 320, 96), "cls": (192, 96)}


def feed(name: str, seed: int) -> np.ndarray:
    width = WIDTHS[name][seed % len(WIDTHS[name])]
    return np.random.default_rng(seed).random((1, 3, 48, width), dtype=np.float32)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("batching", [False, True], ids=["plain", "batched"])
async def test_stress(anyio_backend, batching):
    nets = {name: aiomnn.Interpreter.from_file(model_path(name)) for name in WIDTHS}
    runtime = aiomnn.create_runtime([aiomnn.ScheduleConfig(type="cpu", num_threads=2)])
    config = aiomnn.ScheduleConfig(type="cpu")
    try:
        # Two sessions per model, four in all, sharing one runtime.
        sessions = [(name, await nets[name].create_session(config, runtime)) for name in WIDTHS for _ in range(2)]
        rng = random.Random(1)
        plan = [(rng.randrange(len(sessions)), rng.randrange(10**6), rng.random() < 0.15) for _ in range(RUNS)]
        results: dict[int, np.ndarray] = {}
        cancelled = 0

        async with contextlib.AsyncExitStack() as stack:
            batchers = []
            if batching:
                for k, (_, s) in enumerate(sessions):  # every other one runs two batches at once, on clones
                    batchers.append(await stack.enter_async_context(
                        aiomnn.BatchingSession(s, max_batch=4, max_delay_ms=2, workers=1 + k % 2)))

            async def one(i: int, k: int, seed: int, cancel: bool) -> None:
                nonlocal cancelled
                name, s = sessions[k]
                call = batchers[k].run if batching else s.run
                with anyio.move_on_after(0.002 if cancel else 600) as scope:
                    out = await call({"x": feed(name, seed)})
                    results[i] = next(iter(out.values()))
                if scope.cancelled_caught:
                    assert cancel, "a run without a deadline was cancelled: it hung"
                    cancelled += 1

            with anyio.fail_after(900):
                async with anyio.create_task_group() as tg:
                    for i, (k, seed, cancel) in enumerate(plan):
                        tg.start_soon(one, i, k, seed, cancel)

        # The sequential truth, on a fresh session per model.
        check = {name: await nets[name].create_session(config, runtime) for name in WIDTHS}
        for i, out in results.items():
            k, seed, _ = plan[i]
            name = sessions[k][0]
            want = next(iter((await check[name].run({"x": feed(name, seed)})).values()))
            if batching:  # a batch sums in another order: relative error as everywhere, ||a - b|| / ||b||
                err = np.linalg.norm(out - want) / np.linalg.norm(want)
                assert err <= 1e-5, f"run {i}: batched result off by {err:.2e}"
            else:
                np.testing.assert_array_equal(out, want)
        assert len(results) + cancelled == RUNS
        assert len(results) >= RUNS // 2
        for s in list(check.values()) + [s for _, s in sessions]:
            await s.close()
    finally:
        runtime.close()
