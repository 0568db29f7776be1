"""Detection ops: NonMaxSuppression, RoiAlign and MaxRoiPool.

NonMaxSuppression is greedy per batch and class, in descending score order
(ties: lower box index first), computed in float32 like the common runtimes.
RoiAlign samples each bin on a regular grid with bilinear interpolation;
its `max` mode takes, per sample, the largest of the four weighted corner
values (the behaviour of onnxruntime and of the ONNX test data).
"""

from __future__ import annotations

import math

import numpy as np

from ..execution import CpuOp, Unsupported, op


def _corners(boxes: np.ndarray, center_point_box: int) -> tuple[np.ndarray, ...]:
    """(ymin, xmin, ymax, xmax) of each box, in float32."""
    b = boxes.astype(np.float32, copy=False)
    if center_point_box:
        xc, yc, w, h = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
        hw, hh = w / np.float32(2), h / np.float32(2)
        return yc - hh, xc - hw, yc + hh, xc + hw
    y1, x1, y2, x2 = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    return np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)


@op("NonMaxSuppression", 10)
class NonMaxSuppression(CpuOp):
    def __init__(self, node, inputs, outputs, *, center_point_box=0):
        super().__init__(node, inputs, outputs)
        if center_point_box not in (0, 1):
            raise Unsupported(f"center_point_box {center_point_box}")
        self.center_point_box = center_point_box

    def run(self, boxes, scores, max_output_boxes_per_class=None, iou_threshold=None, score_threshold=None):
        if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3:
            raise ValueError(f"boxes {boxes.shape} must be [batches, boxes, 4] "
                             f"and scores {scores.shape} [batches, classes, boxes]")
        nb, nbox = boxes.shape[:2]
        if scores.shape[0] != nb or scores.shape[2] != nbox:
            raise ValueError(f"scores {scores.shape} do not match boxes {boxes.shape}")
        limit = 0 if max_output_boxes_per_class is None or np.size(max_output_boxes_per_class) == 0 \
            else int(np.asarray(max_output_boxes_per_class).reshape(-1)[0])
        iou_t = np.float32(0) if iou_threshold is None or np.size(iou_threshold) == 0 \
            else np.float32(np.asarray(iou_threshold).reshape(-1)[0])
        score_t = None if score_threshold is None or np.size(score_threshold) == 0 \
            else np.float32(np.asarray(score_threshold).reshape(-1)[0])
        selected: list[tuple[int, int, int]] = []
        if limit <= 0:
            return np.zeros((0, 3), np.int64)
        for b in range(nb):
            y1, x1, y2, x2 = _corners(boxes[b], self.center_point_box)
            area = (y2 - y1) * (x2 - x1)
            for c in range(scores.shape[1]):
                s = scores[b, c].astype(np.float32, copy=False)
                cand = np.arange(nbox) if score_t is None else np.nonzero(s > score_t)[0]
                order = cand[np.argsort(-s[cand], kind="stable")]
                keep: list[int] = []
                for i in order:
                    if len(keep) >= limit:
                        break
                    if keep:
                        k = np.asarray(keep)
                        ih = np.minimum(y2[i], y2[k]) - np.maximum(y1[i], y1[k])
                        iw = np.minimum(x2[i], x2[k]) - np.maximum(x1[i], x1[k])
                        inter = np.maximum(ih, 0) * np.maximum(iw, 0)
                        union = area[i] + area[k] - inter
                        ok = (inter > 0) & (area[i] > 0) & (area[k] > 0) & (union > 0)
                        with np.errstate(divide="ignore", invalid="ignore"):
                            iou = np.where(ok, inter / np.where(ok, union, 1), 0)
                        if (iou > iou_t).any():
                            continue
                    keep.append(int(i))
                selected.extend((b, c, i) for i in keep)
        return np.asarray(selected, np.int64).reshape(-1, 3)


def _axis_samples(start: float, bin_size: float, bins: int, grid: int, size: int):
    """Sample coordinates along one axis and their bilinear taps: low/high indices, weights, validity."""
    k = np.arange(bins)[:, None] * bin_size + (np.arange(grid)[None, :] + 0.5) * bin_size / grid
    p = (start + k).reshape(-1)  # bins * grid samples
    valid = (p >= -1.0) & (p <= size)
    p = np.maximum(p, 0.0)
    low = np.floor(p).astype(np.int64)
    top = low >= size - 1
    low = np.where(top, size - 1, low)
    high = np.where(top, size - 1, low + 1)
    p = np.where(top, low.astype(np.float64), p)
    frac = p - low
    return low, high, 1.0 - frac, frac, valid


class _RoiAlign(CpuOp):
    default_mode = "half_pixel"

    def __init__(self, node, inputs, outputs, *, coordinate_transformation_mode=None, mode="avg", output_height=1,
                 output_width=1, sampling_ratio=0, spatial_scale=1.0):
        super().__init__(node, inputs, outputs)
        ctm = coordinate_transformation_mode or self.default_mode
        if ctm not in ("half_pixel", "output_half_pixel"):
            raise Unsupported(f"coordinate_transformation_mode {ctm!r}")
        if mode not in ("avg", "max"):
            raise Unsupported(f"mode {mode!r}")
        if output_height < 1 or output_width < 1 or sampling_ratio < 0:
            raise Unsupported(f"output {output_height}x{output_width}, sampling_ratio {sampling_ratio}")
        self.half_pixel = ctm == "half_pixel"
        self.mode = mode
        self.oh, self.ow = output_height, output_width
        self.sampling_ratio = sampling_ratio
        self.scale = spatial_scale

    def run(self, X, rois, batch_indices):
        if X.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4:
            raise ValueError(f"X {X.shape} must be 4-D and rois {rois.shape} [num_rois, 4]")
        N, C, H, W = X.shape
        R = rois.shape[0]
        bi = np.asarray(batch_indices).reshape(-1).astype(np.int64)
        if bi.shape[0] != R or ((bi < 0) | (bi >= N)).any():
            raise ValueError(f"batch_indices {bi.tolist()} do not fit {R} rois and batch {N}")
        out = np.zeros((R, C, self.oh, self.ow), X.dtype)
        off = 0.5 if self.half_pixel else 0.0
        r64 = rois.astype(np.float64)
        for r in range(R):
            x1, y1, x2, y2 = (r64[r] * self.scale - off).tolist()
            rw, rh = x2 - x1, y2 - y1
            if not self.half_pixel:
                rw, rh = max(rw, 1.0), max(rh, 1.0)
            bh, bw = rh / self.oh, rw / self.ow
            gh = self.sampling_ratio or int(math.ceil(rh / self.oh))
            gw = self.sampling_ratio or int(math.ceil(rw / self.ow))
            if gh <= 0 or gw <= 0:
                continue  # an empty RoI pools nothing: zeros
            yl, yh, wyl, wyh, vy = _axis_samples(y1, bh, self.oh, gh, H)
            xl, xh, wxl, wxh, vx = _axis_samples(x1, bw, self.ow, gw, W)
            img = X[bi[r]].astype(np.float64)  # (C, H, W)
            valid = (vy[:, None] & vx[None, :]).astype(np.float64)
            taps = [(yl, xl, wyl[:, None] * wxl[None, :]), (yl, xh, wyl[:, None] * wxh[None, :]),
                    (yh, xl, wyh[:, None] * wxl[None, :]), (yh, xh, wyh[:, None] * wxh[None, :])]
            vals = [img[:, yi[:, None], xi[None, :]] * (w * valid) for yi, xi, w in taps]  # (C, Sy, Sx) each
            if self.mode == "avg":
                v = (vals[0] + vals[1] + vals[2] + vals[3]).reshape(C, self.oh, gh, self.ow, gw)
                out[r] = v.sum(axis=(2, 4)) / max(gh * gw, 1)
            else:
                v = np.maximum(np.maximum(vals[0], vals[1]), np.maximum(vals[2], vals[3]))
                out[r] = v.reshape(C, self.oh, gh, self.ow, gw).max(axis=(2, 4))
        return out


@op("RoiAlign", 10)
class RoiAlign10(_RoiAlign):
    default_mode = "output_half_pixel"  # opset 10 had no attribute and no half-pixel shift


@op("RoiAlign", 16)
class RoiAlign16(_RoiAlign):
    default_mode = "half_pixel"


def _round_half_away(v: float) -> int:
    return int(math.floor(v + 0.5)) if v >= 0 else -int(math.floor(-v + 0.5))


@op("MaxRoiPool", 1)
class MaxRoiPool(CpuOp):
    def __init__(self, node, inputs, outputs, *, pooled_shape=None, spatial_scale=1.0):
        super().__init__(node, inputs, outputs)
        if not pooled_shape or len(pooled_shape) != 2 or min(pooled_shape) < 1:
            raise Unsupported(f"pooled_shape {pooled_shape}")
        self.ph, self.pw = pooled_shape
        self.scale = spatial_scale

    def run(self, X, rois):
        if X.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 5:
            raise ValueError(f"X {X.shape} must be 4-D and rois {rois.shape} [num_rois, 5]")
        N, C, H, W = X.shape
        out = np.zeros((rois.shape[0], C, self.ph, self.pw), X.dtype)
        for r, roi in enumerate(rois.astype(np.float64)):
            b = int(roi[0])
            if not 0 <= b < N:
                raise ValueError(f"roi {r} names batch {b}, the batch has {N}")
            ws, hs, we, he = (_round_half_away(v * self.scale) for v in roi[1:])
            rh, rw = max(he - hs + 1, 1), max(we - ws + 1, 1)
            bh, bw = rh / self.ph, rw / self.pw
            for i in range(self.ph):
                h0 = min(max(int(math.floor(i * bh)) + hs, 0), H)
                h1 = min(max(int(math.ceil((i + 1) * bh)) + hs, 0), H)
                for j in range(self.pw):
                    w0 = min(max(int(math.floor(j * bw)) + ws, 0), W)
                    w1 = min(max(int(math.ceil((j + 1) * bw)) + ws, 0), W)
                    if h1 > h0 and w1 > w0:
                        out[r, :, i, j] = X[b, :, h0:h1, w0:w1].max(axis=(1, 2))
        return out
