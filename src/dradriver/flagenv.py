"""The one rule naming a flag's environment variable: `--some-flag` -> `DRADRIVER_SOME_FLAG`."""

from __future__ import annotations

ENV_PREFIX = "DRADRIVER_"


def env_name(flag: str) -> str:
    """`--kubelet-plugins-dir` -> `DRADRIVER_KUBELET_PLUGINS_DIR`."""
    return ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_")
