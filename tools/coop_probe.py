"""conv_coop's split on one conv whose slices are told apart by their sums: x all ones, no padding, the weights 1
over k < 64 (slice 0 of two: 64) and 100 over k >= 64 (slice 1: 800), no bias. Each output should be 864;
what it is instead says which partial sums it took (the values and how many outputs hold each, per run).
    python3 tools/coop_probe.py   (on a device with cooperative matrices)"""
import asyncio
import collections

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import aiomnn
from aiomnn.backends.vulkan.launch import Convolution
from aiomnn.config import ForwardType

x = np.ones((1, 8, 11, 13), np.float32)
w = np.ones((19, 72), np.float32)
w[:, 64:] = 100
w = w.reshape(19, 8, 3, 3)
g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "c",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(w, "w")])
data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


async def main():
    config = aiomnn.ScheduleConfig(type="vulkan", backend_config=aiomnn.BackendConfig(tuning="none", precision="low"))
    info = aiomnn.create_runtime(config)
    rt = info.runtimes[ForwardType.VULKAN]
    for split in (1, 2):
        rt.tuned_choice = lambda la, *_: ["coop", 64, 64, split] if isinstance(la.work, Convolution) else None
        async with await aiomnn.Interpreter.from_bytes(data).create_session(config, info) as s:
            for i in range(3):
                y = (await s.run({"x": x}))["y"]
                print(f"split {split} run {i}:", collections.Counter(y.ravel().tolist()).most_common(6))
    info.close()


asyncio.run(main())
