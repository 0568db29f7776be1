"""conv_coop's split sums on one conv (K = 72: S = 2 slices [0, 64) and [64, 72)): which partial sums the outputs hold.
    python3 tools/coop_debug.py   (on a device with cooperative matrices)"""
import asyncio

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import aiomnn
from aiomnn.backends.vulkan.launch import Convolution
from aiomnn.config import ForwardType

rng = np.random.default_rng(0)
x = rng.standard_normal((1, 8, 11, 13)).astype(np.float32)
w = rng.standard_normal((19, 8, 3, 3)).astype(np.float32)
b = rng.standard_normal(19).astype(np.float32)


def model(wt):
    g = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])], "c",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(wt, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


async def run(data, config, info=None):
    async with await aiomnn.Interpreter.from_bytes(data).create_session(config, info) as s:
        return [(await s.run({"x": x}))["y"] for _ in range(2)]


async def main():
    cpu = aiomnn.ScheduleConfig(type="cpu")
    flat = w.reshape(19, -1)
    s0, s1 = flat.copy(), flat.copy()
    s0[:, 64:] = 0
    s1[:, :64] = 0
    full = (await run(model(w), cpu))[0]
    p0 = (await run(model(s0.reshape(w.shape)), cpu))[0]
    p1 = (await run(model(s1.reshape(w.shape)), cpu))[0]
    bias = b.reshape(1, -1, 1, 1)
    refs = {"full": full, "slice0": p0, "slice1": p1, "bias": np.broadcast_to(bias, full.shape),
            "2*slice0-b": 2 * p0 - bias, "2*slice1-b": 2 * p1 - bias}
    config = aiomnn.ScheduleConfig(type="vulkan", backend_config=aiomnn.BackendConfig(tuning="none", precision="low"))
    info = aiomnn.create_runtime(config)
    rt = info.runtimes[ForwardType.VULKAN]
    for split in (1, 2):
        rt.tuned_choice = lambda la, *_: ["coop", 64, 64, split] if isinstance(la.work, Convolution) else None
        outs = await run(model(w), config, info)
        for i, got in enumerate(outs):
            errs = {k: float(np.linalg.norm(got - v) / np.linalg.norm(v)) for k, v in refs.items()}
            best = min(errs, key=errs.get)
            print(f"split {split} run {i}: nearest {best} ({errs[best]:.2e}); full {errs['full']:.2e}; "
                  f"rows wrong {np.nonzero(np.abs(got - full).max(axis=(0, 2, 3)) > 0.05)[0].tolist()}; "
                  f"got {got.flat[:3]} want {full.flat[:3]}")
    info.close()


asyncio.run(main())
