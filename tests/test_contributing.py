"""CONTRIBUTING.md's worked example of a backend, run as it is written: its code block becomes the package of
an existing forward type (Vulkan's slot in aiomnn.runtime.BACKEND_MODULES, which a new backend would add a
member for), and a model runs through it, its Relu on the toy backend and the rest on the CPU backup."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import numpy as np
from onnx import helper

import aiomnn
from aiomnn import runtime
from aiomnn.config import ForwardType
from tests.oracle import one_input_model

ROOT = Path(__file__).resolve().parent.parent


def _example() -> str:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text[text.index("## Adding a backend"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_worked_example_backend_runs_a_model(tmp_path, monkeypatch):
    (tmp_path / "toy_backend.py").write_text(_example())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(runtime.BACKEND_MODULES, ForwardType.VULKAN, "toy_backend")
    monkeypatch.setattr(runtime, "_probe_cache", {})
    data = one_input_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])],
                           (2, 5))
    x = np.linspace(-2, 2, 10, dtype=np.float32).reshape(2, 5)

    async def run() -> tuple[np.ndarray, list[str]]:
        net = aiomnn.Interpreter.from_bytes(data)
        rt = aiomnn.create_runtime(aiomnn.ScheduleConfig(type="vulkan"))
        try:
            async with await net.create_session(aiomnn.ScheduleConfig(type="vulkan"), rt) as session:
                y = (await session.run({"x": x}))["y"]
                return y, [type(s.backend).__name__ for s in session.pipeline.segments]
        finally:
            rt.close()

    y, backends = asyncio.run(run())
    np.testing.assert_array_equal(y, -np.maximum(x, 0))
    assert backends == ["ToyBackend", "CpuBackend"]  # the Relu on the toy backend, Neg on the backup
    sys.modules.pop("toy_backend", None)
