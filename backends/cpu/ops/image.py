"""Image ops: GridSample (N-D; linear, nearest, cubic), AffineGrid, Col2Im, CenterCropPad, DepthToSpace and
SpaceToDepth.

GridSample follows the convention of torch.nn.functional.grid_sample, which
ONNX adopted: grid coordinates are normalised to [-1, 1] and listed
innermost dimension first; for linear and nearest the padding mode moves the
sampling point, for cubic it moves each of the four taps.
ImageDecoder is not provided: decoding JPEG/PNG would need a new dependency.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..execution import CpuOp, Unsupported, op

_CUBIC_A = -0.75


def _reflect(x: np.ndarray, lo2: float, hi2: float) -> np.ndarray:
    """Reflect coordinates into [lo2/2, hi2/2] (bounds given doubled, as torch does)."""
    if lo2 == hi2:
        return np.zeros_like(x)
    lo = lo2 / 2
    span = (hi2 - lo2) / 2
    d = np.abs(x - lo)
    extra = np.fmod(d, span)
    flips = np.floor(d / span)
    return np.where(flips % 2 == 0, extra + lo, span - extra + lo)


def _pad_coord(x: np.ndarray, size: int, padding_mode: str, align_corners: bool) -> np.ndarray:
    if padding_mode == "border":
        return np.clip(x, 0, size - 1)
    if padding_mode == "reflection":
        x = _reflect(x, 0, 2 * (size - 1)) if align_corners else _reflect(x, -1, 2 * size - 1)
        return np.clip(x, 0, size - 1)
    return x


def _cubic_weights(t: np.ndarray) -> list[np.ndarray]:
    A = _CUBIC_A

    def near(d):  # |d| <= 1
        return ((A + 2) * d - (A + 3)) * d * d + 1

    def far(d):  # 1 < |d| < 2
        return ((A * d - 5 * A) * d + 8 * A) * d - 4 * A

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


class _GridSample(CpuOp):
    modes: dict[str, str] = {}

    def __init__(self, node, inputs, outputs, *, align_corners=0, mode=None, padding_mode="zeros"):
        super().__init__(node, inputs, outputs)
        mode = mode if mode is not None else self.default_mode
        if mode not in self.modes:
            raise Unsupported(f"mode {mode!r}")
        if padding_mode not in ("zeros", "border", "reflection"):
            raise Unsupported(f"padding_mode {padding_mode!r}")
        self.mode = self.modes[mode]
        self.padding_mode = padding_mode
        self.align_corners = bool(align_corners)

    default_mode = "linear"
    max_rank = 0  # 0: any

    def run(self, X, grid):
        r = X.ndim - 2
        if r < 1 or grid.ndim != r + 2 or grid.shape[-1] != r or grid.shape[0] != X.shape[0]:
            raise ValueError(f"X {X.shape} and grid {grid.shape} do not fit: grid must be (N, *out, {r})")
        if self.max_rank and r != self.max_rank:
            raise ValueError(f"GridSample at this opset takes 4-D inputs, got shape {X.shape}")
        N, C = X.shape[:2]
        sizes = X.shape[2:]
        out_sp = grid.shape[1:-1]
        g = grid.astype(np.float64)
        taps: list[list[tuple[np.ndarray, np.ndarray]]] = []  # per dim: (index, weight) pairs, each (N, *out)
        for i in range(r):
            size = sizes[i]
            c = g[..., r - 1 - i]
            x = (c + 1) / 2 * (size - 1) if self.align_corners else ((c + 1) * size - 1) / 2
            if self.mode == "nearest":
                x = _pad_coord(x, size, self.padding_mode, self.align_corners)
                taps.append([(np.rint(x), np.ones_like(x))])
            elif self.mode == "linear":
                x = _pad_coord(x, size, self.padding_mode, self.align_corners)
                x0 = np.floor(x)
                f = x - x0
                taps.append([(x0, 1 - f), (x0 + 1, f)])
            else:
                x0 = np.floor(x)
                ws = _cubic_weights(x - x0)
                dim = []
                for k, w in enumerate(ws):
                    idx = x0 - 1 + k
                    if self.padding_mode != "zeros":
                        idx = np.rint(_pad_coord(idx, size, self.padding_mode, self.align_corners))
                    dim.append((idx, w))
                taps.append(dim)
        xf = X.astype(np.float64) if X.dtype != np.float64 else X
        xm = np.moveaxis(xf, 1, -1)  # (N, *S, C)
        nidx = np.arange(N).reshape((N,) + (1,) * len(out_sp))
        acc = np.zeros((N,) + tuple(out_sp) + (C,), np.float64)
        for combo in itertools.product(*taps):
            weight = np.ones(g.shape[:-1], np.float64)
            inside = np.ones(g.shape[:-1], bool)
            index = []
            for (idx, w), size in zip(combo, sizes):
                weight = weight * w
                ok = (idx >= 0) & (idx <= size - 1)
                inside &= ok
                index.append(np.where(ok, idx, 0).astype(np.int64))
            vals = xm[(nidx, *index)]  # (N, *out, C)
            acc += vals * (weight * inside)[..., None]
        y = np.moveaxis(acc, -1, 1)
        if X.dtype.kind in "iu":
            return y.astype(X.dtype)
        return y.astype(X.dtype, copy=False)


@op("GridSample", 16)
class GridSample16(_GridSample):
    default_mode = "bilinear"
    modes = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}
    max_rank = 2


@op("GridSample", 20)
class GridSample20(_GridSample):
    default_mode = "linear"
    modes = {"linear": "linear", "nearest": "nearest", "cubic": "cubic",
             "bilinear": "linear", "bicubic": "cubic"}  # the opset-16 names, as onnxruntime accepts them


def _base_coords(n: int, align_corners: bool) -> np.ndarray:
    if n <= 1:
        return np.zeros(max(n, 0), np.float64)
    if align_corners:
        return np.linspace(-1.0, 1.0, n)
    return (np.arange(n, dtype=np.float64) * 2 + 1) / n - 1


@op("AffineGrid", 20)
def affine_grid(theta, size, *, align_corners=0):
    sz = [int(v) for v in np.asarray(size).reshape(-1)]
    if len(sz) == 4 and theta.shape[1:] == (2, 3):
        N, _, H, W = sz
        y, x = np.meshgrid(_base_coords(H, bool(align_corners)), _base_coords(W, bool(align_corners)), indexing="ij")
        base = np.stack([x, y, np.ones_like(x)], axis=-1)  # (H, W, 3)
    elif len(sz) == 5 and theta.shape[1:] == (3, 4):
        N, _, D, H, W = sz
        z, y, x = np.meshgrid(_base_coords(D, bool(align_corners)), _base_coords(H, bool(align_corners)),
                              _base_coords(W, bool(align_corners)), indexing="ij")
        base = np.stack([x, y, z, np.ones_like(x)], axis=-1)  # (D, H, W, 4)
    else:
        raise ValueError(f"AffineGrid: theta {theta.shape} with size {sz}: expected (N, 2, 3) with 4 sizes "
                         "or (N, 3, 4) with 5")
    if theta.shape[0] != N:
        raise ValueError(f"theta has {theta.shape[0]} matrices, size asks for batch {N}")
    t = theta.astype(np.float64)
    flat = base.reshape(-1, base.shape[-1])  # (P, k+1)
    out = np.einsum("pk,njk->npj", flat, t)  # (N, P, k)
    return out.reshape((N,) + base.shape[:-1] + (t.shape[1],)).astype(theta.dtype)


@op("Col2Im", 18)
def col2im(input, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    img = [int(v) for v in np.asarray(image_shape).reshape(-1)]
    blk = [int(v) for v in np.asarray(block_shape).reshape(-1)]
    nd = len(img)
    if len(blk) != nd or input.ndim != 3:
        raise ValueError(f"Col2Im: input {input.shape}, image_shape {img}, block_shape {blk}")
    dil = list(dilations or [1] * nd)
    st = list(strides or [1] * nd)
    p = list(pads or [0] * (2 * nd))
    N, CK, L = input.shape
    K = math.prod(blk)
    if K == 0 or CK % K:
        raise ValueError(f"Col2Im: {CK} channels are not a multiple of the block size {K}")
    C = CK // K
    padded = [img[i] + p[i] + p[i + nd] for i in range(nd)]
    counts = [(padded[i] - dil[i] * (blk[i] - 1) - 1) // st[i] + 1 for i in range(nd)]
    if any(c <= 0 for c in counts) or math.prod(counts) != L:
        raise ValueError(f"Col2Im: {L} blocks given, the shapes make {counts}")
    cols = input.reshape((N, C) + tuple(blk) + tuple(counts))
    out = np.zeros((N, C) + tuple(padded), input.dtype)
    for k in itertools.product(*(range(b) for b in blk)):
        sl = tuple(slice(k[i] * dil[i], k[i] * dil[i] + st[i] * (counts[i] - 1) + 1, st[i]) for i in range(nd))
        out[(slice(None), slice(None)) + sl] += cols[(slice(None), slice(None)) + k]
    crop = tuple(slice(p[i], p[i] + img[i]) for i in range(nd))
    return out[(slice(None), slice(None)) + crop].copy()


@op("CenterCropPad", 18)
def center_crop_pad(input_data, shape, *, axes=None):
    r = input_data.ndim
    target = [int(v) for v in np.asarray(shape).reshape(-1)]
    ax = list(range(r)) if axes is None else [a + r if a < 0 else a for a in axes]
    if len(ax) != len(target) or any(not 0 <= a < r for a in ax) or len(set(ax)) != len(ax):
        raise ValueError(f"CenterCropPad: shape {target} does not fit axes {axes} of rank {r}")
    src = [slice(None)] * r
    dst = [slice(None)] * r
    out_shape = list(input_data.shape)
    for a, t in zip(ax, target):
        if t < 0:
            raise ValueError(f"CenterCropPad: negative size {t}")
        d = input_data.shape[a]
        out_shape[a] = t
        if d >= t:
            s = (d - t) // 2
            src[a] = slice(s, s + t)
        else:
            s = (t - d) // 2
            dst[a] = slice(s, s + d)
    out = np.zeros(out_shape, input_data.dtype)
    out[tuple(dst)] = input_data[tuple(src)]
    return out


# ------------------------------------------------------------- depth & space
def _check4(x: np.ndarray, what: str) -> None:
    if x.ndim != 4:
        raise ValueError(f"{what} takes a 4-D input, got shape {x.shape}")


@op("DepthToSpace", 1)
def depth_to_space(x, blocksize, mode="DCR"):
    _check4(x, "DepthToSpace")
    b = blocksize
    n, c, h, w = x.shape
    if b <= 0 or c % (b * b):
        raise ValueError(f"DepthToSpace: channels {c} are not divisible by blocksize^2 = {b * b}")
    if mode == "DCR":
        t = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        t = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        raise ValueError(f"DepthToSpace mode {mode!r} is not DCR or CRD")
    return t.reshape(n, c // (b * b), h * b, w * b)


@op("SpaceToDepth", 1)
def space_to_depth(x, blocksize, mode="DCR"):
    _check4(x, "SpaceToDepth")
    b = blocksize
    n, c, h, w = x.shape
    if b <= 0 or h % b or w % b:
        raise ValueError(f"SpaceToDepth: spatial size {h}x{w} is not divisible by blocksize {b}")
    t = x.reshape(n, c, h // b, b, w // b, b)
    if mode == "DCR":
        t = t.transpose(0, 3, 5, 1, 2, 4)
    elif mode == "CRD":
        t = t.transpose(0, 1, 3, 5, 2, 4)
    else:
        raise ValueError(f"SpaceToDepth mode {mode!r} is not DCR or CRD")
    return t.reshape(n, c * b * b, h // b, w // b)
