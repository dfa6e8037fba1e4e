"""The dataset card of a version, written with huggingface_hub's DatasetCard / DatasetCardData.

The YAML metadata carries what the Hub and `datasets` read: the licenses of the rows, size and
task categories, and `configs` (data_files) and `dataset_info` (features, rows and bytes per split,
from the written Parquet) written by `datasets`' own MetadataConfigs / DatasetInfosDict, so
`datasets` and the Hub read them without a warning. The body states how each metric is defined (pipeline.datasets.stats
METRIC_DEFINITIONS, the one place), the device, backend, torch and verifier versions the
measurements come from, and a usage snippet with the real repo id.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

from pipeline.datasets.card_facts import card_lines
from pipeline.datasets.stats import format_value, metric_definition

if TYPE_CHECKING:  # `datasets` and huggingface_hub load only when a card is written (CLI start-up)
    from datasets.info import DatasetInfosDict
    from huggingface_hub import DatasetCardData

BACKEND_TAGS = {"cuda": ["cuda", "gpu-kernels"], "musa": ["musa", "gpu-kernels"],
                "cpu": ["cpp", "cpu-kernels", "openmp"]}
BACKEND_WORDS = {"cuda": "CUDA kernels compiled with nvcc and checked on an NVIDIA GPU",
                 "musa": "MUSA kernels compiled and checked on a Moore Threads GPU",
                 "cpu": "C++ (OpenMP) kernels compiled with the host compiler and checked on "
                        "the CPU"}


def backend_tags(backends: list[str]) -> list[str]:
    """Card tags naming the backends that made and checked the kernels, nothing else."""
    tags = ["code", "kernelbench", "synthetic"]
    for b in backends:
        tags += [t for t in BACKEND_TAGS.get(b, [b]) if t not in tags]
    return tags


def backend_sentence(backends: list[str]) -> str:
    """One sentence saying which backend made and checked the version's kernels."""
    if not backends:
        return "No kernel rows in this version."
    return ("Kernels in this version: " + "; ".join(BACKEND_WORDS.get(b, b) for b in backends)
            + ". The `backend` column of every row names the one that made and checked it.")

CONFIG_DESCRIPTIONS = {
    "tasks": "KernelBench-style tasks (reference `Model`, inputs, shapes, FLOPs/bytes, "
             "provenance).",
    "sft": "Supervised fine-tuning: per task, the fastest verified teacher kernel among its "
           "strategy variants, kept only when measured at least `select.min_speedup` times "
           "faster than eager (the config in `manifest.json`; the verifier's fastest timing "
           "window of each) and never contradicted by a second timing of the same program "
           "(those are publish rejections `timing_not_repeated`); reward, speedup, runtime, eager "
           "runtime and timing spread are columns.",
    "rft": "Rejection fine-tuning: selected verified model responses with reward, speedup and "
           "the statistics of their sample group.",
    "rl": "Prompt-only rows with the reference source and input shapes for online RL rewards; "
          "all-failed groups appear as feedback-conditioned repair prompts.",
    "repair": "Multi-turn repair: attempt, verifier feedback, fix; per-turn rewards and statuses.",
    "preference": "Preference pairs (`kind`): `speed` pairs two correct kernels of one task "
                  "whose timings differ by at least 1.2x across their spreads; `correctness` "
                  "pairs a correct kernel with an incorrect one (a task has no more of these "
                  "than speed pairs, at least one). The chosen side is correct and "
                  "measured at least `select.min_speedup` times faster than eager; both sides' "
                  "numbers are columns.",
    "review": "Code review: a kernel with an injected bug; the answer names the bug, its line "
              "and the fix.",
    "perf_analysis": "Performance analysis: one row per distinct verified kernel, with its "
                     "measured times and FLOP/byte figures; the answer explains the bottleneck "
                     "and the next optimization from those figures and the kernel's code.",
}

# The Hub's size_categories buckets, by total rows.
_SIZES = [(1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"),
          (1_000_000, "100K<n<1M"), (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M")]


def size_category(rows: int) -> str:
    """The Hub size category of a dataset with `rows` rows."""
    for bound, name in _SIZES:
        if rows < bound:
            return name
    return "n>1T" if rows > 10**12 else "100M<n<1B"


def hub_license(spdx: str) -> str:
    """The Hub's license id for an SPDX id (the Hub uses lower-case SPDX ids)."""
    return spdx.lower() if spdx else "unknown"


def _split_files(folder: Path, config: str, split: str) -> list[Path]:
    return sorted((folder / config).glob(f"{split}-*.parquet"))


def dataset_infos(folder: Path, manifest: dict[str, Any]) -> DatasetInfosDict:
    """Each config's DatasetInfo from its written Parquet: features, rows and sizes per split."""
    from datasets import DatasetInfo, Features, SplitDict, SplitInfo
    from datasets.info import DatasetInfosDict

    infos = {}
    for config in manifest["configs"]:
        splits, features, download = SplitDict(), None, 0
        for split in manifest["counts"][config]:
            files = _split_files(folder, config, split)
            if not files:
                raise FileNotFoundError(f"{folder / config}: no {split}-*.parquet to describe")
            metas = [pq.ParquetFile(f).metadata for f in files]
            if features is None:
                features = Features.from_arrow_schema(pq.read_schema(files[0]))
            splits.add(SplitInfo(name=split, num_examples=sum(m.num_rows for m in metas),
                                 num_bytes=sum(m.row_group(i).total_byte_size for m in metas
                                               for i in range(m.num_row_groups))))
            download += sum(f.stat().st_size for f in files)
        infos[config] = DatasetInfo(features=features, splits=splits, config_name=config,
                                    download_size=download,
                                    dataset_size=sum(s.num_bytes for s in splits.values()))
    return DatasetInfosDict(infos)


def add_data_metadata(data: DatasetCardData, folder: Path, manifest: dict[str, Any]) -> None:
    """`configs` (data_files, sft the default) and `dataset_info`, written by `datasets` itself."""
    from datasets.utils.metadata import MetadataConfigs

    MetadataConfigs({c: {"data_files": [{"split": s, "path": f"{c}/{s}-*.parquet"}
                                        for s in manifest["counts"][c]],
                         **({"default": True} if c == "sft" else {})}
                     for c in manifest["configs"]}).to_dataset_card_data(data)
    dataset_infos(folder, manifest).to_dataset_card_data(data)
    order = {c: i for i, c in enumerate(manifest["configs"])}  # datasets sorts by name
    for field in ("configs", "dataset_info"):
        if isinstance(data.get(field), list):
            data[field] = sorted(data[field], key=lambda entry: order[entry["config_name"]])


def render_card(name: str, version: str, manifest: dict[str, Any],
                stats: dict[str, Any] | None, repo_id: str | None, local_path: str,
                folder: Path | None = None) -> str:
    """The card's text (YAML front matter + Markdown), checked by DatasetCard's parser.

    `folder` holds the version's Parquet files (default: `local_path`), described in the
    metadata.
    """
    from huggingface_hub import DatasetCard, DatasetCardData

    licenses = manifest.get("licenses", {})
    total = sum(sum(c.values()) for c in manifest["counts"].values())
    lin = manifest["lineage"]
    backends = lin.get("backends", [])
    data = DatasetCardData(
        license=sorted({hub_license(x) for x in licenses}) or ["unknown"],
        pretty_name=f"{name} {version}", tags=backend_tags(backends),
        task_categories=["text-generation"], size_categories=[size_category(total)])
    add_data_metadata(data, Path(folder or local_path), manifest)
    target = repo_id or local_path
    # torch.compile is named as a baseline only when this version timed it
    compiled = bool((stats or {}).get("metrics", {}).get("faster_than_compile_n"))
    lines = [f"# {name} {version}", "", backend_sentence(backends), "",
             "Verified training data for LLMs that write kernels, produced by kernelsynth: "
             "PyTorch modules become KernelBench-style tasks; template, LLM, mutation and "
             "repair generators write `ModelNew` kernels; the staged verifier (extract, static "
             "anti-cheat checks, compile, correctness on seeded inputs, timing against eager "
             + ("and torch.compile" if compiled else "PyTorch; torch.compile was not timed for "
                "this version") + ") keeps what is correct and measures what is faster; a "
             "diversity-preserving selection keeps up to k distinct kernels per task.", "",
             "## Usage", "", "```python", "from datasets import load_dataset", "",
             f'ds = load_dataset("{target}", name="sft")', "```", "",
             "## Subsets", "", "| config | train | validation | description |",
             "| --- | ---: | ---: | --- |"]
    for config in manifest["configs"]:
        c = manifest["counts"][config]
        lines.append(f"| `{config}` | {c.get('train', 0)} | {c.get('validation', 0)} | "
                     f"{CONFIG_DESCRIPTIONS.get(config, '')} |")
    if manifest.get("empty_configs"):
        lines += ["", "Empty in this version (left out so every listed subset loads): "
                  + ", ".join(f"`{c}`" for c in manifest["empty_configs"]) + "."]
    lines += ["", "Splits are made per dedup cluster, so no near-duplicate task appears in both "
              "train and validation.", "", "## Licenses", "",
              "Every row carries `license` (SPDX), `repo_url`, `commit` and `path` of the code "
              "its task came from, or `source_generator` for generated sources (seed corpus, "
              "NNSmith). Rows per license:", "", "| license | tasks | rows (all configs) |",
              "| --- | ---: | ---: |"]
    for lic, per in sorted(licenses.items()):
        lines.append(f"| {lic} | {per.get('tasks', 0)} | {sum(per.values())} |")
    excluded = manifest.get("excluded_licenses", {})
    if excluded:
        lines += ["", "Left out by `publish.licenses` (tasks): "
                  + ", ".join(f"{k} ({v})" for k, v in sorted(excluded.items())) + "."]
    lines += ["", "## Measurements", "",
              f"- device: {', '.join(lin.get('devices', [])) or 'n/a'}",
              f"- backend: {', '.join(lin.get('backends', [])) or 'n/a'}",
              f"- torch: {lin.get('torch_version') or 'n/a'} (the publishing host's; the "
              "verifier version pins the measuring code)",
              f"- verifier version: {', '.join(lin.get('verifier_versions', [])) or 'n/a'}",
              "", "Runtimes and speedups are those measured on the device above.", ""]
    if stats:
        lines += ["## Statistics", "", "| stage | count |", "| --- | ---: |"]
        lines += [f"| {k} | {v} |" for k, v in stats.get("funnel", {}).items()]
        metrics = stats.get("metrics", {})
        gens = sorted((manifest.get("rft") or {}).get("generators", {}))
        if metrics and any(k.startswith(("pass@", "avg@", "fast_")) for k in metrics):
            lines += ["", "pass@k, avg@k and fast_p are over the sampled responses ("
                      + (", ".join(f"`{g}`" for g in gens) or "none kept in rft")
                      + "), never over template variants"
                      + ("; `import:demo` is a hand-written demo set, so these are not a "
                         "model's scores" if "import:demo" in gens else "") + "."]
        if metrics:
            lines += ["", "| metric | value | definition |", "| --- | ---: | --- |"]
            lines += [f"| {k} | {format_value(v)} | {metric_definition(k)} |" for k, v in metrics.items()]
        lines.append("")
    lines += card_lines(manifest)
    lines += ["## How it was made", "",
              f"- parent version: {manifest['parent_version'] or 'none'}",
              f"- kernelsynth commit: {lin.get('code_commit') or 'n/a'}",
              f"- source repositories: {len(lin.get('source_commits', []))} (listed in "
              "`manifest.json`)",
              f"- content hash: `{manifest['content_hash']}`", "",
              "`manifest.json` lists every file with its SHA-256, the full configuration and the "
              "source commits.", ""]
    card = DatasetCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines))
    return str(card)
