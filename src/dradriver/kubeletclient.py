"""The kubelet's side of the plugin protocol: registration handshake and DRA calls.

Used by `make demo`, `dradriver healthcheck` and the tests to talk to a running plugin exactly
as a kubelet would (same validation of GetInfo, same choice of service versions): 1.34-1.36 by
default, 1.37 with `kubelet_minor=37` (which picks the health stream's version differently).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

import grpc

from dradriver.kubeletapi.dra.v1 import api_pb2 as v1
from dradriver.kubeletapi.dra.v1 import api_pb2_grpc as v1_grpc
from dradriver.kubeletapi.dra.v1beta1 import api_pb2 as v1beta1
from dradriver.kubeletapi.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from dradriver.kubeletapi.health.v1 import api_pb2 as health_v1
from dradriver.kubeletapi.health.v1 import api_pb2_grpc as health_v1_grpc
from dradriver.kubeletapi.health.v1alpha1 import api_pb2 as health_v1alpha1
from dradriver.kubeletapi.health.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from dradriver.kubeletapi.pluginregistration import api_pb2 as reg_pb
from dradriver.kubeletapi.pluginregistration import api_pb2_grpc as reg_grpc
from dradriver.plugin.driver import ClaimRef

#: The DRAPlugin services a 1.34-1.36 kubelet knows, and their wire modules.
KUBELET_DRA_SERVICES: dict[str, tuple[ModuleType, Any]] = {
    "v1.DRAPlugin": (v1, v1_grpc.DRAPluginStub),
    "v1beta1.DRAPlugin": (v1beta1, v1beta1_grpc.DRAPluginStub),
}
#: The health services a kubelet knows, newest first, and their wire modules.
KUBELET_HEALTH_SERVICES: dict[str, tuple[ModuleType, Any]] = {
    "v1.DRAResourceHealth": (health_v1, health_v1_grpc.DRAResourceHealthStub),
    "v1alpha1.DRAResourceHealth": (health_v1alpha1, health_v1alpha1_grpc.DRAResourceHealthStub),
}
V1ALPHA1_HEALTH = "v1alpha1.DRAResourceHealth"
#: The first kubelet minor that picks the health service from the advertised ones.
HEALTH_NEGOTIATING_MINOR = 37
#: The kubelet minor played unless told otherwise.
DEFAULT_KUBELET_MINOR = 36
#: The kubelet's timeouts for the registration calls.
GET_INFO_TIMEOUT = 1.0
NOTIFY_TIMEOUT = 5.0
#: The kubelet's per-call timeout for NodePrepareResources / NodeUnprepareResources.
DRA_CALL_TIMEOUT = 45.0


class RegistrationRejectedError(Exception):
    """GetInfo answered something the kubelet would refuse; carries the kubelet's message."""


@dataclass(frozen=True)
class Registration:
    driver_name: str
    endpoint: str
    supported_versions: tuple[str, ...]
    #: The DRAPlugin service the kubelet picked: the plugin's first entry it knows.
    service: str
    #: The health service whose stream the kubelet opens, None for none.
    health_service: str | None = None


def _channel(socket: Path | str) -> grpc.Channel:
    return grpc.insecure_channel(f"unix://{socket}")


def register(
    registration_socket: Path,
    *,
    accept: bool = True,
    wait: float = 10.0,
    kubelet_minor: int = DEFAULT_KUBELET_MINOR,
) -> Registration:
    """Perform the plugin watcher's handshake: GetInfo, validate, NotifyRegistrationStatus.

    With `accept=False` the status reports a rejection instead (to test the plugin's reaction).
    """
    with _channel(registration_socket) as channel:
        grpc.channel_ready_future(channel).result(timeout=wait)
        stub = reg_grpc.RegistrationStub(channel)
        info = stub.GetInfo(reg_pb.InfoRequest(), timeout=GET_INFO_TIMEOUT)
        try:
            registration = validate_plugin_info(info, kubelet_minor)
        except RegistrationRejectedError as err:
            _notify(stub, registered=False, error=str(err))
            raise
        if accept:
            _notify(stub, registered=True, error="")
        else:
            _notify(stub, registered=False, error="rejected by test kubelet")
        return registration


def _notify(stub: reg_grpc.RegistrationStub, *, registered: bool, error: str) -> None:
    try:
        stub.NotifyRegistrationStatus(
            reg_pb.RegistrationStatus(plugin_registered=registered, error=error), timeout=NOTIFY_TIMEOUT
        )
    except grpc.RpcError:
        if registered:
            raise  # a plugin may (and the Go helper does) answer a rejection with an error


def validate_plugin_info(info: reg_pb.PluginInfo, kubelet_minor: int = DEFAULT_KUBELET_MINOR) -> Registration:
    """The checks and choice of service versions of the kubelet's DRA plugin handler."""
    if info.type != "DRAPlugin":
        raise RegistrationRejectedError(f"no handler registered for plugin type: {info.type}")
    if not info.supported_versions:
        raise RegistrationRejectedError("empty list of supported gRPC services (aka supported versions)")
    service = next((v for v in info.supported_versions if v in KUBELET_DRA_SERVICES), None)
    if service is None:
        raise RegistrationRejectedError(
            f"none of services supported by the plugin ({list(info.supported_versions)}) "
            f"are supported by the kubelet ({list(KUBELET_DRA_SERVICES)})"
        )
    endpoint = info.endpoint
    if not Path(endpoint).is_absolute():
        raise RegistrationRejectedError(f"endpoint {endpoint!r} is not an absolute path")
    versions = tuple(info.supported_versions)
    return Registration(info.name, endpoint, versions, service, pick_health_service(versions, kubelet_minor))


def pick_health_service(supported_versions: Sequence[str], kubelet_minor: int) -> str | None:
    """The health stream a kubelet opens: 1.34-1.36 open v1alpha1 whatever was advertised; 1.37+
    the newest version both know of those advertised, and none when none is."""
    if kubelet_minor < HEALTH_NEGOTIATING_MINOR:
        return V1ALPHA1_HEALTH
    return next((s for s in KUBELET_HEALTH_SERVICES if s in supported_versions), None)


class DRAClient:
    """A connection to a plugin's DRA socket, speaking one DRAPlugin and one health version."""

    def __init__(
        self, endpoint: Path | str, service: str = "v1.DRAPlugin", health_service: str = V1ALPHA1_HEALTH
    ) -> None:
        self.pb, stub_class = KUBELET_DRA_SERVICES[service]
        self.health_pb, health_stub_class = KUBELET_HEALTH_SERVICES[health_service]
        self._channel = _channel(endpoint)
        self._stub = stub_class(self._channel)
        self._health = health_stub_class(self._channel)

    def __enter__(self) -> DRAClient:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def wait_ready(self, timeout: float) -> None:
        grpc.channel_ready_future(self._channel).result(timeout=timeout)

    def prepare(self, claims: Sequence[ClaimRef], timeout: float = DRA_CALL_TIMEOUT) -> Any:
        request = self.pb.NodePrepareResourcesRequest(claims=[self._claim(c) for c in claims])
        return self._stub.NodePrepareResources(request, timeout=timeout)

    def unprepare(self, claims: Sequence[ClaimRef], timeout: float = DRA_CALL_TIMEOUT) -> Any:
        request = self.pb.NodeUnprepareResourcesRequest(claims=[self._claim(c) for c in claims])
        return self._stub.NodeUnprepareResources(request, timeout=timeout)

    def watch_health(self, timeout: float | None = None) -> Iterator[Any]:
        """The health stream (NodeWatchResourcesResponse messages of the client's health version);
        cancel it by closing the client or letting `timeout` expire."""
        stream: Iterator[Any] = self._health.NodeWatchResources(
            self.health_pb.NodeWatchResourcesRequest(), timeout=timeout
        )
        return stream

    def _claim(self, claim: ClaimRef) -> Any:
        return self.pb.Claim(namespace=claim.namespace, name=claim.name, uid=claim.uid)
