"""Keeping a GPU at its working clock speed while tuning times candidates on it (aiomnn.tuning)."""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Callable

log = logging.getLogger("aiomnn.tuning")


class Clocks:
    """Keeps a GPU at its working clock speed while candidates are timed on it.

    A GPU idles at a fraction of its clock speed and raises it only after steady work. An H100 idled at 345 of
    1980 MHz, and under back-to-back timing its clocks stepped up after about 0.15 s and again after 0.6 s.
    Timed cold, det's 96 -> 24 channel conv took 515 us a dispatch, against 92 warm, and the ranking changed
    with it: a kernel bound by memory looks better at low clocks than one bound by arithmetic. So after an
    idle spell a job first times one candidate over and over, in long batches, until its time stops falling.
    CPU devices (lavapipe, PoCL) have no such governor and skip this."""

    WARM_S = 1.0  # at least this long busy,
    SETTLED_S = 0.3  # and until the time has not fallen for this long,
    MOST_S = 3.0  # but no longer than this
    BATCH_S = 0.005  # one warm-up measurement's length
    IDLE_S = 0.5  # untimed this long, the device counts as cold (an H100 was warm after 1 s idle, cold after 2)

    def __init__(self, gpu: bool):
        self.gpu = gpu
        self.last = -math.inf  # when the device was last timed

    def timed(self) -> None:
        """Something was timed on the device just now."""
        self.last = time.monotonic()

    def warm(self, measure: Callable[[Any, int], float], candidate: Any, cancelled: threading.Event) -> None:
        if not self.gpu or time.monotonic() - self.last < self.IDLE_S:
            return
        try:
            self._warm(measure, candidate, cancelled)
        except Exception as exc:  # the candidate loop meets it again, and skips the candidate
            log.debug("warming up failed: %s", exc)

    def _warm(self, measure: Callable[[Any, int], float], candidate: Any, cancelled: threading.Event) -> None:
        one = best = measure(candidate, 1)
        samples = max(1, min(10_000, math.ceil(self.BATCH_S / max(one, 1e-7))))
        start = best_at = time.monotonic()
        while not cancelled.is_set():
            t = measure(candidate, samples)
            now = time.monotonic()
            if t < 0.97 * best:
                best, best_at = t, now
            if now - start >= self.MOST_S or (now - start >= self.WARM_S and now - best_at >= self.SETTLED_S):
                break
        self.timed()
        log.debug("warmed up in %.2f s: %.1f -> %.1f us", self.last - start, one * 1e6, best * 1e6)
