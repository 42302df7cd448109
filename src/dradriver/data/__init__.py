"""The DeviceClasses and example claims that ship with dradriver.

`deviceclasses/` and `examples/` here are links to the repository's top-level directories, which
stay the source of truth; a build copies their files into the wheel. So `dry-run` and
`dradriver examples` read the same files from a checkout, a wheel install and the image.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).parent
DEVICE_CLASSES = ROOT / "deviceclasses"
#: The optional classes (not applied by `kubectl apply -f deviceclasses/`): whole GPUs, GPUs of one
#: model and MIG devices of one profile, which a ResourceQuota can cap by name; the MIG ones also
#: serve the device plugin's `nvidia.com/mig-<profile>` names as extended resources.
OPTIONAL_DEVICE_CLASSES = DEVICE_CLASSES / "optional"
EXAMPLE_CLAIMS = ROOT / "examples" / "claims"
#: What `dradriver examples` serves, relative to ROOT (the repository's layout).
DIRECTORIES = ("deviceclasses", "deviceclasses/optional", "examples/claims", "examples/quotas")
