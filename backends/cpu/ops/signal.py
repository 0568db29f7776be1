"""Signal ops: DFT (opsets 17 and 20), STFT, the Hann/Hamming/Blackman windows and MelWeightMatrix.

Complex values travel as a trailing dimension of 2 (real, imaginary); a real
signal has a trailing dimension of 1. Transforms run through numpy.fft, in
single precision for float32 inputs and double otherwise.
"""

from __future__ import annotations

import numpy as np

from aiomnn.graph import dtype_of

from ..execution import CpuOp, op


def _to_complex(x: np.ndarray) -> np.ndarray:
    """The signal as complex numbers: complex64 for float32 (numpy.fft then computes in single precision,
    as the ONNX reference results do), complex128 otherwise."""
    ctype = np.complex64 if x.dtype == np.float32 else np.complex128
    if x.shape[-1] == 1:
        return x[..., 0].astype(ctype)
    if x.shape[-1] == 2:
        c = np.empty(x.shape[:-1], ctype)
        c.real = x[..., 0]
        c.imag = x[..., 1]
        return c
    raise ValueError(f"the last dimension must be 1 (real) or 2 (complex), got shape {x.shape}")


def _from_complex(c: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return np.stack([c.real, c.imag], axis=-1).astype(dtype)


def _scalar_int(v, what: str) -> int:
    a = np.asarray(v)
    if a.size != 1:
        raise ValueError(f"{what} must be a scalar, got shape {a.shape}")
    return int(a.reshape(()))


def dft(x: np.ndarray, dft_length: int | None, axis: int, inverse: bool, onesided: bool) -> np.ndarray:
    r = x.ndim
    if r < 2:
        raise ValueError(f"DFT input must have rank >= 2, got shape {x.shape}")
    ax = axis + r if axis < 0 else axis
    if not 0 <= ax <= r - 2:
        raise ValueError(f"axis {axis} is out of range for rank {r} (the last dimension holds real/imaginary parts)")
    if dft_length is not None and dft_length < 1:
        raise ValueError(f"dft_length must be positive, got {dft_length}")
    c = _to_complex(x)
    if onesided and inverse:
        n = dft_length if dft_length is not None else 2 * (c.shape[ax] - 1)
        if n < 1:
            raise ValueError(f"inverse one-sided DFT of length {n}")
        y = np.fft.irfft(c, n=n, axis=ax)
        return y[..., None].astype(x.dtype)
    n = dft_length if dft_length is not None else c.shape[ax]
    y = np.fft.ifft(c, n=n, axis=ax) if inverse else np.fft.fft(c, n=n, axis=ax)
    if onesided:
        y = np.take(y, np.arange(n // 2 + 1), axis=ax)
    return _from_complex(y, x.dtype)


@op("DFT", 17)
def dft_17(input, dft_length=None, *, axis=1, inverse=0, onesided=0):
    n = None if dft_length is None else _scalar_int(dft_length, "dft_length")
    return dft(input, n, axis, bool(inverse), bool(onesided))


@op("DFT", 20)
def dft_20(input, dft_length=None, axis=None, *, inverse=0, onesided=0):
    n = None if dft_length is None else _scalar_int(dft_length, "dft_length")
    a = -2 if axis is None else _scalar_int(axis, "axis")
    return dft(input, n, a, bool(inverse), bool(onesided))


@op("STFT", 17)
def stft(signal, frame_step, window=None, frame_length=None, *, onesided=1):
    if signal.ndim != 3:
        raise ValueError(f"STFT signal must have rank 3 [batch, length, 1 or 2], got shape {signal.shape}")
    c = _to_complex(signal)  # (batch, length)
    length = c.shape[1]
    step = _scalar_int(frame_step, "frame_step")
    if window is not None and window.ndim != 1:
        raise ValueError(f"window must be 1-D, got shape {window.shape}")
    if frame_length is not None:
        fl = _scalar_int(frame_length, "frame_length")
        if window is not None and window.shape[0] != fl:
            raise ValueError(f"window has {window.shape[0]} values, frame_length is {fl}")
    else:
        fl = window.shape[0] if window is not None else length
    if step < 1 or fl < 1 or fl > length:
        raise ValueError(f"frame_step {step} and frame_length {fl} do not fit a signal of length {length}")
    if onesided and signal.shape[-1] == 2:
        raise ValueError("a one-sided STFT needs a real signal")
    frames = (length - fl) // step + 1
    idx = np.arange(frames)[:, None] * step + np.arange(fl)[None, :]
    f = c[:, idx]  # (batch, frames, fl)
    if window is not None:
        f = f * window.astype(f.real.dtype)
    y = np.fft.fft(f, n=fl, axis=-1)
    if onesided:
        y = y[..., : fl // 2 + 1]
    return _from_complex(y, signal.dtype)


class _Window(CpuOp):
    coefficients: tuple[float, ...] = ()

    def __init__(self, node, inputs, outputs, *, output_datatype=1, periodic=1):
        super().__init__(node, inputs, outputs)
        self.dtype = dtype_of(output_datatype, str(node))
        self.periodic = bool(periodic)

    def run(self, size):
        n = _scalar_int(size, "size")
        if n < 0:
            raise ValueError(f"window size {n} is negative")
        N = n if self.periodic else n - 1  # a symmetric window of size 1 is 0/0: NaN, as the ONNX definition gives
        k = np.arange(n, dtype=np.float64)
        w = np.zeros(n, np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            for i, a in enumerate(self.coefficients):
                w += (-1) ** i * a * np.cos(2 * np.pi * i * k / N)
            return w.astype(self.dtype)


@op("HannWindow", 17)
class HannWindow(_Window):
    coefficients = (0.5, 0.5)


@op("HammingWindow", 17)
class HammingWindow(_Window):
    coefficients = (25 / 46, 21 / 46)


@op("BlackmanWindow", 17)
class BlackmanWindow(_Window):
    coefficients = (0.42, 0.5, 0.08)


def _hz_to_mel(f):
    return 2595.0 * np.log10(1.0 + f / 700.0)


def _mel_to_hz(m):
    return 700.0 * (np.power(10.0, m / 2595.0) - 1.0)


@op("MelWeightMatrix", 17)
class MelWeightMatrix(CpuOp):
    def __init__(self, node, inputs, outputs, *, output_datatype=1):
        super().__init__(node, inputs, outputs)
        self.dtype = dtype_of(output_datatype, str(node))

    def run(self, num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz):
        mels = _scalar_int(num_mel_bins, "num_mel_bins")
        n = _scalar_int(dft_length, "dft_length")
        rate = _scalar_int(sample_rate, "sample_rate")
        lo = float(np.asarray(lower_edge_hertz).reshape(()))
        hi = float(np.asarray(upper_edge_hertz).reshape(()))
        if mels < 1 or n < 1 or rate < 1 or not 0 <= lo < hi:
            raise ValueError(f"invalid MelWeightMatrix arguments: {mels} bins, dft_length {n}, rate {rate}, "
                             f"edges {lo}..{hi}")
        bins = n // 2 + 1
        points = mels + 2
        lo_mel, hi_mel = _hz_to_mel(lo), _hz_to_mel(hi)
        step = (hi_mel - lo_mel) / points
        hz = _mel_to_hz(lo_mel + step * np.arange(points, dtype=np.float64))
        edges = np.floor((n + 1) * hz / rate).astype(np.int64)
        if edges.max() >= bins:
            raise ValueError(f"upper_edge_hertz {hi} maps past the {bins} spectrogram bins")
        out = np.zeros((bins, mels), np.float64)
        for m in range(mels):
            left, center, right = edges[m], edges[m + 1], edges[m + 2]
            if center == left:
                out[center, m] = 1.0
            else:
                j = np.arange(left, center + 1)
                out[j, m] = (j - left) / (center - left)
            if right > center:
                j = np.arange(center, right)
                out[j, m] = (right - j) / (right - center)
        return out.astype(self.dtype)

