"""The numeric and categorical feature transforms of the ai.onnx.ml domain: ArrayFeatureExtractor,
Binarizer, Scaler, Imputer, OneHotEncoder and FeatureVectorizer (ml.py says what the domain provides).

Where the spec is silent and implementations disagree, the node is refused: repeated OneHotEncoder
categories.
"""

from __future__ import annotations

import numpy as np

from ..execution import CpuOp, Unsupported, op
from .ml import F32, F64, I64, ML, Lookup, is_string


# ------------------------------------------------------------------ ArrayFeatureExtractor
def array_feature_extractor(x, y):
    if x.ndim == 0:
        raise ValueError("ArrayFeatureExtractor needs an input of rank 1 or more")
    if y.dtype.kind not in "iu":
        raise TypeError(f"the indices must be int64, not {y.dtype}")
    idx = y.reshape(-1).astype(np.int64)
    size = x.shape[-1]
    bad = (idx < 0) | (idx >= size)
    if bad.any():
        raise ValueError(f"index {int(idx[bad][0])} is out of range for a last dimension of {size}")
    z = x[..., idx]
    return z.reshape(1, idx.size) if x.ndim == 1 else z


op("ArrayFeatureExtractor", 1, domain=ML)(array_feature_extractor)


# --------------------------------------------------------------------------- Binarizer
def binarizer(x, threshold=0.0):
    if is_string(x) or x.dtype.kind not in "iuf":
        raise TypeError(f"Binarizer does not take {x.dtype}")
    return (x > threshold).astype(x.dtype)


op("Binarizer", 1, domain=ML)(binarizer)


# ------------------------------------------------------------------------------ Scaler
def check_numeric(x: np.ndarray, op_type: str) -> None:
    if is_string(x) or x.dtype.kind not in "iuf":
        raise TypeError(f"{op_type} takes float, double, int64 or int32, not {x.dtype}")


def _per_feature(values: list[float], x: np.ndarray, what: str) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    if v.size == 1:
        return v.reshape(())
    if x.ndim == 0 or v.size != x.shape[-1]:
        raise ValueError(f"{what} has {v.size} values; the input has {x.shape[-1] if x.ndim else 1} features")
    return v


class Scaler(CpuOp):
    def __init__(self, node, inputs, outputs, offset=None, scale=None):
        super().__init__(node, inputs, outputs)
        if not scale or offset is None or len(offset) != len(scale):
            raise Unsupported("Scaler needs scale and offset of the same, non-zero length")
        self.offset, self.scale = list(offset), list(scale)

    def run(self, x):
        check_numeric(x, "Scaler")
        off = _per_feature(self.offset, x, "offset")
        sc = _per_feature(self.scale, x, "scale")
        if x.dtype == F32:
            return (x - off.astype(F32)) * sc.astype(F32)
        return ((x.astype(F64) - off) * sc).astype(F32)


op("Scaler", 1, domain=ML)(Scaler)


# ----------------------------------------------------------------------------- Imputer
class Imputer(CpuOp):
    def __init__(self, node, inputs, outputs, imputed_value_floats=None, imputed_value_int64s=None,
                 replaced_value_float=0.0, replaced_value_int64=0):
        super().__init__(node, inputs, outputs)
        if (imputed_value_floats is None) == (imputed_value_int64s is None):
            raise Unsupported("exactly one of imputed_value_floats and imputed_value_int64s must be set")
        self.floats = imputed_value_floats is not None
        self.values = list(imputed_value_floats if self.floats else imputed_value_int64s)
        if not self.values:
            raise Unsupported("the imputed values are empty")
        self.replaced = float(replaced_value_float) if self.floats else int(replaced_value_int64)

    def run(self, x):
        check_numeric(x, "Imputer")
        if (x.dtype.kind == "f") != self.floats:
            raise TypeError(f"imputed_value_{'floats' if self.floats else 'int64s'} do not go with a {x.dtype} input")
        v = np.asarray(self.values, dtype=x.dtype)
        if v.size != 1 and (x.ndim == 0 or v.size != x.shape[-1]):
            raise ValueError(f"{v.size} imputed values for {x.shape[-1] if x.ndim else 1} features")
        rep = np.asarray(self.replaced).astype(x.dtype)
        hit = np.isnan(x) if x.dtype.kind == "f" and np.isnan(rep) else x == rep
        return np.where(hit, v, x).astype(x.dtype)


op("Imputer", 1, domain=ML)(Imputer)


# ----------------------------------------------------------------------- OneHotEncoder
class OneHotEncoder(CpuOp):
    def __init__(self, node, inputs, outputs, cats_int64s=None, cats_strings=None, zeros=1):
        super().__init__(node, inputs, outputs)
        if (cats_int64s is None) == (cats_strings is None):
            raise Unsupported("exactly one of cats_int64s and cats_strings must be set")
        self.strings = cats_strings is not None
        cats = list(cats_strings if self.strings else cats_int64s)
        keys = np.empty(len(cats), dtype=object) if self.strings else np.asarray(cats, dtype=np.int64)
        if self.strings:
            keys[:] = cats
        n = len(cats)
        if len(set(cats)) != n:
            raise Unsupported("repeated categories")  # which column gets the 1 is not specified
        self.n = n
        self.lookup = Lookup(keys, np.arange(n, dtype=np.int64), -1, I64, nan_matches=False)
        self.zeros = bool(zeros)

    def run(self, x):
        if self.strings:
            if not is_string(x):
                raise TypeError(f"cats_strings need a string input, not {x.dtype}")
            idx = self.lookup(x)
        else:
            if is_string(x) or x.dtype.kind not in "iuf":
                raise TypeError(f"cats_int64s need a numeric input, not {x.dtype}")
            if x.dtype.kind == "f":
                # Floats are cast to integers (truncated); NaN and out-of-range values match no category.
                ok = np.isfinite(x) & (np.abs(x) < 2.0 ** 63)
                xi = np.where(ok, np.trunc(x), 0).astype(np.int64)
                idx = np.where(ok, self.lookup(xi), -1)
            else:
                idx = self.lookup(x.astype(np.int64))
        if not self.zeros and (idx < 0).any():
            raise ValueError("an input value is not among the categories (zeros=0)")
        out = np.zeros(x.shape + (self.n,), dtype=F32)
        hit = idx >= 0
        out.reshape(-1, self.n)[np.flatnonzero(hit.reshape(-1)), idx.reshape(-1)[hit.reshape(-1)]] = 1.0
        return out


op("OneHotEncoder", 1, domain=ML)(OneHotEncoder)


# -------------------------------------------------------------------- FeatureVectorizer
class FeatureVectorizer(CpuOp):
    def __init__(self, node, inputs, outputs, inputdimensions=None):
        super().__init__(node, inputs, outputs)
        self.dims = list(inputdimensions or [])
        if len(self.dims) != len(node.inputs) or any(d < 0 for d in self.dims):
            raise Unsupported(f"inputdimensions {self.dims} must give one size per input ({len(node.inputs)})")

    def run(self, *xs):
        parts = []
        batch = None
        for x, d in zip(xs, self.dims):
            check_numeric(x, "FeatureVectorizer")
            x2 = x.reshape(1, -1) if x.ndim <= 1 else x.reshape(x.shape[0], -1) if x.ndim > 2 else x
            if batch is None:
                batch = x2.shape[0]
            elif x2.shape[0] != batch:
                raise ValueError(f"inputs have batch sizes {batch} and {x2.shape[0]}")
            # Each input fills exactly its declared width: extra columns are dropped, missing ones are 0.
            part = np.zeros((x2.shape[0], d), dtype=F32)
            w = min(d, x2.shape[1])
            part[:, :w] = x2[:, :w]
            parts.append(part)
        return np.concatenate(parts, axis=1) if parts else np.zeros((0, 0), F32)


op("FeatureVectorizer", 1, domain=ML)(FeatureVectorizer)
