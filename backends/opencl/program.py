"""OpenCL programs: the source of each kernel file, and the programs built from it, cached by source and options.

A kernel file (kernels/<name>.cl) is built with kernels/common.cl before it and the elementwise tables'
activate() and binary_op() written in OpenCL C (aiomnn/expressions.py). Built programs are kept here by source
and options (pyopencl and PoCL also cache the binaries on disk).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import warnings
from pathlib import Path
from typing import Any, Callable

import pyopencl as cl

from aiomnn import binary
from aiomnn.errors import BackendError
from aiomnn.expressions import Dialect, switch

from .ops.base import Alias, Decline, Launch, OpContext, launches_for
from .ops.layout import contiguous_copy

log = logging.getLogger("aiomnn.opencl")

KERNELS = Path(__file__).with_name("kernels")
#: OpenCL C as a dialect of the unary table's expressions (aiomnn/expressions.py); sigmoid_ and softplus_ are
#: kernels/common.cl's.
OPENCL = Dialect({"abs": "fabs", "round": "rint", "min": "fmin", "max": "fmax", "sigmoid": "sigmoid_",
                  "softplus": "softplus_", "div": "div_"}, "f", {"x": "x", "y": "y", "a": "a", "b": "b"})


class Programs:
    """The programs built on one context, shared by every session of its runtime."""

    def __init__(self, context: "cl.Context"):
        self.context = context
        self._programs: dict[tuple[str, tuple[str, ...]], Any] = {}  # a cl.Program, or the error building it
        self._sources: dict[str, tuple[str, str]] = {}
        self._lock = threading.Lock()

    def source(self, name: str) -> tuple[str, str]:
        """A kernel file with the common header and the elementwise tables' activate() and binary_op(), and a
        short hash of it (part of tuning keys)."""
        with self._lock:
            if name not in self._sources:
                text = "\n".join(((KERNELS / "common.cl").read_text(),
                                  switch(OPENCL, "inline float activate(float x, int op, float a, float b)"),
                                  switch(OPENCL, "inline float binary_op(float x, float y, int op)", binary.TABLE),
                                  (KERNELS / f"{name}.cl").read_text()))
                self._sources[name] = (text, hashlib.sha1(text.encode()).hexdigest()[:10])
            return self._sources[name]

    def build(self, name: str, options: tuple[str, ...]) -> "cl.Program":
        """A built program, built once for each source and options.

        A program that fails to build raises BackendError, now and on every later call.
        """
        key = (name, options)
        with self._lock:
            prg = self._programs.get(key)
        if prg is None:
            text, _ = self.source(name)
            try:
                prg = _build(self.context, text, options)
            except cl.Error as exc:
                log.warning("OpenCL: cannot build %s.cl with %s; its ops run on the CPU: %s", name,
                            " ".join(options), exc)
                prg = BackendError(f"OpenCL: cannot build {name}.cl with {' '.join(options)}: {exc}")
            with self._lock:
                prg = self._programs.setdefault(key, prg)
        if isinstance(prg, BackendError):
            raise prg
        return prg

    def build_for(self, ctx: OpContext, ops: list, settle: Callable[[Launch], Launch]) -> None:
        """Build every program these ops need, each launch as `settle` makes it (its choice of tiles); called on a
        worker thread before a plan is made."""
        for node, inputs, outputs in ops:
            try:
                launches = launches_for(ctx, node, inputs, outputs)
            except Decline:
                continue
            if isinstance(launches, Alias):  # becomes a copy when its output is a graph output
                launches = [contiguous_copy(ctx, inputs[launches.index], outputs[0])]
            for launch in map(settle, launches):
                try:
                    self.build(launch.program, ctx.options + launch.options)
                except BackendError:
                    pass

    def clear(self) -> None:
        with self._lock:
            self._programs.clear()


_build_lock = threading.Lock()


def _build(context: "cl.Context", text: str, options: tuple[str, ...]) -> "cl.Program":
    """Build a program; a build log is logged, not warned (NVIDIA's lists every kernel as "noinline overridden")."""
    with _build_lock, warnings.catch_warnings():  # one build at a time: catch_warnings is process-wide
        warnings.simplefilter("ignore", cl.CompilerWarning)
        prg = cl.Program(context, text).build(options=list(options))
    if log.isEnabledFor(logging.DEBUG):
        for dev in context.devices:
            text = prg.get_build_info(dev, cl.program_build_info.LOG).strip()
            if text:
                log.debug("OpenCL build log (%s): %s", " ".join(options), text)
    return prg
