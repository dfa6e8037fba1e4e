"""One candidate's way through the verifier's stages (`verifier.api` drives many at once): the
item and its verdict, the front stages in the caller (extract, Python static checks), its
extension specs (literal, or from a sandboxed collect run), the C++ static checks, and its run
on an execution slot with the parent's own judgement of what the worker measured."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from verifier.backends import Backend, candidate_tool
from verifier.checks.extract import FormatError, check_candidate, extract_code
from verifier.checks.extspec import ExtensionSpec, specs_from_source
from verifier.checks.fallback import apply_policy, errors
from verifier.checks.static import check_cpp, check_python
from verifier.compile.builder import BuildResult
from verifier.isolation.sandbox import Launcher, SandboxLimits, candidates_words
from verifier.judge import worker_fields
from verifier.judge.construct import DEVICE, HOST, HOST_ONLY
from verifier.judge.construct import finding as construct_finding
from verifier.judge.decide import parent_check
from verifier.judge.generalize import record_generalisation, request_variants
from verifier.judge.inputs import trial_input_seed
from verifier.judge.pace import Pace
from verifier.judge.performance import judge_performance
from verifier.judge.reward import record_share
from verifier.protocol import VerdictData, VerifyOptions, VerifyRequest
from verifier.run.baselines import BESIDE_COMPILES, Baselines
from verifier.run.gpu_runner import GpuRunner
from verifier.run.runners import FLOOD_BYTES, SandboxRunner


@dataclass
class Item:
    """One candidate on its way through the stages, and its verdict so far."""

    req: VerifyRequest
    verdict: VerdictData
    code: str = ""
    specs: list[ExtensionSpec] = field(default_factory=list)
    built: dict[str, BuildResult] = field(default_factory=dict)
    done: bool = False
    t0: float = field(default_factory=time.monotonic)
    timing: dict[str, Any] = field(default_factory=dict)  # collect/compile/exec seconds
    # its task's baseline was timed beside compiles: re-judged from a quiet one before it is
    # written (`verifier.run.baselines.Baselines.retime`)
    provisional_base: bool = False

    def stop(self, status: str, stage: str, error: str = "") -> None:
        """The candidate's way ends here, with this status at this stage."""
        # the stage may be the worker's word (the candidate's process): a name, not a payload
        self.verdict.status, self.verdict.stage = status, str(stage)[:40]
        if error:
            self.verdict.error = error[:4000]
        self.done = True


def collect_specs(item: Item, opts: VerifyOptions, launcher: Launcher) -> None:
    """Fill item.specs from literals, else by running the module in a collect sandbox."""
    specs = specs_from_source(item.code)
    if specs is not None:
        item.specs = specs
        return
    t0 = time.monotonic()
    with candidate_tool() as cpus:  # the candidate's module-level code, off the timing cores
        res = launcher.run_module("verifier.run.collect",
                                  limits=SandboxLimits(timeout_s=min(opts.run_timeout_s, 60.0),
                                                       memory_mb=opts.memory_limit_mb, cpus=cpus),
                                  input_files={"candidate.py": item.code,
                                               "task.py": item.req.task_source})
    item.timing["collect_s"] = time.monotonic() - t0
    if res.timed_out:
        item.stop("timeout", "compile", "running the candidate module (to find its load_inline "
                                        f"calls) {res.describe_failure()}")
        return
    if res.payload is None:
        item.stop("runtime_error", "compile", "running the candidate module failed: "
                  + res.describe_failure())
        return
    item.specs = [ExtensionSpec.from_dict(d) for d in res.payload.get("specs", [])]
    if res.payload.get("error") and not item.specs:
        line = res.payload.get("line")
        said = (f"candidate.py line {line}: " if line else "") + str(res.payload["error"])
        # the run reached the candidate's module: its result file may be the candidate's words
        item.stop("runtime_error", "compile", candidates_words(said) if res.started else said)


# the options a worker's job carries
JOB_OPTIONS = ("trials", "atol_fp32", "rtol_fp32", "atol_low", "rtol_low", "perf_trials",
                "perf_max_trials", "perf_budget_s", "perf_target_rel_iqr", "perf_warmup",
                "repeat_timing", "torch_compile_baseline", "seed", "fallback", "namespace")


# what a worker measured beside the verdict, kept for benchmarks (verify_batch's `timings`)
TIMING_DIAGNOSTICS = ("candidate_s", "timing_cv", "timing_trials", "timing_method", "hidden_us",
                      "repeat_medians_us", "repeat_cv", "tolerance", "worker_pid",
                      "spin_us", "host_us", "uncovered_trials", "discarded_trials", "clock_mhz",
                      "worker_device", "phase_s", "construct")


def execute(item: Item, backend: Backend, opts: VerifyOptions, baselines: Baselines,
             runner: SandboxRunner | GpuRunner) -> None:
    """Run the correctness and performance stages for one candidate on one execution slot."""
    v = item.verdict
    job_options = {k: getattr(opts, k) for k in JOB_OPTIONS}
    # timed in a process that never ran candidate code, before this candidate runs
    base = baselines.ensure(item.req.task_source, runner, job_options)
    item.provisional_base = bool(base.get(BESIDE_COMPILES))
    job = {"nonce": secrets.token_hex(16), "backend": backend.name,
           "input_seed": trial_input_seed(),  # every model of the run built on the device
           "options": {**job_options, "construct": DEVICE}}
    variants = request_variants(item.req, opts)
    job["variants"] = variants
    with baselines.turn():  # never beside a baseline's timing (verifier.run.baselines)
        # settled timing, hang deadlines
        out, job = run_constructed(item, runner, job, Pace.of(base, backend.name))
    nonce = job["nonce"]
    item.timing["exec_s"] = out.wall_s
    item.timing["exec_end"] = time.monotonic()  # run order (builds land in any order)
    p = out.payload
    if out.does_not_fit:  # the task's footprint, before the candidate ran
        return item.stop("does_not_fit", "correctness", out.does_not_fit)
    for key in TIMING_DIAGNOSTICS:  # for benchmarks (verify_batch's `timings`)
        if p and p.get(key) is not None and worker_fields.diagnostic(key, p[key]):
            item.timing[key] = p[key]
    stage = out.stage
    if out.flood:
        return item.stop("runtime_error", stage, "the candidate flooded stdout/stderr (over "
                         f"{FLOOD_BYTES >> 20} MB); output is capped and the run was ended")
    if out.timed_out:
        return item.stop("timeout", stage, f"{stage} stage {out.failure}")
    if p is None:
        return item.stop("runtime_error", stage, out.failure)
    if p.get("nonce") != nonce:
        v.findings.append({"rule": "forged_result", "message": "the result was not written by "
                           "the harness", "line": None, "severity": "error"})
        return item.stop("cheat", stage, "the candidate wrote the harness's result")
    record_measurements(v, p, out.own_share)
    outcome = p.get("outcome")
    if outcome != "ok":
        if outcome == "task_error":
            return item.stop("runtime_error", p.get("stage", stage),
                             "task error (not the candidate's): " + p.get("error", ""))
        return item.stop(outcome if outcome in ("runtime_error", "incorrect", "cheat")
                         else "runtime_error", p.get("stage", stage), p.get("error", ""))
    if out.rechecked:  # the worker's "ok" is not believed: the parent compares the outputs
        verdict, why = parent_check(out, item.req.task_source, opts, job, variants, p)
        item.timing["referee_s"] = out.referee_s  # the benchmarks' profile
        if verdict == "cheat":
            v.findings.append({"rule": "parent_check", "message": why, "line": None,
                               "severity": "error"})
        if verdict != "ok":
            return item.stop(verdict, "correctness", why)
    record_generalisation(v, variants, p.get("variants_checked"))
    item.timing["judge_clock"] = (out.clock or {}).get("figures")
    item.timing["referee_s"] = out.referee_s
    status, why = judge_performance(v, opts, out.clock, base, runner.peaks(),
                                    item.req.flops, item.req.bytes_moved)
    item.stop(status, "done" if status.startswith("correct") else "performance", why)


def run_constructed(item: Item, runner: SandboxRunner | GpuRunner, job: dict[str, Any],
                    pace: Pace | None) -> tuple[Any, dict[str, Any]]:
    """(the run's outcome, its job): a run whose reference or candidate cannot be built under
    the device context but can on the host (`verifier.judge.construct`) is made again with
    both built the KernelBench way, and the verdict says so (never one of each)."""
    out = runner.run(item, job, pace)
    item.timing["spans"] = dict(out.spans)  # the benchmarks' profile (`verifier.run.spans`)
    p = out.payload
    why = out.host_only or (str(p.get("error", "")) if p and p.get("nonce") == job["nonce"]
                            and p.get("outcome") == HOST_ONLY else "")
    if not why or job["options"].get("construct") != DEVICE:
        return out, job
    job = {**job, "nonce": secrets.token_hex(16),
           "options": {**job["options"], "construct": HOST}}
    first_s = out.wall_s
    out = runner.run(item, job, pace)
    out.wall_s += first_s
    item.verdict.findings.append(construct_finding(why, job["backend"]))
    item.timing["construct"] = HOST  # for benchmarks (verify_batch's `timings`)
    return out, job


def record_measurements(v: VerdictData, p: dict[str, Any], own_share: Any = None) -> None:
    """Copy what the worker measured onto the verdict (also for failed candidates);
    `own_share`: the share as the worker sent it when measured (`RunOutcome.own_share`)."""
    device = p.get("device")
    v.device = device[:200] if isinstance(device, str) else v.device
    v.trials = worker_fields.count(p.get("trials")) or 0
    for k in ("max_abs_diff", "mean_abs_diff", "mismatch_frac"):
        if worker_fields.number(p.get(k)) is not None:
            setattr(v, k, float(p[k]))
    # the candidate's process: kept in the shapes the verifier reads (`verifier.judge.worker_fields`)
    v.findings.extend(worker_fields.findings(p.get("findings")))
    v.kernel_names = worker_fields.kernel_names(p.get("kernel_names"))
    # measured by the profiler on CUDA (`verifier.checks.fallback.judge_kernels`) and sent to
    # the parent before the candidate's code ran again: the result's own `own_share` is the
    # candidate's to write during its timed calls (test_redteam_round10, share_forged)
    record_share(v, worker_fields.share(own_share), worker_fields.count(p.get("own_calls")))


def front_stages(item: Item, policy: str = "strict", namespace: str = "isolated") -> None:
    """extract and static (Python) in the caller."""
    try:
        item.code = extract_code(item.req.response)
        tree = check_candidate(item.code, item.req.task_source)
    except FormatError as exc:
        return item.stop("format_error", "extract", str(exc))
    findings = apply_policy(check_python(tree, item.req.task_source, namespace), policy)
    item.verdict.findings = findings
    if errors(findings):
        return item.stop("static_reject", "static", "; ".join(
            f"{f['rule']}: {f['message']}" for f in errors(findings)[:3]))
    if "load_inline" not in item.code and "cpp_extension" not in item.code:
        return item.stop("static_reject", "static",
                         "no load_inline call: the candidate has no kernel of its own")
    return None


def cpp_stage(item: Item, opts: VerifyOptions) -> None:
    """The C++ static checks on the candidate's extension specs (after they are known)."""
    if not item.specs:
        item.stop("static_reject", "static", "no load_inline call ran: the candidate has no "
                                             "kernel of its own")
        return
    cpp_findings = apply_policy(check_cpp(item.specs, item.code, item.req.task_source),
                                opts.fallback)
    item.verdict.findings = item.verdict.findings + cpp_findings
    if errors(cpp_findings):
        item.stop("static_reject", "static", "; ".join(
            f"{f['rule']}: {f['message']}" for f in errors(cpp_findings)[:3]))
