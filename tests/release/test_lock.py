"""requirements.lock is current with pyproject.toml (regenerate it with `make lock`).

Every runtime dependency and every transitive one is pinned with hashes, each pin satisfies
every range that asks for it, and nothing else is pinned. Dependency metadata comes from the
development venv, which `make` installs from the lock itself; markers are evaluated for the
image's interpreter, for which `make lock` resolves.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from dataclasses import dataclass

from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

from scripts.build_image import ARCH, LOCK, PYTHON_VERSION, REPO

#: The image's interpreter, for which `make lock` resolves (markers compare minor versions).
IMAGE_PYTHON: dict[str, str] = {
    "implementation_name": "cpython",
    "implementation_version": f"{PYTHON_VERSION}.0",
    "os_name": "posix",
    "platform_machine": ARCH,
    "platform_python_implementation": "CPython",
    "platform_release": "",
    "platform_system": "Linux",
    "platform_version": "",
    "python_full_version": f"{PYTHON_VERSION}.0",
    "python_version": PYTHON_VERSION,
    "sys_platform": "linux",
}


@dataclass(frozen=True)
class Pin:
    version: Version
    hashes: tuple[str, ...]


def read_lock() -> dict[NormalizedName, Pin]:
    """`name==version --hash=...` entries of the lock (pip's requirements format)."""
    pins: dict[NormalizedName, Pin] = {}
    for text in LOCK.read_text().replace("\\\n", " ").splitlines():
        line = text.split("#", 1)[0].strip()
        if not line:
            continue
        requirement, *options = line.split()
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([^;\s]+)", requirement)
        assert match, f"requirements.lock: {line!r} is not a `name==version` pin"
        name = canonicalize_name(match[1])
        assert name not in pins, f"requirements.lock pins {name} twice"
        hashes = tuple(o.removeprefix("--hash=") for o in options if o.startswith("--hash="))
        pins[name] = Pin(Version(match[2]), hashes)
    return pins


def runtime_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"]]


def applies(requirement: Requirement, extras: frozenset[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({**IMAGE_PYTHON, "extra": e}) for e in extras or {""})


def sha256(option: str) -> bool:
    return re.fullmatch(r"sha256:[0-9a-f]{64}", option) is not None


def test_every_pin_carries_hashes() -> None:
    pins = read_lock()
    assert pins, "requirements.lock pins nothing"
    unhashed = [name for name, pin in pins.items() if not pin.hashes or not all(map(sha256, pin.hashes))]
    assert not unhashed, f"pins without sha256 hashes: {unhashed}"


def test_runtime_dependencies_are_pinned_within_pyproject_ranges() -> None:
    pins = read_lock()
    for requirement in runtime_requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"pyproject.toml depends on {requirement}; requirements.lock does not pin it"
        assert requirement.specifier.contains(pins[name].version, prereleases=True), (
            f"requirements.lock pins {name}=={pins[name].version}, outside pyproject.toml's {requirement}"
        )


def test_lock_pins_exactly_the_transitive_closure() -> None:
    pins = read_lock()
    needed: set[NormalizedName] = set()
    walked: set[tuple[NormalizedName, frozenset[str]]] = set()
    pending: list[tuple[Requirement, str]] = [(r, "pyproject.toml") for r in runtime_requirements()]
    while pending:
        requirement, wanted_by = pending.pop()
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{wanted_by} needs {requirement}; requirements.lock does not pin it"
        assert requirement.specifier.contains(pins[name].version, prereleases=True), (
            f"{wanted_by} needs {requirement}; requirements.lock pins {pins[name].version}"
        )
        needed.add(name)
        extras = frozenset(requirement.extras)
        if (name, extras) in walked:
            continue
        walked.add((name, extras))
        installed = Version(importlib.metadata.version(name))
        assert installed == pins[name].version, (
            f"the venv has {name} {installed}, the lock {pins[name].version}: rerun `make .venv/.installed`"
        )
        for text in importlib.metadata.requires(name) or []:
            dependency = Requirement(text)
            if applies(dependency, extras):
                pending.append((dependency, f"{name}=={installed}"))
    unneeded = sorted(set(pins) - needed)
    assert not unneeded, f"requirements.lock pins what nothing needs (run `make lock`): {unneeded}"
