"""The ONNX backend test suite on every backend available here.

tests/conformance/<backend>.txt lists the cases expected to fail on that
backend, one per line with the reason after '#'. They are strict xfails: a
regression fails, and a case that starts passing fails too until the list is
updated (`aiomnn conformance --backend cpu --write-xfail tests/conformance/cpu.txt`).
A case that crashes (anything but a clean AiomnnError or a wrong value) is never an expected failure.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aiomnn import conformance
from aiomnn.runtime import probe
from aiomnn.config import ForwardType
from aiomnn.constants import NONDETERMINISTIC as RANDOM

LISTS = Path(__file__).parent / "conformance"
CASES = conformance.load_cases()
BACKENDS = [t.value for t in (ForwardType.CPU, ForwardType.OPENCL, ForwardType.VULKAN, ForwardType.CUDA) if probe(t)]


def expected_failures(backend: str) -> dict[str, str]:
    path = LISTS / f"{backend}.txt"
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        name, _, reason = line.partition("#")
        if name.strip():
            out[name.strip()] = reason.strip()
    return out


def params():
    for backend in BACKENDS:
        xfails = expected_failures(backend)
        for case in CASES:
            key = f"{case.kind}/{case.name}"
            if key not in xfails:
                marks = []
            elif RANDOM & set(case.op_types):  # a random draw can match by chance: not strict
                marks = [pytest.mark.xfail(strict=False, raises=AssertionError, reason="random values: " + xfails[key])]
            else:
                marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=xfails[key])]
            yield pytest.param(backend, case, id=f"{backend}-{key}", marks=marks)


@pytest.fixture(scope="module")
def runtimes():
    import aiomnn

    made = {}

    def get(backend: str):
        if backend not in made:
            config = aiomnn.ScheduleConfig(type=backend, backend_config=aiomnn.BackendConfig(tuning="none"))
            made[backend] = (config, aiomnn.create_runtime([config]))
        return made[backend]

    yield get
    for _, rt in made.values():
        rt.close()


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("backend,case", list(params()))
def test_case(backend, case, runtimes):
    config, runtime = runtimes(backend)
    outcome = asyncio.run(conformance.run_case(case, config, runtime))
    if outcome.reason.startswith("CRASH"):
        raise RuntimeError(outcome.reason)
    assert outcome.passed, outcome.reason
