"""Build hooks (the metadata is in pyproject.toml): built packages record the git commit they
were built from, which `dradriver version` reports (src/dradriver/buildinfo.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent


def _source_state() -> tuple[str, str]:
    """(file name, content): this tree's commit as the package embeds it."""
    # Loaded by path: the package's own imports need dependencies a build environment lacks.
    name = "_dradriver_buildinfo"
    spec = importlib.util.spec_from_file_location(name, ROOT / "src/dradriver/buildinfo.py")
    if spec is None or spec.loader is None:
        raise RuntimeError("src/dradriver/buildinfo.py cannot be loaded")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return str(module.EMBEDDED_FILE), str(module.of_source_tree(ROOT).to_json())


class BuildPy(build_py):
    def run(self) -> None:
        file, state = _source_state()
        super().run()
        if not self.editable_mode:  # an editable install asks git at run time instead
            (Path(self.build_lib) / "dradriver" / file).write_text(state)


class Sdist(sdist):
    # So that a wheel built from the sdist, where there is no git, still knows the commit.
    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        file, state = _source_state()  # before the release tree shows in the work tree as untracked
        super().make_release_tree(base_dir, files)
        (Path(base_dir) / "src/dradriver" / file).write_text(state)


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
