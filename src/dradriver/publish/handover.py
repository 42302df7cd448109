"""Who publishes the node's pool while two instances of the driver run side by side (pure).

During a surge rollout the old and the new pod both keep a SliceController on the same pool.
If both wrote, two versions that render the pool differently would undo each other's writes
for as long as the overlap lasts. So every slice an instance writes carries its marker, the
annotation `<driver>/publisher: "<start time ns>/<instance>"` (instance: the pod UID, "" without
rolling updates). The newest instance owns the pool: an instance that finds a newer instance's
marker on the pool, while that instance is still serving, writes nothing more and leaves the
pool to it; it takes the pool back only if the newer one goes away (a failed rollout).

Markers are written only with writes the pool needs anyway: when both instances agree on the
content nobody writes, and the handover costs no write at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

ANNOTATION_NAME = "publisher"


def annotation_key(driver_name: str) -> str:
    return f"{driver_name}/{ANNOTATION_NAME}"


@dataclass(frozen=True, order=True)
class Marker:
    """One publishing instance; markers order by start time (the instances share the node's clock)."""

    started_ns: int
    instance: str = ""

    def format(self) -> str:
        return f"{self.started_ns}/{self.instance}"

    @classmethod
    def parse(cls, value: object) -> Marker | None:
        if not isinstance(value, str):
            return None
        started, slash, instance = value.partition("/")
        if not slash or not started.isdigit():
            return None
        return cls(int(started), instance)


def marker_of(slice_: dict[str, Any], driver_name: str) -> Marker | None:
    annotations = (slice_.get("metadata") or {}).get("annotations") or {}
    return Marker.parse(annotations.get(annotation_key(driver_name)))


def newest_other(slices: Iterable[dict[str, Any]], driver_name: str, own: Marker) -> Marker | None:
    """The newest marker on `slices` that is newer than `own`, if any."""
    newer = [m for s in slices if (m := marker_of(s, driver_name)) is not None and m > own]
    return max(newer, default=None)


def stamp(body: dict[str, Any], driver_name: str, own: Marker) -> dict[str, Any]:
    """`body` (a slice to create or update) with our marker."""
    metadata = body.setdefault("metadata", {})
    metadata["annotations"] = {
        **(metadata.get("annotations") or {}),
        annotation_key(driver_name): own.format(),
    }
    return body
