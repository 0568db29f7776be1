"""Classic machine-learning ops of the ai.onnx.ml domain: what they share, and the label encoders.

Provided here: LabelEncoder (opsets 1 to 4) and CategoryMapper, and the Lookup
table that they and OneHotEncoder map keys with. The other feature transforms
(ArrayFeatureExtractor, Binarizer, Scaler, Imputer, OneHotEncoder,
FeatureVectorizer) are in ml_features.py; the scoring ops are in ml_scoring.py
(LinearRegressor, the post transforms) and ml_trees.py (the tree ensembles).
String tensors are numpy object arrays of Python str.

Not provided, because their specifications leave results open (implementations
disagree): Normalizer, LinearClassifier, TreeEnsembleClassifier, SVM*, ZipMap,
DictVectorizer, CastMap.

Where the spec is explicit it is followed even where onnxruntime differs:
LabelEncoder opset 4's last repeated key wins, and opsets 2-3 compare float keys
bitwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..execution import CpuOp, Unsupported, op

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


# ------------------------------------------------------------------------- LabelEncoder
class Lookup:
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


class LabelEncoder(CpuOp):
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
        self.lookup = Lookup(keys, values, default, out_dtype, nan_matches=node.opset >= 4,
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
class CategoryMapper(CpuOp):
    def __init__(self, node, inputs, outputs, cats_int64s=None, cats_strings=None, default_int64=-1,
                 default_string="_Unused"):
        super().__init__(node, inputs, outputs)
        ints, strs = list(cats_int64s or []), list(cats_strings or [])
        if len(ints) != len(strs):
            raise Unsupported(f"cats_int64s has {len(ints)} values, cats_strings {len(strs)}")
        s = np.empty(len(strs), dtype=object)
        s[:] = strs
        i = np.asarray(ints, dtype=np.int64)
        self.to_int = Lookup(s, i, int(default_int64), I64)
        self.to_str = Lookup(i, s, default_string, OBJ)

    def run(self, x):
        if is_string(x):
            return self.to_int(x)
        if x.dtype != I64:
            raise TypeError(f"CategoryMapper takes string or int64, not {x.dtype}")
        return self.to_str(x)


op("CategoryMapper", 1, domain=ML)(CategoryMapper)
