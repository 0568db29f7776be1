"""A small recurrent model, shaped like silero-vad, on each backend against the CPU: streaming chunks, the state fed
back, as a voice-activity service runs it (issue 27: OpenCL must not be slower than its CPU backup here).

The model (built here with onnx.helper and random weights, the shapes of silero-vad's 16 kHz path): an If on the
sample rate around the whole network; in each branch an STFT as a strided Conv1d and its magnitude, four Conv1d +
Relu blocks, an LSTM of 128 over the chunk's one frame with the state handed in, and a Conv1d + Sigmoid head.
Every backend's outputs are checked against onnxruntime's on the first chunk. Where each session's segments run
is printed: a GPU backend leaves If (control flow) to its CPU backup, and with it the branches inside.

    python benchmarks/recurrent.py [--backends cpu,opencl,vulkan,cuda] [--chunks 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import aiomnn

HIDDEN = 128
CHUNK = 512


def _branch(name: str, rng: np.random.Generator, window: int) -> helper.GraphProto:
    """One sample rate's network: reads the outer `input` (1, CHUNK) and `state` (2, 1, HIDDEN)."""
    inits, nodes = [], []

    def weight(wname: str, *shape: int, scale: float = 0.1) -> str:
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), wname))
        return wname

    def const(cname: str, value) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), cname))
        return cname

    bins = window // 2 + 1
    nodes += [helper.make_node("Unsqueeze", ["input", const("ax1", np.array([1], np.int64))], ["x1"]),
              helper.make_node("Conv", ["x1", weight("stft", 2 * bins, 1, window)], ["spec"], strides=[window // 2]),
              helper.make_node("Split", ["spec", const("halves", np.array([bins, bins], np.int64))], ["re", "im"],
                               axis=1),
              helper.make_node("Mul", ["re", "re"], ["re2"]), helper.make_node("Mul", ["im", "im"], ["im2"]),
              helper.make_node("Add", ["re2", "im2"], ["pow"]), helper.make_node("Sqrt", ["pow"], ["mag"])]
    x, c = "mag", bins
    for i, (co, stride) in enumerate([(128, 1), (64, 2), (64, 2), (128, 1)]):
        nodes += [helper.make_node("Conv", [x, weight(f"e{i}w", co, c, 3), weight(f"e{i}b", co)], [f"e{i}"],
                                   pads=[1, 1], strides=[stride]),
                  helper.make_node("Relu", [f"e{i}"], [f"r{i}"])]
        x, c = f"r{i}", co
    nodes += [helper.make_node("ReduceMean", [x], ["feat"], axes=[2], keepdims=0),
              helper.make_node("Unsqueeze", ["feat", const("ax0", np.array([0], np.int64))], ["seq"]),
              helper.make_node("Split", ["state", const("hc", np.array([1, 1], np.int64))], ["h0", "c0"], axis=0),
              helper.make_node("LSTM", ["seq", weight("lw", 1, 4 * HIDDEN, HIDDEN), weight("lr", 1, 4 * HIDDEN, HIDDEN),
                                        weight("lb", 1, 8 * HIDDEN), "", "h0", "c0"], ["y", "yh", "yc"],
                               hidden_size=HIDDEN),
              helper.make_node("Concat", ["yh", "yc"], [f"{name}_state"], axis=0),
              helper.make_node("Squeeze", ["y", const("ax01", np.array([0, 1], np.int64))], ["h"]),
              helper.make_node("Relu", ["h"], ["hr"]),
              helper.make_node("Unsqueeze", ["hr", const("ax2", np.array([2], np.int64))], ["h3"]),
              helper.make_node("Conv", ["h3", weight("dw", 1, HIDDEN, 1), weight("db", 1)], ["logit"]),
              helper.make_node("Sigmoid", ["logit"], ["p"]),
              helper.make_node("Squeeze", ["p", const("ax2b", np.array([2], np.int64))], [f"{name}_out"])]
    outs = [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, None),
            helper.make_tensor_value_info(f"{name}_state", TensorProto.FLOAT, None)]
    return helper.make_graph(nodes, name, [], outs, inits)


def model() -> bytes:
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["rate16k"], value=numpy_helper.from_array(np.array(16000, np.int64))),
         helper.make_node("Equal", ["sr", "rate16k"], ["is16k"]),
         helper.make_node("If", ["is16k"], ["output", "stateN"], then_branch=_branch("k16", rng, 256),
                          else_branch=_branch("k8", rng, 128))],
        "vad", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, CHUNK]),
                helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, 1, HIDDEN]),
                helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("stateN", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def chunks(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [(rng.standard_normal((1, CHUNK)) * 0.3).astype(np.float32) for _ in range(n)]


async def stream(session, audio: list[np.ndarray]) -> tuple[float, dict]:
    """Median ms a chunk over the stream, the state handed back each time; and the first chunk's outputs."""
    state, sr, times, first = np.zeros((2, 1, HIDDEN), np.float32), np.array(16000, np.int64), [], None
    for chunk in audio:
        t = time.perf_counter()
        out = await session.run({"input": chunk, "state": state, "sr": sr})
        times.append(time.perf_counter() - t)
        state = out["stateN"]
        first = first or out
    return statistics.median(times) * 1e3, first


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", default="cpu,opencl,vulkan,cuda")
    p.add_argument("--chunks", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    import onnxruntime as ort

    data, audio = model(), chunks(args.chunks)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(
        None, {"input": audio[0], "state": np.zeros((2, 1, HIDDEN), np.float32), "sr": np.array(16000, np.int64)})
    net = aiomnn.Interpreter.from_bytes(data)
    sessions = {}
    for b in args.backends.split(","):
        config = aiomnn.ScheduleConfig(type=b, num_threads=args.threads,
                                       backend_config=aiomnn.BackendConfig(tuning="none"))
        try:
            s = await net.create_session(config)
        except aiomnn.AiomnnError as exc:
            print(f"{b}: skipped ({type(exc).__name__}: {exc})")
            continue
        await stream(s, audio[:20])  # warm: plans, compiled kernels
        where = [(seg.backend.type.value, len(seg.steps)) for seg in s.pipeline.segments]
        print(f"{b}: segments (backend, steps) {where}")
        sessions[b] = s
    times: dict[str, list[float]] = {b: [] for b in sessions}
    for _ in range(args.rounds):  # backends in turns, so that a slow spell of the machine hits them alike
        for b, s in sessions.items():
            ms, first = await stream(s, audio)
            times[b].append(ms)
            err = max(float(np.max(np.abs(first[k] - r))) for k, r in zip(("output", "stateN"), ref))
            assert err < 1e-4, f"{b}: differs from onnxruntime by {err:.2e}"
    cpu = statistics.median(times["cpu"]) if "cpu" in times else None
    print("| backend | ms a chunk (median of rounds) | rounds | / cpu |")
    print("|---|---|---|---|")
    for b, ts in times.items():
        ms = statistics.median(ts)
        rounds = ", ".join(f"{t:.3f}" for t in ts)
        print(f"| {b} | {ms:.3f} | {rounds} | {ms / cpu:.2f} |" if cpu else f"| {b} | {ms:.3f} | {rounds} | |")
    for s in sessions.values():
        await s.close()


if __name__ == "__main__":
    asyncio.run(main())
