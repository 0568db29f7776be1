"""What a session holds and how it lets go of it: once, by close(), when it is collected, or at exit.

A session's finalizer (lifetime.own) must not refer back to the session, or the session would never be
collected: what it must release (its tuning, its plan's memory, a runtime it made for itself) is gathered in
SessionParts, which refers to none of it. Live sessions are kept here, weakly, so that at exit they close
before their runtimes do.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from .handoff import SessionTuning
from .lifetime import Live, close_first_at_exit
from .pipeline import Pipeline
from .runtime import RuntimeInfo

if TYPE_CHECKING:
    from .session import Session

log = logging.getLogger("aiomnn")


class SessionParts:
    """What a session holds that must be let go: its tuning, its plan's memory, and a runtime it made."""

    def __init__(self, pipeline: Pipeline, tuning: SessionTuning, owned: RuntimeInfo | None):
        self.pipeline, self.tuning, self.owned = pipeline, tuning, owned

    def release(self, wait: bool = True) -> None:
        """Let go (a collected session's parts go on the reaper thread); with `wait`, first wait (blocking)
        for a cancelled run that still uses the buffers on a worker or the device, else leave its buffers to
        the garbage collector."""
        self.tuning.close()
        pending = self.pipeline.pending
        deadline = time.monotonic() + (30 if wait else 0)
        while pending is not None and not pending.done and time.monotonic() < deadline:
            time.sleep(0.005)
        if pending is None or pending.done:
            for b in self.pipeline.all_backends:
                try:
                    b.clear_buffers()
                except Exception as exc:  # noqa: BLE001  (a closed or lost device: its memory is gone anyway)
                    log.debug("clearing %s buffers failed: %s", b.type, exc)
        if self.owned is not None:
            self.owned.release()


#: Live sessions, closed before their runtimes at exit (quietly: exiting is not leaking).
_SESSIONS: Live[Session] = Live()


def track(session: Session) -> int:
    """A new session, to close at exit; returns its serial, for `untrack` once it is closed."""
    return _SESSIONS.add(session)


def untrack(serial: int) -> None:
    """A session closed (or never handed out): nothing to close at exit."""
    _SESSIONS.discard(serial)


def _close_sessions_at_exit() -> None:
    for s in _SESSIONS.newest_first():
        s._close_at_exit()


close_first_at_exit(_close_sessions_at_exit)
