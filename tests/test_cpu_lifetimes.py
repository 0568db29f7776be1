"""The compiled loops never reach freed memory through a raw address.

numba frees an array right after its last use by name, and an address (`a.ctypes.data`) handed to BLAS or to the
crew's pieces is no use by name: an array reached only that way was freed while the loop still wrote and read it
(rare wrong results under load, when another thread's allocation took the memory). The rule, checked on the
source of every loop: after the last time an array's address is taken, its name is used again; inside a loop
body, by the body itself, for an array the body makes."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

pytest.importorskip("numba")

from aiomnn.backends.cpu import crew, loops, planes, tiles  # noqa: E402


def _made_arrays(body: list[ast.stmt]) -> set[str]:
    """Names the statements bind to np.empty / np.zeros / np.ones results."""
    names = set()
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Call, ast.Tuple)):
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            targets = node.targets[0].elts if isinstance(node.targets[0], ast.Tuple) else node.targets
            for target, value in zip(targets, values):
                if (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                        and value.func.attr in ("empty", "zeros", "ones") and isinstance(target, ast.Name)):
                    names.add(target.id)
    return names


def _late_addresses(name: str, statements: list[ast.stmt]) -> bool:
    """Whether the last of the statements that take name's address comes after (or is) the last that uses it."""
    uses = [i for i, st in enumerate(statements) for n in ast.walk(st) if isinstance(n, ast.Name) and n.id == name]
    addressed = [i for i, st in enumerate(statements) for n in ast.walk(st)
                 if isinstance(n, ast.Attribute) and n.attr == "ctypes" and isinstance(n.value, ast.Name)
                 and n.value.id == name]
    return bool(addressed) and max(uses) <= max(addressed)


def _problems(fn) -> list[str]:
    function = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    bodies = [function.body] + [n.body for n in ast.walk(function) if isinstance(n, ast.For)]
    return sorted({f"{fn.__name__}: {name}'s address is taken after its last use by name"
                   for body in bodies for name in _made_arrays(body) if _late_addresses(name, body)})


LOOPS = [f for m in (loops, planes, tiles, crew) for _, f in inspect.getmembers(m, inspect.isfunction)
         if f.__module__ == m.__name__]


@pytest.mark.parametrize("fn", LOOPS, ids=[f"{f.__module__.rsplit('.', 1)[1]}.{f.__name__}" for f in LOOPS])
def test_no_loop_reaches_freed_memory(fn):
    assert not _problems(fn)


def test_the_check_finds_the_mistake():
    def in_a_loop(n, a):
        for c in range(n):
            scores = np.empty(8)  # noqa: F821
            a[c] = scores[0]
            product(scores.ctypes.data)  # noqa: F821

    def in_the_function(n):
        args = np.empty(8)  # noqa: F821
        args[0] = n
        run(args.ctypes.data)  # noqa: F821

    assert _problems(in_a_loop) == ["in_a_loop: scores's address is taken after its last use by name"]
    assert _problems(in_the_function) == ["in_the_function: args's address is taken after its last use by name"]
