"""The CUDA backend without a GPU: run cases through it over a fake cupy that records every launch, copy, upload
and pointer (fake/cupy), and write each case's trace, to compare two trees' traces after a restructuring.

    python tools/cuda_trace/trace.py OUT.json [PREFIX]     # the cases (tests/test_cuda.py's, the public models)
    python tools/cuda_trace/trace.py --compare A.json B.json

Run it from each tree (git archive REV | tar -x -C DIR, `ln -sfn ../backends DIR/aiomnn/backends`, then DIR's own
tools/cuda_trace/trace.py) and compare: the cases whose
launches, copies or pointers differ are listed. A case that tunes ("fused_block:tuning") differs between two runs
of one tree too: tuning goes by wall time.
"""
import asyncio, hashlib, json, os, sys, traceback
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "fake"), os.path.dirname(os.path.dirname(HERE))]  # the fake, this tree
import numpy as np
import cupy  # the fake
import aiomnn
from aiomnn.backends.cuda import blas


class FakeLib:
    def __getattr__(self, name):
        def fn(*args):
            if name == "cublasGemmStridedBatchedEx":
                cupy.TRACE.append(("gemm",) + tuple(cupy.norm(a) if isinstance(a, int) and a > 1 << 30 else a
                                                    for a in args[1:]))
            return 0
        return fn


blas._lib = FakeLib()
import tests.test_cuda as tc
import tests.test_cuda_raster as tr
from aiomnn.models import MODELS, sample_feeds
from aiomnn import models


def norm_out(v):
    if isinstance(v, cupy.ndarray):
        return ("dev", cupy.norm(v.data.ptr), v.shape, v.dtype.str)
    a = np.asarray(v)
    return ("host", a.shape, a.dtype.str)


async def run_case(data, feeds, precision="normal", wait="thread", device=False, profile=False, tuning="none",
                   shapes=None, runs=2):
    os.environ["AIOMNN_CUDA_WAIT"] = wait
    net = aiomnn.Interpreter.from_bytes(data) if isinstance(data, bytes) else aiomnn.Interpreter.from_file(data)
    cfg = aiomnn.ScheduleConfig(type="cuda", num_threads=2, background_tuning=False, profile=profile,
                                backend_config=aiomnn.BackendConfig(precision=precision, tuning=tuning))
    out = []
    async with await net.create_session(cfg) as s:
        for f in ([feeds] if shapes is None else shapes):
            for _ in range(runs):
                got = await s.run(f, device_outputs=device)
                out.append({k: norm_out(v) for k, v in sorted(got.items())})
        out.append(dict(getattr(s.pipeline.main, "summary", {})))
        out.append([(seg.backend.type.name, [st.node.name or st.node.op_type for st in seg.steps])
                    for seg in s.pipeline.segments])
        if profile:
            out.append([(e.name, e.op_type) for run in s.profile.runs for e in run.ops]
                       if hasattr(s, "profile") and s.profile is not None else None)
    return out


def cases():
    for name, make in tc.OP_CASES.items():
        yield f"op:{name}", make, {}
    for name in ["conv3x3", "conv1x1", "depthwise3x3", "convtranspose_k2s2", "maxpool2", "gap", "resize_linear",
                 "softmax_last", "layernorm", "matmul_4d", "gemm", "batchnorm", "add_bcast", "hardswish", "concat",
                 "transpose", "reducemean_last"]:
        if name in tc.OP_CASES:
            yield f"fp16:{name}", tc.OP_CASES[name], {"precision": "low"}
    for algo in ["gemm", "im2col", "direct", "igemm", "igemm32", "igemm32x128", "narrow"]:
        for case in tc.CONV_CASES:
            yield f"algo:{algo}:{case}", tc.OP_CASES[case], {"algo": algo}
    yield "fused_block", tc.fused_block, {}
    yield "fused_block:fp16", tc.fused_block, {"precision": "low"}
    yield "fused_block:profile", tc.fused_block, {"profile": True}
    yield "fused_block:tuning", tc.fused_block, {"tuning": "normal"}
    def resized():
        data, _ = tc.fused_block()
        import onnx
        model = onnx.load_from_string(data)
        for i, d in enumerate(model.graph.input[0].type.tensor_type.shape.dim):
            if i != 1:
                d.dim_param = f"d{i}"
        return model.SerializeToString(), None
    shapes = [{"x": tc.r(*s)} for s in [(1, 8, 9, 7), (3, 8, 16, 16), (1, 8, 9, 7)]]
    yield "resize_shapes", resized, {"shapes": shapes}
    yield "resize_shapes:fp16", resized, {"shapes": shapes, "precision": "low"}

    def device_input():
        data, feeds = tc.conv_case(tc.r(2, 8, 17, 19), tc.r(16, 8, 3, 3), tc.r(16), pads=[1, 1, 1, 1])
        return data, {"x": cupy.asarray(feeds["x"])}
    yield "device_input", device_input, {}
    yield "device_input:device", device_input, {"device": True}
    yield "device_input:fp16", device_input, {"precision": "low", "device": True}
    for wait in ("loop", "thread", "hostfunc"):
        for prec in ("normal", "low"):
            yield f"mixed:{wait}:{prec}", tc.mixed_model, {"wait": wait, "precision": prec}
            yield f"mixed:{wait}:{prec}:device", tc.mixed_model, {"wait": wait, "precision": prec, "device": True}


async def main(out_path, only=None):
    results = {}
    from aiomnn.backends.cuda.ops import conv
    for label, make, kw in cases():
        if only and not label.startswith(only):
            continue
        cupy.reset()
        kw = dict(kw)
        algo = kw.pop("algo", None)
        saved = conv.DIRECT_MACS, conv.FORCE_ALGO
        if algo:
            conv.DIRECT_MACS, conv.FORCE_ALGO = 0, algo
        try:
            data, feeds = make()
            res = await run_case(data, feeds, **kw)
            err = None
        except Exception as exc:
            res, err = None, f"{type(exc).__name__}: {exc}\n" + traceback.format_exc()[-1500:]
        finally:
            conv.DIRECT_MACS, conv.FORCE_ALGO = saved
        trace = list(cupy.TRACE)
        if "tuning" in label:  # the clocks' warm-up times for a while: the distinct entries only
            trace = sorted(set(map(repr, trace)))
        results[label] = {"err": err, "res": repr(res), "trace": repr(trace),
                          "digest": hashlib.md5(repr((res, trace)).encode()).hexdigest()[:12], "n": len(trace)}
    # raster cases
    for name, make in tr.CASES.items():
        for prec in ("normal", "low"):
            label = f"raster:{name}:{prec}"
            if only and not label.startswith(only):
                continue
            cupy.reset()
            try:
                d, x = make()
                res = await run_case(d, {"x": x}, precision=prec)
                err = None
            except Exception as exc:
                res, err = None, f"{type(exc).__name__}: {exc}\n" + traceback.format_exc()[-1500:]
            trace = list(cupy.TRACE)
            results[label] = {"err": err, "res": repr(res), "trace": repr(trace),
                              "digest": hashlib.md5(repr((res, trace)).encode()).hexdigest()[:12], "n": len(trace)}
    # public models
    for name in ("cls", "rec", "det"):
        label = f"model:{name}"
        if only and not label.startswith(only):
            continue
        for prec in ("normal", "low"):
            cupy.reset()
            try:
                path = models.path(name)
                shape = MODELS[name].shapes[-1]
                res = await run_case(str(path), sample_feeds(name, shape), precision=prec, runs=1)
                err = None
            except Exception as exc:
                res, err = None, f"{type(exc).__name__}: {exc}\n" + traceback.format_exc()[-1500:]
            trace = list(cupy.TRACE)
            results[f"{label}:{prec}"] = {"err": err, "res": repr(res), "trace": repr(trace),
                                          "digest": hashlib.md5(repr((res, trace)).encode()).hexdigest()[:12],
                                          "n": len(trace)}
    json.dump(results, open(out_path, "w"))
    errs = sum(1 for r in results.values() if r["err"])
    print(len(results), "cases,", errs, "errors")


def compare(a_path: str, b_path: str) -> None:
    a, b = json.load(open(a_path)), json.load(open(b_path))
    differ = [k for k in a if a.get(k) != b.get(k)] + [k for k in b if k not in a]
    print(f"{len(a)} / {len(b)} cases, {len(differ)} differ:", differ)


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
