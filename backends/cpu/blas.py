"""Bound the BLAS library's threads, so num_threads holds for GEMMs too.

numpy's wheels bundle OpenBLAS under a prefixed name; find it among the loaded
libraries and call its set_num_threads. Other BLAS builds are left alone.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger("aiomnn")
_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads", "MKL_Set_Num_Threads")


def _loaded_blas() -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "blas" in line.lower() or "mkl" in line.lower()}
    except OSError:
        return []
    return sorted(p for p in paths if p.endswith(".so") or ".so." in p or p.endswith(".dylib"))


def limit_threads(n: int) -> bool:
    import numpy  # noqa: F401  (loads the BLAS library)

    for path in _loaded_blas():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _SETTERS:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn(ctypes.c_int(n))
                return True
    log.debug("no BLAS thread setter found; BLAS threads are not bounded")
    return False
