"""A GPU worker's raw outputs handed to the verifier as a sealed memfd, not as bytes on a pipe.

A job's raw outputs (every trial's and variant's output and the parent-clocked windows' last
outputs: about 1 GB a candidate on an 8192x4096 task) used to go `torch.save` -> pipe -> a file
of the parent's -> `torch.load` in the referee: four copies, 2.5 s a GB on this project's CI
machine. Now, per job, the parent makes a memfd of MAX bytes (sparse: `new_memfd`) and passes
it to the worker over their socket (SCM_RIGHTS); the worker maps it and copies each tensor's
bytes in once (`write_into`: a mapping, because the sandbox's RLIMIT_FSIZE stops write() and
ftruncate() past 64 MB, not stores to memory), unmaps it and reports the size and layout; the
parent then cuts the memfd to that size and seals it against any write, grow or shrink
(`seal`: F_SEAL_WRITE fails while any writable mapping is left, so nothing in the worker, the
candidate included, can change the bytes afterwards). The referee maps it copy-on-write
(`read_mapped`): no copy until the tensors move to the GPU.

The layout (which tensor sits where, and the plain values between them) comes from the worker,
so it is checked like any untrusted input: known dtypes only, every tensor inside the file and
of its announced size, bounded nesting. Only torch and the standard library.
"""

from __future__ import annotations

import collections
import errno
import fcntl
import mmap
import os
from typing import Any

SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
ALIGN = 64
MAX_DEPTH = 32
MAX_ENTRIES = 100_000
_DTYPES = ("float32", "float64", "float16", "bfloat16", "complex64", "complex128", "int8",
           "int16", "int32", "int64", "uint8", "bool", "float8_e4m3fn", "float8_e5m2",
           "uint16", "uint32", "uint64")


class Unsupported(ValueError):
    """An output that is not tensors, plain values and containers of them."""


def encode(obj: Any) -> tuple[Any, list[Any]]:
    """(layout, tensors): a JSON-able tree with {"t": i} where tensor i goes; raises
    Unsupported for anything `torch.load(weights_only=True)` would also refuse or that has no
    plain bytes (sparse, quantized, nested tensors)."""
    import torch

    tensors: list[Any] = []

    def walk(x: Any, depth: int) -> Any:
        if depth > MAX_DEPTH or len(tensors) > MAX_ENTRIES:
            raise Unsupported("outputs nested too deep or too many")
        if isinstance(x, torch.Tensor):
            if type(x) not in (torch.Tensor, torch.nn.Parameter):  # as weights_only loads
                raise Unsupported(f"a {type(x).__name__} (a Tensor subclass)")
            if x.layout != torch.strided or x.is_quantized or x.is_nested:
                raise Unsupported(f"a {x.layout} tensor")
            if str(x.dtype).removeprefix("torch.") not in _DTYPES:
                raise Unsupported(f"a {x.dtype} tensor")
            tensors.append(x)
            return {"t": len(tensors) - 1}
        if x is None or type(x) in (bool, int, float, str):
            return {"v": x}
        if isinstance(x, torch.Size):
            return {"size": list(x)}
        if isinstance(x, torch.dtype):
            return {"dtype": str(x).removeprefix("torch.")}
        if type(x) in (list, tuple):  # exact types: a subclass could carry a finalizer
            return {"tuple" if isinstance(x, tuple) else "list": [walk(v, depth + 1) for v in x]}
        if type(x) in (dict, collections.OrderedDict):
            if not all(isinstance(k, (str, int)) for k in x):
                raise Unsupported("a dict with keys other than str/int")
            return {"dict": [[k, walk(v, depth + 1)] for k, v in x.items()]}
        raise Unsupported(f"a {type(x).__name__}")

    return walk(obj, 0), tensors


def new_memfd(capacity: int) -> int:
    """A memfd of `capacity` bytes (sparse: memory is taken only where written), sealable."""
    fd = os.memfd_create("ks-outputs", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
    os.ftruncate(fd, capacity)
    return fd


def write_into(fd: int, obj: Any) -> tuple[int, dict[str, Any]]:
    """(size, layout): `obj`'s tensors copied once into the first `size` bytes of the memfd
    `fd` through a mapping that is gone when this returns. Raises Unsupported (see `encode`)
    and ValueError when they do not fit. A tensor on a device is copied from there straight
    into the mapping (the harness keeps raw outputs where they were made: one copy, not two)."""
    import torch

    tree, tensors = encode(obj)
    metas, size = [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        size = -(-size // ALIGN) * ALIGN
        metas.append({"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                      "offset": size, "nbytes": nbytes})
        size += nbytes
    capacity = os.fstat(fd).st_size
    if size > capacity:
        raise ValueError(f"{size >> 20} MB of outputs, over the {capacity >> 20} MB limit")
    if size:
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            for meta, t in zip(metas, tensors, strict=True):
                if meta["nbytes"]:  # one copy, straight from the device where it is on one
                    dest = torch.frombuffer(mm, dtype=t.dtype, count=t.numel(),
                                            offset=meta["offset"]).view(t.shape)
                    dest.copy_(t.detach().resolve_conj().resolve_neg())
                    del dest  # the mapping closes only once no tensor uses it
        finally:
            mm.close()
    return size, {"tree": tree, "tensors": metas}


def seal(fd: int, size: int) -> str:
    """Cut the memfd to `size` bytes and seal it; why not ("" when sealed): a writable
    mapping still open somewhere (the worker did not let go of it)."""
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    except OSError as exc:
        return ("still mapped for writing" if exc.errno == errno.EBUSY
                else f"not sealable ({exc.strerror})")
    return ""


def write_sealed(obj: Any) -> tuple[int, int, dict[str, Any]]:
    """(fd, size, layout): the worker's and the parent's steps in one process (the tests)."""
    fd = new_memfd(1 << 34)
    try:
        size, layout = write_into(fd, obj)
        why = seal(fd, size)
        if why:
            raise OSError(why)
    except BaseException:
        os.close(fd)
        raise
    return fd, size, layout


def read_mapped(path: str, layout: Any) -> Any:
    """The outputs in the sealed file at `path` (a memfd as /proc/PID/fd/N), as tensors mapped
    copy-on-write over it; ValueError when the layout does not fit the file."""
    import torch

    if not isinstance(layout, dict) or not isinstance(layout.get("tensors"), list):
        raise ValueError("outputs layout is not a dict with a tensor list")
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        mm = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE,
                       prot=mmap.PROT_READ | mmap.PROT_WRITE) if size else None
    finally:
        os.close(fd)
    metas = layout["tensors"]
    if len(metas) > MAX_ENTRIES:
        raise ValueError(f"outputs layout lists {len(metas)} tensors")
    tensors = [_tensor(torch, mm, size, m, i) for i, m in enumerate(metas)]

    def build(node: Any, depth: int) -> Any:
        if depth > MAX_DEPTH or not isinstance(node, dict) or len(node) != 1:
            raise ValueError("outputs layout: a malformed node")
        (kind, value), = node.items()
        if kind == "t":
            if not isinstance(value, int) or not 0 <= value < len(tensors):
                raise ValueError(f"outputs layout: no tensor {value!r}")
            return tensors[value]
        if kind == "v":
            if value is not None and not isinstance(value, (bool, int, float, str)):
                raise ValueError("outputs layout: a value that is not plain")
            return value
        if kind == "size":
            return torch.Size(int(v) for v in value)
        if kind == "dtype":
            return _dtype(torch, value)
        if kind in ("list", "tuple") and isinstance(value, list):
            items = [build(v, depth + 1) for v in value]
            return tuple(items) if kind == "tuple" else items
        if kind == "dict" and isinstance(value, list):
            return {k: build(v, depth + 1) for k, v in value}
        raise ValueError(f"outputs layout: unknown node {kind!r}")

    return build(layout.get("tree"), 0)


def _dtype(torch: Any, name: Any) -> Any:
    if name not in _DTYPES or not hasattr(torch, name):
        raise ValueError(f"outputs layout: dtype {name!r}")
    return getattr(torch, name)


def _tensor(torch: Any, mm: Any, size: int, meta: Any, i: int) -> Any:
    if not isinstance(meta, dict):
        raise ValueError(f"outputs layout: tensor {i} is not described")
    dtype = _dtype(torch, meta.get("dtype"))
    shape, offset, nbytes = meta.get("shape"), meta.get("offset"), meta.get("nbytes")
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)
            and isinstance(offset, int) and isinstance(nbytes, int)):
        raise ValueError(f"outputs layout: tensor {i} has a bad shape, offset or size")
    numel = 1
    for d in shape:
        numel *= d
    itemsize = torch.empty((), dtype=dtype).element_size()
    if numel * itemsize != nbytes or offset < 0 or offset + nbytes > size:
        raise ValueError(f"outputs layout: tensor {i} ({nbytes} bytes at {offset}) does not "
                         f"fit its shape {shape} or the {size}-byte file")
    if not numel:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(mm, dtype=dtype, count=numel, offset=offset).view(shape)
