"""The ops the Vulkan backend runs: each turns a node into dispatches of the shaders.

An op class checks the node at creation (raising Decline when a dtype, shape or
attribute is not handled, so the CPU runs it) and, at on_resize, calls
`self.loc(t)` for the tensors it binds and `self.dispatch(...)` for each
shader launch. Only float32 tensors with known, non-empty shapes are taken;
fp16 storage (precision="low") is the backend's business, not the ops'.
"""

from __future__ import annotations

import logging
import math
import struct
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from aiomnn import shapes as shp
from aiomnn.backend import Execution, Tensor
from aiomnn.errors import BackendError
from aiomnn.graph import Node

from .backend import Dispatch
from .launch import CONV_BUSY, CONV_SLICE, CONV_SPLITS, Convolution, Grid, Launch, Matmul, Rows, Work
from .memory import Loc

if TYPE_CHECKING:
    from .fusion import Group

log = logging.getLogger("aiomnn.vulkan")

F32 = np.dtype(np.float32)
MAX_RANK = 6
INT_MAX = 2**31 - 1


class Decline(Exception):
    """This node stays on the CPU."""


class f32(float):
    """A push-constant value stored as float32 (plain ints are stored as int32)."""


def pack(*values: Any) -> bytes:
    flat: list[Any] = []
    for v in values:
        if isinstance(v, (list, tuple)):
            flat.extend(v)
        else:
            flat.append(v)
    fmt = "<" + "".join("f" if isinstance(v, f32) else "i" for v in flat)
    data = struct.pack(fmt, *flat)
    if len(data) > 128:
        raise Decline("push constants over 128 bytes")
    return data


def pad(values: list[int], n: int = MAX_RANK) -> list[int]:
    if len(values) > n:
        raise Decline(f"more than {n} dimensions")
    return list(values) + [0] * (n - len(values))


def contiguous(shape: tuple[int, ...]) -> list[int]:
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return out[::-1]


def broadcast_strides(shape: tuple[int, ...], out: tuple[int, ...]) -> list[int]:
    """Strides of `shape` read as `out` (numpy broadcasting): 0 on broadcast axes."""
    k = len(out) - len(shape)
    if k < 0:
        raise Decline("input rank above output rank")
    st = contiguous(shape)
    res = [0] * k
    for d, s, o in zip(shape, st, out[k:]):
        if d == o:
            res.append(s)
        elif d == 1:
            res.append(0)
        else:
            raise Decline(f"{shape} does not broadcast to {out}")
    return res


def coalesce(shape: list[int], *strides: list[int]) -> tuple[list[int], list[list[int]]]:
    """Drop unit axes and merge neighbours that are contiguous in every operand."""
    dims = [(d, [s[i] for s in strides]) for i, d in enumerate(shape) if d != 1]
    if not dims:
        return [1], [[0] for _ in strides]
    merged = [dims[0]]
    for d, st in dims[1:]:
        pd, pst = merged[-1]
        if all(ps == s * d for ps, s in zip(pst, st)):
            merged[-1] = (pd * d, st)
        else:
            merged.append((d, st))
    return [d for d, _ in merged], [[st[k] for _, st in merged] for k in range(len(strides))]


def fits(shape, *strides: list[int]) -> None:
    """Decline (at creation, while the CPU can still take the node) an index space the shaders cannot walk."""
    dims, _ = coalesce(list(shape), *[list(st) for st in strides])
    if len(dims) > MAX_RANK:
        raise Decline(f"{len(dims)} dimensions after merging, the shaders take {MAX_RANK}")


def numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) if shape is not None else -1


def is_f32(t: Tensor | None) -> bool:
    return t is not None and t.kind == "tensor" and t.dtype == F32 and t.shape is not None


class VkOp(Execution):
    """A node on the Vulkan backend."""

    #: For Reshape-like ops: the input tensor whose memory the output shares.
    alias_of: Tensor | None = None
    #: The index of this op in the backend's created list (None for ops planned alone, as tuning does).
    step: int | None = None
    #: The fused group this op belongs to (see plan_fusions); its last member runs the group's dispatches.
    group: "Group | None" = None

    def __init__(self, backend, node: Node, inputs: list[Tensor | None], outputs: list[Tensor]):
        self.b = backend
        self.node = node
        self.attrs = node.attrs
        self.dispatches: list[Dispatch] = []
        self.launches: list[Launch] = []

    def on_resize(self, inputs: list[Tensor | None], outputs: list[Tensor]) -> None:
        self.dispatches = []
        self.launches = []
        if self.step is not None:
            self.b.advance(self.step)
        self.b._exes.append(self)
        self.in_names = [t.name for t in inputs if t is not None and t.name and not t.is_const]
        self.out_names = [t.name for t in outputs if t is not None and t.name]
        self.out_locs = [self.b.locate_output(t) if t is not None and t.name else None for t in outputs]
        self.plan(inputs, outputs)
        if self.group is not None and self.group.members[-1] is self:
            self.group.apply(self)

    def plan(self, inputs: list[Tensor | None], outputs: list[Tensor]) -> None:
        raise NotImplementedError

    def on_execute(self, inputs: list[Any], outputs: list[Any]) -> Any:
        raise BackendError(f"{self.node} runs inside its Vulkan segment, not on its own")

    # Helpers for plan() ---------------------------------------------------------------
    def loc(self, t: Tensor) -> Loc:
        return self.b.locate(t)

    def dispatch(self, kernel: str, locs: list[Loc], push: bytes, work: Work, consts: tuple[int, ...] = ()) -> None:
        """Launch `kernel` over `work`, with the workgroup size the tuning cache holds for it, else the default."""
        launch = Launch(self.b.ctx, kernel, self.b.fp16, consts, push, work, locs)
        self.launches.append(launch)
        choice = self.b.rt.tuned_choice(launch)
        name, local, groups = launch.resolve(choice)
        k = self.b.ctx.kernel(name, self.b.fp16, local, consts)
        if len(locs) != k.nbind:
            raise BackendError(f"{kernel} takes {k.nbind} bindings, got {len(locs)}")
        self.dispatches.append(Dispatch(k, locs, push, groups))

    def copy(self, dst: Loc, src: Loc, shape: list[int], src_strides: list[int], dst_strides: list[int],
             src_base: int = 0, dst_base: int = 0) -> None:
        n = numel(shape)
        if n == 0:
            return
        dims, (ss, ds) = coalesce(list(shape), list(src_strides), list(dst_strides))
        self.dispatch("copy", [dst, src], pack(n, src_base, dst_base, pad(dims), pad(ss), pad(ds)),
                      Grid(n), consts=(len(dims),))


OPS: dict[str, Callable[..., VkOp]] = {}


def register(*names: str):
    def add(cls):
        for n in names:
            OPS[n] = cls
        return cls

    return add


def create(backend, node: Node, inputs: list[Tensor | None], outputs: list[Tensor]) -> VkOp | None:
    """The op's Vulkan execution, or None to leave it to the backup backend."""
    cls = OPS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    if cls is None:
        return None
    limit = min(backend.ctx.max_range, INT_MAX)
    for t in outputs:
        if t is not None and t.name:
            if not is_f32(t) or numel(t.shape) <= 0 or numel(t.shape) * 4 > limit:
                return None
    try:
        return cls(backend, node, inputs, outputs)
    except Decline as why:
        log.debug("%s stays on the CPU: %s", node, why)
        return None
    except Exception as exc:  # a shape or attribute this code did not foresee: the CPU will judge it
        log.debug("%s stays on the CPU after %s: %s", node, type(exc).__name__, exc)
        return None


def data_input(t: Tensor | None, backend, what: str = "input") -> Tensor:
    """A float32 tensor with a known, non-empty shape that fits one binding."""
    if not is_f32(t):
        raise Decline(f"{what} is not a float32 tensor of known shape")
    n = numel(t.shape)
    if n <= 0 or n * 4 > min(backend.ctx.max_range, INT_MAX):
        raise Decline(f"{what} has {n} elements")
    return t


def const_value(t: Tensor | None) -> np.ndarray | None:
    if t is None:
        return None
    if not t.is_const:
        raise Decline("a parameter is only known at run time")
    return np.asarray(t.const)


# ------------------------------------------------------------------------ activations
#: Codes shared by unary_op() in shaders/common.glsl.
UNARY = {"Identity": 0, "Relu": 1, "LeakyRelu": 2, "Clip": 3, "Sigmoid": 4, "HardSigmoid": 5, "HardSwish": 6,
         "Tanh": 7, "Elu": 8, "Selu": 11, "Softplus": 12, "Softsign": 13, "Celu": 14,
         "ThresholdedRelu": 15, "Mish": 16, "Swish": 17, "Sqrt": 20, "Exp": 21, "Log": 22, "Neg": 23, "Abs": 24,
         "Reciprocal": 25, "Floor": 26, "Ceil": 27, "Round": 28, "Sin": 29, "Cos": 30, "Erf": 31, "Sign": 32,
         "Tan": 34, "Asin": 35, "Acos": 36, "Atan": 37, "Sinh": 38, "Cosh": 39, "Asinh": 40, "Acosh": 41,
         "Atanh": 42}
_DEFAULTS = {"LeakyRelu": {"alpha": 0.01}, "HardSigmoid": {"alpha": 0.2, "beta": 0.5}, "Elu": {"alpha": 1.0},
             "Selu": {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875},
             "Celu": {"alpha": 1.0}, "ThresholdedRelu": {"alpha": 1.0}, "Swish": {"alpha": 1.0}}
_ALLOWED = {"LeakyRelu": {"alpha"}, "HardSigmoid": {"alpha", "beta"}, "Elu": {"alpha"}, "Selu": {"alpha", "gamma"},
            "Celu": {"alpha"}, "ThresholdedRelu": {"alpha"}, "Gelu": {"approximate"}, "Clip": {"min", "max"},
            "Swish": {"alpha"}}
FLT_MAX = 3.4028234663852886e38


def activation(op: str, attrs: dict[str, Any]) -> tuple[int, float, float]:
    """(code, a, b) for unary_op(): an activation or unary function with its attributes."""
    extra = set(attrs) - _ALLOWED.get(op, set())
    if extra:
        raise Decline(f"{op} attribute(s) {sorted(extra)}")
    a = {**_DEFAULTS.get(op, {}), **attrs}
    if op == "Gelu":
        approx = a.get("approximate", "none")
        if approx not in ("none", "tanh"):
            raise Decline(f"Gelu approximate={approx!r}")
        return (9 if approx == "none" else 10), 0.0, 0.0
    if op == "Clip":
        lo = -math.inf if a.get("min") is None else float(a["min"])
        hi = math.inf if a.get("max") is None else float(a["max"])
        return 3, lo, hi
    if op not in UNARY:
        raise Decline(f"activation {op}")
    if op in ("Elu", "LeakyRelu", "Celu", "ThresholdedRelu", "Swish"):
        return UNARY[op], float(a["alpha"]), 0.0
    if op == "HardSigmoid":
        return UNARY[op], float(a["alpha"]), float(a["beta"])
    if op == "Selu":
        return UNARY[op], float(a["alpha"]), float(a["gamma"])
    return UNARY[op], 0.0, 0.0


def fused(node: Node) -> tuple[int, float, float]:
    act = node.attrs.get("_activation")
    if act is None:
        return 0, 0.0, 0.0
    name, attrs = act
    return activation(name, dict(attrs))


def _f(v: float) -> f32:
    return f32(np.float32(v)) if math.isfinite(v) else f32(v)


# ----------------------------------------------------------------------------- unary
@register(*[n for n in UNARY if n != "Clip"], "Gelu")
class Unary(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        if len(inputs) != 1 or len([o for o in outputs if o.name]) != 1:
            raise Decline("one input, one output")
        data_input(inputs[0], backend)
        self.code, self.a, self.c = activation(node.op_type, dict(node.attrs))

    def plan(self, inputs, outputs):
        n = numel(outputs[0].shape)
        self.dispatch("unary", [self.out_locs[0], self.loc(inputs[0])],
                      pack(n, _f(self.a), _f(self.c)), Grid(n), consts=(self.code,))


@register("Clip")
class Clip(Unary):
    def __init__(self, backend, node, inputs, outputs):
        VkOp.__init__(self, backend, node, inputs, outputs)
        data_input(inputs[0], backend)
        if node.opset < 11:
            lo = float(node.attrs.get("min", -FLT_MAX))
            hi = float(node.attrs.get("max", FLT_MAX))
        else:
            if node.attrs:
                raise Decline("Clip-11 has no attributes")
            bounds = []
            for t in inputs[1:3]:
                v = const_value(t)
                if v is not None and v.size != 1:
                    raise Decline("Clip bounds must be scalars")
                if v is not None and v.dtype != F32:
                    raise Decline("Clip bounds must be float32")
                bounds.append(None if v is None else float(v.reshape(-1)[0]))
            bounds += [None] * (2 - len(bounds))
            lo = -math.inf if bounds[0] is None else bounds[0]
            hi = math.inf if bounds[1] is None else bounds[1]
        self.code, self.a, self.c = 3, lo, hi


@register("Dropout")
class Dropout(Unary):
    def __init__(self, backend, node, inputs, outputs):
        VkOp.__init__(self, backend, node, inputs, outputs)
        data_input(inputs[0], backend)
        if len(outputs) > 1 and outputs[1].name:
            raise Decline("Dropout's mask output")
        if len(inputs) > 2 and inputs[2] is not None:
            mode = const_value(inputs[2])
            if mode is None or bool(mode.reshape(-1)[0]):
                raise Decline("Dropout in training mode")
        if node.opset < 7 and node.attrs.get("is_test", 0) == 0:
            raise Decline("Dropout-6 in training mode")
        self.code, self.a, self.c = 0, 0.0, 0.0


# ---------------------------------------------------------------------------- binary
BINARY = {"Add": 0, "Sub": 1, "Mul": 2, "Div": 3, "Pow": 4, "Max": 5, "Min": 6, "PRelu": 7, "Sum": 0, "Mean": 0}


@register(*BINARY)
class Binary(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        op = node.op_type
        variadic = op in ("Sum", "Mean", "Max", "Min")
        if not inputs or (not variadic and len(inputs) != 2):
            raise Decline("arity")
        for t in inputs:
            data_input(t, backend)
        self.op = BINARY[op]
        if op == "Add":
            self.act = fused(node)
            extra = set(node.attrs) - {"_activation"}
        else:
            self.act = (0, 0.0, 0.0)
            extra = set(node.attrs)
        if extra and node.opset < 7:
            if extra - {"broadcast", "axis"} or node.attrs.get("axis") is not None:
                raise Decline("legacy broadcast axis")
        elif extra:
            raise Decline(f"attributes {sorted(extra)}")
        out = tuple(outputs[0].shape)
        for t in inputs:
            fits(out, broadcast_strides(tuple(t.shape), out), broadcast_strides(tuple(inputs[0].shape), out),
                 contiguous(out))
        if op == "PRelu" and tuple(np.broadcast_shapes(inputs[0].shape, inputs[1].shape)) != tuple(inputs[0].shape):
            raise Decline("PRelu slope larger than x")

    def _one(self, out: Loc, a: Loc, ash, b: Loc, bsh, oshape, act) -> None:
        n = numel(oshape)
        dims, (sa, sb) = coalesce(list(oshape), broadcast_strides(ash, oshape), broadcast_strides(bsh, oshape))
        code, x, y = act
        self.dispatch("binary", [out, a, b], pack(n, _f(x), _f(y), pad(dims), pad(sa), pad(sb)), Grid(n),
                      consts=(self.op, code, len(dims)))

    def plan(self, inputs, outputs):
        out = self.out_locs[0]
        oshape = tuple(outputs[0].shape)
        n = numel(oshape)
        if len(inputs) == 1:
            x = inputs[0]
            self.copy(out, self.loc(x), list(oshape), broadcast_strides(tuple(x.shape), oshape), contiguous(oshape))
            return
        last = len(inputs) - 1
        mean = self.node.op_type == "Mean"
        for i in range(1, len(inputs)):
            a, ash = (self.loc(inputs[0]), tuple(inputs[0].shape)) if i == 1 else (out, oshape)
            act = self.act if i == last else (0, 0.0, 0.0)
            self._one(out, a, ash, self.loc(inputs[i]), tuple(inputs[i].shape), oshape, act)
        if mean:
            self.dispatch("unary", [out, out], pack(n, _f(1.0 / len(inputs)), _f(0.0)), Grid(n), consts=(33,))


@register("BatchNormalization")
class BatchNorm(VkOp):
    """Inference BatchNormalization with constant statistics: y = x * k + c per channel."""

    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x = data_input(inputs[0], backend)
        if len(outputs) > 1 and any(o.name for o in outputs[1:]):
            raise Decline("training outputs")
        if node.attrs.get("training_mode", 0) or (node.opset < 7 and not node.attrs.get("is_test", 0)):
            raise Decline("training mode")
        if len(x.shape) < 2 or len(inputs) != 5:
            raise Decline("shape")
        params = [const_value(t) for t in inputs[1:5]]
        c = x.shape[1]
        if any(p.dtype != F32 or p.shape != (c,) for p in params):
            raise Decline("parameters")
        scale, bias, mean, var = (p.astype(np.float64) for p in params)
        eps = float(node.attrs.get("epsilon", 1e-5))
        k = scale / np.sqrt(var + eps)
        self.k = k.astype(np.float32)
        self.c = (bias - mean * k).astype(np.float32)
        self.cshape = (c,) + (1,) * (len(x.shape) - 2)
        fits(x.shape, contiguous(x.shape), broadcast_strides(self.cshape, tuple(x.shape)))

    def plan(self, inputs, outputs):
        out = self.out_locs[0]
        oshape = tuple(outputs[0].shape)
        kl, cl = self.b.aux(self.k.astype(self.b.store)), self.b.aux(self.c.astype(self.b.store))
        for op, a, ash, b in ((2, self.loc(inputs[0]), oshape, kl), (0, out, oshape, cl)):
            n = numel(oshape)
            dims, (sa, sb) = coalesce(list(oshape), broadcast_strides(ash, oshape),
                                      broadcast_strides(self.cshape, oshape))
            self.dispatch("binary", [out, a, b], pack(n, _f(0), _f(0), pad(dims), pad(sa), pad(sb)), Grid(n),
                          consts=(op, 0, len(dims)))


# ------------------------------------------------------------------------------ conv
def conv_inputs(backend, node, inputs, more_attrs: set[str]):
    """X, W and the optional B of a Conv or ConvTranspose, declined unless 1-D or 2-D float32 with known attributes."""
    x = data_input(inputs[0], backend, "X")
    w = data_input(inputs[1], backend, "W")
    b = inputs[2] if len(inputs) > 2 else None
    if b is not None:
        data_input(b, backend, "B")
    if len(x.shape) not in (3, 4) or len(w.shape) != len(x.shape):
        raise Decline("only 1-D and 2-D convolutions")
    extra = set(node.attrs) - {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides", "_activation"}
    extra -= more_attrs
    if extra:
        raise Decline(f"attributes {sorted(extra)}")
    return x, w, b


#: The implicit GEMM (conv_gemm) takes convolutions with sums this deep (on an H100 it beat the direct kernel
#: from 3 x 3 x 3 up) and this many output channels per group; depthwise ones stay on the direct kernel.
CONV_GEMM_MIN_K = 27
CONV_GEMM_MIN_M = 8
#: Bytes of float32 partial sums a convolution may use to split its sums (where its grid is small).
CONV_SCRATCH = 4 << 20


@register("Conv")
class Conv(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x, w, b = conv_inputs(backend, node, inputs, set())
        kernel, strides, dils, pads = shp.window_params(node, x.shape, node.attrs.get("kernel_shape", w.shape[2:]))
        if list(kernel) != list(w.shape[2:]):
            raise Decline("kernel_shape differs from the weight")
        g = int(node.attrs.get("group", 1))
        n, c = x.shape[:2]
        co = w.shape[0]
        if g < 1 or c % g or co % g or w.shape[1] != c // g:
            raise Decline("groups")
        if b is not None and tuple(b.shape) != (co,):
            raise Decline("bias shape")
        if len(x.shape) == 3:  # 1-D as 2-D with height 1
            kernel, strides, dils, pads = [1] + list(kernel), [1] + list(strides), [1] + list(dils), \
                [0, pads[0], 0, pads[1]]
            spatial = (1, x.shape[2])
        else:
            spatial = tuple(x.shape[2:])
        oh = (spatial[0] + pads[0] + pads[2] - dils[0] * (kernel[0] - 1) - 1) // strides[0] + 1
        ow = (spatial[1] + pads[1] + pads[3] - dils[1] * (kernel[1] - 1) - 1) // strides[1] + 1
        want = (n, co, oh, ow) if len(x.shape) == 4 else (n, co, ow)
        if tuple(outputs[0].shape) != want or oh <= 0 or ow <= 0:
            raise Decline("output shape")
        if any(p < 0 for p in pads):
            raise Decline("negative pads")
        self.geo = (n, c, spatial[0], spatial[1], co, oh, ow, kernel, strides, dils, pads, g)
        self.act = fused(node)
        self.pointwise = (kernel == [1, 1] and strides == [1, 1] and pads == [0, 0, 0, 0] and g == 1)

    @property
    def as_matmul(self) -> bool:
        """Whether plan() runs this conv as the matmul: out[n] = W (co x c) @ X[n] (c x hw) + bias per row.

        Pointwise convs do, unless the matmul's 64 x 64 tiles are too few to fill a GPU (each walks all of
        k alone: latency) and k is deep enough to split: conv_gemm splits the sum instead (not on CPU
        implementations: there the matmul's barrier-free direct kernel wins).
        """
        n, c, h, w, co, _, _, kernel, _, _, _, g = self.geo
        k = c // g * kernel[0] * kernel[1]
        small = k < CONV_GEMM_MIN_K or co // g < CONV_GEMM_MIN_M
        few_tiles = self.b.ctx.info.is_gpu and n * -(-co // 64) * -(-h * w // 64) < CONV_BUSY
        return self.pointwise and (small or not few_tiles or k < 2 * CONV_SLICE)

    def matmul(self, on: VkOp, inputs: list[Tensor | None], out: Loc, x: Loc, res: Loc | None = None,
               scale: Loc | None = None) -> None:
        """Dispatch (on `on`: this op, or the last of a fused group) the matmul of a pointwise conv of image
        `x`, with a residual added after the activation and the image scaled per channel, where given."""
        n, c, h, w, co = self.geo[:5]
        wt = self.loc(inputs[1])
        bias = inputs[2] if len(inputs) > 2 else None
        code, a1, a2 = self.act
        hw = h * w
        push = pack(co, hw, c, 1, [n, 0, 0], [0, 0, 0], [c * hw, 0, 0], c, 1, hw, 1,
                    int(bias is not None), 1, 0, _f(1.0), _f(1.0), _f(a1), _f(a2))
        locs = [out, wt, x, self.loc(bias) if bias is not None else wt, res or wt, scale or wt]
        on.dispatch("matmul", locs, push, Matmul(co, hw, n),
                    consts=(code, int(res is not None), int(scale is not None)))

    def plan(self, inputs, outputs):
        n, c, h, w, co, oh, ow, kernel, strides, dils, pads, g = self.geo
        x, wt = self.loc(inputs[0]), self.loc(inputs[1])
        b = inputs[2] if len(inputs) > 2 else None
        bl = self.loc(b) if b is not None else wt
        code, a1, a2 = self.act
        out = self.out_locs[0]
        cog = co // g
        k, npix = c // g * kernel[0] * kernel[1], n * oh * ow
        small = k < CONV_GEMM_MIN_K or cog < CONV_GEMM_MIN_M
        if self.as_matmul:
            self.matmul(self, inputs, out, x)
            return
        blocks = -(-cog // 4)
        push = pack(n, c, h, w, co, oh, ow, kernel[0], kernel[1], strides[0], strides[1], dils[0], dils[1],
                    pads[0], pads[1], g, int(b is not None), _f(a1), _f(a2), blocks)
        if small:  # depthwise and the like: the direct kernel
            self.dispatch("conv", [out, x, wt, bl], push, Grid(n * g * blocks * oh * ow), consts=(code,))
            return
        # The implicit GEMM (conv_gemm.comp), one per group. Tuning picks its tile and how many workgroups
        # (up to `splits`, each at least two steps of k) share a tile's sum: they need partial sums (arena
        # space, only while this op runs) and a counter per tile of the smallest tile (zeros in aux, which
        # the shader leaves at zero).
        splits = max(s for s in CONV_SPLITS if s == 1 or (s * co * npix * 4 <= CONV_SCRATCH and s * 32 <= k))
        part = cnt = wt
        if splits > 1:
            block = self.b.arena.acquire(splits * co * npix * 4)
            part = Loc("arena", block.offset, splits * co * npix * 4)
            self.b.arena.release(block)
            cnt = self.b.aux(np.zeros(-(-cog // 16) * -(-npix // 32) * g, np.uint32))
        self.dispatch("conv_gemm", [out, x, wt, bl, part, cnt], push, Convolution(cog, npix, k, g, splits),
                      consts=(code,))


@register("ConvTranspose")
class ConvTranspose(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x, w, b = conv_inputs(backend, node, inputs, {"output_padding", "output_shape"})
        a = node.attrs
        nsp = len(x.shape) - 2
        g = int(a.get("group", 1))
        n, c = x.shape[:2]
        if g < 1 or w.shape[0] != c or c % g:
            raise Decline("groups")
        cog = w.shape[1]
        co = cog * g
        kernel = list(w.shape[2:])
        if a.get("kernel_shape") is not None and list(a["kernel_shape"]) != kernel:
            raise Decline("kernel_shape")
        strides = list(a.get("strides") or [1] * nsp)
        dils = list(a.get("dilations") or [1] * nsp)
        opad = list(a.get("output_padding") or [0] * nsp)
        auto = a.get("auto_pad", "NOTSET")
        if auto not in ("NOTSET", "", "SAME_UPPER", "SAME_LOWER", "VALID"):
            raise Decline("auto_pad")
        if len(strides) != nsp or len(dils) != nsp or len(opad) != nsp:
            raise Decline("attribute lengths")
        ins = list(x.shape[2:])
        full = [strides[i] * (ins[i] - 1) + dils[i] * (kernel[i] - 1) + 1 for i in range(nsp)]
        if a.get("output_shape"):
            outs = [int(v) for v in list(a["output_shape"])[-nsp:]]
        elif auto in ("SAME_UPPER", "SAME_LOWER"):
            outs = [ins[i] * strides[i] for i in range(nsp)]
        else:
            outs = None
        if outs is not None:
            heads = []
            for i in range(nsp):
                total = max(0, full[i] + opad[i] - outs[i])
                half = int(total / 2)
                heads.append(half if auto == "SAME_UPPER" else total - half)
        else:
            pads = [0] * (2 * nsp) if auto == "VALID" else list(a.get("pads") or [0] * (2 * nsp))
            if len(pads) != 2 * nsp:
                raise Decline("pads")
            heads = pads[:nsp]
            outs = [full[i] + opad[i] - pads[i] - pads[i + nsp] for i in range(nsp)]
        if tuple(outputs[0].shape) != (n, co, *outs) or any(o <= 0 for o in outs):
            raise Decline("output shape")
        if b is not None and tuple(b.shape) != (co,):
            raise Decline("bias shape")
        if nsp == 1:
            ins, outs, kernel, strides, dils, heads = [1] + ins, [1] + outs, [1] + kernel, [1] + strides, \
                [1] + dils, [0] + heads
        self.geo = (n, c, ins, co, outs, kernel, strides, dils, heads, g)
        self.act = fused(node)

    def plan(self, inputs, outputs):
        n, c, ins, co, outs, kernel, strides, dils, heads, g = self.geo
        x, wt = self.loc(inputs[0]), self.loc(inputs[1])
        b = inputs[2] if len(inputs) > 2 else None
        bl = self.loc(b) if b is not None else wt
        code, a1, a2 = self.act
        push = pack(n, c, ins[0], ins[1], co, outs[0], outs[1], kernel[0], kernel[1], strides[0], strides[1],
                    dils[0], dils[1], heads[0], heads[1], g, int(b is not None), _f(a1), _f(a2))
        self.dispatch("convt", [self.out_locs[0], x, wt, bl], push, Grid(n * co * outs[0] * outs[1]),
                      consts=(code,))


# ---------------------------------------------------------------------------- matmul
@register("MatMul")
class MatMul(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        a = data_input(inputs[0], backend, "A")
        b = data_input(inputs[1], backend, "B")
        sa, sb = list(a.shape), list(b.shape)
        if not sa or not sb:
            raise Decline("scalar operands")
        a2 = [1] + sa if len(sa) == 1 else sa
        b2 = sb + [1] if len(sb) == 1 else sb
        m, k = a2[-2:]
        k2, nn = b2[-2:]
        if k != k2:
            raise Decline("inner dimensions")
        batch = tuple(np.broadcast_shapes(tuple(a2[:-2]), tuple(b2[:-2])))
        bsa = broadcast_strides(tuple(a2[:-2]), batch) if batch else []
        bsb = broadcast_strides(tuple(b2[:-2]), batch) if batch else []
        # Strides counted in matrices: scale to elements.
        bsa = [s * m * k for s in bsa]
        bsb = [s * k * nn for s in bsb]
        dims, (bsa, bsb) = coalesce(list(batch), bsa, bsb) if batch else ([1], [[0], [0]])
        if len(dims) > 3 or numel(batch) > 65535:
            raise Decline("batch")
        want = list(batch) + ([m] if len(sa) > 1 else []) + ([nn] if len(sb) > 1 else [])
        if list(outputs[0].shape) != want:
            raise Decline("output shape")
        self.geo = (m, nn, k, dims, bsa, bsb, numel(batch) if batch else 1)

    def plan(self, inputs, outputs):
        m, n, k, dims, bsa, bsb, nb = self.geo
        a, b = self.loc(inputs[0]), self.loc(inputs[1])
        push = pack(m, n, k, len(dims), pad(dims, 3), pad(bsa, 3), pad(bsb, 3), k, 1, n, 1, 0, 0, 0,
                    _f(1.0), _f(0.0), _f(0.0), _f(0.0))
        self.dispatch("matmul", [self.out_locs[0], a, b, a, a, a], push, Matmul(m, n, nb), consts=(0,))


@register("Gemm")
class Gemm(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        a = data_input(inputs[0], backend, "A")
        b = data_input(inputs[1], backend, "B")
        c = inputs[2] if len(inputs) > 2 else None
        at = node.attrs
        extra = set(at) - {"alpha", "beta", "transA", "transB", "_activation", "broadcast"}
        if extra:
            raise Decline(f"attributes {sorted(extra)}")
        if len(a.shape) != 2 or len(b.shape) != 2:
            raise Decline("rank")
        ta, tb = int(at.get("transA", 0)), int(at.get("transB", 0))
        m, k = (a.shape[1], a.shape[0]) if ta else a.shape
        k2, n = (b.shape[1], b.shape[0]) if tb else b.shape
        if k != k2 or tuple(outputs[0].shape) != (m, n):
            raise Decline("shapes")
        self.strides = ((1, m) if ta else (k, 1)) + ((1, k) if tb else (n, 1))
        self.c = None
        if c is not None:
            data_input(c, backend, "C")
            cs = tuple(c.shape)
            if len(cs) > 2:
                raise Decline("C rank")
            st = broadcast_strides(cs, (m, n))
            self.c = (st[0], st[1])
        self.geo = (m, n, k)
        self.alpha, self.beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
        self.act = fused(node)

    def plan(self, inputs, outputs):
        m, n, k = self.geo
        a, b = self.loc(inputs[0]), self.loc(inputs[1])
        cl = self.loc(inputs[2]) if self.c is not None else a
        crs, ccs = self.c or (0, 0)
        ars, acs, brs, bcs = self.strides
        code, a1, a2 = self.act
        push = pack(m, n, k, 1, [1, 0, 0], [0, 0, 0], [0, 0, 0], ars, acs, brs, bcs, int(self.c is not None), crs, ccs,
                    _f(self.alpha), _f(self.beta), _f(a1), _f(a2))
        self.dispatch("matmul", [self.out_locs[0], a, b, cl, a, a], push, Matmul(m, n, 1), consts=(code,))


# ------------------------------------------------------------------------------ pool
@register("MaxPool", "AveragePool", "LpPool")
class Pool(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        from aiomnn.backends.cpu.ops.pool import pool_geometry

        x = data_input(inputs[0], backend)
        if len(outputs) > 1 and outputs[1].name:
            raise Decline("MaxPool indices")
        if len(x.shape) not in (3, 4):
            raise Decline("only 1-D and 2-D pooling")
        a = node.attrs
        op = node.op_type
        allowed = {"auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "strides"}
        if op == "MaxPool":
            allowed |= {"storage_order"}
        elif op == "AveragePool":
            allowed |= {"count_include_pad"}
        else:
            allowed |= {"p"}
        if set(a) - allowed:
            raise Decline(f"attributes {sorted(set(a) - allowed)}")
        nsp = len(x.shape) - 2
        kernel = list(a.get("kernel_shape") or [])
        if len(kernel) != nsp:
            raise Decline("kernel_shape")
        strides = list(a.get("strides") or [1] * nsp)
        dils = list(a.get("dilations") or [1] * nsp)
        pads, outs = pool_geometry(list(x.shape[2:]), kernel, strides, dils, a.get("pads"),
                                   a.get("auto_pad", "NOTSET"), int(a.get("ceil_mode", 0)))
        if tuple(outputs[0].shape) != tuple(x.shape[:2]) + tuple(outs):
            raise Decline("output shape")
        spatial = list(x.shape[2:])
        if nsp == 1:
            kernel, strides, dils, spatial, outs = [1] + kernel, [1] + strides, [1] + dils, [1] + spatial, [1] + outs
            pads = [0, pads[0], 0, pads[1]]
        include = int(a.get("count_include_pad", 0))
        lo = [(-pads[0] if include else 0), (-pads[1] if include else 0)]
        hi = [spatial[0] + (pads[2] if include else 0), spatial[1] + (pads[3] if include else 0)]
        mode = {"MaxPool": 0, "AveragePool": 1, "LpPool": 2}[op]
        self.geo = (x.shape[0] * x.shape[1], spatial, outs, kernel, strides, dils, pads, mode, lo, hi,
                    float(a.get("p", 2)))

    def plan(self, inputs, outputs):
        nc, sp, outs, k, s, d, p, mode, lo, hi, lp = self.geo
        push = pack(nc, sp[0], sp[1], outs[0], outs[1], k[0], k[1], s[0], s[1], d[0], d[1], p[0], p[1],
                    lo[0], hi[0], lo[1], hi[1], _f(lp))
        self.dispatch("pool", [self.out_locs[0], self.loc(inputs[0])], push, Grid(nc * outs[0] * outs[1]),
                      consts=(mode,))


# ---------------------------------------------------------------------------- reduce
REDUCE = {"ReduceSum": 0, "ReduceMean": 1, "ReduceMax": 2, "ReduceMin": 3, "ReduceSumSquare": 4, "ReduceL1": 5,
          "ReduceL2": 6, "ReduceLogSum": 7, "ReduceProd": 8, "ReduceLogSumExp": 9}


def _local_for(n: int) -> int:
    return 256 if n >= 2048 else (128 if n >= 512 else 64)


@register(*REDUCE, "GlobalAveragePool", "GlobalMaxPool")
class Reduce(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x = data_input(inputs[0], backend)
        shape = list(x.shape)
        op = node.op_type
        if op.startswith("Global"):
            if len(shape) < 3 or node.attrs:
                raise Decline("global pool")
            self.code = 1 if op == "GlobalAveragePool" else 2
            axes = list(range(2, len(shape)))
        else:
            if set(node.attrs) - {"axes", "keepdims", "noop_with_empty_axes"}:
                raise Decline("attributes")
            self.code = REDUCE[op]
            axes = shp.reduce_axes(node, inputs, len(shape))
            if axes is None or not axes:
                raise Decline("no axes")
            if not shape:
                raise Decline("scalar")
        red = set(axes)
        kept = [(i, d) for i, d in enumerate(shape) if d != 1]
        flags = [i in red for i, _ in kept]
        # The reduced axes (ignoring unit axes) must form one run: x is [outer, R, inner].
        if True in flags:
            first = flags.index(True)
            last = len(flags) - 1 - flags[::-1].index(True)
            if not all(flags[first: last + 1]):
                raise Decline("reduced axes are not contiguous")
            outer = numel([d for _, d in kept[:first]])
            r = numel([d for _, d in kept[first: last + 1]])
            inner = numel([d for _, d in kept[last + 1:]])
        else:
            outer, r, inner = numel(shape), 1, 1
        if numel(outputs[0].shape) != outer * inner:
            raise Decline("output size")
        self.geo = (outer, r, inner)

    def plan(self, inputs, outputs):
        outer, r, inner = self.geo
        ls = _local_for(r)
        self.dispatch("reduce", [self.out_locs[0], self.loc(inputs[0])], pack(outer, r, inner),
                      Rows(outer * inner, ls), consts=(self.code,))


@register("Softmax", "LogSoftmax")
class Softmax(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x = data_input(inputs[0], backend)
        shape = list(x.shape)
        if set(node.attrs) - {"axis"}:
            raise Decline("attributes")
        r = max(1, len(shape))
        if node.opset < 13:
            axis = node.attrs.get("axis", 1) % r
            outer, a, inner = numel(shape[:axis]), numel(shape[axis:]), 1
        else:
            axis = node.attrs.get("axis", -1) % r
            outer, a, inner = numel(shape[:axis]), numel(shape[axis: axis + 1]), numel(shape[axis + 1:])
        self.geo = (outer, max(a, 1), inner, int(node.op_type == "LogSoftmax"))

    def plan(self, inputs, outputs):
        outer, a, inner, lg = self.geo
        self.dispatch("softmax", [self.out_locs[0], self.loc(inputs[0])], pack(outer, a, inner),
                      Rows(outer * inner, _local_for(a)), consts=(lg,))


@register("LayerNormalization")
class LayerNorm(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x = data_input(inputs[0], backend)
        if any(o.name for o in outputs[1:]):
            raise Decline("mean and inverse std outputs")
        if set(node.attrs) - {"axis", "epsilon", "stash_type"} or node.attrs.get("stash_type", 1) != 1:
            raise Decline("attributes")
        shape = list(x.shape)
        axis = node.attrs.get("axis", -1) % len(shape)
        norm = tuple(shape[axis:])
        s = data_input(inputs[1], backend, "scale")
        b = inputs[2] if len(inputs) > 2 else None
        if tuple(s.shape) != norm or (b is not None and tuple(data_input(b, backend, "bias").shape) != norm):
            raise Decline("scale or bias shape is not the normalized shape")
        self.geo = (numel(shape[:axis]), numel(norm), float(node.attrs.get("epsilon", 1e-5)))

    def plan(self, inputs, outputs):
        rows, n, eps = self.geo
        s = self.loc(inputs[1])
        b = inputs[2] if len(inputs) > 2 else None
        bl = self.loc(b) if b is not None else s
        self.dispatch("layernorm", [self.out_locs[0], self.loc(inputs[0]), s, bl],
                      pack(rows, n, _f(eps), int(b is not None)), Rows(rows, _local_for(n)))


# ------------------------------------------------------------------------ data movement
@register("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Cast", "CastLike")
class Reshape(VkOp):
    """Same bytes, new shape: the output aliases the input, or is copied where it must be its own buffer."""

    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x = data_input(inputs[0], backend)
        if numel(outputs[0].shape) != numel(x.shape):
            raise Decline("element count")
        if node.op_type in ("Cast", "CastLike") and outputs[0].dtype != F32:
            raise Decline("not a float32 to float32 cast")
        if node.op_type == "Cast" and set(node.attrs) - {"to", "saturate", "round_mode"}:
            raise Decline("attributes")
        if x.is_const:
            raise Decline("constant input")
        self.alias_of = x

    def plan(self, inputs, outputs):
        src = self.loc(inputs[0])
        dst = self.out_locs[0]
        if (dst.region, dst.offset) != (src.region, src.offset):
            n = numel(outputs[0].shape)
            self.copy(dst, src, [n], [1], [1])


@register("Transpose")
class Transpose(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x = data_input(inputs[0], backend)
        r = len(x.shape)
        perm = list(node.attrs.get("perm") or range(r)[::-1])
        if sorted(perm) != list(range(r)):
            raise Decline("perm")
        ist = contiguous(tuple(x.shape))
        self.spec = ([x.shape[p] for p in perm], [ist[p] for p in perm])
        if tuple(outputs[0].shape) != tuple(self.spec[0]):
            raise Decline("output shape")
        fits(self.spec[0], self.spec[1], contiguous(tuple(self.spec[0])))

    def plan(self, inputs, outputs):
        shape, ist = self.spec
        self.copy(self.out_locs[0], self.loc(inputs[0]), shape, ist, contiguous(tuple(shape)))


@register("Expand")
class Expand(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x = data_input(inputs[0], backend)
        self.out_shape = tuple(outputs[0].shape)
        self.strides = broadcast_strides(tuple(x.shape), self.out_shape)
        fits(self.out_shape, self.strides, contiguous(self.out_shape))

    def plan(self, inputs, outputs):
        self.copy(self.out_locs[0], self.loc(inputs[0]), list(self.out_shape), self.strides,
                  contiguous(self.out_shape))


@register("Slice")
class Slice(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x = data_input(inputs[0], backend)
        shape = list(x.shape)
        r = len(shape)
        if node.opset < 10:
            starts, ends = node.attrs.get("starts"), node.attrs.get("ends")
            axes, steps = node.attrs.get("axes"), None
            if starts is None or ends is None:
                raise Decline("starts and ends")
        else:
            if node.attrs:
                raise Decline("attributes")
            vals = [const_value(t) if t is not None else None for t in inputs[1:5]]
            vals += [None] * (4 - len(vals))
            starts, ends, axes, steps = [None if v is None else [int(i) for i in v.reshape(-1)] for v in vals]
        starts, ends = list(starts), list(ends)
        axes = list(range(len(starts))) if axes is None else [int(a) for a in axes]
        steps = [1] * len(starts) if steps is None else list(steps)
        if not (len(starts) == len(ends) == len(axes) == len(steps)):
            raise Decline("lengths")
        begin = [0] * r
        step = [1] * r
        out = list(shape)
        seen = set()
        for s, e, a, st in zip(starts, ends, axes, steps):
            a = a + r if a < 0 else a
            if not 0 <= a < r or a in seen or st == 0:
                raise Decline("axes or steps")
            seen.add(a)
            lo, hi, stp = slice(s, e, st).indices(shape[a])
            begin[a], step[a], out[a] = lo, stp, len(range(lo, hi, stp))
        if tuple(out) != tuple(outputs[0].shape):
            raise Decline("output shape")
        ist = contiguous(tuple(shape))
        self.spec = (out, [st * s for st, s in zip(step, ist)], sum(b * s for b, s in zip(begin, ist)))
        fits(out, self.spec[1], contiguous(tuple(out)))

    def plan(self, inputs, outputs):
        out, ist, base = self.spec
        self.copy(self.out_locs[0], self.loc(inputs[0]), out, ist, contiguous(tuple(out)), src_base=base)


@register("Concat")
class Concat(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        oshape = tuple(outputs[0].shape)
        r = len(oshape)
        axis = node.attrs.get("axis")
        if axis is None or not r:
            raise Decline("axis")
        axis %= r
        off = 0
        self.pieces = []
        for i, t in enumerate(inputs):
            if t is None or t.shape is None or len(t.shape) != r:
                raise Decline("input shapes")
            if numel(t.shape) == 0:
                if not is_f32(t):
                    raise Decline("dtype")
                continue
            data_input(t, backend)
            self.pieces.append((i, off, tuple(t.shape)))
            off += t.shape[axis]
        if off != oshape[axis]:
            raise Decline("sizes")
        for _, _, shape in self.pieces:
            fits(shape, contiguous(shape), contiguous(oshape))
        self.axis = axis

    def plan(self, inputs, outputs):
        oshape = tuple(outputs[0].shape)
        ost = contiguous(oshape)
        out = self.out_locs[0]
        for i, off, shape in self.pieces:
            src = self.loc(inputs[i])
            if not in_place(self.b, out, src, oshape, self.axis, off * ost[self.axis]):
                self.copy(out, src, list(shape), contiguous(shape), ost, dst_base=off * ost[self.axis])


@register("Split")
class Split(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x = data_input(inputs[0], backend)
        shape = tuple(x.shape)
        axis = node.attrs.get("axis", 0) % len(shape)
        off = 0
        self.pieces = []
        for j, o in enumerate(outputs):
            if o.shape is None or len(o.shape) != len(shape):
                raise Decline("output shapes")
            if any(o.shape[d] != shape[d] for d in range(len(shape)) if d != axis):
                raise Decline("output shapes")
            if o.name and numel(o.shape) > 0:
                self.pieces.append((j, off, tuple(o.shape)))
            elif o.name:
                raise Decline("empty output")
            off += o.shape[axis]
        if off != shape[axis]:
            raise Decline("sizes")
        for _, _, piece in self.pieces:
            fits(piece, contiguous(shape), contiguous(piece))
        self.axis = axis

    def plan(self, inputs, outputs):
        shape = tuple(inputs[0].shape)
        ist = contiguous(shape)
        src = self.loc(inputs[0])
        for j, off, piece in self.pieces:
            if not in_place(self.b, src, self.out_locs[j], shape, self.axis, off * ist[self.axis]):
                self.copy(self.out_locs[j], src, list(piece), ist, contiguous(piece), src_base=off * ist[self.axis])


def in_place(backend, whole: Loc, piece: Loc, shape: tuple[int, ...], axis: int, base: int) -> bool:
    """Whether a Concat or Split piece already lies where it belongs in the whole, `base` elements in (the
    backend placed them in one block): one contiguous range, nothing to copy."""
    return (numel(shape[:axis]) == 1 and whole.region == piece.region == "arena"
            and piece.offset == whole.offset + base * backend.store.itemsize)


# ---------------------------------------------------------------------------- resize
@register("Resize", "Upsample")
class Resize(VkOp):
    """Resampling of the last two axes, with the CPU backend's tap plans (so both round alike)."""

    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        from aiomnn.backends.cpu.kernel import OPS as CPU_OPS
        from aiomnn.backends.cpu.kernel import create as cpu_create
        from aiomnn.backends.cpu.ops import resize as cpu_resize

        x = data_input(inputs[0], backend)
        shape = tuple(x.shape)
        if len(shape) < 2:
            raise Decline("rank")
        impl = CPU_OPS.lookup(node)
        if impl is None:
            raise Decline("no CPU plan")
        kern = cpu_create(impl, node, inputs, outputs)
        if isinstance(kern, cpu_resize._Asymmetric):
            s = kern.scales if kern.scales is not None else const_value(inputs[1])
            if s is None:
                raise Decline("scales")
            plan = kern._make_plan(shape, np.asarray(s, np.float64).reshape(-1), None, None)
        else:
            roi, scales, sizes = [const_value(inputs[i]) if len(inputs) > i and inputs[i] is not None else None
                                  for i in (1, 2, 3)]
            sizes = cpu_resize._flat(sizes)
            scales = None if sizes is not None else cpu_resize._flat(scales)
            roi = cpu_resize._flat(roi)
            plan = kern._make_plan(shape, None if scales is None else scales.astype(np.float64),
                                   None if sizes is None else sizes.astype(np.int64),
                                   None if roi is None else roi.astype(np.float64))
        if tuple(plan["out_shape"]) != tuple(outputs[0].shape):
            raise Decline("output shape")
        r = len(shape)
        axes = {p.axis: p for p in plan["axes"]}
        if any(a < r - 2 for a in axes):
            raise Decline("resizes a leading axis")
        tables = []
        has_ex = False
        for a in (r - 2, r - 1):
            p = axes.get(a)
            if p is None:
                o = shape[a]
                tables.append((np.arange(o, dtype=np.int32).reshape(o, 1), np.ones((o, 1), np.float32),
                               np.zeros(o, np.int32)))
            else:
                ex = np.zeros(p.O, np.int32) if p.extrap is None else p.extrap.astype(np.int32)
                has_ex |= p.extrap is not None
                tables.append((p.idx.astype(np.int32), p.w.astype(np.float32), ex))
        self.tables = tables
        self.has_ex = has_ex
        self.ex_value = float(getattr(kern, "extrapolation_value", 0.0))
        self.geo = (numel(shape[:-2]), shape[-2], shape[-1], outputs[0].shape[-2], outputs[0].shape[-1])

    def plan(self, inputs, outputs):
        nc, h, w, oh, ow = self.geo
        parts, offs = [], []
        n = 0
        for idx, wt, ex in self.tables:
            for arr in (idx.reshape(-1), wt.reshape(-1).view(np.int32), ex):
                offs.append(n)
                parts.append(arr.astype(np.int32, copy=False))
                n += arr.size
        table = self.b.aux(np.concatenate(parts))
        th, tw = self.tables[0][0].shape[1], self.tables[1][0].shape[1]
        push = pack(nc, h, w, oh, ow, th, tw, *offs, int(self.has_ex), _f(self.ex_value))
        self.dispatch("resize", [self.out_locs[0], self.loc(inputs[0]), table], push, Grid(nc * oh * ow))
