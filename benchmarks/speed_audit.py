"""The rows audit's checks of issue 31: rows that teach fast kernels, with numbers that hold.

- `numbers_by_name`: every sft, rft and perf_analysis row carries its verdict's reward (> 0),
  speedup, runtime and eager runtime; preference rows both sides', repair rows the final turn's.
- `sft_speed`: every sft answer is at least `select.min_speedup` (the version's config) faster
  than eager; `sft_rows`: the version has at least `--min-sft` of them (once per version, when
  given: the default build's target is 10).
- `chosen_speed`: every preference chosen side is at least `select.min_speedup` faster.
- `speed_pairs`: at least a third of the preference pairs are `speed` pairs (two correct
  kernels), each with a 1.2x margin across both spreads (once per version).
- `timing_repeats`: no sft answer or preference side is a program whose repeated timings on one
  device disagree beyond their spreads (`pairs.unstable_timings`), and no sft answer or chosen
  side was timed again (`retimed`, pipeline.datasets.retime) below `select.min_speedup`.
- `one_analysis_per_kernel`: perf_analysis has one row per distinct kernel (task, code).
- `advice_not_shared`: no perf_analysis advice text is repeated over more than a quarter of the
  rows (and more than two).
- `validation_split`: rft, preference and review each have validation rows when their rows come
  from two or more dedup clusters (once per config).
- `input_specs_shown`: every rl row's `input_specs` are the sizes of the reference its prompt
  shows (the CPU copy's on cpu rows).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from pipeline.datasets.pairs import MIN_SPEEDUP, normalise_code, unstable_timings
from pipeline.datasets.retime import retimings, timing_held
from pipeline.prompts import input_specs_for
from schemas import Candidate, Task, Verdict

SPEED_SHARE = 1 / 3
NUMBERS = ("reward", "speedup", "runtime_us", "eager_us")


def _code(content: str) -> str:
    text = content.strip()
    if text.startswith("```python\n") and text.endswith("```"):
        return text[len("```python\n"):-3].rstrip()
    return text


def check_speed(audit: Any, manifest: dict, rows: dict[str, list[dict]], tasks: list[dict],
                cands: list[Candidate], verdicts: dict[str, Verdict],
                min_sft: int | None = None) -> None:
    """Record every check above on one published version."""
    gate = float(manifest.get("config", {}).get("select", {}).get("min_speedup", 1.0))
    sft, pref = rows.get("sft", []), rows.get("preference", [])
    for config in ("sft", "rft", "perf_analysis"):
        for r in rows.get(config, []):
            missing = [f for f in NUMBERS if r.get(f) is None]
            ok = not missing and r["reward"] > 0
            audit.record("numbers_by_name", ok, f"{config} {r['row_id'][:12]}",
                         f"missing {missing} or reward {r.get('reward')}")
    for r in pref:
        missing = [f"{s}_{f}" for s in ("chosen",) for f in ("speedup", "runtime_us")
                   if r.get(f"{s}_{f}") is None]
        audit.record("numbers_by_name", not missing and r.get("kind") in ("speed", "correctness"),
                     f"preference {r['row_id'][:12]}", f"missing {missing} or kind {r.get('kind')}")
        audit.record("chosen_speed", (r.get("chosen_speedup") or 0) >= gate,
                     f"preference {r['row_id'][:12]}",
                     f"chosen side {r.get('chosen_speedup')}x < select.min_speedup {gate}")
    for r in rows.get("repair", []):
        audit.record("numbers_by_name", r.get("final_speedup") is not None
                     and r.get("final_reward", 0) > 0, f"repair {r['row_id'][:12]}",
                     "no final-turn speedup or reward")
    for r in sft:
        audit.record("sft_speed", (r.get("speedup") or 0) >= gate, f"sft {r['row_id'][:12]}",
                     f"{r.get('speedup')}x < select.min_speedup {gate}")
    if min_sft is not None:  # a size target, for the build it was set for (the default's: 10)
        audit.record("sft_rows", len(sft) >= min_sft, "sft", f"{len(sft)} rows < {min_sft}")
    audit.notes.append(f"sft: {len(sft)} rows, speedups "
                       + ", ".join(f"{r['speedup']:.2f}" for r in sorted(
                           sft, key=lambda r: r.get("speedup") or 0) if r.get("speedup")))
    speed = [r for r in pref if r.get("kind") == "speed"]
    margin = all(r["rejected_runtime_us"] - (r["rejected_runtime_iqr_us"] or 0) / 2
                 >= MIN_SPEEDUP * (r["chosen_runtime_us"] + (r["chosen_runtime_iqr_us"] or 0) / 2)
                 for r in speed)
    if pref:
        audit.record("speed_pairs", len(speed) >= SPEED_SHARE * len(pref) and margin,
                     "preference", f"{len(speed)} speed pairs of {len(pref)}, margins: {margin}")
    else:
        audit.skip("speed_pairs")
    _check_timings(audit, rows, cands, verdicts, gate)
    _check_analyses(audit, rows.get("perf_analysis", []))
    _check_splits(audit, rows, tasks)
    _check_specs(audit, rows.get("rl", []), tasks)


def _check_timings(audit: Any, rows: dict[str, list[dict]], cands: list[Candidate],
                   verdicts: dict[str, Verdict], gate: float) -> None:
    unstable = unstable_timings(cands, verdicts)
    bad_code = {(c.task_id, normalise_code(c.code)) for c in cands if c.candidate_id in unstable
                or (c.candidate_id in verdicts and not timing_held(verdicts[c.candidate_id],
                                                                    gate))}
    retimed = 0
    for r in rows.get("sft", []):
        v = verdicts.get(r["candidate_id"])
        audit.record("timing_repeats", r["candidate_id"] not in unstable,
                     f"sft {r['row_id'][:12]}", "its timing did not repeat within its spread")
        audit.record("timing_repeats", v is None or timing_held(v, gate),
                     f"sft {r['row_id'][:12]}", "timed again below select.min_speedup: "
                     + ", ".join(f"{x.get('speedup')}x" for x in retimings(v) if v))
        retimed += bool(v and retimings(v))
    audit.notes.append(f"sft answers timed twice (near the gate): {retimed} of "
                       f"{len(rows.get('sft', []))}")
    for r in rows.get("preference", []):
        sides = [(r["task_id"], normalise_code(_code(r[s][0]["content"])))
                 for s in ("chosen", "rejected")]
        # a correctness pair's rejected side is labelled by its failure, not by a timing
        used = sides if r.get("kind") == "speed" else sides[:1]
        audit.record("timing_repeats", not any(s in bad_code for s in used),
                     f"preference {r['row_id'][:12]}", "a side's timing did not repeat")


def _check_analyses(audit: Any, rows: list[dict]) -> None:
    kernels = Counter((r["task_id"], normalise_code(_code(
        r["messages"][1]["content"].split("```python\n")[-1].split("```")[0]))) for r in rows)
    for key, n in kernels.items():
        audit.record("one_analysis_per_kernel", n == 1, key[0][:12], f"{n} rows of one kernel")
    advice = Counter(r["messages"][-1]["content"].split("Next optimization:")[-1].strip()
                     for r in rows)
    for text, n in advice.items():
        audit.record("advice_not_shared", n <= 2 or n <= len(rows) / 4, text[:60],
                     f"the same advice in {n} of {len(rows)} rows")


def _check_splits(audit: Any, rows: dict[str, list[dict]], tasks: list[dict]) -> None:
    cluster = {t["task_id"]: t.get("dedup_cluster") or t["task_id"] for t in tasks}
    for config in ("rft", "preference", "review"):
        got = rows.get(config, [])
        if len({cluster.get(r["task_id"], r["task_id"]) for r in got}) < 2:
            audit.skip("validation_split")
            continue
        audit.record("validation_split", any(r["split"] == "validation" for r in got), config,
                     "no validation rows")


def _check_specs(audit: Any, rows: list[dict], tasks: list[dict]) -> None:
    by_id = {t["task_id"]: t for t in tasks}
    fields = set(Task.__dataclass_fields__)
    for r in rows:
        t = by_id.get(r["task_id"])
        if t is None:
            audit.skip("input_specs_shown")
            continue
        task = Task.from_dict({k: v for k, v in t.items() if k in fields})
        want = [(s.name, list(s.shape)) for s in input_specs_for(task, r["backend"])]
        got = [(s["name"], list(s["shape"])) for s in r["input_specs"]]
        audit.record("input_specs_shown", got == want, f"rl {r['row_id'][:12]}",
                     f"input_specs {got} but the prompt's reference has {want}")
