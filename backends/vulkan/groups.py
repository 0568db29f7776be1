"""What the Vulkan backend's fusions share: a Group of ops that one set of dispatches does, and the created
steps indexed by who makes and who reads each value (fusion.py and epilogues.py find the groups)."""

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


class Steps:
    """The created list, indexed: who makes and who reads each value."""

    def __init__(self, steps: list[tuple]):
        self.steps = steps
        self.readers: dict[str, list[int]] = {}
        self.producer = {t.name: i for i, (_, _, _, outs) in enumerate(steps) for t in outs if t is not None and t.name}
        for i, (node, _, _, _) in enumerate(steps):
            for x in dict.fromkeys(list(node.inputs) + list(node.implicit)):
                if x:
                    self.readers.setdefault(x, []).append(i)

    def only(self, name: str, op_type: str, taken: set[int]) -> int | None:
        """The one step reading `name`, if it is an op of this type on this backend not already in a group."""
        rs = self.readers.get(name, [])
        if len(rs) != 1:
            return None
        i = rs[0]
        node, exe = self.steps[i][:2]
        if exe is None or node.op_type != op_type or i in taken or node.attrs.get("_activation") is not None:
            return None
        return i
