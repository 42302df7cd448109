"""The shares of shared GPUs on this node: one MPS control daemon per GPU, outliving claims.

A GPU's daemon starts with its first share and stops with its last; it runs in its own session, so
a restart (or kill -9) of serve leaves it running, and recovery adopts it. Which daemons must run
follows from the prepared claims' records alone (their `ShareRecord`s, in the ledger, which the
caller passes in): `recover` starts the daemons that shares need and stops, and removes the
directories of, those none needs. Nothing here keeps a copy of them. Each share's CDI device
carries its client limits (`prepare.gpu_shares`). On the fake GPU backend the stand-in daemon also
keeps a register of the clients and their limits (no CUDA client ever connects to it), written into
its state file in the pipe directory.

A share's reservation is not written before its daemon starts: after a crash there, the checkpoint
names no share on the GPU and recovery stops the daemon, as it stops any no share needs.

A GPU's daemon and its pipe directory are common to all its shares, and the limits are the clients'
own (any of them can stop the daemon or drop its limits), so the tenant boundary is the namespace:
the enforced shares of one GPU come from claims of one namespace. A share whose GPU holds shares
of another namespace fails, naming it, and is prepared on the kubelet's retry once they are gone.

Under `--gpu-shares unenforced` no daemon runs: shares are prepared without limits and say so in
their records (`status`, the metrics). Under `mps` on a node whose host driver has no MPS control
tool, a share fails with one line instead of running unguarded.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from dradriver import logs
from dradriver.devicemodel.shares import SharePolicy
from dradriver.discovery.driverroot import find_binary
from dradriver.plugin.driver import ClaimRef
from dradriver.prepare.cdi import CdiDevice, ContainerEdits
from dradriver.prepare.checkpoint import ClaimRecord, ShareRecord
from dradriver.prepare.config import Sharing
from dradriver.prepare.gpu_shares import ShareLimits, share_edits, unenforced_edits
from dradriver.prepare.plan import PlannedDevice
from dradriver.prepare.sharing_settings import MPS_CONTROL_SOCKET, MpsDaemons, SharingError

#: The sharing setting a GPU's daemon starts with: no defaults, each client brings its limits.
_DAEMON = Sharing(strategy="MPS")
#: The directory under the state directory that holds the daemons of shared GPUs.
SHARES_DIRECTORY = "shares"
STANDIN_TIMEOUT_SECONDS = 20.0

log = logs.get_logger(component="shares")


def daemon_key(gpu_uuid: str) -> str:
    return f"gpu-share-daemon-{gpu_uuid}"


class ShareDaemons:
    """Shares: their records, their CDI edits, and the per-GPU daemons that hold them to limits.

    `daemons` runs the MPS control tool, None when the host has none (`missing` says why).
    `register` (the stand-in only) tells the daemon each client's limits.
    """

    def __init__(
        self,
        policy: SharePolicy | None = None,
        daemons: MpsDaemons | None = None,
        *,
        register: bool = False,
        missing: str = "",
    ) -> None:
        self.policy = policy
        self._missing = missing
        self._register = register
        self._daemons = daemons

    # --- records ------------------------------------------------------------------------------

    def record(self, device: PlannedDevice) -> ShareRecord | None:
        """The checkpoint record of a planned device's share (None: not a share, or shares off)."""
        if device.share is None or self.policy is None:
            return None
        return ShareRecord(
            memory_mib=device.share.memory_mib,
            thread_percentage=device.share.thread_percentage,
            enforced=self.policy.enforced,
        )

    # --- prepare and release -------------------------------------------------------------------

    def prepare(
        self,
        claim: ClaimRef,
        devices: Sequence[PlannedDevice],
        cdi_devices: Sequence[CdiDevice],
        prepared: Callable[[], Iterable[ClaimRecord]],
    ) -> tuple[CdiDevice, ...]:
        """The CDI devices with each share's edits added, its GPU's daemon running first; the
        `prepared` claims (those being prepared too) say which namespace holds each GPU's shares
        (read only for a share: most claims have none).

        Raises SharingError (one line) when a share cannot be held to its limits, or its GPU
        holds shares of another namespace."""
        out = list(cdi_devices)
        for index, device in enumerate(devices):
            if device.share is None or device.share_id is None:
                continue
            limits, share_id = device.share, device.share_id
            if self.policy is None:
                raise SharingError(
                    f"device {device.name} was allocated as a share, but this node does not publish shares "
                    "(serve --gpu-shares)"
                )
            if not self.policy.enforced:
                edits = unenforced_edits(limits)
            else:
                _check_tenant(claim, device, prepared())
                edits = self._enforce(share_id, device, limits)
            out[index] = replace(out[index], edits=out[index].edits + edits)
        return tuple(out)

    def _enforce(self, share_id: str, device: PlannedDevice, limits: ShareLimits) -> ContainerEdits:
        daemons = self._daemons
        if daemons is None:
            raise SharingError(
                f"the share of {device.name} cannot be held to its limits: {self._missing} "
                "(serve --gpu-shares unenforced runs shares without limits)"
            )
        key = daemon_key(device.uuid)
        if not daemons.running(key):
            self._start(daemons, key, device)
        if self._register:
            self._tell(daemons.pipe(key), f"set_client_limits {share_id} {_client(limits)}")
        return share_edits(limits, str(daemons.host_pipe(key)))

    def release(self, record: ClaimRecord, prepared: Callable[[], Iterable[ClaimRecord]]) -> None:
        """Release the claim's shares; a GPU whose last share among the `prepared` claims this
        was has its daemon stopped (they are read only for a claim with shares). Safe to repeat."""
        daemons = self._daemons
        if daemons is None:
            return
        others: dict[str, dict[str, ShareRecord]] | None = None
        for device in record.devices:
            if device.share is None or device.share_id is None or not device.share.enforced:
                continue
            if others is None:
                others = _shares_by_gpu(r for r in prepared() if r.uid != record.uid)
            key = daemon_key(device.uuid)
            if others.get(device.uuid):
                if self._register and daemons.running(key):
                    self._tell(daemons.pipe(key), f"remove_client {device.share_id}")
                continue
            daemons.stop(key)
            log.info("MPS daemon of shared GPU stopped: its last share was released", gpu=device.uuid)

    def recover(self, prepared: Iterable[ClaimRecord]) -> None:
        """Start the daemons the shares of the `prepared` claims need (again told their clients'
        limits), stop and remove the rest."""
        daemons = self._daemons
        if daemons is None:
            return
        needed = {
            gpu: on for gpu, on in _shares_by_gpu(prepared).items() if any(s.enforced for s in on.values())
        }
        for gpu, on in needed.items():
            key = daemon_key(gpu)
            try:
                if not daemons.running(key):
                    self._start(daemons, key, _Gpu(gpu))
                if self._register:
                    for share_id, share in on.items():
                        self._tell(daemons.pipe(key), f"set_client_limits {share_id} {_client(share)}")
            except SharingError as err:
                log.error("the MPS daemon of a shared GPU cannot be started", gpu=gpu, error=str(err))
        keep = {daemons.pipe(daemon_key(gpu)).parent for gpu in needed}
        for root in daemons.directories():
            if root not in keep:
                log.info("stopping an MPS daemon no share needs", directory=str(root))
                daemons.stop_directory(root)

    def _start(self, daemons: MpsDaemons, key: str, device: _Gpu | PlannedDevice) -> None:
        # A daemon that died leaves its socket; its directory stays, as the containers of the
        # GPU's shares have it bind-mounted: the new daemon listens where they look.
        daemons.forget(key)
        (daemons.pipe(key) / MPS_CONTROL_SOCKET).unlink(missing_ok=True)
        daemons.start(key, _DAEMON, [device])
        log.info("MPS daemon of shared GPU started", gpu=device.uuid)

    def _tell(self, pipe: Path, command: str) -> None:
        """One command to the stand-in daemon, in process (its protocol: a line, a reply)."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(STANDIN_TIMEOUT_SECONDS)
                conn.connect(str(pipe / MPS_CONTROL_SOCKET))
                conn.sendall(command.encode() + b"\n")
                reply = conn.makefile("r", encoding="utf-8").readline().strip()
        except OSError as err:
            raise SharingError(f"the MPS daemon in {pipe} does not answer: {err.strerror or err}") from err
        if reply != "ok":
            raise SharingError(f"the MPS daemon refused {command!r}: {reply}")


class _Gpu:
    """A GPU known by its UUID alone (recovery), as the daemon's start needs it."""

    def __init__(self, uuid: str) -> None:
        self.uuid = uuid
        self.name = uuid


def _check_tenant(claim: ClaimRef, device: PlannedDevice, prepared: Iterable[ClaimRecord]) -> None:
    """Refuse a share of a GPU whose enforced shares belong to claims of another namespace."""
    for record in prepared:
        if record.namespace == claim.namespace:
            continue
        if any(d.uuid == device.uuid and d.share is not None and d.share.enforced for d in record.devices):
            holder = record.namespace or "unknown (a claim recovered without the checkpoint)"
            raise SharingError(
                f"GPU {device.name} ({device.uuid}) holds MPS shares of namespace {holder}; the shares of a "
                "GPU share one MPS daemon and pipe directory, so they come from one namespace: this one is "
                "prepared once those are released"
            )


def _client(share: ShareRecord | ShareLimits) -> str:
    return f"{share.thread_percentage} {share.memory_mib}M"


def _shares_by_gpu(records: Iterable[ClaimRecord]) -> dict[str, dict[str, ShareRecord]]:
    """GPU UUID -> the shares on it (share ID -> its record)."""
    shares: dict[str, dict[str, ShareRecord]] = {}
    for record in records:
        for device in record.devices:
            if device.share is not None and device.share_id is not None:
                shares.setdefault(device.uuid, {})[device.share_id] = device.share
    return shares


def host_share_daemons(policy: SharePolicy | None, *, driver_root: Path, state_dir: Path) -> ShareDaemons:
    """The node's shares held by the host driver's MPS control tool (none: shares fail, saying so)."""
    found = find_binary(driver_root, "nvidia-cuda-mps-control")
    return ShareDaemons(
        policy,
        None if found is None else MpsDaemons([str(found)], state_dir / SHARES_DIRECTORY),
        missing=f"the host driver under {driver_root} has no nvidia-cuda-mps-control (no MPS on this node)",
    )
