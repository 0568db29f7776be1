"""The two-input elementwise ops, written once, as the unary table (unary.py) writes the one-input ones: each op's
first opset of its meaning (numpy's broadcasting) and its value as one expression over x and y, from which the
GPU backends write their kernels' binary_op (aiomnn/expressions.py). The CPU computes them with numpy's ufuncs.

Max and Min give NaN where either input is NaN, as numpy does (C's fmax would drop it); Div and Pow are each
language's own helpers (Vulkan's division is otherwise 2.5 ulp off, and its pow is undefined for a negative base).
"""

from __future__ import annotations

from .unary import Table

#: The two-input ops' rows (unary.Row: name, code, since, expression).
TABLE = Table((
        ("Add", 7, "x + y"),
        ("Sub", 7, "x - y"),
        ("Mul", 7, "x * y"),
        ("Div", 7, "div(x, y)"),
        ("Pow", 7, "pow(x, y)"),
        ("Max", 8, "x + y if isnan(x) or isnan(y) else max(x, y)"),
        ("Min", 8, "x + y if isnan(x) or isnan(y) else min(x, y)"),
        ("PRelu", 7, "x * y if x < 0 else x"),
        # Forms of the kernels' own, not ONNX's ops: Mod with fmod=1, and x scaled by y plus x (a Mul and the Add
        # of its input, which Vulkan's fusion makes one).
        ("Fmod", None, "fmod(x, y)"),
        ("Gate", None, "x + x * y")))
