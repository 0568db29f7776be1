"""What the OpenCL backend's fusions share: a Group of ops that one set of kernels does, and the host-side checks of
tensors that the matchers use (fusion.py, epilogues.py and blocks.py find the groups among the offered ops,
aiomnn/offered.py)."""

from __future__ import annotations

import logging
from typing import Callable

import numpy as np

from aiomnn.backend import Tensor
from aiomnn.strides import contiguous

from .ops.base import In, Launch

log = logging.getLogger("aiomnn.opencl")


class Group:
    """Ops whose work one set of kernels does, launched at the group's last member.

    `inner` are the values computed only for other members (each read by members alone); `build(plan)` makes the
    group's launches and the tensors their In(i) arguments index. The values the group reads live until its last
    member runs (plan.extend), so its kernels can run there. If an inner value turns out to need memory of its
    own (a graph output, say), or the build declines, every member keeps its own launches.
    """

    def __init__(self, kind: str, members: list, inner: list[str], reads: list[str],
                 build: Callable[..., tuple[list[Launch], list[Tensor | None]]]):
        self.kind, self.members, self.inner, self.reads, self.build = kind, members, inner, reads, build

    def apply(self, plan, final) -> None:
        if not all(plan.in_arena(name) for name in self.inner):
            return
        try:
            launches, inputs = self.build(plan)
        except Exception as exc:  # a shape or device limit the matching did not foresee: the ops run alone
            log.debug("%s group at %s not fused: %s: %s", self.kind, final.node, type(exc).__name__, exc)
            return
        for m in self.members:
            m.launches = []
        final.launches, final.inputs = launches, list(inputs)
        plan.fused.append(self.kind)
        plan.fused_away.update(self.inner)


def view_strides(out: tuple[int, ...], shape: tuple[int, ...], spans: list[tuple[int, int]]) -> list[int] | None:
    """The strides of a tensor of `shape`, broadcast to `out`, over a view of `out` whose dims each join a span of
    its dims (lo, hi); None where it broadcasts along part of a span only (or does not broadcast to `out`)."""
    rank = len(out)
    if len(shape) > rank:
        return None
    full = (1,) * (rank - len(shape)) + tuple(shape)
    if any(a not in (1, o) for a, o in zip(full, out)):
        return None
    st = [0 if full[d] == 1 else s for d, s in enumerate(contiguous(full))]
    found = []
    for lo, hi in spans:
        live = [d for d in range(lo, hi) if out[d] != 1]
        inner = st[live[-1]] if live else 0
        expect = inner
        for d in reversed(live):
            if st[d] != expect:
                return None
            expect = st[d] * out[d]
        found.append(inner)
    return found


def operand(index: int, strides3: list[int]) -> list:
    """A fused epilogue step's kernel arguments for the tensor In(index) (kernels/common.cl's EPI_STEP_ARGS, less
    the activation's parameters)."""
    return [In(index), *(np.int32(s) for s in strides3)]
