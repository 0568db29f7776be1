"""Fused elementwise kernels, generated as CUDA C source.

Fused kernels ("groups") are generated from an expression tree whose leaves
load tensors by strides, read scalars from the meta table, or compute a value
inline (a depthwise conv, a pool window, a resize sample, a col2im sum).
Shapes, strides and scalars are written into the source as constants, so each
layer compiles to its own kernel, with divisions by constant dims and loops of
known length. They used to be read from an int32 table in device memory, one
kernel per form of tree: constants make the runs faster, for more compiling on
a cold cache (cupy keeps the kernels on disk).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from aiomnn import binary, strides, unary
from aiomnn.errors import BackendError
from aiomnn.expressions import FUNCTIONS, Dialect, render

from .kernels import constants


def flit(v: float) -> str:
    """A float literal for C source."""
    v = float(v)
    if v != v:
        return "__int_as_float(0x7fc00000)"
    if v in (float("inf"), float("-inf")):
        return "__int_as_float(0x7f800000)" if v > 0 else "__int_as_float(0xff800000)"
    return repr(v) + "f" if "e" in repr(v) or "." in repr(v) else repr(v) + ".f"


def float_bits(v: float) -> int:
    return struct.unpack("<i", struct.pack("<f", float(v)))[0]


#: CUDA C as a dialect of the unary table's expressions (aiomnn/expressions.py): x is the template's {0}, the
#: parameters its {a} and {b}; sigmoid_ and softplus_ are the prelude's (kernels.py).
CUDA = Dialect({**{f: f + "f" for f in FUNCTIONS - {"abs", "round", "min", "max", "sigmoid", "softplus", "div",
                                                    "isnan"}},
                "abs": "fabsf", "round": "rintf", "min": "fminf", "max": "fmaxf", "sigmoid": "sigmoid_",
                "softplus": "softplus_", "div": "div_"}, "f", {"x": "{0}", "y": "{1}", "a": "{a}", "b": "{b}"})
#: Expression templates: {0}, {1}... are argument names; {a}, {b} attributes. The unary and binary ops' come from
#: their tables.
EXPR = {
    "Square": "({0} * {0})", "Affine": "({0} * {1} + {2})",
    **{name: render(row.expr, CUDA) for name, row in unary.TABLE.items()},
    **{name: render(row.expr, CUDA) for name, row in binary.TABLE.items()},
}


class Term:
    """A term of a fused expression: an op of EXPR over argument terms, or a leaf (not a graph.Node)."""

    __slots__ = ()


@dataclass(eq=False)
class Expr(Term):
    op: str
    args: tuple
    attrs: tuple = ()  # (name, value) pairs, formatted as literals

    def sig(self) -> str:
        return self.op + (repr(self.attrs) if self.attrs else "")


@dataclass(eq=False)
class Val(Term):
    """A tensor value read by broadcasting its (possibly re-viewed) shape to the group's shape."""

    name: str
    shape: tuple  # the view's shape (a reshape of the value, e.g. a bias as (1, C, 1, 1))

    def key(self):
        return ("val", self.name, self.shape)


@dataclass(eq=False)
class Lit(Term):
    """A scalar; its bits travel in the meta table, so the source does not depend on it."""

    value: float

    def key(self):
        return ("lit", float_bits(self.value))


@dataclass(eq=False)
class Raw(Term):
    """The raw result an op wrote into its own output buffer, read with the op's strides."""

    op: Any  # the producing op

    def key(self):
        return ("raw", id(self.op))


@dataclass(eq=False)
class Inline(Term):
    """A value computed in the kernel from the output coordinates (n, c, y, x)."""

    op: Any

    def key(self):
        return ("inline", id(self.op))


def substitute(node: Term, name: str, repl: Term, memo: dict | None = None) -> Term:
    """The tree with every Val of `name` replaced by `repl` (shared, so it is computed once)."""
    memo = {} if memo is None else memo
    if id(node) in memo:
        return memo[id(node)]
    if isinstance(node, Val) and node.name == name:
        out = repl
    elif isinstance(node, Expr):
        args = tuple(substitute(a, name, repl, memo) for a in node.args)
        out = node if all(a is b for a, b in zip(args, node.args)) else Expr(node.op, args, node.attrs)
    else:
        out = node
    memo[id(node)] = out
    return out


def leaves(node: Term, out: dict | None = None) -> dict:
    """Unique leaves by key, in first-visit order."""
    out = {} if out is None else out
    if isinstance(node, Expr):
        for a in node.args:
            leaves(a, out)
    elif node.key() not in out:
        out[node.key()] = node
    return out


def vals(node: Term) -> list[str]:
    return list(dict.fromkeys(l.name for l in leaves(node).values() if isinstance(l, Val)))


@dataclass
class LeafPlan:
    """How one leaf is read in a generated kernel."""

    leaf: Term
    mode: str  # "c" contiguous like the output, "0" a single element, "s" strided, "lit", "inline"
    ptrs: list = field(default_factory=list)  # device arrays passed as kernel arguments
    strides: list = field(default_factory=list)  # for "s"
    meta: list = field(default_factory=list)  # for "lit" and "inline"
    at: int = 0  # where an inline leaf's meta starts in the table


def leaf_strides(shape: tuple[int, ...], out: list[int]) -> list[int]:
    """The strides a leaf of a dense `shape` is read through over an output of `out` (aiomnn/strides.
    broadcast_strides, leading axes of one element dropped), 0 also on the output's axes of one element: their
    coordinate is always 0, so a kernel's index folds them away."""
    extra = len(shape) - len(out)
    st = strides.broadcast_strides(shape[extra:] if extra > 0 and all(d == 1 for d in shape[:extra]) else shape,
                                   out)
    if st is None:
        raise BackendError(f"cuda: shape {tuple(shape)} does not broadcast to {out}")
    return [0 if o == 1 else x for x, o in zip(st, out)]


def index_space(plans: list[LeafPlan], shape: list[int], inline: bool) -> list[int]:
    """The dims a group's kernel walks over an output of `shape`: the fewest (aiomnn/strides.collapse), or the 4-D
    output's own where an inline leaf reads its coordinates. Each strided leaf's strides are set over them, and its
    mode to "c" where it reads as the output is laid out, "0" where it reads one value."""
    strided = [p for p in plans if p.mode == "s"]
    dims = list(shape) if shape else [1]
    if inline:
        sts = [p.strides for p in strided]
    else:
        dims, sts = strides.collapse(dims, *[p.strides for p in strided])
    cont = leaf_strides(dims, dims)
    for p, st in zip(strided, sts):
        p.strides = st
        if all(a == b for a, b, d in zip(st, cont, dims) if d != 1):
            p.mode = "c"
        elif all(a == 0 for a in st):
            p.mode = "0"
    return dims


def lanes(dims: list[int]) -> int:
    """How many consecutive elements of the last axis one thread of a plain fused kernel computes: 4 or 2 where the
    axis divides so. With fp16 storage one element a thread kept too few bytes in flight to fill the memory's
    bandwidth (a 2-byte load a leaf); more loads a thread, and the coordinates decoded once for them, do."""
    return 1 if not dims[-1] else 4 if dims[-1] % 4 == 0 else 2 if dims[-1] % 2 == 0 else 1


def generate(root: Term, plans: list[LeafPlan], dims: list[int]) -> str:
    """The kernel source for a group with these leaf plans, over an output of these (collapsed) dims.

    The generator first writes references to a meta table: the dims, then each strided leaf's strides,
    then each literal's bits and each inline leaf's parameters; `constants` then writes the values in.
    A plain kernel's thread computes `lanes(dims)` elements, the body written out for each in a scope of its own
    (its own `i` and last coordinate); a tiled leaf's kernel (a conv's) runs the body as its epilogue.
    """
    params, body = [], []
    rank = len(dims)
    dims_at = 0
    meta = list(dims)
    names: dict[Any, str] = {}
    for k, p in enumerate(plans):
        v = f"l{k}"
        names[p.leaf.key()] = v
        if p.mode == "lit":
            body.append(f"    const float {v} = __int_as_float(m[{len(meta)}]);")
            meta.extend(p.meta)
        elif p.mode == "inline":
            ptr_names = [f"q{k}_{j}" for j in range(len(p.ptrs))]
            types = p.leaf.op.inline_types() or ["const T* __restrict__"] * len(p.ptrs)
            for pn, ty in zip(ptr_names, types):
                params.append(f"{ty} {pn}")
            p.at = len(meta)
            body.append(p.leaf.op.inline_code(v, ptr_names, p.at))
            meta.extend(p.meta)
        else:
            params.append(f"const T* __restrict__ p{k}")
            if p.mode == "c":
                body.append(f"    const float {v} = LD(p{k}[i]);")
            elif p.mode == "0":
                body.append(f"    const float {v} = LD(p{k}[0]);")
            else:
                terms = " + ".join(f"c{d} * (unsigned)m[{len(meta) + d}]" for d in range(rank))
                body.append(f"    const float {v} = LD(p{k}[{terms}]);")
                meta.extend(p.strides)
    # Expressions, each computed once.
    count = [0]

    def emit(node: Term) -> str:
        if not isinstance(node, Expr):
            return names[node.key()]
        if id(node) in names:
            return names[id(node)]
        args = [emit(a) for a in node.args]
        attrs = {k: flit(v) for k, v in node.attrs}
        expr = EXPR[node.op].format(*args, **attrs)
        t = f"t{count[0]}"
        count[0] += 1
        body.append(f"    const float {t} = {expr};")
        names[id(node)] = t
        return t

    result = emit(root)
    body.append(f"    out[i] = ST({result});")
    sig = ", ".join(["T* __restrict__ out", "unsigned total"] + params)
    tiled = [p for p in plans if p.mode == "inline" and p.leaf.op.tiled]
    last = rank - 1

    def decode(index: str, axes: int) -> list[str]:
        """Coordinates c0 .. c{axes} of `index` over the first axes + 1 dims."""
        lines = [f"    unsigned rem = {index};"]
        for d in range(axes, 0, -1):
            lines.append(f"    const unsigned c{d} = rem % (unsigned)m[{dims_at + d}]; rem /= (unsigned)m[{dims_at + d}];")
        return lines + ["    const unsigned c0 = rem;"]

    if not tiled:
        v = lanes(dims)
        row = f"(unsigned)m[{dims_at + last}]" if v == 1 else f"{dims[last] // v}u"  # threads a row of the last axis
        coords = decode(f"j / {row}", last - 1) if last else []
        coords.append(f"    const unsigned cl = j % {row} * {v};")
        each = "\n".join(body)
        copies = [f"    {{\n    const unsigned i = j * {v} + {u}, c{last} = cl + {u};\n{each}\n    }}" for u in range(v)]
        src = (f'extern "C" __global__ void fused({sig}) {{\n'
               f"  GRID_LOOP(j, total / {v}) {{\n" + "\n".join(coords + copies) + "\n  }\n}\n")
        return constants(src, meta)
    coords = decode("i", last)  # the epilogue's, from its output element
    # A tiled leaf owns the kernel; the group's expression becomes its per-output epilogue, with
    # the leaf's value in `acc`.
    (t,) = tiled
    k = plans.index(t)
    call = ", ".join(["out", "(i)", "(acc)"] + [a.rsplit(" ", 1)[1] for a in params])
    epi_sig = ", ".join(["T* __restrict__ out", "unsigned i", "float acc"] + params)
    src = (f"__device__ __forceinline__ void epilogue({epi_sig}) {{\n" + "\n".join(coords + body) + "\n}\n"
           f"#define EPILOGUE(i, acc) epilogue({call})\n"
           f'extern "C" __global__ void {t.leaf.op.launch_bounds()} fused({sig}) {{\n'
           + t.leaf.op.tiled_code([f"q{k}_{j}" for j in range(len(t.ptrs))], t.at, "EPILOGUE") + "}\n")
    return constants(src, meta)
