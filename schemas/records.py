"""The records that flow between stages (ARCHITECTURE.md, "Records")."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from schemas.base import Record


def content_hash(*parts: str, length: int = 20) -> str:
    """Stable hex id from text parts (NUL-separated so parts cannot run together)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()[:length]


# --- shared pieces ---------------------------------------------------------------------------


@dataclass
class Message:
    """One chat message (TRL conversational format)."""

    role: str
    content: str


@dataclass
class TensorSpec:
    """A tensor input or output: shape, dtype and, for inputs, how values are drawn."""

    name: str
    shape: list[int]
    dtype: str
    init: str = "randn"  # randn | rand | randint | ones | zeros | arange | given
    low: float | None = None
    high: float | None = None


@dataclass
class Finding:
    """One static or dynamic anti-cheat finding: the rule and where it fired."""

    rule: str
    message: str
    line: int | None = None
    severity: str = "error"  # error rejects the candidate; warning is recorded only; info: a
    # check it passed (`generalised`: the sizes and constructor values it was also correct at)


# --- stage records ----------------------------------------------------------------------------


@dataclass
class RawModule(Record):
    """One nn.Module class found in a source file, with provenance."""

    TABLE = "raw_modules"
    KEY = "module_id"
    SCHEMA_VERSION = 1

    module_id: str
    source_kind: str  # git | transformers | seed | nnsmith
    repo_url: str
    commit: str
    path: str
    license: str
    module_name: str
    code: str  # the whole source file, so extraction can take the class's dependency closure
    line_start: int = 0
    line_end: int = 0
    meta: str = "{}"  # JSON: e.g. nnsmith seed/ops, package version

    @classmethod
    def make_id(cls, source_kind: str, repo_url: str, commit: str, path: str, module_name: str,
                code: str) -> str:
        return content_hash(source_kind, repo_url, commit, path, module_name, code)


@dataclass
class Task(Record):
    """A KernelBench-style task: reference `Model`, `get_inputs`, `get_init_inputs`."""

    TABLE = "tasks"
    KEY = "task_id"
    SCHEMA_VERSION = 2  # 2: license, source_generator

    task_id: str  # content hash of the normalized source
    name: str
    source: str  # KernelBench file at GPU sizes, with shape annotations in forward
    cpu_source: str  # the same file with dims scaled down for CPU validation
    entry_point: str = "Model"
    init_inputs: str = "[]"  # JSON list of constructor arguments
    input_specs: list[TensorSpec] = field(default_factory=list)
    output_specs: list[TensorSpec] = field(default_factory=list)
    shape_annotations: str = ""  # the annotated forward, one line per statement
    op_inventory: list[str] = field(default_factory=list)  # e.g. ["aten.mm", "aten.relu"]
    op_families: list[str] = field(default_factory=list)  # e.g. ["matmul", "activation"]
    flops: float = 0.0
    bytes_moved: float = 0.0
    level: int = 1  # 1 single op, 2 fusion, 3 block/architecture
    reasoning: str = ""
    source_kind: str = ""
    module_id: str = ""
    repo_url: str = ""
    commit: str = ""
    path: str = ""
    original_name: str = ""
    dedup_cluster: str = ""
    decontamination: str = "clean"  # clean | ngram:<file> | opseq:<file>
    meta: str = "{}"
    license: str = ""  # SPDX id, from RawModule.license
    source_generator: str = ""  # seed/NNSmith: the generator (and seed) that wrote the source


@dataclass
class Candidate(Record):
    """A candidate kernel (`ModelNew`) for a task, with how it was produced."""

    TABLE = "candidates"
    KEY = "candidate_id"
    SCHEMA_VERSION = 1

    candidate_id: str  # hash of code + task_id + backend
    task_id: str
    backend: str  # cuda | musa | cpu
    generator: str  # template:<family>/<variant> | llm:<model> | mutate:<kind> | repair:<turn>
    code: str  # extracted Python source that defines ModelNew
    raw_response: str = ""
    prompt: list[Message] = field(default_factory=list)
    parent_id: str | None = None
    turn: int = 0
    meta: str = "{}"  # JSON: template params, mutation kind and fix, token usage, ...

    @classmethod
    def make_id(cls, task_id: str, backend: str, code: str) -> str:
        return content_hash(task_id, backend, code)

    def meta_dict(self) -> dict:
        """`meta` parsed; {} when it is not a JSON object (rows written by hand or older code)."""
        try:
            meta = json.loads(self.meta or "{}")
        except json.JSONDecodeError:
            return {}
        return meta if isinstance(meta, dict) else {}


@dataclass
class Verdict(Record):
    """What the verifier found for one candidate. Statuses: ARCHITECTURE.md."""

    TABLE = "verdicts"
    KEY = "candidate_id"
    SCHEMA_VERSION = 2  # 2: tolerance_policy

    candidate_id: str
    task_id: str
    status: str
    stage: str  # the stage reached: extract | static | compile | correctness | performance | done
    backend: str
    device: str = ""
    verifier_version: str = ""
    compile_log: str = ""
    error: str = ""
    trials: int = 0
    max_abs_diff: float | None = None
    mean_abs_diff: float | None = None
    mismatch_frac: float | None = None
    findings: list[Finding] = field(default_factory=list)
    kernel_names: list[str] = field(default_factory=list)
    runtime_us: float | None = None
    runtime_iqr_us: float | None = None
    eager_us: float | None = None
    compiled_us: float | None = None  # torch.compile baseline, where measured
    speedup: float | None = None  # vs eager
    speedup_compiled: float | None = None
    faster: bool = False
    reward: float = 0.0
    reward_components: str = "{}"  # JSON
    feedback: str = ""
    compile_s: float = 0.0
    wall_s: float = 0.0
    # the output tolerances judged at: "strict: fp32 atol=0.0001 rtol=0.0001, fp16/bf16 ..."
    # (not the worker's `tolerance` timing diagnostic, which says fp64_reference accepted it)
    tolerance_policy: str = ""


@dataclass
class Rejection(Record):
    """An input a stage dropped, and why (one line). Nothing is lost silently."""

    TABLE = "rejections"
    KEY = "rejection_id"
    SCHEMA_VERSION = 1

    rejection_id: str
    stage: str  # ingest | extract | curate | generate | verify | ...
    item_id: str  # module_id / task_id / candidate_id / repo url
    ref: str  # file path, row or URL a user can look up
    reason: str  # short machine-friendly reason class, e.g. "license", "timeout"
    detail: str = ""  # the one-line human message

    @classmethod
    def make(cls, stage: str, item_id: str, ref: str, reason: str, detail: str = "") -> Rejection:
        return cls(content_hash(stage, item_id, ref, reason), stage, item_id, ref, reason, detail)


# --- dataset rows (TRL conversational formats) -------------------------------------------------


@dataclass
class SftRow(Record):
    TABLE = "sft"
    KEY = "row_id"
    SCHEMA_VERSION = 3  # 2: provenance columns; 3: runtime, spread and eager columns

    row_id: str
    task_id: str
    candidate_id: str
    messages: list[Message]
    backend: str
    level: int
    split: str = "train"
    # provenance, copied from the task by pipeline.datasets.rows.build_datasets
    license: str = ""  # SPDX id of the source the task came from
    repo_url: str = ""
    commit: str = ""
    path: str = ""
    source_generator: str = ""  # for generated sources (seed corpus, NNSmith): what made them
    reward: float = 0.0
    speedup: float | None = None
    # the verdict's numbers, by name (pipeline.datasets.rows): a trainer filters by speed
    runtime_us: float | None = None
    runtime_iqr_us: float | None = None  # spread of the timing samples
    eager_us: float | None = None


@dataclass
class RftRow(Record):
    TABLE = "rft"
    KEY = "row_id"
    SCHEMA_VERSION = 3  # 2: provenance columns; 3: runtime, spread and eager columns

    row_id: str
    task_id: str
    candidate_id: str
    messages: list[Message]
    backend: str
    generator: str
    reward: float
    speedup: float | None
    group_size: int
    group_pass_rate: float
    group_mean_reward: float
    group_std_reward: float
    split: str = "train"
    # provenance, copied from the task by pipeline.datasets.rows.build_datasets
    license: str = ""  # SPDX id of the source the task came from
    repo_url: str = ""
    commit: str = ""
    path: str = ""
    source_generator: str = ""  # for generated sources (seed corpus, NNSmith): what made them
    # the verdict's numbers, by name (pipeline.datasets.rows): a trainer filters by speed
    runtime_us: float | None = None
    runtime_iqr_us: float | None = None  # spread of the timing samples
    eager_us: float | None = None


@dataclass
class RepairRow(Record):
    TABLE = "repair"
    KEY = "row_id"
    SCHEMA_VERSION = 3  # 2: provenance columns; 3: the final turn's numbers

    row_id: str
    task_id: str
    messages: list[Message]  # user task, assistant attempt, user feedback, assistant fix, ...
    turn_rewards: list[float]
    turn_statuses: list[str]
    backend: str
    final_status: str
    split: str = "train"
    # provenance, copied from the task by pipeline.datasets.rows.build_datasets
    license: str = ""  # SPDX id of the source the task came from
    repo_url: str = ""
    commit: str = ""
    path: str = ""
    source_generator: str = ""  # for generated sources (seed corpus, NNSmith): what made them
    # the final (correct) turn's verdict numbers, by name
    final_reward: float = 0.0
    final_speedup: float | None = None
    final_runtime_us: float | None = None
    final_runtime_iqr_us: float | None = None
    eager_us: float | None = None


@dataclass
class PreferenceRow(Record):
    TABLE = "preference"
    KEY = "row_id"
    SCHEMA_VERSION = 3  # 2: provenance columns; 3: both sides' numbers

    row_id: str
    task_id: str
    prompt: list[Message]
    chosen: list[Message]
    rejected: list[Message]
    chosen_reward: float
    rejected_reward: float
    chosen_status: str
    rejected_status: str
    split: str = "train"
    # provenance, copied from the task by pipeline.datasets.rows.build_datasets
    license: str = ""  # SPDX id of the source the task came from
    repo_url: str = ""
    commit: str = ""
    path: str = ""
    source_generator: str = ""  # for generated sources (seed corpus, NNSmith): what made them
    # both sides' verdict numbers, by name; `kind` says what the pair contrasts
    chosen_speedup: float | None = None
    rejected_speedup: float | None = None
    chosen_runtime_us: float | None = None
    rejected_runtime_us: float | None = None
    chosen_runtime_iqr_us: float | None = None
    rejected_runtime_iqr_us: float | None = None
    eager_us: float | None = None
    kind: str = ""  # speed (two correct kernels) | correctness (correct vs incorrect)


RECORD_TYPES: dict[str, type[Record]] = {
    cls.TABLE: cls
    for cls in (RawModule, Task, Candidate, Verdict, Rejection, SftRow, RftRow, RepairRow,
                PreferenceRow)
}

# The op-family vocabulary shared by curation (Task.op_families), templates and statistics.
OP_FAMILIES = (
    "elementwise", "activation", "broadcast", "reduction", "softmax", "norm", "matmul", "conv",
    "conv_transpose", "pooling", "attention", "loss", "scan", "embedding", "shape", "other",
)


# --- dataset rows added by the datasets stage (rl, review, perf_analysis) ----------------------


@dataclass
class RlRow(Record):
    """A prompt-only row for online RL: the reward comes from running the verifier on `task_id`."""

    TABLE = "rl"
    KEY = "row_id"
    SCHEMA_VERSION = 2  # 2: provenance columns

    row_id: str
    task_id: str
    prompt: list[Message]
    reference: str  # the KernelBench source the reward runs against
    input_specs: list[TensorSpec]
    backend: str
    level: int
    kind: str = "task"  # task | repair (an all-failed group, conditioned on verifier feedback)
    feedback: str = ""
    split: str = "train"
    # provenance, copied from the task by pipeline.datasets.rows.build_datasets
    license: str = ""  # SPDX id of the source the task came from
    repo_url: str = ""
    commit: str = ""
    path: str = ""
    source_generator: str = ""  # for generated sources (seed corpus, NNSmith): what made them


@dataclass
class ReviewRow(Record):
    """A kernel with an injected bug; the assistant names the bug, its line and the fix."""

    TABLE = "review"
    KEY = "row_id"
    SCHEMA_VERSION = 2  # 2: provenance columns

    row_id: str
    task_id: str
    candidate_id: str
    messages: list[Message]
    bug_kind: str
    bug_line: int | None
    backend: str
    observed_status: str  # what the verifier saw when it ran the buggy kernel
    split: str = "train"
    # provenance, copied from the task by pipeline.datasets.rows.build_datasets
    license: str = ""  # SPDX id of the source the task came from
    repo_url: str = ""
    commit: str = ""
    path: str = ""
    source_generator: str = ""  # for generated sources (seed corpus, NNSmith): what made them


@dataclass
class PerfAnalysisRow(Record):
    """A verified kernel with its measurements; the assistant explains the bottleneck."""

    TABLE = "perf_analysis"
    KEY = "row_id"
    SCHEMA_VERSION = 3  # 2: provenance columns; 3: reward and spread

    row_id: str
    task_id: str
    candidate_id: str
    messages: list[Message]
    backend: str
    device: str
    runtime_us: float
    eager_us: float | None
    speedup: float | None
    arithmetic_intensity: float | None  # FLOPs per byte moved
    bottleneck: str  # memory | compute | launch | unknown
    split: str = "train"
    # provenance, copied from the task by pipeline.datasets.rows.build_datasets
    license: str = ""  # SPDX id of the source the task came from
    repo_url: str = ""
    commit: str = ""
    path: str = ""
    source_generator: str = ""  # for generated sources (seed corpus, NNSmith): what made them
    reward: float = 0.0
    runtime_iqr_us: float | None = None


RECORD_TYPES.update({cls.TABLE: cls for cls in (RlRow, ReviewRow, PerfAnalysisRow)})

# The provenance columns every dataset row carries (copied from its task by the datasets stage).
PROVENANCE_FIELDS = ("license", "repo_url", "commit", "path", "source_generator")
