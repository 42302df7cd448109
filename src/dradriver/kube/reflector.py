"""List, then watch from the list's resourceVersion, until stopped: the loop behind each view of
API objects dradriver keeps (its own ResourceSlices, this node's ResourceClaims).

The watch resumes from the last resourceVersion it saw; an expired one (410 Gone) lists again;
other failures back off (jittered, exponential) and never end the loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dradriver.kube.client import WatchEvent, WatchStream
from dradriver.kube.errors import GoneError, KubeError
from dradriver.kube.retry import Backoff

Json = dict[str, Any]


def _ignore(_: bool) -> None:
    """No one to tell whether the watch is open."""


def _go() -> None:
    """Nothing to wait for."""


@dataclass(kw_only=True, eq=False)
class Reflector:
    """`list_objects` returns the items and the list's resourceVersion; `on_list` gets every
    (re)list, `on_event` every event but bookmarks; `what` names the objects in the log;
    `before_list` and `before_watch` may hold the loop back (e.g. until other requests are done,
    so that all go over one connection)."""

    what: str
    list_objects: Callable[[], tuple[list[Json], str]]
    watch: Callable[[str], WatchStream]
    on_list: Callable[[list[Json]], None]
    on_event: Callable[[WatchEvent], None]
    backoff: Backoff
    log: Any
    on_watching: Callable[[bool], None] = _ignore
    before_list: Callable[[], object] = _go
    before_watch: Callable[[], object] = _go
    _stream: WatchStream | None = field(default=None, init=False, repr=False)

    def run(self, stop: threading.Event) -> None:
        resource_version: str | None = None
        failures = 0
        while not stop.is_set():
            try:
                if resource_version is None:
                    self.before_list()
                    if stop.is_set():
                        break
                    items, resource_version = self.list_objects()
                    self.on_list(items)
                self.before_watch()
                if stop.is_set():
                    break
                stream = self.watch(resource_version)
                self._stream = stream
                self.on_watching(True)
                if stop.is_set():
                    stream.close()
                opened, events = time.monotonic(), 0
                for event in stream:
                    failures, events = 0, events + 1
                    resource_version = str(
                        event.object.get("metadata", {}).get("resourceVersion") or resource_version
                    )
                    if event.type != "BOOKMARK":
                        self.on_event(event)
                if not events and time.monotonic() - opened < 1.0 and not stop.is_set():
                    # Something in between accepts and hangs up at once: do not spin.
                    failures += 1
                    stop.wait(self.backoff.delay(failures - 1))
            except GoneError:
                self.log.info("watch resourceVersion expired, listing again", objects=self.what)
                resource_version = None
                continue
            except KubeError as err:
                failures += 1
                self.on_watching(False)
                delay = self.backoff.delay(failures - 1)
                self.log.warning(f"watching {self.what} failed", error=str(err), retry_in=round(delay, 2))
                stop.wait(delay)
                continue
            except Exception:  # keep the daemon alive whatever happens; the next round starts afresh
                failures += 1
                self.log.exception(f"unexpected error in the {self.what} watch")
                resource_version = None
                stop.wait(self.backoff.delay(failures - 1))
                continue
            finally:
                self._stream = None
                self.on_watching(False)

    def close(self) -> None:
        """End the watch in progress (from any thread), e.g. so that `run` sees its stop event."""
        stream = self._stream
        if stream is not None:
            stream.close()
