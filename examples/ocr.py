"""PP-OCRv4 text reading over any pair of sessions: detection, then every found line recognised at once.

The services beside it serve this pipeline: `ocr_service.py` on Starlette in one process, `ray_serve_ocr.py`
as Ray Serve replicas. `det` and `rec` are anything with `async run(feeds) -> outputs`: an aiomnn Session, a
BatchingSession, or a stand-in for another engine (the tests run it on onnxruntime to compare).
"""

from __future__ import annotations

import asyncio
import io
import time
from typing import Any, Mapping, Protocol

import numpy as np

import aiomnn
from aiomnn import models


class Runs(Protocol):
    async def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]: ...


MEAN, STD = 0.5, 0.5


def resize_nearest(img: np.ndarray, h: int, w: int) -> np.ndarray:
    rows = (np.arange(h) * img.shape[0] / h).astype(np.int64)
    cols = (np.arange(w) * img.shape[1] / w).astype(np.int64)
    return img[rows][:, cols]


def to_input(img: np.ndarray) -> np.ndarray:
    x = (img.astype(np.float32) / 255 - MEAN) / STD
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def text_lines(prob: np.ndarray, threshold: float = 0.3, min_height: int = 3) -> list[tuple[int, int, int, int]]:
    """Boxes (top, bottom, left, right) of text lines in a detection map, by row then column projection."""
    mask = prob > threshold
    rows = np.flatnonzero(mask.any(axis=1))
    boxes = []
    if rows.size == 0:
        return boxes
    breaks = np.flatnonzero(np.diff(rows) > 1)
    for top, bottom in zip(np.r_[rows[0], rows[breaks + 1]], np.r_[rows[breaks], rows[-1]]):
        if bottom - top + 1 < min_height:
            continue
        cols = np.flatnonzero(mask[top:bottom + 1].any(axis=0))
        boxes.append((int(top), int(bottom) + 1, int(cols[0]), int(cols[-1]) + 1))
    return boxes


def charset() -> list[str]:
    """The recognizer's classes: CTC's blank, the characters its model file lists, and a space."""
    rec = aiomnn.Interpreter.from_file(models.path("rec"))
    return ["<blank>"] + rec.metadata.metadata_props.get("character", "").splitlines() + [" "]


class OCR:
    def __init__(self, det: Runs, rec: Runs, classes: list[str]):
        self.det, self.rec, self.charset = det, rec, classes

    @classmethod
    async def open(cls, runtime: aiomnn.RuntimeInfo, kind: str = "auto") -> "OCR":
        """Both sessions on one runtime (its worker threads and devices)."""
        config = aiomnn.ScheduleConfig(type=kind)
        det = await aiomnn.Interpreter.from_file(models.path("det")).create_session(config, runtime)
        rec = await aiomnn.Interpreter.from_file(models.path("rec")).create_session(config, runtime)
        return cls(det, rec, charset())

    async def close(self) -> None:
        await self.det.close()  # type: ignore[attr-defined]
        await self.rec.close()  # type: ignore[attr-defined]

    async def detect(self, img: np.ndarray) -> np.ndarray:
        """The detector's text probability map of img, resized to sides of multiples of 32 (640 at most)."""
        h, w = img.shape[:2]
        scale = min(1.0, 640 / max(h, w))
        dh, dw = max(32, int(round(h * scale / 32)) * 32), max(32, int(round(w * scale / 32)) * 32)
        return (await self.det.run({"x": to_input(resize_nearest(img, dh, dw))}))["sigmoid_0.tmp_0"][0, 0]

    async def read(self, img: np.ndarray) -> list[dict]:
        """Each text line of an HxWx3 uint8 image: its box (top, bottom, left, right) and its text."""
        h, w = img.shape[:2]
        prob = await self.detect(img)
        dh, dw = prob.shape
        boxes = []
        for t, b, l, r in text_lines(prob):
            pad = int(0.6 * (b - t)) + 1  # the detector marks a shrunk core of each line: grow it back
            t, b, l, r = max(t - pad, 0), min(b + pad, dh), max(l - pad, 0), min(r + pad, dw)
            boxes.append((int(t * h / dh), int(np.ceil(b * h / dh)), int(l * w / dw), int(np.ceil(r * w / dw))))
        texts = await asyncio.gather(*(self.recognise(img[t:b, l:r]) for t, b, l, r in boxes))
        return [{"box": [t, b, l, r], "text": text} for (t, b, l, r), text in zip(boxes, texts)]

    async def recognise(self, crop: np.ndarray) -> str:
        width = int(np.clip(round(48 * crop.shape[1] / max(crop.shape[0], 1) / 8) * 8, 16, 320))
        probs = (await self.rec.run({"x": to_input(resize_nearest(crop, 48, width))}))["softmax_11.tmp_0"][0]
        best = probs.argmax(axis=1)
        keep = (best != 0) & np.r_[True, best[1:] != best[:-1]]  # CTC: drop blanks and repeats
        return "".join(self.charset[i] if i < len(self.charset) else "?" for i in best[keep])


async def answer(ocr: OCR, body: bytes) -> tuple[dict, int]:
    """An HTTP request's answer, as both services give it: (JSON, status) for a body holding an HxWx3 uint8
    image saved with np.save (read with allow_pickle=False)."""
    try:
        img = np.load(io.BytesIO(body), allow_pickle=False)
    except Exception as exc:
        return {"error": f"body is not a .npy array: {exc}"}, 400
    if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3 or min(img.shape[:2]) < 8:
        return {"error": f"want an HxWx3 uint8 image, got {img.dtype} {img.shape}"}, 400
    t = time.perf_counter()
    try:
        lines = await ocr.read(img)
    except aiomnn.AiomnnError as exc:
        return {"error": str(exc)}, 422
    return {"lines": lines, "ms": round((time.perf_counter() - t) * 1e3, 2)}, 200
