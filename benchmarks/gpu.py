"""GPU benchmark: aiomnn on CUDA, OpenCL and Vulkan against torch eager and torch.compile(mode="reduce-overhead").

For each public model at batch 1 and 8 it prints median milliseconds per run, and each backend's time
over CUDA's (and CUDA's over torch's):
- aiomnn on each GPU backend found here, fp32 and fp16 (precision="low"),
  `await session.run(numpy)`, numpy in and out; each session starts with a cold
  tuning cache, and the seconds its background tuning took are reported with the
  relative error against onnxruntime and how many steps ran on the device; the
  sessions of a model and batch are open together and timed in turns;
- on CUDA also with the input already on the GPU and the outputs left there (cupy in and out: device);
- torch eager and torch.compile with CUDA graphs, numpy in and out, and with the
  input already on the GPU (device); where fp16 is timed, torch.compile under float16 autocast too.
The torch models come from a small interpreter of the ONNX graph written here
(shape-only subgraphs are folded first by aiomnn's encode step), checked
against onnxruntime before timing.

Then the host cost of a run for a 300-op and a 30-op model (the 30-op one also with
its device time matched to the 300-op one's), and the latency an await adds for each
way of learning that the GPU finished (AIOMNN_CUDA_WAIT).

    python benchmarks/gpu.py [--backends cuda,opencl,vulkan] [--models det,cls] [--batches 1,8]
                             [--precisions fp32,fp16] [--tuning normal] [--no-compile] [--out DIR]
                             [--tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time

import numpy as np

import aiomnn
from aiomnn import models
from aiomnn.backends.cpu import jit
from aiomnn.config import BackendConfig, ScheduleConfig
from aiomnn.models import MODELS, sample_feeds
from aiomnn.pipeline import Pipeline


# --------------------------------------------------------------------------------------------
# ONNX -> torch, for the baseline only.


def onnx_to_torch(path, shapes, device="cuda"):
    """The model as a torch Module whose forward takes the inputs in the order of `shapes` (name -> shape)."""
    import torch
    import torch.nn.functional as F

    net = aiomnn.Interpreter.from_file(path)
    graph = net.graph
    rt = aiomnn.create_runtime(ScheduleConfig(type="cpu", num_threads=2))
    cpu = rt.cpu.new_backend(BackendConfig())
    p = Pipeline(graph, cpu, cpu)
    p.encode({k: tuple(v) for k, v in shapes.items()})
    consts = {k: np.asarray(t.const) for k, t in p.tensors.items() if t.is_const}
    rt.close()
    nodes = [n for n in graph.nodes if not all(not o or o in consts for o in n.outputs)]
    outputs = graph.output_names

    class Module(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = {}
            for n in nodes:
                for x in n.inputs:
                    if x and x in consts and consts[x].dtype.kind == "f" and x not in self.w:
                        self.w[x] = torch.from_numpy(np.array(consts[x])).to(device)
            # Constant parameters as Python values, so the traced forward touches no numpy.
            self.k = {}
            for n in nodes:
                self.k[id(n)] = {x: (float(consts[x].reshape(-1)[0]) if consts[x].dtype.kind == "f" and consts[x].size == 1
                                     else np.asarray(consts[x]).tolist())
                                 for x in n.inputs if x and x in consts and consts[x].size <= 64}
            self.sl = {}
            for n in nodes:
                if n.op_type == "Slice":
                    shp = p.tensors[n.inputs[0]].shape
                    i = n.inputs
                    starts = np.asarray(consts[i[1]]).tolist()
                    ends = np.asarray(consts[i[2]]).tolist()
                    axes = np.asarray(consts[i[3]]).tolist() if len(i) > 3 and i[3] else list(range(len(starts)))
                    steps = np.asarray(consts[i[4]]).tolist() if len(i) > 4 and i[4] else [1] * len(starts)
                    idx = [slice(None)] * len(shp)
                    for s0, e0, ax, st in zip(starts, ends, axes, steps):
                        if st < 0:
                            raise NotImplementedError("negative slice steps")
                        ax %= len(shp)
                        idx[ax] = slice(*slice(s0, e0, st).indices(shp[ax]))
                    self.sl[id(n)] = tuple(idx)
            self.idx = {id(n): torch.as_tensor(np.asarray(consts[n.inputs[1]]).reshape(-1), device=device)
                        for n in nodes if n.op_type == "Gather" and n.inputs[1] in consts}

        def forward(self, *inputs):
            env = dict(zip(shapes, inputs))

            def t(name):
                return env[name] if name in env else self.w[name]

            for n in nodes:
                a, i = dict(n.attrs), n.inputs
                kn = self.k[id(n)]

                def c(name, default=None, kn=kn):
                    return kn[name] if name and name in kn else default

                op = n.op_type
                if op == "Conv":
                    pads = list(a.get("pads", [0, 0, 0, 0]))
                    x = t(i[0])
                    if pads[0] != pads[2] or pads[1] != pads[3]:
                        x = F.pad(x, (pads[1], pads[3], pads[0], pads[2]))
                        pads = [0, 0, 0, 0]
                    y = F.conv2d(x, t(i[1]), t(i[2]) if len(i) > 2 and i[2] else None, tuple(a.get("strides", [1, 1])),
                                 (pads[0], pads[1]), tuple(a.get("dilations", [1, 1])), a.get("group", 1))
                elif op == "ConvTranspose":
                    pads = a.get("pads", [0, 0, 0, 0])
                    y = F.conv_transpose2d(t(i[0]), t(i[1]), t(i[2]) if len(i) > 2 and i[2] else None,
                                           tuple(a.get("strides", [1, 1])), (pads[0], pads[1]),
                                           tuple(a.get("output_padding", [0, 0])), a.get("group", 1),
                                           tuple(a.get("dilations", [1, 1])))
                elif op == "BatchNormalization":
                    y = F.batch_norm(t(i[0]), t(i[3]), t(i[4]), t(i[1]), t(i[2]), False, 0.0, a.get("epsilon", 1e-5))
                elif op in ("Add", "Sub", "Mul", "Div", "Pow"):
                    fn = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div, "Pow": torch.pow}[op]
                    y = fn(t(i[0]), t(i[1]))
                elif op == "Sqrt":
                    y = torch.sqrt(t(i[0]))
                elif op == "Erf":
                    y = torch.erf(t(i[0]))
                elif op == "Max":
                    y = torch.maximum(t(i[0]), t(i[1]))
                elif op == "LayerNormalization":
                    x = t(i[0])
                    y = F.layer_norm(x, x.shape[a.get("axis", -1):], t(i[1]), t(i[2]) if len(i) > 2 and i[2] else None,
                                     a.get("epsilon", 1e-5))
                elif op == "Clip":
                    lo = c(i[1]) if len(i) > 1 else a.get("min")
                    hi = c(i[2]) if len(i) > 2 else a.get("max")
                    y = torch.clamp(t(i[0]), None if lo is None else float(lo), None if hi is None else float(hi))
                elif op == "Relu":
                    y = F.relu(t(i[0]))
                elif op == "Sigmoid":
                    y = torch.sigmoid(t(i[0]))
                elif op == "HardSigmoid":
                    y = torch.clamp(t(i[0]) * a.get("alpha", 0.2) + a.get("beta", 0.5), 0.0, 1.0)
                elif op == "HardSwish":
                    y = F.hardswish(t(i[0]))
                elif op == "GlobalAveragePool":
                    y = torch.mean(t(i[0]), dim=(2, 3), keepdim=True)
                elif op == "AveragePool":
                    pads = a.get("pads", [0, 0, 0, 0])
                    y = F.avg_pool2d(t(i[0]), a["kernel_shape"], a.get("strides", a["kernel_shape"]), (pads[0], pads[1]),
                                     bool(a.get("ceil_mode", 0)), bool(a.get("count_include_pad", 0)))
                elif op == "MaxPool":
                    pads = a.get("pads", [0, 0, 0, 0])
                    y = F.max_pool2d(t(i[0]), a["kernel_shape"], a.get("strides", a["kernel_shape"]), (pads[0], pads[1]),
                                     tuple(a.get("dilations", [1, 1])), bool(a.get("ceil_mode", 0)))
                elif op == "Resize":
                    out_hw = tuple(p.tensors[n.outputs[0]].shape[2:])
                    mode = a.get("mode", "nearest")
                    ctm = a.get("coordinate_transformation_mode", "half_pixel")
                    if mode == "nearest" and ctm == "asymmetric" and a.get("nearest_mode") == "floor":
                        y = F.interpolate(t(i[0]), size=out_hw, mode="nearest")
                    elif mode == "linear" and ctm in ("half_pixel", "align_corners"):
                        y = F.interpolate(t(i[0]), size=out_hw, mode="bilinear", align_corners=ctm == "align_corners")
                    else:
                        raise NotImplementedError(f"Resize {mode}/{ctm}")
                elif op == "Concat":
                    y = torch.cat([t(x) for x in i if x], dim=a["axis"])
                elif op == "Split":
                    sizes = [p.tensors[o].shape[a.get("axis", 0)] for o in n.outputs]
                    y = tuple(torch.split(t(i[0]), sizes, dim=a.get("axis", 0)))
                elif op == "Slice":
                    y = t(i[0])[self.sl[id(n)]]
                elif op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
                    y = t(i[0]).reshape(p.tensors[n.outputs[0]].shape)
                elif op == "Transpose":
                    x = t(i[0])
                    y = x.permute(*a.get("perm", list(range(x.dim()))[::-1]))
                elif op == "ReduceMean":
                    axes = a.get("axes") or (c(i[1]) if len(i) > 1 else None)
                    y = torch.mean(t(i[0]), dim=tuple(axes), keepdim=bool(a.get("keepdims", 1)))
                elif op in ("ReduceSum", "ReduceL2"):
                    axes = a.get("axes") or (c(i[1]) if len(i) > 1 else None)
                    fn = torch.sum if op == "ReduceSum" else torch.linalg.vector_norm
                    y = fn(t(i[0]), dim=tuple(axes), keepdim=bool(a.get("keepdims", 1)))
                elif op == "MatMul":
                    y = torch.matmul(t(i[0]), t(i[1]))
                elif op == "Gemm":
                    A, B = t(i[0]), t(i[1])
                    A = A.t() if a.get("transA", 0) else A
                    B = B.t() if a.get("transB", 0) else B
                    y = a.get("alpha", 1.0) * (A @ B)
                    if len(i) > 2 and i[2]:
                        y = y + a.get("beta", 1.0) * t(i[2])
                elif op == "Softmax":
                    x = t(i[0])
                    axis = a.get("axis", 1 if n.opset < 13 else -1) % x.dim()
                    if n.opset < 13 and axis != x.dim() - 1:
                        y = F.softmax(x.reshape(*x.shape[:axis], -1), -1).reshape(x.shape)
                    else:
                        y = F.softmax(x, axis)
                elif op == "Cast":
                    y = t(i[0]).to({1: torch.float32, 7: torch.int64, 6: torch.int32}[a["to"]])
                elif op in ("Identity", "Dropout"):
                    y = t(i[0])
                elif op == "Expand":
                    x = t(i[0])
                    y = x.expand(tuple(p.tensors[n.outputs[0]].shape))
                elif op == "Gather" and id(n) not in self.idx:  # indices from an input: an embedding lookup
                    y = torch.index_select(t(i[0]), a.get("axis", 0), t(i[1]).reshape(-1)).reshape(
                        p.tensors[n.outputs[0]].shape)
                elif op == "Gather":
                    y = torch.index_select(t(i[0]), a.get("axis", 0), self.idx[id(n)]).reshape(p.tensors[n.outputs[0]].shape)
                else:
                    raise NotImplementedError(op)
                if isinstance(y, tuple):
                    for o, v in zip(n.outputs, y):
                        env[o] = v
                else:
                    env[n.outputs[0]] = y
            return tuple(env[o] for o in outputs)

    return Module().eval()


# --------------------------------------------------------------------------------------------
# Timing.


def median_ms(samples):
    return statistics.median(samples) * 1e3


#: Untimed runs before each measurement, the same for every contender: aiomnn's CUDA and Vulkan waiters
#: learn each run's duration over the first runs, and GPU clocks ramp up.
WARMUP = 20


def time_sync(fn, n, warmup=WARMUP):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return median_ms(out)


async def time_async(fn, n, warmup=WARMUP):
    await asyncio.to_thread(jit.wait)  # as time_in_turns
    for _ in range(warmup):
        await fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t0)
    return median_ms(out)


def rel_error(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


#: aiomnn's sessions of one model and batch are timed in turns, TURN runs each (after TURN_WARMUP untimed ones),
#: the order reversed every other round: every contender sees the same spells of a noisy host and of GPU clocks.
#: Timed one after the other, a ratio between backends moved by up to 0.2 from call to call on H100s (cls b1
#: 1.43 -> 1.60, det b1 1.35 -> 1.55).
TURN = 10
TURN_WARMUP = 3
#: aiomnn's precisions: (BackendConfig.precision, the benchmark's tag).
PRECISIONS = (("normal", "fp32"), ("low", "fp16"))


async def open_aiomnn(stack, name, shape, backend, precision, tuning, cache_dir):
    """A session on one backend, tuned and warmed up, and what its setup measured. With tuning on, the cache
    starts cold: the first resize serves on the CPU while the runtime tunes, and tune_s is the time until the
    session is on the GPU."""
    net = aiomnn.Interpreter.from_file(models.path(name))
    feeds = sample_feeds(name, shape)
    cfg = ScheduleConfig(type=backend, backend_config=BackendConfig(precision=precision, tuning=tuning))
    rt = aiomnn.create_runtime(cfg)
    stack.callback(rt.close)
    rt.set_cache_file(os.path.join(cache_dir, f"{backend}-{name}-{shape[0]}-{precision}.json"))
    t0 = time.perf_counter()
    s = await stack.enter_async_context(await net.create_session(cfg, runtime=rt))
    await s.resize({k: v.shape for k, v in feeds.items()})
    t_resize = time.perf_counter() - t0
    t1 = time.perf_counter()
    tuned = s.has_async_work()
    await s.wait_async_resize()
    tune_s = time.perf_counter() - t1 if tuned else 0.0
    out = await s.run(feeds)
    for _ in range(WARMUP):
        await s.run(feeds)
    steps = [st for seg in s.pipeline.segments for st in seg.steps]
    on_device = sum(st.backend is s.pipeline.main for st in steps)
    opened = {"session": s, "run": lambda: s.run(feeds), "resize_s": t_resize, "tune_s": tune_s, "out": out,
              "summary": dict(getattr(s.pipeline.main, "summary", {})), "on_device": f"{on_device}/{len(steps)}"}
    if backend == "cuda":  # also with the input on the device and the outputs left there (cupy in and out)
        import cupy

        dev_feeds = {k: cupy.asarray(v) for k, v in feeds.items()}
        opened["run_dev"] = lambda: s.run(dev_feeds, device_outputs=True)
    return opened


async def time_in_turns(runs: dict, n: int) -> dict:
    """Median ms of each contender (name -> async run), at least n timed runs each, timed in turns (TURN). First
    numba's background compiles end: the CPU backup's kernels compile while a GPU session serves, and a compile
    holds the GIL, slowing the GPU runs' host work by a quarter (benchmarks/RESULTS.md, session 45)."""
    await asyncio.to_thread(jit.wait)
    samples = {k: [] for k in runs}
    order = list(runs)
    for r in range(max(1, -(-n // TURN))):
        for k in order if r % 2 == 0 else order[::-1]:
            for _ in range(TURN_WARMUP):
                await runs[k]()
            for _ in range(TURN):
                t0 = time.perf_counter()
                await runs[k]()
                samples[k].append(time.perf_counter() - t0)
    return {k: median_ms(v) for k, v in samples.items()}


#: The torch module of the last model and shape bench_torch timed.
_TORCH_MODELS: dict = {}


def bench_torch(name, shape, n, compile_, half=False):
    """torch's times: eager and compiled, numpy in and out and on the device; with half, the compiled model alone
    under autocast to float16 (convs and products in fp16, as torch users run half precision)."""
    import torch

    path = models.path(name)
    feeds = sample_feeds(name, shape)
    key = (path, tuple((k, v.shape) for k, v in feeds.items()))
    model = _TORCH_MODELS.get(key)
    if model is None:  # made once for the fp32 and the fp16 pass
        _TORCH_MODELS.clear()
        model = _TORCH_MODELS[key] = onnx_to_torch(path, {k: v.shape for k, v in feeds.items()})
    res = {}
    with torch.no_grad():
        xd = [torch.from_numpy(v).cuda() for v in feeds.values()]

        def e2e(m):
            return lambda: [o.cpu().numpy() for o in m(*[torch.from_numpy(v).cuda() for v in feeds.values()])]

        def dev(m):
            def go():
                m(*xd)
                torch.cuda.synchronize()
            return go

        cast = torch.autocast("cuda", torch.float16) if half else contextlib.nullcontext()
        with cast:
            ref = [o.float().cpu().numpy() for o in model(*xd)]
            if not half:
                res["eager"] = (time_sync(e2e(model), n), time_sync(dev(model), n))
            if compile_:
                t0 = time.perf_counter()
                cm = torch.compile(model, mode="reduce-overhead", dynamic=False)
                for _ in range(3):
                    cm(*xd)
                torch.cuda.synchronize()
                res["compile_s"] = time.perf_counter() - t0
                res["compile"] = (time_sync(e2e(cm), n), time_sync(dev(cm), n))
    return res, ref


def chain_model(n_ops, c=8, hw=16, upscale=1):
    """A chain of n_ops 3x3 convs, each followed by a Relu (fused): n_ops kernels.

    With upscale, the convs work on the input upscaled (nearest) and the chain ends in an average pool
    back to the input's size: more device time for the same ops, input and output.
    """
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    nodes, inits = [], []
    x = "x"
    if upscale > 1:
        inits.append(numpy_helper.from_array(np.array([1, 1, upscale, upscale], np.float32), "scales"))
        nodes.append(helper.make_node("Resize", ["x", "", "scales"], ["up"], mode="nearest"))
        x = "up"
    for k in range(n_ops):
        w = f"w{k}"
        inits.append(numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) * 0.2).astype(np.float32), w))
        nodes.append(helper.make_node("Conv", [x, w], [f"c{k}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{k}"], [f"r{k}"]))
        x = f"r{k}"
    if upscale > 1:
        nodes.append(helper.make_node("AveragePool", [x], ["down"], kernel_shape=[upscale] * 2, strides=[upscale] * 2))
        x = "down"
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, c, hw, hw))],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, (1, c, hw, hw))], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


async def host_cost(n=300):
    """Host cost of a run for a 30-op and a 300-op chain: the wall time of submit(), and the CPU time per
    run of the whole process and of the event-loop thread alone.

    The 30-op chain runs twice: as is, and balanced, on its input upscaled inside the model until its
    device time matches the 300-op chain's (same input and output). The host work after a longer idle
    wait runs slower (colder caches and clocks, whatever the op count), so only the balanced pair
    isolates the op count.
    """
    x = {"x": np.random.default_rng(0).random((1, 8, 16, 16), dtype=np.float32)}

    async def cost(ops, upscale):
        net = aiomnn.Interpreter.from_bytes(chain_model(ops, upscale=upscale))
        async with await net.create_session(ScheduleConfig(type="cuda", backend_config=BackendConfig(tuning="none"))) as s:
            be = s.pipeline.main
            submit_times = []
            orig = be.submit

            def timed(seg, values, device=False):
                t0 = time.perf_counter()
                f = orig(seg, values, device)
                submit_times.append(time.perf_counter() - t0)
                return f

            be.submit = timed
            for _ in range(20):
                await s.run(x)
            calls = [0]

            def count(frame, event, arg):
                if event in ("call", "c_call"):
                    calls[0] += 1

            sys.setprofile(count)  # Python and C calls of one run on the loop thread: deterministic
            await s.run(x)
            sys.setprofile(None)
            submit_times.clear()
            c0, t0 = time.process_time(), time.thread_time()
            wall = await time_async(lambda: s.run(x), n, warmup=0)
            cpu, loop_cpu = (time.process_time() - c0) / n, (time.thread_time() - t0) / n
            return {"upscale": upscale, "kernels": be.summary["launches"], "calls": calls[0],
                    "device_us": graph_time_us(be),
                    "submit_us": statistics.median(submit_times) * 1e6, "cpu_us_per_run": cpu * 1e6,
                    "loop_cpu_us_per_run": loop_cpu * 1e6, "wall_ms": wall}

    out = {"300": await cost(300, 1), "30": await cost(30, 1)}
    target = out["300"]["device_us"]
    best = None
    for up in (2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48):  # the upscale at which 30 ops take as long on the device
        net = aiomnn.Interpreter.from_bytes(chain_model(30, upscale=up))
        async with await net.create_session(ScheduleConfig(type="cuda", backend_config=BackendConfig(tuning="none"))) as s:
            await s.run(x)
            t = graph_time_us(s.pipeline.main)
        if best is None or abs(t - target) < abs(best[1] - target):
            best = (up, t)
        if t > target:
            break
    out["30 balanced"] = await cost(30, best[0])
    out["cpu 300/30"] = {k: out["300"][k] / out["30"][k] for k in ("cpu_us_per_run", "loop_cpu_us_per_run")}
    out["cpu 300/30 balanced"] = {k: out["300"][k] / out["30 balanced"][k]
                                  for k in ("cpu_us_per_run", "loop_cpu_us_per_run")}
    return out


def graph_time_us(be, n=30) -> float:
    """Median device time of a replay of the backend's recorded graph (one segment)."""
    import cupy

    run = next(iter(be.plan.runs.values()))
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(n):
        start.record(be.stream)
        run.graph.launch(be.stream)
        end.record(be.stream)
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) * 1e3)
    return statistics.median(times)


async def await_lag(n=500):
    """Latency from GPU completion to the awaiting task, per AIOMNN_CUDA_WAIT mode."""
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "tiny",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 16))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 16))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    net = aiomnn.Interpreter.from_bytes(m.SerializeToString())
    x = {"x": np.ones((1, 16), np.float32)}
    res = {}
    for mode in ("hostfunc", "thread", "loop"):
        os.environ["AIOMNN_CUDA_WAIT"] = mode
        async with await net.create_session(ScheduleConfig(type="cuda", backend_config=BackendConfig(tuning="none"))) as s:
            await s.run(x)
            be = s.pipeline.main
            run = next(iter(be.plan.runs.values()))
            stream = be.stream

            def blocking():
                run.graph.launch(stream)
                stream.synchronize()

            base = [0.0] * n
            fence_t = [0.0] * n
            for k in range(n):
                t0 = time.perf_counter()
                blocking()
                base[k] = time.perf_counter() - t0
            from aiomnn.fence import Fence

            for k in range(n):
                t0 = time.perf_counter()
                f = Fence()
                be.queue.launch(run, f)
                await f.wait()
                fence_t[k] = time.perf_counter() - t0
            session_ms = await time_async(lambda: s.run(x), n)
        fence_t.sort()
        res[mode] = {"blocking_sync_us": statistics.median(base) * 1e6,
                     "await_us": statistics.median(fence_t) * 1e6,
                     "await_p90_us": fence_t[int(0.9 * n)] * 1e6,
                     "lag_us": (statistics.median(fence_t) - statistics.median(base)) * 1e6,
                     "session_run_us": session_ms * 1e3}
    os.environ.pop("AIOMNN_CUDA_WAIT", None)
    return res


async def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="det,cls,yolov8n,rec,minilm")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--backends", default="cuda,opencl,vulkan")
    ap.add_argument("--tuning", default="normal", help="tuning level; the cache starts cold for each session")
    ap.add_argument("--precisions", default="fp32,fp16", help="aiomnn's precisions to time: fp32, fp16 or both")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--skip-extra", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--tokens", type=int, default=None, help="minilm's sequence length (its first sample shape's else)")
    args = ap.parse_args(argv)
    here = {t.value: names for t, names in aiomnn.available_backends().items()}
    backends = [b for b in args.backends.split(",") if b in here]
    for b in args.backends.split(","):
        print(f"{b}: {', '.join(here.get(b, ['not available here']))}", flush=True)
    results = {"devices": {b: here[b] for b in backends}, "models": {}}
    if "cuda" in backends and not args.skip_extra:
        results["host_cost"] = await host_cost()
        print("host cost:", json.dumps(results["host_cost"]), flush=True)
        results["await_lag"] = await await_lag()
        print("await lag (asyncio):", json.dumps(results["await_lag"]), flush=True)
        try:
            import uvloop
        except ImportError:
            pass
        else:
            import threading

            box = {}
            t = threading.Thread(target=lambda: box.update(r=uvloop.run(await_lag())))
            t.start()
            t.join()
            results["await_lag_uvloop"] = box.get("r")
            print("await lag (uvloop):", json.dumps(results["await_lag_uvloop"]), flush=True)

    import onnxruntime as ort

    precisions = [(p, t) for p, t in PRECISIONS if t in args.precisions.split(",")]
    cache_dir = tempfile.mkdtemp(prefix="aiomnn-gpu-bench-")
    rows = []
    for name in args.models.split(","):
        spec = MODELS[name]
        base = spec.shapes[0] if name != "minilm" or args.tokens is None else (1, args.tokens)
        oracle = ort.InferenceSession(str(models.path(name)), providers=["CPUExecutionProvider"])
        for b in [int(v) for v in args.batches.split(",")]:
            shape = (b,) + tuple(base[1:])
            want = oracle.run(None, sample_feeds(name, shape))
            r = {}
            async with contextlib.AsyncExitStack() as stack:
                opened = {}
                for backend in backends:
                    for prec, tag in precisions:
                        try:
                            m = await open_aiomnn(stack, name, shape, backend, prec, args.tuning, cache_dir)
                        except Exception as exc:  # report and go on
                            r[f"{backend}_{tag}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                            continue
                        opened[f"{backend}_{tag}"] = m
                        r[f"{backend}_{tag}_err"] = max(rel_error(m["out"][k], w) for k, w in zip(m["out"], want))
                        r[f"{backend}_{tag}_tune_s"] = m["tune_s"]
                        r[f"{backend}_{tag}_on_device"] = m["on_device"]
                        if backend == "cuda" and tag == "fp32":
                            r.update(kernels=m["summary"].get("launches"), graphs=m["summary"].get("graphs"))
                contenders = {k: m["run"] for k, m in opened.items()}
                contenders.update({f"{k}_dev": m["run_dev"] for k, m in opened.items() if "run_dev" in m})
                r.update(await time_in_turns(contenders, args.n))
            if "cuda" in backends and not args.no_torch:
                try:
                    tr, ref = bench_torch(name, shape, args.n, not args.no_compile)
                    r["err_torch"] = max(rel_error(a, w) for a, w in zip(ref, want))
                    r["eager"], r["eager_dev"] = tr["eager"]
                    if "compile" in tr:
                        r["compile"], r["compile_dev"] = tr["compile"]
                        r["compile_s"] = tr["compile_s"]
                except Exception as exc:  # report and go on
                    r["torch_error"] = f"{type(exc).__name__}: {exc}"
                if "fp16" in args.precisions.split(",") and not args.no_compile:
                    try:
                        tr, ref = bench_torch(name, shape, args.n, True, half=True)
                        r["err_torch16"] = max(rel_error(a, w) for a, w in zip(ref, want))
                        r["compile16"], r["compile16_dev"] = tr["compile"]
                    except Exception as exc:
                        r["torch16_error"] = f"{type(exc).__name__}: {exc}"
            results["models"][f"{name} b{b}"] = r
            print(f"{name} b{b} {json.dumps(r, default=float)}", flush=True)
            rows.append((f"{name} {'x'.join(map(str, shape))}", r))
            save(args.out, results)

    table = report(rows, backends)
    print(table)
    save(args.out, results, table)


def report(rows: list[tuple[str, dict]], backends: list[str]) -> str:
    """The tables: ms per run; each backend's time over CUDA's at the same precision (and CUDA's over torch's),
    the ratios the issues' targets are stated in; errors, steps on the device and tuning seconds."""

    def f(v, spec=".3f"):
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)

    def ratio(r, a, b):
        return r[a] / r[b] if r.get(a) and r.get(b) else None

    cols = [(f"{b} {t}", f"{b}_{t}") for b in backends for t in ("fp32", "fp16")]
    cols += [(f"cuda {t} (device)", f"cuda_{t}_dev") for t in ("fp32", "fp16") if "cuda" in backends]
    torch_cols = [("torch eager", "eager"), ("eager (device)", "eager_dev"), ("torch.compile", "compile"),
                  ("compile (device)", "compile_dev"), ("compile fp16", "compile16"),
                  ("compile fp16 (device)", "compile16_dev")]
    head = [c for c, _ in cols] + [c for c, _ in torch_cols]
    lines = ["ms per run (numpy in and out unless marked device)", "",
             "| model | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for label, r in rows:
        vals = [f(r.get(k)) for _, k in cols + torch_cols]
        lines.append(f"| {label} | " + " | ".join(vals) + " |")
    if "cuda" in backends:
        pairs = [(f"{b} / cuda {t}", f"{b}_{t}", f"cuda_{t}") for b in backends if b != "cuda"
                 for t in ("fp32", "fp16")]
        pairs += [(f"cuda fp32 / {name}", "cuda_fp32", key) for name, key in (("torch eager", "eager"),
                                                                             ("torch.compile", "compile"))]
        pairs += [(f"cuda {t} (device) / compile (device)", f"cuda_{t}_dev", "compile_dev") for t in ("fp32", "fp16")]
        pairs += [("cuda fp16 (device) / compile fp16 (device)", "cuda_fp16_dev", "compile16_dev")]
        lines += ["", "time over the peer's, in the same process (below 1: aiomnn's backend is faster)", "",
                  "| model | " + " | ".join(c for c, _, _ in pairs) + " |", "|---" * (len(pairs) + 1) + "|"]
        for label, r in rows:
            lines.append(f"| {label} | " + " | ".join(f(ratio(r, a, b), ".2f") for _, a, b in pairs) + " |")
    sessions = [(c, k) for c, k in cols if not k.endswith("_dev")]
    lines += ["", "relative error against onnxruntime, steps on the device, and tuning seconds (cold cache)", "",
              "| model | " + " | ".join(c for c, _ in sessions) + " |", "|---" * (len(sessions) + 1) + "|"]
    for label, r in rows:
        vals = [f"{f(r.get(k + '_err'), '.1e')}, {r.get(k + '_on_device', '-')}, {f(r.get(k + '_tune_s'), '.1f')} s"
                for _, k in sessions]
        lines.append(f"| {label} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def save(out, results, table=None):
    if not out:
        return
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "gpu_bench.json"), "w") as fh:
        json.dump(results, fh, indent=1, default=float)
    if table is not None:
        with open(os.path.join(out, "gpu_bench.md"), "w") as fh:
            fh.write(table + "\n")


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
