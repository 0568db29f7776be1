"""Configuration: which backend a session runs on, and how."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal

from .errors import AiomnnError


class ForwardType(str, enum.Enum):
    """Which backend runs a session (MNN's forward type). AUTO picks the first of AUTO_ORDER that has a real
    GPU here, else the CPU. Configs take the values as strings too ("cuda", case aside)."""

    CPU = "cpu"
    CUDA = "cuda"
    OPENCL = "opencl"
    VULKAN = "vulkan"
    AUTO = "auto"

    @classmethod
    def of(cls, value: "ForwardType | str") -> "ForwardType":
        """A ForwardType or its name as the ForwardType; an AiomnnError naming the choices for anything else."""
        try:
            return cls(value.lower() if isinstance(value, str) else value)
        except ValueError:
            names = ", ".join(t.value for t in cls)
            raise AiomnnError(f"unknown forward type {value!r}; expected one of {names}") from None

    def __str__(self) -> str:
        return self.value


#: AUTO tries these in order; CPU always exists.
AUTO_ORDER = (ForwardType.CUDA, ForwardType.OPENCL, ForwardType.VULKAN, ForwardType.CPU)

Tuning = Literal["none", "fast", "normal", "heavy"]


@dataclass(frozen=True)
class BackendConfig:
    """Per-backend hints, after MNN's BackendConfig.

    precision: "normal" (fp32), "high" (fp32, no fast-math) or "low" (fp16 where supported).
    memory: "low" has Vulkan reuse the smallest freed range that fits (not the one freed longest ago, which lets
        independent dispatches overlap); otherwise a hint kept for parity with MNN.
    power: "high" keeps the CPU workers at normal priority, never yielding their cores; "low" keeps the event
        loop from polling GPU runs (CUDA, OpenCL and Vulkan wake it from their waiter thread instead: an idle loop,
        a run's end reaching the task later by the wake-up); "normal" has the loop poll short runs while a
        core is spare (aiomnn.cores).
    tuning: how many candidates GPU tuning tries ("none" disables tuning).
    device_id: which device of the backend's kind to use.
    memory_limit: refuse a plan whose activations exceed this many bytes.
    """

    precision: Literal["normal", "high", "low"] = "normal"
    memory: Literal["normal", "high", "low"] = "normal"
    power: Literal["normal", "high", "low"] = "normal"
    tuning: Tuning = "normal"
    device_id: int = 0
    memory_limit: int | None = None

    def __post_init__(self) -> None:
        for name, allowed in (("precision", ("normal", "high", "low")), ("memory", ("normal", "high", "low")),
                              ("power", ("normal", "high", "low")), ("tuning", ("none", "fast", "normal", "heavy"))):
            if getattr(self, name) not in allowed:
                raise AiomnnError(f"BackendConfig.{name} must be one of {allowed}, not {getattr(self, name)!r}")


@dataclass(frozen=True)
class ScheduleConfig:
    """How a session is scheduled: main backend, backup backend, threads, tuning and fallback."""

    type: ForwardType | str = ForwardType.AUTO
    backup_type: ForwardType | str = ForwardType.CPU
    num_threads: int | None = None
    backend_config: BackendConfig = field(default_factory=BackendConfig)
    max_tuning_number: int = 64
    background_tuning: bool = True
    #: When the main backend fails (out of memory, device lost, a driver error), rerun on the
    #: backup and stay there, logging why, instead of raising BackendError.
    fallback_on_error: bool = False
    #: Record each run op by op (aiomnn.profile): session.profile, session.write_profile(path).
    profile: bool = False
    #: How many of the latest runs a profile keeps.
    profile_runs: int = 1000

    def __post_init__(self) -> None:
        object.__setattr__(self, "type", ForwardType.of(self.type))
        object.__setattr__(self, "backup_type", ForwardType.of(self.backup_type))
        if self.backup_type is ForwardType.AUTO:
            raise AiomnnError("backup_type cannot be AUTO")
        if self.num_threads is not None and self.num_threads < 1:
            raise AiomnnError(f"num_threads must be at least 1, not {self.num_threads}")
        if self.profile_runs < 1:
            raise AiomnnError(f"profile_runs must be at least 1, not {self.profile_runs}")
