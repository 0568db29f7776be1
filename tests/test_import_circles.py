"""No import circles anywhere in aiomnn/ and backends/ (issue 26, item 3), as tools/import_circles.py finds them:
neither among the imports that run at import time nor with the imports inside functions counted too (a circle that
only a function-level import closes is still one). Imports under `if TYPE_CHECKING:` are type-only and allowed."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("import_circles", ROOT / "tools" / "import_circles.py")
import_circles = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_circles)

VIEWS = {"import time": {}, "with imports inside functions": {"deferred": True}}


@pytest.mark.parametrize("view", VIEWS)
def test_no_circle(view):
    found = import_circles.circles(**VIEWS[view])
    assert not found, f"import circles in aiomnn/ and backends/ ({view}): {found}"


def test_the_script_finds_circles(tmp_path):
    """On a small tree: a circle at import time, one closed only inside a function, one only for type checkers."""
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools]\npackage-dir = { "pkg" = "src", "pkg.sub" = "sub" }\n')
    files = {
        "src/__init__.py": "",
        "src/a.py": "from . import b\n",
        "src/b.py": "import pkg.a\n",
        "src/c.py": "def f():\n    from .d import g\n",
        "src/d.py": "from pkg import c\n",
        "sub/__init__.py": "",
        "sub/e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .f import F\n",
        "sub/f.py": "from ..sub.e import E\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    assert import_circles.circles(tmp_path) == [["pkg.a", "pkg.b"]]
    assert import_circles.circles(tmp_path, deferred=True) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d"]]
    assert import_circles.circles(tmp_path, deferred=True, type_only=True) == [
        ["pkg.a", "pkg.b"], ["pkg.c", "pkg.d"], ["pkg.sub.e", "pkg.sub.f"]]
