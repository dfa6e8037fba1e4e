"""Import existing model responses (JSONL or Parquet) as candidates: `generator = import:<model>`.

The file is what an offline batch run (vLLM's `LLM.generate` over the `rl` config's prompts)
writes: one row per response with `response`, `model`, and the task as `task_id`, `task_name`
(hand-written samples) or as the `prompt` it answered (a message list, a user message, or a
chat-templated string), optionally `backend`, `sample`, sampling parameters (`temperature`, `top_p`, `seed`, `max_tokens`) and token
counts (`prompt_tokens`, `completion_tokens`, `finish_reason`). A prompt is matched to a task by
the exact text of the prompt we would build for it, else after normalizing whitespace and case.
A row naming no known task, with an empty response or that is not JSON becomes a Rejection
whose detail names the file and the row.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.candidates.response_code import extract_code
from pipeline.config import GenerateConfig
from pipeline.prompts import build_prompt
from schemas import Candidate, Message, Rejection, Task

STAGE = "generate"
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "seed", "max_tokens", "n", "finish_reason")
USAGE_KEYS = ("prompt_tokens", "completion_tokens")
_SPACE = re.compile(r"\s+")


class SampleFileError(ValueError):
    """The sample file cannot be read at all; the message names the file."""


def _norm(text: str) -> str:
    return _SPACE.sub(" ", text).strip().lower()


def read_rows(path: Path) -> Iterator[tuple[int, dict[str, Any] | None, str]]:
    """(row number from 1, row or None, why not) for every row of a JSONL or Parquet file."""
    if not path.is_file():
        raise SampleFileError(f"{path}: no such file")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for bad files
            raise SampleFileError(f"{path}: not a Parquet file ({exc})") from None
        for i, row in enumerate(table.to_pylist(), 1):
            yield i, row, ""
        return
    with path.open(encoding="utf-8", errors="replace") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                yield i, None, f"not a JSON line ({exc.args[0][:80]})"
                continue
            yield (i, row, "") if isinstance(row, dict) else (i, None, "not a JSON object")


class PromptIndex:
    """Which task a prompt belongs to: exact text of our prompts, then normalized text."""

    def __init__(self, tasks: list[Task], backend: str, cfg: GenerateConfig):
        self.tasks = {t.task_id: t for t in tasks}
        names = Counter(t.name for t in tasks)
        self.by_name = {t.name: t.task_id for t in tasks if names[t.name] == 1}
        self.prompts = {t.task_id: build_prompt(t, backend, cfg) for t in tasks}
        self.exact: dict[str, str] = {}
        self.normal: dict[str, str] = {}
        self._templated: dict[str, str | None] = {}
        for tid, msgs in self.prompts.items():
            user = next((m.content for m in msgs if m.role == "user"), "")
            for key in (user, json.dumps([[m.role, m.content] for m in msgs])):
                self.exact.setdefault(key, tid)
            self.normal.setdefault(_norm(user), tid)

    def find(self, prompt: Any) -> str | None:
        """The task id of `prompt` (a string or a list of {role, content}), or None."""
        if isinstance(prompt, list):
            try:
                msgs = [(str(m["role"]), str(m["content"])) for m in prompt]
            except (TypeError, KeyError):
                return None
            user = next((c for r, c in msgs if r == "user"), "")
            hit = self.exact.get(json.dumps([list(m) for m in msgs])) or self.exact.get(user)
            return hit or self.normal.get(_norm(user))
        if not isinstance(prompt, str) or not prompt.strip():
            return None
        hit = self.exact.get(prompt) or self.normal.get(_norm(prompt))
        if hit:
            return hit
        if prompt not in self._templated:
            # a chat-templated string: our user message appears inside it (n samples of one
            # prompt share the search)
            text = _norm(prompt)
            found = {tid for key, tid in self.normal.items() if key and key in text}
            self._templated[prompt] = found.pop() if len(found) == 1 else None
        return self._templated[prompt]


def _candidate(row: dict[str, Any], task_id: str, backend: str, prompt: list[Message],
               where: str) -> Candidate:
    response = str(row["response"])
    model = str(row.get("model") or "unknown").strip() or "unknown"
    code = extract_code(response) or ""
    meta: dict[str, Any] = {"model": model, "source": where,
                            "sample": row.get("sample", row.get("index"))}
    meta.update({k: row[k] for k in SAMPLING_KEYS if row.get(k) is not None})
    usage = {k: int(row[k]) for k in USAGE_KEYS if isinstance(row.get(k), int | float)}
    if usage:
        meta["usage"] = usage
    if row.get("reasoning"):
        meta["reasoning"] = str(row["reasoning"])
    return Candidate(
        candidate_id=Candidate.make_id(task_id, backend, code or response), task_id=task_id,
        backend=backend, generator=f"import:{model}", code=code, raw_response=response,
        prompt=prompt, meta=json.dumps(meta, default=str))


def import_samples(path: Path, tasks: list[Task], backend: str, cfg: GenerateConfig
                   ) -> tuple[list[Candidate], list[Rejection]]:
    """Candidates from a sample file; unusable rows become rejections naming file and row."""
    index = PromptIndex(tasks, backend, cfg)
    out: dict[str, Candidate] = {}
    rejected: list[Rejection] = []

    def reject(i: int, reason: str, detail: str) -> None:
        where = f"{path.name}:{i}"
        rejected.append(Rejection.make(STAGE, f"{path}:{i}", where, reason,
                                       f"{path} row {i}: {detail}"))

    for i, row, why in read_rows(path):
        if row is None:
            reject(i, "bad_row", why)
            continue
        response = row.get("response")
        if not isinstance(response, str) or not response.strip():
            reject(i, "empty_response", "no `response` text")
            continue
        tid = row.get("task_id")
        if not tid and row.get("task_name"):
            tid = index.by_name.get(str(row["task_name"]))
            if tid is None:
                reject(i, "unknown_task", f"task_name {str(row['task_name'])[:60]!r} names "
                       "no single workspace task")
                continue
        if tid:
            if str(tid) not in index.tasks:
                reject(i, "unknown_task", f"task_id {str(tid)[:40]!r} is not a workspace task")
                continue
            tid = str(tid)
        else:
            tid = index.find(row.get("prompt"))
            if tid is None:
                reject(i, "unknown_prompt", "the prompt matches no workspace task"
                       if row.get("prompt") else "neither `task_id` nor `prompt`")
                continue
        row_backend = str(row.get("backend") or backend)
        prompt = (index.prompts[tid] if row_backend == backend
                  else build_prompt(index.tasks[tid], row_backend, cfg))
        cand = _candidate(row, tid, row_backend, prompt, f"{path.name}:{i}")
        out.setdefault(cand.candidate_id, cand)  # the same response twice is one candidate
    return list(out.values()), rejected


DEMO_SAMPLES = Path(__file__).parent / "demo_samples.jsonl"
DEMO = "demo"
_ELSEWHERE = ("unknown_task", "unknown_prompt")


def samples_path(cfg: GenerateConfig) -> Path | None:
    """The file the `import` generator reads: `import_file`, the demo set, or None (off).

    The demo set stands in for a model's samples only while no local model is configured."""
    if not cfg.import_file:
        return None
    if cfg.import_file == DEMO:
        return None if cfg.hf_model and "hf" in cfg.generators else DEMO_SAMPLES
    return Path(cfg.import_file)


def import_candidates(tasks: list[Task], cfg: GenerateConfig, backend: str, *, report: bool
                      ) -> tuple[list[Candidate], list[Rejection]]:
    """The `import` generator over `tasks`; `report=False` (a batch) returns no rejections.

    Rows of the demo set for tasks outside this workspace are not errors: the demo covers
    the default build's tasks, and a workspace may hold others."""
    path = samples_path(cfg)
    if path is None:
        return [], []
    made, rejected = import_samples(path, tasks, backend, cfg)
    if path == DEMO_SAMPLES:  # the demo's kernels are written for one backend each
        made = _demo_filter(made, backend)
    if not report:
        return made, []
    if path == DEMO_SAMPLES:
        rejected = [r for r in rejected if r.reason not in _ELSEWHERE]
    return made, rejected


def _demo_filter(made: list[Candidate], backend: str) -> list[Candidate]:
    return [c for c in made if c.backend == backend]
