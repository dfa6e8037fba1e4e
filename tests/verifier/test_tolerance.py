"""--tolerance kernelbench|strict|ATOL,RTOL: parsing, options, config, and verdicts that record it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from schemas.records import Verdict
from verifier.__main__ import main as cli_main
from verifier.api import verify_batch
from verifier.protocol import CORRECT_STATUSES, VerifyOptions, VerifyRequest, parse_tolerance

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import RELU_LOOP, RELU_TASK, relu_candidate  # noqa: E402

CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"


def test_parse_tolerance() -> None:
    assert parse_tolerance("strict") is None
    assert parse_tolerance("kernelbench") == (1e-2, 1e-2)
    assert parse_tolerance("1e-3,2e-3") == (1e-3, 2e-3)
    for bad in ("loose", "1e-3", "1e-3,x", "1,2,3", "-1,0", "nan,1e-3", "inf,0"):
        with pytest.raises(ValueError, match="kernelbench, strict or ATOL,RTOL"):
            parse_tolerance(bad)


def test_options_map_the_policy_onto_the_tolerance_fields() -> None:
    strict = VerifyOptions()
    assert (strict.atol_fp32, strict.rtol_fp32, strict.atol_low, strict.rtol_low) == (
        1e-4, 1e-4, 1e-2, 1e-2)
    assert strict.tolerance_policy() == ("strict: fp32 atol=0.0001 rtol=0.0001, fp16/bf16 "
                                         "atol=0.01 rtol=0.01")
    kb = VerifyOptions(tolerance="kernelbench")
    assert (kb.atol_fp32, kb.rtol_fp32, kb.atol_low, kb.rtol_low) == (1e-2,) * 4
    custom = VerifyOptions(tolerance="2e-4,3e-4")
    assert (custom.atol_fp32, custom.rtol_fp32, custom.atol_low, custom.rtol_low) == (
        2e-4, 3e-4, 2e-4, 3e-4)
    assert VerifyOptions(atol_fp32=5e-4).atol_fp32 == 5e-4  # strict keeps explicit fields
    with pytest.raises(ValueError, match="'1e-3'"):
        VerifyOptions(tolerance="1e-3")


def test_cli_rejects_a_bad_tolerance(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli_main(["--task", "t.py", "--candidate", "c.py", "--tolerance", "loose"])
    assert exc.value.code == 2 and "not 'loose'" in capsys.readouterr().err


def test_config_passes_the_tolerance_through() -> None:
    from pipeline.config import VerifyConfig

    opts = VerifyOptions.from_mapping(VerifyConfig(tolerance="kernelbench").model_dump())
    assert opts.atol_fp32 == opts.rtol_fp32 == 1e-2
    with pytest.raises(ValueError, match="ATOL,RTOL"):
        VerifyConfig(tolerance="1e-3")


def test_verdicts_are_judged_at_and_record_the_tolerance() -> None:
    """A relu that is off by 1e-3 everywhere (a fast-math-sized error): incorrect at strict
    and at 1e-4,1e-4, correct at KernelBench's 1e-2; each verdict names its tolerances."""
    off = RELU_LOOP.format(fn="relu_fwd", pragma="").replace(
        "o[i] = in[i] > 0.f ? in[i] : 0.f;", "o[i] = (in[i] > 0.f ? in[i] : 0.f) + 1e-3f;")
    code = relu_candidate(off)
    got = {}
    for spec in ("strict", "kernelbench", "1e-4,1e-4"):
        opts = VerifyOptions(backend="cpu", build_cache_dir=str(CACHE), tolerance=spec,
                             trials=2, perf_trials=3, perf_warmup=1, perf_budget_s=0.3)
        (v,) = verify_batch([VerifyRequest(spec, "relu", RELU_TASK, code, "cpu")], opts)
        assert v.tolerance_policy == opts.tolerance_policy(), v.tolerance_policy
        assert Verdict.from_dict(v.to_dict()).tolerance_policy.startswith(spec + ": ")
        got[spec] = (v.status, v.error)
    assert got["strict"][0] == "incorrect" and "atol=0.0001" in got["strict"][1], got
    assert got["1e-4,1e-4"][0] == "incorrect", got
    assert got["kernelbench"][0] in CORRECT_STATUSES, got


def test_verdict_schema_has_the_policy_column() -> None:
    schema = Verdict.arrow_schema()
    assert "tolerance_policy" in schema.names and "tolerance" not in schema.names
    assert schema.metadata[b"kernelsynth.schema_version"] == b"2"


def test_the_standby_workers_flag_reaches_the_options() -> None:
    """`--standby-workers N`: N warm spares per GPU; 0 turns them off (`api._standbys`)."""
    from verifier.__main__ import _options, _parser
    from verifier.api import _standbys

    default = _options(_parser().parse_args([]))
    assert default.standby_worker and default.standby_workers == VerifyOptions.standby_workers
    eight = _options(_parser().parse_args(["--standby-workers", "8"]))
    assert _standbys(eight, "cuda") == 8 and _standbys(eight, "cpu") == 3
    none = _options(_parser().parse_args(["--standby-workers", "0"]))
    assert not none.standby_worker and _standbys(none, "cuda") == 0
