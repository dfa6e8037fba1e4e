"""Red-team round 10 on the cpu backend: attacks on main at a9be61a, as a policy rewarded for
holes would try them (cases in tests/verifier/redteam_round10_cases.py). Each was measured on
main first (the "Before" of each test); an open one is a strict xfail naming its fix.

Persistent worker (`verifier.run.gpu_worker`; its cpu loop here, one worker sequence `chain`
as in rounds 9 and 9b: no timing asserted, only verdicts and which worker ran a job). What a
job leaves that reached the next job, an honest sibling's, framing it or failing it:
- code run later despite the settle (`verifier.run.settle`): a finalizer of the candidate's
  own named as torch's (`__module__` is writable), a torch function that execs its argument,
  an object hung on the job's `load_inline` shim (died in the next job's `install_shim`);
  fixed: torch's finalizers by identity (`settle.torch_own`), the shim goes with its job;
  torch's `_del_library` given a handle whose `on_destroy` is the candidate's (open here):
  every finalizer is detached at the settle (`verifier.run.disarm`; more of this kind in
  tests/verifier/test_redteam_later_code.py);
- state the residue check did not compare: an operator of `torch.Tensor` (x * 2 = 2x + 1),
  the process's settings (umask 777 killed the worker with the next job; priority, rlimits,
  blocked signals, recursion limit, switch interval; a stdout whose flush the worker calls),
  the worker's own exchange (`json` encoder and decoder: the next job's result rewritten, or
  another candidate run in its place), a private torch counter the mode check reads (round
  7's mode hidden); fixed in `verifier.run.tamper` (class_attributes, process_settings,
  protocol_state, torch_private).
Parent side: what the worker writes beside the verdict (its result is the candidate's to
write): text where the batch loop read a number, findings that are not records (both ended
`verify_batch` for the whole batch), megabytes of findings and a `generalised` finding of its
own; fixed: `verifier.judge.worker_fields`. The timed calls' trace blinded in the worker: held
on a cpu by the judge's sampler; on the persistent loop (the GPU's) by the judge's clock over the
trials (`verifier.judge.trial_pace`: windows far faster than the traced trials are a cheat).
GPU forms: `python -m benchmarks.redteam_gpu --backend cuda --round10 --out ...` (the same
Python in the CUDA worker's loop, each attack between honest compiled ReLUs; also the
own-kernel share forged under --fallback partial, a GPU-only hole).
"""

from __future__ import annotations

import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from redteam_round7_cases import NUMPY_RELU  # noqa: E402
from redteam_round10_cases import (  # noqa: E402
    ASK_MODULE,
    ASK_MUL,
    ASK_SETTINGS,
    BLIND_EXTRA,
    BLIND_FORWARD,
    BULK_FORWARD,
    DECODER_EXTRA,
    DUNDER_EXTRA,
    ENCODER_EXTRA,
    FINDINGS_FORWARD,
    FORGE_EXTRA,
    HIDDEN_MODE_EXTRA,
    PATH_EXTRA,
    PHASES_FORWARD,
    SETTINGS_EXTRA,
    SPEC_EXTRA,
    STREAM_EXTRA,
    UMASK_EXTRA,
    extra,
)
from test_redteam_round9 import _jobs  # noqa: E402

from verifier.run.settle import armed_finalizers, torch_own  # noqa: E402

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)

ROOT = Path(__file__).resolve().parents[2]


def _anchored(name: str) -> str:
    """An honest numpy ReLU with the attack `name`'s module code (redteam_round10_cases)."""
    return NUMPY_RELU.replace("class ModelNew(torch.nn.Module):\n",
                              extra(name) + "class ModelNew(torch.nn.Module):\n")


SPOOF, EXEC, DEL, KEPT = (_anchored(n) for n in ("spoof", "exec", "del", "kept"))


def _with(code: str) -> str:
    """An honest numpy ReLU with `code` at module level."""
    return NUMPY_RELU.replace("class ModelNew(", code + "\n\nclass ModelNew(")


def _asking(code: str) -> str:
    """A numpy ReLU whose forward runs `code` (which raises what it found) first."""
    return NUMPY_RELU.replace("        import numpy as np\n", f"        {code}\n")


DUNDER, ASK = _with(DUNDER_EXTRA), _asking(ASK_MUL)


@pytest.fixture(scope="module")
def chain() -> dict[str, list[dict[str, Any]]]:
    """Each attack and the honest job after it, in one worker's sequence."""
    runs = {"spoof": [SPOOF, NUMPY_RELU], "exec": [EXEC, NUMPY_RELU], "del": [DEL, NUMPY_RELU],
            "kept": [KEPT, NUMPY_RELU], "dunder": [DUNDER, ASK],
            "settings": [_with(SETTINGS_EXTRA), _asking(ASK_SETTINGS)],
            "umask": [_with(UMASK_EXTRA), NUMPY_RELU], "stream": [_with(STREAM_EXTRA), NUMPY_RELU],
            "encoder": [_with(ENCODER_EXTRA), NUMPY_RELU],
            "decoder": [_with(DECODER_EXTRA), NUMPY_RELU],
            "hidden_mode": [_with(HIDDEN_MODE_EXTRA), ASK],
            "path": [_with(PATH_EXTRA), _asking(ASK_MODULE)],
            "spec": [_with(SPEC_EXTRA), _asking(ASK_MODULE)]}
    got = _jobs([src for srcs in runs.values() for src in srcs])
    out, i = {}, 0
    for name, srcs in runs.items():
        out[name], i = got[i:i + len(srcs)], i + len(srcs)
    return out


@pytest.mark.parametrize("name", ["spoof", "exec", "del"])
def test_code_hung_on_the_jobs_shim_runs_in_its_own_job(
        chain: dict[str, list[dict[str, Any]]], name: str) -> None:
    """Before (main at a9be61a, measured here): each attacker passed ("ok", no finding) in a
    worker that stayed, and the honest numpy ReLU after it in that worker was a "cheat"
    ("torch.relu changed during the run"). Now the job's shim goes as the job ends
    (`gpu_worker._run_one`): what hangs on it runs in the attacker's own job, which is the
    cheat, and the sibling passes in a fresh worker."""
    attacker, honest = chain[name]
    assert honest["outcome"] == "ok", honest
    assert honest["worker_pid"] != attacker["worker_pid"]
    assert attacker["outcome"] == "cheat", attacker
    assert "torch.relu changed during the run" in [f["message"] for f in attacker["findings"]]


def test_a_finalizer_named_as_torchs_is_named_at_the_settle(
        chain: dict[str, list[dict[str, Any]]]) -> None:
    """Before: no finding, the worker stayed (the settle took any function whose `__module__`
    said torch for torch's own). Now torch's finalizers are known by identity: the job's is
    named at its settle and its worker is replaced; the sibling passes."""
    attacker, honest = chain["kept"]
    said = [f["message"] for f in attacker.get("findings", [])]
    assert any("weakref.finalize callbacks armed (torch.fx.passes.later)" in m for m in said), \
        attacker
    assert honest["outcome"] == "ok" and honest["worker_pid"] != attacker["worker_pid"]


def test_an_operator_of_torchs_tensor_rebound_is_not_handed_to_the_next_job(
        chain: dict[str, list[dict[str, Any]]]) -> None:
    """A job rebinds `torch.Tensor.__mul__` (x * y + 1). Before (measured here): no finding,
    the same worker, and the next job's `torch.ones(2) * 2` was [3.0, 3.0] (an honest sibling
    that multiplies is "incorrect"): the checks compared only a module's public callables.
    Now the attributes of the classes every job goes through (torch's Tensor, nn's modules,
    autograd's Function) are compared too: changed, the worker is replaced."""
    rebinder, ask = chain["dunder"]
    said = [f["message"] for f in rebinder.get("findings", []) if f["rule"] == "worker_replaced"]
    assert any("torch.Tensor attributes" in m for m in said), rebinder
    assert ask["outcome"] == "runtime_error" and "mul=[2.0, 2.0]" in ask.get("error", ""), ask
    assert ask["worker_pid"] != rebinder["worker_pid"]


def test_the_processs_settings_a_job_changes_are_not_handed_to_the_next_job(
        chain: dict[str, list[dict[str, Any]]]) -> None:
    """Before (measured here, one worker): the setter passed with no finding and the next job
    saw its settings: "rec=400 nice=+7 nofile=64 cpu=3000 mask=[SIGUSR1] switch=0.5 stack=65536
    digits=640" (a lower priority and a 0.5 s thread switch slow a sibling's windows under
    load; 64 descriptors or a cpu-time limit end it). Now they are part of the residue
    (`tamper.process_settings`): the worker is replaced and the next job sees the defaults."""
    setter, ask = chain["settings"]
    said = " ".join(f["message"] for f in setter.get("findings", [])
                    if f["rule"] == "worker_replaced")
    for name in ("priority", "rlimits", "signal mask", "sys.getrecursionlimit()",
                 "sys.getswitchinterval()"):
        assert name in said, (name, setter)
    assert ask["worker_pid"] != setter["worker_pid"]
    assert "rec=1000 nofile=" in ask["error"] and "mask=[]" in ask["error"], ask
    assert "nofile=64 " not in ask["error"] and "switch=0.5 " not in ask["error"], ask


@pytest.mark.parametrize("name", ["umask", "stream"])
def test_a_umask_or_stream_a_job_leaves_does_not_fail_the_next_job(
        chain: dict[str, list[dict[str, Any]]], name: str) -> None:
    """Before (measured here): a umask of 777 passed with no finding, and the worker died
    with the next job, an honest ReLU's ("PermissionError: ... /tmp/w/job-..."); a stdout
    whose `flush` (the worker's, after each job) rebinds torch.relu from its second call made
    the next honest job a cheat. Now both are residue: the worker is replaced."""
    leaver, honest = chain[name]
    assert honest["outcome"] == "ok", honest
    assert honest["worker_pid"] != leaver["worker_pid"]


@pytest.mark.parametrize("name", ["encoder", "decoder"])
def test_the_workers_json_a_job_rebinds_does_not_frame_the_next_job(
        chain: dict[str, list[dict[str, Any]]], name: str) -> None:
    """The worker reads each job with `json.loads` and writes each result with `json.dumps`.
    Before (measured here, one worker): a job that rebound `json.JSONEncoder.encode` passed,
    and the next job's result, an honest numpy ReLU's, came back "incorrect" ("framed by an
    earlier job", under that job's nonce); one that set `json._default_decoder.decode` passed,
    and the next job ran another candidate ("not the candidate that was sent"): only public
    callables of a module were compared. Now every global of json and socket, private ones
    too, and their classes' and objects' attributes, are part of the residue: the worker is
    replaced."""
    leaver, honest = chain[name]
    assert leaver["outcome"] == "ok", leaver
    assert honest["outcome"] == "ok", honest
    assert honest["worker_pid"] != leaver["worker_pid"]
    said = " ".join(f["message"] for f in leaver["findings"] if f["rule"] == "worker_replaced")
    assert "(protocol)" in said, leaver


def test_a_mode_hidden_from_the_checks_reader_does_not_reach_the_next_job(
        chain: dict[str, list[dict[str, Any]]]) -> None:
    """Round 7's torch-function mode (adds 1 to every later job's tensors) left on the stack,
    and `torch._C._len_torch_function_stack` rebound to tell one less. Before (measured here):
    no finding, the same worker, and the next job's `torch.ones(2) * 2` was [5.0, 5.0]. Now
    the private globals of torch and torch._C are part of the residue: the worker is
    replaced and the next job computes [2.0, 2.0]."""
    leaver, ask = chain["hidden_mode"]
    said = " ".join(f["message"] for f in leaver["findings"] if f["rule"] == "worker_replaced")
    assert "torch._C._len_torch_function_stack (private)" in said, leaver
    assert ask["worker_pid"] != leaver["worker_pid"]
    assert "mul=[2.0, 2.0]" in ask["error"], ask


@pytest.mark.parametrize("name", ["path", "spec"])
def test_a_module_a_job_wrote_for_a_later_import_is_not_handed_to_the_next_job(
        chain: dict[str, list[dict[str, Any]]], name: str) -> None:
    """A job writes `tabnanny.py` to its worker's tmpfs (which outlives the job) and either
    puts that directory first on sys.path or loads the file and places it in sys.modules.
    Before (measured here): no finding, the same worker, and the next job's `import tabnanny`
    ran the job's file ("the module an earlier job wrote"; file=/tmp/w/tabnanny.py): sys.path
    was not compared, and a module counted as imported when its file existed. Now sys.path is
    part of the residue and a module from the worker's writable directories is not imported:
    the worker is replaced and the next job gets the standard library's."""
    leaver, ask = chain[name]
    said = " ".join(f["message"] for f in leaver["findings"] if f["rule"] == "worker_replaced")
    assert ("sys.path (value)" if name == "path" else "tabnanny") in said, leaver
    assert ask["worker_pid"] != leaver["worker_pid"]
    assert "file=" in ask["error"] and "/tmp/w/" not in ask["error"], ask


def _finalizer(func: Any, *args: Any) -> Any:
    """The registry entry of a `weakref.finalize(anchor, func, *args)` (detached after)."""
    class Anchor:
        pass

    anchor = Anchor()
    fin = weakref.finalize(anchor, func, *args)
    info = weakref.finalize._registry[fin]  # type: ignore[attr-defined]
    fin.detach()
    return info


def test_torchs_own_finalizers_are_still_torchs() -> None:
    """An honest job that defines a `torch.library.Library` (a custom op) leaves torch's own
    finalizer: not a leftover (its worker stays)."""
    import torch

    before = armed_finalizers()
    lib = torch.library.Library("ks_round10", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CPU")
    new = [name for fin, name in armed_finalizers().items() if fin not in before]
    assert new == [], new
    assert any(torch_own(info) for info in weakref.finalize._registry.values())  # type: ignore
    assert not torch_own(_finalizer(print, "x"))  # not torch's function
    def later() -> None:
        pass
    later.__module__ = "torch.fx.passes"
    assert not torch_own(_finalizer(later))


# in a process of its own (the settle detaches every finalizer and pins what it finds there):
# torch's finalizer function with the candidate's code in every place its data can hold it
DETACHED = """
import functools, gc, sys, weakref
import torch
from torch._library.utils import RegistrationHandle
from verifier.run.disarm import note_frozen
from verifier.run.settle import armed_finalizers, leftover_code

gc.collect()
gc.freeze()
mark = note_frozen(freeze=False)
before = armed_finalizers()
ran = []


def later(*_a):
    ran.append(1)


class Job:
    def method(self):
        later()


class Anchor:
    pass


kept = []
for on_destroy in (later, functools.partial(later), Job().method):
    anchor = Anchor()
    torch.library._keep_alive.append(anchor)  # an object torch holds
    weakref.finalize(anchor, torch.library._del_library, set(), set(), set(), set(),
                     [RegistrationHandle(on_destroy)], None, {})
    weakref.finalize(anchor, functools.partial(torch.library._del_library, set(), set()),
                     set(), set(), [RegistrationHandle(on_destroy)], None, {})
    weakref.finalize(anchor, RegistrationHandle(on_destroy).destroy)
    kept.append(anchor)
left = leftover_code(before, mark)
for anchor in kept:
    torch.library._keep_alive.remove(anchor)
del anchor
kept.clear()
gc.collect()
print(len(ran), len(weakref.finalize._registry), left)
"""


def test_torchs_finalizer_with_the_candidates_code_never_runs_after_the_settle() -> None:
    """This file's xfail (torch's finalizer given a handle the candidate made), in every form:
    `torch.library._del_library` (by identity) with real `RegistrationHandle`s whose
    `on_destroy` is the job's function, a partial of it or a bound method, armed directly or
    through a partial, or a handle's `destroy` itself, on objects torch holds. Before (main
    at 258f195, measured): the settle named only the last (its function is no torch
    finalizer: that worker would have gone) and all nine ran as the objects died. Now every
    finalizer is detached at the settle, whatever its function (`verifier.run.disarm`): none
    runs, the registry is empty, the last is still named. In a worker, on an object that dies
    in the next job: tests/verifier/test_redteam_later_code.py."""
    out = subprocess.run([sys.executable, "-c", DETACHED], capture_output=True, text=True,
                         cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    ran, registry, left = out.stdout.strip().splitlines()[-1].split(" ", 2)
    assert (ran, registry) == ("0", "0"), out.stdout
    assert "RegistrationHandle.destroy" in left, left


@pytest.mark.slow
def test_what_a_worker_writes_beside_the_verdict_does_not_end_the_batch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Correct ReLUs whose forward writes into the harness's result (its process: frames here,
    PyRun from C++ alike), static checks off (the run-time defences on their own), between
    honest ones, in one batch. Before (measured here): `phase_s = {"load": "a while"}` made
    verify_batch raise ValueError ("could not convert string to float") from the batch loop,
    outside the per-candidate guard: no verdict for any candidate, honest ones included;
    findings that are not records, then a NameError, raised in the feedback's hint likewise
    (AttributeError); 2000 findings of 3 kB made a correct verdict of 7 MB, with a `generalised`
    finding of the worker's own. Now the worker's fields are kept only in the shapes the
    verifier reads them (`verifier.judge.worker_fields`): every verdict is there, small."""
    import json

    from redteam_cases import candidate
    from verifier_cases import relu_task

    import verifier.stages as stages
    from verifier.api import verify_batch
    from verifier.protocol import VerifyOptions, VerifyRequest

    monkeypatch.setattr(stages, "check_python", lambda *a, **k: [])
    monkeypatch.setattr(stages, "check_cpp", lambda *a, **k: [])
    honest = candidate(name="r10_diag", prelude=False)
    rows = [("honest_before", honest)] + [
        (name, candidate(FORGE_EXTRA, forward=fwd, name="r10_diag", prelude=False))
        for name, fwd in (("phases", PHASES_FORWARD), ("findings", FINDINGS_FORWARD),
                          ("bulk", BULK_FORWARD))] + [("honest_after", honest)]
    reqs = [VerifyRequest(name, "relu", relu_task(16, 256), code, "cpu") for name, code in rows]
    got = {v.candidate_id: v for v in verify_batch(reqs, VerifyOptions(
        backend="cpu", workers=1, build_cache_dir=str(tmp_path / "builds"),
        baseline_cache_dir=str(tmp_path / "baselines")))}
    assert sorted(got) == sorted(name for name, _ in rows)
    for name in ("honest_before", "honest_after", "phases"):
        assert got[name].status.startswith("correct"), got[name]
    assert got["findings"].status == "runtime_error", got["findings"]
    bulk = got["bulk"]
    assert len(json.dumps(bulk.to_dict())) < 1 << 20, len(json.dumps(bulk.to_dict()))
    assert "generalised" not in {f["rule"] for f in bulk.findings}


def test_the_workers_fields_are_kept_only_in_the_shapes_the_verifier_reads() -> None:
    """The shapes `verifier.judge.worker_fields` keeps of a worker's hostile result fields."""
    from verifier.judge import worker_fields as wf

    assert not wf.diagnostic("phase_s", {"load": "a while"})
    assert not wf.diagnostic("phase_s", {"load": True}) and wf.diagnostic("phase_s", {"a": 1.5})
    assert not wf.diagnostic("timing_cv", float("nan")) and wf.diagnostic("timing_cv", 0.02)
    assert not wf.diagnostic("worker_device", "x" * 5000)
    kept = wf.findings([1, "x", {"rule": "generalised", "message": "m"},
                        {"rule": "note", "message": "A" * 9000, "line": True}] * 100)
    assert len(kept) == wf.MAX_FINDINGS and {f["rule"] for f in kept} == {"note"}
    assert len(kept[0]["message"]) == wf.MAX_TEXT and kept[0]["line"] is None
    assert wf.findings("not a list") == [] and wf.kernel_names({"a": 1}) == []
    assert [wf.share(x) for x in ("1.0", 1.5, float("nan"), True, 0.25)] == [
        None, None, None, None, 0.25]


@pytest.mark.slow
def test_a_blinded_trace_of_the_timed_calls_is_caught_by_the_judges_sampler(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ReLU whose own kernel does the trials and whose timed calls run torch.relu, static
    checks off. Switching alone is the worker's `timed_fallback` cheat. Swapping the worker's
    recorder set as the windows begin (BLIND_EXTRA) hides it from that check (no
    `timed_fallback`), and the judge's ip sampler, in its own process, still finds the
    library's time: a cheat ("library_time", measured here: none of 19 compute samples in the
    candidate's objects). On a GPU the worker's records are all there is: the GPU form
    (benchmarks/redteam_gpu.py --round10, "blind") is the hole to measure there."""
    from redteam_cases import candidate
    from verifier_cases import relu_task

    import verifier.stages as stages
    from verifier.api import verify_batch
    from verifier.protocol import VerifyOptions, VerifyRequest

    monkeypatch.setattr(stages, "check_python", lambda *a, **k: [])
    monkeypatch.setattr(stages, "check_cpp", lambda *a, **k: [])
    switch = BLIND_FORWARD.replace("blind()\n            ", "")
    rows = [("honest", candidate(name="r10_diag", prelude=False)),
            ("blind", candidate(BLIND_EXTRA, forward=BLIND_FORWARD, name="r10_diag",
                                prelude=False)),
            ("switch", candidate(BLIND_EXTRA, forward=switch, name="r10_diag", prelude=False))]
    reqs = [VerifyRequest(n, "relu", relu_task(256, 4096), c, "cpu") for n, c in rows]
    got = {v.candidate_id: v for v in verify_batch(reqs, VerifyOptions(
        backend="cpu", workers=1, build_cache_dir=str(tmp_path / "builds"),
        baseline_cache_dir=str(tmp_path / "baselines")))}
    assert got["honest"].status.startswith("correct"), got["honest"]
    assert got["switch"].status == "cheat" and "timed_fallback" in {
        f["rule"] for f in got["switch"].findings}, got["switch"]
    blind = got["blind"]
    assert blind.status == "cheat" and "library" in blind.error, blind
    assert "timed_fallback" not in {f["rule"] for f in blind.findings}  # the worker was blind


@pytest.mark.slow
def test_a_blinded_trace_of_the_timed_calls_is_caught_in_the_persistent_worker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """BLIND_EXTRA on the persistent worker's loop (`CpuBackend.persistent_worker`, as
    benchmarks/redteam_gpu.py --round10 --persistent runs it). Before (measured here, main at
    a9be61a): "blind" was correct_slow with no finding (the cpu sandbox path's sampler calls
    it a cheat): on that loop, the GPU's, the timed calls' trace and the kernel profile are the
    worker's, the only fallback checks. Now the judge times each traced trial through its
    clock as it times the windows (`verifier.judge.trial_pace`). The attack pays where its own
    kernel is slower than the library's: here an unoptimised one (27-53 ms a call against
    torch.relu's 1.9-2.1 ms, measured here). The blinded run's windows (torch.relu) are far
    faster per call than its traced trials (its kernel, 39-58 ms): a cheat (`timed_not_traced`)
    naming both figures, at 4-6x the judge's bound; the same kernel honest is correct, its
    trials within 1.0-1.3x of its windows (0.3-0.4 of the bound). With the compiled ReLU of the
    cases (its kernel 6.0 ms a call here, torch.relu's 3.9) the blinded run stays correct: it
    gains less than the bound (`trial_pace.RATIO`)."""
    from redteam_cases import RELU, candidate
    from verifier_cases import relu_task

    import verifier.stages as stages
    from verifier.api import verify_batch
    from verifier.backends.cpu import CpuBackend
    from verifier.protocol import VerifyOptions, VerifyRequest

    monkeypatch.setattr(stages, "check_python", lambda *a, **k: [])
    monkeypatch.setattr(stages, "check_cpp", lambda *a, **k: [])
    # its ReLU in a kernel several times slower than torch's (unoptimised, four passes): what
    # a run gains by running the library's op in its timed calls instead
    slow = RELU.replace("for (int64_t i = 0;",
                        "for (int pass = 0; pass < 4; ++pass)\n    for (int64_t i = 0;")
    monkeypatch.setattr(CpuBackend, "persistent_worker", True)
    rows = [("honest", candidate(cpp=slow, cflags='["-O0"]', name="r10_slow",
                                 prelude=False)),
            ("blind", candidate(BLIND_EXTRA, forward=BLIND_FORWARD, cpp=slow,
                                cflags='["-O0"]', name="r10_slow", prelude=False))]
    reqs = [VerifyRequest(n, "relu", relu_task(256, 4096), c, "cpu") for n, c in rows]
    got = {v.candidate_id: v for v in verify_batch(reqs, VerifyOptions(
        backend="cpu", gpus=1, workers=1, build_cache_dir=str(tmp_path / "builds"),
        baseline_cache_dir=str(tmp_path / "baselines")))}
    assert got["honest"].status.startswith("correct"), got["honest"]
    blind = got["blind"]
    assert blind.status == "cheat", blind
    assert "timed_not_traced" in {f["rule"] for f in blind.findings}, blind
    assert "faster than the traced trials" in blind.error and "windows " in blind.error, blind
