"""benchmarks/gpu.py with every conv candidate's tuning time kept: after its tables, one per model and precision
of the time of each candidate the tuner timed for each conv (us, best of the tuner's samples), the pick marked,
and the sum of the picks against the sum of the best picks without the algorithms named in --without (for the
gain of a new family of kernels, from one tuning pass).

    python3 tools/conv_candidates.py --without mma -- --models yolov8n --batches 8 --backends cuda \
        --precisions fp16 --n 20 --no-torch --skip-extra
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

import gpu  # noqa: E402  (benchmarks/gpu.py)

from aiomnn import tuning  # noqa: E402

#: (model, precision) -> conv key -> {algorithm: seconds}
TIMES: dict[tuple[str, str], dict[str, dict[str, float]]] = collections.defaultdict(dict)
_where = threading.local()
_current = ["?", "?"]


def _patch() -> None:
    real_tune, real_open = tuning.tune_task, gpu.open_aiomnn

    def tune_task(task, level, cancelled, clocks):
        timer = task.timer
        times = TIMES[tuple(_current)].setdefault(getattr(task, "key", str(task)), {})

        def timed_timer():
            cm = timer()

            class Wrap:
                def __enter__(self):
                    measure = cm.__enter__()

                    def m(c, samples):
                        t = measure(c, samples)
                        times[str(c)] = t
                        return t

                    return m

                def __exit__(self, *exc):
                    return cm.__exit__(*exc)

            return Wrap()

        task.timer = timed_timer
        return real_tune(task, level, cancelled, clocks)

    async def open_aiomnn(stack, name, shape, backend, precision, *args):
        _current[:] = [f"{name} b{shape[0]}", precision]
        return await real_open(stack, name, shape, backend, precision, *args)

    tuning.tune_task = tune_task
    gpu.open_aiomnn = open_aiomnn


def report(without: list[str]) -> None:
    for (model, precision), convs in TIMES.items():
        print(f"\n## {model} {precision}: us per conv candidate (* the pick)")
        total = total_old = 0.0
        for key, times in convs.items():
            if not times:
                continue
            best = min(times, key=times.get)
            old = [t for a, t in times.items() if not any(a.startswith(w) for w in without)]
            total += times[best]
            total_old += min(old) if old else times[best]
            ranked = sorted(times.items(), key=lambda x: x[1])
            cells = "  ".join(f"{'*' if a == best else ''}{a} {t * 1e6:.1f}" for a, t in ranked)
            print(f"{key}: {cells}")
        print(f"sum of picks {total * 1e6:.1f} us; without {','.join(without) or '-'}: {total_old * 1e6:.1f} us")


def main() -> None:
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser()
    ap.add_argument("--without", default="")
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    _patch()
    try:
        asyncio.run(gpu.main(rest))
    finally:
        report([w for w in args.without.split(",") if w])


if __name__ == "__main__":
    main()
