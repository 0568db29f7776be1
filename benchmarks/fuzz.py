"""Fuzz runner: thousands of malformed models and bad inputs, each guarded by a timeout.

Every case must end in a result or an AiomnnError, and no warning (a NumPy
RuntimeWarning, say) may reach the caller. Cases run in worker processes; a
worker that dies (a crash) or a case that outlives its timeout (a hang) is
counted and the pool is restarted. The last line counts the outcomes by class;
crash, hang and other (which includes a warning) must be 0.

    python benchmarks/fuzz.py [--models 10000] [--inputs 10000] [--workers 2] [--timeout 10]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures as cf
import random
import time
import warnings

import numpy as np

BASES: dict[str, bytes] = {}


def _bases() -> dict[str, bytes]:
    if not BASES:
        from aiomnn.cli import demo_model

        BASES["demo"] = demo_model(channels=4, classes=3)
        try:
            from aiomnn import models

            BASES["cls"] = models.path("cls").read_bytes()
        except FileNotFoundError:
            pass
    return BASES


# Model mutations ------------------------------------------------------------------------
def mutate_model(seed: int) -> bytes:
    import onnx
    from onnx import helper

    rng = random.Random(seed)
    name = rng.choice(sorted(_bases()))
    data = bytearray(_bases()[name])
    kind = rng.randrange(9)
    if kind == 0:  # bit flips
        for _ in range(rng.randint(1, 16)):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        return bytes(data)
    if kind == 1:  # truncation at every length class
        return bytes(data[: rng.choice([0, 1, 2, 7, 64, 1000, len(data) // 2, len(data) - 1, rng.randrange(len(data))])])
    m = onnx.ModelProto()
    m.ParseFromString(bytes(data))
    g = m.graph
    nodes = list(g.node)
    if kind == 2 and len(nodes) > 1:  # swapped nodes
        i, j = rng.randrange(len(nodes)), rng.randrange(len(nodes))
        a, b = onnx.NodeProto(), onnx.NodeProto()
        a.CopyFrom(nodes[i])
        b.CopyFrom(nodes[j])
        g.node[i].CopyFrom(b)
        g.node[j].CopyFrom(a)
    elif kind == 3 and nodes:  # duplicated node
        g.node.append(nodes[rng.randrange(len(nodes))])
    elif kind == 4 and g.initializer:  # tensor size against raw data
        t = g.initializer[rng.randrange(len(g.initializer))]
        if t.dims:
            t.dims[rng.randrange(len(t.dims))] += rng.choice([-1, 1, 7, 10**6])
        else:
            t.dims.append(3)
    elif kind == 5 and g.initializer:  # absurd / huge declared sizes
        t = g.initializer[rng.randrange(len(g.initializer))]
        del t.dims[:]
        t.dims.extend(rng.choice([[10**12], [-5, 3], [2**31, 2**31], [0, 10**9]]))
    elif kind == 6:  # unknown opsets and domains
        m.opset_import[0].version = rng.choice([0, 1, 999, -3, 2**40])
        if rng.random() < 0.5 and nodes:
            g.node[rng.randrange(len(nodes))].domain = "com.nowhere"
    elif kind == 7:  # deeply nested subgraphs
        depth = rng.choice([5, 15, 25])
        leaf = helper.make_graph([helper.make_node("Identity", ["c"], ["o"])], "b", [],
                                 [helper.make_tensor_value_info("o", onnx.TensorProto.BOOL, [])])
        body = leaf
        for _ in range(depth):
            body = helper.make_graph([helper.make_node("If", ["c"], ["o"], then_branch=body, else_branch=leaf)], "b",
                                     [], [helper.make_tensor_value_info("o", onnx.TensorProto.BOOL, [])])
        g.node.append(helper.make_node("If", ["c"], ["nested_out"], then_branch=body, else_branch=leaf))
        g.input.append(helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, []))
    elif kind == 8 and nodes:  # attribute and input damage
        n = g.node[rng.randrange(len(nodes))]
        if n.attribute and rng.random() < 0.5:
            a = n.attribute[rng.randrange(len(n.attribute))]
            a.type = rng.randrange(1, 15)
        elif n.input:
            n.input[rng.randrange(len(n.input))] = rng.choice(["", "nope", n.output[0] if n.output else "x"])
    return m.SerializeToString()


def run_model_case(seed: int) -> str:
    import aiomnn

    data = mutate_model(seed)
    try:
        net = aiomnn.Interpreter.from_bytes(data)

        async def go():
            async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=1)) as s:
                feeds = {}
                for name, (shape, dtype) in net.inputs.items():
                    dims = [d if isinstance(d, int) and 0 < d <= 64 else 1 for d in (shape or [])]
                    if name == "x" and len(dims) == 4:
                        dims = [1, 3, 48, 192]
                    feeds[name] = np.zeros(dims, dtype=dtype if dtype is not None and dtype != object else np.float32)
                await s.run(feeds)

        asyncio.run(go())
    except aiomnn.AiomnnError as exc:
        return type(exc).__name__
    except Exception as exc:
        return f"other:{type(exc).__name__}: {str(exc)[:120]}"
    return "ok"


# Input mutations ------------------------------------------------------------------------
_SESSION = None


def run_input_case(seed: int) -> str:
    global _SESSION
    import aiomnn

    rng = np.random.default_rng(seed)
    if _SESSION is None:
        loop = asyncio.new_event_loop()
        net = aiomnn.Interpreter.from_bytes(_bases()["demo"])
        _SESSION = (loop, loop.run_until_complete(net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=1))))
    loop, s = _SESSION
    kind = int(rng.integers(9))
    good = rng.standard_normal((1, 3, 64, 64)).astype(np.float32)
    if kind == 0:
        x = good.copy()
        x.flat[rng.integers(0, x.size, 10)] = rng.choice([np.nan, np.inf, -np.inf])
    elif kind == 1:
        dims = [int(d) for d in rng.choice([0, 1, 2, 3, 64, 10**6], size=rng.integers(0, 6))]
        # Huge shapes as zero-stride views: the caller's array costs nothing, a careless copy would.
        if rng.random() < 0.5:
            try:
                x = np.broadcast_to(np.float32(0), dims)
            except ValueError:  # past numpy's own limits: the largest view numpy can make
                x = np.broadcast_to(np.float32(0), [d for d in dims if d < 10**6] + [10**6])
        else:
            x = np.zeros((int(rng.integers(0, 3)), 3, 64, 64), np.float32)
    elif kind == 2:
        x = good.astype(rng.choice([np.float64, np.float16, np.int64, np.int8, np.uint8, np.bool_, np.complex64]))
    elif kind == 3:
        x = np.asfortranarray(good) if rng.random() < 0.5 else good[..., ::-1]
    elif kind == 4:
        x = good.astype(">f4") if rng.random() < 0.5 else good.copy()
        x.flags.writeable = bool(rng.random() < 0.5)
    elif kind == 5:
        x = good.tolist() if rng.random() < 0.5 else float(rng.standard_normal())
    elif kind == 6:
        feeds = rng.choice([{}, {"image": good, "extra": good}, {"other": good}, {"image": "text"}])
        return _run_feeds(loop, s, feeds)
    elif kind == 7:
        x = np.empty((1, 3, 64, 64), np.float32)  # uninitialised memory is still a valid input
    else:  # what is not an array: None, a DLPack-only object, ragged lists, strings, objects
        choice = int(rng.integers(6))
        x = [None, _DLPackOnly(good if rng.random() < 0.7 else good.astype(np.float64)), [[1.0, 2.0], [3.0]],
             "image", np.array([good], dtype=object), {"a": 1}][choice]
    return _run_feeds(loop, s, {"image": x})


class _DLPackOnly:
    """An array reachable through DLPack alone."""

    def __init__(self, a: np.ndarray):
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def _run_feeds(loop, s, feeds) -> str:
    import aiomnn

    try:
        loop.run_until_complete(s.run(feeds))
    except aiomnn.AiomnnError as exc:
        return type(exc).__name__
    except Exception as exc:
        return f"other:{type(exc).__name__}: {str(exc)[:120]}"
    return "ok"


def checked(fn, seed: int) -> str:
    """fn(seed)'s outcome, or 'other:warning: ...' where a warning reached the caller."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome = fn(seed)
    shown = [w for w in caught if not issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning))]
    if shown and not outcome.startswith("other"):
        w = shown[0]
        return f"other:warning: {w.category.__name__}: {str(w.message)[:80]} ({w.filename}:{w.lineno})"
    return outcome


def run_all(fn, count: int, workers: int, timeout: float, offset: int) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    seeds = list(range(offset, offset + count))
    done = 0
    while done < len(seeds):
        with cf.ProcessPoolExecutor(workers) as pool:
            futures = {pool.submit(checked, fn, s): s for s in seeds[done:]}
            try:
                for fut in futures:
                    try:
                        outcome = fut.result(timeout=timeout)
                        counts[outcome] += 1
                        if outcome.startswith("other"):
                            print(f"{outcome}: seed {futures[fut]}")
                    except cf.TimeoutError:
                        counts["hang"] += 1
                        print(f"hang: seed {futures[fut]}")
                        raise
                    except cf.process.BrokenProcessPool:
                        counts["crash"] += 1
                        print(f"crash: seed {futures[fut]}")
                        raise
                    done += 1
            except (cf.TimeoutError, cf.process.BrokenProcessPool):
                done += 1
                for p in pool._processes.values():
                    p.kill()
    return counts


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", type=int, default=10000)
    p.add_argument("--inputs", type=int, default=10000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    t = time.perf_counter()
    for label, fn, n in (("malformed models", run_model_case, a.models), ("bad inputs", run_input_case, a.inputs)):
        counts = run_all(fn, n, a.workers, a.timeout, a.seed)
        bad = sum(v for k, v in counts.items() if k in ("crash", "hang") or k.startswith("other"))
        print(f"{label}: {n} cases")
        for k, v in counts.most_common():
            print(f"  {v:6d} {k}")
        print(f"  crash/hang/other: {bad}")
    print(f"took {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    main()
