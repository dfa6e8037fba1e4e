"""The prompt builder: what a kernel model is asked, for each backend, and configurable wording."""

from __future__ import annotations

import pytest

from pipeline.candidates.response_code import extract_code
from pipeline.config import GenerateConfig
from pipeline.prompts import (
    PromptError,
    backend_wording,
    build_prompt,
    fence,
    musa_reference,
)
from schemas import Task, TensorSpec


def _task(source: str, cpu_source: str | None = None) -> Task:
    return Task(task_id="abc123", name="linear_relu", source=source,
                cpu_source=cpu_source if cpu_source is not None else source,
                init_inputs="[64, 32]",
                input_specs=[TensorSpec("x", [8, 64], "float32")])


def test_cuda_prompt_states_reference_shapes_and_rules(linear_task_source: str) -> None:
    msgs = build_prompt(_task(linear_task_source), "cuda", GenerateConfig())
    assert [m.role for m in msgs] == ["system", "user"]
    system, user = msgs[0].content, msgs[1].content
    assert "CUDA C++" in system and "```python" in system
    assert linear_task_source.strip() in user  # the reference, verbatim
    assert "`x`: tensor float32 of shape (8, 64)" in user
    assert "in_features=64, out_features=32" in user  # named by the parameter they bind to
    assert "class ModelNew(nn.Module)" in user
    assert "No PyTorch/ATen compute fallback" in user
    assert "must compile" in user and "match the reference numerically" in user
    assert "cuda_sources" in user
    assert "1.1x" in user  # the performance requirement
    assert "explain your kernel design" in user  # reasoning requested


def test_switches_drop_performance_and_reasoning(linear_task_source: str) -> None:
    cfg = GenerateConfig(performance_hint=False, include_reasoning=False)
    user = build_prompt(_task(linear_task_source), "cuda", cfg)[1].content
    assert "Performance:" not in user
    assert "explain your kernel design" not in user
    assert "code block only" in user


def test_cpu_prompt_uses_scaled_source_and_cpp_wording(linear_task_source: str) -> None:
    cpu_src = linear_task_source.replace("batch_size = 8", "batch_size = 2")
    user = build_prompt(_task(linear_task_source, cpu_src), "cpu", GenerateConfig())[1].content
    assert "batch_size = 2" in user and "batch_size = 8" not in user
    assert "CPU" in user and "OpenMP" in user and "cpp_sources" in user
    assert "shape (8, 64)" not in user  # the GPU shapes would contradict the scaled file
    assert "see `get_inputs()` in the reference" in user  # no CPU shapes recorded: none shown


def test_cpu_prompt_states_cpu_shapes_and_cpu_constructor_arguments(linear_task_source: str
                                                                     ) -> None:
    import json
    from dataclasses import replace

    cpu_src = linear_task_source.replace("in_features = 64", "in_features = 16")
    task = replace(_task(linear_task_source, cpu_src),
                   meta=json.dumps({"cpu_inputs": [{"name": "x", "shape": [8, 16]}],
                                    "cpu_init_inputs": [16, 32]}))
    user = build_prompt(task, "cpu", GenerateConfig())[1].content
    assert "shape (8, 16)" in user and "shape (8, 64)" not in user
    assert "in_features=16, out_features=32" in user and "in_features=64" not in user
    cuda = build_prompt(task, "cuda", GenerateConfig())[1].content
    assert "shape (8, 64)" in cuda and "in_features=64, out_features=32" in cuda


def test_musa_prompt_uses_musa_wording_and_ported_reference() -> None:
    source = (
        "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
        "    def forward(self, x):\n        return torch.relu(x)\n\n"
        "def get_inputs():\n    return [torch.randn(4, 4).cuda()]\n\n"
        "def get_init_inputs():\n    return []\n")
    msgs = build_prompt(_task(source), "musa", GenerateConfig())
    user = msgs[1].content
    assert "MUSA" in user and "Moore Threads" in user and "musa_sources" in user
    assert "MUSA" in msgs[0].content
    ported = musa_reference(_task(source))
    try:
        import verifier.backends.musa_port  # noqa: F401
    except ImportError:
        assert ported == source  # degrades to the CUDA reference
    else:
        assert ".cuda()" not in ported and "musa" in ported
    assert ported.strip() in user


def test_custom_templates_from_config(relu_task_source: str) -> None:
    cfg = GenerateConfig(system_prompt="You write {language}.",
                         user_template="Task {task_name} for {backend_name}:\n{reference}")
    msgs = build_prompt(_task(relu_task_source), "cpu", cfg)
    assert msgs[0].content.startswith("You write C++")
    assert msgs[1].content.startswith("Task linear_relu for CPU:\nimport torch")
    # braces inside the reference are data, not placeholders
    braced = relu_task_source.replace("return torch.relu(x)", "return {'y': x}['y']")
    assert "{'y': x}" in build_prompt(_task(braced), "cpu", cfg)[1].content


def test_bad_template_and_backend_are_named(relu_task_source: str) -> None:
    with pytest.raises(PromptError, match="unknown placeholder {nope}"):
        build_prompt(_task(relu_task_source), "cuda", GenerateConfig(user_template="{nope}"))
    with pytest.raises(ValueError, match="unknown backend 'rocm'"):
        backend_wording("rocm")


def test_fence_round_trips_through_extraction() -> None:
    code = "import torch\n\nclass ModelNew(torch.nn.Module):\n    pass\n"
    answer = fence(code, "I fuse the ops into one kernel.")
    assert answer.startswith("I fuse")
    assert extract_code(answer) == code
    two = "```python\nprint('draft')\n```\nbetter:\n" + fence(code)
    assert extract_code(two) == code  # the block that defines ModelNew wins
    assert extract_code("no code here") is None
