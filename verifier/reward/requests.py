"""What the reward service accepts and answers: request checks and JSON-safe verdicts.

A request the service cannot judge is refused with a 400 naming the item and the problem, rather
than verified into a misleading reward: a task source that is not a KernelBench task file, a
number that is NaN, infinite, negative or not a number, a backend that does not exist.
"""

from __future__ import annotations

import ast
import json
import math
from typing import Any

from verifier.protocol import VerdictData, VerifyRequest
from verifier.pyast import parse

BACKENDS = ("auto", "cpu", "cuda", "musa")
TASK_NAMES = ("Model", "get_inputs", "get_init_inputs")  # what every KernelBench file defines
VERDICT_FIELDS = ("candidate_id", "task_id", "status", "stage", "reward", "reward_components",
                  "feedback", "speedup", "runtime_us", "error", "device")


class BadRequest(ValueError):
    """A request the service refuses; `status` is the HTTP code, the message the reason."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _reject_constant(name: str) -> Any:
    raise BadRequest(400, f"{name} is not a number this service takes (JSON has no NaN or "
                          "Infinity)")


def load_json(raw: bytes) -> Any:
    """The body as JSON, refusing NaN/Infinity; BadRequest(400) with the position otherwise."""
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except UnicodeDecodeError as exc:
        raise BadRequest(400, f"body is not UTF-8 JSON: {exc}") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(400, f"invalid JSON: {exc.msg} at line {exc.lineno} column "
                              f"{exc.colno}") from None
    except RecursionError:  # json's C scanner: arrays/objects nested past the recursion limit
        raise BadRequest(400, "invalid JSON: nested too deeply") from None
    except ValueError as exc:  # an integer past Python's int-string limit (4300 digits)
        raise BadRequest(400, f"invalid JSON: {str(exc)[:120]}") from None


def positive_number(value: Any, name: str) -> float:
    """`value` as a finite positive float, or BadRequest naming the field and what it got."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(400, f'"{name}" must be a positive number of seconds, got '
                              f"{type(value).__name__} {value!r:.40}")
    if not math.isfinite(value) or value <= 0:
        raise BadRequest(400, f'"{name}" must be a finite positive number, got {value!r}')
    return float(value)


def task_source_problem(source: str) -> str | None:
    """Why `source` is not a KernelBench task file (parses; Model, get_inputs, ...), or None."""
    try:  # the verifier writes it to files: a lone surrogate would fail there, as its own error
        source.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"is not UTF-8 text ({exc.reason} at character {exc.start})"
    try:
        tree = parse(source, "<task_source>")
    except (RecursionError, MemoryError):  # the parser's nesting limits
        return "does not parse as Python (it nests too deeply)"
    except (SyntaxError, ValueError) as exc:
        line = getattr(exc, "lineno", None)
        return f"does not parse as Python ({getattr(exc, 'msg', exc)}" + (
            f" at line {line})" if line else ")")
    defined: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            defined[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    defined[target.id] = node
    missing = [n for n in TASK_NAMES if n not in defined]
    if missing:
        return (f"is not a KernelBench task file: it defines no {', '.join(missing)} at module "
                f"level (a task file defines {', '.join(TASK_NAMES)}; send the `rl` row's "
                "`reference`)")
    model = defined["Model"]
    if isinstance(model, ast.ClassDef) and not any(
            isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == "forward"
            for f in model.body):
        return "is not a KernelBench task file: class Model has no forward method"
    return None


def _text(item: dict[str, Any], keys: tuple[str, ...], where: str) -> str:
    value = next((item[k] for k in keys if item.get(k) is not None), None)
    if not isinstance(value, str):
        named = " (or ".join(f'"{k}"' for k in keys) + ")" * (len(keys) - 1)
        raise BadRequest(400, f"{where}: needs {named}, a string")
    return value


def _identifier(item: dict[str, Any], key: str, default: str, where: str) -> str:
    value = item.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise BadRequest(400, f'{where}: "{key}" must be a string or an integer, got '
                              f"{type(value).__name__}")
    return str(value)


def checked_request(item: Any, index: int, where: str) -> VerifyRequest:
    """One VerifyRequest from an item of /verify, or BadRequest naming the item and field."""
    if not isinstance(item, dict):
        raise BadRequest(400, f"{where}: expected an object")
    source = _text(item, ("task_source", "reference"), where)
    response = _text(item, ("response", "completion"), where)
    problem = task_source_problem(source)
    if problem:
        raise BadRequest(400, f"{where}: the task source {problem}")
    backend = item.get("backend") or "auto"
    if backend not in BACKENDS:
        raise BadRequest(400, f'{where}: unknown "backend" {backend!r}; use one of '
                              f"{', '.join(BACKENDS)}")
    return VerifyRequest(candidate_id=_identifier(item, "candidate_id", str(index), where),
                         task_id=_identifier(item, "task_id", "", where), task_source=source,
                         response=response, backend=backend)


def parse_items(payload: Any, max_items: int | None = None
                ) -> tuple[list[VerifyRequest], float | None]:
    """VerifyRequests from a /verify body and its timeout_s, or BadRequest naming the problem."""
    if not isinstance(payload, dict) or not isinstance(payload.get("items"), list):
        raise BadRequest(400, 'body must be a JSON object with an "items" list')
    _bounded(len(payload["items"]), max_items)
    timeout = payload.get("timeout_s")
    if timeout is not None:
        timeout = positive_number(timeout, "timeout_s")
    reqs = [checked_request(item, i, f"items[{i}]") for i, item in enumerate(payload["items"])]
    return reqs, timeout


def _bounded(n: int, max_items: int | None) -> None:
    """413 before any item is checked: each check parses a task source (holding the GIL), so
    a body of tens of thousands of small items stalled the whole server for seconds."""
    if max_items is not None and n > max_items:
        raise BadRequest(413, f"{n} items; this service takes at most {max_items} per request")


def parse_openrlhf(payload: Any, max_items: int | None = None) -> list[VerifyRequest]:
    """VerifyRequests from OpenRLHF's {"query", "prompts", "labels"} (labels: task sources)."""
    # The shape OpenRLHF's client sends: openrlhf/utils/remote_rm_utils.py (OpenRLHF/OpenRLHF,
    # commit 9b8641c1), remote_rm_fn(api_url, queries, prompts, labels, score_key="rewards")
    # requests.post(json={"query": queries, "prompts": prompts, "labels": labels}) and returns
    # response[score_key]; the answer's keys are in reward_server.openrlhf_answer.
    if not isinstance(payload, dict):
        raise BadRequest(400, "body must be a JSON object")
    queries, prompts, labels = (payload.get(k) for k in ("query", "prompts", "labels"))
    if not isinstance(queries, list) or not isinstance(labels, list):
        raise BadRequest(400, '"query" and "labels" must be lists (labels: the task sources; '
                              "OpenRLHF --label_key reference)")
    _bounded(len(queries), max_items)
    if prompts is None:
        prompts = [""] * len(queries)
    if not isinstance(prompts, list):
        raise BadRequest(400, '"prompts" must be a list (one prompt per query) when given')
    if not len(queries) == len(labels) == len(prompts):
        raise BadRequest(400, f"{len(queries)} queries, {len(prompts)} prompts, "
                              f"{len(labels)} labels: one each per sample")
    reqs = []
    for i, (q, p, label) in enumerate(zip(queries, prompts, labels, strict=True)):
        if not (isinstance(q, str) and isinstance(p, str) and isinstance(label, str)):
            raise BadRequest(400, f"sample {i}: query, prompt and label must be strings (label: "
                                  "the task source)")
        # The query repeats the prompt, whose code block is the reference: answer only.
        response = q[len(p):] if p and q.startswith(p) else q
        reqs.append(checked_request({"task_source": label, "response": response}, i,
                                    f"sample {i} (label)"))
    return reqs


def _finite(value: Any) -> Any:
    """JSON-safe: non-finite floats become null, so every number in an answer is a number."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def verdict_json(v: VerdictData) -> dict[str, Any]:
    """The answer's view of one verdict: reward_components as an object, numbers as numbers."""
    d = v.to_dict()
    out = {k: d[k] for k in VERDICT_FIELDS}
    try:
        components = json.loads(v.reward_components or "{}")
    except ValueError:  # a verdict's own field that is not JSON: keep it visible, as text
        components = {"unparsed": v.reward_components}
    out["reward_components"] = components if isinstance(components, dict) else {
        "value": components}
    return _finite(out)


def dumps(data: dict[str, Any]) -> bytes:
    """Strict JSON (no NaN/Infinity tokens) for an answer."""
    return json.dumps(_finite(data), allow_nan=False).encode()
