"""The fake backend: GPUs described by a profile (`--fake-gpus`), for nodes and tests without GPUs."""
