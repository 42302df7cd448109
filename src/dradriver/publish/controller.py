"""Keeps this node's ResourceSlices in the API server equal to what the driver renders.

Two threads: a watcher (one list, then one long watch, scoped by field selectors to our driver
and node) that keeps a cache of our slices, and a reconciler that turns cache + desired slices
into writes with `reconcile.plan_pool`. Any change the watch reports (kubelet's wipe, a foreign
edit) triggers a sync after a short debounce; our own writes are recognised and do not. The
watch carries metadata alone, so the API server keeps no encoding of our slices' content for it;
the reconciler GETs a slice that someone else changed before planning against it. At start the
two threads take turns (GET the Node, LIST, the first sync's writes, then the watch), so that a
starting node opens one connection to the API server, not two.

Slices are left in place when the controller stops: a restarted driver adopts them without a
write, and when a driver goes away for good the kubelet deletes its slices 30 s after it
disconnects. `delete_node_slices` removes them explicitly.

With a `marker`, two instances (a surge rollout) share the pool as `handover` describes: the
newest one writes, an older one stands by.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from dradriver.kube.client import KubeClient, WatchEvent
from dradriver.kube.errors import ConflictError, KubeError, NotFoundError
from dradriver.kube.events import NODE_EVENTS_NAMESPACE, node_event
from dradriver.kube.reflector import Reflector
from dradriver.kube.retry import Backoff
from dradriver.logs import get_logger
from dradriver.publish.cache import SliceCache, is_stub
from dradriver.publish.handover import Marker, newest_other, stamp
from dradriver.publish.reconcile import (
    Plan,
    content,
    contents_equal,
    fingerprint,
    plan_pool,
)
from dradriver.slices import InvalidSlicesError
from dradriver.slices.compare import dropped_gates

Json = dict[str, Any]

#: Watch events arrive in bursts (the kubelet deletes all slices at once): wait this long
#: after the first one before syncing.
DEFAULT_DEBOUNCE_S = 0.3
#: While a newer instance owns the pool, how often to check that it is still there.
HANDOVER_RECHECK_S = 2.0
#: Rounds of fetching what the watch reported changed before a sync gives up and retries later.
FETCH_ROUNDS = 3


@dataclass(frozen=True)
class WriteCounts:
    creates: int = 0
    updates: int = 0
    deletes: int = 0

    @property
    def total(self) -> int:
        return self.creates + self.updates + self.deletes


@dataclass(frozen=True)
class PublishStatus:
    """What readiness and `dradriver status` show."""

    #: The desired pool has been in the API server at least once since start.
    published: bool = False
    #: The last sync found (or left) the API server equal to the desired pool.
    in_sync: bool = False
    watching: bool = False
    generation: int | None = None
    slices: int = 0
    last_error: str | None = None
    last_sync: datetime | None = None
    #: Feature gates the API server seems to have off (it dropped their fields from our slices).
    dropped_features: tuple[str, ...] = ()
    #: Reports that are not failures: publishing goes on (e.g. which fields were dropped).
    warnings: tuple[str, ...] = ()
    writes: WriteCounts = field(default_factory=WriteCounts)
    #: The newer instance that owns the pool now (we write nothing meanwhile), if any.
    superseded_by: str | None = None


def field_selector(driver_name: str, node_name: str) -> str:
    return f"spec.driver={driver_name},spec.nodeName={node_name}"


def delete_node_slices(client: KubeClient, *, driver_name: str, node_name: str) -> int:
    """Delete all of this driver's slices on `node_name`; returns how many were deleted."""
    slices = client.list_resource_slices(field_selector(driver_name, node_name)).get("items", [])
    deleted = 0
    for slice_ in slices:
        meta = slice_["metadata"]
        try:
            client.delete_resource_slice(
                meta["name"], uid=meta.get("uid"), resource_version=meta.get("resourceVersion")
            )
            deleted += 1
        except NotFoundError:
            pass
    return deleted


@dataclass(eq=False)
class SliceController:
    """Publishes `desired()` as this node's pool and keeps it that way (see module docstring).

    `desired()` returns full ResourceSlice objects in priority order (as `render_node_slices` makes
    them); the controller owns their names, owner reference and pool generation.
    """

    client: KubeClient
    _: KW_ONLY
    driver_name: str
    node_name: str
    desired: Callable[[], list[Json]]
    debounce: float = DEFAULT_DEBOUNCE_S
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.2, cap=5.0))
    events: bool = True
    marker: Marker | None = None
    instance_alive: Callable[[str], bool] = lambda _instance: False

    def __post_init__(self) -> None:
        self._log = get_logger(component="publish", driver=self.driver_name, node=self.node_name)
        self._selector = field_selector(self.driver_name, self.node_name)
        self._owner: Marker | None = None  # reconciler thread only: the newer instance we yield to

        self._cache = SliceCache()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._listed = threading.Event()
        # The start's turns (module docstring); both are set by stop() too.
        self._node_known = threading.Event()
        self._first_pass = threading.Event()
        self._reflector = Reflector(
            what="ResourceSlices",
            list_objects=self._listed_slices,
            watch=lambda rv: self.client.watch_resource_slices(self._selector, rv, metadata_only=True),
            on_list=self._on_list,
            on_event=self._on_event,
            on_watching=lambda watching: self._set_status(watching=watching),
            before_list=self._node_known.wait,
            before_watch=self._first_pass.wait,
            backoff=self.backoff,
            log=self._log,
        )
        self._threads: list[threading.Thread] = []
        # Guarded by _cond:
        self._status = PublishStatus()
        self._due: float | None = None  # monotonic time of the next sync
        self._requested = 0  # bumped by start() and resync()
        self._completed = 0  # the request number the last in-sync pass served
        # Reconciler thread only:
        self._node_uid: str | None = None
        self._stored_forms: dict[int, tuple[str, Json]] = {}  # index -> (desired fingerprint, stored content)
        self._reported: set[tuple[int, tuple[str, ...]]] = set()

    # -- public API ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the watcher and reconciler threads; returns at once."""
        if self._threads:
            raise RuntimeError("SliceController already started")
        with self._cond:
            self._requested += 1
            self._due = time.monotonic()
        for name, target in (("slice-watch", self._watch_loop), ("slice-sync", self._sync_loop)):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the threads; the slices stay in the API server (see module docstring)."""
        self._stop.set()
        for gate in (self._listed, self._node_known, self._first_pass):
            gate.set()  # releases a thread still waiting for its turn
        self._reflector.close()
        with self._cond:
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout)

    def resync(self) -> None:
        """The device set changed: republish `desired()` now."""
        with self._cond:
            self._requested += 1
            self._due = time.monotonic()
            self._cond.notify_all()

    def wait_published(self, timeout: float) -> bool:
        """Wait until the desired pool as of the latest start()/resync() is in the API server."""
        with self._cond:
            target = self._requested
            return self._cond.wait_for(
                lambda: self._completed >= target or self._stop.is_set(), timeout
            ) and (self._completed >= target)

    @property
    def status(self) -> PublishStatus:
        with self._cond:
            return self._status

    # -- watcher -------------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        self._reflector.run(self._stop)

    def _listed_slices(self) -> tuple[list[Json], str]:
        listed = self.client.list_resource_slices(self._selector)
        return listed.get("items", []), str(listed.get("metadata", {}).get("resourceVersion", ""))

    def _on_list(self, items: list[Json]) -> None:
        self._cache.replace(items)
        self._listed.set()
        self._kick(debounce=False)

    def _on_event(self, event: WatchEvent) -> None:
        if self._cache.apply_event(event.type, event.object):
            self._log.debug("slice changed", type=event.type, slice=event.object["metadata"].get("name"))
            self._kick(debounce=True)

    def _kick(self, *, debounce: bool) -> None:
        with self._cond:
            when = time.monotonic() + (self.debounce if debounce else 0.0)
            if self._due is None or when < self._due:
                self._due = when
            self._cond.notify_all()

    # -- reconciler ----------------------------------------------------------------------------

    def _sync_loop(self) -> None:
        found = self._lookup_node()
        self._node_known.set()
        if not found:
            return
        self._listed.wait()  # the watcher retries its first list itself
        failures = 0
        while not self._stop.is_set():
            with self._cond:
                while not self._stop.is_set() and not self._due_now():
                    self._cond.wait(self._wait_time())
                if self._stop.is_set():
                    return
                self._due = None
                request = self._requested
            try:
                plan = self._sync_once()
            except InvalidSlicesError as err:  # retried on the next resync, not in a loop
                self._log.error("not publishing: invalid desired ResourceSlices", error=str(err))
                self._set_status(in_sync=False, last_error=str(err))
                continue
            except Exception as err:
                failures += 1
                delay = self.backoff.delay(failures - 1)
                if not isinstance(err, KubeError):
                    self._log.exception("unexpected error while publishing ResourceSlices")
                else:
                    self._log.warning(
                        "publishing ResourceSlices failed", error=str(err), retry_in=round(delay, 2)
                    )
                self._set_status(in_sync=False, last_error=str(err))
                self._kick_at(
                    time.monotonic() + (min(delay, 0.5) if isinstance(err, ConflictError) else delay)
                )
                continue
            finally:
                self._first_pass.set()  # the watcher's turn, whatever this pass did
            failures = 0
            with self._cond:
                self._status = replace(
                    self._status,
                    published=self._status.published or plan.in_sync,
                    in_sync=plan.in_sync,
                    generation=plan.generation,
                    slices=len(self._cache.snapshot()),
                    last_error=None if plan.in_sync else self._status.last_error,
                    last_sync=datetime.now(UTC),
                )
                if plan.in_sync:
                    self._completed = max(self._completed, request)
                else:  # the writes were made; check again (a conflict or a dropped field)
                    self._due = time.monotonic()
                self._cond.notify_all()

    def _due_now(self) -> bool:
        return self._due is not None and self._due <= time.monotonic()

    def _wait_time(self) -> float | None:
        return None if self._due is None else max(0.0, self._due - time.monotonic())

    def _kick_at(self, when: float) -> None:
        with self._cond:
            self._due = when if self._due is None else min(self._due, when)
            self._cond.notify_all()

    def _lookup_node(self) -> bool:
        """Find the Node's UID (for the owner reference), retrying until it exists."""
        attempt = 0
        while not self._stop.is_set():
            try:
                self._node_uid = self.client.node_uid(self.node_name)
                return True
            except KubeError as err:
                delay = Backoff(initial=1.0, cap=30.0).delay(attempt)
                if isinstance(err, NotFoundError):
                    message = (
                        f"Node {self.node_name!r} does not exist in the cluster; our ResourceSlices are "
                        f"owned by it, so publishing waits for it (is --node-name right?)"
                    )
                else:
                    message = f"looking up Node {self.node_name!r}: {err}"
                self._log.warning(message, retry_in=round(delay, 1))
                self._set_status(last_error=message)
                attempt += 1
                self._stop.wait(delay)
        return False

    def _sync_once(self) -> Plan:
        """One pass: plan against the cache, make the writes, report dropped fields."""
        assert self._node_uid is not None
        current = self._current_slices()
        if self._yielding(current):
            return Plan(generation=self.status.generation or 0)
        desired = self.desired()
        effective = [self._effective(i, s) for i, s in enumerate(desired)]
        plan = plan_pool(
            current,
            effective,
            driver=self.driver_name,
            node=self.node_name,
            node_uid=self._node_uid,
        )
        if plan.in_sync:
            return plan
        self._log.info(
            "publishing ResourceSlices",
            generation=plan.generation,
            deletes=len(plan.deletes),
            updates=len(plan.updates),
            creates=len(plan.creates),
        )
        for delete in plan.deletes:
            try:
                self.client.delete_resource_slice(
                    delete.name, uid=delete.uid, resource_version=delete.resource_version
                )
                self._count(deletes=1)
            except NotFoundError:
                pass
            self._cache.record_delete(delete.name, delete.uid)
        for update in plan.updates:
            stored = self.client.update_resource_slice(self._stamped(update.body))
            self._count(updates=1)
            self._stored(update.index, desired[update.index], effective[update.index], stored)
        for create in plan.creates:
            stored = self.client.create_resource_slice(self._stamped(create.body))
            self._count(creates=1)
            self._stored(create.index, desired[create.index], effective[create.index], stored)
        return plan

    def _current_slices(self) -> list[Json]:
        """The cache with every slice the watch reported by its metadata fetched whole."""
        for _ in range(FETCH_ROUNDS):
            # One snapshot both checked and returned: a stub arriving meanwhile waits for the next sync.
            current = self._cache.snapshot()
            stubs = [s["metadata"]["name"] for s in current if is_stub(s)]
            if not stubs:
                return current
            for name in stubs:
                try:
                    self._cache.fill(name, self.client.get_resource_slice(name))
                except NotFoundError:
                    self._cache.fill(name, None)
        raise KubeError(f"our ResourceSlices kept changing while {FETCH_ROUNDS} rounds fetched them")

    def _stamped(self, body: Json) -> Json:
        return body if self.marker is None else stamp(body, self.driver_name, self.marker)

    def _yielding(self, current: list[Json]) -> bool:
        """Whether a newer, still serving instance owns the pool (see `handover`)."""
        if self.marker is None:
            return False
        seen = newest_other(current, self.driver_name, self.marker)
        newest = max((m for m in (seen, self._owner) if m is not None), default=None)
        # Our own pod's marker from a newer start is an earlier life of ours (clock stepped back).
        alive = (
            newest is not None
            and newest.instance != self.marker.instance
            and self.instance_alive(newest.instance)
        )
        if alive and newest != self._owner:
            assert newest is not None
            self._log.info(
                "a newer instance of the driver publishes the pool; leaving it to it", newer=newest.format()
            )
        elif not alive and self._owner is not None:
            self._log.info(
                "the newer instance is gone; publishing the pool again", newer=self._owner.format()
            )
        self._owner = newest if alive else None
        self._set_status(superseded_by=self._owner.format() if self._owner else None)
        if self._owner is not None:
            self._kick_at(time.monotonic() + HANDOVER_RECHECK_S)
        return self._owner is not None

    def _effective(self, index: int, desired: Json) -> Json:
        """The desired slice, or the form the server stored for it when it dropped fields."""
        remembered = self._stored_forms.get(index)
        spec = desired.get("spec") or {}
        if remembered is None or remembered[0] != fingerprint(content(spec)):
            return desired
        return {
            **desired,
            "spec": {**{k: v for k, v in spec.items() if k not in content(spec)}, **remembered[1]},
        }

    def _stored(self, index: int, desired: Json, effective: Json, stored: Json) -> None:
        self._cache.record_write(stored)
        wanted = content(effective.get("spec") or {})
        got = content(stored.get("spec") or {})
        if contents_equal(wanted, got):
            return
        key = fingerprint(content(desired.get("spec") or {}))
        self._stored_forms[index] = (key, got)
        gates = dropped_gates(wanted, got)
        # Once per slice and set of gates: device taints come and go with GPU health, and each
        # change would otherwise repeat the same report.
        if (index, tuple(gates)) in self._reported:
            return
        self._reported.add((index, tuple(gates)))
        message = (
            f"ResourceSlice #{index}: the API server dropped some fields, probably because these feature "
            f"gates are disabled: {' '.join(gates) or 'unknown'}; publishing what it stores instead"
        )
        self._log.warning(message, gates=gates)
        with self._cond:
            merged = tuple(sorted({*self._status.dropped_features, *(gates or ["unknown"])}))
            self._status = replace(
                self._status, dropped_features=merged, warnings=(*self._status.warnings, message)[-10:]
            )
        if self.events:
            self._emit_event("DroppedFields", message)

    def _emit_event(self, reason: str, message: str) -> None:
        event = node_event(
            namespace=NODE_EVENTS_NAMESPACE,
            node_name=self.node_name,
            node_uid=self._node_uid,
            component=self.driver_name,
            reason=reason,
            message=message,
            event_type="Warning",
        )
        try:
            self.client.create_event(NODE_EVENTS_NAMESPACE, event)
        except KubeError as err:  # an Event is a courtesy; the log line above is the record
            self._log.debug("could not create Event", error=str(err))

    def _count(self, **delta: int) -> None:
        with self._cond:
            w = self._status.writes
            self._status = replace(
                self._status,
                writes=WriteCounts(
                    w.creates + delta.get("creates", 0),
                    w.updates + delta.get("updates", 0),
                    w.deletes + delta.get("deletes", 0),
                ),
            )

    def _set_status(self, **changes: Any) -> None:
        with self._cond:
            self._status = replace(self._status, **changes)
