"""The compiled loops never reach freed memory through a borrowed view or a raw address.

numba frees an array right after its last use by name. A view from scalars.borrow holds no reference, and an
address (`a.ctypes.data`) handed to BLAS is no use by name either: an array made inside a loop body and
reached only that way was freed while the loop still wrote and read it (rare wrong results under load, when
another thread's allocation took the memory). The rule, checked on the source of every loop: inside a loop
body, an array the body makes is never borrowed, and after the last time its address is taken, its name is
used again."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

pytest.importorskip("numba")

from aiomnn.backends.cpu import loops, planes, tiles  # noqa: E402


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


def _problems(fn) -> list[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    found = []
    for loop in [n for n in ast.walk(tree) if isinstance(n, ast.For)]:
        made = _made_arrays(loop.body)
        statements = loop.body
        for name in made:
            uses = [i for i, st in enumerate(statements) for n in ast.walk(st)
                    if isinstance(n, ast.Name) and n.id == name]
            addressed = [i for i, st in enumerate(statements) for n in ast.walk(st)
                         if isinstance(n, ast.Attribute) and n.attr == "ctypes"
                         and isinstance(n.value, ast.Name) and n.value.id == name]
            borrowed = [n for st in statements for n in ast.walk(st) if isinstance(n, ast.Call)
                        and getattr(n.func, "id", "") == "borrow" and any(
                            isinstance(a, ast.Name) and a.id == name for a in n.args)]
            if borrowed:
                found.append(f"{fn.__name__}: {name} is made in a loop body and borrowed")
            if addressed and max(uses) <= max(addressed):
                found.append(f"{fn.__name__}: {name}'s address is taken after its last use by name")
    return found


LOOPS = [f for m in (loops, planes, tiles) for _, f in inspect.getmembers(m, inspect.isfunction) if f.__module__ == m.__name__]


@pytest.mark.parametrize("fn", LOOPS, ids=[f"{f.__module__.rsplit('.', 1)[1]}.{f.__name__}" for f in LOOPS])
def test_no_loop_reaches_freed_memory(fn):
    assert not _problems(fn)


def test_the_check_finds_both_mistakes():
    def borrowed(n):
        for c in range(n):
            store = np.empty(8)  # noqa: F821
            t = borrow(store)  # noqa: F821, F841

    def addressed(n, a):
        for c in range(n):
            scores = np.empty(8)  # noqa: F821
            a[c] = scores[0]
            product(scores.ctypes.data)  # noqa: F821

    assert _problems(borrowed) == ["borrowed: store is made in a loop body and borrowed"]
    assert _problems(addressed) == ["addressed: scores's address is taken after its last use by name"]
