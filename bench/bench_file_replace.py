"""Issue 36: what replacing one of our files costs, by swap (what `files.write` does) and by a
rename over it (what it did), on the filesystems a node writes to.

Run (repository root): `.venv/bin/python -m bench.bench_file_replace [--dir DIR ...] [--writes 3000]`

For each directory (default: /var/tmp, where a checkpoint's disk is, and /dev/shm, a tmpfs as
/var/run/cdi is), `write_atomically` replaces a 3 KB file (a one-claim checkpoint's size) again
and again without fsync, as checkpoint saves and spec writes are, once with the name swap and
once with renameat2 made unavailable (the rename fallback); the two take turns write by write.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import percentile
from dradriver.files import write


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, action="append", help="a directory to write in (repeatable)")
    parser.add_argument("--writes", type=int, default=3000)
    opts = parser.parse_args()
    data = b"x" * 3000
    swap = write._renameat2
    for base in opts.dir or [Path("/var/tmp"), Path("/dev/shm")]:
        directory = Path(tempfile.mkdtemp(prefix="file-replace-", dir=base))
        try:
            samples: dict[str, list[float]] = {"swap": [], "rename": []}
            targets = {way: directory / f"{way}.json" for way in samples}
            for n in range(opts.writes):
                for way in ("swap", "rename") if n % 2 else ("rename", "swap"):
                    write._renameat2 = swap if way == "swap" else None
                    started = time.perf_counter()
                    write.write_atomically(targets[way], data, mode=0o600, durable=False)
                    samples[way].append(time.perf_counter() - started)
        finally:
            write._renameat2 = swap
            shutil.rmtree(directory, ignore_errors=True)
        for way, values in samples.items():
            print(
                f"{base} {way}: p50 {statistics.median(values) * 1e3:.3f} ms, "
                f"p99 {percentile(values, 99) * 1e3:.3f} ms ({len(values)} writes)"
            )


if __name__ == "__main__":
    main()
