"""The installed transformers package as a source: provenance, seeded diverse sampling."""

from __future__ import annotations

import json
from importlib.metadata import version

from schemas import RawModule
from sources.transformers_src import TRANSFORMERS_REPO, iter_transformers_modules


def test_sample_is_seeded_diverse_and_has_provenance():
    first = list(iter_transformers_modules(6, seed=3))
    again = list(iter_transformers_modules(6, seed=3))
    other = list(iter_transformers_modules(6, seed=4))
    assert all(isinstance(m, RawModule) for m in first)
    assert [m.module_id for m in first] == [m.module_id for m in again]
    assert [m.module_id for m in first] != [m.module_id for m in other]
    folders = {json.loads(m.meta)["model_folder"] for m in first}
    assert len(folders) == 6  # round-robin over model folders
    for m in first:
        assert m.source_kind == "transformers" and m.repo_url == TRANSFORMERS_REPO
        assert m.commit == "v" + version("transformers") and m.license == "Apache-2.0"
        assert m.path.startswith("src/transformers/models/") and "/modeling_" in m.path
        assert m.code.splitlines()[m.line_start - 1].startswith(f"class {m.module_name}(")
        assert m.line_end > m.line_start


def test_model_filter_and_zero_sample():
    mods = list(iter_transformers_modules(4, models=["bert"], seed=0))
    assert len(mods) == 4
    assert all(m.path == "src/transformers/models/bert/modeling_bert.py" for m in mods)
    assert len({m.module_name for m in mods}) == 4
    assert list(iter_transformers_modules(0)) == []
