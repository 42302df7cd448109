"""The controller's view of our ResourceSlices: filled by list+watch, and by our own writes.

Writing results through (like client-go's mutation cache) means a sync that runs before the
watch has echoed our create does not create the slice a second time, and the echo itself is
recognised (same resourceVersion) and does not trigger another sync.

The watch sends metadata alone (`PartialObjectMetadata`): a change it reports is kept as a stub
(no `spec`, `is_stub`) until the reconciler fetches it (`fill`), or our own write's result, with
that resourceVersion, replaces it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

Json = dict[str, Any]

#: How long a slice we deleted stays remembered, so a late event cannot resurrect it.
TOMBSTONE_TTL_S = 60.0


def rv_newer(candidate: str, current: str) -> bool:
    """Whether resourceVersion `candidate` is newer than `current`. They are opaque strings in
    the API contract but etcd revisions in practice; anything else counts as newer."""
    if candidate.isdigit() and current.isdigit():
        return int(candidate) > int(current)
    return candidate != current


class SliceCache:
    """Slices by name; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slices: dict[str, Json] = {}
        self._tombstones: dict[str, float] = {}  # uid -> monotonic time of our delete

    def replace(self, items: Iterable[Json]) -> None:
        """A fresh list: forget everything else."""
        with self._lock:
            self._slices = {_name(s): s for s in items}
            self._tombstones.clear()

    def snapshot(self) -> list[Json]:
        with self._lock:
            return list(self._slices.values())

    def apply_event(self, kind: str, obj: Json) -> bool:
        """Apply a watch event; True if our view changed (so a sync is due)."""
        name, uid, rv = _name(obj), _uid(obj), _rv(obj)
        with self._lock:
            self._expire_tombstones()
            current = self._slices.get(name)
            if kind == "DELETED":
                self._tombstones.pop(uid, None)
                if current is None or _uid(current) != uid:
                    return False
                del self._slices[name]
                return True
            if uid in self._tombstones:
                return False
            if current is not None and _uid(current) == uid and not rv_newer(rv, _rv(current)):
                return False
            self._slices[name] = obj
            return True

    def record_write(self, stored: Json) -> None:
        """Our create or update succeeded with this stored object (or a fetch found it)."""
        with self._lock:
            current = self._slices.get(_name(stored))
            if (
                current is None
                or _uid(current) != _uid(stored)
                or rv_newer(_rv(stored), _rv(current))
                or (is_stub(current) and not rv_newer(_rv(current), _rv(stored)))
            ):
                self._slices[_name(stored)] = stored

    def fill(self, name: str, fetched: Json | None) -> None:
        """What a GET of a stub's name found (None: not found)."""
        if fetched is not None:
            self.record_write(fetched)
            return
        with self._lock:
            current = self._slices.get(name)
            if current is not None and is_stub(current):
                del self._slices[name]

    def record_delete(self, name: str, uid: str) -> None:
        """Our delete succeeded (or the slice was already gone)."""
        with self._lock:
            current = self._slices.get(name)
            if current is not None and _uid(current) == uid:
                del self._slices[name]
            self._tombstones[uid] = time.monotonic()

    def _expire_tombstones(self) -> None:
        cutoff = time.monotonic() - TOMBSTONE_TTL_S
        for uid in [u for u, t in self._tombstones.items() if t < cutoff]:
            del self._tombstones[uid]


def is_stub(obj: Json) -> bool:
    """Metadata without content: every ResourceSlice has a spec."""
    return "spec" not in obj


def _meta(obj: Json) -> Json:
    meta: Json = obj.get("metadata") or {}
    return meta


def _name(obj: Json) -> str:
    return str(_meta(obj).get("name", ""))


def _uid(obj: Json) -> str:
    return str(_meta(obj).get("uid", ""))


def _rv(obj: Json) -> str:
    return str(_meta(obj).get("resourceVersion", ""))
