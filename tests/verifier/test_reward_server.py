"""The HTTP reward service on loopback: batches, load, limits, timeout and clear 4xx errors."""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from verifier.api import verify_batch
from verifier.protocol import VerifyOptions
from verifier.reward_server import RewardServer, RewardService, ServiceLimits

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import MARKDOWN, RELU_TASK, relu_ok  # noqa: E402

CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"
OPTS = VerifyOptions(backend="cpu", build_cache_dir=str(CACHE), trials=2, perf_trials=5,
                     perf_budget_s=0.5)
TORCH_RELU = relu_ok().replace("return ext.relu_fwd(x)", "return torch.relu(x)")
# Its load_inline arguments are not literals, so the verifier runs the module to find them,
# and the module spins forever at import: only the run timeout ends it.
SPINNING = relu_ok().replace('cpp_source = r"""', 'n = 0\nwhile n >= 0:\n    n += 1\n'
                             'cpp_source = "".join([r"""', 1).replace(
    '"""\n\next = load_inline', '"""])\n\next = load_inline', 1)


class CountingVerify:
    """The real verify_batch, counting how many batches run at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.peak = self.calls = 0

    def __call__(self, reqs, opts):  # noqa: ANN001, ANN204
        with self.lock:
            self.now += 1
            self.calls += 1
            self.peak = max(self.peak, self.now)
        try:
            time.sleep(0.2)  # hold the slot long enough for the clients to overlap
            return verify_batch(reqs, opts)
        finally:
            with self.lock:
                self.now -= 1


def _server(limits: ServiceLimits, verify=None) -> RewardServer:  # noqa: ANN001
    server = RewardServer("127.0.0.1", 0, RewardService(OPTS, limits, verify))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def counting():
    return CountingVerify()


@pytest.fixture
def server(counting):
    srv = _server(ServiceLimits(max_concurrency=2, timeout_s=120, max_body_bytes=64 << 10,
                                max_items=8), counting)
    yield srv
    srv.shutdown()
    srv.server_close()


def _call(url: str, body: bytes | None = None, method: str | None = None,
          timeout: float = 120) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _post(url: str, data: object, timeout: float = 120) -> tuple[int, dict]:
    return _call(url, json.dumps(data).encode(), timeout=timeout)


def test_health(server: RewardServer) -> None:
    status, data = _call(server.url + "/health")
    assert status == 200
    assert data["status"] == "ok" and data["max_concurrency"] == 2 and data["in_flight"] == 0
    assert data["backend"] == "cpu" and data["verifier_version"]


def test_bad_requests_get_the_reason(server: RewardServer) -> None:
    status, data = _call(server.url + "/verify", b'{"items": [', method="POST")
    assert status == 400 and data["error"].startswith("invalid JSON: Expecting value at line 1")
    assert _post(server.url + "/verify", {"things": []}) == (
        400, {"error": 'body must be a JSON object with an "items" list'})
    status, data = _post(server.url + "/verify", {"items": [
        {"task_source": RELU_TASK, "response": "x"}, {"response": "x"}]})
    assert status == 400 and data["error"].startswith('items[1]: needs "task_source"')
    status, data = _post(server.url + "/verify", {"items": [], "timeout_s": -1})
    assert status == 400 and "timeout_s" in data["error"]
    status, data = _post(server.url + "/verify", {"items": [
        {"task_source": RELU_TASK, "response": "x"}] * 9})
    assert status == 413 and "at most 8 per request" in data["error"]
    status, data = _post(server.url + "/verify", {"items": [
        {"task_source": "x" * (70 << 10), "response": "x"}]})
    assert status == 413 and "over the limit of 65536" in data["error"]
    assert _call(server.url + "/nope")[0] == 404
    assert _call(server.url + "/verify")[0] == 405
    status, data = _post(server.url + "/get_reward", {"query": ["a"], "labels": "x"})
    assert status == 400 and '"query" and "labels" must be lists' in data["error"]
    assert _call(server.url + "/health")[1]["in_flight"] == 0


def test_concurrent_clients_get_their_own_verdicts(server: RewardServer,
                                                   counting: CountingVerify) -> None:
    def client(n: int) -> list[tuple[int, dict]]:
        answers = []
        for k in range(3):
            items = [{"task_source": RELU_TASK, "response": f"client {n} request {k}: no code",
                      "candidate_id": f"c{n}-{k}-a"},
                     {"task_source": RELU_TASK, "response": f"```python\n{TORCH_RELU}```",
                      "candidate_id": f"c{n}-{k}-b", "task_id": "relu"}]
            answers.append(_post(server.url + "/verify", {"items": items}))
        return answers

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(client, range(4)))
    for n, answers in enumerate(results):
        for k, (status, data) in enumerate(answers):
            assert status == 200, data
            assert [v["candidate_id"] for v in data["verdicts"]] == [f"c{n}-{k}-a",
                                                                     f"c{n}-{k}-b"]
            assert [v["status"] for v in data["verdicts"]] == ["format_error", "static_reject"]
            assert data["rewards"] == [0.0, 0.0]
            assert "torch_compute" in data["verdicts"][1]["feedback"]
    assert counting.calls == 12 and counting.peak == 2  # overlapped, never past the bound
    assert _call(server.url + "/health")[1]["in_flight"] == 0


def test_openrlhf_shape_scores_only_the_response(server: RewardServer) -> None:
    # The prompt shows the reference in a code block; only the response after it is judged.
    prompt = f"Optimize this model:\n```python\n{RELU_TASK}```\n"
    status, data = _post(server.url + "/get_reward", {
        "query": [prompt + MARKDOWN, prompt + "I cannot."], "prompts": [prompt, prompt],
        "labels": [RELU_TASK, RELU_TASK]})
    assert status == 200, data
    assert data["rewards"] == data["scores"]
    assert 0.5 < data["rewards"][0] <= 1.0 and data["rewards"][1] == 0.0


def test_request_timeout_answers_504_and_frees_the_slot() -> None:
    srv = _server(ServiceLimits(max_concurrency=1, timeout_s=30))
    try:
        t0 = time.monotonic()
        status, data = _post(srv.url + "/verify", {"timeout_s": 0.5, "items": [
            {"task_source": RELU_TASK, "response": SPINNING}]})
        assert status == 504 and "did not finish within 0.5 s" in data["error"]
        assert time.monotonic() - t0 < 10
        deadline = time.monotonic() + 60  # the batch's runs are bounded by the same timeout
        while _call(srv.url + "/health")[1]["in_flight"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _call(srv.url + "/health")[1]["in_flight"] == 0
        status, data = _post(srv.url + "/verify", {"items": [
            {"task_source": RELU_TASK, "response": "no code"}]})
        assert status == 200 and data["verdicts"][0]["status"] == "format_error"
    finally:
        srv.shutdown()
        srv.server_close()


def test_readme_verl_client_works_as_written(server: RewardServer) -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    block = readme.split("and in `kernel_reward.py`:\n\n```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(block, "README.md:kernel_reward.py", "exec"), namespace)  # noqa: S102
    namespace["URL"] = server.url + "/verify"
    scores = namespace["compute_score"](data_sources=["kernelsynth"] * 2,
                                        solution_strs=["no code", "still none"],
                                        ground_truths=[RELU_TASK] * 2, extra_infos=[None] * 2)
    assert scores == [0.0, 0.0]


@pytest.mark.parametrize("argv", [
    [sys.executable, "-m", "verifier", "serve", "--port", "0", "--backend", "cpu",
     "--max-concurrency", "3"],
    [str(Path(sys.executable).parent / "kernelsynth"), "serve-verifier", "--port", "0",
     "--backend", "cpu", "--max-concurrency", "3"],
])
def test_serve_commands_answer_on_loopback(argv: list[str], tmp_path: Path) -> None:
    import subprocess

    if "serve-verifier" in argv:
        argv = [*argv, "-w", str(tmp_path / "ws")]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        line = proc.stderr.readline()
        assert "kernelsynth reward service on http://127.0.0.1:" in line, line
        url = line.split(" on ", 1)[1].split()[0]
        status, data = _call(url + "/health", timeout=30)
        assert status == 200 and data["backend"] == "cpu" and data["max_concurrency"] == 3
        status, data = _post(url + "/verify", {"items": [
            {"task_source": RELU_TASK, "response": "no code"}]})
        assert status == 200 and data["verdicts"][0]["status"] == "format_error"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
