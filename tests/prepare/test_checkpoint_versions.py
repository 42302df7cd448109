"""The checkpoint across versions: the released reader and this one read each other's files, and
fields a newer version wrote survive this version's rewrite.

`checkpoint-v1.json` is the released format (what 0.1.0 writes); `checkpoint-v1-newer.json` is
that file as a newer version might write it, with fields this one does not know at every level.
The released reader itself is loaded from the project's git history.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from dradriver.prepare.checkpoint import CheckpointStore, checksum, decode, encode
from tests.prepare.node import Node
from tests.prepare.test_gpu_driver import one_gpu

GOLDEN = Path(__file__).parent / "golden"
RELEASED = GOLDEN / "checkpoint-v1.json"
NEWER = GOLDEN / "checkpoint-v1-newer.json"
REPO = Path(__file__).resolve().parents[2]
#: The last landed commit of 0.1.0 (the released checkpoint format) and its reader.
RELEASED_COMMIT = "2a55cdf"
RELEASED_PATH = "src/dradriver/prepare/checkpoint.py"


@pytest.fixture(scope="module")
def released() -> ModuleType:
    """The released `dradriver.prepare.checkpoint`, from git history."""
    git = shutil.which("git")
    shown = (
        subprocess.run(
            [git, "-C", str(REPO), "show", f"{RELEASED_COMMIT}:{RELEASED_PATH}"],
            capture_output=True,
            text=True,
            check=False,
        )
        if git
        else None
    )
    if shown is None or shown.returncode != 0:
        pytest.skip(
            f"the released checkpoint reader ({RELEASED_COMMIT}) is not in this checkout's git history"
        )
    spec = importlib.util.spec_from_loader("released_checkpoint", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the models' annotations through it
    # Its one import from a module that has moved since points at where that function lives now.
    source = shown.stdout.replace(
        "from dradriver.prepare.cdi import write_atomically",
        "from dradriver.files.write import write_atomically",
    )
    exec(compile(source, f"{RELEASED_COMMIT}:{RELEASED_PATH}", "exec"), module.__dict__)
    return module


def data_of(raw: bytes) -> dict[str, object]:
    document = json.loads(raw)
    assert document["checksum"] == checksum(document["data"])
    data: dict[str, object] = document["data"]
    return data


def test_fields_of_a_newer_version_survive_a_rewrite(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save(decode(NEWER.read_bytes()))
    assert data_of(store.path.read_bytes()) == data_of(NEWER.read_bytes())


def test_a_restart_and_a_prepare_keep_a_newer_versions_fields(tmp_path: Path) -> None:
    node = Node(tmp_path, "dgx-h100")
    newer = json.loads(NEWER.read_text())
    newer["data"]["boot_id"] = node.boot_id
    node.store.path.parent.mkdir(parents=True, exist_ok=True)
    node.store.path.write_text(json.dumps(newer))
    (uid,) = newer["data"]["claims"]
    device = {"name": f"{uid}-gpu-0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}
    node.cdi.write(uid, {"cdiVersion": "0.5.0", "kind": "k8s.gpu.dradriver.dev/claim", "devices": [device]})
    driver = node.driver()  # recover() rewrites the checkpoint
    ref = node.add(one_gpu(7, "gpu-5"))
    assert driver.prepare([ref])[ref.uid].error == ""
    written = data_of(node.store.path.read_bytes())
    assert written["future_top_level"] == newer["data"]["future_top_level"]
    claims = written["claims"]
    assert isinstance(claims, dict)
    assert claims[uid] == newer["data"]["claims"][uid]
    driver.close()


def test_this_version_reads_the_released_writers_file(released: ModuleType) -> None:
    released_file = released.encode(released.decode(RELEASED.read_bytes()))
    assert json.loads(released_file) == json.loads(RELEASED.read_text())
    ours = decode(released_file)
    # Same document (and checksum); only the whitespace of the encoding may differ.
    assert json.loads(encode(ours)) == json.loads(released_file)


def test_the_released_reader_reads_this_versions_file(released: ModuleType, tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save(decode(NEWER.read_bytes()))
    theirs = released.decode(store.path.read_bytes())  # unknown fields ignored, checksum verified
    expected = released.decode(RELEASED.read_bytes())
    assert theirs == expected
