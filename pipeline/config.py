"""The one configuration object (`kernelsynth.yaml`), validated by pydantic, defaults built in.

Each stage owns one section; code receives its section as an argument and never reads the
environment itself (secrets such as GITHUB_TOKEN / HF_TOKEN are read once, at the CLI edge).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any, Literal, get_type_hints

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
)

from sources.config import SourcesConfig  # sources owns its section
from verifier.protocol import NAMESPACES, VerifyOptions, parse_tolerance


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TasksConfig(Section):
    timeout_s: float = 20.0  # per module, for input inference and the reference run
    workers: int = 2
    target_gpu: str = "H100"
    gpu_min_ms: float = 1.0  # aim the GPU-size inputs at about this reference time
    cpu_max_numel: int = 1 << 18  # the scaled CPU copy keeps inputs at most this large
    near_dup_threshold: float = 0.85
    ngram: int = 5
    # `kernelbench` (the shipped fingerprint index, or one from `benchmarks fetch`), index .json
    # files or benchmark folders; [] turns decontamination off
    decontaminate_against: list[str] = Field(default_factory=lambda: ["kernelbench"])
    decontam_threshold: float = 0.6
    decontaminate_generic: Literal["keep", "reject"] = "keep"  # a match that is one generic op
    max_tasks: int | None = None
    gpu_max_gb: float = 4.0  # GPU-size inputs, weights and outputs stay below this
    probe_memory_mb: int = 6144  # address-space limit of each sandboxed probe worker
    repo_cache_dir: str | None = None  # git clones, for helpers in sibling files (the tasks stage sets)


class GenerateConfig(Section):
    generators: list[str] = Field(default_factory=lambda: ["template", "import"])
    backend: Literal["auto", "cuda", "musa", "cpu"] = "auto"
    variants_per_task: int = 3
    samples: int = 4  # LLM samples per task
    # responses for the `import` generator: a JSONL/Parquet file, or `demo` (the shipped demo
    # set, used by the default build when no local `hf` model is configured)
    import_file: str = "demo"
    openai_base_url: str = "http://127.0.0.1:8000/v1"
    openai_model: str = ""
    hf_model: str = ""
    temperature: float = 0.8
    top_p: float = 0.95
    max_tokens: int = 4096
    concurrency: int = 8
    request_timeout_s: float = 300.0
    retries: int = 4
    mutations_per_kernel: int = 1
    # rounds of mutate + verify: a kernel whose mutants all verified correct gets new kinds
    mutation_rounds: int = 2
    include_reasoning: bool = True
    performance_hint: bool = True
    # prompt templates (pipeline/prompts.py); None: the built-in wording. Placeholders in
    # user_template: {backend_name} {language} {reference} {inputs} {init_inputs} {requirements}
    system_prompt: str | None = None
    user_template: str | None = None
    speedup_target: float = 1.1  # the performance requirement stated when performance_hint
    openai_api_key_env: str = "OPENAI_API_KEY"  # read once at the CLI edge, never deep inside
    retry_backoff_s: float = 1.0  # first retry delay; doubles each retry (429/5xx/timeouts)
    hf_batch_size: int = 4
    hf_device: str = "auto"  # auto | cpu | cuda | musa
    hf_dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    mutation_kinds: list[str] = Field(default_factory=list)  # empty: every kind (mutate.py)
    seed: int = 0


def _verify_fields() -> dict[str, Any]:
    """The verifier's own options (`verifier.protocol.VerifyOptions`), in their order, plus the
    pipeline's: a checked backend name and how many verdicts go into one Parquet part."""
    hints = get_type_hints(VerifyOptions)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(VerifyOptions):
        if f.name in _VERIFIER_ONLY:
            continue
        if f.name == "seed":  # the part size sits before the seed, as it always has
            fields["write_batch"] = (int, 32)  # verdicts per part (a crash loses at most one)
        fields[f.name] = (hints[f.name], f.default)
    fields["backend"] = (Literal["auto", "cuda", "musa", "cpu"], "auto")
    fields["fallback"] = (Literal["strict", "partial"], fields["fallback"][1])  # checked early
    # dataset builds teach no kernel that hard-codes a size: the generalisation check is on
    fields["generalize"] = (bool, True)
    # kernelbench | strict | "ATOL,RTOL", and isolated | kernelbench: checked when loaded
    fields["tolerance"] = (Annotated[str, AfterValidator(_tolerance)], fields["tolerance"][1])
    fields["namespace"] = (Literal[NAMESPACES], fields["namespace"][1])  # type: ignore[valid-type]
    return fields


def _tolerance(spec: str) -> str:
    parse_tolerance(spec)  # ValueError names the bad spec; pydantic reports it with the field
    return spec


_VERIFIER_ONLY = frozenset({"repeat_timing"})  # benchmark knobs, not pipeline configuration

# `verify:`: every VerifyOptions field (defaults from the verifier, never copied here).
VerifyConfig = create_model("VerifyConfig", __base__=Section, **_verify_fields())


class RepairConfig(Section):
    turns: int = 2
    generator: str = "auto"  # auto: the known fix for mutations, else the configured LLM
    # Buffered Dynamic Retry: a task group whose every first attempt failed gets this many
    # feedback-conditioned samples from its best attempt (0: off)
    retry_samples: int = 4
    verify: bool = True  # verify each turn inside the repair step (pipeline/plan.py)


class SelectConfig(Section):
    k: int = 4
    diversity_weight: float = 0.5
    seed: int = 0
    method: Literal["diverse", "top_k", "random"] = "diverse"
    # a kernel taught as an answer (sft, rft's kept responses, preference's chosen side) is at
    # least this much faster than eager on the verifier's device; 0 lets any correct one through
    min_speedup: float = Field(default=1.0, ge=0.0)
    # a teacher kernel whose one timing is within [min_speedup, retime_below * min_speedup)
    # is verified again, and taught as >= min_speedup only when both timings say so
    # (pipeline.datasets.retime); 0 (or at most 1) re-times nothing
    retime_below: float = Field(default=1.5, ge=0.0)


class PublishConfig(Section):
    name: str = "kernelsynth"
    validation_fraction: float = 0.1
    hub_repo: str | None = None
    private: bool = True
    preference_pairs_per_task: int = 4
    shard_rows: int = 100_000  # rows per Parquet file of a split
    # SPDX ids a published row's source may carry (case-insensitive); rows of other licenses
    # are left out and recorded as publish rejections. The seed corpus and NNSmith graphs are
    # Apache-2.0 (kernelsynth's own license, sources/collect.py, sources/nnsmith_graphs.py).
    licenses: list[str] = Field(default_factory=lambda: [
        "MIT", "Apache-2.0", "BSD-2-Clause", "BSD-3-Clause", "ISC", "Unlicense", "0BSD", "Zlib",
        "CC0-1.0", "PSF-2.0", "BSL-1.0"])


class FlowsConfig(Section):
    runner: Literal["local", "ray"] = "local"
    ray_address: str | None = None  # None: start a local Ray instance
    batch_size: int = 32
    schedule_cron: str = "0 3 * * *"
    schedule_timezone: str = "UTC"
    deployment_name: str = "nightly"
    io_workers: int = 4  # threads for I/O-bound tasks (ingest, publish)
    cpu_pool: Literal["thread", "process"] = "thread"  # generate/repair batches (local runner)
    cpu_workers: int = 2
    verify_in_flight: int = 1  # batches verified at once locally (each uses verify.workers)
    ray_num_cpus: int | None = None  # a local Ray instance's CPUs (None: all)
    ray_num_gpus: int | None = None  # a local Ray instance's GPUs (None: detected)
    split_compile: bool = True  # GPU backends on Ray: compile on CPU tasks before GPU tasks
    always_publish: bool = False  # publish even when nothing changed since the latest version


class Config(Section):
    workspace: str = "./ks-data"
    sources: SourcesConfig = Field(default_factory=SourcesConfig)
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    generate: GenerateConfig = Field(default_factory=GenerateConfig)
    verify: VerifyConfig = Field(default_factory=VerifyConfig)
    repair: RepairConfig = Field(default_factory=RepairConfig)
    select: SelectConfig = Field(default_factory=SelectConfig)
    publish: PublishConfig = Field(default_factory=PublishConfig)
    flows: FlowsConfig = Field(default_factory=FlowsConfig)


class ConfigError(ValueError):
    """The config file cannot be read or does not validate; the message names file and field."""


DEFAULT_CONFIG_NAME = "kernelsynth.yaml"


def load_config(path: str | Path | None = None, workspace: str | Path | None = None) -> Config:
    """Load `path` (or ./kernelsynth.yaml when present), else the built-in defaults."""
    data: dict = {}
    if path is None and Path(DEFAULT_CONFIG_NAME).is_file():
        path = DEFAULT_CONFIG_NAME
    if path is not None:
        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise ConfigError(f"{p}: cannot read config ({exc})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: the top level must be a mapping")
    try:
        cfg = Config.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ConfigError(f"{path or 'defaults'}: {where}: {first['msg']}") from None
    if workspace is not None:
        cfg = cfg.model_copy(update={"workspace": str(workspace)})
    return cfg


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
