"""The `sources:` section of `kernelsynth.yaml`: where PyTorch code comes from and how much of it.

Owned by `sources/` so that it never imports `pipeline/`; `pipeline.config.Config` embeds it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NNSmithConfig(Section):
    count: int = 6
    seed: int = 0
    max_nodes: int = 5
    include_ops: list[str] = Field(default_factory=list)
    exclude_ops: list[str] = Field(default_factory=list)
    dtypes: list[str] = Field(default_factory=lambda: ["float32"])
    min_rank: int = 2
    max_rank: int = 4
    target_numel: int = 1 << 16  # graphs are scaled so the largest input has about this many


class SourcesConfig(Section):
    seed_corpus: bool = True
    # The default build samples so it finishes in ~10 min on 2 CPU cores; 0 takes all 120.
    seed_sample: int = 40  # seed files taken, spread over families (0: all)
    transformers_sample: int = 10  # modules sampled from the installed transformers (0: none)
    transformers_models: list[str] = Field(default_factory=list)  # empty: all model folders
    sample_seed: int = 0  # seeds the transformers sample
    nnsmith: NNSmithConfig = Field(default_factory=NNSmithConfig)
    manifest: str | None = None  # repo manifest YAML for git sources
    license_allowlist: list[str] = Field(default_factory=lambda: [
        "MIT", "Apache-2.0", "BSD-2-Clause", "BSD-3-Clause", "ISC", "Unlicense", "0BSD",
        "Zlib", "MPL-2.0", "CC0-1.0", "PSF-2.0", "BSL-1.0"])
    max_file_bytes: int = 1_000_000
    clone_timeout_s: float = 300.0
