"""Memory the trusted judge and the worker both map: the judge's fresh inputs for the timed
windows, and the slot the worker copies each window's last output into.

The judge (the verifier process on cpu, the referee on a GPU) allocates the arena, writes fresh
inputs into it right before each timed window and reads the output slot right after, so the
worker never sees a window's inputs before the judge's clock runs, and nothing it reports is a
figure. cpu: a file in the run directory, mapped MAP_SHARED by both. cuda: device memory from
CUDA's virtual memory management (`cuMemCreate` with a POSIX file-descriptor handle), exported by
the judge and imported by the worker through the driver API (ctypes; the descriptor travels over
SCM_RIGHTS): legacy `cudaIpc` handles do not cross pid namespaces, and the worker has its own.
Nothing of output size crosses host memory. Only torch and the standard library.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import Any

ALIGN = 256  # every tensor starts on this boundary (any dtype's view of the bytes is aligned)
_HANDLE_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
_LOC_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
_READWRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _Prop(ctypes.Structure):  # CUmemAllocationProp (cuda.h, CUDA 12 and 13)
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", _Location), ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", _AllocFlags)]


class _Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_U64, _SZ = ctypes.c_ulonglong, ctypes.c_size_t
_SIGNATURES = {
    "cuMemGetAllocationGranularity": [ctypes.POINTER(_SZ), ctypes.POINTER(_Prop), ctypes.c_int],
    "cuMemCreate": [ctypes.POINTER(_U64), _SZ, ctypes.POINTER(_Prop), _U64],
    "cuMemExportToShareableHandle": [ctypes.c_void_p, _U64, ctypes.c_int, _U64],
    "cuMemImportFromShareableHandle": [ctypes.POINTER(_U64), ctypes.c_void_p, ctypes.c_int],
    "cuMemAddressReserve": [ctypes.POINTER(_U64), _SZ, _SZ, _U64, _U64],
    "cuMemMap": [_U64, _SZ, _SZ, _U64, _U64],
    "cuMemSetAccess": [_U64, _SZ, ctypes.POINTER(_Access), _SZ],
    "cuMemUnmap": [_U64, _SZ],
    "cuMemAddressFree": [_U64, _SZ],
    "cuMemRelease": [_U64],
    "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
    "cuCtxGetCurrent": [ctypes.POINTER(ctypes.c_void_p)],
    "cuDevicePrimaryCtxRetain": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int],
    "cuCtxSetCurrent": [ctypes.c_void_p],
    "cuGetErrorString": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
}


class ArenaError(OSError):
    """The arena could not be made, exported, imported or mapped."""


class _Driver:
    """The CUDA driver calls an arena needs, with errors as ArenaError naming the call."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise ArenaError(f"the CUDA driver library is not loadable: {exc}") from exc
        for name, args in _SIGNATURES.items():
            fn = getattr(self.lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int

    def __call__(self, name: str, *args: Any) -> None:
        res = getattr(self.lib, name)(*args)
        if res:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorString(res, ctypes.byref(text))
            raise ArenaError(f"{name} failed: {(text.value or b'').decode()} ({res})")

    def device(self) -> int:
        """The CUdevice of torch's current device, its primary context current on this thread."""
        import torch

        torch.cuda.init()
        ordinal = torch.cuda.current_device()
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        self("cuDeviceGet", ctypes.byref(dev), ordinal)
        self("cuCtxGetCurrent", ctypes.byref(ctx))
        if not ctx.value:  # a thread that has not used CUDA yet: torch's (primary) context
            self("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev.value)
            self("cuCtxSetCurrent", ctx)
        return dev.value

    def prop(self, dev: int) -> _Prop:
        return _Prop(type=_PINNED, requestedHandleTypes=_HANDLE_FD,
                     location=_Location(_LOC_DEVICE, dev))

    def granularity(self, dev: int) -> int:
        gran, prop = _SZ(), self.prop(dev)
        self("cuMemGetAllocationGranularity", ctypes.byref(gran), ctypes.byref(prop), 0)
        return int(gran.value)

    def map(self, handle: int, size: int, dev: int) -> int:
        ptr = _U64()
        self("cuMemAddressReserve", ctypes.byref(ptr), size, 0, 0, 0)
        try:
            self("cuMemMap", ptr.value, size, 0, handle, 0)
            access = _Access(_Location(_LOC_DEVICE, dev), _READWRITE)
            self("cuMemSetAccess", ptr.value, size, ctypes.byref(access), 1)
        except ArenaError:
            self.lib.cuMemUnmap(ptr.value, size)
            self.lib.cuMemAddressFree(ptr.value, size)
            raise
        return int(ptr.value)


class _CudaArrayInterface:
    """What `torch.as_tensor` needs to wrap device memory it did not allocate (no copy)."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (ptr, False), "version": 2}


class Arena:
    """A byte arena both processes map; `view(meta)` is a tensor over part of it."""

    def __init__(self, base: Any, nbytes: int, device: str, fd: int = -1,
                 unmap: Any = None) -> None:
        self.base, self.nbytes, self.device, self.fd = base, nbytes, device, fd
        self._unmap = unmap
        self._private: Any = None  # the judge's own copy of a cpu arena (see `create`)

    def push(self, lo: int, hi: int) -> None:
        """The judge's bytes [lo, hi) into the shared file (a mapped arena: nothing to do)."""
        if self._private is None:
            return
        view = memoryview(self._private)[lo:hi]
        done = 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done:], lo + done)

    def pull(self, lo: int, hi: int) -> None:
        """The shared file's bytes [lo, hi) into the judge's copy; ArenaError when the file no
        longer holds them (the worker shrank it)."""
        if self._private is None:
            return
        view = memoryview(self._private)[lo:hi]
        done = 0
        while done < len(view):
            got = os.preadv(self.fd, [view[done:]], lo + done)
            if got <= 0:
                raise ArenaError(f"the arena file ends at byte {lo + done}, before {hi}: "
                                 "the worker shrank it")
            done += got

    @classmethod
    def create(cls, nbytes: int, device: str, path: str = "") -> Arena:
        """The judge's side: a new arena of at least `nbytes` (cpu: the file `path`)."""
        nbytes = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        if device == "cpu":  # a file the worker opens by name, else a memfd it is handed
            fd = (os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                  if path else os.memfd_create("ks-arena", os.MFD_CLOEXEC))
            os.ftruncate(fd, nbytes)
            # The judge never maps the file: a worker that shrinks it would make the verifier
            # process's next touch of the mapping a SIGBUS. Its copy is private memory, written
            # to the file (`push`) and read back (`pull`, short when the file was shrunk).
            import torch

            buf = mmap.mmap(-1, nbytes)
            base = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes)
            arena = cls(base, nbytes, "cpu", fd, unmap=buf.close)
            arena._private = buf
            return arena
        drv = _Driver()
        dev = drv.device()
        gran = drv.granularity(dev)
        size = -(-nbytes // gran) * gran
        handle, fd = _U64(), ctypes.c_int(-1)
        prop = drv.prop(dev)
        drv("cuMemCreate", ctypes.byref(handle), size, ctypes.byref(prop), 0)
        try:
            drv("cuMemExportToShareableHandle", ctypes.byref(fd), handle.value, _HANDLE_FD, 0)
            ptr = drv.map(handle.value, size, dev)
        finally:  # the mapping keeps the memory; the handle itself is not needed again
            drv.lib.cuMemRelease(handle.value)
        return cls._cuda(drv, ptr, size, device, fd.value)

    @classmethod
    def attach(cls, handle: str | int, nbytes: int, device: str) -> Arena:
        """The worker's side: the judge's arena (cpu: a file path or a descriptor; cuda: its
        descriptor)."""
        if device == "cpu":
            fd = (os.dup(handle) if isinstance(handle, int)
                  else os.open(str(handle), os.O_RDWR | os.O_CLOEXEC))
            if os.fstat(fd).st_size < nbytes:
                os.close(fd)
                raise ArenaError(f"the arena file is smaller than {nbytes} bytes")
            return cls._cpu(fd, nbytes)
        drv = _Driver()
        dev = drv.device()
        imported = _U64()
        drv("cuMemImportFromShareableHandle", ctypes.byref(imported),
            ctypes.c_void_p(int(handle)), _HANDLE_FD)
        try:
            ptr = drv.map(imported.value, nbytes, dev)
        finally:
            drv.lib.cuMemRelease(imported.value)
        return cls._cuda(drv, ptr, nbytes, device, -1)  # the descriptor stays the caller's

    @classmethod
    def _cpu(cls, fd: int, nbytes: int) -> Arena:
        import torch

        mm = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        base = torch.frombuffer(mm, dtype=torch.uint8, count=nbytes)
        return cls(base, nbytes, "cpu", fd, unmap=mm.close)

    @classmethod
    def _cuda(cls, drv: _Driver, ptr: int, size: int, device: str, fd: int) -> Arena:
        import torch

        base = torch.as_tensor(_CudaArrayInterface(ptr, size), device=device)

        def unmap() -> None:
            drv.lib.cuMemUnmap(ptr, size)
            drv.lib.cuMemAddressFree(ptr, size)

        return cls(base, size, device, fd, unmap=unmap)

    def view(self, meta: dict[str, Any]) -> Any:
        """The tensor `meta` describes ({"dtype", "shape", "stride", "offset", "nbytes"})."""
        import torch

        dtype = getattr(torch, meta["dtype"])
        offset, nbytes = int(meta["offset"]), int(meta["nbytes"])
        if offset < 0 or offset + nbytes > self.nbytes or offset % ALIGN:
            raise ArenaError(f"a tensor of {nbytes} bytes at {offset} is outside the arena")
        flat = self.base[offset:offset + nbytes].view(dtype)
        return flat.as_strided(meta["shape"], meta["stride"])

    def close(self) -> None:
        """Unmap (every view of this arena must be gone first) and close the descriptor."""
        self.base = None
        if self._unmap is not None:
            try:
                self._unmap()
            except BufferError:  # a view is still alive: the mapping goes with the process
                pass
            self._unmap = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def plan(sample: Any, start: int = 0) -> tuple[Any, int]:
    """(layout, end): where each tensor of `sample` (inputs or an output: tensors, plain values,
    lists and tuples) sits from byte `start` on, each dense in its own strides."""
    import torch

    end = start

    def walk(x: Any) -> Any:
        nonlocal end
        if isinstance(x, torch.Tensor):
            span = _span(x)
            end = -(-end // ALIGN) * ALIGN
            meta = {"dtype": str(x.dtype).removeprefix("torch."), "shape": list(x.shape),
                    "stride": list(x.stride()), "offset": end, "nbytes": span}
            end += span
            return {"t": meta}
        if type(x) in (list, tuple):
            return {"tuple" if isinstance(x, tuple) else "list": [walk(v) for v in x]}
        if x is None or type(x) in (bool, int, float, str):
            return {"v": x}
        raise ArenaError(f"an input or output of type {type(x).__name__} cannot be shared")

    return walk(sample), -(-end // ALIGN) * ALIGN


def _span(t: Any) -> int:
    """Bytes from a tensor's first element to one past its last (its strides as they are)."""
    if t.numel() == 0:
        return 0
    last = sum((d - 1) * s for d, s in zip(t.shape, t.stride(), strict=True) if d > 0)
    return (last + 1) * t.element_size()


def views(arena: Arena, layout: Any) -> Any:
    """The objects `layout` describes, tensors as views of the arena."""
    kind, value = next(iter(layout.items()))
    if kind == "t":
        return arena.view(value)
    if kind == "v":
        return value
    items = [views(arena, v) for v in value]
    return tuple(items) if kind == "tuple" else items


def fill(target: Any, source: Any) -> None:
    """Copy every tensor of `source` into the matching view of `target` (same structure)."""
    import torch

    if isinstance(target, torch.Tensor):
        if not isinstance(source, torch.Tensor) or source.shape != target.shape:
            raise ArenaError("the inputs changed shape between draws of get_inputs()")
        target.copy_(source)
    elif isinstance(target, list | tuple):
        if not isinstance(source, list | tuple) or len(source) != len(target):
            raise ArenaError("the inputs changed structure between draws of get_inputs()")
        for t, s in zip(target, source, strict=True):
            fill(t, s)
    elif target != source:
        raise ArenaError(f"a plain input changed between draws ({target!r} -> {source!r})")


def shift(layout: Any, start: int) -> Any:
    """A layout planned from byte 0, moved to `start` (a multiple of the arena's alignment)."""
    kind, value = next(iter(layout.items()))
    if kind == "t":
        return {"t": {**value, "offset": int(value["offset"]) + start}}
    if kind == "v":
        return layout
    return {kind: [shift(v, start) for v in value]}
