"""An honest OpenMP C++ ReLU (16x1024, the lead's case in issue 28) verified end to end three
times on the cpu backend (a fresh baseline cache: timed once, then cached): runtime, eager,
speedup. Usage: nice -n 15 python benchmarks/eager_method_e2e.py CHECKOUT (with PYTHONPATH=CHECKOUT,
to compare a branch with main)."""

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, sys.argv[1] + "/tests/verifier")

from verifier_cases import RELU_TASK, relu_ok  # noqa: E402

import verifier  # noqa: E402
from verifier.api import verify_batch  # noqa: E402
from verifier.protocol import VerifyOptions, VerifyRequest  # noqa: E402

print(verifier.__file__)
tmp = Path(tempfile.mkdtemp())
opts = VerifyOptions(backend="cpu", workers=1, compile_workers=1, run_timeout_s=60.0, trials=3,
                     build_cache_dir=str(Path.home() / ".cache/kernelsynth-tests/verifier-builds"),
                     baseline_cache_dir=str(tmp / "bl"))
for k in range(3):
    (v,) = verify_batch([VerifyRequest(f"c{k}", "relu", RELU_TASK, relu_ok(), "cpu")], opts)
    print(v.status, "runtime", v.runtime_us, "eager", v.eager_us, "speedup", v.speedup, flush=True)
