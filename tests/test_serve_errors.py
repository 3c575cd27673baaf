"""`rlvr serve` answers bad input with OpenAI's error object naming the field, never a crash or a hang: malformed
JSON, wrong types, n=0, max_tokens of 10^9, a 1 MB prompt, an unknown model, tool schemas that are not JSON
Schema, a client that disconnects (streamed or not), a full queue, a wrong API key; and SIGTERM with requests in
flight lets them finish or fail cleanly and releases the port (issue 65)."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from serving import ADD_TOOL, chat_model, chat_tokenizer, client, start

pytest.importorskip("fastapi")
pytest.importorskip("openai")

USER = [{"role": "user", "content": "hello"}]
LONG = {"max_tokens": 400, "ignore_eos": True}  # a request that decodes for a while


@pytest.fixture(scope="module")
def served():
    handle, engine, model, tokenizer, records = start(api_key=None)
    yield handle
    handle.stop()


def _post(handle, path, body=None, content=None, headers=None, timeout=60):
    return httpx.post(handle.url + path, json=body, content=content, timeout=timeout,
                      headers={"content-type": "application/json", **(headers or {})})


def _error(response, status, *words, param=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    for word in words:
        assert word in error["message"], error["message"]
    if param is not None:
        assert error["param"] == param
    assert "Traceback" not in response.text
    return error


def _until(condition, seconds=60.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


@pytest.mark.parametrize("body, words, param", [
    ({"messages": USER, "n": 0}, ["n:", "greater than or equal to 1"], "n"),
    ({"messages": USER, "temperature": "hot"}, ["temperature:"], "temperature"),
    ({"messages": "hello"}, ["messages:"], "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, ["messages.0.role"], "messages.0.role"),
    ({"messages": USER, "top_p": 0}, ["top_p:"], "top_p"),
    ({"messages": USER, "stop": [""]}, ["stop strings must be non-empty"], "stop"),
    ({"messages": USER, "presence_penalty": 0.5}, ["presence_penalty is not supported"], "presence_penalty"),
    ({"messages": USER, "n": 500}, ["n:"], "n"),
    ({"messages": USER, "n": 20}, ["n=20 is more choices than the server decodes at once"], "n"),
    ({"messages": USER, "response_format": {"type": "json_object"}}, ["response_format"], "response_format"),
])
def test_a_bad_field_answers_400_naming_it(served, body, words, param):
    _error(_post(served, "/v1/chat/completions", body), 400, *words, param=param)


def test_malformed_json_and_a_body_that_is_not_an_object(served):
    _error(_post(served, "/v1/chat/completions", content=b'{"messages": [}'), 400, "malformed JSON body")
    _error(_post(served, "/v1/completions", content=b"[1, 2]"), 400, "body")


def test_a_prompt_past_the_context_answers_maximum_context_length(served):
    _error(_post(served, "/v1/chat/completions", {"messages": USER, "max_tokens": 10**9}), 400,
           "maximum context length", param="max_tokens")
    megabyte = {"messages": [{"role": "user", "content": "x" * 2**20}], "max_tokens": 4}
    _error(_post(served, "/v1/chat/completions", megabyte), 400, "maximum context length")
    _error(_post(served, "/v1/completions", {"prompt": [5] * 2000, "max_tokens": 1}), 400,
           "maximum context length")
    _error(_post(served, "/inference/v1/generate", {"token_ids": [5] * 1030}), 400, "maximum context length")
    client_error = pytest.importorskip("openai").BadRequestError
    with pytest.raises(client_error, match="maximum context length"):
        client(served).chat.completions.create(model="tiny", messages=USER, max_tokens=10**9)


def test_unknown_model_route_token_and_schema(served):
    _error(_post(served, "/v1/chat/completions", {"model": "gpt-9", "messages": USER}), 404, "gpt-9", param="model")
    _error(_post(served, "/v1/nothing", {}), 404)
    _error(_post(served, "/inference/v1/generate", {"token_ids": [5, 10**6]}), 400, "not in the vocabulary",
           param="token_ids")
    _error(_post(served, "/detokenize", {"tokens": [-1]}), 400, "not in the vocabulary")
    not_a_schema = {**ADD_TOOL, "function": {**ADD_TOOL["function"], "parameters": {
        "type": "object", "properties": {"a": {"type": "integr"}}}}}
    _error(_post(served, "/v1/chat/completions", {"messages": USER, "tools": [not_a_schema]}), 400,
           "is not a JSON Schema", param="tools[0].function.parameters")
    not_an_object = {**ADD_TOOL, "function": {**ADD_TOOL["function"], "parameters": {"type": "string"}}}
    _error(_post(served, "/v1/chat/completions", {"messages": USER, "tools": [not_an_object]}), 400,
           "must describe an object")
    _error(_post(served, "/v1/chat/completions", {"messages": USER, "tools": [{"type": "function", "function": {
        "name": "add", "parameters": "a string"}}]}), 400, param="tools.0.function.parameters")


def test_a_client_that_disconnects_frees_its_rows(served):
    scheduler = served.scheduler
    aborted, completed = scheduler.stats["aborted"], scheduler.stats["completed"]
    with httpx.Client(timeout=60) as http:  # streamed: closed after the first chunks
        with http.stream("POST", served.url + "/v1/chat/completions",
                         json={"messages": USER, "stream": True, **LONG, "max_tokens": 900}) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
    _until(lambda: scheduler.stats["aborted"] == aborted + 1 and not scheduler.batch.rows)
    with served.paused():  # not streamed: the client gives up waiting while the engine holds (it cannot finish)
        with pytest.raises(httpx.ReadTimeout):
            _post(served, "/v1/completions", {"prompt": "abc", **LONG}, timeout=0.5)
        time.sleep(0.2)  # the server sees the connection close
    _until(lambda: not scheduler.batch.rows and not scheduler.waiting and not scheduler.active)
    assert scheduler.stats["completed"] == completed  # neither ran to its end
    answer = _post(served, "/v1/completions", {"prompt": "abc", "max_tokens": 3})  # and the server goes on
    assert answer.status_code == 200 and len(answer.json()["choices"][0]["text"]) > 0


def test_a_full_queue_answers_429_and_every_request_gets_an_answer():
    handle, *_ = start(max_rows=1, max_queue=2)
    try:
        codes, lock = [], threading.Lock()

        def ask():
            response = _post(handle, "/v1/completions", {"prompt": "abc", "max_tokens": 40, "ignore_eos": True})
            with lock:
                codes.append((response.status_code, response.json()))

        threads = [threading.Thread(target=ask) for _ in range(8)]
        with handle.paused():  # the engine takes nothing while the 8 arrive: two wait, six are refused
            for t in threads:
                t.start()
            _until(lambda: len(codes) == 6)
        for t in threads:
            t.join(120)
        assert len(codes) == 8 and sorted(c for c, _ in codes) == [200] * 2 + [429] * 6
        assert all("queue is full" in b["error"]["message"] for c, b in codes if c == 429)
        assert all(len(b["choices"][0]["text"]) > 0 for c, b in codes if c == 200)
        handle.state.draining = True  # what stop() sets first: requests still arriving are told so
        _error(_post(handle, "/v1/completions", {"prompt": "a", "max_tokens": 2}), 503, "shutting down")
    finally:
        handle.stop()


def test_the_trainer_can_end_an_episode_with_calls_in_flight():
    handle, engine, model, tokenizer, records = start()
    try:
        answers = []
        long = {"prompt": "abc", "max_tokens": 900, "ignore_eos": True}
        thread = threading.Thread(target=lambda: answers.append(
            _post(handle, "/episodes/slow/v1/completions", long)))
        thread.start()
        _until(lambda: handle.scheduler.batch.rows)
        assert handle.end_episode("slow") == 1
        thread.join(60)
        _error(answers[0], 409, "episode", param=None)
        assert records[-1].episode == "slow" and records[-1].samples[0].finish_reason == "abort"
        assert 0 < len(records[-1].samples[0].token_ids) < 900
        assert _post(handle, "/episodes/other/v1/completions", {"prompt": "a", "max_tokens": 2}).status_code == 200
    finally:
        handle.stop()


def test_a_request_whose_kv_cannot_fit_answers_400():
    handle, *_ = start(max_kv_mib=0.05)  # the tiny model's KV is 256 bytes a token: about 200 tokens
    try:
        _error(_post(handle, "/v1/completions", {"prompt": "abc", "max_tokens": 300}), 400, "MiB of KV cache",
               param="max_tokens")
        assert _post(handle, "/v1/completions", {"prompt": "abc", "max_tokens": 30}).status_code == 200
    finally:
        handle.stop()


def test_an_api_key_is_required_when_set_and_an_admit_hook_can_refuse():
    handle, *_ = start(api_key="sesame", admit=lambda call: "episode over" if call.episode == "done" else None)
    try:
        _error(httpx.get(handle.url + "/v1/models"), 401, "API key")
        auth = {"authorization": "Bearer sesame"}
        assert httpx.get(handle.url + "/v1/models", headers=auth).status_code == 200
        refused = _post(handle, "/episodes/done/v1/completions", {"prompt": "a", "max_tokens": 2}, headers=auth)
        _error(refused, 403, "episode over")
        assert _post(handle, "/episodes/live/v1/completions", {"prompt": "a", "max_tokens": 2},
                     headers=auth).status_code == 200
    finally:
        handle.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_lets_requests_in_flight_end_cleanly_and_releases_the_port(tmp_path):
    """`rlvr serve RUN_DIR` (a finished run's final/ model) in a subprocess; SIGTERM while requests decode."""
    from rlvr.core.checkpoint import save_final

    tokenizer = chat_tokenizer()
    run = tmp_path / "run"
    save_final(run, chat_model(tokenizer), tokenizer, {"steps": 1})
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    process = subprocess.Popen([sys.executable, "-m", "rlvr.cli", "serve", str(run), "--port", str(port),
                                "shutdown_timeout_s=120"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env)
    try:
        banner = next(line for line in process.stdout if "rlvr serve:" in line or process.poll() is not None)
        assert f":{port}/v1" in banner and "rlvr serve:" in banner, banner
        url = f"http://127.0.0.1:{port}"
        outcomes, progress, first = [], {}, threading.Semaphore(0)

        def stream(max_tokens):
            try:
                with httpx.stream("POST", url + "/v1/completions", timeout=60, json={
                        "prompt": "abc", "stream": True, "max_tokens": max_tokens, "ignore_eos": True}) as response:
                    lines = []
                    for line in response.iter_lines():
                        if line:
                            lines.append(line)
                            progress[max_tokens] = len(lines)
                            if len(lines) == 1:
                                first.release()
                    outcomes.append(("done" if lines[-1] == "data: [DONE]" else "cut", response.status_code))
            except httpx.HTTPError as err:
                outcomes.append(("failed", type(err).__name__))

        sizes = (150, 200, 250)
        threads = [threading.Thread(target=stream, args=(n,)) for n in sizes]
        for t in threads:
            t.start()
        assert all(first.acquire(timeout=120) for _ in threads)  # every stream has begun
        in_flight = sum(progress.get(n, 0) < n for n in sizes)  # a stream has fewer lines than tokens until its end
        process.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(90)
        assert not any(t.is_alive() for t in threads), "a request hung"
        assert process.wait(60) == 0
        assert len(outcomes) == 3 and all(kind == "done" and code == 200 for kind, code in outcomes), outcomes
        assert in_flight >= 1
        with socket.socket() as s:  # the port is free again: a new server can listen on it (as servers bind)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()
        assert "stopped" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()


def test_rlvr_serve_refuses_a_bad_field_or_model_before_listening(tmp_path):
    from typer.testing import CliRunner

    from rlvr.cli import app

    typo = CliRunner().invoke(app, ["serve", "--prot", "8001"])
    assert typo.exit_code == 2 and "did you mean 'port'" in typo.output
    parser = CliRunner().invoke(app, ["serve", "tool_parser=nowhere.py:parse"])
    assert parser.exit_code == 2 and "tool_parser" in parser.output
    (tmp_path / "run").mkdir()
    empty = CliRunner().invoke(app, ["serve", str(tmp_path / "run")])
    assert empty.exit_code == 2 and "no final/ model and no checkpoint" in empty.output
    assert "Traceback" not in typo.output + parser.output + empty.output
