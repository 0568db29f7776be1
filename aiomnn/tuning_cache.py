"""The tuning cache: results by device and key, in a JSON file (never pickle).

A file may hold several devices' results, and several runtimes or processes may
share it: a save reads the file again under a lock file and merges, so none of
them loses another's entries, and writes it atomically (a temporary file, then
os.replace), readable by its owner only. A file that is not ours, or damaged,
is ignored with a warning and rewritten.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
import threading
from typing import Any, Iterator

try:
    import fcntl
except ImportError:  # not on Windows: saves there are atomic but not merged under a lock
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("aiomnn.tuning")

SCHEMA = "aiomnn-tuning-cache"
VERSION = 1


class TuningCache:
    """Tuning results of one device, by key; other devices' entries in the file are kept as they were."""

    def __init__(self, device: str):
        self.device = device
        self.path: str | None = None
        self._lock = threading.Lock()
        self._entries: dict[str, dict[str, Any]] = {}
        self._others: dict[str, Any] = {}  # entries of other devices, written back untouched
        self._dirty = False

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            return self._entries.get(key)

    def put(self, key: str, choice: Any, seconds: float | None) -> None:
        entry = {"choice": choice, "us": None if seconds is None else round(seconds * 1e6, 3)}
        with self._lock:
            self._entries[key] = entry
            self._dirty = True

    def load(self, path: str) -> None:
        """Use `path` from now on, and take its entries for this device; a bad file is ignored with a warning."""
        with self._lock:
            self.path = path
            self._others = {}
            try:
                with open(path, "rb") as f:
                    data = f.read(64 << 20)
            except FileNotFoundError:
                log.info("tuning cache %s does not exist yet; it is written when tuning ends", path)
                return
            except OSError as exc:
                log.warning("cannot read the tuning cache %s (%s); ignoring it", path, exc)
                self._dirty = True
                return
            try:
                devices = _parse(data)
            except ValueError as exc:
                log.warning("ignoring the tuning cache %s: %s; it will be rewritten", path, exc)
                self._dirty = True
                return
            mine = devices.pop(self.device, {})
            self._others = devices
            self._entries.update(mine)
            log.info("tuning cache %s: %d entries for %s", path, len(mine), self.device)

    def save(self) -> None:
        """Merge this device's entries into the file and write it atomically (a temporary file, then
        os.replace), readable by its owner only.

        The file is read again under a lock file, so that runtimes or processes sharing it lose none of
        each other's entries: the file's own are kept and this cache's win where both have a key.
        """
        with self._lock:
            if self.path is None or not self._dirty:
                return
            mine = dict(self._entries)
            others = dict(self._others)
            path = self.path
            self._dirty = False
        try:
            with _locked(path):
                try:
                    with open(path, "rb") as f:
                        devices = _parse(f.read(64 << 20))
                except (OSError, ValueError):  # absent, unreadable or not ours: rewritten from memory
                    devices = others
                devices[self.device] = {**devices.get(self.device, {}), **mine}
                text = json.dumps({"schema": SCHEMA, "version": VERSION, "devices": devices}, indent=1,
                                  sort_keys=True)
                _write_atomically(path, text)
        except OSError as exc:
            log.warning("cannot write the tuning cache %s: %s", path, exc)
            with self._lock:
                self._dirty = True
            return
        log.info("tuning cache written to %s", path)


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """Hold an exclusive lock on `path`.lock (where the platform has flock) while the block runs."""
    if fcntl is None:
        yield
        return
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _write_atomically(path: str, text: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tuning-", suffix=".tmp", dir=folder)  # mode 0o600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _parse(data: bytes) -> dict[str, dict[str, dict[str, Any]]]:
    """The entries of a cache file, by device; ValueError when it is not one of ours."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema != SCHEMA:
        raise ValueError(f"not an aiomnn tuning cache (schema {schema!r})")
    if doc.get("version") != VERSION:
        raise ValueError(f"version {doc.get('version')!r}, this aiomnn writes version {VERSION}")
    devices = doc.get("devices")
    if not isinstance(devices, dict):
        raise ValueError("it has no 'devices' table")
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for device, entries in devices.items():
        if not isinstance(entries, dict):
            raise ValueError(f"the entries of {device!r} are not a table")
        good = {}
        for key, entry in entries.items():
            if not isinstance(entry, dict) or "choice" not in entry or not _is_number_or_none(entry.get("us")):
                raise ValueError(f"entry {key!r} of {device!r} is malformed")
            good[key] = {"choice": entry["choice"], "us": entry.get("us")}
        out[device] = good
    return out


def _is_number_or_none(v: Any) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
