"""numpy's BLAS library: its thread count (the CPU runtime keeps it at one; see runtime.py), and its
matrix product for the compiled loops (loops.gemm).

numpy's wheels bundle OpenBLAS under a prefixed name; find it among the loaded
libraries. Other BLAS builds are left alone.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from typing import Any, Callable

log = logging.getLogger("aiomnn")
#: cblas_sgemm under the names that numpy's BLAS builds give it: 64-bit integers first (numpy's own wheels).
_SGEMM = ("scipy_cblas_sgemm64_", "cblas_sgemm64_", "scipy_cblas_sgemm", "cblas_sgemm")
_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads", "MKL_Set_Num_Threads")


def _loaded_blas() -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "blas" in line.lower() or "mkl" in line.lower()}
    except OSError:
        return []
    return sorted(p for p in paths if p.endswith(".so") or ".so." in p or p.endswith(".dylib"))


def _function(names: tuple[str, ...]) -> Any:
    """The first of these functions that a loaded BLAS library exports (ctypes), None if none does."""
    import numpy  # noqa: F401  (loads the BLAS library)

    for path in _loaded_blas():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in names:
            fn = getattr(lib, name, None)
            if fn is not None:
                return fn
    return None


@functools.cache
def _setter() -> Callable[[int], None] | None:
    fn = _function(_SETTERS)
    if fn is None:
        log.debug("no BLAS thread setter found; BLAS threads are not bounded")
        return None
    return lambda n: fn(ctypes.c_int(n))


def limit_threads(n: int) -> bool:
    """Set the BLAS thread count (about a microsecond once the library is found); False if unknown."""
    setter = _setter()
    if setter is None:
        return False
    setter(n)
    return True


@functools.cache
def sgemm_address() -> int | None:
    """The address of numpy's cblas_sgemm, None where none is found. Its integer arguments are passed as 64-bit
    values, which a build with 32-bit integers reads correctly on x86-64 (the low half of each register and
    stack slot), the only machine where the compiled loops use it."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    fn = _function(_SGEMM)
    return None if fn is None else ctypes.cast(fn, ctypes.c_void_p).value
