"""The messages kernel models are trained on: the task prompt (reference, shapes, backend, rules)
and the verifier-feedback turn of a repair chain. Generation, repair and the dataset rows all
read them here, so a row says exactly what a model was asked.

One system message (the role and the answer format) and one user message (the task). Both come
from templates that a config may replace (`GenerateConfig.system_prompt` / `user_template`); the
user template is filled with `str.format` using the placeholders listed in `PLACEHOLDERS`.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass

from pipeline.config import GenerateConfig
from schemas import Message, Task, TensorSpec, Verdict
from verifier import pyast


@dataclass(frozen=True)
class BackendWording:
    """How a prompt names one target backend and the way its kernels are built."""

    name: str
    device: str
    language: str
    build: str


BACKENDS: dict[str, BackendWording] = {
    "cuda": BackendWording(
        name="CUDA",
        device="an NVIDIA GPU (tensors on device 'cuda')",
        language="CUDA C++",
        build=("Build the kernels with `torch.utils.cpp_extension.load_inline(...)` at module "
               "level: `cuda_sources` holds the `__global__` kernels and their host launchers, "
               "`cpp_sources` the declarations, `functions=[...]` the bound names."),
    ),
    "musa": BackendWording(
        name="MUSA",
        device="a Moore Threads GPU through torch_musa (tensors on device 'musa')",
        language="MUSA C++ (the CUDA-like dialect: `__global__`, `threadIdx`, `blockIdx`, "
                 "`__syncthreads()`, `<<<grid, block>>>` launches)",
        build=("Build the kernels with `torch_musa.utils.musa_extension.load_inline(...)` at "
               "module level: `musa_sources` holds the `__global__` kernels and their host "
               "launchers (compiled by mcc as `.mu`), `cpp_sources` the declarations, "
               "`functions=[...]` the bound names. Use `musa*` runtime calls and MUSA headers "
               "(`musa_runtime.h`, `musa_fp16.h`), never `cuda*` ones."),
    ),
    "cpu": BackendWording(
        name="CPU",
        device="the host's processor cores (tensors on device 'cpu')",
        language="C++ (plain loops over `data_ptr<T>()`; OpenMP allowed)",
        build=("Build the kernels with `torch.utils.cpp_extension.load_inline(...)` at module "
               "level: `cpp_sources` holds the C++ functions, `functions=[...]` the bound names; "
               "for OpenMP pass `extra_cflags=[\"-O3\", \"-fopenmp\"]` and "
               "`extra_ldflags=[\"-fopenmp\"]`."),
    ),
}

PLACEHOLDERS = ("backend_name", "device", "language", "build", "reference", "inputs",
                "init_inputs", "requirements", "task_name")

DEFAULT_SYSTEM_PROMPT = (
    "You are an expert in high-performance {language} kernels for PyTorch. Given a PyTorch "
    "reference module, you write an equivalent module whose computation runs in custom kernels "
    "you write yourself. Think about the memory access pattern and parallel decomposition "
    "first, then reply with the complete Python file in a single ```python code block."
)

DEFAULT_USER_TEMPLATE = """\
Write {backend_name} kernels for {device} that replace the computation of this PyTorch \
reference (task `{task_name}`):

```python
{reference}
```

Inputs of `forward` (from `get_inputs()`):
{inputs}
Constructor arguments (from `get_init_inputs()`): {init_inputs}

Requirements:
{requirements}
"""


class PromptError(ValueError):
    """A prompt template is unusable; the message names the placeholder."""


def backend_wording(backend: str) -> BackendWording:
    """The wording for `backend` (cuda, musa or cpu); ValueError names an unknown one."""
    try:
        return BACKENDS[backend]
    except KeyError:
        raise ValueError(f"unknown backend {backend!r} (expected one of {sorted(BACKENDS)})"
                         ) from None


def reference_for(task: Task, backend: str) -> str:
    """The reference source a prompt shows: CPU-sized for cpu, ported for musa where possible."""
    if backend == "cpu":
        return task.cpu_source or task.source
    if backend == "musa":
        return musa_reference(task)
    return task.source


def musa_reference(task: Task) -> str:
    """The task source ported to MUSA by the verifier's port, or the CUDA source unchanged."""
    try:
        from verifier.backends.musa_port import (
            musa_task_variant,  # written by the MUSA port's owner
        )
    except ImportError:
        return task.source
    try:
        ported = musa_task_variant(task.source)
    except Exception:  # noqa: BLE001 - an unported reference is still a valid prompt
        return task.source
    return ported if isinstance(ported, str) and ported.strip() else task.source


def task_meta(task: Task) -> dict:
    """The task's `meta` JSON object ({} when it is empty or not an object)."""
    try:
        meta = json.loads(task.meta or "{}")
    except json.JSONDecodeError:
        return {}
    return meta if isinstance(meta, dict) else {}


def _scaled(task: Task, backend: str) -> bool:
    return bool(backend == "cpu" and task.cpu_source and task.cpu_source != task.source)


def input_specs_for(task: Task, backend: str) -> list[TensorSpec]:
    """The forward inputs at the sizes of the reference shown for `backend` (CPU: scaled)."""
    specs = list(task.input_specs)
    if not _scaled(task, backend):
        return specs
    cpu = task_meta(task).get("cpu_inputs") or []
    if len(cpu) != len(specs):
        return []
    out = []
    for spec, c in zip(specs, cpu, strict=True):
        shape = c.get("shape") if isinstance(c, dict) else None
        if not (isinstance(shape, list) and all(isinstance(d, int) for d in shape)):
            return []
        out.append(TensorSpec(name=spec.name, shape=shape, dtype=spec.dtype, init=spec.init,
                              low=spec.low, high=spec.high))
    return out


def init_inputs_for(task: Task, backend: str) -> object:
    """The constructor arguments of the reference shown for `backend` (CPU: the scaled file's)."""
    if _scaled(task, backend):
        cpu = task_meta(task).get("cpu_init_inputs")
        if cpu is not None:
            return cpu
    try:
        return json.loads(task.init_inputs or "[]")
    except json.JSONDecodeError:
        return task.init_inputs


def describe_init(source: str, init: object) -> str:
    """The constructor arguments by the `Model.__init__` parameter each binds to
    (`embed_dim=1024, num_heads=16`); the plain list when they cannot be matched."""
    if init == [] or init is None:
        return "none"
    try:
        tree = pyast.parse(source)
    except SyntaxError:
        return json.dumps(init)
    fn = next((f for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "Model"
               for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    if fn is None or not isinstance(init, list):
        return json.dumps(init)
    params = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args][1:]]
    if len(init) > len(params):
        return json.dumps(init)
    return ", ".join(f"{name}={json.dumps(value)}" for name, value in zip(params, init,
                                                                          strict=False))


def describe_inputs(task: Task, backend: str) -> str:
    """One bullet per forward input: name, shape, dtype, at the shown reference's sizes."""
    specs = input_specs_for(task, backend)
    if not specs:
        return "- see `get_inputs()` in the reference\n"
    lines = [f"- `{spec.name}`: " + _spec_text(spec, shape=True) for spec in specs]
    lines.append("- these are the reference's sizes for this check; compute sizes from the "
                 "tensors at run time rather than hard-coding them")
    return "\n".join(lines) + "\n"


def _spec_text(spec: TensorSpec, shape: bool) -> str:
    if spec.init == "none":
        return "None (an optional argument the task leaves unset)"
    if spec.init == "given" or (not spec.shape and spec.dtype in ("int", "float", "bool")):
        return f"{spec.dtype} scalar" if not spec.shape else f"{spec.dtype} {spec.shape}"
    text = f"tensor {spec.dtype}"
    if shape:
        text += f" of shape ({', '.join(str(d) for d in spec.shape)})"
    if spec.init not in ("randn", ""):
        bounds = "" if spec.low is None else f" in [{spec.low:g}, {spec.high:g})"
        text += f", values {spec.init}{bounds}"
    return text


REASONING_RULE = ("Before the code, explain your kernel design briefly: the parallel "
                  "decomposition, memory accesses and numerical care.")
CODE_ONLY_RULE = "Reply with the code block only."
# the repair generator's feedback turn ends with one of these (pipeline/candidates/repair.py)
EXPLAIN_FIX_RULE = "Say briefly what was wrong, then reply with the complete corrected Python file"
CODE_ONLY_FIX = "Reply with the complete corrected Python file alone"


def has_prose(answer: str) -> bool:
    """Whether an assistant answer says something besides its fenced code."""
    return bool(re.sub(r"```.*?```", "", answer, flags=re.S).strip())


def answer_format_problems(messages: list[Message]) -> list[str]:
    """Assistant turns that do not answer in the form their user turn asked for: prose before
    the code when it asked for an explanation, one code block alone when it asked for that."""
    problems, asked = [], ""
    for i, m in enumerate(messages):
        if m.role == "user":
            asked = m.content
            continue
        if m.role != "assistant":
            continue
        prose = has_prose(m.content)
        if (CODE_ONLY_RULE in asked or CODE_ONLY_FIX in asked) and prose:
            problems.append(f"turn {i}: asked for the code block only, answered with prose")
        if (REASONING_RULE in asked or EXPLAIN_FIX_RULE in asked) and not prose:
            problems.append(f"turn {i}: asked for an explanation, answered with bare code")
        asked = ""
    return problems


def requirements(backend: str, cfg: GenerateConfig, *, reasoning: bool) -> str:
    """The rules a candidate is verified against, as a numbered list."""
    w = backend_wording(backend)
    rules = [
        "Define `class ModelNew(nn.Module)` with the same constructor and `forward` signature "
        "as `Model`; create parameters in the same order as `Model` so seeded initialisation "
        "matches.",
        f"All computation in `forward` runs in your own {w.language} kernels. {w.build}",
        "No PyTorch/ATen compute fallback: `forward` may call only your extension functions "
        "and allocation/view/shape ops (`empty`, `empty_like`, `view`, `reshape`, "
        "`contiguous`, `size`); no `torch.*`/`F.*` math, no `at::`/`torch::` compute in C++.",
        "The code must compile and its outputs must match the reference numerically "
        "(fp32 within 1e-4, fp16/bf16 within 1e-2) for random inputs of the given shapes.",
        "Do not special-case inputs, cache results, touch timing, streams or threads, or "
        "lower the precision of the computation.",
    ]
    if cfg.performance_hint:
        rules.append(f"Performance: aim for at least {cfg.speedup_target:g}x the speed of the "
                     "eager PyTorch reference on this device.")
    rules.append(REASONING_RULE if reasoning else CODE_ONLY_RULE)
    return "\n".join(f"{i}. {r}" for i, r in enumerate(rules, 1))


def prompt_fields(task: Task, backend: str, cfg: GenerateConfig) -> dict[str, str]:
    """The values of every template placeholder for `task` on `backend`."""
    w = backend_wording(backend)
    init = init_inputs_for(task, backend)
    return {
        "backend_name": w.name,
        "device": w.device,
        "language": w.language,
        "build": w.build,
        "reference": reference_for(task, backend).strip("\n"),
        "inputs": describe_inputs(task, backend),
        "init_inputs": describe_init(reference_for(task, backend), init),
        "requirements": requirements(backend, cfg, reasoning=cfg.include_reasoning),
        "task_name": task.name or task.task_id,
    }


def _fill(template: str, fields: dict[str, str], which: str) -> str:
    try:
        return template.format(**fields)
    except KeyError as exc:
        raise PromptError(f"{which}: unknown placeholder {{{exc.args[0]}}} "
                          f"(known: {', '.join(PLACEHOLDERS)})") from None
    except (IndexError, ValueError) as exc:
        raise PromptError(f"{which}: malformed template ({exc}); escape braces as {{{{ }}}}"
                          ) from None


def build_prompt(task: Task, backend: str, cfg: GenerateConfig) -> list[Message]:
    """The chat messages (system, user) that ask for a `ModelNew` for `task` on `backend`."""
    fields = prompt_fields(task, backend, cfg)
    system = _fill(cfg.system_prompt or DEFAULT_SYSTEM_PROMPT, fields, "system_prompt")
    user = _fill(cfg.user_template or DEFAULT_USER_TEMPLATE, fields, "user_template")
    return [Message("system", system), Message("user", user)]


def fence(code: str, reasoning: str = "") -> str:
    """An assistant answer: optional reasoning text, then the code in one python block."""
    block = f"```python\n{code.rstrip()}\n```"
    return f"{reasoning.strip()}\n\n{block}" if reasoning.strip() else block


def feedback_turn(verdict: Verdict, explain: bool = True) -> str:
    """The user message that carries the verifier's findings into the next turn.

    `explain=False` asks for the file alone: a dataset row uses it when the answer that follows
    is bare code, so no row teaches ignoring a request to explain.
    """
    body = verdict.feedback.strip()
    if not body:
        detail = verdict.error.strip() or verdict.compile_log.strip()[-1500:]
        body = f"The verifier stopped at the {verdict.stage} stage." + (
            f"\n\n{detail}" if detail else "")
    return (f"Your kernel did not pass verification (status: {verdict.status}).\n\n{body}\n\n"
            f"{EXPLAIN_FIX_RULE if explain else CODE_ONLY_FIX} in one ```python code block.")
