"""GPU timing: CUDA/MUSA events around one call, device-synchronized, L2 flushed, adaptive trials.

Each trial: fresh inputs (made outside the timed region), L2 flushed by overwriting a buffer twice
the L2 size, device synchronized, a GPU spin sized to outlast the host's launch of the call (so
the call's kernels are queued by the time the GPU reaches the start event: host launch time stays
out of the interval; every trial checks it and a trial it fails is redone with a longer spin), start
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
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
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
    spin_us: float = 0.0  # GPU spin before each start event (covers the host's launch time)
    host_us: float = 0.0  # host time to queue one call, median
    uncovered_trials: int = 0  # kept trials whose launch outlasted the spin (host-bound calls)
    discarded_trials: int = 0  # trials dropped because the spin was too short, then lengthened
    clock_mhz: float = 0.0  # SM clock during the trials, from the spin's cycles and GPU time

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


def _spin(api: Any, cycles: int) -> None:
    """Keep the GPU busy for `cycles` SM clocks (~50 us at 2 GHz for 100k) on the current stream
    (torch.cuda._sleep; a device API without it gets no spin and its trials count as uncovered)."""
    sleep = getattr(api, "_sleep", None)
    if cycles > 0 and sleep is not None:
        sleep(int(cycles))


@dataclass
class _Trial:
    body_us: float  # start event -> after the call, on the call's stream
    tail_us: float  # after the call -> after a device-wide synchronize
    spin_us: float  # GPU time of the spin before the start event
    host_us: float  # host time from queueing the spin to queueing the end event


def _bracket(api: Any, spin_cycles: int, call: Callable[[], Any] | None) -> _Trial:
    """One timed bracket. The spin keeps the GPU busy while the host queues the call, so that
    the GPU reaches the start event only when the call's work is already queued: host launch
    time stays out of the body, provided the spin outlasts it (`host_us < spin_us`: the spin
    cannot start on the GPU before the host queued it, when `host_us` starts counting)."""
    ev = [api.Event(enable_timing=True) for _ in range(4)]
    api.synchronize()
    ev[0].record()
    h0 = time.perf_counter()  # the spin starts on the GPU no earlier than this
    _spin(api, spin_cycles)  # not timed: it runs before the start event
    ev[1].record()
    if call is not None:
        call()
    ev[2].record()
    host_us = (time.perf_counter() - h0) * 1e6
    api.synchronize()  # the whole device, not just this stream: no hidden side-stream work
    ev[3].record()
    ev[3].synchronize()
    return _Trial(body_us=ev[1].elapsed_time(ev[2]) * 1000.0,
                  tail_us=ev[2].elapsed_time(ev[3]) * 1000.0,
                  spin_us=ev[0].elapsed_time(ev[1]) * 1000.0, host_us=host_us)


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
    max_spin_us: float = 5000.0,
    hidden_threshold_us: float = 10.0,
    hidden_threshold_rel: float = 0.05,
) -> TimingResult:
    """Time `fn(*make_args(i))` on the device; stop when IQR/median < target or a cap.

    Each trial records four events: before a GPU spin, start (after the spin), right after the
    call (on the current stream), and after a device-wide synchronize. The start -> call interval
    is the call's GPU time without host noise, **when the spin outlasted the host's time to queue
    the call**: otherwise the GPU idled after the start event waiting for the launch, and that
    gap was timed. On an H100 a 50 us spin against a ~50 us Python forward made 5-repeat medians
    jump 12-27% (CV 5.7% and 11% for 140 us and 99 us kernels). So the spin is sized from the
    host time of the warmup calls, every trial checks `host < spin` (host clock vs the spin's GPU
    time), and an uncovered trial is discarded and the spin doubled, up to `max_spin_us`; past
    that the call is host-bound (it synchronizes inside, say) and its gaps are its own cost.
    The call -> synchronize interval is the host's synchronize latency plus any work the call
    left on other streams. An empty bracket interleaved with every trial measures that latency
    alone. When the call's median tail exceeds the empty one's by more than
    max(hidden_threshold_us, hidden_threshold_rel * runtime), work was hidden from the current
    stream (side streams, other threads' streams): the samples become the synchronize-inclusive
    times minus the latency, so hidden work is always paid for, and `hidden_us` says how much.
    """
    api = device_api(device)
    flusher = flusher if flusher is not None else L2Flusher(device)
    persisting = reset_persisting_l2() if torch.device(device).type == "cuda" else False
    with torch.no_grad():
        host = _warm_up(fn, make_args, api, warmup, warmup_min_s)
        probe = _bracket(api, spin_cycles, None)
        # cycles per us; a device API without a spin (or a spin that took no time) cannot cover
        # launches: its trials are all kept, counted as uncovered
        rate = spin_cycles / probe.spin_us if probe.spin_us > 1.0 else 0.0
        spin_cap = int(rate * max_spin_us) if rate > 0 else spin_cycles
        steady = sorted(host[len(host) // 2:])  # the first calls pay one-time costs
        want_us = 2.0 * steady[len(steady) // 2] + 20.0
        spin = min(spin_cap, max(spin_cycles, int(rate * want_us)))
        run = _Trials(spin=spin, spin_cap=spin_cap, rate=rate)
        run.measure(api, fn, make_args, flusher, min_trials, max_trials, target_rel_iqr,
                    budget_s)
    if not run.trials:  # every attempt was discarded: the spin never caught up (keep the last)
        run.trials.append(run.last)
        run.empty.append(_bracket(api, run.spin, None).tail_us)
    return run.result(persisting, hidden_threshold_us, hidden_threshold_rel)


def _warm_up(fn: Callable[..., Any], make_args: Callable[[int], Sequence[Any]], api: Any,
             warmup: int, warmup_min_s: float) -> list[float]:
    """At least `warmup` calls and `warmup_min_s` of work; the host time of each call (us)."""
    # on an H100 the first of five repeated measurements of a 160 us kernel came out 18%
    # slower after 3 warmup calls (clocks still ramping), which alone made the repeat CV 8%
    t_warm = time.monotonic()
    host: list[float] = []
    i = 0
    while i < warmup or time.monotonic() - t_warm < warmup_min_s:
        args = make_args(-1 - i)
        h0 = time.perf_counter()
        fn(*args)
        host.append((time.perf_counter() - h0) * 1e6)
        i += 1
        if i % 8 == 0:
            api.synchronize()
    api.synchronize()
    return host


class _Trials:
    """The timed trials of one call, the empty brackets between them and the spin that covers
    the call's launch (doubled when a trial shows it did not)."""

    MAX_DISCARDS = 16

    def __init__(self, spin: int, spin_cap: int, rate: float) -> None:
        self.spin, self.spin_cap, self.rate = spin, spin_cap, rate
        self.trials: list[_Trial] = []
        self.empty: list[float] = []  # the synchronize tail around no call
        self.clocks: list[float] = []
        self.discarded = 0
        self.last: _Trial | None = None

    def measure(self, api: Any, fn: Callable[..., Any],
                make_args: Callable[[int], Sequence[Any]], flusher: L2Flusher,
                min_trials: int, max_trials: int, target_rel_iqr: float,
                budget_s: float) -> None:
        """Trials until IQR/median < target (after min_trials), max_trials, or the budget."""
        start_wall = time.monotonic()
        for i in range(max_trials + self.MAX_DISCARDS):
            args = make_args(i)
            flusher.flush()
            trial = self.last = _bracket(api, self.spin, lambda args=args: fn(*args))
            if trial.spin_us > 0:
                self.clocks.append(self.spin / trial.spin_us)
            if (trial.host_us >= trial.spin_us and self.spin < self.spin_cap
                    and self.discarded < self.MAX_DISCARDS):
                self.discarded += 1  # the GPU waited for the launch inside the timed interval
                self.spin = min(self.spin_cap,
                                max(2 * self.spin, int(self.rate * 2 * trial.host_us)))
                continue
            self.trials.append(trial)
            self.empty.append(_bracket(api, self.spin, None).tail_us)
            n = len(self.trials)
            if n >= max_trials:
                break
            if n >= min_trials and relative_iqr([t.body_us for t in self.trials]) < target_rel_iqr:
                break
            if n >= min_trials and time.monotonic() - start_wall > budget_s:
                break

    def result(self, persisting: bool, hidden_threshold_us: float,
               hidden_threshold_rel: float) -> TimingResult:
        """The figures; synchronize-inclusive when the call hid work from its stream."""
        trials = self.trials
        body = [t.body_us for t in trials]
        latency = statistics.median(self.empty)
        hidden = statistics.median([t.tail_us for t in trials]) - latency
        runtime = statistics.median(body)
        if hidden > max(hidden_threshold_us, hidden_threshold_rel * runtime):
            samples = [t.body_us + t.tail_us - latency for t in trials]
            result = summarize(samples, persisting_l2_reset=persisting)
            result.method = "device_sync"
        else:
            result = summarize(body, persisting_l2_reset=persisting)
        result.hidden_us = round(max(0.0, hidden), 3)
        result.sync_latency_us = round(latency, 3)
        result.spin_us = round(statistics.median([t.spin_us for t in trials]), 3)
        result.host_us = round(statistics.median([t.host_us for t in trials]), 3)
        result.uncovered_trials = sum(t.host_us >= t.spin_us for t in trials)
        result.discarded_trials = self.discarded
        result.clock_mhz = round(statistics.median(self.clocks), 1) if self.clocks else 0.0
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
