"""A Go program's heap profile in the text form its net/http/pprof handler writes with `debug=1`,
summed by allocation site (pure: text in, figures out).

The text holds one record per sampled allocation stack, "in-use objects: in-use bytes [allocated
objects: allocated bytes] @ addresses", then its frames ("#<tab>address<tab>function+offset<tab>
file:line", the allocating frame first), and at the end the runtime.MemStats of the moment
("# HeapAlloc = 123"). The counts are of samples: the runtime records one allocation per
MemProfileRate bytes on average (the header says "heap/<2 x rate>"), so each record is scaled as
`go tool pprof` scales it, by 1 / (1 - exp(-average size / rate)).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

HEADER = re.compile(r"^heap profile: \d+: \d+ \[\d+: \d+\] @ heap/(\d+)$")
RECORD = re.compile(r"^(\d+): (\d+) \[\d+: \d+\] @")
FRAME = re.compile(r"^#\t0x[0-9a-f]+\t(\S+?)(?:\+0x[0-9a-f]+)?\t")
#: `# Name = N`, or `# Name = IN_USE / SYS` (Stack, MSpan, MCache: the second kept as NameSys).
MEMSTAT = re.compile(r"^# (\w+) = (\d+)(?: / (\d+))?")
#: Packages whose functions allocate on behalf of their caller: a site is the first frame outside them.
HELPERS = re.compile(
    r"^(runtime|internal/.*|reflect|unique|weak|sync|sync/atomic|bytes|strings|bufio|strconv|fmt|io|"
    r"errors|context|sort|slices|maps|encoding/.*|compress/.*|container/.*|math/.*|unicode/.*)$"
)


@dataclass(frozen=True)
class Record:
    """One allocation stack's objects and bytes in use, estimated from the samples."""

    objects: float
    bytes: float
    #: Function names, the allocating one first.
    frames: tuple[str, ...]


@dataclass(frozen=True)
class HeapProfile:
    records: tuple[Record, ...]
    #: runtime.MemStats (the integer ones) when the profile was written: HeapAlloc, HeapInuse, ...
    memstats: dict[str, int]
    #: The runtime's MemProfileRate: one sample per this many bytes allocated, on average.
    rate: int


class ProfileError(ValueError):
    """The text is not a Go heap profile written with debug=1."""


def scaled(objects: int, size: int, rate: int) -> tuple[float, float]:
    """A record's sampled counts scaled to an estimate of the real ones (pprof's scaleHeapSample)."""
    if objects == 0 or size == 0:
        return 0.0, 0.0
    if rate <= 1:
        return float(objects), float(size)
    scale = 1 / (1 - math.exp(-size / objects / rate))
    return objects * scale, size * scale


def parse_heap_profile(text: str) -> HeapProfile:
    lines = text.splitlines()
    header = HEADER.match(lines[0]) if lines else None
    if header is None:
        raise ProfileError(f"not a debug=1 heap profile: first line {lines[0] if lines else ''!r}")
    rate = int(header.group(1)) // 2
    records: list[Record] = []
    memstats: dict[str, int] = {}
    counts: tuple[int, int] | None = None
    frames: list[str] = []

    def close_record() -> None:
        if counts is not None:
            objects, size = scaled(*counts, rate)
            records.append(Record(objects, size, tuple(frames)))

    for line in lines[1:]:
        if (record := RECORD.match(line)) is not None:
            close_record()
            counts, frames = (int(record.group(1)), int(record.group(2))), []
        elif (frame := FRAME.match(line)) is not None:
            frames.append(frame.group(1))
        elif (stat := MEMSTAT.match(line)) is not None:
            memstats[stat.group(1)] = int(stat.group(2))
            if stat.group(3) is not None:
                memstats[f"{stat.group(1)}Sys"] = int(stat.group(3))
    close_record()
    return HeapProfile(tuple(records), memstats, rate)


def package(function: str) -> str:
    """The import path of a symbolised Go function ("k8s.io/x/y.(*T).M" -> "k8s.io/x/y")."""
    directory, _, last = function.rpartition("/")
    name = last.split(".", 1)[0]
    return f"{directory}/{name}" if directory else name


def allocation_site(frames: tuple[str, ...]) -> str:
    """The first frame outside the runtime and the generic helpers (bufio, bytes, encoding/json,
    reflect, ...): the code that asked for the memory."""
    for function in frames:
        if not HELPERS.match(package(function)):
            return function
    return frames[-1] if frames else "(no stack)"


def bytes_by(profile: HeapProfile, key: Callable[[Record], str]) -> dict[str, float]:
    """Estimated bytes in use, summed by key(record)."""
    sums: dict[str, float] = {}
    for record in profile.records:
        name = key(record)
        sums[name] = sums.get(name, 0.0) + record.bytes
    return sums


def bytes_by_site(profile: HeapProfile) -> dict[str, float]:
    """Estimated bytes in use per allocation site."""
    return bytes_by(profile, lambda record: allocation_site(record.frames))
