"""Session: the awaitable face of a pipeline.

Runs on one session are serialised in FIFO order, because the pipeline's
activations belong to it; runs on different sessions proceed concurrently.
A run whose shapes differ from the current plan resizes first.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import anyio
import numpy as np

from .config import ForwardType, ScheduleConfig
from .errors import AiomnnError, BackendError, ClosedError, InputError
from .feeds import check_feeds, check_shapes, is_device_array
from .fence import offload
from .graph import Graph
from .memory import HandedOver
from .metadata import Outputs, TensorInfo
from .pipeline import Pipeline
from .profile import Profile
from .run_lock import RunLock
from .lifetime import own, release_now
from .runtime import RuntimeInfo
from .session_parts import SessionParts, track, untrack
from .stats import RunCounts, SessionStats
from .handoff import SessionTuning

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger("aiomnn")


class Session:
    """A model ready to run on a backend: `await session.run(feeds)`.

    Made by `Interpreter.create_session`. Runs on one session are served one at a time, in the order they
    arrive, because the activations are the session's; runs on different sessions (`clone()` makes one
    that shares the weights) proceed together. A run at new input shapes plans for them first (`resize`).

    Close a session (`await session.close()` or `async with`) when done with it. One that is dropped
    open releases what it holds when it is collected, with a ResourceWarning, as an open file does.

    `config` and `runtime_info` are what the session was made with. `pipeline` is internal (the plans and
    the backends they run on, read by tests and benchmarks); it may change without notice.
    """

    def __init__(self, graph: Graph, config: ScheduleConfig, runtime: RuntimeInfo, owns_runtime: bool,
                 outputs: Outputs | None = None):
        """Made by Interpreter.create_session and clone(): `graph` is the one to run, `outputs` what the
        interpreter says of its outputs."""
        runtime.check_usable()
        self._graph = graph
        self._outputs = outputs if outputs is not None else Outputs(graph.outputs)
        self.config = config
        self.runtime_info = runtime
        self._owns_runtime = owns_runtime
        self._lock = RunLock()  # runs in arrival order; a free lock costs no trip through the loop
        self._closed = False
        self._shapes: dict[str, tuple[int, ...]] | None = None
        self._counts = RunCounts()
        main_rt: Runtime = runtime.runtime_for(config)
        self._main_runtime = main_rt
        self._run_type = main_rt.type  # the backend a run counts under in stats(): set with each plan
        backup_rt = runtime.runtimes.get(ForwardType.of(config.backup_type), runtime.cpu)
        self._backup_runtime = backup_rt
        self._profile = Profile(config.profile_runs) if config.profile else None
        # A plan per input shape seen (Pipeline.recall), each on backends of its own. Made by a function that
        # holds no reference to the session, which the pipeline must not keep alive.
        spawn = functools.partial(_backends, main_rt, backup_rt, config.backend_config, self._profile)
        self.pipeline = Pipeline(graph, *spawn(), spawn=spawn)
        self.pipeline.memory_limit = config.backend_config.memory_limit
        self.pipeline.profile = self._profile
        self._inputs = {v.name: v for v in graph.inputs}
        self._tuning = SessionTuning(main_rt, config, runtime.executor)
        #: Why the session left its main backend for good (with fallback_on_error), else None.
        self.fallback_error: BackendError | None = None
        if owns_runtime:
            runtime.retain()
        # What the session holds, released once: by close(), when it is collected, or at exit. None of it
        # refers back to the session.
        self._parts = SessionParts(self.pipeline, self._tuning, runtime if owns_runtime else None)
        self._finalizer = own(self, SessionParts.release, self._parts,
                              warn=f"unclosed aiomnn session on {main_rt.type} "
                                   f"(call `await session.close()` or use `async with`)")
        self._serial = track(self)

    # Public API ---------------------------------------------------------------
    @property
    def backend_types(self) -> list[ForwardType]:
        """The forward type each pipeline runs on right now."""
        p = self.pipeline
        used = {seg.backend.type for seg in p.segments}
        return [p.main.type if p.main.type in used or not used else p.backup.type]

    @property
    def input_shapes(self) -> dict[str, tuple[int, ...]] | None:
        """The input shapes of the current plan, by input name; None before the first plan."""
        return dict(self._shapes) if self._shapes is not None else None

    @property
    def outputs(self) -> dict[str, TensorInfo]:
        """Each output's name, shape and dtype, by name, for the input shapes last planned (by `resize` or a
        run): concrete shapes, all ints. Before any plan, and for an output whose shape only a run tells (a
        NonZero's, say), what the interpreter says (Interpreter.outputs), symbolic dimensions and all."""
        declared = self._outputs.get()
        if self._shapes is None:
            return declared
        tensors = self.pipeline.tensors
        planned = {}
        for name, info in declared.items():
            t = tensors.get(name)
            if t is None or t.shape is None or t.kind != "tensor":
                planned[name] = info
            else:
                planned[name] = TensorInfo(name, tuple(int(d) for d in t.shape), t.dtype or info.dtype)
        return planned

    def memory_report(self) -> dict[str, int]:
        """Planned activation bytes of the current plan: `peak_bytes` (the memory it holds) and `sum_bytes`
        (what every activation would take without reuse)."""
        return self.pipeline.memory_report()

    @property
    def profile(self) -> Profile | None:
        """With ScheduleConfig(profile=True), the recorder of this session's latest runs, op by op
        (aiomnn.profile: .summary(), .trace(), .write(path), .clear()); else None."""
        return self._profile

    def write_profile(self, path: str | os.PathLike[str]) -> Path:
        """Write the profile of the latest runs as a Chrome trace (chrome://tracing, Perfetto); returns the path."""
        if self._profile is None:
            raise AiomnnError("profiling is off for this session: create it with ScheduleConfig(profile=True)")
        return self._profile.write(path)

    def stats(self) -> SessionStats:
        """A snapshot of the session's runs so far: how many completed, failed, were cancelled or rejected; their
        queue wait and compute time; runs by backend; fallbacks; GPU tuning and its latest events (see
        aiomnn.SessionStats). Cheap, safe from any thread, and still answers after close() (the final counts)."""
        return self._counts.snapshot(self._lock.waiting(), self.fallback_error, self._tuning.busy,
                                     self._tuning.events.snapshot())

    def has_async_work(self) -> bool:
        """True while GPU tuning for this session runs in the background (the session runs on the CPU meanwhile)."""
        return self._tuning.busy

    async def wait_async_resize(self) -> None:
        """Wait until background work (GPU tuning) has ended and the session is on its final backend."""
        self._check_open()
        await self._tuning.wait()
        async with self._lock:
            self._check_open()
            if self._tuning.handoff_due and self._shapes is not None:
                await self._resize_locked(self._shapes)

    async def resize(self, shapes: Mapping[str, Any]) -> None:
        """Plan for these input shapes (input name -> sequence of ints; every input needs one) ahead of the
        runs that use them: infer every tensor's shape, choose each op's kernel, plan the memory and, on a GPU,
        record the work. A run at new shapes does this by itself; a plan made before is taken back, not made
        again. The output shapes it gives are in `outputs`."""
        self._check_open()
        full = check_shapes(self._inputs, shapes)
        async with self._lock:
            self._check_open()
            try:
                await self._resize_locked(full)
            except Exception as exc:
                self._closed_error(exc)
                raise

    async def run(self, feeds: Mapping[str, Any], *, device_outputs: bool = False) -> dict[str, Any]:
        """Run the model on feeds (name -> array). Outputs are numpy arrays the caller owns.

        Feeds may be arrays in CUDA device memory (cupy arrays, torch CUDA tensors, anything with
        __cuda_array_interface__ or CUDA DLPack): a CUDA session copies them on the device, with no
        host round trip; other backends copy them to the host.

        device_outputs=True leaves outputs made on a CUDA GPU there, as cupy arrays (each one a
        fresh device copy, never a host round trip; hand them to torch and others through
        DLPack). Other backends return numpy arrays, which speak DLPack too.
        """
        self._check_open()
        try:
            arrays = check_feeds(self._inputs, feeds)
        except InputError:
            self._counts.rejected()
            raise
        shapes = {name: tuple(a.shape) for name, a in arrays.items()
                  if isinstance(a, np.ndarray) or is_device_array(a)}
        called = time.perf_counter()
        try:
            async with self._lock:
                taken = time.perf_counter()
                outputs = await self._run_locked(arrays, shapes, device_outputs)
                ready = time.perf_counter()
        except Exception:
            self._counts.failed()
            raise
        except BaseException:
            self._counts.cancelled()
            raise
        self._counts.completed(self._run_type, taken - called, ready - taken)
        return _own_outputs(outputs, arrays)

    async def _run_locked(self, arrays: dict[str, Any], shapes: dict[str, tuple[int, ...]],
                          device_outputs: bool) -> dict[str, Any]:
        """The run itself, the session's lock held: plan for new shapes, execute, and on a device error rerun
        on the backup where the session falls back."""
        self._check_open()
        try:
            if shapes != self._shapes or self._tuning.handoff_due:
                await self._resize_locked(shapes)
            try:
                return await self.pipeline.execute(arrays, device_outputs)
            except BackendError as exc:
                self._closed_error(exc)
                if not self._falls_back(exc):
                    raise
                await self._resize_locked(shapes, again=True)
                return await self.pipeline.execute(arrays, device_outputs)
        except Exception as exc:
            self._closed_error(exc)
            raise

    async def clone(self) -> "Session":
        """A session on the same model, config and runtime. It shares the weights (the graph's
        constant tensors) and the runtime's threads and caches; its activations are its own, so
        it runs concurrently with this one."""
        self._check_open()
        twin = Session(self._graph, self.config, self.runtime_info, owns_runtime=self._owns_runtime,
                       outputs=self._outputs)
        if self._shapes is not None:
            try:
                await twin.resize(self._shapes)
            except BaseException:
                await twin.close()
                raise
        return twin

    async def close(self) -> None:
        """Release the session's memory and stop its tuning; waits for a run still on the device. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._tuning.close()
        async with self._lock:
            pending = self.pipeline.pending
            if pending is not None and not pending.done:
                with anyio.CancelScope(shield=True):
                    await pending.settle()
            got = self._finalizer.detach()
            untrack(self._serial)
            if got is not None:
                self._parts.release()

    def _discard(self) -> None:
        """Release a session that was never handed out (its creation failed), quietly and without blocking."""
        self._closed = True
        untrack(self._serial)
        if self._finalizer.detach() is not None:
            self._parts.release(wait=False)

    def _close_at_exit(self) -> None:
        """At exit, before the runtimes close (session_parts.py): release, quietly, as exiting is not leaking."""
        self._closed = True
        release_now(self._finalizer)

    async def __aenter__(self) -> "Session":
        """`async with await net.create_session() as session:` closes the session at the block's end."""
        return self

    async def __aexit__(self, *exc: Any) -> None:
        """Close the session (see close)."""
        await self.close()

    # Internals ----------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the session is closed; create a new one (Interpreter.create_session)")
        info = self.runtime_info
        if info.closed or self._main_runtime.closed or self._backup_runtime.closed:
            raise ClosedError("the session's runtime is closed; close the session, and create a new runtime "
                              "and session")
        for rt in (self._main_runtime, self._backup_runtime):
            if rt.fork_error is not None:
                raise rt.fork_error

    def _closed_error(self, exc: BaseException) -> None:
        """A run that failed because its runtime was closed meanwhile gets a ClosedError."""
        if isinstance(exc, Exception) and not isinstance(exc, ClosedError):
            try:
                self._check_open()
            except AiomnnError as closed:
                raise closed from exc

    async def _resize_locked(self, shapes: dict[str, tuple[int, ...]], again: bool = False) -> None:
        """Make the plan for these shapes current: a kept one, else a new one. `again` (the session fell back
        to its backup) plans anew on the current backends; so does the hand-off of finished tuning."""
        p = self.pipeline
        if p.pending is not None and not p.pending.done:
            await p.pending.settle()
        if again or self._tuning.handoff_due:
            # The kept plans ran on the backup or with untuned choices, or on a failed device. Freeing device
            # memory may wait for the device: off the event loop, as trim below.
            await self._offload(p.forget)
        elif p.recall(shapes):
            self._planned(shapes)
            return
        self._shapes = None
        try:  # planning folds constants and builds kernels: worker-thread work, off the event loop
            await self._offload(p.encode, shapes)
            on_backup = self.fallback_error is not None or await self._tuning.prepare(p)
            try:
                await self._offload(p.alloc, on_backup)
            except BackendError as exc:
                if on_backup or not self._falls_back(exc):
                    raise
                await self._offload(p.alloc, True)
        except BaseException:
            p.segments = []
            raise
        self._planned(shapes)
        await self._offload(p.trim)

    def _planned(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """The plan for these shapes is current: runs now go where it runs (once per plan, not per run)."""
        self._shapes = shapes
        self._run_type = self.backend_types[0]

    def _falls_back(self, exc: BackendError) -> bool:
        """With fallback_on_error, a failure of the main backend moves the session onto the backup for good."""
        p = self.pipeline
        if not self.config.fallback_on_error or p.main is p.backup or exc.backend != str(p.main.type) \
                or self.fallback_error is not None:
            return False
        self.fallback_error = exc
        self._counts.fell_back()
        self._tuning.close()
        p.forget()
        log.warning("%s; the session runs on %s from now on", exc, p.backup.type)
        return True

    async def _offload(self, fn: Any, *args: Any) -> Any:
        fence = offload(self.runtime_info.executor, fn, *args)
        self.pipeline.pending = fence  # a cancelled resize still owns the pipeline until it ends
        try:
            return await fence.wait()
        except BaseException:
            fence.cancel()
            raise


def _own_outputs(outputs: dict[str, Any], feeds: dict[str, np.ndarray]) -> dict[str, Any]:
    """Outputs the caller owns: never a view of a feed, a constant or a planned buffer. An array on memory a
    backend handed over (memory.HandedOver) is the caller's already."""
    def own(v: Any) -> Any:
        if isinstance(v, list):
            return [own(x) for x in v]
        if not isinstance(v, np.ndarray):
            return v
        base: object = v.base  # numpy's stubs say an ndarray; it may be any object that exports the memory
        if base is not None and type(base) is not HandedOver or not v.flags.writeable \
                or any(v is f for f in feeds.values()):
            return v.copy()
        return v

    return {name: own(v) for name, v in outputs.items()}


def _backends(main_rt: "Runtime", backup_rt: "Runtime", config: Any, profile: Profile | None,
              kin: tuple[Any, Any] | None = None) -> tuple[Any, Any]:
    """A new plan's (main, backup) backends; one backend where the backup is the main runtime. With kin (the
    current plan's pair), their siblings: a GPU session's plans share one queue (Backend.sibling)."""
    if kin is None:
        main = main_rt.new_backend(config)
        backup = main if backup_rt is main_rt else backup_rt.new_backend(config)
    else:
        main = kin[0].sibling()
        backup = main if kin[1] is kin[0] else kin[1].sibling()
    if profile is not None:
        main.profile = backup.profile = profile
    return main, backup
