"""Red-team round 17 on the cpu backend: attacks on branch attack17 (from main at b4493cd), as a
policy rewarded for holes would try them (cases in tests/verifier/redteam_round17_cases.py).
Each was measured first (the "Before" of each test); an open one is a strict xfail naming its
fix.

Closed here: `sys.pycache_prefix` pointed at the worker's tmpfs with a forged .pyc (a later
job's `import graphlib` ran the job's code; `hidden_state.snapshot`); cuBLAS's fp16
accumulation and the math attention's fp16/bf16 reduction left on for every later job
(`tamper.SWITCHES`); the worker's OOM score adjustment and I/O priority
(`hidden_state.kernel_standing`); `copy`'s and `copyreg`'s dispatch tables
(`hidden_state.copy_tables`); the fallback check's op kinds poisoned for later jobs (its cache
filled while `torch.ops.aten.<op>` was the job's object, that object left there, `torch.Tag`'s
attributes, an overload's `_tags`: an honest `torch.empty_like` a cheat, a cheat's `torch.relu`
a "copy" that passed `strict`; `fallback.op_kind` now reads torch._C, its cache per job,
`hidden_state.foreign_ops` and `op_metadata`); the op trace made blind for later jobs
(`torch.utils._python_dispatch._push_mode`/`_pop_mode` no-ops: a later `torch.relu` forward
passed `strict`; `hidden_state.trace_machinery`); torch's Python front's private names
(`torch._VF.einsum` the job's: every later `torch.einsum`; `torch.nn.functional`'s helpers;
`hidden_state.torch_front`).
Open at first (strict xfails), closed in the lead's session 23: code that runs as an object
dies, hidden from the settle's scan (`disarm.pin_mortal`, now scanning with `mortal`) by a metaclass that denies `__del__`, a weak reference subclass whose
`__callback__` reads None, `PyObject_GC_UnTrack` (main's disarm.py names this one open too), or
a capsule whose C destructor is a ctypes callback (never listed: not a collected type): it ran
as the next job began (a GIL hog made an honest sibling's ReLU up to 50x slower, its verdict
standing, or had it run again). The fix's reader is here (`verifier.run.mortal`: C slots, the
C callback, untracked objects and capsules walked from what the collector lists and the
stack's locals), used by `disarm.pin_mortal`. And `relocations`' documented open, shown: a C++
vtable entry (`c10::TensorImpl`'s deleting destructor, `.data.rel.ro`) repointed at a slow hook
made every later honest ReLU 13x slower, its verdict standing (now each library's whole RELRO
up to `relocations.WHOLE_RELRO_MAX` is hashed).
No effect (measured, not kept as tests): torch's mobile cpu allocator left on
(`_set_default_mobile_cpu_allocator`: not compared, a torch ReLU 53.6 -> 50.2 us); torch._C's
other unread `_set_*` booleans judged harmless to a later verdict (test 4's docstring).
Not tried here: the reward HTTP service and the build sandbox (read only), a GPU's state.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from redteam_round7_cases import NUMPY_RELU
from redteam_round14_cases import leaving
from redteam_round17_cases import (
    ALLOCATING_RELU,
    BLIND_TRACE,
    IMPORTING_RELU,
    OP_KINDS,
    OP_KINDS_LEFT,
    PYCACHE_PREFIX,
    SETTLED,
    TORCH_RELU,
    VTABLE_SLOW,
    WAYS,
    hidden_death,
)
from test_redteam_round9b import _at_settle
from test_redteam_round14 import _ok, _said, _why  # the rounds' shared readers

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)

ROOT = Path(__file__).resolve().parents[2]


# --- 1. code hung on an object that dies in the next job, hidden from the settle's scan ---------
# (open at first, a strict xfail each: `disarm.pin_mortal` asked Python and saw only what
# `gc.get_objects()` lists; closed in the lead's session: it scans with `verifier.run.mortal`)
HOG_WAYS = list(WAYS)


@pytest.fixture(scope="module")
def hogged() -> dict[str, tuple[Any, Any, Any]]:
    """On the real path (`GpuRunner`, cpu loop), one sequence: an honest numpy ReLU, then for
    each way the attacker (an honest ReLU that, as its worker settles it, hangs code that
    rebinds torch.relu on the settle's message in the worker's loop, `hidden_death`) and an
    honest ReLU."""
    from verifier_cases import cpu_loop_jobs

    ways = list(WAYS)
    sources = [NUMPY_RELU]
    for way in ways:
        sources += [_at_settle(hidden_death(way)), NUMPY_RELU]
    outs, _ = cpu_loop_jobs(sources, "r17hog")
    return {way: (outs[0], outs[1 + 2 * i], outs[2 + 2 * i]) for i, way in enumerate(ways)}


@pytest.mark.parametrize("way", HOG_WAYS)
def test_code_a_job_hangs_on_a_dying_object_runs_in_no_later_job(
        hogged: dict[str, tuple[Any, Any, Any]], way: str) -> None:
    """Before (attack17 at b4493cd, measured here): for "plain" (round 10's `__del__`) the
    object was held, the later ReLU correct in the attacker's worker; for each hidden way the
    attacker was correct with no finding, and the next job's honest ReLU a cheat in the
    attacker's worker ("the candidate changed the harness's process: torch.relu"), run again
    in a fresh worker (correct: a run's throughput per attack). With `later` a GIL hog instead
    (`redteam_round17_cases.hidden_hog`, four sequences), the honest ReLU either stood correct
    at 822-7446 us a call (the first: 64-86 us; its worker replaced for "native threads", the
    hog's, after its timing) or was run again ("the judge's windows beat its traced trials
    past its bound"), as the hog fell on its trials or windows. Held: correct where it ran,
    nothing run again."""
    first, attacker, later = hogged[way]
    assert _ok(first) and _ok(attacker), (_why(first), _why(attacker))
    assert _ok(later), _why(later)
    assert not later.confirmed, (later.confirmed, _said(later))


@pytest.mark.parametrize("way", sorted(WAYS))
@pytest.mark.parametrize("scan", ["fixed", "as is"])
def test_a_settle_holds_what_runs_code_as_it_dies(way: str, scan: str) -> None:
    """In one process (SETTLED: a settle as the worker makes them, then the anchor dropped):
    `later` must not run. Before (attack17 at b4493cd, measured here): "plain" 0, each hidden
    way 1 (the "as is" row, the harness's own scan, was a strict xfail); with `mortal.mortal_of`
    as the scan ("fixed"), 0 for each. Now the harness's own scan is `mortal.mortal_of`
    (`disarm.pin_mortal`): "as is" 0 for each too."""
    if scan == "as is" and way == "plain":
        pytest.skip("the control: held as is (the fixed scan's row checks it too)")
    out = subprocess.run([sys.executable, "-c", SETTLED, way, scan.replace(" ", "_")],
                         capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "0", out.stdout


# --- 2. the bytecode cache moved to the job's own directory ----------------------------------
def test_a_bytecode_cache_a_job_moves_serves_no_later_import() -> None:
    """On the real path (`GpuRunner`, cpu loop): an honest numpy ReLU, the attacker (an honest
    ReLU leaving PYCACHE_PREFIX: `sys.pycache_prefix` at a directory of the worker's tmpfs
    holding a .pyc for `graphlib` whose header matches the source's size and mtime, its code
    the job's own), two honest ReLUs that `import graphlib`. Before (attack17 at b4493cd,
    measured here): the attacker correct with no finding, its worker kept; the next honest
    ReLU a cheat there ("the candidate changed the harness's process: torch.relu", the .pyc's
    code), run again in a fresh worker. Now the prefix is compared
    (`hidden_state.snapshot`): the attacker's worker is replaced, nothing run again."""
    from verifier_cases import cpu_loop_jobs

    outs, again = cpu_loop_jobs([NUMPY_RELU, leaving(NUMPY_RELU, PYCACHE_PREFIX),
                                 IMPORTING_RELU, IMPORTING_RELU], "r17pyc")
    assert "sys.pycache_prefix" in _said(outs[1]), _said(outs[1])
    assert all(map(_ok, outs)), [_why(o) for o in outs]
    assert again == 0 and not any(o.confirmed for o in outs), (again, _said(outs[2]))


def _runtime(out: Any) -> float:
    return float(((out.clock or {}).get("figures") or {}).get("runtime_us") or 0.0)


# --- 3. a C++ vtable entry in RELRO outside the GOT -----------------------------------------------
def test_a_vtable_entry_a_job_repoints_slows_no_later_job() -> None:
    """On the real path (`GpuRunner`, cpu loop): two honest numpy ReLUs, the attacker (an honest
    ReLU leaving VTABLE_SLOW: `c10::TensorImpl`'s deleting destructor in its vtable, libc10's
    `.data.rel.ro`, pointed at a ctypes hook that waits 0.5 ms and calls the original; in one
    process a loop of two tensors made and freed went 57 -> 1566 us), two honest ReLUs.
    Before (attack17 at b4493cd, measured here): the attacker correct with no finding, its
    worker kept; the later ReLUs correct at 1112 and 1186 us a call (before: 70-91 us), nothing
    run again: their speedups a thirteenth of their own (a strict xfail then). Now a library's
    whole RELRO is hashed up to `relocations.WHOLE_RELRO_MAX` (libc10's: 10 KiB): the
    attacker's worker is replaced, the later ReLUs timed as the first."""
    from verifier_cases import cpu_loop_jobs

    outs, again = cpu_loop_jobs([NUMPY_RELU, NUMPY_RELU, leaving(NUMPY_RELU, VTABLE_SLOW),
                                 NUMPY_RELU, NUMPY_RELU], "r17vtable")
    assert all(map(_ok, outs)), [_why(o) for o in outs]
    assert "libc10.so (GOT and RELRO pages)" in _said(outs[2]), _said(outs[2])
    floor = max(map(_runtime, outs[:2]))
    assert all(0 < _runtime(o) < 3 * floor + 100.0 for o in outs[3:]), list(map(_runtime, outs))


# --- 4. torch switches of reduced precision no check read ----------------------------------------
@pytest.mark.parametrize("switch", ["cublas_allow_fp16_accumulation",
                                    "math_sdp_allow_fp16_bf16_reduction"])
def test_reduced_precision_switches_a_job_leaves_are_residue(switch: str) -> None:
    """`torch.backends.cuda.matmul.allow_fp16_accumulation = True` (torch 2.7+: every later
    job's fp16 cuBLAS GEMM accumulates in fp16, faster and less exact, an honest sibling's
    torch.matmul included) and the math attention's fp16/bf16 reduction
    (`allow_fp16_bf16_reduction_math_sdp(True)`), set in this process through torch._C's
    setters (a cpu build keeps the flags) and undone. Before (attack17 at b4493cd, measured
    here, a sweep of torch._C's `_set_*` booleans): `left_in_process` empty for both, and
    neither in `gpu_worker.global_flags`. Now both are `tamper.SWITCHES`: residue, and nothing
    once undone. (Also not compared, judged harmless to a later verdict here: the fill of
    uninitialized memory, compared deterministic mode's only; nnpack, after oneDNN on x86;
    TorchScript's executor, forward AD, autograd threading, view replay.)"""
    import torch

    from verifier.run.tamper import left_in_process, process_state

    get, put = (getattr(torch._C, f"_{x}_{switch}") for x in ("get", "set"))
    before, was = process_state(), get()
    try:
        put(not was)
        left = left_in_process(before)
    finally:
        put(was)
    after = left_in_process(before)
    left, after = ([x for x in found if x != "file descriptors"] for found in (left, after))
    assert any("fp16" in x for x in left), left
    assert not after, after


# --- 5. the worker's standing with the kernel: OOM score, I/O priority ---------------------------
@pytest.mark.parametrize("route", ["oom score", "io priority"])
def test_the_workers_standing_a_job_lowers_is_residue(route: str) -> None:
    """`/proc/self/oom_score_adj` raised to 1000 (any process may raise its own: its worker is
    then the host OOM killer's first pick while every later job runs, an honest sibling's run
    killed for another's memory) and `ioprio_set` to the idle class (a later job's reads, its
    extension's .so among them, wait behind all other I/O), planted in this process and
    undone. Before (attack17 at b4493cd, measured here): `left_in_process` empty for both
    (neither read anywhere; the harm was not measured on this host: no memory or I/O
    pressure made). Now both are read (`hidden_state.kernel_standing`): residue, and nothing
    once undone."""
    import ctypes
    import platform

    from verifier.run.tamper import left_in_process, process_state

    libc = ctypes.CDLL(None, use_errno=True)
    get, put = {"x86_64": (252, 251), "aarch64": (31, 30)}[platform.machine()]
    path = "/proc/self/oom_score_adj"
    before, oom, io = process_state(), open(path).read().strip(), libc.syscall(get, 1, 0)
    try:
        if route == "oom score":
            with open(path, "w") as f:
                f.write("1000")
        else:
            assert libc.syscall(put, 1, 0, 3 << 13) == 0  # IOPRIO_CLASS_IDLE
        left = left_in_process(before)
    finally:
        with open(path, "w") as f:
            f.write(oom)
        libc.syscall(put, 1, 0, io)
    after = left_in_process(before)
    left, after = ([x for x in found if x != "file descriptors"] for found in (left, after))
    assert "OOM score and I/O priority" in left, left
    assert not after, after


# --- 6. what deepcopy dispatches on --------------------------------------------------------------
@pytest.mark.parametrize("route", ["deepcopy int", "copyreg"])
def test_deepcopy_dispatch_a_job_leaves_is_residue(route: str) -> None:
    """The worker deep-copies the reference's data into a candidate's globals (`--namespace
    kernelbench`: `namespace.candidate_globals`) and the reference model for the fp64 second
    opinion (`device_compare.against_fp64`). `copy._deepcopy_dispatch[int]` set to add one
    (private dict: the walk skips it) and `copyreg.dispatch_table[nn.Linear]` (not callable:
    skipped) planted in this process and undone. Before (attack17 at b4493cd, measured
    here): `left_in_process` empty for both, and with the first `candidate_globals` of
    {batch_size 16, dim 16384, shape [16, 16384]} gave 17, 16385, [17, 16385] (every later
    job's copies). Now the tables are read (`hidden_state.copy_tables`): residue, and nothing
    once undone."""
    import copy
    import copyreg

    import torch

    from verifier.checks.namespace import candidate_globals
    from verifier.run.tamper import left_in_process, process_state

    ref = {"batch_size": 16, "dim": 16384, "shape": [16, 16384]}
    before, was = process_state(), copy._deepcopy_dispatch[int]  # type: ignore[attr-defined]
    try:
        if route == "deepcopy int":
            copy._deepcopy_dispatch[int] = lambda x, memo: x + 1  # type: ignore[attr-defined]
            assert candidate_globals(ref, "kernelbench")["shape"] == [17, 16385]
        else:
            copyreg.dispatch_table[torch.nn.Linear] = lambda m: (torch.nn.Identity, ())
        left = left_in_process(before)
    finally:
        copy._deepcopy_dispatch[int] = was  # type: ignore[attr-defined]
        copyreg.dispatch_table.pop(torch.nn.Linear, None)
    after = left_in_process(before)
    left, after = ([x for x in found if x != "file descriptors"] for found in (left, after))
    assert "copy and copyreg dispatch tables" in left, left
    assert not after, after
    assert candidate_globals(ref, "kernelbench") == ref


# --- 7. the fallback check's op kinds poisoned for later jobs ------------------------------------
def test_op_kinds_a_job_poisons_reach_no_later_job() -> None:
    """On the real path (`GpuRunner`, cpu loop): an honest numpy ReLU that allocates its output
    with `torch.empty_like` (ALLOCATING_RELU: an allocation, not a fallback), the attacker
    (OP_KINDS: `op_kind`'s cache filled while `torch.ops.aten.empty_like` was an object of its
    own, then deleted), the honest ReLU, the attacker leaving the object there
    (OP_KINDS_LEFT), the honest ReLU. Before (attack17 at b4493cd, measured here, one loop per
    attacker): each attacker correct with no finding, its worker kept; the next honest ReLU
    "forward computes with torch ops: aten.empty_like.default (line 7)", a cheat in the
    attacker's worker, run again in a fresh one. Now `judge_ops` clears the cache for each
    job, `op_kind` reads torch._C, and a foreign entry of `torch.ops.aten` is residue
    (`hidden_state.foreign_ops`): every honest ReLU correct, nothing run again."""
    from verifier_cases import cpu_loop_jobs

    outs, again = cpu_loop_jobs([ALLOCATING_RELU, leaving(NUMPY_RELU, OP_KINDS), ALLOCATING_RELU,
                                 leaving(NUMPY_RELU, OP_KINDS_LEFT), ALLOCATING_RELU], "r17ops")
    assert "torch.ops.aten" in _said(outs[3]), _said(outs[3])
    assert all(map(_ok, outs)), [_why(o) for o in outs]
    assert again == 0 and not any(o.confirmed for o in outs), (again, list(map(_said, outs)))


@pytest.mark.parametrize("route", ["Tag attribute", "overload tags"])
def test_a_cheats_torch_op_is_not_made_a_copy_for_later_jobs(route: str) -> None:
    """`torch.Tag.view_copy = torch.Tag.pointwise` (a pybind class attribute) or
    `torch.ops.aten.relu.default._tags.append(torch.Tag.view_copy)`, planted in this process
    and undone: a later cheat's `torch.relu` must be a fallback under `strict`, or the plant
    residue (its worker replaced before any later job). Before (attack17 at b4493cd, measured
    here): for both `judge_ops([aten.relu.default], "strict")` found nothing ("copy") and
    `left_in_process` was empty. Now `op_kind` reads tags from torch._C (the second: a
    fallback) and the metadata classes' attributes are residue (`hidden_state.op_metadata`)."""
    import torch

    from verifier.checks.fallback import judge_ops
    from verifier.run.tamper import left_in_process, process_state

    before, was, tags = process_state(), torch.Tag.view_copy, torch.ops.aten.relu.default._tags
    try:
        if route == "Tag attribute":
            torch.Tag.view_copy = torch.Tag.pointwise
        else:
            tags.append(torch.Tag.view_copy)
        cheat = judge_ops([("aten.relu.default", 6)], "strict", 0)[1]
        left = [x for x in left_in_process(before) if x != "file descriptors"]
    finally:
        torch.Tag.view_copy = was
        if route != "Tag attribute":
            tags.pop()
    assert cheat or left, (cheat, left)
    assert judge_ops([("aten.relu.default", 6)], "strict", 0)[1]


# --- 8. the op trace made blind for later jobs ---------------------------------------------------
def test_a_trace_a_job_blinds_passes_no_later_fallback() -> None:
    """On the real path (`GpuRunner`, cpu loop): a library fallback (TORCH_RELU: `forward` is
    `torch.relu(x)`), an honest numpy ReLU, the attacker (an honest ReLU leaving BLIND_TRACE:
    `torch.utils._python_dispatch._push_mode` and `_pop_mode` made no-ops, private functions
    of a module whose public callables alone were compared), the fallback again, an honest
    ReLU. Before (attack17 at b4493cd, measured here): the first fallback a cheat ("forward
    computes with torch ops: aten.relu.default (line 6)"); the attacker correct with no
    finding, its worker kept; the second fallback CORRECT in that worker (its trace empty),
    nothing run again. Now every callable of the trace's modules and their classes'
    attributes are residue (`hidden_state.trace_machinery`): the attacker's worker is
    replaced, the second fallback a cheat as the first."""
    from verifier_cases import cpu_loop_jobs

    outs, _ = cpu_loop_jobs([TORCH_RELU, NUMPY_RELU, leaving(NUMPY_RELU, BLIND_TRACE),
                             TORCH_RELU, NUMPY_RELU], "r17blind")
    first, honest, attacker, second, last = outs
    assert "op trace machinery" in _said(attacker), _said(attacker)
    assert _ok(honest) and _ok(attacker) and _ok(last), [_why(o) for o in outs]
    for cheat in (first, second):
        assert not _ok(cheat) and "aten.relu" in str((cheat.payload or {}).get("error")), \
            (cheat.payload or {}).get("error")


# --- 9. torch's Python front: names the walk skipped ---------------------------------------------
@pytest.mark.parametrize("route", ["torch._VF.einsum", "F._canonical_mask"])
def test_torchs_private_front_a_job_rebinds_is_residue(route: str) -> None:
    """`torch._VF` answers torch's C functions by `__getattr__` (`torch.einsum`, `torch.norm`,
    `torch.meshgrid`, nn.LSTM and dropout call through it), so a name set on it is no key of
    the walk; `torch.nn.functional`'s private helpers (`_canonical_mask`: every attention
    mask) are skipped as private. Planted in this process and undone. Before (attack17 at
    b4493cd, measured here): `left_in_process` empty for both, and with the first every
    `torch.einsum` was the job's (here: its sum plus one). Now every callable and module of
    `hidden_state.FRONT_MODULES` is compared, private ones too: residue, and nothing once
    undone (nor after an honest LSTM, einsum and norm)."""
    import torch

    from verifier.run.tamper import left_in_process, process_state

    vf, fn = sys.modules["torch._VF"], sys.modules["torch.nn.functional"]
    real, mask = torch._C._VariableFunctions.einsum, fn._canonical_mask
    before = process_state()
    try:
        if route == "torch._VF.einsum":
            vf.einsum = lambda eq, ops, **kw: real(eq, ops) + 1
            assert torch.einsum("ij->j", torch.ones(2, 2)).tolist() == [3.0, 3.0]
        else:
            fn._canonical_mask = lambda *a, **k: None
        left = left_in_process(before)
    finally:
        vf.__dict__.pop("einsum", None)
        fn._canonical_mask = mask
    assert torch.einsum("ij->j", torch.ones(2, 2)).tolist() == [2.0, 2.0]
    after = left_in_process(before)
    left, after = ([x for x in found if x != "file descriptors"] for found in (left, after))
    assert "torch's Python front (private names too)" in left, left
    assert "torch's Python front (private names too)" not in after, after
