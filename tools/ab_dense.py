"""A/B: minilm with its Dense steps through the tile loop (on) and through BLAS (off), against onnxruntime.

    python tools/ab_dense.py THREADS[,THREADS...]
"""
import asyncio, sys
sys.path.insert(0, "benchmarks")
import cpu_vs_ort
from aiomnn import models
from aiomnn.backends.cpu.ops import direct
on = direct.dense
for t in [int(v) for v in sys.argv[1].split(",")]:
    for shape in ((1, 16), (1, 128), (8, 128)):
        feeds = models.sample_feeds("minilm", shape)
        row = []
        for mode in ("on", "off"):
            direct.dense = on if mode == "on" else (lambda *a: False)
            o, a = asyncio.run(cpu_vs_ort.bench(models.path("minilm"), feeds, t, 10))
            row.append(f"{mode} {a:.2f}/{o:.2f}={a/o:.2f}")
        print(f"minilm {shape} threads {t}: " + "  ".join(row), flush=True)
