"""What preparing claims and recovering them at start-up both work on, built once by the driver."""

from __future__ import annotations

from dataclasses import dataclass

from dradriver.prepare.cdi import CdiDirectory
from dradriver.prepare.gpu_share_daemons import ShareDaemons
from dradriver.prepare.ledger import Ledger
from dradriver.prepare.metadata_files import MetadataFiles
from dradriver.prepare.release import Release


@dataclass(frozen=True)
class ClaimContext:
    """The driver's and pool's names, the records of prepared claims, their spec and device
    metadata files, how a claim's devices are released and the GPUs' share daemons."""

    driver_name: str
    pool_name: str
    ledger: Ledger
    cdi_dir: CdiDirectory
    release: Release
    shares: ShareDaemons
    metadata: MetadataFiles
