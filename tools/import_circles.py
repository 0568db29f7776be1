"""Import circles among the modules of aiomnn/ and backends/ (issue 26): prints each set of modules that import
one another round in a circle, with the imports inside it, and exits with status 1 if there is any.

    python tools/import_circles.py [--deferred | --all]

It reads the source with `ast` and imports nothing. The package `aiomnn.backends` lives in the folder backends/
(pyproject.toml's `package-dir`); relative imports resolve against the module's own package.

By default only imports that run when the module is imported count: those at module level, in class bodies and
in module-level `if`, `try`, `with` and `for` blocks. Imports inside functions run later, once both modules
exist, and those under `if TYPE_CHECKING:` never run, so neither can make an import fail halfway: both are left
out. `--deferred` counts the imports inside functions too (a circle that only a function-level import closes is
still two modules that need each other); `--all` counts type-only imports as well, as issue 26 counted its five
circles.

An import names one module: `import a.b` and `from a import b` (b a module) count as importing a.b, `from a
import f` as importing a. The packages above a module, which Python imports on the way, are not counted, or
every package's `__init__` would be in a circle with everything it re-exports.

A circle is a strongly connected component of that graph with more than one module.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_dirs(root: Path) -> dict[str, Path]:
    """The top-level packages and where they live: pyproject's `package-dir` (a package maps to its folder)."""
    with open(root / "pyproject.toml", "rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {name: root / folder for name, folder in mapping.items()}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module under the mapped folders: dotted name -> file (a package is its __init__.py)."""
    found: dict[str, Path] = {}
    for package, folder in package_dirs(root).items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if "__pycache__" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(body: list[ast.stmt], deferred: bool, type_only: bool):
    """The import statements among these statements and the blocks inside them: those inside functions only if
    `deferred`, those under `if TYPE_CHECKING:` only if `type_only`."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not deferred:
            continue
        elif isinstance(node, ast.If) and _type_checking(node.test) and not type_only:
            yield from _statements(node.orelse, deferred, type_only)
        else:
            blocks = [getattr(node, field, []) for field in ("body", "orelse", "finalbody")]
            blocks += [handler.body for handler in getattr(node, "handlers", [])]
            blocks += [case.body for case in getattr(node, "cases", [])]
            for block in blocks:
                if isinstance(block, list):
                    yield from _statements(block, deferred, type_only)


def imports(name: str, path: Path, known: set[str], deferred: bool = False, type_only: bool = False) -> set[str]:
    """The modules in `known` that module `name` (at `path`) imports: at import time, and inside functions if
    `deferred`, and under `if TYPE_CHECKING:` if `type_only`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _statements(ast.parse(path.read_text(), str(path)).body, deferred, type_only):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        for target in targets:
            while target and target not in known:  # `import a.b.c` of a package a.b that has no module c
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph(root: Path = ROOT, deferred: bool = False, type_only: bool = False) -> dict[str, set[str]]:
    """Each module -> the modules of the tree it imports (see imports)."""
    found = modules(root)
    known = set(found)
    return {name: imports(name, path, known, deferred, type_only) for name, path in found.items()}


def components(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                out.append(sorted(members))
    return out


def circles(root: Path = ROOT, deferred: bool = False, type_only: bool = False) -> list[list[str]]:
    """The import circles of the tree: components of more than one module, each sorted, in order."""
    return sorted(c for c in components(graph(root, deferred, type_only)) if len(c) > 1)


def main(argv: list[str]) -> int:
    if set(argv) - {"--deferred", "--all"}:
        sys.exit(__doc__)
    view = {"deferred": bool({"--deferred", "--all"} & set(argv)), "type_only": "--all" in argv}
    edges = graph(**view)
    found = sorted(c for c in components(edges) if len(c) > 1)
    for members in found:
        inside = set(members)
        print(f"{len(members)} modules: {', '.join(members)}")
        for name in members:
            print(f"    {name} -> {', '.join(sorted(edges[name] & inside))}")
    print(f"{len(found)} import circle{'s' if len(found) != 1 else ''} among {len(edges)} modules")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
