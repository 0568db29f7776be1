"""The elementwise tables' expressions (aiomnn/unary.py, aiomnn/binary.py) written in a kernel language: CUDA C,
OpenCL C or GLSL.

An expression is a Python expression over x (and y, for a binary op) and the parameters a and b: numbers,
+ - * /, a negation, one comparison, `and`/`or`, `p if c else q`, and the functions of FUNCTIONS. Each GPU
backend names its language as a Dialect (what each function is called there, how a float literal ends, how
the names are written), and render() writes an expression in it; switch() writes the function that the OpenCL
and Vulkan kernels call with a row's code. So an op's meaning is written once, and a new row reaches every GPU
backend.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Mapping

from .unary import TABLE, Row

#: The functions an expression may call. sigmoid, softplus, div and pow are each language's own helpers,
#: written for accuracy where a plain formula overflows, loses digits or means something else.
FUNCTIONS = frozenset({"exp", "log", "sqrt", "abs", "floor", "ceil", "round", "sin", "cos", "tan", "asin", "acos",
                       "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "sigmoid", "softplus",
                       "min", "max", "div", "pow", "fmod", "isnan"})
_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_COMPARISONS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
_LOGIC = {ast.And: "&&", ast.Or: "||"}


@dataclass(frozen=True)
class Dialect:
    """A kernel language: its name for each of FUNCTIONS that it spells differently (round is half to even),
    the suffix of a float literal, and how it writes x, y, a and b."""

    functions: Mapping[str, str]
    suffix: str
    names: Mapping[str, str]


def render(expr: str, dialect: Dialect) -> str:
    """The expression in the dialect's language. ValueError naming what the expression language lacks."""
    return _write(ast.parse(expr, mode="eval").body, dialect, expr)


def switch(dialect: Dialect, header: str, table: dict[str, Row] = TABLE, indent: str = "    ") -> str:
    """A function over a table (the unary one unless told): `header` (its C-like signature, taking the operands,
    a code `op`, and a and b for a unary op) and a switch that returns each row's expression for its code, else
    x."""
    lines = [header + " {", f"{indent}switch (op) {{"]
    for row in table.values():
        lines.append(f"{indent}case {row.code}: return {render(row.expr, dialect)};  // {row.name}")
    lines += [f"{indent}}}", f"{indent}return {dialect.names['x']};", "}"]
    return "\n".join(lines) + "\n"


def _write(node: ast.AST, d: Dialect, expr: str) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return repr(float(node.value)) + d.suffix
    if isinstance(node, ast.Name) and node.id in d.names:
        return d.names[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return f"({_write(node.left, d, expr)} {_OPERATORS[type(node.op)]} {_write(node.right, d, expr)})"
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return f"(-{_write(node.operand, d, expr)})"
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARISONS:
        return (f"({_write(node.left, d, expr)} {_COMPARISONS[type(node.ops[0])]} "
                f"{_write(node.comparators[0], d, expr)})")
    if isinstance(node, ast.BoolOp) and type(node.op) in _LOGIC:
        return "(" + f" {_LOGIC[type(node.op)]} ".join(_write(v, d, expr) for v in node.values) + ")"
    if isinstance(node, ast.IfExp):
        return (f"({_write(node.test, d, expr)} ? {_write(node.body, d, expr)} : "
                f"{_write(node.orelse, d, expr)})")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS \
            and not node.keywords:
        name = node.func.id
        return f"{d.functions.get(name, name)}({', '.join(_write(a, d, expr) for a in node.args)})"
    raise ValueError(f"expression {expr!r}: {ast.unparse(node)!r} is not in the expression language")
