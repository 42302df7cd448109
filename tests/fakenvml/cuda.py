"""The C fake libcuda.so.1, the stand-in nvidia-smi and the CUDA probe (this directory), and the
root filesystems the probe runs in.

The fake libcuda answers from a table of the node's GPUs appended to its own file (see
fake_cuda.c), so a copy laid out in a driver root serves that node wherever a CDI spec mounts it.
The roots are real glibc roots, each laid out as a family of images is, with no shell:

- `debian-slim`: Debian's multiarch layout, its own ld.so.cache, no LD_LIBRARY_PATH (what
  python:3.12-slim and debian:bookworm-slim are); a whole Debian root may be given for it;
- `lib64`: the RHEL family's layout (/usr/lib64, /lib64 a link to it) whose ld.so.cache names a
  CUDA stub in /usr/lib64, as images with CUDA's stubs or compat packages have: the stub must
  lose to the host driver's library mounted over it;
- `own-ld-library-path`: an LD_LIBRARY_PATH naming the image's own directory, which a library the
  probe loads first lives in: it must keep working;
- `cuda-image`: the nvidia/cuda images' LD_LIBRARY_PATH and PATH (/usr/local/nvidia).
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dradriver.discovery import NodeInventory
from tests.fakenvml.harness import compiler

HERE = Path(__file__).parent
TABLE_MARKER = b"\n#fake-cuda-gpus\n"
#: The multiarch triplet of the roots: the libc copied in is this machine's.
TRIPLET = f"{platform.machine()}-linux-gnu"
LOADER = "ld-linux-x86-64.so.2"
PROBE_IN_ROOT = "/usr/local/bin/cuda-probe"
HELPER_SONAME = "libprobehelper.so.1"
#: What CUDA's stub libcuda.so.1 answers to cuInit: CUDA_ERROR_STUB_LIBRARY.
STUB_SOURCE = "int cuInit(unsigned int flags) { (void)flags; return 34; }\n"
HELPER_SOURCE = "int probe_helper(void) { return 1; }\n"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class CudaBuild:
    """The compiled fakes: libcuda without a table (see `with_table`), nvidia-smi, the probe, and
    the probe roots' own libraries (a CUDA stub, a helper found through LD_LIBRARY_PATH)."""

    libcuda: Path
    nvidia_smi: Path
    probe: Path
    stub: Path
    helper: Path


@dataclass(frozen=True)
class ProbeRoot:
    """A root filesystem with the probe, and how an image built from it runs it."""

    name: str
    path: Path
    env: tuple[str, ...]
    command: tuple[str, ...]
    #: Where the probe's libcuda.so.1 must come from in a container of this image.
    libcuda_dir: str


def _cc(out: Path, *args: str | Path) -> Path:
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc) on PATH")
    subprocess.run(
        [cc, "-O1", "-Wall", "-Wextra", "-Werror", "-o", out, *args], check=True, capture_output=True
    )
    return out


def _shared(out: Path, soname: str, source: Path | str) -> Path:
    if isinstance(source, Path):
        return _cc(out, "-shared", "-fPIC", f"-Wl,-soname,{soname}", source)
    with tempfile.NamedTemporaryFile("w", suffix=".c", dir=out.parent) as file:
        file.write(source)
        file.flush()
        return _cc(out, "-shared", "-fPIC", f"-Wl,-soname,{soname}", file.name)


def build(out_dir: Path) -> CudaBuild:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "stub").mkdir(exist_ok=True)
    return CudaBuild(
        libcuda=_shared(out_dir / "libcuda.so.1", "libcuda.so.1", HERE / "fake_cuda.c"),
        nvidia_smi=_cc(out_dir / "nvidia-smi", HERE / "fake_nvidia_smi.c"),
        probe=_cc(out_dir / "cuda-probe", HERE / "cuda_probe.c"),
        stub=_shared(out_dir / "stub" / "libcuda.so.1", "libcuda.so.1", STUB_SOURCE),
        helper=_shared(out_dir / HELPER_SONAME, HELPER_SONAME, HELPER_SOURCE),
    )


def gpu_table(inventory: NodeInventory) -> str:
    """The fake libcuda's table for a node: its whole GPUs, and on GPUs in MIG mode its MIG
    devices (CUDA sees those, not the GPU), each with the nodes that give access to it."""
    lines = []
    for gpu in inventory.gpus:
        node = f"/dev/nvidia{gpu.minor}"
        if not gpu.mig_enabled:
            lines.append(f"gpu\t{node}\t{gpu.uuid}\t{gpu.product_name}\t{gpu.memory_bytes}")
            continue
        for mig in gpu.mig_devices:
            caps = [f"/dev/nvidia-caps/nvidia-cap{m}" for m in (mig.gi_caps_minor, mig.ci_caps_minor)]
            name = f"{gpu.product_name} MIG {mig.profile}"
            lines.append("\t".join(["mig", node, *caps, mig.uuid, name, str(mig.resources.memory_mib << 20)]))
    return "\n".join(lines) + "\n"


def with_table(library: Path, inventory: NodeInventory, out: Path) -> Path:
    """A copy of the fake libcuda at `out` that serves `inventory`."""
    out.write_bytes(library.read_bytes() + TABLE_MARKER + gpu_table(inventory).encode())
    out.chmod(0o755)
    return out


def libc_dir() -> Path:
    """Where this machine's glibc lives (the roots' libc is a copy of it)."""
    return Path("/lib") / TRIPLET


#: What glibc's runtime package (Debian's libc6, RHEL's glibc) puts in every image: the real
#: libcuda.so.1 and nvidia-smi need libm, libdl, libpthread and librt beside libc.
GLIBC = ("libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1")


def _base(root: Path) -> None:
    for sub in ("dev", "proc", "sys", "tmp", "etc", "root", "usr/bin", "usr/local/bin"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/nonexistent\n")
    (root / "etc/group").write_text("root:x:0:\n")
    (root / "tmp").chmod(0o1777)


def _glibc(root: Path, lib_dir: str, libc: Path) -> None:
    """glibc in `lib_dir` (a path in the root), the loader where every x86-64 binary asks for it."""
    target = root / lib_dir.lstrip("/")
    target.mkdir(parents=True, exist_ok=True)
    for name in (*GLIBC, LOADER):
        shutil.copy(libc / name, target / name)  # the files links name
    if lib_dir == "/usr/lib64":
        (root / "lib64").symlink_to("usr/lib64")
    else:
        (root / "lib64").mkdir(exist_ok=True)
        (root / "lib64" / LOADER).symlink_to(f"{lib_dir}/{LOADER}")


def _ldconfig(root: Path, directories: str) -> None:
    """The image's own ld.so.cache, as its package manager leaves it."""
    (root / "etc/ld.so.conf").write_text(directories)
    subprocess.run(["ldconfig", "-r", str(root)], check=True, capture_output=True)


def _with_probe(root: Path, cuda: CudaBuild) -> None:
    shutil.copy(cuda.probe, root / PROBE_IN_ROOT.lstrip("/"))


def probe_roots(dest: Path, cuda: CudaBuild, *, debian_root: Path | None = None) -> list[ProbeRoot]:
    """The probe roots under `dest`. `debian_root`, a whole Debian root (mmdebstrap's), becomes
    `debian-slim` in place (its device nodes go: an image has none) instead of a root laid out
    from this machine's glibc."""
    libc = libc_dir()
    multiarch = f"/usr/lib/{TRIPLET}"
    roots = []

    slim = dest / "debian-slim" if debian_root is None else debian_root
    if debian_root is not None:
        for entry in (slim / "dev").iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        _base(slim)
        if not (slim / "etc/ld.so.conf").exists():  # libc-bin's, which a slim image has
            _ldconfig(slim, "include /etc/ld.so.conf.d/*.conf\n")
        else:
            subprocess.run(["ldconfig", "-r", str(slim)], check=True, capture_output=True)
    else:
        _base(slim)
        _glibc(slim, multiarch, libc)
        _ldconfig(slim, f"{multiarch}\n")
    _with_probe(slim, cuda)
    roots.append(ProbeRoot("debian-slim", slim, (f"PATH={DEFAULT_PATH}",), (PROBE_IN_ROOT,), multiarch))

    lib64 = dest / "lib64"
    _base(lib64)
    _glibc(lib64, "/usr/lib64", libc)
    shutil.copy(cuda.stub, lib64 / "usr/lib64/libcuda.so.1")
    _ldconfig(lib64, "/usr/lib64\n")
    _with_probe(lib64, cuda)
    path = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"  # RHEL's
    roots.append(ProbeRoot("lib64", lib64, (path,), (PROBE_IN_ROOT,), "/usr/lib64"))

    own = dest / "own-ld-library-path"
    _base(own)
    _glibc(own, multiarch, libc)
    _ldconfig(own, f"{multiarch}\n")
    (own / "opt/app/lib").mkdir(parents=True)
    shutil.copy(cuda.helper, own / "opt/app/lib" / HELPER_SONAME)
    _with_probe(own, cuda)
    env = (f"PATH={DEFAULT_PATH}", "LD_LIBRARY_PATH=/opt/app/lib")
    roots.append(ProbeRoot(own.name, own, env, (PROBE_IN_ROOT, "--need", HELPER_SONAME), multiarch))

    image = dest / "cuda-image"
    _base(image)
    _glibc(image, multiarch, libc)
    _ldconfig(image, f"{multiarch}\n")
    _with_probe(image, cuda)
    env = (
        f"PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:{DEFAULT_PATH}",
        "LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
    )
    roots.append(ProbeRoot(image.name, image, env, (PROBE_IN_ROOT,), "/usr/local/nvidia/lib64"))
    return roots


@dataclass(frozen=True)
class Probed:
    """What the probe printed."""

    libcuda: str
    ld_library_path: str
    needed: Mapping[str, str]
    #: UUID (lower-case hex, no prefix) -> (SM count, memory bytes, name).
    devices: Mapping[str, tuple[int, int, str]]
    nvidia_smi: tuple[str, ...]
    ok: bool


def parse_probe(output: str) -> Probed:
    libcuda = ld_path = ""
    needed: dict[str, str] = {}
    devices: dict[str, tuple[int, int, str]] = {}
    smi = []
    for line in output.splitlines():
        words = line.split(" ", 5)
        if words[0] == "libcuda":
            libcuda = words[1]
        elif words[0] == "ld-library-path":
            ld_path = words[1]
        elif words[0] == "needed":
            needed[words[1]] = words[2]
        elif words[0] == "device" and len(words) == 6:
            devices[words[2]] = (int(words[3]), int(words[4]), words[5])
        elif line.startswith("GPU "):
            smi.append(line)
    return Probed(libcuda, ld_path, needed, devices, tuple(smi), "probe ok" in output.splitlines())


def bare_uuid(uuid: str) -> str:
    """`GPU-ad41...` / `MIG-c5a5...` as CUDA's 16 bytes print (no prefix)."""
    return uuid.split("-", 1)[1].lower()
