"""What the Vulkan backend's fusions share: a Group of ops that one set of dispatches does (fusion.py, epilogues.py
and the others find the groups among the offered ops, aiomnn/offered.py)."""

from __future__ import annotations

from .ops.base import VkOp


class Group:
    """Ops whose work one set of dispatches does, recorded at the group's last member.

    `inner` are the values computed only for other members (each read by members alone); `build(final)`
    plans the fused dispatches on the last member. The inputs the group reads (`reads`) live until that
    member runs (the backend defers their release), so the fused dispatches can run there. If an inner
    value turns out to need memory of its own (a graph output, say), the members keep their own dispatches.
    """

    def __init__(self, kind: str, members: list[VkOp], inner: list[str], reads: list[str], build):
        self.kind, self.members, self.inner, self.reads, self.build = kind, members, inner, reads, build

    def apply(self, final: VkOp) -> None:
        plan = final.plan
        locs = [plan.locs.get(name) for name in self.inner]
        if any(loc is None or loc.region != "arena" for loc in locs):
            return
        if any(m.out_names != [m.node.outputs[0]] for m in self.members):
            return
        alone = {(launch.kernel, launch.work): launch.key for m in self.members for launch in m.launches}
        for m in self.members:
            m.tuned_as = alone
            m.dispatches, m.launches = [], []
        self.build(final)
        plan.fused_away.update(self.inner)
        plan.fused.append(self.kind)
