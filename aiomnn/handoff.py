"""A session's side of GPU tuning: MNN's "turn back to cpu", then the hand-off.

When a plan has ops whose GPU settings are not tuned yet (tuning.py), the session runs on its CPU backup while
its runtime's tuning job times them in the background, then re-plans onto the GPU before its next run.
SessionTuning holds one session's part in that: the job it waits for, whether it is on the GPU yet, and the
tuning events its stats report.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Protocol

from .fence import offload
from .stats import TuningEvents
from .tuning import LEVELS, TuneTask, Tuner, TuningJob

if TYPE_CHECKING:
    from .config import ScheduleConfig
    from .pipeline import Pipeline
    from .runtime import Runtime

log = logging.getLogger("aiomnn.tuning")


class TunableRuntime(Protocol):
    """What a GPU runtime provides for the session side (OpenCL, Vulkan and CUDA do).

    - `tuner`: its Tuner; `set_cache_file(path)` forwards to `tuner.set_cache_file`.
    - `tuning_tasks(backend, node, inputs, outputs)`: the op's tunable work, as TuneTasks.
    - `measure(node, inputs, outputs)`: `bool(tuner.pending(tuning_tasks(...)))` (MNN's onMeasure).
    - optionally `compile(backend, ops)`: build what a plan needs; run on a worker thread.
    """

    tuner: Tuner

    def tuning_tasks(self, backend: Any, node: Any, inputs: list[Any], outputs: list[Any]) -> list[TuneTask]: ...


class SessionTuning:
    """One session's tuning state: fall back to the CPU while its ops are tuned, then move to the GPU."""

    def __init__(self, runtime: "Runtime", config: "ScheduleConfig", executor: "Executor"):
        tuner = getattr(runtime, "tuner", None)
        level = config.backend_config.tuning
        self.tuner: Tuner | None = tuner if isinstance(tuner, Tuner) and level != "none" else None
        self.runtime = runtime
        self.level = LEVELS.get(level, LEVELS["normal"])
        self.max_ops = config.max_tuning_number
        self.background = config.background_tuning
        self.executor = executor
        self.job: TuningJob | None = None
        self.failed: BaseException | None = None  # a job that crashed keeps the session on the CPU
        #: The session has run on the GPU: a new shape's untuned ops then run there with their default choices
        #: while they are tuned, instead of sending the session back to the CPU.
        self.on_gpu = False
        self._closed = False
        #: What the session's stats() show of its tuning.
        self.events = TuningEvents()

    @property
    def busy(self) -> bool:
        """Tuning for this session is in flight (has_async_work). Reads, changes nothing: safe from any thread."""
        job = self.job
        return job is not None and not job.done

    @property
    def handoff_due(self) -> bool:
        """The job ended well: the next run re-resizes onto the GPU."""
        self._settle()
        return self.job is not None and self.job.succeeded

    def _settle(self) -> None:
        job = self.job
        if job is not None and job.done and not job.succeeded:
            self._note_end(job)
            self.job = None
            if job.error is not None:
                self.failed = job.error

    def _note_end(self, job: TuningJob) -> None:
        """Note how the job the session waits for ended; "cancelled" where the session leaves it first. Called
        on the job's thread as it ends, and by the session where it sees the end first (events.ended notes once)."""
        if job.done and job.error is not None:
            self.events.ended(job, "failed", f"{type(job.error).__name__}: {job.error}")
        else:
            self.events.ended(job, "finished" if job.succeeded else "cancelled")

    async def prepare(self, pipeline: "Pipeline") -> bool:
        """Called between encode and alloc; True when this plan must run on the CPU backup.

        First the main runtime builds the kernels the plan needs, on a worker thread (a
        cold compile takes seconds), so alloc finds them built and never blocks the loop.
        """
        if self._closed:
            return False
        compile_ = getattr(self.runtime, "compile", None)
        if compile_ is not None and pipeline.main is not pipeline.backup:
            await offload(self.executor, compile_, pipeline.main, list(pipeline.ops())).wait()
        if self.tuner is None:
            return False
        self._settle()
        if self.failed is not None:
            return True
        if self.job is not None:
            if not self.job.done:  # new shapes while tuning: queue their ops too, stay where the session is
                tasks = self._tasks(pipeline)
                if tasks and not self.job.add(tasks, self.level):
                    self._start(tasks)
                return not self.on_gpu
            job, self.job = self.job, None
            self._note_end(job)  # "finished" before "handoff", should the job's thread not have noted it yet
            job.release()
            self.on_gpu = True
            self.events.note("handoff")
            return False  # tuning has ended: this is the hand-off onto the GPU
        tasks = self._tasks(pipeline)
        if not tasks:
            self.on_gpu = True
            return False
        if self.background:
            self._start(tasks)
            if self.on_gpu:  # a new shape of a model already on the GPU: it stays there
                log.info("%d %s op(s) of a new shape need tuning; the session stays on the GPU with their "
                         "default choices meanwhile", len({t.label for t in tasks}), pipeline.main.type)
                return False
            log.info("%d %s op(s) need tuning; running on the CPU meanwhile (turn back to cpu)",
                     len({t.label for t in tasks}), pipeline.main.type)
            return True
        cancelled = threading.Event()
        self.events.note("started")
        fence = offload(self.executor, self.tuner.run_now, tasks, self.level, cancelled)
        try:
            await fence.wait()
        except BaseException as exc:
            cancelled.set()
            fence.cancel()
            if isinstance(exc, Exception):
                self.events.note("failed", f"{type(exc).__name__}: {exc}")
            else:
                self.events.note("cancelled")
            raise
        self.events.note("finished")
        return False

    def _start(self, tasks: list[TuneTask]) -> None:
        assert self.tuner is not None
        previous, self.job = self.job, None
        if previous is not None:  # it ended as these tasks came: the session follows the job that takes them
            self.events.follow(None)
            previous.release()
        job = self.job = self.tuner.start(tasks, self.level)
        if previous is None:
            self.events.note("started")
        self.events.follow(job)
        if not job.on_end(self._note_end):
            self._note_end(job)

    def _tasks(self, pipeline: "Pipeline") -> list[TuneTask]:
        """The tasks of the max_tuning_number ops that need tuning and cost the most (each op as its costliest
        task; in graph order among equal costs, and where tasks carry no cost), in graph order. The other ops
        keep their first (default) candidate, recorded in the cache, so a warm cache needs no tuning at all.

        Taken in graph order, the cap left det's heaviest convs, at its end, at their defaults: on Vulkan 120 of
        its ops have tunable launches (46 of them elementwise), and YOLOv8n's detection head's convs likewise."""
        assert self.tuner is not None
        ops: list[list[TuneTask]] = []
        seen: set[str] = set()
        make = self.runtime.tuning_tasks  # type: ignore[attr-defined]
        for node, ins, outs in pipeline.measure(len(pipeline.graph.nodes)):
            new = [t for t in self.tuner.pending(make(pipeline.main, node, ins, outs)) if t.key not in seen]
            seen.update(t.key for t in new)
            if new:
                ops.append(new)
        by_cost = sorted(range(len(ops)), key=lambda i: -max(getattr(t, "cost", 0) for t in ops[i]))
        tuned = set(by_cost[:self.max_ops])
        tasks: list[TuneTask] = []
        for i, new in enumerate(ops):
            if i in tuned:
                tasks.extend(new)
            else:
                for t in new:
                    self.tuner.cache.put(t.key, t.candidates(1)[0], None)
        return tasks

    async def wait(self) -> None:
        """Until this session's tuning has ended (however it ended)."""
        job = self.job
        if job is None:
            return
        fence = job.waiter()
        if fence is not None:
            await fence.settle()
        self._settle()

    def close(self) -> None:
        """The session is closing: stop waiting for the job, which is cancelled if nobody else waits."""
        self._closed = True
        job, self.job = self.job, None
        if job is not None:
            self._note_end(job)
            job.release()
