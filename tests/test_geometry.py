"""aiomnn.geometry: the data-movement ops as raster regions, run by the numpy reference executor, give exactly what
onnx's reference evaluator gives, over ranks 0 to 6, empty dimensions, negative axes and steps, float32 and int64.
Every raster is also checked to write no element twice, and every element when it has no fill."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from aiomnn.config import ForwardType
from aiomnn.geometry import OPS, Raster, Region, merge, plan, run
from aiomnn.runtime import probe

DTYPES = [pytest.param(np.float32, id="float32"), pytest.param(np.int64, id="int64")]
BIG = np.iinfo(np.int64).max
I64 = np.int64


def data(shape, dtype, start=0) -> np.ndarray:
    """Distinct values, so that any element in the wrong place shows."""
    return (np.arange(math.prod(shape)) + start).reshape(shape).astype(dtype)


def reference(op_type, inputs, consts, attrs, opset, n_outputs) -> list[np.ndarray]:
    """onnx's reference evaluator on a one-node model: inputs are fed, consts are initializers, an index in
    neither is an input left out."""
    names = [f"x{i}" if i < len(inputs) or i in consts else "" for i in range(max([len(inputs) - 1, *consts]) + 1)]
    # An empty list attribute has no type onnx can infer; the cases give none where the default is the same.
    attrs = {k: v for k, v in attrs.items() if not (isinstance(v, list) and not v)}
    node = helper.make_node(op_type, names, [f"y{k}" for k in range(n_outputs)], **attrs)
    graph = helper.make_graph(
        [node], "case",
        [helper.make_tensor_value_info(f"x{i}", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
         for i, x in enumerate(inputs)],
        [helper.make_empty_tensor_value_info(f"y{k}") for k in range(n_outputs)],
        initializer=[numpy_helper.from_array(np.asarray(v), f"x{i}") for i, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return ReferenceEvaluator(model).run(None, {f"x{i}": x for i, x in enumerate(inputs)})


def writes(raster: Raster) -> np.ndarray:
    """How many times the raster writes each output element."""
    counts = np.zeros(math.prod(raster.shape), dtype=np.int64)
    for r in raster.regions:
        assert len(r.size) == len(r.src_strides) == len(r.dst_strides) == 3
        i, j, k = (np.arange(n) * s for n, s in zip(r.size, r.dst_strides))
        np.add.at(counts, (r.dst_offset + i[:, None, None] + j[None, :, None] + k[None, None, :]).reshape(-1), 1)
    return counts


def planned(op_type, inputs, consts=None, opset=18, n_outputs=1, expected=None, **attrs) -> list[Raster]:
    """Plan every output of a node, run the rasters and compare with the reference (or with `expected`)."""
    consts = consts or {}
    shapes = [inputs[i].shape if i < len(inputs) else np.shape(consts[i]) if i in consts else None
              for i in range(max([len(inputs) - 1, *consts]) + 1)]
    want = expected if expected is not None else reference(op_type, inputs, consts, attrs, opset, n_outputs)
    rasters = []
    for k in range(n_outputs):
        raster = plan(op_type, attrs, shapes, consts, opset, k, n_outputs)
        assert raster is not None, (op_type, attrs)
        got = run(raster, inputs, inputs[0].dtype)
        where = f"{op_type} {[x.shape for x in inputs]} {consts} {attrs} output {k}"
        assert got.dtype == want[k].dtype and got.shape == want[k].shape, where
        assert np.array_equal(got, want[k]), where
        counts = writes(raster)
        assert counts.max(initial=0) <= 1, where
        assert raster.fill is not None or counts.min(initial=1) == 1, where
        rasters.append(raster)
    return rasters


def shapes_up_to(rank: int, rng: np.random.Generator, dims=(1, 2, 3, 4)) -> list[tuple[int, ...]]:
    return [tuple(int(d) for d in rng.choice(dims, size=r)) for r in range(rank + 1) for _ in range(4)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_transpose(dtype):
    rng = np.random.default_rng(0)
    for shape in shapes_up_to(6, rng) + [(2, 0, 3), (0,), (3, 1, 0, 2)]:
        x = data(shape, dtype)
        planned("Transpose", [x])  # the default perm reverses the axes
        planned("Transpose", [x], perm=list(range(len(shape))))
        for _ in range(3):
            planned("Transpose", [x], perm=[int(p) for p in rng.permutation(len(shape))])


def random_slice(shape, rng, steps=(1, 1, 2, 3, -1, -2), first_axes=False):
    """starts, ends, axes and steps over a random set of axes (or the first ones), with negative and out-of-range
    values; no backward start before the beginning (test_slice_clamps_as_onnx_says covers that one)."""
    count = int(rng.integers(1, min(len(shape), 3) + 1))
    axes = list(range(count)) if first_axes else [int(a) for a in rng.permutation(len(shape))[:count]]
    starts, ends, chosen = [], [], []
    for a in axes:
        d, step = shape[a], int(rng.choice(steps))
        # Mostly from near one end to near the other, so that most slices take something.
        if step > 0:
            starts.append(int(rng.choice([0, 0, 1, -d, -BIG, -1, d + 5])))
            ends.append(int(rng.choice([d, d, d + 5, BIG, BIG, -1, 2])))
        else:
            starts.append(max(int(rng.choice([d - 1, d - 1, -1, BIG, d + 5, 1, -d])), -d))
            ends.append(int(rng.choice([-BIG, -BIG, -d - 3, -d - 1, -1, 0])))
        chosen.append(step)
    return starts, ends, [a - len(shape) if rng.random() < 0.3 else a for a in axes], chosen


@pytest.mark.parametrize("dtype", DTYPES)
def test_slice(dtype):
    rng = np.random.default_rng(1)
    for shape in [s for s in shapes_up_to(6, rng, (1, 3, 4, 5)) if s] + [(3, 0, 2), (0,)]:
        x = data(shape, dtype)
        for _ in range(4):
            starts, ends, axes, steps = (np.array(v, dtype=I64) for v in random_slice(shape, rng))
            planned("Slice", [x], {1: starts, 2: ends, 3: axes, 4: steps}, opset=13)
            starts, ends, axes, steps = (np.array(v, dtype=I64) for v in random_slice(shape, rng, first_axes=True))
            planned("Slice", [x], {1: starts, 2: ends, 4: steps}, opset=13)  # no axes: the first ones
            starts, ends, axes, _ = random_slice(shape, rng, steps=(1,))
            planned("Slice", [x], {1: np.array(starts), 2: np.array(ends), 3: np.array(axes)}, opset=13)
            planned("Slice", [x], opset=9, starts=starts, ends=ends, axes=axes)


def test_slice_clamps_as_onnx_says():
    """A backward slice starting before the beginning starts at element 0 (ONNX's clamping, and onnxruntime's);
    numpy's slices, which onnx's reference evaluator uses, take nothing there."""
    x = np.arange(5, dtype=np.float32)
    consts = {1: np.array([-100]), 2: np.array([-BIG - 1]), 3: np.array([0]), 4: np.array([-1])}
    planned("Slice", [x], consts, opset=13, expected=[x[:1]])
    consts[1] = np.array([BIG])
    planned("Slice", [x], consts, opset=13, expected=[x[::-1]])


@pytest.mark.parametrize("dtype", DTYPES)
def test_concat(dtype):
    rng = np.random.default_rng(2)
    for shape in [s for s in shapes_up_to(6, rng) if s] + [(2, 0, 3)]:
        for axis in range(-len(shape), len(shape)):
            parts = []
            for k in range(int(rng.integers(1, 5))):
                s = list(shape)
                s[axis] = int(rng.choice([0, 1, 2, 3]))
                parts.append(data(s, dtype, start=100 * k))
            planned("Concat", parts, axis=axis)


@pytest.mark.parametrize("dtype", DTYPES)
def test_split(dtype):
    rng = np.random.default_rng(3)
    for shape in [s for s in shapes_up_to(6, rng, (1, 2, 4, 6)) if s] + [(0, 3)]:
        x = data(shape, dtype)
        for axis in range(-len(shape), len(shape)):
            d = shape[axis]
            cut = sorted(int(c) for c in rng.integers(0, d + 1, size=2))
            sizes = [cut[0], cut[1] - cut[0], d - cut[1]]
            planned("Split", [x], {1: np.array(sizes, dtype=np.int64)}, opset=13, n_outputs=3, axis=axis)
            planned("Split", [x], opset=11, n_outputs=3, axis=axis, split=sizes)
            for n in (1, 2, 3):
                if -(-d // n) * (n - 1) <= d:
                    planned("Split", [x], opset=18, n_outputs=n, axis=axis, num_outputs=n)
                if d % n == 0:
                    planned("Split", [x], opset=13, n_outputs=n, axis=axis)


def cropped_pad(x, begin, end, value):
    """np.pad, which the reference evaluator uses, takes no negative pads: pad by the positive ones, then crop by
    the negative ones (which may reach into the padding, as onnxruntime agrees)."""
    y = np.pad(x, [(max(0, b), max(0, e)) for b, e in zip(begin, end)], constant_values=value)
    return y[tuple(slice(max(0, -b), d - max(0, -e)) for d, b, e in zip(y.shape, begin, end))]


@pytest.mark.parametrize("dtype", DTYPES)
def test_pad(dtype):
    rng = np.random.default_rng(4)
    for shape in shapes_up_to(6, rng) + [(2, 0, 3)]:
        x = data(shape, dtype)
        value = np.array(7, dtype=dtype)
        for _ in range(3):
            pads = [int(p) for p in rng.integers(0, 3, size=2 * len(shape))]
            if not shape:  # the reference reads an empty pads tensor as float and fails
                planned("Pad", [x], {1: np.array(pads, dtype=np.int64), 2: value}, opset=13, expected=[x])
                continue
            planned("Pad", [x], {1: np.array(pads, dtype=np.int64), 2: value}, opset=13)
            planned("Pad", [x], {1: np.array(pads, dtype=np.int64)}, opset=11)
            planned("Pad", [x], opset=2, pads=pads, value=-3.0)
            axes = [int(a) - len(shape) for a in rng.permutation(len(shape))[:2]]
            some = pads[:len(axes)] * 2
            planned("Pad", [x], {1: np.array(some, dtype=np.int64), 2: value, 3: np.array(axes)}, opset=18)
            crops = [int(p) for p in rng.integers(-2, 3, size=2 * len(shape))]
            begin, end = crops[:len(shape)], crops[len(shape):]
            if all(d + b + e >= 0 for d, b, e in zip(shape, begin, end)):
                planned("Pad", [x], {1: np.array(crops, dtype=np.int64), 2: value}, opset=13,
                        expected=[cropped_pad(x, begin, end, 7)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_tile(dtype):
    rng = np.random.default_rng(5)
    for shape in shapes_up_to(6, rng, (1, 2, 3)) + [(2, 0)]:
        x = data(shape, dtype)
        for _ in range(3):
            reps = rng.choice([1, 1, 2, 3, 0], size=len(shape)).astype(np.int64)
            planned("Tile", [x], {1: reps}, opset=13)


@pytest.mark.parametrize("dtype", DTYPES)
def test_expand(dtype):
    rng = np.random.default_rng(6)
    for shape in shapes_up_to(5, rng, (1, 1, 2, 3)) + [(1, 0), (2, 1)]:
        x = data(shape, dtype)
        for _ in range(3):
            lead = [int(d) for d in rng.choice([1, 2, 3], size=rng.integers(0, 3))]
            target = lead + [int(rng.choice([d, 4, 0])) if d == 1 else int(rng.choice([d, 1])) for d in shape]
            planned("Expand", [x], {1: np.array(target, dtype=np.int64)}, opset=13)
            planned("Expand", [x], {1: np.array(target[len(lead) + 1:], dtype=np.int64)}, opset=13)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reshapes(dtype):
    rng = np.random.default_rng(7)
    for shape in shapes_up_to(6, rng) + [(2, 0, 3)]:
        x = data(shape, dtype)
        planned("Identity", [x])
        planned("Reshape", [x], {1: np.array([-1], dtype=np.int64)}, opset=13)
        planned("Reshape", [x], opset=4, shape=[-1], expected=[x.reshape(-1)])  # no reference at opset 4
        if len(shape) >= 2 and x.size:  # numpy (the reference) infers no -1 for an empty tensor
            planned("Reshape", [x], {1: np.array([0, -1], dtype=np.int64)}, opset=13)
            planned("Reshape", [x], {1: np.array(list(reversed(shape)), dtype=np.int64)}, opset=14, allowzero=1)
        for axis in range(-len(shape), len(shape) + 1):
            a = axis + len(shape) if axis < 0 else axis
            flat = x.reshape(math.prod(shape[:a]), math.prod(shape[a:]))  # numpy's -1, the reference's, fails on 0
            planned("Flatten", [x], opset=13, axis=axis, expected=None if x.size else [flat])
        ones = [i for i, d in enumerate(shape) if d == 1]
        planned("Squeeze", [x], opset=13)
        if ones:
            planned("Squeeze", [x], {1: np.array([ones[0] - len(shape)], dtype=np.int64)}, opset=13)
            planned("Squeeze", [x], opset=11, axes=ones)
        planned("Unsqueeze", [x], {1: np.array([0, -1], dtype=np.int64)}, opset=13)
        planned("Unsqueeze", [x], opset=11, axes=[len(shape)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather(dtype):
    rng = np.random.default_rng(8)
    for shape in [s for s in shapes_up_to(6, rng, (1, 2, 3, 5)) if s] + [(3, 0), (0, 2)]:
        x = data(shape, dtype)
        for axis in range(-len(shape), len(shape)):
            d = shape[axis]
            choices = [np.zeros((0,), dtype=np.int64)]
            if d:
                choices += [np.array(int(rng.integers(-d, d))),  # a scalar index drops the axis
                            rng.integers(-d, d, size=4).astype(np.int64),
                            rng.integers(-d, d, size=(2, 3)).astype(np.int32),
                            np.arange(d, dtype=np.int64)]
            for indices in choices:
                planned("Gather", [x], {1: indices}, axis=axis)


@pytest.mark.parametrize("dtype", DTYPES)
def test_depth_and_space(dtype):
    for n, c, h, w, b in [(1, 4, 2, 3, 2), (2, 18, 2, 1, 3), (1, 3, 2, 2, 1), (2, 8, 3, 3, 2), (0, 4, 2, 2, 2)]:
        x = data((n, c, h, w), dtype)
        for mode in ("DCR", "CRD"):
            planned("DepthToSpace", [x], opset=13, blocksize=b, mode=mode)
        planned("DepthToSpace", [x], opset=11, blocksize=b)  # DCR by default
        y = data((n, c, h * b, w * b), dtype)
        planned("SpaceToDepth", [y], opset=13, blocksize=b)
        for mode in ("DCR", "CRD"):  # a mode from opset 28 on
            planned("SpaceToDepth", [y], opset=28, blocksize=b, mode=mode)


def test_merge_counts():
    parts = [data((2, 3, 4), np.float32) for _ in range(3)]
    assert len(planned("Concat", parts, axis=0)[0].regions) == 3  # one contiguous copy per input
    x = data((2, 3, 2, 3, 2, 3), np.float32)
    assert len(planned("Transpose", [x], perm=list(range(6)))[0].regions) == 1
    y = data((2, 6, 3), np.float32)
    # Any even step through the indices joins, [5, 0] too (a source stride of -15); [0, 1, 3] steps unevenly.
    for indices, count in [([1, 2, 3, 4], 1), ([4, 3, 2], 1), ([0, 1, 3, 4], 2), ([0, 2, 4], 1), ([5, 0], 1),
                           ([0, 1, 3], 2)]:
        raster = planned("Gather", [y], {1: np.array(indices)}, axis=1)[0]
        assert len(raster.regions) == count, indices
    whole = planned("Gather", [y], {1: np.arange(6)}, axis=1)[0]
    assert whole.regions == (Region(0, 0, (0, 0, 1), 0, (0, 0, 1), (1, 1, 36)),)


def test_merge_rules():
    a = Region(0, 0, (0, 0, 1), 0, (0, 0, 1), (1, 1, 4))
    b = Region(0, 4, (0, 0, 1), 4, (0, 0, 1), (1, 1, 6))
    assert merge([a, b]) == [Region(0, 0, (0, 0, 1), 0, (0, 0, 1), (1, 1, 10))]
    other_input = Region(1, 4, (0, 0, 1), 4, (0, 0, 1), (1, 1, 6))
    assert merge([a, other_input]) == [a, other_input]
    # The same input read twice, into two places: one region with a source stride of 0.
    again = Region(0, 0, (0, 0, 1), 10, (0, 0, 1), (1, 1, 4))
    assert merge([a, again, Region(0, 0, (0, 0, 1), 20, (0, 0, 1), (1, 1, 4))]) == [
        Region(0, 0, (0, 0, 1), 0, (0, 10, 1), (1, 3, 4))]
    full = Region(0, 0, (12, 4, 1), 0, (1, 3, 6), (2, 3, 4))
    shifted = Region(0, 100, (12, 4, 1), 100, (1, 3, 6), (2, 3, 4))
    assert merge([full, shifted]) == [full, shifted]  # a region has no fourth axis to join them along


def copies(regions) -> list[tuple[int, int, int]]:
    """Every (input, source element, destination element) the regions copy, sorted."""
    out = []
    for r in regions:
        for idx in itertools.product(*(range(n) for n in r.size)):
            out.append((r.src, r.src_offset + sum(i * k for i, k in zip(idx, r.src_strides)),
                        r.dst_offset + sum(i * k for i, k in zip(idx, r.dst_strides))))
    return sorted(out)


def test_merge_keeps_every_copy():
    """Runs of shifted copies of one region (as Gather and the outer loops of view make), broken at random by a
    region of another input or a change of step: merging never adds, drops or moves a copy."""
    rng = np.random.default_rng(9)
    for _ in range(300):
        sizes = [int(n) for n in rng.integers(1, 4, size=rng.integers(0, 4))]
        unit = Region(0, 0, tuple([0] * (3 - len(sizes)) + [int(k) for k in rng.integers(-4, 6, len(sizes))]),
                      0, tuple([0] * (3 - len(sizes)) + [int(k) for k in rng.integers(1, 6, len(sizes))]),
                      tuple([1] * (3 - len(sizes)) + sizes))
        regions, shift = [], (int(rng.integers(-5, 9)), int(rng.integers(1, 9)))
        for k in range(int(rng.integers(1, 8))):
            if rng.random() < 0.2:
                shift = (int(rng.integers(-5, 9)), int(rng.integers(1, 9)))
            other = int(rng.random() < 0.15)
            regions.append(Region(other, unit.src_offset + 40 + k * shift[0], unit.src_strides,
                                  unit.dst_offset + 40 + k * shift[1], unit.dst_strides, unit.size))
        merged = merge(regions)
        assert len(merged) <= len(regions)
        assert all(len(r.size) == 3 for r in merged)
        assert copies(merged) == copies(regions), regions


def test_run_checks_bounds():
    reverse = Raster((4,), (Region(0, 3, (0, 0, -1), 0, (0, 0, 1), (1, 1, 4)),))
    assert run(reverse, [np.arange(4)], np.int64).tolist() == [3, 2, 1, 0]
    with pytest.raises(ValueError, match="input 0 view"):
        run(Raster((4,), (Region(0, 1, (0, 0, 1), 0, (0, 0, 1), (1, 1, 4)),)), [np.arange(4)], np.int64)
    with pytest.raises(ValueError, match="output view"):
        run(Raster((3,), (Region(0, 0, (0, 0, 1), 0, (0, 0, 1), (1, 1, 4)),)), [np.arange(4)], np.int64)
    with pytest.raises(ValueError, match="reads input 1"):
        run(Raster((4,), (Region(1, 0, (0, 0, 1), 0, (0, 0, 1), (1, 1, 4)),)), [np.arange(4)], np.int64)


@pytest.mark.parametrize("op_type, shapes, consts, opset, attrs, message", [
    ("Gather", [(3, 4)], {1: np.array([0, 3])}, 13, {"axis": 0}, "out of range"),
    ("Gather", [(3, 4)], {1: np.array([-5])}, 13, {"axis": 1}, "out of range"),
    ("Gather", [(3, 4)], {1: np.array([0.5])}, 13, {}, "not integers"),
    ("Gather", [(3, 4)], {1: np.array([0])}, 13, {"axis": 2}, "axis 2 is out of range"),
    ("Concat", [(3, 4), (3,)], {}, 13, {"axis": 0}, "one rank"),
    ("Concat", [(3, 4), (3, 5)], {}, 13, {"axis": 0}, "differ off axis"),
    ("Concat", [(3, 4)], {}, 13, {}, "needs the attribute axis"),
    ("Slice", [(3, 4)], {}, 9, {"starts": [0]}, "needs the attribute ends"),
    ("Concat", [()], {}, 13, {"axis": 0}, "one rank above 0"),
    ("Reshape", [(3, 4)], {1: np.array([5, 2], dtype=I64)}, 13, {}, "cannot reshape"),
    ("Reshape", [(3, 4)], {1: np.array([-1, -1], dtype=I64)}, 13, {}, "not a shape"),
    ("Reshape", [(3, 4)], {1: np.array([5, -1], dtype=I64)}, 13, {}, "cannot reshape"),
    ("Reshape", [(3,)], {1: np.array([0, 0], dtype=I64)}, 13, {}, "copies dimension 1"),
    ("Transpose", [(3, 4)], {}, 13, {"perm": [0, 0]}, "not a permutation"),
    ("Slice", [(3, 4)], {1: np.array([0]), 2: np.array([2]), 3: np.array([0]), 4: np.array([0])}, 13, {},
     "zero step"),
    ("Slice", [(3, 4)], {1: np.array([0, 0]), 2: np.array([2, 2]), 3: np.array([1, -1])}, 13, {}, "repeat"),
    ("Slice", [(3, 4)], {1: np.array([0, 0]), 2: np.array([2])}, 13, {}, "differ in length"),
    ("Slice", [(3,)], {1: np.array([0, 0]), 2: np.array([2, 2])}, 13, {}, "outnumber the 1 axes"),
    ("Split", [(6,)], {1: np.array([2, 2], dtype=I64)}, 13, {}, "do not split 6"),
    ("Split", [(7,)], {}, 13, {}, "equal parts"),
    ("Split", [(5,)], {}, 18, {"num_outputs": 4}, "do not split 5"),
    ("Pad", [(3, 4)], {1: np.array([0, -2, 0, -3], dtype=I64)}, 13, {}, "crop more"),
    ("Pad", [(3, 4)], {1: np.array([0, 1], dtype=I64)}, 13, {}, "do not fit"),
    ("Tile", [(3, 4)], {1: np.array([2], dtype=I64)}, 13, {}, "do not fit"),
    ("Expand", [(3, 4)], {1: np.array([2, 4], dtype=I64)}, 13, {}, "does not broadcast"),
    ("DepthToSpace", [(1, 6, 2, 2)], {}, 13, {"blocksize": 2}, "do not divide"),
    ("DepthToSpace", [(1, 4, 2)], {}, 13, {"blocksize": 2}, "rank-4"),
    ("DepthToSpace", [(1, 4, 2, 2)], {}, 13, {"blocksize": 2, "mode": "XYZ"}, "mode"),
    ("SpaceToDepth", [(1, 4, 3, 2)], {}, 13, {"blocksize": 2}, "does not divide"),
    ("Squeeze", [(3, 1)], {1: np.array([0], dtype=I64)}, 13, {}, "not all of size 1"),
    ("Unsqueeze", [(3,)], {1: np.array([0, -3], dtype=I64)}, 13, {}, "repeat"),
    ("Unsqueeze", [(3,)], {1: np.array([3], dtype=I64)}, 13, {}, "out of range"),
    ("Flatten", [(3, 4)], {}, 13, {"axis": 3}, "out of range"),
])
def test_bad_ops_raise(op_type, shapes, consts, opset, attrs, message):
    last = max([len(shapes) - 1, *consts])
    all_shapes = shapes + [np.shape(consts[i]) if i in consts else None for i in range(len(shapes), last + 1)]
    with pytest.raises(ValueError, match=message):
        plan(op_type, attrs, all_shapes, consts, opset, 0, 2 if op_type == "Split" else 1)


def test_split_output_out_of_range():
    with pytest.raises(ValueError, match="output 2 of 2"):
        plan("Split", {}, [(6,)], {}, 13, output=2, n_outputs=2)


def test_what_is_not_planned():
    assert plan("Relu", {}, [(3,)], {}, 13) is None
    assert plan("Pad", {"mode": "reflect"}, [(3,), (2,)], {1: np.array([1, 1])}, 13) is None
    assert plan("Slice", {}, [(3,), (1,), (1,)], {2: np.array([2])}, 13) is None  # starts at run time
    assert plan("Gather", {}, [(3,), (2,)], {}, 13) is None
    assert plan("Pad", {}, [(3,), (2,), ()], {1: np.array([1, 1])}, 13) is None  # its value at run time
    assert plan("Tile", {}, [(3,), (1,), (1,)], {1: np.array([2]), 2: np.array([0])}, 5) is None
    assert {"Transpose", "Slice", "Concat", "Split", "Pad", "Tile", "Expand", "Reshape", "Gather",
            "DepthToSpace", "SpaceToDepth"} <= OPS


def test_of_node_gives_a_backend_rasters_or_a_decline():
    from aiomnn.backend import Decline, Tensor
    from aiomnn.geometry import of_node
    from aiomnn.graph import Node

    f32 = np.dtype(np.float32)
    split = Node("s", "Split", "", ("x",), ("a", "b"), {"axis": 1}, 13)
    x = Tensor("x", f32, (2, 6))
    a, b = of_node(split, [x], [Tensor("a", f32, (2, 3)), Tensor("b", f32, (2, 3))])
    data = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_array_equal(run(b, [data], np.float32), data[:, 3:])
    with pytest.raises(Decline, match="shape"):  # the pipeline inferred another shape: not this raster's
        of_node(split, [x], [Tensor("a", f32, (2, 2)), Tensor("b", f32, (2, 4))])
    gather = Node("g", "Gather", "", ("x", "i"), ("y",), {}, 13)
    with pytest.raises(Decline, match="not a data movement"):  # indices known only at run time
        of_node(gather, [x, Tensor("i", np.dtype(np.int64), (2,))], [Tensor("y", f32, (2, 6))])
    with pytest.raises(Decline, match="out of range"):  # a malformed node: the backup judges it
        of_node(gather, [x, Tensor("i", np.dtype(np.int64), (1,), np.array([7]))], [Tensor("y", f32, (1, 6))])
    dynamic = Node("t", "Transpose", "", ("x",), ("y",), {}, 13)
    with pytest.raises(Decline, match="run time"):
        of_node(dynamic, [Tensor("x", f32, None)], [Tensor("y", f32, None)])


@pytest.mark.parametrize("backend", [t.value for t in (ForwardType.CPU, ForwardType.OPENCL, ForwardType.VULKAN,
                                                        ForwardType.CUDA) if probe(t)])
def test_a_backward_slice_from_before_the_beginning_takes_element_0(backend):
    """ONNX clamps a negative step's start into [0, dim - 1] (onnxruntime too), where Python's slices give nothing:
    the shapes the core infers, moves.py's rasters and each backend's Slice agree with onnxruntime."""
    import asyncio

    import aiomnn
    from tests.oracle import one_input_model

    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    consts = {"s": np.array([-100], np.int64), "e": np.array([-200], np.int64), "a": np.array([1], np.int64),
              "p": np.array([-1], np.int64)}
    data = one_input_model([helper.make_node("Slice", ["x", "s", "e", "a", "p"], ["y"])], x.shape, consts, opset=13)

    async def run() -> np.ndarray:
        net = aiomnn.Interpreter.from_bytes(data)
        async with await net.create_session(aiomnn.ScheduleConfig(type=backend, backup_type="cpu")) as session:
            return (await session.run({"x": x}))["y"]

    np.testing.assert_array_equal(asyncio.run(run()), x[:, :1])


def test_of_node_declines_a_raster_of_too_many_regions():
    """Each region is a launch of a backend's raster kernel: a Gather of many irregular constant indices is left to
    the backend's own Gather (or the CPU) rather than run as hundreds of launches."""
    from aiomnn.backend import Decline, Tensor
    from aiomnn.geometry import MAX_REGIONS, of_node
    from aiomnn.graph import Node

    f32, i64 = np.dtype(np.float32), np.dtype(np.int64)
    x = Tensor("x", f32, (1000, 8))
    gather = Node("g", "Gather", "", ("x", "i"), ("y",), {}, 13)
    few = np.arange(0, 40, 4)  # evenly stepping: one region
    assert len(of_node(gather, [x, Tensor("i", i64, few.shape, few)], [Tensor("y", f32, (10, 8))])[0].regions) == 1
    scattered = np.random.default_rng(0).permutation(1000)[: 4 * MAX_REGIONS]  # few runs step evenly
    assert len(plan("Gather", {}, [(1000, 8), scattered.shape], {1: scattered}, 13).regions) > MAX_REGIONS
    with pytest.raises(Decline, match="regions"):
        of_node(gather, [x, Tensor("i", i64, scattered.shape, scattered)], [Tensor("y", f32, (len(scattered), 8))])
