"""A/B of two builds of the conv tile loop in one process, both serial, on the same planned convs, their calls
alternating (this machine's noise hits both alike): backends/cpu/tiles.py against a changed copy of it.

    cp backends/cpu/tiles.py backends/cpu/tiles_exp.py     # (git-ignored) then change tiles_exp.py's conv
    python tools/ab_tiles.py pw32,s1,s1small,s2,first

Checks that both give the same outputs, then prints each build's median microseconds a call and GMAC/s, and
exp / base. The shapes are YOLOv8n's kinds of conv (SH), each followed by SiLU as there.
"""
import asyncio, sys, time
import numpy as np
from onnx import helper, TensorProto, numpy_helper
import aiomnn
from aiomnn.backends.cpu import jit, loops
from aiomnn.backends.cpu.ops import direct
from aiomnn.backends.cpu import tiles_exp

SH = {"pw32": (1,32,80,80,32,1,1), "pw48b8": (8,48,80,80,32,1,1), "s1": (1,64,40,40,64,3,1), "s1small": (1,16,80,80,16,3,1),
      "s2": (1,16,160,160,32,3,2), "first": (1,3,320,320,16,3,2), "s2b": (1,64,40,40,128,3,2)}

def model(N,C,H,W,co,k,s):
    rng=np.random.default_rng(0)
    w=(rng.random((co,C,k,k),dtype=np.float32)-0.5)*0.2; b=rng.random(co,dtype=np.float32)
    nodes=[helper.make_node("Relu",["x"],["xr"]), helper.make_node("Conv",["xr","w","b"],["c"],kernel_shape=[k,k],strides=[s,s],pads=[k//2]*4),
           helper.make_node("Sigmoid",["c"],["sg"]), helper.make_node("Mul",["c","sg"],["a"]), helper.make_node("Abs",["a"],["y"])]
    g=helper.make_graph(nodes,"g",[helper.make_tensor_value_info("x",TensorProto.FLOAT,[N,C,H,W])],[helper.make_tensor_value_info("y",TensorProto.FLOAT,None)],[numpy_helper.from_array(w,"w"),numpy_helper.from_array(b,"b")])
    m=helper.make_model(g,opset_imports=[helper.make_opsetid("",17)]); m.ir_version=8
    return m.SerializeToString()

async def main(names):
    sig = loops.SIGNATURES["conv_tiles"][1]
    base = loops.compile("conv_tiles")
    loops.SIGNATURES["conv_tiles"] = (tiles_exp.conv, sig)
    exp = loops.compile("conv_tiles")
    u = np.uint64
    for nm in names:
        N,C,H,W,co,k,s = SH[nm]
        x = np.random.rand(N,C,H,W).astype(np.float32)
        net = aiomnn.Interpreter.from_bytes(model(N,C,H,W,co,k,s))
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=1)) as ss:
            await ss.run({"x": x}); jit.wait(300); await ss.run({"x": x})
            be = ss.pipeline.segments[0].backend
            conv = [st[0] for st in be._plans[ss.pipeline.segments[0]] if type(st[0]).__name__ in ("Conv", "ConvAffine")][0]
            p, packed = conv._plan, conv._packed
            d = p["direct"]; w, bias = direct.pack(packed)
            xf = x.reshape(N, -1)
            if d["layout"] is not None:
                xl = np.zeros((N, d["xs"]), np.float32)
                jit.jitted("conv_input")(xf, xl, *d["layout"], 0, N, 0, d["hq"])
            else:
                xl = xf
            xs, offs, far = d["fixed"]
            code, alpha, beta = p["loop_act"]
            groups = d["groups"]
            tail = d["widths"] + (u(0), u(N), u(0), u(d["last"]), code, alpha, beta, groups, groups)
            ya = np.zeros((N, co, p["L"]), np.float32); yb = np.zeros_like(ya)
            base(xl.reshape(-1), xs, offs, far, w, bias, ya, *tail); exp(xl.reshape(-1), xs, offs, far, w, bias, yb, *tail)
            assert np.array_equal(ya, yb), (nm, np.abs(ya - yb).max())
            ta, tb = [], []
            for _ in range(60):
                t = time.perf_counter(); base(xl.reshape(-1), xs, offs, far, w, bias, ya, *tail); ta.append(time.perf_counter() - t)
                t = time.perf_counter(); exp(xl.reshape(-1), xs, offs, far, w, bias, yb, *tail); tb.append(time.perf_counter() - t)
            macs = co * C * k * k * N * p["L"]
            a, b = np.median(ta) * 1e6, np.median(tb) * 1e6
            print(f"{nm:8s} base {a:8.1f} us ({macs / a / 1e3:.0f} GMAC/s)  exp {b:8.1f} us ({macs / b / 1e3:.0f} GMAC/s)  exp/base {b / a:.3f}", flush=True)

asyncio.run(main(sys.argv[1].split(",")))
