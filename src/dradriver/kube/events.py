"""Kubernetes Events about this node's Node object: what `kubectl describe node` shows.

Events of the cluster-scoped Node go to `default`: the API server keeps a cluster-scoped object's
Events there (or in kube-system) and refuses them elsewhere, as the kubelet's own Node Events are;
`kubectl describe node` matches the involved object's UID.
"""

from __future__ import annotations

import queue
import threading
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from dradriver.kube.errors import KubeError
from dradriver.logs import get_logger

#: Where Events about the Node are kept (see the module docstring).
NODE_EVENTS_NAMESPACE = "default"

if TYPE_CHECKING:
    from dradriver.kube.client import KubeClient

Json = dict[str, Any]
EventType = Literal["Normal", "Warning"]

#: The API server keeps Event messages of any length, but kubectl and the events.k8s.io view cut
#: at 1024 characters; longer ones are cut here, visibly.
MAX_MESSAGE = 1024


def node_event(
    *,
    namespace: str,
    node_name: str,
    node_uid: str | None,
    component: str,
    reason: str,
    message: str,
    event_type: EventType,
) -> Json:
    """A core/v1 Event about Node `node_name`, kept in `namespace`, reported by `component` from
    that node."""
    return object_event(
        _node_reference(node_name, node_uid),
        namespace=namespace,
        node_name=node_name,
        component=component,
        reason=reason,
        message=message,
        event_type=event_type,
    )


def _node_reference(node_name: str, node_uid: str | None) -> Json:
    """An Event's involvedObject for the Node (`kubectl describe node` matches its UID)."""
    involved: Json = {"apiVersion": "v1", "kind": "Node", "name": node_name}
    if node_uid:
        involved["uid"] = node_uid
    return involved


def object_event(
    involved: Json,
    *,
    namespace: str,
    node_name: str,
    component: str,
    reason: str,
    message: str,
    event_type: EventType,
) -> Json:
    """A core/v1 Event about `involved` (apiVersion, kind, name, uid; namespace for a namespaced
    object), kept in `namespace`, reported by `component` from this node."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "type": event_type,
        "source": {"component": component, "host": node_name},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


class NodeEventSender:
    """Sends this node's Events (about the Node, or with `send_about` about an object on it: a
    claim, a pod) from a thread of its own, so a slow API server never holds up the caller.

    Events are a courtesy next to the log: when the queue is full or the API server refuses one,
    it is logged and dropped.
    """

    def __init__(self, client: KubeClient, *, node_name: str, component: str, capacity: int = 100) -> None:
        self._client = client
        self._node = node_name
        self._component = component
        self._uid: str | None = None
        # (reason, message, type, the object and its namespace; None: the Node)
        self._queue: queue.Queue[tuple[str, str, EventType, tuple[Json, str] | None] | None] = queue.Queue(
            capacity
        )
        self._log = get_logger(component="events", node=node_name)
        self._thread = threading.Thread(target=self._run, name="node-events", daemon=True)

    def start(self) -> None:
        """Send what is queued, and what comes, from now on."""
        self._thread.start()

    def send(self, reason: str, message: str, event_type: EventType) -> None:
        self._put((reason, message, event_type, None))

    def send_about(
        self, involved: Json, namespace: str, reason: str, message: str, event_type: EventType
    ) -> None:
        self._put((reason, message, event_type, (involved, namespace)))

    def _put(self, item: tuple[str, str, EventType, tuple[Json, str] | None]) -> None:
        reason, message = item[0], item[1]
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._log.warning("too many Events queued; dropping one", event_reason=reason, message=message)

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued (within `timeout`), then stop."""
        if not self._thread.is_alive():
            return
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            reason, message, event_type, about = item
            try:
                involved, namespace = about if about is not None else self._about_node()
                event = object_event(
                    involved,
                    namespace=namespace,
                    node_name=self._node,
                    component=self._component,
                    reason=reason,
                    message=message,
                    event_type=event_type,
                )
                self._client.create_event(namespace, event)
            except KubeError as err:
                self._log.warning("could not create an Event", event_reason=reason, error=str(err))

    def _about_node(self) -> tuple[Json, str]:
        """The Node as an Event's involvedObject (its UID looked up once) and where its Events go."""
        if self._uid is None:
            self._uid = self._client.node_uid(self._node)
        return _node_reference(self._node, self._uid), NODE_EVENTS_NAMESPACE
