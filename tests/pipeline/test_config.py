"""Config: built-in defaults, YAML overrides, errors that name the file and field."""

from __future__ import annotations

import pytest
import yaml

from pipeline.config import ConfigError, dump_config, load_config


def test_defaults_and_override(tmp_path):
    assert load_config().verify.trials >= 5
    path = tmp_path / "ks.yaml"
    path.write_text("verify:\n  trials: 9\nsources:\n  nnsmith:\n    count: 3\n")
    cfg = load_config(path, workspace=tmp_path / "w")
    assert cfg.verify.trials == 9 and cfg.sources.nnsmith.count == 3
    assert cfg.workspace == str(tmp_path / "w")
    assert yaml.safe_load(dump_config(cfg))["verify"]["trials"] == 9


def test_errors_name_file_and_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("verify:\n  trials: many\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: verify.trials: .*integer"):
        load_config(path)
    path.write_text("verify:\n  trails: 3\n")
    with pytest.raises(ConfigError, match=r"verify.trails: Extra inputs are not permitted"):
        load_config(path)
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(path)
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")
