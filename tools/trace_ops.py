"""Per op type, the median over runs of its summed time in a run, from a trace that `aiomnn run --profile` wrote.

    python tools/trace_ops.py TRACE.json [--skip 10] [--top 20]

The first runs (--skip) are left out: they hold compiling and tuning.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--skip", type=int, default=10)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    with open(args.trace) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    per: dict[str, dict[int, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "op":
            per[e["args"]["op_type"]][e["args"]["run"]] += e["dur"]
    runs = sorted({r for d in per.values() for r in d})[args.skip:]
    rows = sorted(((statistics.median(d.get(r, 0.0) for r in runs), k) for k, d in per.items()), reverse=True)
    for us, kind in rows[:args.top]:
        print(f"{kind:24s} {us:10.1f} us a run")
    print(f"{'all':24s} {sum(us for us, _ in rows):10.1f} us a run, median of {len(runs)} runs")


if __name__ == "__main__":
    main()
