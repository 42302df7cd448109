"""GPU backends: one interface (`backend.interface.GpuBackend`), two implementations.

- `backend.nvml`: the node's real GPUs through NVML (`nvidia-ml-py`).
- `backend.fake`: GPUs a profile describes (`--fake-gpus`), for laptops, CI and tests.

`backend.select.open_backend` picks one; nothing above this package knows which it has. This
module imports nothing, so a light look at one backend (the built-in profile names) stays light.
"""
