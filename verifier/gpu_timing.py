"""GPU timing: CUDA/MUSA events around one call, device-synchronized, L2 flushed, adaptive trials.

Each trial: fresh inputs (made outside the timed region), L2 flushed by overwriting a buffer twice
the L2 size, device synchronized, a short GPU spin (so the host has queued the call's kernels by
the time the GPU reaches the start event: host launch jitter stays out of the interval), start
event, the call, an event on the call's stream, **device synchronize**, end event. The runtime
is start -> call's event (no host noise); the synchronize-inclusive interval, against an empty
bracket interleaved with every trial, detects work hidden on side streams or other threads'
streams, and when there is any the timing includes it (`time_device_fn`).
Trials run until the relative IQR is under a target or a cap; the median and IQR are reported.
Baselines (eager, torch.compile) are cached per (task, device, torch version) in JSON files.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass
class TimingResult:
    """Median/IQR of per-call times in microseconds, with the raw samples."""

    median_us: float
    iqr_us: float
    mean_us: float
    cv: float  # stdev / mean over the samples
    trials: int
    samples_us: list[float] = field(default_factory=list)
    l2_flushed: bool = True
    persisting_l2_reset: bool = False
    method: str = "events"  # events: start -> end of the call's stream; device_sync: see below
    hidden_us: float = 0.0  # work still running on the device after the call's stream finished
    sync_latency_us: float = 0.0  # host synchronize latency (the empty bracket), median

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def device_api(device: torch.device | str) -> Any:
    """torch.cuda or torch.musa for a device (torch.musa exists once torch_musa is imported)."""
    kind = torch.device(device).type
    api = getattr(torch, kind, None)
    if api is None or not hasattr(api, "Event"):
        raise RuntimeError(f"no event timing API for device type {kind!r}")
    return api


class L2Flusher:
    """Evicts the L2 cache by writing a buffer twice its size (H100: 50 MB L2 -> 100 MB)."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        l2 = 0
        if self.device.type == "cuda":
            props = torch.cuda.get_device_properties(self.device)
            l2 = int(getattr(props, "L2_cache_size", 0) or 0)
        size = max(2 * l2, 64 * 1024 * 1024)
        self.buffer = torch.empty(size // 4, dtype=torch.int32, device=self.device)

    def flush(self) -> None:
        self.buffer.zero_()


def _load_cudart() -> ctypes.CDLL | None:
    names = [ctypes.util.find_library("cudart")]
    torch_dir = os.path.dirname(torch.__file__)
    site = os.path.dirname(torch_dir)
    names += sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "lib", "libcudart.so*")))
    names += sorted(glob.glob(os.path.join(site, "nvidia", "cuda_runtime", "lib", "libcudart.so*")))
    names += sorted(glob.glob("/usr/local/cuda/lib64/libcudart.so*"))
    for name in names:
        if not name:
            continue
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def reset_persisting_l2() -> bool:
    """Drop any persisting-L2 window a previous candidate set; True when the reset ran."""
    if not torch.cuda.is_available():
        return False
    lib = _load_cudart()
    if lib is None:
        return False
    try:
        # cudaLimitPersistingL2CacheSize = 0x06; then release lines already marked persisting.
        rc1 = lib.cudaDeviceSetLimit(ctypes.c_int(0x06), ctypes.c_size_t(0))
        rc2 = lib.cudaCtxResetPersistingL2Cache()
    except AttributeError:
        return False
    return rc1 == 0 and rc2 == 0


def _spin(device: torch.device | str, cycles: int) -> None:
    """Keep the GPU busy for `cycles` clocks (~50 us at 2 GHz for 100k) on the current stream."""
    if cycles > 0 and torch.device(device).type == "cuda":
        torch.cuda._sleep(cycles)


def _bracket(api: Any, device: torch.device | str, spin_cycles: int,
             call: Callable[[], Any] | None) -> tuple[float, float]:
    """One timed bracket: (start -> after the call on this stream, after the call -> after a
    device synchronize), both in microseconds of GPU time."""
    ev = [api.Event(enable_timing=True) for _ in range(3)]
    api.synchronize()
    _spin(device, spin_cycles)  # not timed: it runs before the start event
    ev[0].record()
    if call is not None:
        call()
    ev[1].record()
    api.synchronize()  # the whole device, not just this stream: no hidden side-stream work
    ev[2].record()
    ev[2].synchronize()
    return ev[0].elapsed_time(ev[1]) * 1000.0, ev[1].elapsed_time(ev[2]) * 1000.0


def time_device_fn(
    fn: Callable[..., Any],
    make_args: Callable[[int], Sequence[Any]],
    *,
    device: torch.device | str,
    warmup: int = 3,
    min_trials: int = 25,
    max_trials: int = 100,
    target_rel_iqr: float = 0.02,
    budget_s: float = 10.0,
    flusher: L2Flusher | None = None,
    warmup_min_s: float = 0.1,
    spin_cycles: int = 100_000,
    hidden_threshold_us: float = 10.0,
    hidden_threshold_rel: float = 0.05,
) -> TimingResult:
    """Time `fn(*make_args(i))` on the device; stop when IQR/median < target or a cap.

    Each trial records three events: start, right after the call (on the current stream), and
    after a device-wide synchronize. The first interval is the call's GPU time without host
    noise (repeat CV 0.05% on an H100 where the synchronize-inclusive interval gave 3-15%); the
    second is the host's synchronize latency plus any work the call left on other streams. An
    empty bracket interleaved with every trial measures that latency alone. When the call's
    median tail exceeds the empty one's by more than max(hidden_threshold_us,
    hidden_threshold_rel * runtime), work was hidden from the current stream (side streams,
    other threads' streams): the samples become the synchronize-inclusive times minus the
    latency, so hidden work is always paid for, and `hidden_us` says how much there was.
    """
    api = device_api(device)
    flusher = flusher if flusher is not None else L2Flusher(device)
    persisting = reset_persisting_l2() if torch.device(device).type == "cuda" else False
    with torch.no_grad():
        # At least `warmup` calls and `warmup_min_s` of work: on an H100 the first of five
        # repeated measurements of a 160 us kernel came out 18% slower after 3 warmup calls
        # (clocks still ramping), which alone made the repeat CV 8%.
        t_warm = time.monotonic()
        i = 0
        while i < warmup or time.monotonic() - t_warm < warmup_min_s:
            fn(*make_args(-1 - i))
            i += 1
            if i % 8 == 0:
                api.synchronize()
        api.synchronize()
        body: list[float] = []  # start -> after the call, this stream
        tail: list[float] = []  # after the call -> device idle (host latency + hidden work)
        empty: list[float] = []  # the same tail around no call
        start_wall = time.monotonic()
        for i in range(max_trials):
            args = make_args(i)
            flusher.flush()
            b, t = _bracket(api, device, spin_cycles, lambda args=args: fn(*args))
            body.append(b)
            tail.append(t)
            empty.append(_bracket(api, device, spin_cycles, None)[1])
            n = len(body)
            if n >= min_trials and relative_iqr(body) < target_rel_iqr:
                break
            if n >= min_trials and time.monotonic() - start_wall > budget_s:
                break
    latency = statistics.median(empty)
    hidden = statistics.median(tail) - latency
    runtime = statistics.median(body)
    if hidden > max(hidden_threshold_us, hidden_threshold_rel * runtime):
        samples = [b + t - latency for b, t in zip(body, tail, strict=True)]
        result = summarize(samples, persisting_l2_reset=persisting)
        result.method = "device_sync"
    else:
        result = summarize(body, persisting_l2_reset=persisting)
    result.hidden_us = round(max(0.0, hidden), 3)
    result.sync_latency_us = round(latency, 3)
    return result


def _quartiles(samples: Sequence[float]) -> tuple[float, float, float]:
    if len(samples) < 2:
        v = samples[0] if samples else 0.0
        return v, v, v
    q = statistics.quantiles(samples, n=4, method="inclusive")
    return q[0], q[1], q[2]


def relative_iqr(samples: Sequence[float]) -> float:
    """IQR / median: the spread a timing loop stops on."""
    q1, med, q3 = _quartiles(samples)
    return (q3 - q1) / med if med > 0 else float("inf")


def summarize(samples: Sequence[float], *, persisting_l2_reset: bool = False) -> TimingResult:
    """Median, IQR, mean and CV of microsecond samples."""
    if not samples:
        raise ValueError("no timing samples")
    q1, med, q3 = _quartiles(samples)
    mean = statistics.fmean(samples)
    sd = statistics.stdev(samples) if len(samples) > 1 else 0.0
    return TimingResult(median_us=med, iqr_us=q3 - q1, mean_us=mean,
                        cv=sd / mean if mean > 0 else 0.0, trials=len(samples),
                        samples_us=[round(s, 3) for s in samples],
                        persisting_l2_reset=persisting_l2_reset)


def coefficient_of_variation(values: Sequence[float]) -> float:
    """stdev/mean of repeated measurements (e.g. 5 medians of the same kernel)."""
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean > 0 else 0.0


def device_key(device: torch.device | str) -> str:
    """Name of the device model plus torch version: what a cached baseline is valid for."""
    dev = torch.device(device)
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
    elif dev.type == "musa":
        name = device_api(dev).get_device_name(dev)
    else:
        name = "cpu"
    return f"{name}|torch-{torch.__version__}"


class BaselineCache:
    """JSON cache of baseline timings keyed by (task source hash, mode, device model, torch)."""

    def __init__(self, root: str | Path | None) -> None:
        self.root = Path(root) if root else None

    def _path(self, task_source: str, mode: str, device: torch.device | str) -> Path | None:
        if self.root is None:
            return None
        key = hashlib.sha256(
            f"{task_source}\0{mode}\0{device_key(device)}".encode()).hexdigest()[:32]
        return self.root / f"{mode}-{key}.json"

    def get_or_measure(self, task_source: str, mode: str, device: torch.device | str,
                       measure: Callable[[], TimingResult]) -> tuple[TimingResult, bool]:
        """Cached timing for this (task, mode, device, torch) or measure and store it."""
        path = self._path(task_source, mode, device)
        if path is not None and path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                return TimingResult(**data), True
            except (ValueError, TypeError, OSError):
                path.unlink(missing_ok=True)
        result = measure()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(result.to_dict()), encoding="utf-8")
            tmp.replace(path)
        return result, False
