"""The gRPC services on the DRA socket: DRAPlugin v1 and v1beta1, and the health stream v1 and v1alpha1.

Both DRAPlugin versions are thin adapters over one `DRAService`, which enforces the kubelet's
response contract whatever the driver does: one entry per requested claim UID and nothing else,
base request names, whole-call failures only through `CallError`. Both health versions are thin
adapters over one `HealthBoard`: the same devices, health and messages on every stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol, TypeVar

import grpc
from google.protobuf.json_format import MessageToDict

from dradriver import logs
from dradriver.health.board import DeviceHealth, HealthBoard
from dradriver.kubeletapi.dra.v1 import api_pb2 as v1
from dradriver.kubeletapi.dra.v1 import api_pb2_grpc as v1_grpc
from dradriver.kubeletapi.dra.v1beta1 import api_pb2 as v1beta1
from dradriver.kubeletapi.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from dradriver.kubeletapi.health.v1 import api_pb2 as health_v1
from dradriver.kubeletapi.health.v1 import api_pb2_grpc as health_v1_grpc
from dradriver.kubeletapi.health.v1alpha1 import api_pb2 as health_v1alpha1
from dradriver.kubeletapi.health.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from dradriver.plugin.driver import (
    CallError,
    ClaimRef,
    Driver,
    PreparedDevice,
    PrepareResult,
    base_request_name,
)

#: The health stream's services, newest first: a 1.37+ kubelet opens the newest one it knows of
#: those advertised; 1.34-1.36 open v1alpha1 whatever is advertised.
HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
#: What GetInfo advertises. The kubelet takes the first DRAPlugin entry it knows.
SUPPORTED_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin", *HEALTH_SERVICES)

#: Per-claim errors end up in Pod events; one that echoes a huge input is cut to this length.
MAX_ERROR_CHARS = 1024

#: How long a prepare/unprepare that arrives during start-up waits for the node to be built.
INIT_WAIT_SECONDS = 30.0

#: How close to its deadline a call may end and still have ended by it (see `_unanswered`).
DEADLINE_SLACK_SECONDS = 0.05

#: How long the kubelet may trust a health report; it marks unreported devices Unknown after it.
HEALTH_TIMEOUT_SECONDS = 60
#: Streams re-send the full list this often, well inside the timeout, even when nothing changed.
HEALTH_REFRESH_SECONDS = HEALTH_TIMEOUT_SECONDS / 3

log = logs.get_logger(component="dra")


class CallRecorder(Protocol):
    """Told about every DRA call (metrics); must be cheap and never raise."""

    def record(
        self, method: str, api: str, seconds: float, claim_errors: Sequence[str], failure: str | None
    ) -> None: ...


class _NoRecorder:
    def record(
        self, method: str, api: str, seconds: float, claim_errors: Sequence[str], failure: str | None
    ) -> None:
        """Without metrics (or before the node is built) calls are not recorded."""


NO_RECORDER: CallRecorder = _NoRecorder()


class NodeParts(Protocol):
    """What the service calls once the node is built (the daemon's parts)."""

    @property
    def driver(self) -> Driver: ...

    @property
    def recorder(self) -> CallRecorder: ...


class PendingParts(Protocol):
    """The node's parts to come: a `Future` of them (of any type with `NodeParts`' fields)."""

    def done(self) -> bool: ...

    def exception(self, timeout: float | None = None) -> BaseException | None: ...

    def result(self, timeout: float | None = None) -> NodeParts: ...


@dataclass(frozen=True)
class BuiltParts:
    """A node built already: a driver and how its calls are recorded."""

    driver: Driver
    recorder: CallRecorder = NO_RECORDER


def built(driver: Driver, recorder: CallRecorder = NO_RECORDER) -> PendingParts:
    """The parts of a node built already (tests, and anything without a start-up phase)."""
    parts: Future[BuiltParts] = Future()
    parts.set_result(BuiltParts(driver, recorder))
    return parts


class DRAService:
    """Version-independent prepare/unprepare that always answers the kubelet's contract.

    The sockets come up before the node is built (`daemon`): `parts` is resolved once it is, or
    fails with the CallError that every call then answers. A call that arrives before then waits
    for it up to `wait_seconds`."""

    def __init__(self, parts: PendingParts, *, wait_seconds: float = INIT_WAIT_SECONDS) -> None:
        self._parts = parts
        self._wait = wait_seconds

    @property
    def recorder(self) -> CallRecorder:
        done = self._parts.done() and self._parts.exception() is None
        return self._parts.result().recorder if done else NO_RECORDER

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        results = self._driver().prepare(claims)
        return {claim.uid: _normalized(results.get(claim.uid), claim) for claim in claims}

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        errors = self._driver().unprepare(claims)
        return {
            claim.uid: _clipped(
                errors.get(claim.uid, f"internal error: driver returned no result for claim {claim}")
            )
            for claim in claims
        }

    def _driver(self) -> Driver:
        try:
            return self._parts.result(self._wait).driver
        except TimeoutError:
            raise CallError(f"driver is still initializing after {self._wait:.0f}s; retry later") from None


def _normalized(result: PrepareResult | None, claim: ClaimRef) -> PrepareResult:
    if result is None:
        return PrepareResult(error=f"internal error: driver returned no result for claim {claim}")
    if result.error:
        return PrepareResult(error=_clipped(result.error))
    return PrepareResult(devices=tuple(_with_base_request_names(d) for d in result.devices))


def _clipped(error: str) -> str:
    return logs.clip_text(error, MAX_ERROR_CHARS)


def _with_base_request_names(device: PreparedDevice) -> PreparedDevice:
    names = tuple(dict.fromkeys(base_request_name(n) for n in device.request_names))
    return PreparedDevice(device.pool_name, device.device_name, names, device.cdi_device_ids, device.share_id)


_Answer = TypeVar("_Answer")


class _DRAPluginAdapter:
    """Maps one wire version's messages to and from DRAService."""

    def __init__(self, service: DRAService, pb: ModuleType, version: str) -> None:
        self._service = service
        self._pb = pb
        self._version = version
        self._share_ids = pb is v1  # share_id exists only on the v1 wire

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        with _logged_after_answer(context):
            return self._prepare(request, context)

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        with _logged_after_answer(context):
            return self._unprepare(request, context)

    def _prepare(self, request: Any, context: grpc.ServicerContext) -> Any:
        claims = _claim_refs(request)
        self._trace("NodePrepareResources request", request)
        started = time.perf_counter()
        results = self._call(context, "NodePrepareResources", started, self._service.prepare, claims)
        response = self._pb.NodePrepareResourcesResponse()
        for uid, result in results.items():
            entry = response.claims[uid]
            entry.error = result.error
            for device in result.devices:
                out = entry.devices.add(
                    request_names=device.request_names,
                    pool_name=device.pool_name,
                    device_name=device.device_name,
                    cdi_device_ids=device.cdi_device_ids,
                )
                if self._share_ids and device.share_id is not None:
                    out.share_id = device.share_id
        self._log_done(context, "NodePrepareResources", results.values(), started, lambda r: r.error)
        self._trace("NodePrepareResources response", response)
        return response

    def _unprepare(self, request: Any, context: grpc.ServicerContext) -> Any:
        claims = _claim_refs(request)
        self._trace("NodeUnprepareResources request", request)
        started = time.perf_counter()
        errors = self._call(context, "NodeUnprepareResources", started, self._service.unprepare, claims)
        response = self._pb.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            response.claims[uid].error = error
        self._log_done(context, "NodeUnprepareResources", errors.values(), started, lambda e: e)
        self._trace("NodeUnprepareResources response", response)
        return response

    def _call(
        self,
        context: grpc.ServicerContext,
        method: str,
        started: float,
        body: Callable[[Sequence[ClaimRef]], _Answer],
        claims: Sequence[ClaimRef],
    ) -> _Answer:
        """Run the driver; CallError fails the whole call as the Go helper does, anything else is a bug."""
        try:
            return body(claims)
        except CallError as err:
            self._service.recorder.record(method, self._version, time.perf_counter() - started, (), "UNKNOWN")
            log.warning(f"{method} failed", error=str(err))
            context.abort(grpc.StatusCode.UNKNOWN, _clipped(str(err)))
        except Exception as err:
            self._service.recorder.record(
                method, self._version, time.perf_counter() - started, (), "INTERNAL"
            )
            log.exception(f"{method} crashed")
            context.abort(grpc.StatusCode.INTERNAL, _clipped(f"internal error in {method}: {err}"))

    def _log_done(
        self, context: grpc.ServicerContext, method: str, outcomes: Any, started: float, error_of: Any
    ) -> None:
        seconds = time.perf_counter() - started
        failed = [error_of(o) for o in outcomes if error_of(o)]

        def done(ended_before_the_answer: bool = False) -> None:
            unanswered = _unanswered(context, ended_before_the_answer)
            self._service.recorder.record(method, self._version, seconds, failed, unanswered)
            (log.warning if unanswered else log.info)(
                method,
                api=self._version,
                claims=len(outcomes),
                failed=len(failed),
                ms=round(seconds * 1000, 2),
                **({"errors": failed[:5]} if failed else {}),
                # The work is done (and recorded), but the kubelet got no answer: it retries.
                **({"unanswered": unanswered} if unanswered else {}),
            )

        # When the call ends (after its held records): only then is it known whether the answer
        # reached the kubelet, however late the handler was.
        if not context.add_callback(done):
            done(ended_before_the_answer=True)

    def _trace(self, what: str, message: Any) -> None:
        if logs.verbosity() >= logs.VERBOSITY_TRACE_GRPC:
            log.info(
                what, api=self._version, message=MessageToDict(message, preserving_proto_field_name=True)
            )


@contextmanager
def _logged_after_answer(context: grpc.ServicerContext) -> Iterator[None]:
    """The call's info lines, its own line and its metrics are done once its answer is out (by
    the server's thread, when the call ends): a pod waits for the answer, not for the log."""
    held = logs.HeldRecords()
    if not context.add_callback(held.write):  # the call is over already: nothing to wait for
        yield
        return
    with logs.holding(held):
        yield


def _unanswered(context: grpc.ServicerContext, ended_before_the_answer: bool) -> str | None:
    """Why the kubelet got no answer to a call that has ended: DEADLINE_EXCEEDED or CANCELLED.

    The kubelet gives up at its deadline and the server learns of it as a cancellation, a
    moment before the deadline it was sent reaches zero here: a call that ended that close to
    its deadline ended by it."""
    remaining = context.time_remaining()
    if remaining is not None and remaining <= DEADLINE_SLACK_SECONDS:
        return "DEADLINE_EXCEEDED"
    return "CANCELLED" if ended_before_the_answer else None


def _claim_refs(request: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]


class DRAPluginV1(_DRAPluginAdapter, v1_grpc.DRAPluginServicer):
    def __init__(self, service: DRAService) -> None:
        super().__init__(service, v1, "v1")


class DRAPluginV1beta1(_DRAPluginAdapter, v1beta1_grpc.DRAPluginServicer):
    def __init__(self, service: DRAService) -> None:
        super().__init__(service, v1beta1, "v1beta1")


class _HealthAdapter:
    """NodeWatchResources in one wire version: the full device list at once, then on every
    change and periodically."""

    def __init__(self, board: HealthBoard, pb: ModuleType, version: str, refresh_seconds: float) -> None:
        self._board = board
        self._pb = pb
        self._version = version
        self._refresh = refresh_seconds

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        context.add_callback(self._board.wake)
        log.info("health stream opened", api=self._version, peer=context.peer())
        # Right after start-up discovery may still be running: an empty list would tell the
        # kubelet we have no devices, so wait for the real one (bounded).
        self._board.wait_until_known(self._refresh)
        version, devices = self._board.snapshot()
        yield self._response(devices)
        while context.is_active() and not self._board.closed:
            self._board.wait_for_change(version, self._refresh)
            if not context.is_active() or self._board.closed:
                break
            version, devices = self._board.snapshot()
            yield self._response(devices)
        log.info("health stream closed", api=self._version)

    def _response(self, devices: Sequence[DeviceHealth]) -> Any:
        pb = self._pb
        return pb.NodeWatchResourcesResponse(
            devices=[
                pb.DeviceHealth(
                    device=pb.DeviceIdentifier(pool_name=d.pool_name, device_name=d.device_name),
                    health=int(d.health),
                    last_updated_time=d.last_updated,
                    health_check_timeout_seconds=HEALTH_TIMEOUT_SECONDS,
                    message=d.message,
                )
                for d in devices
            ]
        )


class DRAResourceHealthV1(_HealthAdapter, health_v1_grpc.DRAResourceHealthServicer):
    def __init__(self, board: HealthBoard, refresh_seconds: float = HEALTH_REFRESH_SECONDS) -> None:
        super().__init__(board, health_v1, "v1", refresh_seconds)


class DRAResourceHealthV1alpha1(_HealthAdapter, health_v1alpha1_grpc.DRAResourceHealthServicer):
    def __init__(self, board: HealthBoard, refresh_seconds: float = HEALTH_REFRESH_SECONDS) -> None:
        super().__init__(board, health_v1alpha1, "v1alpha1", refresh_seconds)


def add_dra_services(server: grpc.Server, service: DRAService, board: HealthBoard) -> None:
    v1_grpc.add_DRAPluginServicer_to_server(DRAPluginV1(service), server)
    v1beta1_grpc.add_DRAPluginServicer_to_server(DRAPluginV1beta1(service), server)
    health_v1_grpc.add_DRAResourceHealthServicer_to_server(DRAResourceHealthV1(board), server)
    health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(DRAResourceHealthV1alpha1(board), server)
