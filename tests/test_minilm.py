"""minilm (all-MiniLM-L6-v2): the BERT exporter and its safetensors parser, and the exported model on the
CPU backend against onnxruntime and against the original model in transformers."""

from __future__ import annotations

import json
import os
import struct

import anyio
import numpy as np
import pytest

import aiomnn
from aiomnn import bert, models
from aiomnn.errors import ModelError

from .conftest import model_path
from .oracle import run_aiomnn, run_ort

SPEC = models.MODELS["minilm"]


def rel_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / max(np.linalg.norm(b.astype(np.float64)), 1e-30))


def source_path():
    """The wheel's model.zip that `aiomnn models fetch` keeps beside the exported model."""
    p = models.cache_dir() / SPEC.source
    if not p.is_file():
        if os.environ.get("CI"):
            raise FileNotFoundError(p)
        pytest.skip(f"{p} is missing; run `aiomnn models fetch minilm`")
    return p


@pytest.fixture(scope="module")
def source():
    """(safetensors bytes, config.json, 1_Pooling/config.json) of the real model."""
    return bert.read_zip(source_path())


# The safetensors parser ------------------------------------------------------------------------------------------


def safetensors(tensors: dict[str, np.ndarray], header: dict | None = None) -> bytes:
    """A safetensors file of these tensors, written the way the format lays it out."""
    names = {np.dtype("<f4"): "F32", np.dtype("<i8"): "I64", np.dtype("<f2"): "F16"}
    head: dict = {"__metadata__": {"format": "pt"}}
    body = b""
    for name, a in tensors.items():
        data = np.ascontiguousarray(a).tobytes()
        head[name] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [len(body), len(body) + len(data)]}
        body += data
    text = json.dumps(header if header is not None else head).encode()
    return struct.pack("<Q", len(text)) + text + body


def test_safetensors_round_trip():
    rng = np.random.default_rng(0)
    tensors = {"w": rng.standard_normal((3, 4)).astype(np.float32), "ids": np.arange(5, dtype=np.int64),
               "h": rng.standard_normal(7).astype(np.float16), "empty": np.zeros((0, 2), np.float32)}
    got = bert.read_safetensors(safetensors(tensors))
    assert got.keys() == tensors.keys()
    for k, a in tensors.items():
        assert got[k].dtype == a.dtype and got[k].shape == a.shape
        np.testing.assert_array_equal(got[k], a)


def test_safetensors_bf16_is_widened_to_float32():
    x = np.array([1.5, -2.25, 3e38], np.float32)
    bits = (x.view(np.uint32) >> 16).astype("<u2")
    text = json.dumps({"x": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]}}).encode()
    got = bert.read_safetensors(struct.pack("<Q", len(text)) + text + bits.tobytes())["x"]
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, (bits.astype(np.uint32) << 16).view(np.float32))


def _header(entry: object) -> bytes:
    text = json.dumps({"x": entry}).encode()
    return struct.pack("<Q", len(text)) + text + bytes(16)


GOOD = safetensors({"w": np.ones((2, 2), np.float32), "b": np.ones(2, np.float32)})
MALFORMED = {
    "empty": (b"", "too short"),
    "truncated-length": (GOOD[:5], "too short"),
    "truncated-header": (GOOD[:40], "runs past the end"),
    "truncated-data": (GOOD[:-4], "not within"),
    "huge-header-length": (struct.pack("<Q", 2**63) + b"{}", "exceeds"),
    "header-longer-than-file": (struct.pack("<Q", 1000) + b"{}", "runs past the end"),
    "bad-json": (struct.pack("<Q", 9) + b"{not json", "not JSON"),
    "not-utf8": (struct.pack("<Q", 4) + b"\xff\xfe{}", "not JSON"),
    "deeply-nested": (struct.pack("<Q", 200000) + b"[" * 200000, "not JSON"),
    "too-many-digits": (struct.pack("<Q", 5000) + b"9" * 5000, "not JSON"),
    "header-a-list": (struct.pack("<Q", 2) + b"[]", "not an object"),
    "entry-not-object": (_header(3), "needs dtype"),
    "missing-offsets": (_header({"dtype": "F32", "shape": [4]}), "needs dtype"),
    "offsets-out-of-range": (_header({"dtype": "F32", "shape": [4], "data_offsets": [0, 10**12]}), "not within"),
    "offsets-negative": (_header({"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}), "not within"),
    "offsets-reversed": (_header({"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}), "not within"),
    "offsets-not-ints": (_header({"dtype": "F32", "shape": [1], "data_offsets": ["0", "4"]}), "not within"),
    "size-mismatch": (_header({"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}), "do not hold"),
    "huge-shape": (_header({"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 16]}), "do not hold"),
    "negative-shape": (_header({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}), "shape"),
    "unknown-dtype": (_header({"dtype": "Q7", "shape": [1], "data_offsets": [0, 4]}), "dtype"),
    "overlap": (safetensors({}, {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                 "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}) + bytes(12), "overlap"),
}


@pytest.mark.parametrize("data,match", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_safetensors_is_a_model_error(data, match):
    with pytest.raises(ModelError, match=match):
        bert.read_safetensors(data)


def test_a_malformed_weight_file_fails_the_export():
    config = {"hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1, "intermediate_size": 16,
              "layer_norm_eps": 1e-12}
    with pytest.raises(ModelError, match="runs past the end"):
        bert.export_bytes(GOOD[:40], config)
    with pytest.raises(ModelError, match="'embeddings.word_embeddings.weight' is missing"):
        bert.export_bytes(GOOD, config)


# The exporter on a tiny random BERT ------------------------------------------------------------------------------


def tiny_bert(prefix: str = "", hidden: int = 8, heads: int = 2, layers: int = 2, inter: int = 16):
    rng = np.random.default_rng(1)

    def r(*shape):
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)

    w = {"embeddings.word_embeddings.weight": r(50, hidden), "embeddings.position_embeddings.weight": r(20, hidden),
         "embeddings.token_type_embeddings.weight": r(2, hidden), "embeddings.LayerNorm.weight": 1 + r(hidden),
         "embeddings.LayerNorm.bias": r(hidden)}
    for i in range(layers):
        p = f"encoder.layer.{i}"
        for name, (o, n) in {"attention.self.query": (hidden, hidden), "attention.self.key": (hidden, hidden),
                             "attention.self.value": (hidden, hidden), "attention.output.dense": (hidden, hidden),
                             "intermediate.dense": (inter, hidden), "output.dense": (hidden, inter)}.items():
            w[f"{p}.{name}.weight"], w[f"{p}.{name}.bias"] = r(o, n), r(o)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[f"{p}.{name}.weight"], w[f"{p}.{name}.bias"] = 1 + r(hidden), r(hidden)
    config = {"hidden_size": hidden, "num_attention_heads": heads, "num_hidden_layers": layers,
              "intermediate_size": inter, "layer_norm_eps": 1e-12, "hidden_act": "gelu", "model_type": "bert"}
    return safetensors({prefix + k: v for k, v in w.items()}), config


def tiny_feeds(b: int, s: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(b * 100 + s)
    mask = np.ones((b, s), np.int64)
    mask[0, s - s // 4:] = 0
    return {"input_ids": rng.integers(0, 50, (b, s)), "attention_mask": mask,
            "token_type_ids": rng.integers(0, 2, (b, s))}


def numpy_bert(tensors: dict[str, np.ndarray], config: dict, feeds: dict[str, np.ndarray]):
    """BertModel's forward in float64 numpy, then mean pooling and normalisation."""
    from math import erf

    w = {k.removeprefix("bert."): v.astype(np.float64) for k, v in tensors.items()}
    ids, mask, tt = feeds["input_ids"], feeds["attention_mask"], feeds["token_type_ids"]
    b, s = ids.shape
    heads = config["num_attention_heads"]

    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + config["layer_norm_eps"]) * w[f"{p}.weight"] + w[f"{p}.bias"]

    def lin(x, p):
        return x @ w[f"{p}.weight"].T + w[f"{p}.bias"]

    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.token_type_embeddings.weight"][tt]
    x = ln(x + w["embeddings.position_embeddings.weight"][:s], "embeddings.LayerNorm")
    ext = (1.0 - mask[:, None, None, :]) * -1e30
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}"

        def split(t):
            return t.reshape(b, s, heads, -1).transpose(0, 2, 1, 3)

        q, k, v = (split(lin(x, f"{p}.attention.self.{n}")) for n in ("query", "key", "value"))
        a = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]) + ext
        a = np.exp(a - a.max(-1, keepdims=True))
        a = (a / a.sum(-1, keepdims=True)) @ v
        a = ln(lin(a.transpose(0, 2, 1, 3).reshape(b, s, -1), f"{p}.attention.output.dense") + x,
               f"{p}.attention.output.LayerNorm")
        h = lin(a, f"{p}.intermediate.dense")
        h = h * 0.5 * (1 + np.vectorize(erf)(h / np.sqrt(2)))
        x = ln(lin(h, f"{p}.output.dense") + a, f"{p}.output.LayerNorm")
    m = mask[..., None].astype(np.float64)
    e = (x * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    return x, e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)


@pytest.mark.parametrize("prefix", ["", "bert."], ids=["plain-keys", "bert-prefix"])
def test_tiny_bert_matches_numpy_onnxruntime_and_aiomnn(prefix):
    pytest.importorskip("onnxruntime")
    weights, config = tiny_bert(prefix)
    data = bert.export_bytes(weights, config)
    assert bert.export_bytes(weights, config) == data  # deterministic
    for b, s in ((1, 5), (3, 12)):
        feeds = tiny_feeds(b, s)
        x, e = numpy_bert(bert.read_safetensors(weights), config, feeds)
        keep = feeds["attention_mask"].astype(bool)
        for got in (run_ort(data, feeds), run_aiomnn(data, feeds)):
            np.testing.assert_allclose(got[0][keep], x[keep], atol=1e-5)
            np.testing.assert_allclose(got[1], e, atol=1e-5)


def test_the_graph_is_torch_exports_pattern():
    """The op sequence a backend's fusion matches: one encoder layer, GELU as Div, Erf, Add, Mul, Mul."""
    import onnx

    weights, config = tiny_bert(layers=1)
    model = onnx.load_from_string(bert.export_bytes(weights, config))
    assert model.opset_import[0].version == 17 and model.ir_version == 8
    assert not [n for n in model.graph.node if n.domain]  # no contrib ops
    layer = [n.op_type for n in model.graph.node if n.name.startswith("/encoder/layer.0/")]
    qkv = ["MatMul", "Add", "Reshape", "Transpose"] * 3
    assert layer == qkv + ["MatMul", "Div", "Add", "Softmax", "MatMul", "Transpose", "Reshape",
                           "MatMul", "Add", "Add", "LayerNormalization",
                           "MatMul", "Add", "Div", "Erf", "Add", "Mul", "Mul",
                           "MatMul", "Add", "Add", "LayerNormalization"]
    transposes = [list(n.attribute[0].ints) for n in model.graph.node if n.name.endswith("/Transpose")]
    assert transposes[:4] == [[0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3], [0, 2, 1, 3]]
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask", "token_type_ids"]
    assert [i.name for i in model.graph.output] == ["last_hidden_state", "sentence_embedding"]
    dims = [[d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(model.graph.input) + list(model.graph.output)]
    assert dims == [["batch", "sequence"]] * 3 + [["batch", "sequence", 8], ["batch", 8]]


@pytest.mark.parametrize("change,match", [({"hidden_act": "relu"}, "hidden_act"),
                                          ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
                                          ({"num_attention_heads": 3}, "multiple"),
                                          ({"model_type": "gpt2"}, "model_type")])
def test_unsupported_configs_are_model_errors(change, match):
    weights, config = tiny_bert()
    with pytest.raises(ModelError, match=match):
        bert.export_bytes(weights, {**config, **change})


# The real model --------------------------------------------------------------------------------------------------


@pytest.mark.models
def test_export_is_deterministic_and_matches_the_pin(source, tmp_path):
    out = tmp_path / SPEC.filename
    bert.export_zip(source_path(), out)
    assert models.sha256(out) == SPEC.sha256
    assert bert.export_bytes(*source) == out.read_bytes()


@pytest.fixture(scope="module")
def ort_session():
    ort = pytest.importorskip("onnxruntime")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    return ort.InferenceSession(str(model_path("minilm")), opts, providers=["CPUExecutionProvider"])


@pytest.mark.models
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("shape", SPEC.shapes, ids=["x".join(map(str, s)) for s in SPEC.shapes])
async def test_cpu_matches_onnxruntime(shape, ort_session, anyio_backend):
    feeds = models.sample_feeds("minilm", shape)
    want = ort_session.run(None, feeds)
    net = aiomnn.Interpreter.from_file(model_path("minilm"))
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=2)) as session:
        got = await session.run(feeds)
        if shape[0] > 1:  # row 0 is padded: its embedding is the one of its unpadded tokens alone
            n = int(feeds["attention_mask"][0].sum())
            alone = await session.run({k: v[:1, :n] for k, v in feeds.items()})
    for name, w in zip(net.output_names, want):
        assert got[name].shape == w.shape and got[name].dtype == w.dtype
        assert rel_error(got[name], w) <= 1e-4, f"{name}: relative error {rel_error(got[name], w):.2e}"
    if shape[0] > 1:
        np.testing.assert_allclose(got["sentence_embedding"][0], alone["sentence_embedding"][0], atol=1e-5)


@pytest.mark.models
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_replayed_runs_follow_new_tokens(ort_session, anyio_backend):
    """Later runs of a plan replay its recorded run (backends/cpu/replay.py): new token ids and masks each run,
    at one shape, still give onnxruntime's embeddings."""
    from aiomnn.backends.cpu import backend as cpu, jit

    rng = np.random.default_rng(5)
    net = aiomnn.Interpreter.from_file(model_path("minilm"))
    replayed = 0
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=2)) as session:
        for k in range(8):
            ids = rng.integers(0, 30000, (2, 12)).astype(np.int64)
            mask = np.ones((2, 12), np.int64)
            mask[1, rng.integers(1, 12):] = 0
            feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            got = await session.run(feeds)
            for name, w in zip(net.output_names, ort_session.run(None, feeds)):
                assert rel_error(got[name], w) <= 1e-4, f"run {k}, {name}: relative error {rel_error(got[name], w):.2e}"
            if k == 1:
                await anyio.to_thread.run_sync(jit.wait, 300)  # the loops compiled: the next runs record
            backend = session.pipeline.segments[0].backend
            replayed += any(isinstance(b, cpu.CpuBackend) and b._replays for b in [backend])
    assert replayed >= 3


@pytest.mark.models
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_matches_transformers_bert_model(source, ort_session, tmp_path, anyio_backend):
    """The exported model against the original: transformers' BertModel with the same weights loaded strictly."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    weights, config, _ = source
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = transformers.BertModel(transformers.BertConfig.from_json_file(str(tmp_path / "config.json"))).eval()
    state = {k.removeprefix("bert."): torch.from_numpy(v.copy()) for k, v in bert.read_safetensors(weights).items()}
    unsaved = {name for name, _ in model.named_buffers()} - model.state_dict().keys()  # position_ids, lately
    model.load_state_dict({k: v for k, v in state.items() if k not in unsaved}, strict=True)

    feeds = models.sample_feeds("minilm", (4, 48))
    feeds["attention_mask"][2, 20:] = 0
    feeds["token_type_ids"][3, 30:] = 1
    with torch.no_grad():
        x = model(**{k: torch.from_numpy(v) for k, v in feeds.items()}).last_hidden_state.double().numpy()
    m = feeds["attention_mask"][..., None].astype(np.float64)
    e = (x * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    e /= np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)

    net = aiomnn.Interpreter.from_file(model_path("minilm"))
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=2)) as session:
        out = await session.run(feeds)
    keep = feeds["attention_mask"].astype(bool)
    diffs = {}
    for who, (hidden, emb) in {"onnxruntime": ort_session.run(None, feeds),
                               "aiomnn": (out["last_hidden_state"], out["sentence_embedding"])}.items():
        diffs[who] = (float(np.abs(hidden[keep] - x[keep]).max()), float(np.abs(emb - e).max()))
        np.testing.assert_allclose(hidden[keep], x[keep], atol=1e-4, err_msg=who)
        np.testing.assert_allclose(emb, e, atol=1e-4, err_msg=who)
    print(f"\nmax |difference| from transformers (last_hidden_state, sentence_embedding): {diffs}")
