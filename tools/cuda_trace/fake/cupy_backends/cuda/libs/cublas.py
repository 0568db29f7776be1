"""Fake: makes ctypes.CDLL hand out a cuBLAS whose calls all succeed (and trace GEMMs)."""
import ctypes

_real = ctypes.CDLL


class _Fn:
    def __init__(self, name):
        self.name = name

    def __call__(self, *args):
        if self.name == "cublasGemmStridedBatchedEx":
            import cupy
            cupy.TRACE.append(("gemm",) + tuple(cupy.norm(a) if isinstance(a, int) and a > 1 << 30 else a
                                                for a in args[1:]))
        return 0


class _Lib:
    def __getattr__(self, name):
        fn = _Fn(name)
        setattr(self, name, fn)
        return fn


def CDLL(name, *a, **k):
    if "cublas" in str(name):
        return _Lib()
    return _real(name, *a, **k)


ctypes.CDLL = CDLL
