"""Two prepare calls at once on a node-only `serve` (no --pod-uid, so no node-wide flock), the
checkpoint write of one of them failing: each answer is right, and the failed call undoes only
what it did itself (real serve, real gRPC over its unix socket, a real tmpfs state directory).

The state directory is left with room for the checkpoint with the small claim and not with the
big one: whichever call comes first, the big claim's write fails (ENOSPC) and the small one's
succeeds. Before calls were serialized, the failing call put back the records it had seen when it
started and released every other one, the small claim's included, about one round in ten.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from dradriver import kubeletclient
from dradriver.plugin.driver import ClaimRef
from dradriver.prepare.cdi import spec_file_name
from dradriver.prepare.checkpoint import FILE_NAME, CheckpointStore
from tests.faults.mounts import fill, tmpfs
from tests.helpers import ServeProcess, allocated_claim, opaque, short_tmpdir, uid

ROUNDS = 25
PAGE = os.sysconf("SC_PAGE_SIZE")
MPS: dict[str, object] = {
    "apiVersion": "gpu.dradriver.dev/v1alpha1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "MPS"},
}


def pages(size: int) -> int:
    return -(-size // PAGE)


def small(n: int) -> dict[str, object]:
    return allocated_claim(f"small-{n}", uid(1000 + n), [{"request": "gpu", "device": "gpu-1"}])


def big(n: int) -> dict[str, object]:
    devices: list[dict[str, object]] = [{"request": "gpu", "device": f"gpu-{i}"} for i in range(2, 8)]
    return allocated_claim(f"big-{n}", uid(2000 + n), devices)


def ref(claim: dict[str, object]) -> ClaimRef:
    meta = claim["metadata"]
    assert isinstance(meta, dict)
    return ClaimRef(meta["namespace"], meta["name"], meta["uid"])


def prepared(state: Path) -> set[str]:
    stored = CheckpointStore(state).load()
    return set() if stored is None else set(stored.claims)


def test_a_failed_checkpoint_write_undoes_only_its_own_call() -> None:
    with short_tmpdir() as root:
        state = root / "state"
        with tmpfs(state, "1m"):
            # The metadata beside, as the DaemonSet has it: the disk's last pages are the checkpoint's.
            metadata = ["--device-metadata-dir", str(root / "device-metadata")]
            serve = ServeProcess(root, ["--state-dir", str(state), "--log-format", "json", *metadata])
            kept = allocated_claim(
                "kept", uid(1), [{"request": "gpu", "device": "gpu-0"}], config=[opaque(MPS)]
            )
            claims = [kept] + [c for n in range(ROUNDS + 1) for c in (small(n), big(n))]
            (serve.claims_dir / "claims.yaml").write_text(yaml.safe_dump_all(claims))
            serve.start()
            try:
                kubeletclient.register(serve.registration_socket)
                with (
                    kubeletclient.DRAClient(serve.dra_socket) as one,
                    kubeletclient.DRAClient(serve.dra_socket) as other,
                ):
                    one.wait_ready(30)
                    assert one.prepare([ref(kept)]).claims[uid(1)].error == ""
                    kept_spec = serve.cdi_dir.joinpath(spec_name(serve, uid(1))).read_bytes()
                    pipe_dirs = sorted(p.name for p in (state / "mps").iterdir())
                    # How big the checkpoint grows with each claim: one round without a full disk.
                    checkpoint = state / FILE_NAME
                    with_small = size_with(one, small(ROUNDS), checkpoint)
                    with_big = size_with(one, big(ROUNDS), checkpoint)
                    assert pages(with_small) < pages(with_big)
                    filler = fill(state)
                    os.truncate(filler, filler.stat().st_size - pages(with_small) * PAGE)

                    for n in range(ROUNDS):
                        answers = at_once(partial(prepare, one, small(n)), partial(prepare, other, big(n)))
                        small_uid, big_uid = uid(1000 + n), uid(2000 + n)
                        assert answers[0][small_uid].error == "", f"round {n}"
                        assert "ENOSPC" in answers[1][big_uid].error, f"round {n}"
                        assert serve.cdi_dir.joinpath(spec_name(serve, small_uid)).exists(), f"round {n}"
                        assert not serve.cdi_dir.joinpath(spec_name(serve, big_uid)).exists(), f"round {n}"
                        assert prepared(state) == {uid(1), small_uid}, f"round {n}"
                        # Unprepared, the small claim stays unprepared: its write is smaller.
                        assert one.unprepare([ref(small(n))]).claims[small_uid].error == ""
                        assert prepared(state) == {uid(1)}, f"round {n}"

                    assert serve.cdi_dir.joinpath(spec_name(serve, uid(1))).read_bytes() == kept_spec
                    assert sorted(p.name for p in (state / "mps").iterdir()) == pipe_dirs
                    assert sorted(p.name for p in serve.cdi_dir.iterdir()) == [spec_name(serve, uid(1))]
            finally:
                serve.kill()
            # What memory held is what a restart finds: the kept claim alone, whole.
            restarted = ServeProcess(root, ["--state-dir", str(state)])
            filler.unlink()
            restarted.start()
            try:
                with kubeletclient.DRAClient(restarted.dra_socket) as client:
                    client.wait_ready(30)
                    assert prepared(state) == {uid(1)}
                    assert client.prepare([ref(kept)]).claims[uid(1)].error == ""
            finally:
                restarted.kill()


def spec_name(serve: ServeProcess, claim_uid: str) -> str:
    return spec_file_name(serve.driver, claim_uid)


def prepare(client: kubeletclient.DRAClient, claim: dict[str, object]) -> Any:
    return client.prepare([ref(claim)]).claims


def size_with(client: kubeletclient.DRAClient, claim: dict[str, object], checkpoint: Path) -> int:
    """The checkpoint's size with `claim` prepared too (then unprepared again)."""
    assert client.prepare([ref(claim)]).claims[ref(claim).uid].error == ""
    size = checkpoint.stat().st_size
    assert client.unprepare([ref(claim)]).claims[ref(claim).uid].error == ""
    return size


def at_once(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls on threads released together; their answers in order."""
    start = threading.Barrier(len(calls))
    answers: list[Any] = [None] * len(calls)

    def run(i: int, call: Callable[[], Any]) -> None:
        start.wait()
        answers[i] = call()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return answers
