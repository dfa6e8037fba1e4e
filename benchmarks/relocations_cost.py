"""What the libraries' GOT check costs a settle (`verifier.run.relocations`), on this device.

Loads torch and warms the device as a GPU worker does (CUDA context, a conv and a matmul: the
math libraries mapped), then times, over the same loaded libraries:

    baseline   every library's whole RELRO hashed (round 16's first form of the check)
    got        the GOT sections inside RELRO and the bound lazy GOT entries (the check now)

    python -m benchmarks.relocations_cost [--repeat 20] [--out FILE.md]

Stdlib and torch only (it runs on the GPU node)."""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import struct
import sys
import time
from pathlib import Path


def _whole_relro(mem: int) -> int:
    """Bytes hashed when every library's whole RELRO is (the baseline)."""
    from verifier.run import relocations

    done = 0
    for path, where in relocations._objects().items():
        try:
            with open(path, "rb") as f:
                head = f.read(64)
            if head[:6] != b"\x7fELF\x02\x01":
                continue
            with open(path, "rb") as f:
                phoff = struct.unpack_from("<Q", head, 0x20)[0]
                phsize, phnum = struct.unpack_from("<HH", head, 0x36)
                f.seek(phoff)
                heads = [struct.unpack_from("<IIQQQQQQ", f.read(phsize)) for _ in range(phnum)]
            first = min((h[3] for h in heads if h[0] == 1), default=0)
            relro = next(((h[3], h[5]) for h in heads if h[0] == 0x6474E552), (0, 0))
            if relro[1]:
                base = where[0] - (first & ~0xFFF)
                hashlib.blake2b(os.pread(mem, relro[1], base + relro[0]), digest_size=8)
                done += relro[1]
        except (OSError, ValueError):
            continue
    return done


def _got_bytes() -> int:
    from verifier.run import relocations

    total = 0
    for path in relocations._objects():
        try:
            st = os.stat(path)
            total += sum(n for _, n in relocations._layout(path, (st.st_ino, st.st_mtime_ns))[1])
        except (OSError, ValueError):
            continue
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    import torch

    from verifier.run import relocations

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.ones(1, 1, 8, 8, device=dev)
    torch.nn.functional.conv2d(x, torch.ones(1, 1, 3, 3, device=dev)).sum().item()
    (x[0, 0] @ x[0, 0]).sum().item()
    libs = len(relocations._objects())
    mem = os.open("/proc/self/mem", os.O_RDONLY)
    try:
        whole, got, nbytes = [], [], 0
        relocations.snapshot()  # headers parsed once per file, as in a worker's life
        for _ in range(a.repeat):
            t = time.perf_counter()
            nbytes = _whole_relro(mem)
            whole.append(time.perf_counter() - t)
            t = time.perf_counter()
            relocations.snapshot()
            got.append(time.perf_counter() - t)
    finally:
        os.close(mem)
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    lines = [f"# The libraries' GOT check, per settle ({name}, {libs} mapped files, python "
             f"{sys.version.split()[0]})", "",
             "| check | KiB hashed | median ms | max ms |", "| --- | --- | --- | --- |",
             f"| baseline: every library's whole RELRO | {nbytes >> 10} | "
             f"{statistics.median(whole) * 1e3:.1f} | {max(whole) * 1e3:.1f} |",
             f"| GOT in RELRO + bound lazy entries (now) | {_got_bytes() >> 10} | "
             f"{statistics.median(got) * 1e3:.1f} | {max(got) * 1e3:.1f} |"]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text, "utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
