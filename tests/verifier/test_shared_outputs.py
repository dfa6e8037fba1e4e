"""Raw outputs as a sealed memfd (`verifier.shared_outputs`), and the GPU worker's result socket
that carries it (`verifier.gpu_pool`): what torch.save/torch.load round-trip comes back the same
way, nobody can change the bytes after sealing, and a layout or descriptor from the worker that
does not fit is refused."""

from __future__ import annotations

import fcntl
import io
import math
import mmap
import os
import socket
import tempfile
from typing import Any

import pytest
import torch

from verifier.gpu_pool import GpuWorkerProcess
from verifier.shared_outputs import (
    SEALS,
    Unsupported,
    new_memfd,
    read_mapped,
    seal,
    write_into,
    write_sealed,
)


def _same(a: Any, b: Any) -> bool:
    """Equal values and the same container types, tensors bit-equal with dtype and shape
    (strides are not kept: the judge compares values, `verifier.judge`)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return (a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(_bits(a), _bits(b)))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8) if t.numel() and t.dim() else t


def _outputs() -> list[Any]:
    """What harnesses return: several dtypes, 0-d and empty tensors, views, nested tuples."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 10, generator=g)
    return [[x, (x.t(), x[:, ::3]), {"logits": x.half(), "mask": x > 0}, None],
            [torch.tensor(3.5), torch.empty(0, 4), x.to(torch.bfloat16),
             torch.arange(7, dtype=torch.int64), torch.randn(3, dtype=torch.complex64,
                                                             generator=g)],
            [torch.Size([2, 3]), 1.25, float("nan"), 7, True, "text", torch.float16]]


def _sealed_at(fd: int, size: int) -> bool:
    """The memfd carries every seal and has exactly `size` bytes."""
    return (fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS == SEALS
            and os.fstat(fd).st_size == size)


def _mapped(obj: Any) -> tuple[Any, int]:
    fd, size, layout = write_sealed(obj)
    assert _sealed_at(fd, size)
    return read_mapped(f"/proc/self/fd/{fd}", layout), fd


def test_round_trip_matches_torch_save_and_load() -> None:
    obj = _outputs()
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    got, fd = _mapped(obj)
    os.close(fd)  # the mapping outlives the descriptor
    assert _same(got, loaded), (got, loaded)


def test_nothing_changes_the_bytes_once_sealed() -> None:
    x = torch.arange(1024, dtype=torch.float32)
    fd, size, layout = write_sealed([x])
    try:
        assert os.fstat(fd).st_size == size
        with pytest.raises(PermissionError):
            os.pwrite(fd, b"\0" * 16, 0)
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
        with pytest.raises(PermissionError):
            mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_WRITE)
        got = read_mapped(f"/proc/self/fd/{fd}", layout)
        got[0].mul_(0)  # the reader's mapping is copy-on-write: the memfd keeps the bytes
        again = read_mapped(f"/proc/self/fd/{fd}", layout)
        assert torch.equal(again[0], x) and not torch.equal(got[0], x)
    finally:
        os.close(fd)


def test_sealing_cuts_the_memfd_to_the_reported_size_and_seals_everything() -> None:
    fd, size, _ = write_sealed([torch.ones(8)])
    assert _sealed_at(fd, size) and not _sealed_at(fd, size + 4)
    os.close(fd)
    open_fd = new_memfd(1 << 20)
    assert not _sealed_at(open_fd, 32)  # a memfd the parent has not sealed yet
    assert seal(open_fd, 32) == "" and _sealed_at(open_fd, 32)
    assert seal(open_fd, 16).startswith("not sealable")  # sealed for good
    os.close(open_fd)
    with tempfile.TemporaryFile() as fh:  # only a memfd takes seals
        assert seal(fh.fileno(), 0).startswith("not sealable")


def test_outputs_with_no_plain_bytes_are_unsupported() -> None:
    sparse = torch.eye(3).to_sparse()
    with pytest.raises(Unsupported, match="sparse"):
        write_sealed([[sparse], None])
    with pytest.raises(Unsupported, match="object"):
        write_sealed([[object()], None])
    with pytest.raises(Unsupported, match="keys"):
        write_sealed([[{(1, 2): torch.ones(1)}], None])
    # subclasses (of tensors or containers) could carry a finalizer, which is candidate code
    # running after the write; torch.load(weights_only=True) refused them too

    class Sub(torch.Tensor):
        pass

    class Listy(list):
        pass

    with pytest.raises(Unsupported, match="Tensor subclass"):
        write_sealed([[torch.ones(2).as_subclass(Sub)], None])
    with pytest.raises(Unsupported, match="Listy"):
        write_sealed([Listy([torch.ones(2)]), None])


@pytest.mark.parametrize("bad, why", [
    (lambda m: {**m, "offset": m["offset"] + 64}, "does not fit"),
    (lambda m: {**m, "nbytes": m["nbytes"] - 4}, "does not fit"),
    (lambda m: {**m, "shape": [10**9]}, "does not fit"),
    (lambda m: {**m, "offset": -64}, "does not fit"),
    (lambda m: {**m, "dtype": "object"}, "dtype"),
    (lambda m: {**m, "shape": "64"}, "bad shape"),
])
def test_a_layout_that_does_not_fit_the_file_is_refused(bad: Any, why: str) -> None:
    fd, _, layout = write_sealed([torch.randn(64), torch.randn(16)])
    try:
        broken = {**layout, "tensors": [layout["tensors"][0], bad(layout["tensors"][1])]}
        with pytest.raises(ValueError, match=why):
            read_mapped(f"/proc/self/fd/{fd}", broken)
        for tree in ({"t": 5}, {"x": 1}, {"v": [1]}, {"list": [{"t": 0}], "v": 1}):
            with pytest.raises(ValueError):
                read_mapped(f"/proc/self/fd/{fd}", {**layout, "tree": tree})
        deep: Any = {"t": 0}
        for _ in range(40):
            deep = {"list": [deep]}
        with pytest.raises(ValueError, match="malformed"):
            read_mapped(f"/proc/self/fd/{fd}", {**layout, "tree": deep})
    finally:
        os.close(fd)


def test_the_job_memfd_goes_to_the_worker_and_is_sealed_after() -> None:
    """The parent passes a sparse memfd with the job; the worker maps it, writes, lets go and
    reports; the parent seals it at the reported size. A worker that keeps a writable mapping
    leaves it unsealable; a descriptor sent back on the socket is never received."""
    proc = GpuWorkerProcess({}, "cpu")
    parent, worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    proc.sock = parent
    try:
        memfd = new_memfd(1 << 30)
        socket.send_fds(parent, [b"o"], [memfd])
        _, fds, _, _ = socket.recv_fds(worker, 1, 1)
        x = torch.randn(300, 500)
        size, layout = write_into(fds[0], [[x], None])
        os.close(fds[0])
        assert os.fstat(memfd).st_size == 1 << 30  # sparse until sealed
        assert proc._seal_outputs(memfd, size) == ""
        assert os.fstat(memfd).st_size == size
        assert torch.equal(read_mapped(f"/proc/self/fd/{memfd}", layout)[0][0], x)
        os.close(memfd)
        assert proc._seal_outputs(-1, 0) == "" and proc._seal_outputs(-1, "9") == "a bad size"
        kept = new_memfd(1 << 20)
        mapping = mmap.mmap(kept, 4096, flags=mmap.MAP_SHARED, prot=mmap.PROT_WRITE)
        assert proc._seal_outputs(kept, 4096) == "still mapped for writing"
        mapping.close()
        os.close(kept)
        junk = os.memfd_create("junk")
        before = set(os.listdir("/proc/self/fd"))
        socket.send_fds(worker, [b'{"outputs_bytes": 0}\n'], [junk])
        os.close(junk)
        assert proc._read(5) == {"outputs_bytes": 0}
        opened = set(os.listdir("/proc/self/fd")) - before
        assert not any("memfd:junk" in os.readlink(f"/proc/self/fd/{n}") for n in opened
                       if os.path.exists(f"/proc/self/fd/{n}"))
    finally:
        proc.stop()
        worker.close()


def test_outputs_over_the_memfd_capacity_are_refused() -> None:
    fd = new_memfd(1 << 16)
    try:
        with pytest.raises(ValueError, match="over the"):
            write_into(fd, [[torch.zeros(1 << 15)], None])
    finally:
        os.close(fd)
