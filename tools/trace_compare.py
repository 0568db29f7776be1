"""Two profiles of one model, step by step: each step's median time a run in trace A and in trace B (both written
by `aiomnn run --profile`, e.g. OpenCL and CUDA), the steps where B gains the most first.

    python tools/trace_compare.py A.json B.json [--skip 10] [--top 25]

A step is named as the profile names it (a fused group by its root); steps in only one trace are listed apart.
CUDA's profile launches step by step from Python, so its small steps read long (launch gaps): read the large ones.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics


def steps(path: str, skip: int) -> dict[str, tuple[str, float]]:
    """Per step name: its op type and median time a run (us), the first `skip` runs left out."""
    with open(path) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    per: dict[str, dict[int, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    kinds: dict[str, str] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "op":
            per[e["name"]][e["args"]["run"]] += e["dur"]
            kinds[e["name"]] = e["args"]["op_type"]
    runs = sorted({r for d in per.values() for r in d})[skip:]
    return {name: (kinds[name], statistics.median(d.get(r, 0.0) for r in runs)) for name, d in per.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--skip", type=int, default=10)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    a, b = steps(args.a, args.skip), steps(args.b, args.skip)
    both = sorted(set(a) & set(b), key=lambda n: b[n][1] - a[n][1])
    print(f"{'step':40s} {'op':16s} {'A us':>9s} {'B us':>9s} {'A/B':>6s}")
    for name in both[:args.top]:
        (kind, ta), (_, tb) = a[name], b[name]
        print(f"{name[-40:]:40s} {kind[:16]:16s} {ta:9.1f} {tb:9.1f} {ta / max(tb, 1e-9):6.2f}")
    by_kind: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for name in both:
        by_kind[a[name][0]][0] += a[name][1]
        by_kind[a[name][0]][1] += b[name][1]
    for kind, (ta, tb) in sorted(by_kind.items(), key=lambda kv: kv[1][1] - kv[1][0]):
        print(f"{'  all ' + kind:57s} {ta:9.1f} {tb:9.1f} {ta / max(tb, 1e-9):6.2f}")
    print(f"{'all shared steps':57s} {sum(a[n][1] for n in both):9.1f} {sum(b[n][1] for n in both):9.1f}")
    for label, only in (("only in A", set(a) - set(b)), ("only in B", set(b) - set(a))):
        if only:
            print(f"{label}: " + ", ".join(f"{n} ({a.get(n, b.get(n))[1]:.1f})" for n in sorted(only)))


if __name__ == "__main__":
    main()
