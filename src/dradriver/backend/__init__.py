"""GPU backends: NVML (`backend.nvml`) and fake GPUs (`backend.fake`)."""
