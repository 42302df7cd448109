"""Sharing on fake GPUs: time slices kept in memory, MPS through one stand-in control daemon per
claim (`dradriver.backend.fake.mps_standin`), so MPS claims prepare, get their pipe directory and
clean up exactly as on a GPU node."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from dradriver.prepare.cdi import ContainerEdits
from dradriver.prepare.config import Interval, Sharing, TimeSlicing
from dradriver.prepare.sharing_settings import MPS_STANDIN, MpsDaemons, SharedDevice, timeslice_env


class FakeSharing:
    """Time slices land in memory (inspectable by tests); MPS runs the stand-in control daemon."""

    def __init__(self, state_dir: Path, host_state_dir: Path | None = None) -> None:
        self.timeslices: dict[str, Interval] = {}
        self._lock = threading.Lock()
        self._mps = MpsDaemons(MPS_STANDIN, state_dir, host_state_dir)

    def apply(self, claim_uid: str, sharing: Sharing, devices: Sequence[SharedDevice]) -> ContainerEdits:
        if sharing.strategy == "MPS":
            return self._mps.start(claim_uid, sharing, devices)
        interval = (sharing.time_slicing or TimeSlicing()).interval
        with self._lock:
            for device in devices:
                self.timeslices[device.uuid] = interval
        return ContainerEdits(env=(timeslice_env(interval),))

    def release(self, claim_uid: str, sharing: str, uuids: Sequence[str]) -> None:
        if sharing == "MPS":
            self._mps.stop(claim_uid)
            return
        with self._lock:
            for uuid in uuids:
                self.timeslices.pop(uuid, None)
