"""The exceptions aiomnn raises. Every one derives from AiomnnError."""


class AiomnnError(Exception):
    """Base class of every error aiomnn raises on purpose."""


class ModelError(AiomnnError):
    """The model is malformed, unsafe or uses something no backend supports."""


class InputError(AiomnnError):
    """A feed is missing, unknown, or has the wrong dtype or shape."""


class BackendError(AiomnnError):
    """A backend failed: device missing, kernel error, out of memory."""


class UnsupportedOpError(ModelError):
    """No backend, not even the CPU backup, can run this node."""
