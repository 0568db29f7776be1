"""The ONNX backend test suite, run through aiomnn on one backend.

Cases come from onnx itself: `node` cases are generated in memory; `simple`,
`pytorch-converted` and `pytorch-operator` are on disk. A case passes when
every output has the expected shape and dtype and matches within the case's
own rtol and atol; sequence outputs match element by element.
"""

from __future__ import annotations

import collections
import glob
import os
import warnings
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

KINDS = ("node", "simple", "pytorch-converted", "pytorch-operator")


@dataclass
class Case:
    name: str
    kind: str
    model: bytes
    model_dir: str | None
    data_sets: list[tuple[list[Any], list[Any]]]
    rtol: float
    atol: float
    op_types: tuple[str, ...]


@dataclass
class Outcome:
    case: Case
    passed: bool
    reason: str = ""
    #: The backends the case's session ran on: every segment's, once it was made.
    placed: tuple[str, ...] = ()


def load_cases(kinds: Iterable[str] = KINDS) -> list[Case]:
    import onnx
    from onnx.backend.test.loader import load_model_tests

    cases = []
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}; expected some of {', '.join(KINDS)}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tests = load_model_tests(kind=kind)
        for t in tests:
            if t.model is not None:  # a case built in Python, its data sets beside it
                model = t.model
                data = [([_as_value(v) for v in i], [_as_value(v) for v in o]) for i, o in t.data_sets or ()]
            elif t.model_dir is not None:  # a case on disk
                path = os.path.join(t.model_dir, "model.onnx")
                model = onnx.load(path)
                data = [_read_data_set(d) for d in sorted(glob.glob(os.path.join(t.model_dir, "test_data_set_*")))]
            else:
                continue
            ops = tuple(sorted({n.op_type for n in model.graph.node}))
            cases.append(Case(t.name, kind, model.SerializeToString(), t.model_dir, data, t.rtol, t.atol, ops))
    return cases


def _as_value(v: Any) -> Any:
    """Generated cases hold some tensors (float8, int4, ...) as TensorProto; make them arrays."""
    import onnx
    from onnx import numpy_helper

    return numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else v


def _read_data_set(folder: str) -> tuple[list[Any], list[Any]]:
    def read(prefix: str) -> list[Any]:
        files = sorted(glob.glob(os.path.join(folder, f"{prefix}_*.pb")),
                       key=lambda p: int(p.rsplit("_", 1)[1].split(".")[0]))
        return [_read_value(Path(f).read_bytes()) for f in files]

    return read("input"), read("output")


def _read_value(data: bytes) -> Any:
    import onnx
    from onnx import numpy_helper

    t = onnx.TensorProto()
    t.ParseFromString(data)
    if t.data_type:
        return numpy_helper.to_array(t)
    s = onnx.SequenceProto()
    s.ParseFromString(data)
    if s.elem_type:
        return numpy_helper.to_list(s)
    o = onnx.OptionalProto()
    o.ParseFromString(data)
    return numpy_helper.to_optional(o)


def compare(expected: Any, got: Any, rtol: float, atol: float, where: str = "output") -> str | None:
    """None when got matches expected; else what differs."""
    if isinstance(expected, list):
        if not isinstance(got, list):
            return f"{where}: expected a sequence, got {type(got).__name__}"
        if len(expected) != len(got):
            return f"{where}: sequence length {len(got)}, expected {len(expected)}"
        for i, (e, g) in enumerate(zip(expected, got)):
            why = compare(e, g, rtol, atol, f"{where}[{i}]")
            if why:
                return why
        return None
    if expected is None:
        return None if got is None else f"{where}: expected None, got {type(got).__name__}"
    expected = np.asarray(expected)
    if not isinstance(got, (np.ndarray, np.generic)):
        return f"{where}: expected an array, got {type(got).__name__}"
    got = np.asarray(got)
    if got.dtype != expected.dtype:
        return f"{where}: dtype {got.dtype}, expected {expected.dtype}"
    if got.shape != expected.shape:
        return f"{where}: shape {got.shape}, expected {expected.shape}"
    if expected.dtype == object or expected.dtype.kind in "USb":
        return None if np.array_equal(expected, got) else f"{where}: values differ"
    e = expected.astype(np.float64) if expected.dtype.kind not in "c" else expected
    g = got.astype(np.float64) if got.dtype.kind not in "c" else got
    try:
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError:
        bad = ~np.isclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
        return f"{where}: {int(bad.sum())} of {e.size} values differ (max abs error {np.nanmax(np.abs(g - e)):.3g})"
    return None


async def run_case(case: Case, config: Any, runtime: Any) -> Outcome:
    from . import AiomnnError, Interpreter

    try:
        if case.model_dir is not None:
            net = Interpreter.from_file(os.path.join(case.model_dir, "model.onnx"))
        else:
            net = Interpreter.from_bytes(case.model)
        session = await net.create_session(config, runtime)
        placed: tuple[str, ...] = ()
        try:
            for inputs, outputs in case.data_sets:
                feeds = dict(zip(net.input_names, inputs))
                with warnings.catch_warnings(), np.errstate(all="ignore"):
                    warnings.simplefilter("ignore")
                    got = await session.run(feeds)
                ran = tuple(s.backend.type.value for s in session.pipeline.segments)
                placed = tuple(dict.fromkeys(placed + ran))
                if len(got) != len(outputs):
                    return Outcome(case, False, f"{len(got)} outputs, expected {len(outputs)}", placed)
                for name, e in zip(net.output_names, outputs):
                    why = compare(e, got[name], case.rtol, case.atol, name)
                    if why:
                        return Outcome(case, False, why, placed)
        finally:
            await session.close()
    except AiomnnError as exc:
        return Outcome(case, False, f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # a bug, not a clean refusal: report it loudly
        return Outcome(case, False, f"CRASH {type(exc).__name__}: {exc}")
    return Outcome(case, True, placed=placed)


async def run_suite(backend: str = "cpu", kinds: Iterable[str] = KINDS, cases: list[Case] | None = None,
                    match: str | None = None) -> list[Outcome]:
    import re

    from . import BackendConfig, ScheduleConfig, create_runtime

    config = ScheduleConfig(type=backend, backend_config=BackendConfig(tuning="none"))
    runtime = create_runtime([config])
    try:
        cases = cases if cases is not None else load_cases(kinds)
        if match:
            cases = [c for c in cases if re.search(match, c.name)]
        return [await run_case(c, config, runtime) for c in cases]
    finally:
        runtime.close()


def report(outcomes: list[Outcome], list_failures: bool = True) -> str:
    lines = []
    if list_failures:
        for o in outcomes:
            if not o.passed:
                lines.append(f"FAIL {o.case.kind}/{o.case.name}: {o.reason}")
    by_op: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for o in outcomes:
        for op in o.case.op_types or ("(none)",):
            by_op[op][0 if o.passed else 1] += 1
    lines.append("per op type (cases passed/failed):")
    for op in sorted(by_op):
        p, f = by_op[op]
        lines.append(f"  {op:28s} {p:4d} passed {f:4d} failed")
    passed = sum(o.passed for o in outcomes)
    lines.append(f"{passed} passed, {len(outcomes) - passed} failed")
    backends = collections.Counter(o.placed[0] for o in outcomes if len(o.placed) == 1)
    for backend, n in sorted(backends.items()):
        whole = sum(o.passed and o.placed == (backend,) for o in outcomes)
        lines.append(f"{whole} of {len(outcomes)} cases passed running wholly on {backend}")
    return "\n".join(lines)
