"""The `aiomnn` command: demo, run, info, models, conformance.

Here are the parser and the subcommands; the timed serving that demo and run report is in serving.py, and
what info prints of a model in describe.py.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import TYPE_CHECKING, Callable, Mapping, NoReturn

import anyio
import numpy as np

from .describe import describe
from .serving import Progress, print_stats, serve

if TYPE_CHECKING:
    from .metadata import TensorInfo


def demo_model(channels: int = 16, classes: int = 10) -> bytes:
    """A small deterministic CNN with a dynamic batch: conv, pooling, residual add, classifier."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32), name)

    c = channels
    inits = [weight("w1", c, 3, 3, 3), weight("b1", c), weight("w2", c, 1, 3, 3), weight("b2", c),
             weight("w3", 2 * c, c, 1, 1), weight("b3", 2 * c), weight("w4", 2 * c, 2 * c, 3, 3), weight("b4", 2 * c),
             weight("fc", 2 * c, classes), weight("fcb", classes)]
    nodes = [
        helper.make_node("Conv", ["image", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], group=c),
        helper.make_node("HardSwish", ["c2"], ["h2"]),
        helper.make_node("Conv", ["h2", "w3", "b3"], ["c3"]),
        helper.make_node("Relu", ["c3"], ["r3"]),
        helper.make_node("MaxPool", ["r3"], ["p3"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p3", "w4", "b4"], ["c4"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c4", "p3"], ["s4"]),
        helper.make_node("Relu", ["s4"], ["r4"]),
        helper.make_node("GlobalAveragePool", ["r4"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "aiomnn-demo",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 64, 64])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", classes])],
        inits)
    data: bytes = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    return data


async def _demo(args: argparse.Namespace) -> int:
    import aiomnn

    net = aiomnn.Interpreter.from_bytes(demo_model())
    config = aiomnn.ScheduleConfig(type=args.backend, num_threads=args.threads)
    async with await net.create_session(config) as session:
        rng = np.random.default_rng(1)
        images = rng.standard_normal((16, 1, 3, 64, 64)).astype(np.float32)
        await session.run({"image": images[0]})  # plan once before timing
        # The CPU's numba loops compile (or load from their disk cache) in the background on first use, numpy
        # serving meanwhile, and the compiling thread holds the GIL much of that time: on 2 cores it took most
        # of this short demo's throughput (benchmarks/RESULTS.md). The demo shows the steady state, as the
        # benchmarks do.
        began = time.perf_counter()
        from aiomnn.backends.cpu import jit

        if jit.pending():
            print("compiling the CPU loops (once a machine: numba caches them on disk)...", flush=True)
            await anyio.to_thread.run_sync(jit.wait, 300)
            print(f"CPU loops compiled in {time.perf_counter() - began:.1f} s")
        print(f"aiomnn demo: {args.requests} requests, {args.concurrency} concurrent tasks")
        print(f"backend: {', '.join(str(t) for t in session.backend_types)}")
        stats = await serve(lambda i: {"image": images[i % 16]}, session.run, args.requests, args.concurrency)
        if session.has_async_work():
            print("GPU tuning still running in the background; requests were served on the CPU")
    print_stats(stats)
    return 0


#: What --backend takes (aiomnn.ForwardType's values; not imported here, so that --help stays quick).
BACKENDS = ["auto", "cpu", "cuda", "opencl", "vulkan"]


class UsageError(Exception):
    """A bad argument found after parsing (a --shape naming no input of the model): exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad argument reported in one line: `aiomnn run: error: ...` and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {value}")
        return value

    parse.__name__ = "integer"
    return parse


def shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    """An argparse type: name=1x3x224x224 as (name, dims)."""
    name, _, dims = text.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x")) if name and dims else None
    except ValueError:
        shape = None
    if shape is None or any(d < 0 for d in shape):
        raise argparse.ArgumentTypeError(f"wants name=1x3x224x224 (dimensions >= 0), not {text!r}")
    return name, shape


def _parse_shapes(items: list[tuple[str, tuple[int, ...]]], inputs: Mapping[str, TensorInfo]
                  ) -> dict[str, tuple[int, ...]]:
    shapes = dict(items)
    unknown = [n for n in shapes if n not in inputs]
    if unknown:
        raise UsageError(f"argument --shape: the model has no input {', '.join(map(repr, unknown))}; "
                         f"its inputs are {', '.join(map(repr, inputs))}")
    return shapes


def random_feeds(inputs: Mapping[str, TensorInfo], shapes: dict[str, tuple[int, ...]], rng: np.random.Generator
                 ) -> dict[str, np.ndarray]:
    """A random feed for every input, of the shape given in `shapes` or else the one the model fixes."""
    feeds = {}
    for name, info in inputs.items():
        if name in shapes:
            shape = shapes[name]
        elif info.shape is not None and all(isinstance(d, int) for d in info.shape):
            shape = tuple(d for d in info.shape if isinstance(d, int))
        else:
            raise UsageError(f"input {name!r} has dynamic shape {info.shape}; give it with --shape {name}=...")
        dtype = np.dtype(info.dtype or np.float32)
        if dtype.kind == "f":
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        else:
            # 0 and 1 only: integer inputs are mostly token ids, token types, masks and other indices, and an index
            # past a small table (BERT's two token types) fails the run, where 0 and 1 are in range of any.
            feeds[name] = rng.integers(0, 2, shape).astype(dtype)
    return feeds


async def _run(args: argparse.Namespace) -> int:
    import aiomnn

    net = aiomnn.Interpreter.from_file(args.model)
    feeds = random_feeds(net.inputs, _parse_shapes(args.shape, net.inputs), np.random.default_rng(0))
    config = aiomnn.ScheduleConfig(type=args.backend, num_threads=args.threads,
                                   backend_config=aiomnn.BackendConfig(tuning=args.tuning, precision=args.precision),
                                   profile=args.profile is not None)
    runtime = aiomnn.create_runtime(config)
    bar = Progress(0, "tuning ")
    runtime.add_tuning_callback(lambda p: bar.update(p.done, p.total))  # from the tuning thread
    if args.cache:
        runtime.set_cache_file(args.cache)
    try:
        async with await net.create_session(config, runtime) as session:
            t = time.perf_counter()
            outputs = await session.run(feeds)
            first = (time.perf_counter() - t) * 1e3
            print(f"backend: {', '.join(str(t) for t in session.backend_types)}")
            for name, value in outputs.items():
                print(f"output {name}: shape {getattr(value, 'shape', None)} dtype {getattr(value, 'dtype', None)}")
            print(f"first run (with planning): {first:.2f} ms")
            report = session.memory_report()
            print(f"planned activations: peak {report['peak_bytes']} bytes, sum {report['sum_bytes']} bytes")
            if session.has_async_work():
                print("GPU tuning runs in the background; runs are served on the CPU meanwhile")
                await session.wait_async_resize()
                await session.run(feeds)
                print(f"tuning done{' and saved to ' + args.cache if args.cache else ''}; "
                      f"backend: {', '.join(str(t) for t in session.backend_types)}")
            if args.requests:
                stats = await serve(lambda i: feeds, session.run, args.requests, args.concurrency)
                print_stats(stats)
            profile = session.profile
            if args.profile is not None and profile is not None:
                from .profile import format_summary

                session.write_profile(args.profile)
                print(f"profile of {len(profile.runs)} runs written to {args.profile}; the costliest ops:")
                print(format_summary(profile.summary(top=10)))
    finally:
        runtime.close()
    return 0


def _info(args: argparse.Namespace) -> int:
    import aiomnn
    from aiomnn.runtime import BACKEND_MODULES, probe

    if args.model is not None:
        for line in describe(aiomnn.Interpreter.from_file(args.model), args.model):
            print(line)
        return 0

    for t in BACKEND_MODULES:
        devices = probe(t)
        if devices:
            for d in devices:
                kind = "" if t is aiomnn.ForwardType.CPU else (" (gpu)" if d.is_gpu else " (cpu device: by name only)")
                print(f"{t.value:7s} {d.name}{kind}")
        else:
            print(f"{t.value:7s} not available")
    chosen = aiomnn.runtime.resolve_type(aiomnn.ScheduleConfig())
    print(f"auto -> {chosen.value}")
    return 0


def _models(args: argparse.Namespace) -> int:
    from . import models

    if args.action == "fetch":
        models.fetch(args.names or None)
    else:
        for name, spec in models.MODELS.items():
            p = models.cache_dir() / spec.filename
            state = "fetched" if p.is_file() else "missing"
            print(f"{name:8s} {state:8s} {p}  input {', '.join(spec.inputs)} {spec.shapes}")
    return 0


def _conformance(args: argparse.Namespace) -> int:
    from . import conformance

    kinds = [k for k in args.kinds.split(",") if k]
    outcomes = asyncio.run(conformance.run_suite(args.backend, kinds, match=args.match))
    print(conformance.report(outcomes, list_failures=args.list_failures))
    if args.write_xfail:
        with open(args.write_xfail, "w") as f:
            for o in sorted(outcomes, key=lambda o: (o.case.kind, o.case.name)):
                if not o.passed:
                    reason = " ".join(o.reason.split())[:200]
                    f.write(f"{o.case.kind}/{o.case.name}  # {reason}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="aiomnn", description="asyncio-native inference runtime")
    parser.add_argument("--version", action="version", version=f"aiomnn {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("demo", help="serve a small CNN from concurrent tasks and report latency")
    p.add_argument("--backend", default="auto", choices=BACKENDS)
    p.add_argument("--requests", type=_count(1), default=400)
    p.add_argument("--concurrency", type=_count(1), default=16)
    p.add_argument("--threads", type=_count(1), default=None)
    p.set_defaults(fn=lambda a: asyncio.run(_demo(a)))

    p = sub.add_parser("run", help="run a model on random inputs")
    p.add_argument("model")
    p.add_argument("--backend", default="auto", choices=BACKENDS)
    p.add_argument("--shape", action="append", default=[], type=shape_arg, help="name=1x3x224x224 (repeatable)")
    p.add_argument("--requests", type=_count(0), default=0)
    p.add_argument("--concurrency", type=_count(1), default=1)
    p.add_argument("--threads", type=_count(1), default=None)
    p.add_argument("--tuning", default="normal", choices=["none", "fast", "normal", "heavy"],
                   help="GPU tuning level; tuning runs once, in the background, with a progress bar")
    p.add_argument("--precision", default="normal", choices=["normal", "high", "low"],
                   help="low: float16 where the backend supports it (GPU backends)")
    p.add_argument("--cache", metavar="FILE", help="tuning cache: read at start, written when tuning ends")
    p.add_argument("--profile", metavar="TRACE.json", help="time every op of every run; write a Chrome trace "
                   "(chrome://tracing, Perfetto) and print the ten costliest ops")
    p.set_defaults(fn=lambda a: asyncio.run(_run(a)))

    p = sub.add_parser("info", help="list backends and devices; with a model, its metadata, inputs and outputs")
    p.add_argument("model", nargs="?", help="an ONNX model file to describe")
    p.set_defaults(fn=_info)

    p = sub.add_parser("models", help="fetch or list the public real models")
    p.add_argument("action", choices=["fetch", "list"])
    p.add_argument("names", nargs="*")
    p.set_defaults(fn=_models)

    p = sub.add_parser("conformance", help="run the ONNX backend test suite")
    p.add_argument("--backend", default="cpu", choices=BACKENDS)
    p.add_argument("--kinds", default="node,simple,pytorch-converted,pytorch-operator")
    p.add_argument("--match", default=None, help="regex on case names")
    p.add_argument("--list-failures", action="store_true")
    p.add_argument("--write-xfail", metavar="FILE", help="write the failing cases as an expected-failure list")
    p.set_defaults(fn=_conformance)

    args = parser.parse_args(argv)
    from .errors import AiomnnError

    try:
        status: int = args.fn(args)
        return status
    except UsageError as exc:
        sub.choices[args.command].error(str(exc))
    except AiomnnError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("aiomnn")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
