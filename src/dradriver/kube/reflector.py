"""List, then watch from the list's resourceVersion, until stopped: the loop behind each view of
API objects dradriver keeps (its own ResourceSlices, this node's ResourceClaims).

The watch resumes from the last resourceVersion it saw; an expired one (410 Gone) lists again;
other failures back off (jittered, exponential) and never end the loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from dradriver.kube.client import WatchEvent, WatchStream
from dradriver.kube.errors import GoneError, KubeError
from dradriver.kube.retry import Backoff

Json = dict[str, Any]


def _ignore(_: bool) -> None:
    """No one to tell whether the watch is open."""


class Reflector:
    def __init__(
        self,
        *,
        what: str,
        list_objects: Callable[[], tuple[list[Json], str]],
        watch: Callable[[str], WatchStream],
        on_list: Callable[[list[Json]], None],
        on_event: Callable[[WatchEvent], None],
        backoff: Backoff,
        log: Any,
        on_watching: Callable[[bool], None] = _ignore,
    ) -> None:
        """`list_objects` returns the items and the list's resourceVersion; `on_list` gets every
        (re)list, `on_event` every event but bookmarks; `what` names the objects in the log."""
        self._what = what
        self._list = list_objects
        self._watch = watch
        self._on_list = on_list
        self._on_event = on_event
        self._on_watching = on_watching
        self._backoff = backoff
        self._log = log
        self._stream: WatchStream | None = None

    def run(self, stop: threading.Event) -> None:
        resource_version: str | None = None
        failures = 0
        while not stop.is_set():
            try:
                if resource_version is None:
                    items, resource_version = self._list()
                    self._on_list(items)
                stream = self._watch(resource_version)
                self._stream = stream
                self._on_watching(True)
                if stop.is_set():
                    stream.close()
                opened, events = time.monotonic(), 0
                for event in stream:
                    failures, events = 0, events + 1
                    resource_version = str(
                        event.object.get("metadata", {}).get("resourceVersion") or resource_version
                    )
                    if event.type != "BOOKMARK":
                        self._on_event(event)
                if not events and time.monotonic() - opened < 1.0 and not stop.is_set():
                    # Something in between accepts and hangs up at once: do not spin.
                    failures += 1
                    stop.wait(self._backoff.delay(failures - 1))
            except GoneError:
                self._log.info("watch resourceVersion expired, listing again", objects=self._what)
                resource_version = None
                continue
            except KubeError as err:
                failures += 1
                self._on_watching(False)
                delay = self._backoff.delay(failures - 1)
                self._log.warning(f"watching {self._what} failed", error=str(err), retry_in=round(delay, 2))
                stop.wait(delay)
                continue
            except Exception:  # keep the daemon alive whatever happens; the next round starts afresh
                failures += 1
                self._log.exception(f"unexpected error in the {self._what} watch")
                resource_version = None
                stop.wait(self._backoff.delay(failures - 1))
                continue
            finally:
                self._stream = None
                self._on_watching(False)

    def close(self) -> None:
        """End the watch in progress (from any thread), e.g. so that `run` sees its stop event."""
        stream = self._stream
        if stream is not None:
            stream.close()
