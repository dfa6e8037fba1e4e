"""The verifier as an online RL reward: TRL's `reward_funcs` contract over `verify_batch`.

    from trl import GRPOConfig, GRPOTrainer
    from verifier.reward.rl_reward import KernelReward
    from verifier.protocol import VerifyOptions

    reward = KernelReward(VerifyOptions(backend="cuda", workers=8))
    trainer = GRPOTrainer(model=..., reward_funcs=[reward], train_dataset=rl_split, ...)

TRL calls `reward(prompts=..., completions=..., completion_ids=..., **columns)` with every other
column of the dataset as a list, one value per completion. The kernelsynth `rl` config gives the
task in `reference` (the KernelBench source), `task_id` and `backend`; `task_source` is taken as
well for datasets of other origin. Completions are strings, or (conversational prompts) lists of
messages whose assistant content is the answer. All completions of a step are verified in one
batch; the reward is the verifier's hierarchical reward (verifier/judge/reward.py), so it is computed
by the parent from the verdict, never by the candidate's process. torch + stdlib only.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from verifier.protocol import (
    CORRECT_STATUSES,
    EXCLUDED_STATUSES,
    VerdictData,
    VerifyOptions,
    VerifyRequest,
)
from verifier.reward.requests import task_source_problem

REFERENCE_COLUMNS = ("reference", "task_source")


class RewardInputError(ValueError):
    """The batch TRL passed cannot be verified (a missing column, a malformed completion)."""


def completion_text(completion: Any, index: int = 0) -> str:
    """The answer text of one completion: a string, or the assistant content of a message list."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, Sequence):
        parts = []
        for msg in completion:
            if not isinstance(msg, dict) or "content" not in msg:
                raise RewardInputError(f"completion {index}: a message without 'content'")
            if msg.get("role", "assistant") != "assistant":
                continue
            content = msg["content"]
            if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}]
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            parts.append(str(content or ""))
        return "\n".join(parts)
    raise RewardInputError(f"completion {index}: expected a string or a list of messages, "
                           f"got {type(completion).__name__}")


def requests_for(completions: Sequence[Any], columns: dict[str, Any],
                 default_backend: str = "cpu") -> list[VerifyRequest]:
    """One VerifyRequest per completion from TRL's reward kwargs (the dataset's columns)."""
    refs = next((columns[c] for c in REFERENCE_COLUMNS if columns.get(c) is not None), None)
    if refs is None:
        raise RewardInputError("the reward needs the task source of every completion: give the "
                               f"dataset a {' or '.join(map(repr, REFERENCE_COLUMNS))} column "
                               "(the kernelsynth `rl` config has `reference`)")
    if len(refs) != len(completions):
        raise RewardInputError(f"{len(completions)} completions but {len(refs)} references")
    task_ids = columns.get("task_id") or [""] * len(completions)
    backends = columns.get("backend") or [default_backend] * len(completions)
    out = []
    for i, (completion, ref) in enumerate(zip(completions, refs, strict=True)):
        if not isinstance(ref, str) or not ref.strip():
            raise RewardInputError(f"completion {i}: empty reference (task source)")
        problem = task_source_problem(ref)
        if problem:  # a reward of a run that could not judge would mislead the policy
            raise RewardInputError(f"completion {i}: the reference {problem}")
        text = completion_text(completion, i)
        task_id = str(task_ids[i] or hashlib.sha256(ref.encode()).hexdigest()[:16])
        cid = f"{task_id}-{i}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
        out.append(VerifyRequest(cid, task_id, ref, text, str(backends[i] or default_backend)))
    return out


class KernelReward:
    """A TRL reward function (`reward_funcs=[KernelReward()]`) verifying a batch of kernels.

    `options.backend` other than "auto" overrides the rows' `backend` column (e.g. "cpu" to
    train against the CPU backend from rows built for cuda). `last_verdicts` keeps the verdicts
    of the latest call. When TRL passes `log_metric` / `log_extra`, the fraction of correct
    kernels is logged and each completion's status goes into the completions table.
    """

    def __init__(self, options: VerifyOptions | None = None,
                 verify: Callable[[list[VerifyRequest], VerifyOptions], list[VerdictData]]
                 | None = None, name: str = "kernel_reward"):
        self.options = options or VerifyOptions()
        self._verify = verify
        self.__name__ = name  # TRL names the reward's logged columns after it
        self.last_verdicts: list[VerdictData] = []

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any],
                 **kwargs: Any) -> list[float | None]:
        default = self.options.backend if self.options.backend != "auto" else "cpu"
        reqs = requests_for(completions, kwargs, default)
        if self.options.backend != "auto":
            for r in reqs:
                r.backend = self.options.backend
        verify = self._verify
        if verify is None:
            from verifier.api import verify_batch as verify
        verdicts = verify(reqs, self.options)
        self.last_verdicts = list(verdicts)
        log_metric, log_extra = kwargs.get("log_metric"), kwargs.get("log_extra")
        if callable(log_metric) and verdicts:
            counts = Counter(v.status for v in verdicts)
            log_metric(f"{self.__name__}/correct",
                       sum(counts[s] for s in CORRECT_STATUSES) / len(verdicts))
            log_metric(f"{self.__name__}/compiled", sum(
                1 for v in verdicts if v.stage in ("correctness", "performance", "done")
                or v.status == "compiled") / len(verdicts))
        if callable(log_extra):
            log_extra(f"{self.__name__}_status", [v.status for v in verdicts])
        # a task whose run cannot fit the device gives no reward (TRL skips None), not a 0
        return [None if v.status in EXCLUDED_STATUSES else float(v.reward) for v in verdicts]


def kernel_reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
                  ) -> list[float | None]:
    """The reward with default options (backend from each row): `reward_funcs=[kernel_reward]`."""
    return KernelReward()(prompts, completions, **kwargs)
