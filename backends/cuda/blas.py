"""cuBLAS through ctypes: a handle per backend, bound to its stream, with its own workspace.

cupy's cuBLAS wrappers refuse to run while a stream is being captured, so the
GEMMs that go into a CUDA graph call libcublas directly. The library is the one
cupy already loaded; a handle is bound to one stream and given a fixed
workspace, as graph capture requires.
"""

from __future__ import annotations

import ctypes
import threading

_lib = None
_lock = threading.Lock()

CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1
WORKSPACE_BYTES = 32 << 20


def library() -> ctypes.CDLL:
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        from cupy_backends.cuda.libs import cublas as _cupy_cublas  # noqa: F401  (loads libcublas)

        path = None
        try:
            with open("/proc/self/maps") as f:
                for line in f:
                    name = line.rsplit(None, 1)[-1] if "/" in line else ""
                    base = name.rsplit("/", 1)[-1]
                    if base.startswith("libcublas.so"):
                        path = name
                        break
        except OSError:
            pass
        lib = None
        for cand in ([path] if path else []) + ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]:
            try:
                lib = ctypes.CDLL(cand)
                break
            except OSError:
                continue
        if lib is None:
            raise OSError("libcublas could not be loaded")
        vp, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
        lib.cublasCreate_v2.argtypes = [ctypes.POINTER(vp)]
        lib.cublasDestroy_v2.argtypes = [vp]
        lib.cublasSetStream_v2.argtypes = [vp, vp]
        lib.cublasSetWorkspace_v2.argtypes = [vp, vp, ctypes.c_size_t]
        lib.cublasGemmStridedBatchedEx.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, ll, vp, i, i, ll, vp, vp, i, i, ll,
                                                   i, i, i]
        for fn in (lib.cublasCreate_v2, lib.cublasDestroy_v2, lib.cublasSetStream_v2, lib.cublasSetWorkspace_v2,
                   lib.cublasGemmStridedBatchedEx):
            fn.restype = ctypes.c_int
        _lib = lib
        return lib


class Blas:
    """One cuBLAS handle on one stream."""

    def __init__(self, stream_ptr: int, workspace) -> None:
        self.lib = library()
        h = ctypes.c_void_p()
        self._check(self.lib.cublasCreate_v2(ctypes.byref(h)), "cublasCreate")
        self.handle = h
        self.workspace = workspace
        self._check(self.lib.cublasSetStream_v2(h, ctypes.c_void_p(stream_ptr)), "cublasSetStream")
        self._check(self.lib.cublasSetWorkspace_v2(h, ctypes.c_void_p(workspace.ptr), WORKSPACE_BYTES),
                    "cublasSetWorkspace")

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} failed with cuBLAS status {status}")

    def gemm(self, op_a, op_b, m, n, k, alpha, a, at, lda, sa, b, bt, ldb, sb, beta, c, ct, ldc, sc, batch) -> None:
        self._check(self.lib.cublasGemmStridedBatchedEx(self.handle, op_a, op_b, m, n, k, alpha, a, at, lda, sa, b, bt,
                                                        ldb, sb, beta, c, ct, ldc, sc, batch, CUBLAS_COMPUTE_32F,
                                                        CUBLAS_GEMM_DEFAULT), "cublasGemmStridedBatchedEx")

    def close(self) -> None:
        if self.handle:
            self.lib.cublasDestroy_v2(self.handle)
            self.handle = None
