"""How runtimes and sessions give back what they hold: once, whichever of these comes first.

* close(): the owner calls `release_now` on its finalizer.
* Collection: `own`'s finalizer hands the release to a reaper thread, never running it inside the garbage
  collector, which may strike on any thread while it holds a lock the release needs.
* Exit: sessions first, then runtimes, newest first, before the device libraries' own exit hooks run.

A child made by os.fork() releases nothing of its parent's: each runtime is told (`after_fork_in_child`), and
the reaper's queue starts empty.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import queue
import threading
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeAlias, TypeVar

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger("aiomnn")

T = TypeVar("T")
#: What `own` returns: a finalizer of any object.
Finalizer: TypeAlias = "weakref.finalize[..., Any]"


def own(obj: Any, release: Callable[..., Any], *args: Any, warn: str | None = None) -> Finalizer:
    """A finalizer that calls release(*args) once obj is collected, with a ResourceWarning `warn` if given.

    The release runs on the reaper thread, never inside the garbage collector: a collection may happen on
    any thread (a worker, the Vulkan waiter, a tuning thread) while it holds a lock the release needs, or be
    the very thread that the release would join. Not at exit: the exit hook closes everything in order.
    """
    _start_reaper()
    f = weakref.finalize(obj, _collected, warn, release, args)
    f.atexit = False
    return f


def release_now(f: Finalizer) -> None:
    """Run a finalizer's release now, on this thread, once (and without its warning)."""
    got = f.detach()
    if got is not None:
        _, _, (_, release, args), _ = got
        release(*args)


def _collected(warn: str | None, release: Callable[..., Any], args: tuple[Any, ...]) -> None:
    _REAP.put((release, args))  # SimpleQueue.put is safe inside a weakref callback
    if warn is not None:  # after: under a filter that makes warnings errors, the release still happens
        warnings.warn(warn, ResourceWarning, stacklevel=2)


_Release: TypeAlias = "tuple[Callable[..., Any], tuple[Any, ...]]"
_REAP: "queue.SimpleQueue[_Release | None]" = queue.SimpleQueue()
_reaper: tuple[int, threading.Thread] | None = None  # (pid, thread)
_reaper_lock = threading.Lock()


def _start_reaper() -> None:
    """Start the thread that releases what was collected (once per process; called from ordinary code only)."""
    global _reaper
    if _reaper is not None and _reaper[0] == os.getpid():
        return
    with _reaper_lock:
        if _reaper is None or _reaper[0] != os.getpid():
            t = threading.Thread(target=_reap, args=(_REAP,), name="aiomnn-reaper", daemon=True)
            t.start()
            _reaper = (os.getpid(), t)


def _reap(q: "queue.SimpleQueue[_Release | None]") -> None:
    while (item := q.get()) is not None:
        _release_one(item)
        item = None


def _release_one(item: _Release) -> None:
    release, args = item
    try:
        release(*args)
    except Exception as exc:  # noqa: BLE001  (nobody to hand it to)
        log.warning("releasing a collected aiomnn object failed: %s: %s", type(exc).__name__, exc)


def _drain_reaper() -> None:
    """Stop the reaper after what it holds, then release what is left here."""
    global _reaper
    found, _reaper = _reaper, None
    if found is not None and found[0] == os.getpid():
        _REAP.put(None)
        found[1].join(timeout=30)
    while True:
        try:
            item = _REAP.get_nowait()
        except queue.Empty:
            return
        if item is not None:
            _release_one(item)


class Live(Generic[T]):
    """Objects still open, held weakly, in the order they were made: what closes at exit, newest first."""

    def __init__(self) -> None:
        self._objects: weakref.WeakValueDictionary[int, T] = weakref.WeakValueDictionary()
        self._order = itertools.count()

    def add(self, obj: T) -> int:
        """Keep obj; returns its key, for discard()."""
        key = next(self._order)
        self._objects[key] = obj
        return key

    def discard(self, key: int) -> None:
        self._objects.pop(key, None)

    def newest_first(self) -> list[T]:
        found = (self._objects.get(key) for key in sorted(self._objects.keys(), reverse=True))
        return [obj for obj in found if obj is not None]


#: Live runtimes, and what closes first at exit (sessions register here).
_RUNTIMES: Live[Runtime] = Live()
_EXIT_FIRST: list[Callable[[], None]] = []


def track(rt: Runtime) -> None:
    """A new runtime: closed at exit (after the sessions, newest first) and told when this process forks."""
    _RUNTIMES.add(rt)


def close_first_at_exit(hook: Callable[[], None]) -> None:
    """hook() runs at exit before any runtime closes: the sessions' own closing goes here."""
    _EXIT_FIRST.append(hook)


def _close_all_at_exit() -> None:
    """Close what is still open before the interpreter tears down: sessions first, then runtimes, newest first.

    Device libraries' threads (pyopencl callbacks, the Vulkan waiter) must have ended by then: a thread that
    reaches the interpreter during its teardown is killed, and a C++ one aborts the process.
    """
    _drain_reaper()
    for hook in list(_EXIT_FIRST):
        try:
            hook()
        except Exception as exc:  # noqa: BLE001  (exit must go on)
            log.debug("closing at exit failed: %s: %s", type(exc).__name__, exc)
    for rt in _RUNTIMES.newest_first():
        try:
            rt.close()
        except Exception as exc:  # noqa: BLE001
            log.warning("closing the %s runtime at exit failed: %s: %s", rt.type, type(exc).__name__, exc)
    _drain_reaper()


def exit_hook_last() -> None:
    """(Re-)register the exit hook so that it runs before the exit hooks of device libraries imported since."""
    atexit.unregister(_close_all_at_exit)
    atexit.register(_close_all_at_exit)


def _after_fork_in_child() -> None:
    global _REAP, _reaper, _reaper_lock
    _REAP, _reaper, _reaper_lock = queue.SimpleQueue(), None, threading.Lock()  # the parent's pending releases are the parent's
    for rt in _RUNTIMES.newest_first():
        try:
            rt.after_fork_in_child()
        except Exception:  # noqa: BLE001  (never break the child)
            pass


exit_hook_last()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
