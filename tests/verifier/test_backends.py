"""Backend registry and auto-selection."""

from __future__ import annotations

import pytest

from verifier.backends import BackendUnavailable, get_backend, select_backend


def test_auto_resolves_to_cpu_without_devices() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert select_backend("auto") in ("cpu", "musa")
    assert select_backend("cpu") == "cpu"


def test_unknown_backend_is_a_clear_error() -> None:
    with pytest.raises(BackendUnavailable, match="unknown backend 'tpu'"):
        select_backend("tpu")


def test_cpu_backend_interface() -> None:
    be = get_backend("cpu")
    assert be.device() == "cpu" and be.device_name().startswith("cpu:")
    assert any("torch/include" in f for f in be.host_flags())
    assert "-ltorch" in be.link_flags()
    calls: list[int] = []
    res = be.time_call(lambda n: sum(range(n)), lambda i: (calls.append(i) or 1000,), warmup=1,
                       min_trials=3, max_trials=5, budget_s=0.0)
    assert res.trials == 3 and all(t > 0 for t in res.samples_us) and res.median_us > 0
    assert calls == [-1, 0, 1, 2]  # fresh arguments for the warmup call and for every trial


def test_compilers_run_niced(tmp_path) -> None:
    """Compiler commands run at a lower priority than the execution worker (timing noise)."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from verifier.backends import niced, run_tool

    assert niced(["g++", "-c"], level=0) == ["g++", "-c"]
    cmd = niced(["g++", "-c"], level=7)
    assert cmd[1:] == ["-n", "7", "g++", "-c"] and cmd[0].endswith("nice")
    # the priority really applies to the child: it reports its own niceness
    probe = tmp_path / "nice.txt"
    log: list[str] = []
    # (the path as an argument: compilers see only the directories their arguments name)
    # (sh, not python3: a pyenv shim reaches into a home the compiler's sandbox hides)
    assert run_tool(["sh", "-c", 'nice > "$1"', "sh", str(probe)], log, timeout_s=30), log
    assert int(probe.read_text()) >= min(19, os.nice(0) + 1)
    assert log[0].startswith("$ sh -c")  # the log shows the command as given
    # host trees the arguments do not name are hidden from it
    hidden = Path(tempfile.mkdtemp()) / "secret.txt"  # not under tmp_path, which it names
    hidden.write_text("x")
    out = tmp_path / "seen.txt"
    script = f'if [ -e "{hidden}" ]; then echo True > "$1"; else echo False > "$1"; fi'
    assert run_tool(["sh", "-c", script, "sh", str(out)], [], timeout_s=30)
    assert out.read_text().strip() == "False"
    shutil.rmtree(hidden.parent)
