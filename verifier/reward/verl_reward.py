"""The verifier as verl's custom reward function (torch + stdlib only).

verl loads this file by path and calls a function of it by name:

    custom_reward_function.path=<site-packages or checkout>/verifier/reward/verl_reward.py
    custom_reward_function.name=compute_score          # reward_model.reward_manager=naive
    custom_reward_function.name=compute_score_batch    # reward_model.reward_manager=batch

with the rows' `reward_model.ground_truth` set to the kernelsynth `rl` row's `reference` (the
KernelBench task source). `solution_str` is the decoded response. `extra_info` may carry
`task_id` and `backend` (as the `rl` rows do). Both forms verify through the same batch
verifier as TRL's `KernelReward`: in this process (`verify_batch`) or, when the environment
variable KERNELSYNTH_REWARD_URL names a reward service (`http://HOST:8008`), through its
`POST /verify`, so the trainer's node needs neither a compiler nor a GPU. KERNELSYNTH_BACKEND
(cpu | cuda | musa | auto, default: each row's `backend`, else auto) picks the backend and
KERNELSYNTH_REWARD_TIMEOUT the seconds one batch may take (default 900).

The calls follow verl's own code (volcengine/verl, verl/trainer/ppo/reward.py
`get_custom_reward_fn`: spec_from_file_location("custom_module", path), then the named function
with reward_kwargs bound; NaiveRewardManager calls it per sample by keyword, BatchRewardManager
once with data_sources/solution_strs/ground_truths/extra_infos).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from verifier.protocol import VerifyOptions
from verifier.reward.rl_reward import RewardInputError, requests_for

URL_ENV, BACKEND_ENV, TIMEOUT_ENV = ("KERNELSYNTH_REWARD_URL", "KERNELSYNTH_BACKEND",
                                     "KERNELSYNTH_REWARD_TIMEOUT")


class RemoteRewardError(RuntimeError):
    """The reward service refused a batch or could not be reached (the message says which)."""


def _column(extra_infos: Sequence[Any] | None, key: str, n: int) -> list[Any]:
    infos = list(extra_infos) if extra_infos is not None else [None] * n
    return [info.get(key) if isinstance(info, dict) else None for info in infos]


def _settings() -> tuple[str | None, str, float]:
    """(service URL, backend, timeout) from the environment, checked (read at the call)."""
    backend = os.environ.get(BACKEND_ENV, "").strip() or "auto"
    if backend not in ("auto", "cpu", "cuda", "musa"):
        raise RewardInputError(f"{BACKEND_ENV}={backend!r}: use cpu, cuda, musa or auto")
    raw = os.environ.get(TIMEOUT_ENV, "900")
    try:
        timeout = float(raw)
    except ValueError:
        timeout = math.nan
    if not math.isfinite(timeout) or timeout <= 0:
        raise RewardInputError(f"{TIMEOUT_ENV}={raw!r}: a positive number of seconds")
    url = os.environ.get(URL_ENV, "").strip().rstrip("/") or None
    return url, backend, timeout


def options_from(kwargs: dict[str, Any]) -> VerifyOptions:
    """VerifyOptions with verl's `reward_kwargs` that name its fields (trials=2, ...), checked."""
    fields = {f.name: f for f in dataclasses.fields(VerifyOptions)}
    defaults = VerifyOptions()
    updates = {}
    for key, value in kwargs.items():
        if key not in fields or key == "backend":  # other reward_kwargs are not ours
            continue
        default = getattr(defaults, key)
        kind = (int, float) if isinstance(default, float) else (
            type(default) if default is not None else (str, int, float))
        if isinstance(value, bool) != isinstance(default, bool) or not isinstance(value, kind) \
                or (isinstance(value, float) and not math.isfinite(value)):
            raise RewardInputError(f"reward_kwargs {key}={value!r}: expected "
                                   f"{type(default).__name__} like the default {default!r}")
        updates[key] = value
    return dataclasses.replace(defaults, **updates)


def _post_verify(url: str, items: list[dict[str, Any]], timeout: float) -> list[float]:
    body = json.dumps({"items": items, "timeout_s": timeout}).encode()
    req = urllib.request.Request(f"{url}/verify", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout + 60) as resp:
            rewards = json.loads(resp.read())["rewards"]
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:500]
        raise RemoteRewardError(f"{url}/verify answered {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise RemoteRewardError(f"{url}/verify: {getattr(exc, 'reason', exc)}") from None
    if not isinstance(rewards, list) or len(rewards) != len(items):
        raise RemoteRewardError(f"{url}/verify: expected {len(items)} rewards, got {rewards!r:.200}")
    return [float(r) for r in rewards]


def compute_score_batch(data_sources: Sequence[Any], solution_strs: Sequence[str],
                        ground_truths: Sequence[str], extra_infos: Sequence[Any] | None = None,
                        **kwargs: Any) -> list[float]:
    """verl's batch reward manager form: one reward per response, all verified in one batch.

    `kwargs` (verl's `custom_reward_function.reward_kwargs`) may set VerifyOptions fields for
    in-process verification, e.g. `trials`, `perf_trials`, `build_cache_dir`.
    """
    n = len(solution_strs)
    opts = options_from(kwargs)
    if len(ground_truths) != n:
        raise RewardInputError(f"{n} responses but {len(ground_truths)} ground truths (the "
                               "rows' reward_model.ground_truth: the `rl` reference)")
    url, backend, timeout = _settings()
    row_backends = _column(extra_infos, "backend", n)
    columns = {"reference": list(ground_truths), "task_id": _column(extra_infos, "task_id", n),
               "backend": [backend if backend != "auto" else (b or "auto")
                           for b in row_backends]}
    reqs = requests_for(list(solution_strs), columns, default_backend="auto")
    if url is not None:
        return _post_verify(url, [{"task_source": r.task_source, "response": r.response,
                                   "task_id": r.task_id, "candidate_id": r.candidate_id,
                                   "backend": r.backend} for r in reqs], timeout)
    from verifier.api import verify_batch

    opts = dataclasses.replace(opts, run_timeout_s=min(opts.run_timeout_s, timeout))
    return [float(v.reward) for v in verify_batch(reqs, opts)]


def compute_score(data_source: Any, solution_str: str, ground_truth: str,
                  extra_info: Any = None, **kwargs: Any) -> float:
    """verl's per-sample form (naive reward manager): the reward of one response."""
    return compute_score_batch([data_source], [solution_str], [ground_truth], [extra_info],
                               **kwargs)[0]
