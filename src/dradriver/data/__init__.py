"""The DeviceClasses and example claims that ship with dradriver.

`deviceclasses/` and `examples/` here are links to the repository's top-level directories, which
stay the source of truth; a build copies their files into the wheel. So `dry-run` and
`dradriver examples` read the same files from a checkout, a wheel install and the image.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).parent
DEVICE_CLASSES = ROOT / "deviceclasses"
#: The optional classes a ResourceQuota can cap GPUs of one model, MIG devices of one profile by.
QUOTA_DEVICE_CLASSES = DEVICE_CLASSES / "quota"
EXAMPLE_CLAIMS = ROOT / "examples" / "claims"
#: What `dradriver examples` serves, relative to ROOT (the repository's layout).
DIRECTORIES = ("deviceclasses", "deviceclasses/quota", "examples/claims", "examples/quotas")
