"""Run as a program: what a CUDA application sees through one libcuda.so.1 (argv[1]), as JSON.

With `--context` it also makes each device's primary context current and allocates on it (an MPS
client connects to its server then), and reports the SMs the context may use and the memory it
is told of: an MPS thread percentage or pinned-memory limit shows there.
"""

from __future__ import annotations

import ctypes
import json
import sys

CU_EXEC_AFFINITY_TYPE_SM_COUNT = 0


class _ExecAffinity(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("sm_count", ctypes.c_uint)]


def _check(lib: ctypes.CDLL, name: str, *args: object) -> None:
    rc = getattr(lib, name)(*args)
    if rc != 0:
        text = ctypes.c_char_p()
        lib.cuGetErrorString(rc, ctypes.byref(text))
        print(json.dumps({"error": f"{name} returned {rc}: {(text.value or b'').decode()}"}))
        sys.exit(1)


def _uuid(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def main() -> None:
    lib = ctypes.CDLL(sys.argv[1])
    _check(lib, "cuInit", 0)
    count = ctypes.c_int()
    _check(lib, "cuDeviceGetCount", ctypes.byref(count))
    devices = []
    for ordinal in range(count.value):
        device = ctypes.c_int()
        _check(lib, "cuDeviceGet", ctypes.byref(device), ordinal)
        name = ctypes.create_string_buffer(256)
        _check(lib, "cuDeviceGetName", name, 256, device)
        uuid = (ctypes.c_ubyte * 16)()
        _check(lib, "cuDeviceGetUuid_v2", uuid, device)
        entry: dict[str, object] = {"name": name.value.decode(), "uuid": _uuid(bytes(uuid))}
        if "--context" in sys.argv:
            context = ctypes.c_void_p()
            _check(lib, "cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
            _check(lib, "cuCtxSetCurrent", context)
            pointer = ctypes.c_uint64()
            _check(lib, "cuMemAlloc_v2", ctypes.byref(pointer), 1 << 20)
            _check(lib, "cuMemFree_v2", pointer)
            affinity = _ExecAffinity()
            _check(lib, "cuCtxGetExecAffinity", ctypes.byref(affinity), CU_EXEC_AFFINITY_TYPE_SM_COUNT)
            free, total = ctypes.c_size_t(), ctypes.c_size_t()
            _check(lib, "cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
            entry |= {"smCount": affinity.sm_count, "memoryTotal": total.value}
            _check(lib, "cuDevicePrimaryCtxRelease_v2", device)
        devices.append(entry)
    print(json.dumps({"devices": devices}))


if __name__ == "__main__":
    main()
