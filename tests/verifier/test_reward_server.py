"""The HTTP reward service on loopback: batches, load, limits, timeout and clear 4xx errors."""

from __future__ import annotations

import json
import socket
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
from verifier.reward.server import RewardServer, RewardService, ServiceLimits

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import MARKDOWN, RELU_TASK, relu_ok  # noqa: E402

CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"
OPTS = VerifyOptions(backend="cpu", build_cache_dir=str(CACHE), trials=2, perf_trials=5,
                     perf_budget_s=0.5)
TORCH_RELU = relu_ok().replace("return ext.relu_fwd(x)", "return torch.relu(x)")
WRONG = "```python\n" + relu_ok().replace("in[i] > 0.f ? in[i] : 0.f", "in[i] > 0.f ? 0.f : in[i]") \
    + "```"  # compiles and runs, wrong output
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
    # exactly what OpenRLHF's remote_rm_fn posts; it reads response["rewards"]
    status, data = _post(server.url + "/get_reward", {
        "query": [prompt + MARKDOWN, prompt + WRONG, prompt + "I cannot."],
        "prompts": [prompt] * 3, "labels": [RELU_TASK] * 3})
    assert status == 200, data
    assert data["rewards"] == data["scores"]
    good, wrong, refusal = data["rewards"]
    assert 0.5 < good <= 1.0 and wrong == pytest.approx(0.2) and refusal == 0.0, data
    assert data["extra_logs"] == {"kernel_correct": [1.0, 0.0, 0.0]}


@pytest.mark.parametrize("isolate", [False, True])
def test_request_timeout_answers_504_and_frees_the_slot(isolate: bool) -> None:
    srv = _server(ServiceLimits(max_concurrency=1, timeout_s=30, isolate_batches=isolate))
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


def test_readme_names_the_verl_functions_that_exist() -> None:
    import verifier.reward.verl_reward as verl

    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    names = {line.split("custom_reward_function.name=")[1].split("`")[0]
             for line in readme.splitlines() if "custom_reward_function.name=" in line}
    assert names == {"compute_score", "compute_score_batch"}
    assert all(callable(getattr(verl, n)) for n in names)
    assert "verifier.reward.verl_reward" in readme and "KERNELSYNTH_REWARD_URL" in readme


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


def _strict(raw: bytes) -> dict:
    def no_constant(name: str) -> None:
        raise AssertionError(f"{name} in an answer is not JSON")
    return json.loads(raw, parse_constant=no_constant)


def test_numbers_backends_and_task_sources_are_checked(server: RewardServer) -> None:
    item = {"task_source": RELU_TASK, "response": "no code"}
    for raw in (b'{"timeout_s": NaN, "items": []}', b'{"timeout_s": Infinity, "items": []}',
                b'{"timeout_s": -Infinity, "items": []}'):
        status, data = _call(server.url + "/verify", raw, method="POST")
        assert status == 400 and "is not a number this service takes" in data["error"], raw
    for bad in (1e999, -1, 0, "10", True, [5], None):
        body = json.dumps({"timeout_s": bad, "items": [item]}).replace("Infinity", "1e999")
        status, data = _call(server.url + "/verify", body.encode(), method="POST")
        if bad is None:  # absent timeout: the server's own
            assert status == 200 and data["verdicts"][0]["status"] == "format_error"
            continue
        assert status == 400 and '"timeout_s" must be a' in data["error"], (bad, data)
    status, data = _post(server.url + "/verify", {"items": [{**item, "backend": "gpu"}]})
    assert status == 400 and "items[0]: unknown \"backend\" 'gpu'" in data["error"]
    status, data = _post(server.url + "/verify", {"items": [{**item, "candidate_id": 1.5}]})
    assert status == 400 and '"candidate_id" must be a string or an integer' in data["error"]
    no_inputs = RELU_TASK.split("def get_inputs")[0]
    status, data = _post(server.url + "/verify", {"items": [item, {**item,
                                                                    "task_source": no_inputs}]})
    assert status == 400, data
    assert data["error"].startswith("items[1]: the task source is not a KernelBench task file: "
                                    "it defines no get_inputs, get_init_inputs")
    status, data = _post(server.url + "/verify", {"items": [{**item, "task_source": "def f(:"}]})
    assert status == 400 and "does not parse as Python" in data["error"]
    status, data = _post(server.url + "/get_reward", {"query": ["x"], "prompts": [""],
                                                      "labels": ["print('hello')"]})
    assert status == 400 and data["error"].startswith("sample 0 (label): the task source is "
                                                      "not a KernelBench task file")
    assert _call(server.url + "/health")[1]["in_flight"] == 0


def test_answers_are_strict_json_with_components_as_an_object(server: RewardServer) -> None:
    req = urllib.request.Request(server.url + "/verify", method="POST", data=json.dumps(
        {"items": [{"task_source": RELU_TASK, "response": MARKDOWN, "task_id": "relu"}]}).encode())
    with urllib.request.urlopen(req, timeout=120) as resp:
        data = _strict(resp.read())
    verdict = data["verdicts"][0]
    assert verdict["status"] in ("correct_slow", "correct_fast"), verdict["error"]
    assert isinstance(verdict["reward_components"], dict) and verdict["reward_components"]
    assert all(isinstance(v, (int, float)) for v in verdict["reward_components"].values()
               if not isinstance(v, (str, bool, type(None))))
    assert isinstance(verdict["speedup"], float) and isinstance(verdict["runtime_us"], float)
    assert data["rewards"] == [verdict["reward"]] and 0.5 < verdict["reward"] <= 1.0


def _slow_body(url: str, announced: int = 1000) -> socket.socket:
    host, port = url.rsplit("/", 1)[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(b"POST /verify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n{\"items\":" % announced)  # 9 bytes of the body
    return sock


def _answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def test_forty_slow_bodies_do_not_exhaust_the_server() -> None:
    srv = _server(ServiceLimits(max_concurrency=1, timeout_s=60, read_timeout_s=3.0),
                  CountingVerify())
    slow = [_slow_body(srv.url) for _ in range(40)]
    try:
        time.sleep(0.5)  # every slow client is connected and waiting for its body
        t0 = time.monotonic()
        status, data = _post(srv.url + "/verify", {"items": [
            {"task_source": RELU_TASK, "response": "no code"}]}, timeout=10)
        assert status == 200 and data["verdicts"][0]["status"] == "format_error"
        assert time.monotonic() - t0 < 5
        for sock in slow:  # each is answered 408 once its read timeout passes, then closed
            answer = _answer(sock)
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
            assert b"body not received within 3 s (9 of 1000 bytes)" in answer
        assert time.monotonic() - t0 < 10
    finally:
        for sock in slow:
            sock.close()
        srv.shutdown()
        srv.server_close()


def test_connections_past_the_bound_get_503_and_slots_come_back() -> None:
    srv = _server(ServiceLimits(max_concurrency=1, timeout_s=60, read_timeout_s=2.0,
                                max_connections=4), CountingVerify())
    slow = [_slow_body(srv.url) for _ in range(4)]
    try:
        time.sleep(0.3)
        t0 = time.monotonic()
        status, data = _post(srv.url + "/verify", {"items": []}, timeout=10)
        assert status == 503 and "4 connections open" in data["error"]
        # answered at once, not queued behind the slow ones (2 s: their read timeout)
        assert time.monotonic() - t0 < 1.5
        time.sleep(2.5)  # the slow ones time out and free their connections
        status, data = _post(srv.url + "/verify", {"items": [
            {"task_source": RELU_TASK, "response": "no code"}]}, timeout=10)
        assert status == 200 and data["verdicts"][0]["status"] == "format_error"
    finally:
        for sock in slow:
            sock.close()
        srv.shutdown()
        srv.server_close()


def test_body_over_the_limit_is_413_before_it_is_read() -> None:
    srv = _server(ServiceLimits(max_body_bytes=1024), CountingVerify())
    try:
        sock = _slow_body(srv.url, announced=4096)  # announces 4 KiB, sends 9 bytes
        answer = _answer(sock)  # and closed: the unread body is never parsed as a request
        assert answer.startswith(b"HTTP/1.1 413 ") and b"over the limit of 1024" in answer
        assert answer.count(b"HTTP/1.1") == 1
        sock.close()
    finally:
        srv.shutdown()
        srv.server_close()


def test_abandoned_request_frees_its_slot() -> None:
    srv = _server(ServiceLimits(max_concurrency=1, timeout_s=300, isolate_batches=True))
    try:
        body = json.dumps({"timeout_s": 250, "items": [
            {"task_source": RELU_TASK, "response": SPINNING}]}).encode()
        host, port = srv.url.rsplit("/", 1)[1].split(":")
        sock = socket.create_connection((host, int(port)), timeout=30)
        sock.sendall(b"POST /verify HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))
        deadline = time.monotonic() + 60
        while _call(srv.url + "/health")[1]["in_flight"] == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _call(srv.url + "/health")[1]["in_flight"] == 1
        time.sleep(1.0)  # the batch is running (the candidate spins until its 250 s timeout)
        sock.close()  # the client gives up
        t0 = time.monotonic()
        while _call(srv.url + "/health")[1]["in_flight"] and time.monotonic() - t0 < 10:
            time.sleep(0.1)
        health = _call(srv.url + "/health")[1]
        assert health["in_flight"] == 0 and health["ended_early"] == 1
        assert time.monotonic() - t0 < 5
        status, data = _post(srv.url + "/verify", {"items": [
            {"task_source": RELU_TASK, "response": "no code"}]}, timeout=120)
        assert status == 200 and data["verdicts"][0]["status"] == "format_error"
    finally:
        srv.shutdown()
        srv.server_close()
