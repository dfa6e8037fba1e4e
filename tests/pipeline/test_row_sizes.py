"""One set of sizes per row: code, comments, prompt text and reasoning agree on every dimension.

Seed tasks go through the real task stage (probe, annotation, CPU scaling); for each backend the
reference a prompt shows is run on the meta device, and every shape it mentions in comments,
every shape and constructor argument in the prompt text and every shape in the template
answer's reasoning must be one that reference really has.
"""

from __future__ import annotations

import ast
import json
import re

import pytest

from pipeline.candidates.templates import template_candidates
from pipeline.config import GenerateConfig, TasksConfig
from pipeline.prompts import build_prompt, reference_for
from pipeline.tasks.annotate.shape_facts import facts
from pipeline.tasks.extract import extract_tasks
from pipeline.tasks.probe.pool import ProbePool
from schemas import RawModule
from sources.seed import SEED_DIR

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)

SEEDS = ("norm_layer_norm", "pooling_max_pool1d", "embedding_embedding_lookup",
         "conv_conv2d_relu_maxpool")


@pytest.fixture(scope="module")
def tasks() -> list:
    modules = []
    for name in SEEDS:
        code = (SEED_DIR / f"{name}.py").read_text(encoding="utf-8")
        path = f"seed/{name}.py"
        modules.append(RawModule(RawModule.make_id("seed", "", "", path, "Model", code), "seed",
                                 "", "", path, "MIT", "Model", code))
    with ProbePool(2) as pool:
        built, rejections = extract_tasks(modules, TasksConfig(workers=2, timeout_s=60.0),
                                          pool=pool)
    assert not rejections, rejections
    return built


def _facts(source: str) -> tuple[list, list, list, set[int]]:
    """(init args, input shapes, output shapes, every dim of every tensor) of a reference."""
    f = facts(source)
    return f["init"], f["inputs"], f["outputs"], set(f["dims"])


def _init_params(source: str) -> list[str]:
    model = next(c for c in ast.parse(source).body if isinstance(c, ast.ClassDef)
                 and c.name == "Model")
    init = next(f for f in model.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    return [a.arg for a in init.args.args[1:]]


def _lists(text: str) -> list[list[int]]:
    return [[int(d) for d in m.split(",")] for m in re.findall(r"\[(\d+(?:, \d+)*)\]", text)]


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_every_dimension_in_a_row_is_the_code_s(tasks, backend: str) -> None:
    for task in tasks:
        ref = reference_for(task, backend)
        init, in_shapes, out_shapes, dims = _facts(ref)
        label = f"{task.name} ({backend})"
        comments = "\n".join(re.findall(r"#[^\n]*", ref))
        sig = re.search(r"# inputs: (.*)", ref)
        if sig:
            assert _lists(sig.group(1)) == in_shapes, (label, sig.group(0), in_shapes)
        ret = re.search(r"# returns (.*)", ref)
        if ret:
            assert _lists(ret.group(1)) == out_shapes, (label, ret.group(0), out_shapes)
        for shape in _lists(comments):
            assert set(shape) <= dims, (label, "comment", shape, sorted(dims))
        user = build_prompt(task, backend, GenerateConfig())[1].content
        stated = re.search(r"Constructor arguments \(from `get_init_inputs\(\)`\): (.*)", user)
        assert stated, label
        named = re.findall(r"(\w+)=([^,=]+(?:, [^,=]+)*?)(?=, \w+=|$)", stated.group(1))
        values = [json.loads(v) for _, v in named] if named else (
            [] if stated.group(1) == "none" else json.loads(stated.group(1)))
        assert values == init, (label, stated.group(1), init)
        if init:  # named by the constructor parameter each binds to
            assert [n for n, _ in named] == _init_params(ref)[:len(init)], (label, stated)
        shown = [[int(d) for d in m.split(", ")] for m in
                 re.findall(r"of shape \((\d+(?:, \d+)*)\)", user)]
        assert shown in ([], in_shapes), (label, shown, in_shapes)
        for cand in template_candidates(task, backend, 1):
            text = cand.raw_response.split("```python")[0]
            # window geometry lists (kernel [1, 4], stride [1, 2]) are not tensor shapes
            text = re.sub(r"(kernel|stride|padding|dilation)=? ?\[[^\]]*\]", "", text)
            for shape in _lists(text):
                assert set(shape) <= dims | {1}, (label, "reasoning", shape, sorted(dims))
