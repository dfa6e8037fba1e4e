"""The shared arena: the judge's inputs seen by another process, its output slot read back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verifier.judge.arena import ALIGN, Arena, ArenaError, fill, plan, views

ROOT = str(Path(__file__).resolve().parents[2])


def _exchange(device: str, tmp_path: Path, argv_prefix: list[str] | None = None) -> None:
    x = torch.randn(64, 48, device=device).t()  # not contiguous: strides must survive
    y = torch.randn(48, 64, device=device)
    layout, end = plan([x, y, 3])
    out_layout, total = plan(torch.empty(48, 64, device=device), end)
    arena = Arena.create(total, device, path=str(tmp_path / "arena.bin"))
    try:
        fill(views(arena, layout), [x, y, 3])
        arena.push(0, arena.nbytes)  # cpu: the judge's private copy into the shared file
        spec = {"device": device, "path": str(tmp_path / "arena.bin"), "fd": arena.fd,
                "nbytes": arena.nbytes, "inputs": layout, "out": out_layout}
        os.set_inheritable(arena.fd, True)
        res = subprocess.run([*(argv_prefix or []), sys.executable,
                              str(Path(__file__).with_name("arena_child.py")), json.dumps(spec)],
                             capture_output=True, text=True, pass_fds=(arena.fd,),
                             env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
        assert res.returncode == 0, res.stderr[-2000:]
        seen = json.loads(res.stdout.strip().splitlines()[-1])
        assert seen["stride"] == list(x.stride())
        assert seen["sum"] == pytest.approx(float(x.double().sum()), rel=1e-6)
        arena.pull(0, arena.nbytes)  # cpu: what the other process wrote, into the judge's copy
        out = views(arena, out_layout)
        assert torch.equal(out, x * 2 + y)  # written by the other process, read here
    finally:
        arena.close()


def test_cpu_arena_is_shared_with_another_process(tmp_path: Path) -> None:
    _exchange("cpu", tmp_path)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_arena_crosses_a_pid_namespace(tmp_path: Path) -> None:
    """Legacy cudaIpc handles do not cross pid namespaces; the VMM descriptor does."""
    unshare = shutil.which("unshare")
    prefix = [unshare, "--pid", "--fork", "--mount-proc"] if unshare and os.geteuid() == 0 else []
    _exchange("cuda", tmp_path, prefix)


def test_plan_aligns_every_tensor_and_keeps_plain_values() -> None:
    layout, end = plan((torch.zeros(3, dtype=torch.float64), [torch.zeros(5, 7)[:, 1:3], 2.5]))
    metas = [layout["tuple"][0]["t"], layout["tuple"][1]["list"][0]["t"]]
    assert all(m["offset"] % ALIGN == 0 for m in metas)
    assert metas[1]["stride"] == [7, 1] and metas[1]["nbytes"] == (4 * 7 + 1 + 1) * 4
    assert layout["tuple"][1]["list"][1] == {"v": 2.5} and end % ALIGN == 0


def test_fill_refuses_a_draw_of_another_shape(tmp_path: Path) -> None:
    layout, end = plan([torch.zeros(4)])
    arena = Arena.create(end, "cpu", path=str(tmp_path / "a.bin"))
    try:
        with pytest.raises(ArenaError, match="changed shape"):
            fill(views(arena, layout), [torch.zeros(5)])
        with pytest.raises(ArenaError, match="cannot be shared"):
            plan([object()])
    finally:
        arena.close()


def test_a_view_outside_the_arena_is_refused(tmp_path: Path) -> None:
    arena = Arena.create(1024, "cpu", path=str(tmp_path / "a.bin"))
    try:
        with pytest.raises(ArenaError, match="outside the arena"):
            arena.view({"dtype": "float32", "shape": [1024], "stride": [1], "offset": 0,
                        "nbytes": 4096})
    finally:
        arena.close()
