"""Classic machine-learning ops of the ai.onnx.ml domain: the feature transforms.

Provided here: ArrayFeatureExtractor, Binarizer, LabelEncoder (opsets 1 to 4),
CategoryMapper, Scaler, Imputer, OneHotEncoder and FeatureVectorizer; the
scoring ops (LinearRegressor and the tree ensembles) are in ml_scoring.py.
String tensors are numpy object arrays of Python str.

Not provided, because their specifications leave results open (implementations
disagree): Normalizer, LinearClassifier, TreeEnsembleClassifier, SVM*, ZipMap,
DictVectorizer, CastMap.

Where the spec is explicit it is followed even where onnxruntime differs:
LabelEncoder opset 4's last repeated key wins, and opsets 2-3 compare float keys
bitwise. Where it is silent and implementations disagree, the node is refused:
repeated OneHotEncoder categories.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..kernel import Kernel, Unsupported, op

ML = "ai.onnx.ml"
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
I64 = np.dtype(np.int64)
OBJ = np.dtype(object)


def is_string(x: np.ndarray) -> bool:
    return x.dtype == OBJ or x.dtype.kind in "US"


def _strings(x: np.ndarray) -> np.ndarray:
    """x as an object array of str (numpy U/S arrays are accepted too)."""
    if x.dtype == OBJ:
        return x
    if x.dtype.kind == "S":
        return np.vectorize(lambda b: b.decode("utf-8", errors="replace"), otypes=[object])(x).reshape(x.shape)
    return x.astype(object)


def _object_full(shape: tuple[int, ...], value: str) -> np.ndarray:
    out = np.empty(shape, dtype=object)
    out.fill(value)
    return out


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


# ------------------------------------------------------------------------- LabelEncoder
class _Lookup:
    """Maps keys to values; keys not found map to `default`. Of repeated keys the last wins, or the first."""

    def __init__(self, keys: np.ndarray, values: np.ndarray, default: Any, out_dtype: np.dtype,
                 nan_matches: bool = True, bitwise: bool = False, last_wins: bool = True):
        if keys.shape[0] != values.shape[0]:
            raise Unsupported(f"{keys.shape[0]} keys but {values.shape[0]} values")
        if not last_wins:
            keys, values = keys[::-1], values[::-1]
        self.key_dtype = keys.dtype
        self.out_dtype = out_dtype
        self.values = values if out_dtype == OBJ else values.astype(out_dtype)
        self.default = default
        self.is_str = keys.dtype == OBJ
        self.bitwise = bitwise and keys.dtype.kind == "f"
        if self.is_str:
            self.table = {str(k): i for i, k in enumerate(keys.tolist())}
            return
        at = np.arange(keys.shape[0])  # the value index of each key left in the table
        self.nan_index = None
        if self.bitwise:
            keys = keys.view(np.dtype(f"u{keys.dtype.itemsize}"))
        elif keys.dtype.kind == "f":
            nan = np.isnan(keys)
            if nan.any():
                # NaN keys leave the sorted table; every NaN input gets the last NaN key's value.
                if nan_matches:
                    self.nan_index = int(np.flatnonzero(nan)[-1])
                at = np.flatnonzero(~nan)
                keys = keys[at]
        # Last occurrence of each key: unique over the reversed keys gives the first of the reversal.
        uniq, first = np.unique(keys[::-1], return_index=True)
        self.keys = uniq
        self.pos = at[len(keys) - 1 - first].astype(np.int64)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.is_str:
            flat = _strings(x).reshape(-1)
            out = np.empty(flat.shape, dtype=self.out_dtype)
            get = self.table.get
            idx = np.fromiter((get(s, -1) for s in flat), dtype=np.int64, count=flat.size)
        else:
            flat = x.reshape(-1)
            if self.bitwise:
                flat = flat.view(np.dtype(f"u{flat.dtype.itemsize}"))
            idx = np.full(flat.shape, -1, dtype=np.int64)
            if self.keys.size:
                at = np.searchsorted(self.keys, flat)
                at_c = np.minimum(at, self.keys.size - 1)
                hit = (at < self.keys.size) & (self.keys[at_c] == flat)
                idx[hit] = self.pos[at_c[hit]]
            if self.nan_index is not None:
                idx[np.isnan(flat)] = self.nan_index
            out = np.empty(flat.shape, dtype=self.out_dtype)
        found = idx >= 0
        out[~found] = self.default
        out[found] = self.values[idx[found]]
        return out.reshape(x.shape)


_LIST_KEYS = {"strings": OBJ, "int64s": I64, "floats": F32}


def _type_default(dt: np.dtype) -> Any:
    if dt == OBJ:
        return "_Unused"
    if dt.kind in "iu":
        return -1
    return -0.0


class LabelEncoder(Kernel):
    def __init__(self, node, inputs, outputs, classes_strings=None, default_int64=None, default_string=None,
                 default_float=None, default_tensor=None, keys_strings=None, keys_int64s=None, keys_floats=None,
                 keys_tensor=None, values_strings=None, values_int64s=None, values_floats=None,
                 values_tensor=None):
        super().__init__(node, inputs, outputs)
        self.v1 = node.opset < 2
        if self.v1:
            extra = [n for n, v in (("default_float", default_float), ("default_tensor", default_tensor),
                                    ("keys_strings", keys_strings), ("keys_int64s", keys_int64s),
                                    ("keys_floats", keys_floats), ("keys_tensor", keys_tensor),
                                    ("values_strings", values_strings), ("values_int64s", values_int64s),
                                    ("values_floats", values_floats), ("values_tensor", values_tensor))
                     if v is not None]
            if extra:
                raise Unsupported(f"opset 1 LabelEncoder has no attribute(s) {', '.join(extra)}")
            self.classes = list(classes_strings or [])
            self.index = {s: i for i, s in enumerate(self.classes)}  # a repeated class maps to its last index
            self.default_int64 = -1 if default_int64 is None else int(default_int64)
            self.default_string = "_Unused" if default_string is None else default_string
            return
        if classes_strings is not None:
            raise Unsupported(f"classes_strings belongs to opset 1, not {node.opset}")
        if node.opset < 4 and (keys_tensor is not None or values_tensor is not None or default_tensor is not None):
            raise Unsupported(f"the *_tensor attributes need opset 4, the model has {node.opset}")
        keys = self._pick("keys", {"strings": keys_strings, "int64s": keys_int64s, "floats": keys_floats,
                                   "tensor": keys_tensor})
        values = self._pick("values", {"strings": values_strings, "int64s": values_int64s,
                                       "floats": values_floats, "tensor": values_tensor})
        out_dtype = values.dtype
        if default_tensor is not None:
            if values_tensor is None:
                raise Unsupported("default_tensor goes with values_tensor")
            d = np.asarray(default_tensor).reshape(-1)
            if d.size != 1 or (d.dtype == OBJ) != (out_dtype == OBJ):
                raise Unsupported(f"default_tensor must hold one value of the values' type, got {d.dtype} {d.shape}")
            default = d[0] if out_dtype == OBJ else d.astype(out_dtype)[0]
        else:
            by_kind = default_string if out_dtype == OBJ else default_int64 if out_dtype.kind in "iu" else default_float
            default = _type_default(out_dtype) if by_kind is None else by_kind
            if out_dtype != OBJ:
                with np.errstate(all="ignore"):
                    if out_dtype.kind in "iu" and not np.can_cast(np.min_scalar_type(default), out_dtype):
                        raise Unsupported(f"default {default} does not fit {out_dtype}")
                    default = np.asarray(default).astype(out_dtype)[()]
        # Opsets 2-3 compare float keys bit for bit, and the first of repeated keys wins (as onnxruntime
        # does); opset 4 matches every NaN to a NaN key, and the last of repeated keys wins.
        self.lookup = _Lookup(keys, values, default, out_dtype, nan_matches=node.opset >= 4,
                              bitwise=node.opset < 4, last_wins=node.opset >= 4)

    @staticmethod
    def _pick(what: str, options: dict[str, Any]) -> np.ndarray:
        given = [k for k, v in options.items() if v is not None]
        if len(given) != 1:
            raise Unsupported(f"exactly one {what}_* attribute must be set, got {given or 'none'}")
        kind = given[0]
        v = options[kind]
        if kind == "tensor":
            arr = np.asarray(v).reshape(-1)
            if arr.dtype != OBJ and arr.dtype.kind not in "iuf":
                raise Unsupported(f"{what}_tensor of type {arr.dtype}")
            return arr
        if kind == "strings":
            arr = np.empty(len(v), dtype=object)
            arr[:] = list(v)
            return arr
        return np.asarray(v, dtype=_LIST_KEYS[kind])

    def run(self, x):
        if self.v1:
            if is_string(x):
                flat = _strings(x).reshape(-1)
                get, d = self.index.get, self.default_int64
                return np.fromiter((get(s, d) for s in flat), dtype=np.int64, count=flat.size).reshape(x.shape)
            if x.dtype != I64:
                raise TypeError(f"opset 1 LabelEncoder takes string or int64, not {x.dtype}")
            n = len(self.classes)
            flat = x.reshape(-1)
            out = _object_full(flat.shape, self.default_string)
            ok = (flat >= 0) & (flat < n)
            if ok.any():
                table = np.empty(n, dtype=object)
                table[:] = self.classes
                out[ok] = table[flat[ok]]
            return out.reshape(x.shape)
        want = self.lookup.key_dtype
        if (want == OBJ) != is_string(x) or (want != OBJ and x.dtype != want):
            raise TypeError(f"LabelEncoder keys are {'string' if want == OBJ else want}, the input is {x.dtype}")
        return self.lookup(x)


op("LabelEncoder", 1, domain=ML)(LabelEncoder)


# ----------------------------------------------------------------------- CategoryMapper
class CategoryMapper(Kernel):
    def __init__(self, node, inputs, outputs, cats_int64s=None, cats_strings=None, default_int64=-1,
                 default_string="_Unused"):
        super().__init__(node, inputs, outputs)
        ints, strs = list(cats_int64s or []), list(cats_strings or [])
        if len(ints) != len(strs):
            raise Unsupported(f"cats_int64s has {len(ints)} values, cats_strings {len(strs)}")
        s = np.empty(len(strs), dtype=object)
        s[:] = strs
        i = np.asarray(ints, dtype=np.int64)
        self.to_int = _Lookup(s, i, int(default_int64), I64)
        self.to_str = _Lookup(i, s, default_string, OBJ)

    def run(self, x):
        if is_string(x):
            return self.to_int(x)
        if x.dtype != I64:
            raise TypeError(f"CategoryMapper takes string or int64, not {x.dtype}")
        return self.to_str(x)


op("CategoryMapper", 1, domain=ML)(CategoryMapper)


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


class Scaler(Kernel):
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
class Imputer(Kernel):
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
class OneHotEncoder(Kernel):
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
        self.lookup = _Lookup(keys, np.arange(n, dtype=np.int64), -1, I64, nan_matches=False)
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
class FeatureVectorizer(Kernel):
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
