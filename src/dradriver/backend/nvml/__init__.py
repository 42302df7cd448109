"""The NVML backend: the node's real GPUs through NVIDIA's `nvidia-ml-py` binding."""
