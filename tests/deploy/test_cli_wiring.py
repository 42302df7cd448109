"""The DaemonSet configures serve and its probes only through settings the CLI really has.

Every DRADRIVER_* variable the manifests set must be the env twin of a flag of `dradriver serve`
(a misspelt variable is silently ignored otherwise), and the values must parse: the real parser
is built with the rendered container environment and asked to parse `serve` and `healthcheck`.
"""

from __future__ import annotations

import argparse
import os

import pytest

from dradriver.cli import build_parser
from dradriver.flagenv import ENV_PREFIX, env_name
from tests.deploy.manifests import KUSTOMIZATIONS, container_env, plugin_container, render


def subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            found: argparse.ArgumentParser = action.choices[name]
            return found
    pytest.skip(f"`dradriver {name}` is not in this tree yet, so its flags cannot be checked")


def env_names(parser: argparse.ArgumentParser) -> set[str]:
    """DRADRIVER_* names of every long flag of a subcommand."""
    return {
        env_name(opt) for action in parser._actions for opt in action.option_strings if opt.startswith("--")
    }


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
@pytest.mark.parametrize("command", ["serve", "healthcheck"])
def test_container_env_parses_as_flags(
    kustomization: str, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = container_env(plugin_container(render(kustomization)))
    for name in [n for n in os.environ if n.startswith(ENV_PREFIX) or n == "NODE_NAME"]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parser = build_parser()
    sub = subcommand(parser, command)
    if command == "serve":
        unknown = {n for n in env if n.startswith(ENV_PREFIX)} - env_names(sub)
        assert not unknown, f"deploy/{kustomization} sets variables serve has no flag for: {sorted(unknown)}"
    args = parser.parse_args([command])
    # The probe must look at the very socket serve creates.
    assert args.driver_name == env["DRADRIVER_DRIVER_NAME"]
    assert str(args.kubelet_plugins_dir) == env["DRADRIVER_KUBELET_PLUGINS_DIR"]
