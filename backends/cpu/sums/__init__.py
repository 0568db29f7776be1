"""The blocks of sums that the compiled tile loops (tiles.py) inline, one module a tile shape, written by
tools/make_tiles.py. tile() imports just the one a process uses (its vector width: vectors.py)."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def tile(loop: str, rows: int, columns: int) -> Callable[..., Any]:
    """The block of sums of `loop` ("conv" or "dense") for a tile of rows x columns."""
    name = f"{loop}_{rows}x{columns}"
    return getattr(importlib.import_module(f"{__name__}.{name}"), name)
