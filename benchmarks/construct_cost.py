"""What building a large model costs by each construction method (`verifier.judge.construct`).

    python -m benchmarks.construct_cost [--device cuda] [--width 8192] [--layers 4]
        [--repeat 2] [--processes 2] [--out benchmarks/results/construct_cost_<tag>.md]

A stack of `--layers` nn.Linear(width, width), the shape of KernelBench main's level-3 MLPs
(level3/2_ShallowWideMLP holds 8.6 GB of fp32 weights), built seeded by the verifier's one rule:
`host` (KernelBench's way: built on the host, then moved to the device), `device` (under
`with torch.device(device)`, then `.to(device)`: the verifier's default) and, for reference,
`device` on the meta device (no weights drawn at all: the floor of the Python-side cost, what
the discovery run pays). Every figure is the best of --repeat builds, the device synchronized;
two builds by one method from one seed must hold the same weights (checked: the rule's
promise), and so must builds in `--processes` fresh processes (the worker and the referee are
two; the digests are exact fp64 sums). On a cpu-only host `host` and `device` do the same work; on a GPU `device` should
take the meta floor plus the GPU's own init kernels (milliseconds), where `host` pays one host
core's init (~1 s per 1e8 weights) and the copy.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from verifier.judge.construct import DEVICE, HOST, build  # noqa: E402


class Stack(nn.Module):
    """`layers` nn.Linear(width, width) with ReLUs between them."""

    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        mods: list[nn.Module] = []
        for _ in range(layers):
            mods += [nn.Linear(width, width), nn.ReLU()]
        self.net = nn.Sequential(*mods[:-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_build(width: int, layers: int, device: str, method: str, repeat: int
               ) -> tuple[float, bool]:
    """(best seconds of `repeat` seeded builds, whether two builds held the same weights)."""
    best, first = float("inf"), None
    same = True
    for _ in range(max(1, repeat)):
        _sync(device)
        t0 = time.perf_counter()
        model = build(Stack, [width, layers], 0, device, method)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
        if device != "meta":
            w = model.net[0].weight.detach()[:4, :64].cpu().clone()
            same = same and (first is None or torch.equal(first, w))
            first = w
        del model
    return best, same


class NumpyInit(nn.Module):
    """KernelBench accepts it (built on the host, then moved): `.numpy()` of a fresh tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.arange(4.0).numpy().tolist()
        self.w = nn.Parameter(torch.randn(4))


def host_only_row(device: str) -> str:
    """What the rule makes of NumpyInit on `device`: HostOnly off the cpu (the run is made again
    the host's way), built on the cpu (its device context is the host)."""
    from verifier.judge.construct import HostOnly, build_checked

    try:
        build_checked(NumpyInit, [], 0, device)
        return f"`.numpy()` in `__init__` on {device}: built under the device context"
    except HostOnly as exc:
        return f"`.numpy()` in `__init__` on {device}: HostOnly ({str(exc)[:160]})"


def digest(width: int, layers: int, device: str, method: str) -> str:
    """A fingerprint of the weights one seeded build by `method` holds (exact: fp64 sums of
    every tensor and its first values)."""
    model = build(Stack, [width, layers], 0, device, method)
    parts = []
    for t in model.parameters():
        flat = t.detach().double().flatten()
        parts.append(f"{flat.sum().item():.17g}/{flat[:3].tolist()}")
    return ";".join(parts)


def across_processes(width: int, layers: int, device: str, n: int) -> list[str]:
    """Table rows: each method's weights built in `n` fresh processes must be one fingerprint
    (the worker and the referee are two processes); the two methods' differ off the cpu."""
    import subprocess

    code = ("import sys; sys.path.insert(0, {root!r}); from benchmarks.construct_cost import "
            "digest; print(digest({w}, {l}, {d!r}, {m!r}))")
    seen: dict[str, set[str]] = {}
    for method in (DEVICE, HOST):
        for _ in range(n):
            out = subprocess.run([sys.executable, "-c", code.format(
                root=str(ROOT), w=width, l=layers, d=device, m=method)],
                capture_output=True, text=True, check=True).stdout.strip()
            seen.setdefault(method, set()).add(out)
    rows = [f"| {m} | {n} | {len(v)} | {'yes' if len(v) == 1 else 'NO'} |"
            for m, v in seen.items()]
    same = seen[DEVICE] == seen[HOST]
    rows.append(f"\nThe two methods' weights are {'the same' if same else 'different'} on "
                f"{device} ({'expected on the cpu' if device == 'cpu' else 'expected off it'}:"
                " a run never mixes them).")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--width", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--processes", type=int, default=2,
                    help="fresh processes per method whose weights must agree (0: none)")
    ap.add_argument("--out", type=Path, default=None, help="a markdown table here too")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # the worker's setting (`verifier.run.worker`: threads=1)
    weights = args.layers * (args.width * args.width + args.width)
    rows = []
    for device, method in ((args.device, HOST), (args.device, DEVICE), ("meta", DEVICE)):
        secs, same = time_build(args.width, args.layers, device, method, args.repeat)
        rows.append((device, method, secs, same))
        print(f"{device:6s} {method:6s} {secs:8.3f} s", flush=True)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    lines = [f"# Model construction cost by method ({name}, torch {torch.__version__})", "",
             f"`python -m benchmarks.construct_cost --device {args.device} --width {args.width} "
             f"--layers {args.layers} --repeat {args.repeat}`: {args.layers} x nn.Linear("
             f"{args.width}, {args.width}), {weights / 1e6:.0f} M fp32 weights "
             f"({weights * 4 / 2**30:.2f} GiB), one torch thread, best of {args.repeat}.", "",
             "| device | method | seconds | weights per second | same weights twice |",
             "|---|---|---|---|---|"]
    for device, method, secs, same in rows:
        rate = "-" if device == "meta" else f"{weights / secs / 1e6:.0f} M"
        twice = "-" if device == "meta" else "yes" if same else "NO"
        lines.append(f"| {device} | {method} | {secs:.3f} | {rate} | {twice} |")
    agree = True
    if args.processes > 0:
        small = min(args.width, 1024)  # the same draws, a smaller stack: a quick check
        rows_p = across_processes(small, args.layers, args.device, args.processes)
        agree = all("| NO |" not in r for r in rows_p)
        lines += ["", f"Seeded builds of a {args.layers} x nn.Linear({small}, {small}) stack on "
                  f"{args.device}, each in a fresh process:", "",
                  "| method | processes | distinct weights | one set |", "|---|---|---|---|",
                  *rows_p]
    lines += ["", host_only_row(args.device)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0 if agree and all(same for _, _, _, same in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
