"""A BERT exporter: safetensors weights and a Hugging Face config.json in, an ONNX model out.

Only numpy and `onnx.helper`/`onnx.numpy_helper` are used; the safetensors file is parsed here (an 8-byte
little-endian header length, a JSON header naming each tensor's dtype, shape and data_offsets, then the raw
data), and anything malformed raises ModelError. The same weights give the same ONNX bytes, so a
fetched model can be pinned by SHA-256.

The graph is written the way `torch.onnx.export` writes a Hugging Face `BertModel` (opset 17, plain ops,
no fused contrib ops), so that what a backend fuses here it also fuses in an exported model.

Inputs `input_ids`, `attention_mask`, `token_type_ids`: int64 [batch, sequence].
Outputs `last_hidden_state` float32 [batch, sequence, hidden] and `sentence_embedding` float32
[batch, hidden] (sentence-transformers' mean pooling over the mask, then L2 normalisation).

The pattern, node by node (X @ W is MatMul with the weight transposed to [in, out]; "+ b" is
Add(bias, X @ W), bias first, as torch writes a Linear):

    embeddings   Gather(word, input_ids) + Gather(token_type, token_type_ids)     Add
                 + Gather(position, Slice(position_ids, [0], Unsqueeze(Gather(Shape(input_ids), 1)), [1]))
                 LayerNormalization(axis=-1, epsilon)
    mask, once   Unsqueeze(attention_mask, [1, 2]) -> Cast(float) -> Sub(1, m) -> Mul(., float32 min)
                 giving [batch, 1, 1, sequence]
    shapes, once Shape(input_ids) -> Concat(., [heads, head_size]) and Concat(., [hidden])
    per layer    Q, K, V: MatMul + Add, Reshape to [b, s, heads, head_size],
                 Transpose perm [0, 2, 1, 3] (K: perm [0, 2, 3, 1])
                 MatMul(Q, K) -> Div(., sqrt(head_size)) -> Add(., mask) -> Softmax(axis=-1) -> MatMul(., V)
                 Transpose perm [0, 2, 1, 3] -> Reshape to [b, s, hidden]
                 MatMul + Add (attention output) -> Add(., layer input) -> LayerNormalization
                 MatMul + Add (intermediate) -> GELU -> MatMul + Add (output)
                 -> Add(., attention block output) -> LayerNormalization
    GELU         Div(x, 1.4142135) -> Erf -> Add(., 1) -> Mul(x, .) -> Mul(., 0.5), in that node order
    pooling      Unsqueeze(attention_mask, [-1]) -> Cast(float) -> Mul(hidden, m) -> ReduceSum(axis 1)
                 / Clip(ReduceSum(m, axis 1), min 1e-9); then Div(., Max(ReduceL2(., axis 1), 1e-12))
"""

from __future__ import annotations

import json
import math
import struct
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx

from .errors import ModelError

OPSET = 17
IR_VERSION = 8
#: Written into the model; change it when the graph changes (the pinned SHA-256 changes too).
EXPORTER_VERSION = "1"

#: safetensors dtypes numpy reads directly; BF16 is widened to float32.
_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
           "U8": "u1", "BOOL": "?", "BF16": "<u2"}
#: The header's own size limit (the safetensors format's is 100 MB).
_MAX_HEADER = 100 << 20


# --------------------------------------------------------------------------------------------
# safetensors


def read_safetensors(data: bytes) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file, by name. ModelError names what is malformed."""
    view = memoryview(data)
    if len(view) < 8:
        raise ModelError(f"safetensors: {len(view)} bytes is too short for the 8-byte header length")
    (n,) = struct.unpack("<Q", view[:8])
    if n > _MAX_HEADER:
        raise ModelError(f"safetensors: header length {n} exceeds the {_MAX_HEADER}-byte limit")
    if 8 + n > len(view):
        raise ModelError(f"safetensors: header length {n} runs past the end of the {len(view)}-byte file")
    try:
        header = json.loads(bytes(view[8:8 + n]).decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested too deep, a number too long
        raise ModelError(f"safetensors: the header is not JSON: {exc!s:.200}") from None
    if not isinstance(header, dict):
        raise ModelError(f"safetensors: the header is a JSON {type(header).__name__}, not an object")
    body = view[8 + n:]
    out: dict[str, np.ndarray] = {}
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        out[name] = _tensor(name, info, body)
        spans.append((info["data_offsets"][0], info["data_offsets"][1], name))
    spans.sort()
    for (_, end, a), (begin, _, b) in zip(spans, spans[1:]):
        if begin < end:
            raise ModelError(f"safetensors: tensors {a!r} and {b!r} overlap")
    return out


def _tensor(name: str, info: Any, body: memoryview) -> np.ndarray:
    where = f"safetensors: tensor {name!r}"
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
        raise ModelError(f"{where}: needs dtype, shape and data_offsets, got {info!r:.200}")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if dtype not in _DTYPES:
        raise ModelError(f"{where}: dtype {dtype!r} is not one of {sorted(_DTYPES)}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise ModelError(f"{where}: shape {shape!r:.200} is not a list of non-negative integers")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= len(body)):
        raise ModelError(f"{where}: data_offsets {offsets!r:.200} are not within the {len(body)}-byte data")
    np_dtype = np.dtype(_DTYPES[dtype])
    count = math.prod(shape)
    if offsets[1] - offsets[0] != count * np_dtype.itemsize:
        raise ModelError(f"{where}: {offsets[1] - offsets[0]} bytes do not hold {dtype} {shape}")
    a = np.frombuffer(body, np_dtype, count, offsets[0]).reshape(shape)
    if dtype == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np_dtype.newbyteorder("="))


# --------------------------------------------------------------------------------------------
# The graph


class _Graph:
    """Nodes and initializers, named the way torch's exporter names them (/encoder/layer.0/...)."""

    def __init__(self) -> None:
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._consts: dict[tuple[str, tuple[int, ...], bytes], str] = {}

    def init(self, name: str, a: np.ndarray) -> str:
        self.inits.append(self.numpy_helper.from_array(np.array(a, order="C"), name))
        return name

    def const(self, value: Any, dtype: type[np.generic] = np.float32) -> str:
        """A shared scalar or 1-D constant initializer."""
        a = np.asarray(value, dtype)
        key = (a.dtype.str, a.shape, a.tobytes())
        if key not in self._consts:
            self._consts[key] = self.init(f"const_{len(self._consts)}", a)
        return self._consts[key]

    def op(self, op: str, inputs: list[str], name: str, **attrs: Any) -> str:
        out = f"{name}_output_0"
        self.nodes.append(self.helper.make_node(op, inputs, [out], name=name, **attrs))
        return out


def _weights(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The tensors by their BertModel name: a `bert.` prefix (BertFor... checkpoints) is dropped."""
    if any(k.startswith("bert.") for k in tensors):
        return {k[5:]: v for k, v in tensors.items() if k.startswith("bert.")}
    return dict(tensors)


def _check_config(config: dict[str, Any]) -> None:
    need = {"hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "layer_norm_eps"}
    missing = need - config.keys()
    if missing:
        raise ModelError(f"bert config: missing {sorted(missing)}")
    if config.get("model_type", "bert") != "bert":
        raise ModelError(f"bert config: model_type {config['model_type']!r} is not bert")
    if config.get("hidden_act", "gelu") != "gelu":
        raise ModelError(f"bert config: hidden_act {config['hidden_act']!r} is not supported (only gelu)")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ModelError(f"bert config: position_embedding_type {config['position_embedding_type']!r} "
                         "is not supported (only absolute)")
    if config["hidden_size"] % config["num_attention_heads"]:
        raise ModelError("bert config: hidden_size is not a multiple of num_attention_heads")


def export(tensors: dict[str, np.ndarray], config: dict[str, Any], pooling: dict[str, Any] | None = None,
           name: str = "bert") -> onnx.ModelProto:
    """The ONNX ModelProto of a BertModel with these weights, plus mean pooling and L2 normalisation."""
    from onnx import TensorProto, helper

    _check_config(config)
    if pooling is not None and not pooling.get("pooling_mode_mean_tokens", False):
        raise ModelError(f"bert pooling: only mean pooling is supported, got {pooling!r:.200}")
    w = _weights(tensors)
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    head_size = hidden // heads
    eps = float(config["layer_norm_eps"])

    def weight(key: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        if key not in w:
            raise ModelError(f"bert weights: {key!r} is missing")
        a = w[key]
        if shape is not None and a.shape != shape:
            raise ModelError(f"bert weights: {key!r} has shape {a.shape}, expected {shape}")
        return a.astype(np.float32) if a.dtype.kind == "f" else a

    g = _Graph()

    def layer_norm(x: str, prefix: str, scope: str) -> str:
        gamma = g.init(f"{prefix}.weight", weight(f"{prefix}.weight", (hidden,)))
        beta = g.init(f"{prefix}.bias", weight(f"{prefix}.bias", (hidden,)))
        return g.op("LayerNormalization", [x, gamma, beta], f"{scope}/LayerNormalization", axis=-1, epsilon=eps)

    def linear(x: str, prefix: str, scope: str, n_in: int, n_out: int) -> str:
        wt = g.init(f"{prefix}.weight_T", weight(f"{prefix}.weight", (n_out, n_in)).T)
        b = g.init(f"{prefix}.bias", weight(f"{prefix}.bias", (n_out,)))
        return g.op("Add", [b, g.op("MatMul", [x, wt], f"{scope}/MatMul")], f"{scope}/Add")

    # Embeddings.
    word = g.init("embeddings.word_embeddings.weight", weight("embeddings.word_embeddings.weight"))
    ttype = g.init("embeddings.token_type_embeddings.weight", weight("embeddings.token_type_embeddings.weight"))
    pos_table = weight("embeddings.position_embeddings.weight")
    pos = g.init("embeddings.position_embeddings.weight", pos_table)
    pos_ids = g.init("embeddings.position_ids", np.arange(pos_table.shape[0], dtype=np.int64)[None])
    for table in (word, ttype, pos):
        if w[table].ndim != 2 or w[table].shape[1] != hidden:
            raise ModelError(f"bert weights: {table!r} has shape {w[table].shape}, expected [n, {hidden}]")
    shape = g.op("Shape", ["input_ids"], "/embeddings/Shape")
    seq = g.op("Gather", [shape, g.const(1, np.int64)], "/embeddings/Gather", axis=0)
    seq1 = g.op("Unsqueeze", [seq, g.const([0], np.int64)], "/embeddings/Unsqueeze")
    ids = g.op("Slice", [pos_ids, g.const([0], np.int64), seq1, g.const([1], np.int64)], "/embeddings/Slice")
    x = g.op("Gather", [word, "input_ids"], "/embeddings/word_embeddings/Gather")
    x = g.op("Add", [x, g.op("Gather", [ttype, "token_type_ids"], "/embeddings/token_type_embeddings/Gather")],
             "/embeddings/Add")
    x = g.op("Add", [x, g.op("Gather", [pos, ids], "/embeddings/position_embeddings/Gather")], "/embeddings/Add_1")
    x = layer_norm(x, "embeddings.LayerNorm", "/embeddings/LayerNorm")

    # The extended attention mask and the reshape targets, computed once.
    m = g.op("Unsqueeze", ["attention_mask", g.const([1, 2], np.int64)], "/Unsqueeze")
    m = g.op("Cast", [m], "/Cast", to=TensorProto.FLOAT)
    m = g.op("Sub", [g.const(1.0), m], "/Sub")
    mask = g.op("Mul", [m, g.const(np.finfo(np.float32).min)], "/Mul")
    bs = g.op("Shape", ["input_ids"], "/Shape")
    heads_shape = g.op("Concat", [bs, g.const([heads, head_size], np.int64)], "/Concat", axis=0)
    hidden_shape = g.op("Concat", [bs, g.const([hidden], np.int64)], "/Concat_1", axis=0)

    for i in range(int(config["num_hidden_layers"])):
        p, s = f"encoder.layer.{i}", f"/encoder/layer.{i}"
        sa, ss = f"{p}.attention.self", f"{s}/attention/self"

        def split(name: str, perm: list[int], sa: str = sa, ss: str = ss) -> str:
            y = linear(x, f"{sa}.{name}", f"{ss}/{name}", hidden, hidden)
            y = g.op("Reshape", [y, heads_shape], f"{ss}/{name}/Reshape")
            return g.op("Transpose", [y], f"{ss}/{name}/Transpose", perm=perm)

        q, k, v = split("query", [0, 2, 1, 3]), split("key", [0, 2, 3, 1]), split("value", [0, 2, 1, 3])
        a = g.op("MatMul", [q, k], f"{ss}/MatMul")
        a = g.op("Div", [a, g.const(math.sqrt(head_size))], f"{ss}/Div")
        a = g.op("Add", [a, mask], f"{ss}/Add")
        a = g.op("Softmax", [a], f"{ss}/Softmax", axis=-1)
        a = g.op("MatMul", [a, v], f"{ss}/MatMul_1")
        a = g.op("Transpose", [a], f"{ss}/Transpose", perm=[0, 2, 1, 3])
        a = g.op("Reshape", [a, hidden_shape], f"{ss}/Reshape")
        a = linear(a, f"{p}.attention.output.dense", f"{s}/attention/output/dense", hidden, hidden)
        a = g.op("Add", [a, x], f"{s}/attention/output/Add")
        a = layer_norm(a, f"{p}.attention.output.LayerNorm", f"{s}/attention/output/LayerNorm")
        inter = int(config["intermediate_size"])
        h = linear(a, f"{p}.intermediate.dense", f"{s}/intermediate/dense", hidden, inter)
        sg = f"{s}/intermediate/intermediate_act_fn"
        e = g.op("Div", [h, g.const(1.4142135381698608)], f"{sg}/Div")
        e = g.op("Erf", [e], f"{sg}/Erf")
        e = g.op("Add", [e, g.const(1.0)], f"{sg}/Add")
        e = g.op("Mul", [h, e], f"{sg}/Mul")
        h = g.op("Mul", [e, g.const(0.5)], f"{sg}/Mul_1")
        h = linear(h, f"{p}.output.dense", f"{s}/output/dense", inter, hidden)
        h = g.op("Add", [h, a], f"{s}/output/Add")
        x = layer_norm(h, f"{p}.output.LayerNorm", f"{s}/output/LayerNorm")

    g.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="/Identity"))
    # Mean pooling over the mask, then L2 normalisation.
    pm = g.op("Unsqueeze", ["attention_mask", g.const([-1], np.int64)], "/pooling/Unsqueeze")
    pm = g.op("Cast", [pm], "/pooling/Cast", to=TensorProto.FLOAT)
    total = g.op("ReduceSum", [g.op("Mul", [x, pm], "/pooling/Mul"), g.const([1], np.int64)], "/pooling/ReduceSum",
                 keepdims=0)
    count = g.op("ReduceSum", [pm, g.const([1], np.int64)], "/pooling/ReduceSum_1", keepdims=0)
    count = g.op("Clip", [count, g.const(1e-9)], "/pooling/Clip")
    mean = g.op("Div", [total, count], "/pooling/Div")
    norm = g.op("ReduceL2", [mean], "/normalize/ReduceL2", axes=[1], keepdims=1)
    norm = g.op("Max", [norm, g.const(1e-12)], "/normalize/Max")
    g.nodes.append(helper.make_node("Div", [mean, norm], ["sentence_embedding"], name="/normalize/Div"))

    dims = ["batch", "sequence"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, dims)
              for n in ("input_ids", "attention_mask", "token_type_ids")]
    outputs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, dims + [hidden]),
               helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", hidden])]
    graph = helper.make_graph(g.nodes, name, inputs, outputs, initializer=g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="aiomnn.bert",
                              producer_version=EXPORTER_VERSION)
    model.ir_version = IR_VERSION
    return model


def export_bytes(safetensors: bytes, config: dict[str, Any], pooling: dict[str, Any] | None = None,
                 name: str = "bert") -> bytes:
    """The serialized ONNX model; the same inputs give the same bytes."""
    data: bytes = export(read_safetensors(safetensors), config, pooling, name).SerializeToString()
    return data


def _json(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ModelError(f"{what} is not a JSON object")
    return value


def read_zip(src: Path) -> tuple[bytes, dict[str, Any], dict[str, Any] | None]:
    """The model.safetensors bytes, config.json and 1_Pooling/config.json (None if absent) of a
    sentence-transformers zip; the files lie at its root or under one folder."""
    with zipfile.ZipFile(src) as z:
        members = set(z.namelist())
        found = sorted((m for m in members if m.rsplit("/", 1)[-1] == "model.safetensors"), key=len)
        root = found[0][:-len("model.safetensors")] if found else ""

        def read(member: str) -> bytes | None:
            return z.read(root + member) if root + member in members else None

        weights, config, pooling = read("model.safetensors"), read("config.json"), read("1_Pooling/config.json")
    if weights is None or config is None:
        raise ModelError(f"{src.name}: model.safetensors or config.json is missing")
    return weights, _json(config, "config.json"), None if pooling is None else _json(pooling, "1_Pooling/config.json")


def export_zip(src: Path, out: Path) -> None:
    """The builder `models.fetch` runs: a sentence-transformers zip (see read_zip) exported to `out`."""
    data = export_bytes(*read_zip(src))
    tmp = out.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(out)
