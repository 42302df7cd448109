"""The kubelet plugin registration service (`pluginregistration.Registration`).

The kubelet finds our registration socket, calls GetInfo to learn the driver name, the DRA
socket and the services we offer, then reports the outcome through NotifyRegistrationStatus.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from dradriver import logs
from dradriver.kubeletapi.pluginregistration import api_pb2 as pb
from dradriver.kubeletapi.pluginregistration import api_pb2_grpc as pb_grpc

PLUGIN_TYPE = "DRAPlugin"

log = logs.get_logger(component="registration")


@dataclass(frozen=True)
class RegistrationStatus:
    """What the kubelet last told us; `registered` is None until it has said anything."""

    registered: bool | None
    error: str = ""


class RegistrationState:
    """Thread-safe holder of the registration outcome, read by readiness checks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._status = RegistrationStatus(registered=None)
        self._changed = threading.Event()

    def set(self, status: RegistrationStatus) -> None:
        with self._lock:
            self._status = status
        self._changed.set()

    def reset(self) -> None:
        """Forget the outcome, e.g. when our registration socket had to be re-created."""
        self.set(RegistrationStatus(registered=None))

    @property
    def status(self) -> RegistrationStatus:
        with self._lock:
            return self._status

    def wait_registered(self, timeout: float) -> bool:
        """Block until the kubelet reports a successful registration (or `timeout` passes)."""
        self._changed.wait(timeout)
        return self.status.registered is True


class RegistrationServicer(pb_grpc.RegistrationServicer):
    def __init__(
        self, driver_name: str, endpoint: str, supported_versions: Sequence[str], state: RegistrationState
    ) -> None:
        self._info = pb.PluginInfo(
            type=PLUGIN_TYPE, name=driver_name, endpoint=endpoint, supported_versions=list(supported_versions)
        )
        self._state = state

    def GetInfo(self, request: pb.InfoRequest, context: grpc.ServicerContext) -> pb.PluginInfo:  # noqa: N802
        log.debug("GetInfo", peer=context.peer())
        return self._info

    def NotifyRegistrationStatus(  # noqa: N802
        self, request: pb.RegistrationStatus, context: grpc.ServicerContext
    ) -> pb.RegistrationStatusResponse:
        self._state.set(RegistrationStatus(registered=request.plugin_registered, error=request.error))
        if not request.plugin_registered:
            log.error("kubelet rejected the registration", kubelet_error=request.error)
            # The Go helper answers a failed registration with an error too.
            context.abort(grpc.StatusCode.UNKNOWN, f"failed registration process: {request.error}")
        log.info("registered with the kubelet", driver=self._info.name, endpoint=self._info.endpoint)
        return pb.RegistrationStatusResponse()


def add_registration_service(server: grpc.Server, servicer: RegistrationServicer) -> None:
    pb_grpc.add_RegistrationServicer_to_server(servicer, server)
