"""What the op tests share: build a one-input model, and run it through aiomnn's CPU backend and onnxruntime."""

from __future__ import annotations

import asyncio

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import aiomnn


def one_input_model(nodes: list, x_shape: tuple, consts: dict[str, np.ndarray] | None = None,
                    dtype: np.dtype = np.float32, opset: int = 17) -> bytes:
    """A model of these nodes over input "x" and constant initializers; its output is the last node's."""
    elem = TensorProto.DOUBLE if np.dtype(dtype) == np.float64 else TensorProto.FLOAT
    graph = helper.make_graph(nodes, "case", [helper.make_tensor_value_info("x", elem, x_shape)],
                              [helper.make_empty_tensor_value_info(nodes[-1].output[0])],
                              initializer=[numpy_helper.from_array(a, n) for n, a in (consts or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString()


def counting(monkeypatch, key: str, fn, *modules, into: dict[str, int] | None = None) -> dict[str, int]:
    """Count the calls of fn that serve (return something true: True, or a bound call), under {key: n} (or into
    another count's dict): fn is replaced by a counting wrapper under its own name in each of the modules (those
    that imported it by name, or its own)."""
    count = {} if into is None else into
    count.setdefault(key, 0)

    def counted(*args):
        done = fn(*args)
        count[key] += bool(done)
        return done

    for module in modules:
        monkeypatch.setattr(module, fn.__name__, counted)
    return count


def run_ort(data: bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model's outputs from onnxruntime's CPU provider."""
    import onnxruntime

    return onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)


def run_aiomnn(data: bytes, feeds: dict[str, np.ndarray], threads: int | None = None) -> list[np.ndarray]:
    """The model's outputs, in order, from a fresh CPU session (of `threads` threads, else the default)."""

    async def run() -> list[np.ndarray]:
        net = aiomnn.Interpreter.from_bytes(data)
        config = aiomnn.ScheduleConfig(type="cpu", **({} if threads is None else {"num_threads": threads}))
        async with await net.create_session(config) as session:
            out = await session.run(feeds)
        return [out[name] for name in net.output_names]

    return asyncio.run(run())


def conv_batch_matches_single_images(xs: tuple, ws: tuple, attrs: dict, bias: bool, tail: list, atol: float,
                                     rng: np.random.Generator) -> None:
    """A batched Conv (with `tail`, the nodes after it reading "y") gives every image exactly the result it
    gets alone, and the batch matches onnxruntime."""
    x = rng.standard_normal(xs).astype(np.float32)
    consts = {"w": rng.standard_normal(ws).astype(np.float32)}
    if bias:
        consts["b"] = rng.standard_normal(ws[0]).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["y"], **attrs)] + tail
    batched = run_aiomnn(one_input_model(nodes, xs, consts), {"x": x})[0]
    single = one_input_model(nodes, (1,) + tuple(xs[1:]), consts)
    for i in range(xs[0]):
        np.testing.assert_array_equal(batched[i:i + 1], run_aiomnn(single, {"x": x[i:i + 1]})[0])
    np.testing.assert_allclose(batched, run_ort(one_input_model(nodes, xs, consts), {"x": x})[0], rtol=1e-4,
                               atol=atol)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """`aiomnn ARGV...` in this process: (exit status, stdout, stderr), capsys being pytest's fixture."""
    from aiomnn import cli

    try:
        rc = cli.main(list(argv))
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return rc, out, err
