"""Run as a program (Triton compiles only kernels defined in a file): a Triton kernel, what
torch.compile generates, on the container's one GPU; prints what it saw as JSON, with the
libcuda the process loaded."""

import json

import torch
import triton
import triton.language as tl


@triton.jit
def add(x, y, out, n, block: tl.constexpr):  # type: ignore[no-untyped-def]  # Triton: no annotations but constexpr
    i = tl.program_id(0) * block + tl.arange(0, block)
    tl.store(out + i, tl.load(x + i, mask=i < n) + tl.load(y + i, mask=i < n), mask=i < n)


x = torch.arange(4096, device="cuda", dtype=torch.float32)
out = torch.empty_like(x)
add[(16,)](x, x, out, 4096, block=256)
with open("/proc/self/maps") as maps:
    libcuda = sorted({line.split()[-1] for line in maps if "/libcuda.so" in line})
seen = {
    "ok": bool(torch.equal(out, 2 * x)),
    "count": torch.cuda.device_count(),
    "uuid": str(torch.cuda.get_device_properties(0).uuid),
    "libcuda": libcuda,
}
print(json.dumps(seen))
