"""aiomnn: an asyncio-native neural-network inference runtime, built on MNN's design.

Everything public is re-exported here; other modules are private.
"""

from .batching import BatchingSession
from .config import BackendConfig, ForwardType, ScheduleConfig
from .errors import AiomnnError, BackendError, ClosedError, ForkError, InputError, ModelError, UnsupportedOpError
from .interpreter import InputInfo, Interpreter
from .metadata import ModelMetadata, TensorInfo
from .runtime import RuntimeInfo, available_backends, create_runtime
from .session import Session
from .stats import BatchingStats, Durations, SessionStats, TuningEvent

__version__ = "0.1.0"

__all__ = [
    "AiomnnError",
    "BackendConfig",
    "BackendError",
    "BatchingSession",
    "BatchingStats",
    "ClosedError",
    "Durations",
    "ForkError",
    "ForwardType",
    "InputError",
    "InputInfo",
    "Interpreter",
    "ModelError",
    "ModelMetadata",
    "RuntimeInfo",
    "ScheduleConfig",
    "Session",
    "SessionStats",
    "TensorInfo",
    "TuningEvent",
    "UnsupportedOpError",
    "available_backends",
    "create_runtime",
]
