"""The health policy's settings: defaults, and the YAML file `serve --health-config` reads.

Every setting has a default that suits a production node, so the file holds only what differs:

    xids:                         # per-XID class: fatal | application | informational (beats the
                                  # recovery action NVML reports with an XID, which beats the table)
      94: application             # e.g. treat contained ECC errors as the application's problem
      13: fatal                   # or distrust the GPU after a graphics exception
    unlistedXids: fatal           # the class of XIDs neither the defaults nor `xids` name
    quietPeriodSeconds: 300       # no fatal event for this long before a device is re-checked
    recheckIntervalSeconds: 30    # how often a failing re-check is repeated
    taintEffect: NoSchedule       # or NoExecute: also evict pods already using the device
    thresholds:                   # NVML only, off unless set
      temperatureCelsius: 90
      uncorrectedEccErrors: 1     # volatile count (since the last driver load or GPU reset)
      pollIntervalSeconds: 30
    enabled: true                 # false: no health monitoring at all (every device HEALTHY)

Unknown fields and wrong types are errors naming the field, so a typo cannot silently leave a
default in place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from dradriver.files import FileInputError, load_document
from dradriver.health.xid import MAX_XID, XidClass

#: Upper bound of durations, so that a unit mix-up (milliseconds) is caught.
_MAX_SECONDS = 7 * 24 * 3600.0


class HealthConfigError(Exception):
    """The health config file is unreadable or invalid; the message names the file and field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)


class Thresholds(_Model):
    temperature_celsius: Annotated[int, Field(gt=0, le=200)] | None = None
    uncorrected_ecc_errors: Annotated[int, Field(gt=0)] | None = None
    poll_interval_seconds: Annotated[float, Field(ge=1, le=_MAX_SECONDS)] = 30.0

    @property
    def enabled(self) -> bool:
        return self.temperature_celsius is not None or self.uncorrected_ecc_errors is not None


class HealthConfig(_Model):
    enabled: bool = True
    xids: dict[Annotated[int, Field(ge=0, le=MAX_XID)], XidClass] = Field(default_factory=dict)
    unlisted_xids: XidClass = XidClass.FATAL
    quiet_period_seconds: Annotated[float, Field(ge=0, le=_MAX_SECONDS)] = 300.0
    recheck_interval_seconds: Annotated[float, Field(gt=0, le=_MAX_SECONDS)] = 30.0
    taint_effect: Literal["NoSchedule", "NoExecute"] = "NoSchedule"
    thresholds: Thresholds = Field(default_factory=Thresholds)


def load_health_config(path: Path) -> HealthConfig:
    """Read and validate the YAML file; raises HealthConfigError with a one-line reason."""
    try:
        data = load_document(path)
    except FileInputError as err:
        raise HealthConfigError(str(err)) from None
    if data is None:
        return HealthConfig()
    if not isinstance(data, dict):
        raise HealthConfigError(f"{path}: must be a mapping of settings, not {type(data).__name__}")
    try:
        return HealthConfig.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
        raise HealthConfigError(f"{path}: {where}: {first['msg']}{more}") from None
