"""Moving data: Reshape and friends (aliases), Transpose, Slice, Concat, Split, Gather, Cast."""

from __future__ import annotations

import cupy
import numpy as np

from aiomnn.graph import dtype_of
from aiomnn.moves import slice_span
from aiomnn.strides import collapse, contiguous

from ..kernels import CTYPES, MAX_COPY_RANK, cast_source
from ..program import launcher
from .base import F32, CudaOp, Decline, check_tensors, op
from .elementwise import Copy



def copy_launch(exe: CudaOp, src, dst, dims, sstr, dstr, sbase: int = 0, dbase: int = 0):
    """A launch of the strided copy kernel: dst[dbase + c.dstr] = src[sbase + c.sstr] over dims (None: nothing
    to copy). Rows of contiguous elements take the pieces' kernel (copies_launches)."""
    launches = copies_launches(exe, [(src, dst, dims, sstr, dstr, sbase, dbase)])
    return launches[0] if launches else None


def copies_launches(exe: CudaOp, copies: list[tuple]) -> list:
    """The launches for copies (src, dst, dims, sstr, dstr, sbase, dbase), each as copy_launch's: those that are
    rows of contiguous elements a stride apart (a Concat's or Split's pieces, of a batch too), all in one launch
    of kernels.COPY's copy_pieces; the rest one launch each of the general copy, which divides for every index
    of every element. At batch 8 the general copy took 6-7 us a piece of YOLOv8n's Concats and Splits on the
    H200 (benchmarks/RESULTS.md, session 32)."""
    rows, launches = [], []
    for src, dst, dims, sstr, dstr, sbase, dbase in copies:
        total = int(np.prod(dims, dtype=np.int64)) if dims else 1
        if total == 0:
            continue
        dims2, (ss, ds) = collapse(list(dims) or [1], list(sstr) or [0], list(dstr) or [0])
        e = src.dtype.itemsize
        if ss == ds == [1] and src.data.ptr + sbase * e == dst.data.ptr + dbase * e:
            continue  # already in place: the backend planned the piece into the whole (Concat, Split)
        if len(dims2) <= 2 and ss[-1] == ds[-1] == 1:
            count, n = (1, dims2[0]) if len(dims2) == 1 else dims2
            steps = (ss[0], ds[0]) if len(dims2) == 2 else (0, 0)
            rows.append((src.data.ptr + sbase * e, dst.data.ptr + dbase * e, count, n, *steps))
            continue
        if len(dims2) > MAX_COPY_RANK:
            raise Decline("copy of rank over 8")
        pad = [0] * (MAX_COPY_RANK - len(dims2))
        meta = [len(dims2)] + dims2 + pad + ss + pad + ds + pad + [int(sbase), int(dbase)]
        kern = exe.be.rt.programs.static_kernel(f"copy{e}", False)
        m = cupy.asarray(np.asarray(meta, dtype=np.int32))  # the meta table, kept with the op
        exe.keep.append(m)
        launches.append(launcher(kern, total, (src, dst, m, np.uint32(total))))
    if rows:  # one op's copies: one dtype
        launches.append(_pieces_launch(exe, rows, copies[0][0].dtype.itemsize))
    return launches


def _pieces_launch(exe: CudaOp, rows: list[tuple], e: int):
    """One launch of copy_pieces for these pieces (source and destination addresses in bytes; rows, their length
    n and their two strides in elements of e bytes): in 16-byte vectors where every row of every piece starts on
    a 16-byte boundary in both, else by elements."""
    vector = all(v % 16 == 0 for a, b, _, n, ss, ds in rows for v in (a, b, n * e, ss * e, ds * e))
    lanes = 16 // e if vector else 1
    table = np.asarray([(a, b, count, n // lanes, ss // lanes, ds // lanes) for a, b, count, n, ss, ds in rows],
                       np.int64)
    t = cupy.asarray(table)
    exe.keep.append(t)
    kern = exe.be.rt.programs.static_kernel(f"copy_pieces{16 if vector else e}", False)
    block = 256
    grid = (max(1, min(-(-int(table[:, 3].max()) // block), 1 << 16)), max(1, min(int(table[:, 2].max()), 65535)),
            len(rows))

    def go() -> None:
        kern(grid, (block,), (t,))

    return go


class Alias(CudaOp):
    """Output 0 is input 0 with another shape; shares its block when the planner allows."""

    alias = True

    def __init__(self, be, node, ins, outs):
        super().__init__(be, node, ins, outs)
        check_tensors(ins[:1], outs[:1])
        if len([o for o in outs if o.name]) != 1 or not outs[0].name:
            raise Decline("extra outputs (a Dropout mask)")
        if ins[0].dtype != outs[0].dtype:
            raise Decline("dtype changes")

    def bind(self, plan):
        src, dst = plan.view(self.in_names[0]), plan.view(self.out_names[0])
        if src.data.ptr != dst.data.ptr and dst.nbytes:
            stream, n = self.be.stream, int(dst.nbytes)
            s, d = src.data.ptr, dst.data.ptr

            def go():
                cupy.cuda.runtime.memcpyAsync(d, s, n, 3, stream.ptr)

            self.launches = [go]


for _t in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"):
    op(_t)(Alias)


@op("Transpose")
class Transpose(CudaOp):
    def __init__(self, be, node, ins, outs):
        super().__init__(be, node, ins, outs)
        check_tensors(ins, outs)
        s = self.in_shape(0)
        self.perm = list(self.attrs.get("perm", list(range(len(s)))[::-1]))

    def bind(self, plan):
        s = self.in_shape(0)
        st = contiguous(s)
        dims = [s[p] for p in self.perm]
        fn = copy_launch(self, plan.view(self.in_names[0]), plan.view(self.out_names[0]), dims,
                         [st[p] for p in self.perm], contiguous(dims))
        self.launches = [fn] if fn else []


@op("Slice")
class Slice(CudaOp):
    def __init__(self, be, node, ins, outs):
        super().__init__(be, node, ins, outs)
        check_tensors(ins[:1], outs)
        s = self.in_shape(0)
        if node.opset >= 10:
            vals = [self.const(i) if i < len(ins) and ins[i] is not None else None for i in range(1, 5)]
            if any(v is None and i < len(ins) and ins[i] is not None for i, v in zip(range(1, 5), vals)):
                raise Decline("Slice parameters must be constants")
            starts, ends, axes, steps = (None if v is None else [int(x) for x in v.reshape(-1)] for v in vals)
        else:
            a = self.attrs
            starts, ends, axes, steps = a["starts"], a["ends"], a.get("axes"), None
        axes = [a % len(s) for a in axes] if axes is not None else list(range(len(starts)))
        steps = steps if steps is not None else [1] * len(starts)
        st = contiguous(s)
        self.sbase = 0
        self.sstr = list(st)
        self.dims = list(s)
        for b, e, ax, sp in zip(starts, ends, axes, steps):
            r = slice_span(b, e, sp, s[ax])  # ONNX's clamping, not Python's
            self.dims[ax] = len(r)
            if len(r):
                self.sbase += r.start * st[ax]
            self.sstr[ax] = st[ax] * sp

    def bind(self, plan):
        fn = copy_launch(self, plan.view(self.in_names[0]), plan.view(self.out_names[0]), self.dims,
                         self.sstr, contiguous(self.dims), self.sbase)
        self.launches = [fn] if fn else []


@op("Concat")
class Concat(CudaOp):
    def __init__(self, be, node, ins, outs):
        super().__init__(be, node, ins, outs)
        check_tensors(ins, outs)
        self.axis = self.attrs["axis"] % len(self.out_shape)

    def bind(self, plan):
        out = plan.view(self.out_names[0])
        ost = contiguous(self.out_shape)
        off, copies = 0, []
        for t in self.ins:
            if t is None:
                continue
            s = tuple(t.shape)
            copies.append((plan.view(t.name), out, list(s), contiguous(s), ost, 0, off * ost[self.axis]))
            off += s[self.axis]
        self.launches = copies_launches(self, copies)


@op("Split")
class Split(CudaOp):
    def __init__(self, be, node, ins, outs):
        super().__init__(be, node, ins, outs)
        check_tensors(ins[:1], [o for o in outs if o.name])
        self.axis = self.attrs.get("axis", 0) % len(self.in_shape(0))

    def bind(self, plan):
        s = self.in_shape(0)
        st = contiguous(s)
        src = plan.view(self.in_names[0])
        off, copies = 0, []
        for t in self.outs:
            if t.shape is None:
                raise Decline("unknown split")
            if t.name:
                copies.append((src, plan.view(t.name), list(t.shape), st, contiguous(t.shape), off * st[self.axis], 0))
            off += t.shape[self.axis]
        self.launches = copies_launches(self, copies)


@op("Gather")
class Gather(CudaOp):
    def __init__(self, be, node, ins, outs):
        super().__init__(be, node, ins, outs)
        check_tensors(ins, outs)
        if ins[1].dtype not in (np.dtype(np.int64), np.dtype(np.int32)):
            raise Decline("indices must be int32 or int64")
        if ins[1].dtype == np.dtype(np.int32) and not ins[1].is_const:
            raise Decline("runtime int32 indices")
        s = self.in_shape(0)
        self.axis = self.attrs.get("axis", 0) % len(s)
        if be.dev_dtype(ins[0].dtype).itemsize not in (1, 2, 4, 8):
            raise Decline("element size")

    def bind(self, plan):
        s = self.in_shape(0)
        outer = int(np.prod(s[: self.axis], dtype=np.int64))
        inner = int(np.prod(s[self.axis + 1:], dtype=np.int64))
        nidx = int(np.prod(self.ins[1].shape, dtype=np.int64))
        if self.ins[1].is_const:
            idx = cupy.asarray(np.asarray(self.ins[1].const, dtype=np.int64).reshape(-1))
            self.keep.append(idx)
        else:
            idx = plan.view(self.in_names[1])
        src, dst = plan.view(self.in_names[0]), plan.view(self.out_names[0])
        total = outer * nidx * inner
        if not total:
            return
        kern = self.be.rt.programs.static_kernel(f"copy{src.dtype.itemsize}_gather", False)
        self.launches = [launcher(kern, total, (src, idx, dst, np.uint32(outer), np.uint32(s[self.axis]),
                                                np.uint32(nidx), np.uint32(inner)))]


class CastOp(CudaOp):
    def __init__(self, be, node, ins, outs):
        super().__init__(be, node, ins, outs)
        check_tensors(ins, outs)
        for t in (ins[0], outs[0]):
            if be.dev_dtype(t.dtype).name not in CTYPES:
                raise Decline(f"cast of {t.dtype}")

    def bind(self, plan):
        src, dst = plan.view(self.in_names[0]), plan.view(self.out_names[0])
        n = int(src.size)
        if not n:
            return
        kern = self.be.rt.programs.kernel(cast_source(src.dtype.name, dst.dtype.name), False, "cast")
        self.launches = [launcher(kern, n, (src, dst, np.uint32(n)))]


@op("Cast")
def make_cast(be, node, ins, outs):
    to = dtype_of(node.attrs["to"], str(node))
    if ins[0] is not None and ins[0].dtype == F32 and to == F32:
        return Copy(be, node, ins, outs)
    return CastOp(be, node, ins, outs)
