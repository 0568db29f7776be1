"""String ops: StringNormalizer, StringConcat, StringSplit and RegexFullMatch.

String tensors are numpy object arrays of Python str. RegexFullMatch takes
RE2 syntax; it is translated to an equivalent Python `re` pattern, and a
pattern whose meaning would differ (or that RE2 rejects) is refused at
kernel creation rather than matched differently.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from aiomnn.errors import BackendError

from ..execution import CpuOp, Unsupported, op


def _text(v: Any) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8")
    if not isinstance(v, str):
        raise BackendError(f"expected a string element, got {type(v).__name__}")
    return v


def _strings(x: Any) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != object and x.dtype.kind not in "US":
        raise BackendError(f"expected a string tensor, got {x.dtype}")
    return x


def _object_array(values: list[str], shape: tuple[int, ...]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out.reshape(shape)


# StringNormalizer -----------------------------------------------------------

def _upper_char(c: str) -> str:
    u = c.upper()
    if len(u) == 1:
        return u
    t = c.title()  # the simple uppercase of the Greek letters with ypogegrammeni
    return t if len(t) == 1 else c


def _lower_char(c: str) -> str:
    lo = c.lower()
    if len(lo) == 1:
        return lo
    return "i" if c == "\u0130" else c


def simple_upper(s: str) -> str:
    """Per-character (simple) case mapping, as C++ towupper does: "ß" stays "ß"."""
    return s.upper() if s.isascii() else "".join(map(_upper_char, s))


def simple_lower(s: str) -> str:
    return s.lower() if s.isascii() else "".join(map(_lower_char, s))


@op("StringNormalizer", 10)
class StringNormalizer(CpuOp):
    """Stopword removal and case change, with per-character (simple) Unicode case mapping.

    The `locale` attribute is accepted and not used: the mapping is the same for every locale.
    """

    def __init__(self, node, inputs, outputs, case_change_action="NONE", is_case_sensitive=0, locale="",
                 stopwords=None):
        super().__init__(node, inputs, outputs)
        if case_change_action not in ("NONE", "LOWER", "UPPER"):
            raise Unsupported(f"case_change_action {case_change_action!r} is not NONE, LOWER or UPPER")
        self.action = case_change_action
        self.sensitive = bool(is_case_sensitive)
        words = list(stopwords or [])
        self.stopwords = set(words) if self.sensitive else {simple_lower(w) for w in words}

    def run(self, x):
        x = _strings(x)
        if x.ndim == 1:
            two_d = False
        elif x.ndim == 2 and x.shape[0] == 1:
            two_d = True
        else:
            raise BackendError(f"{self.node}: the input must have shape [C] or [1, C], not {list(x.shape)}")
        kept = []
        for v in x.reshape(-1):
            s = _text(v)
            if (s if self.sensitive else simple_lower(s)) in self.stopwords:
                continue
            if self.action == "LOWER":
                s = simple_lower(s)
            elif self.action == "UPPER":
                s = simple_upper(s)
            kept.append(s)
        if not kept:
            kept = [""]
        return _object_array(kept, (1, len(kept)) if two_d else (len(kept),))


# StringConcat -----------------------------------------------------------------

@op("StringConcat", 20)
def string_concat(x, y):
    x, y = _strings(x), _strings(y)
    shape = np.broadcast_shapes(x.shape, y.shape)
    xs, ys = np.broadcast_to(x, shape).reshape(-1), np.broadcast_to(y, shape).reshape(-1)
    return _object_array([_text(a) + _text(b) for a, b in zip(xs, ys)], shape)


# StringSplit ------------------------------------------------------------------

@op("StringSplit", 20)
class StringSplit(CpuOp):
    def __init__(self, node, inputs, outputs, delimiter="", maxsplit=None):
        super().__init__(node, inputs, outputs)
        self.delimiter = delimiter or None  # None: split on runs of whitespace
        self.maxsplit = -1 if maxsplit is None else int(maxsplit)
        if self.maxsplit < -1:
            raise Unsupported(f"maxsplit {maxsplit} must be positive")

    def run(self, x):
        x = _strings(x)
        if self.delimiter is None:  # runs of whitespace separate; leading and trailing whitespace is dropped
            parts = [_text(v).strip().split(None, self.maxsplit) for v in x.reshape(-1)]
        else:
            parts = [_text(v).split(self.delimiter, self.maxsplit) for v in x.reshape(-1)]
        width = max((len(p) for p in parts), default=0)
        flat = [s for p in parts for s in p + [""] * (width - len(p))]
        counts = np.array([len(p) for p in parts], dtype=np.int64).reshape(x.shape)
        return _object_array(flat, x.shape + (width,)), counts


# RegexFullMatch -----------------------------------------------------------------

@op("RegexFullMatch", 20)
class RegexFullMatch(CpuOp):
    def __init__(self, node, inputs, outputs, pattern=None):
        super().__init__(node, inputs, outputs)
        if pattern is None:
            raise Unsupported("RegexFullMatch needs a pattern")
        self.regex = compile_re2(pattern)

    def run(self, x):
        x = _strings(x)
        match = self.regex.fullmatch
        flat = [match(_text(v)) is not None for v in x.reshape(-1)]
        return np.array(flat, dtype=bool).reshape(x.shape)


_WORD = "0-9A-Za-z_"
_SPACE = r"\t\n\f\r\x20"
_CLASS_ESCAPES = {"d": "0-9", "w": _WORD, "s": _SPACE}
_ESCAPES = {
    "d": "[0-9]", "D": "[^0-9]", "w": f"[{_WORD}]", "W": f"[^{_WORD}]", "s": f"[{_SPACE}]", "S": f"[^{_SPACE}]",
    "b": f"(?:(?<=[{_WORD}])(?![{_WORD}])|(?<![{_WORD}])(?=[{_WORD}]))",
    "B": f"(?:(?<=[{_WORD}])(?=[{_WORD}])|(?<![{_WORD}])(?![{_WORD}]))",
    "A": r"\A", "z": r"\Z",
}
_POSIX = {
    "alnum": "0-9A-Za-z", "alpha": "A-Za-z", "ascii": r"\x00-\x7f", "blank": r"\t\x20", "cntrl": r"\x00-\x1f\x7f",
    "digit": "0-9", "graph": r"\x21-\x7e", "lower": "a-z", "print": r"\x20-\x7e",
    "punct": r"\x21-\x2f\x3a-\x40\x5b-\x60\x7b-\x7e", "space": r"\t\n\x0b\f\r\x20", "upper": "A-Z",
    "word": _WORD, "xdigit": "0-9A-Fa-f",
}
_REPEAT = re.compile(r"\{(\d+)(,(\d*))?\}")
_MAX_REPEAT = 1000


class _Frame:
    __slots__ = ("flags", "scopes")

    def __init__(self, flags: frozenset[str]):
        self.flags = flags
        self.scopes: list[str] = []  # "(?flags:" groups opened by (?flags) in this group, closed with it


def compile_re2(pattern: str) -> re.Pattern[str]:
    """A Python regex that matches exactly what the RE2 pattern matches; Unsupported where unsure."""
    try:
        translated = _translate(pattern)
        return re.compile(translated)
    except Unsupported as exc:
        raise Unsupported(f"regex {pattern!r}: {exc}") from None
    except re.error as exc:
        raise Unsupported(f"regex {pattern!r} is not valid: {exc}") from None


def _translate(p: str) -> str:
    out: list[str] = []
    stack = [_Frame(frozenset())]
    i, n = 0, len(p)
    after_repeat = False  # the previous token was a repetition operator
    while i < n:
        c = p[i]
        was_repeat, after_repeat = after_repeat, False
        if c == "\\":
            text, i = _escape(p, i, in_class=False)
            out.append(text)
        elif c == "[":
            text, i = _char_class(p, i)
            out.append(text)
        elif c == "(":
            i = _open_group(p, i, stack, out)
        elif c == ")":
            if len(stack) == 1:
                raise Unsupported("unbalanced ')'")
            out.append(")" * len(stack[-1].scopes) + ")")
            stack.pop()
            i += 1
        elif c == "|":
            f = stack[-1]
            out.append(")" * len(f.scopes) + "|" + "".join(f.scopes))
            i += 1
        elif c == "$":
            out.append("$" if "m" in stack[-1].flags else r"\Z")
            i += 1
        elif c in "*+?":
            if was_repeat and c != "?":
                raise Unsupported(f"bad repetition operator at offset {i}")
            if was_repeat:  # a lazy quantifier: x*? x+? x?? x{n}?
                out.append("?")
                i += 1
                if i < n and p[i] in "*+?{":
                    raise Unsupported(f"bad repetition operator at offset {i}")
                continue
            out.append(c)
            i += 1
            after_repeat = True
        elif c == "{":
            m = _REPEAT.match(p, i)
            if m is None:
                out.append(r"\{")  # RE2 reads a brace that starts no repetition literally
                i += 1
                continue
            lo, hi = int(m.group(1)), m.group(3)
            if lo > _MAX_REPEAT or (hi and int(hi) > _MAX_REPEAT) or (hi and int(hi) < lo):
                raise Unsupported(f"bad repetition {m.group(0)}")
            if was_repeat:
                raise Unsupported(f"bad repetition operator at offset {i}")
            out.append(m.group(0))
            i = m.end()
            after_repeat = True
        else:
            out.append(re.escape(c) if c in "}#&~ \t\n\v\f\r" else c)
            i += 1
    if len(stack) != 1:
        raise Unsupported("missing ')'")
    out.append(")" * len(stack[0].scopes))
    return "".join(out)


def _open_group(p: str, i: int, stack: list[_Frame], out: list[str]) -> int:
    cur = stack[-1]
    if not p.startswith("(?", i):
        out.append("(")
        stack.append(_Frame(cur.flags))
        return i + 1
    rest = p[i + 2 :]
    if rest.startswith("P<") or rest.startswith("<") and not rest.startswith(("<=", "<!")):
        start = i + (4 if rest.startswith("P<") else 3)
        end = p.find(">", start)
        name = p[start:end] if end >= 0 else ""
        if not name or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise Unsupported(f"bad capture group name at offset {i}")
        out.append(f"(?P<{name}>")
        stack.append(_Frame(cur.flags))
        return end + 1
    m = re.match(r"([A-Za-z]*)(?:-([A-Za-z]*))?([:)])", rest)
    if m is None:
        raise Unsupported(f"group syntax {p[i:i + 4]!r}... is not RE2 (lookaround, comments, atomic groups "
                          "and backreferences are not RE2)")
    on, off, end = m.group(1), m.group(2), m.group(3)
    letters = on + (off or "")
    if any(ch not in "ims" for ch in letters):
        raise Unsupported(f"flags {letters!r} at offset {i} are not supported (RE2 has i, m, s and U; "
                          "U is not supported here)")
    if m.group(2) is not None and not off or not letters and end == ")":
        raise Unsupported(f"bad flag group at offset {i}")
    flags = (cur.flags | set(on)) - set(off or "")
    spec = on + (f"-{off}" if off else "")
    opener = f"(?{spec}:" if spec else "(?:"
    consumed = i + 2 + m.end()
    if end == ":":
        out.append(opener)
        stack.append(_Frame(frozenset(flags)))
    else:  # (?flags): to the end of the enclosing group
        out.append(opener)
        cur.scopes.append(opener)
        cur.flags = frozenset(flags)
    return consumed


def _escape(p: str, i: int, in_class: bool) -> tuple[str, int]:
    if i + 1 >= len(p):
        raise Unsupported("trailing backslash")
    c = p[i + 1]
    if in_class and c in _CLASS_ESCAPES:
        return _CLASS_ESCAPES[c], i + 2
    if in_class and c in "DWS":
        raise Unsupported(f"\\{c} inside a character class is not supported")
    if not in_class and c in _ESCAPES:
        return _ESCAPES[c], i + 2
    if c in "aftnrv":
        return "\\" + c, i + 2
    if c == "x":
        if p.startswith("{", i + 2):
            end = p.find("}", i + 3)
            digits = p[i + 3 : end] if end > 0 else ""
            if not digits or not re.fullmatch(r"[0-9A-Fa-f]+", digits) or int(digits, 16) > 0x10FFFF:
                raise Unsupported(f"bad escape \\x{{{digits}}}")
            return "\\U%08x" % int(digits, 16), end + 1
        digits = p[i + 2 : i + 4]
        if not re.fullmatch(r"[0-9A-Fa-f]{2}", digits):
            raise Unsupported("bad \\x escape")
        return "\\x" + digits, i + 4
    if c in "01234567":
        m = re.match(r"[0-7]{1,3}", p[i + 1 :])
        digits = m.group(0)
        if c != "0" and len(digits) == 1:
            raise Unsupported(f"backreference \\{c} is not RE2")
        return "\\x%02x" % int(digits, 8) if int(digits, 8) < 256 else "\\u%04x" % int(digits, 8), i + 1 + len(digits)
    if c == "Q" and not in_class:
        end = p.find("\\E", i + 2)
        literal = p[i + 2 :] if end < 0 else p[i + 2 : end]
        return re.escape(literal), len(p) if end < 0 else end + 2
    if c.isalnum() or c == "_" or ord(c) > 127:
        raise Unsupported(f"escape \\{c} is not supported")
    return "\\" + c, i + 2  # an escaped punctuation character is itself


def _char_class(p: str, i: int) -> tuple[str, int]:
    out = ["["]
    j = i + 1
    if j < len(p) and p[j] == "^":
        out.append("^")
        j += 1
    first = True
    while True:
        if j >= len(p):
            raise Unsupported("missing ']'")
        c = p[j]
        if c == "]" and not first:
            out.append("]")
            return "".join(out), j + 1
        first = False
        if c == "\\":
            text, j = _escape(p, j, in_class=True)
            out.append(text)
        elif c == "[" and p.startswith("[:", j):
            end = p.find(":]", j + 2)
            name = p[j + 2 : end] if end > 0 else ""
            if name not in _POSIX:
                raise Unsupported(f"character class [:{name}:] is not supported")
            out.append(_POSIX[name])
            j = end + 2
        elif c in "[]&~|^":
            out.append("\\" + c)
            j += 1
        else:
            out.append(c)
            j += 1
