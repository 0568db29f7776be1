"""The exceptions aiomnn raises. Every one derives from AiomnnError."""


class AiomnnError(Exception):
    """Base class of every error aiomnn raises on purpose."""


class ModelError(AiomnnError):
    """The model is malformed, unsafe or uses something no backend supports."""


class InputError(AiomnnError):
    """A feed is missing, unknown, or has the wrong dtype or shape."""


class BackendError(AiomnnError):
    """A backend failed: device missing or lost, driver or kernel error, out of memory.

    `backend` is the forward type ("cuda", "cpu", ...) that failed, where it is known.
    """

    def __init__(self, message: str, backend: str | None = None):
        super().__init__(message)
        self.backend = backend


class UnsupportedOpError(ModelError):
    """No backend, not even the CPU backup, can run this node."""


class ClosedError(AiomnnError):
    """The session or runtime was closed (or collected); create a new one."""


class ForkError(AiomnnError):
    """A runtime made before os.fork() was used in the child, where its device state is not valid.

    Create the runtime (and its sessions) in the child process instead.
    """
