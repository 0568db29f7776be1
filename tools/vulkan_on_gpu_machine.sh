#!/usr/bin/env bash
# The Vulkan backend's checks on a machine with a real GPU (the lent NVIDIA machine).
#
# Here, once (fills the ignored folder .cache/vk: wheels, the Vulkan loader debs, the models):
#     bash tools/vulkan_on_gpu_machine.sh prepare
# There, through the device tool, carrying that folder:
#     run(command="bash tools/vulkan_on_gpu_machine.sh run", carry=[".cache/vk"], timeout_s=600)
# Everything it prints also goes to $OUT/gpu_check.log (and the pytest report to $OUT/pytest.log).
#
# Steps: unpack the loader, install the carried wheels and aiomnn, list the devices, check the
# shaders, run tests/test_vulkan.py, time the real models on Vulkan (fp32 and fp16) against
# onnxruntime, the host-overhead benchmark, the conformance counts (cpu vs vulkan), and last a
# tuned run (background tuning, then the session moves to the GPU).
set -u
mode=${1:-run}
VK=.cache/vk
OUT=${OUT:-/tmp/vk_out}
mkdir -p "$OUT"

if [ "$mode" = prepare ]; then
    mkdir -p $VK/whl $VK/gl $VK/models /tmp/amd64/partial
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d $VK/whl \
        vulkan==1.3.275.1 cffi==2.0.0 pycparser==3.0 sniffio==1.3.1 trio==0.35.0 outcome==1.3.0.post0 \
        pytest-asyncio==1.5.0
    o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
    apt-get $o update -qq && (cd $VK/gl && apt-get $o download -qq libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
    python3 -c "from aiomnn import models; models.fetch()" || true
    cp "${AIOMNN_MODELS:-$HOME/.cache/aiomnn/models}"/*.onnx $VK/models/ 2>/dev/null || cp /tmp/aiomnn-models/*.onnx $VK/models/
    du -sh $VK
    exit 0
fi

exec > >(tee "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1 AIOMNN_MODELS=$PWD/$VK/models
step() { echo; echo "=== $* ($(date +%T))"; }

# QUICK=1 (small shapes, few runs, no conformance) and SKIP_SETUP=1 are for trying the script on lavapipe.
QUICK=${QUICK:-0}
export QUICK
step setup
if [ "${SKIP_SETUP:-0}" != 1 ]; then
    for f in $VK/gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $VK/whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
        || { echo "editable install failed; linking aiomnn/backends instead"; ln -sfn ../backends aiomnn/backends; export PYTHONPATH=/tmp/site:$PWD; }
fi
nvidia-smi -L || true
python3 - <<'EOF'
import aiomnn
from aiomnn.config import ForwardType
from aiomnn.runtime import probe
devs = probe(ForwardType.VULKAN)
print("vulkan devices:", devs)
if not devs:
    print("no Vulkan device: is libvulkan.so.1 there (ldconfig -p | grep vulkan)? try "
          "VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json")
    raise SystemExit(1)
info = aiomnn.create_runtime(aiomnn.ScheduleConfig(type="vulkan"))
print(info.runtimes[ForwardType.VULKAN].describe())
info.close()
EOF
if [ $? -ne 0 ] && [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
    python3 -c "from aiomnn.runtime import probe; from aiomnn.config import ForwardType; print(probe(ForwardType.VULKAN))"
fi

step shaders
python3 tools/build_shaders.py --check

step tests
timeout 300 python3 -m pytest -q -p no:cacheprovider --durations=8 tests/test_vulkan.py 2>&1 | tee "$OUT/pytest.log" | tail -25

step real models
timeout 240 python3 - <<'EOF'
import asyncio, os, statistics, time
import numpy as np, onnxruntime as ort
import aiomnn
from aiomnn import models

def text_image(h, w, seed=0):
    rng = np.random.default_rng(seed)
    img = np.full((h, w, 3), 235.0)
    for row in range(2, max(3, h - 12), 18):
        x = 4
        while x < w - 12:
            cw = int(rng.integers(3, 9)); img[row:row + 10, x:x + cw] = rng.integers(0, 60); x += cw + int(rng.integers(2, 6))
    img += rng.normal(0, 4, img.shape)
    return ((img / 255.0 - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]).transpose(2, 0, 1)[None].astype(np.float32)

async def main():
    quick = os.environ.get("QUICK") == "1"
    cases = [("det", (1, 3, 640, 640)), ("rec", (1, 3, 48, 320)), ("cls", (1, 3, 48, 192)), ("yolov8n", (1, 3, 320, 320))]
    if quick:
        cases = [("det", (1, 3, 96, 96)), ("cls", (1, 3, 48, 192))]
    runs = 3 if quick else 30
    for precision in ("normal", "low"):
        cfg = aiomnn.ScheduleConfig(type="vulkan", backend_config=aiomnn.BackendConfig(tuning="none", precision=precision))
        info = aiomnn.create_runtime(cfg)
        for name, shape in cases:
            path = str(models.path(name))
            x = text_image(shape[2], shape[3]) if name != "yolov8n" else np.random.default_rng(0).random(shape, dtype=np.float32)
            want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {models.MODELS[name].input: x})[0]
            net = aiomnn.Interpreter.from_file(path)
            async with await net.create_session(cfg, info) as s:
                t = time.perf_counter(); got = await s.run({net.input_names[0]: x}); first = time.perf_counter() - t
                ts = []
                for _ in range(runs):
                    t = time.perf_counter(); got = await s.run({net.input_names[0]: x}); ts.append(time.perf_counter() - t)
                cpu_steps = sum(len(seg.steps) for seg in s.pipeline.segments if seg.backend.type.value != "vulkan")
            g = got[net.output_names[0]]
            err = np.linalg.norm(g.astype(np.float64) - want) / np.linalg.norm(want)
            print(f"{precision:6s} {name:8s} {'x'.join(map(str, shape)):12s} rel err {err:.2e}  first {first*1e3:8.1f} ms  "
                  f"median {statistics.median(ts)*1e3:7.2f} ms  min {min(ts)*1e3:7.2f} ms  cpu steps {cpu_steps}")
        info.close()
asyncio.run(main())
EOF

step host overhead
runs=300; [ "$QUICK" = 1 ] && runs=20
timeout 120 python3 benchmarks/host_overhead.py --runs $runs
timeout 120 python3 benchmarks/host_overhead.py --runs $runs --loop uvloop

step conformance
[ "$QUICK" = 1 ] || timeout 200 python3 - <<'EOF'
import asyncio
from aiomnn import conformance as c
cases = c.load_cases(["node"])
res = {}
for b in ("cpu", "vulkan"):
    res[b] = {o.case.name: o for o in asyncio.run(c.run_suite(b, cases=cases))}
    print(b, c.report(list(res[b].values()), list_failures=False).splitlines()[-1])
bad = [k for k in res["cpu"] if res["cpu"][k].passed and not res["vulkan"][k].passed]
print(len(bad), "cases pass on cpu and fail on vulkan")
for k in bad:
    print("  ", k, res["vulkan"][k].reason[:200])
EOF

step background tuning
timeout 240 python3 - <<'EOF'
import asyncio, os, statistics, tempfile, time
import numpy as np
import aiomnn
from aiomnn import models

async def main():
    cache = os.path.join(tempfile.mkdtemp(), "tuning.json")
    cfg = aiomnn.ScheduleConfig(type="vulkan", backend_config=aiomnn.BackendConfig(tuning="normal"))
    quick = os.environ.get("QUICK") == "1"
    side = 64 if quick else 640
    for attempt in ("cold cache", "warm cache"):
        info = aiomnn.create_runtime(cfg)
        info.set_cache_file(cache)
        net = aiomnn.Interpreter.from_file(str(models.path("det")))
        x = np.random.default_rng(0).standard_normal((1, 3, side, side)).astype(np.float32)
        t0 = time.perf_counter()
        async with await net.create_session(cfg, info) as s:
            await s.run({"x": x})
            print(attempt, "first run on", s.backend_types, "tuning in flight:", s.has_async_work())
            await s.wait_async_resize()
            print(f"  tuning done after {time.perf_counter() - t0:.1f} s; now on {s.backend_types}")
            ts = []
            for _ in range(3 if quick else 30):
                t = time.perf_counter(); await s.run({"x": x}); ts.append(time.perf_counter() - t)
            print(f"  det {side} tuned: median {statistics.median(ts)*1e3:.2f} ms")
        info.close()
    print("cache files:", os.listdir(os.path.dirname(cache)))
asyncio.run(main())
EOF
step done
