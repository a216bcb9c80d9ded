"""What operators configure: connection timeouts and limits, the API key, CORS, docs, and
/health while draining."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from server_helpers import MODEL, engine_config, serve
from test_shutdown import LONG, StreamReader

from speculant.server import ServerOptions

GOOD = {"model": MODEL, "prompt": "Hello", "max_tokens": 2, "temperature": 0}
TIMEOUTS = ServerOptions(header_timeout_s=1.0, body_timeout_s=1.0)


def _closed_by_server(sock: socket.socket, within_s: float = 20.0) -> bytes:
    """Everything the server sends until it closes the connection (fails if it never does)."""
    sock.settimeout(within_s)
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            raise AssertionError(f"the server kept the connection open; got {received[:200]!r}") from None
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk


@pytest.fixture(scope="module")
def timed(tiny_checkpoint):
    with serve(tiny_checkpoint, engine_config(), options=TIMEOUTS) as running:
        yield running


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def test_an_idle_connection_is_closed(timed):
    with _connect(timed.url) as sock:
        assert _closed_by_server(sock) == b""


def test_an_idle_connection_is_closed_under_the_default_options(server):
    with _connect(server.url) as sock:
        assert _closed_by_server(sock, within_s=ServerOptions().header_timeout_s + 10) == b""


def test_a_slow_request_head_is_closed(timed):
    with _connect(timed.url) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        for _ in range(3):  # a header line every half timeout: each alone would be in time
            time.sleep(TIMEOUTS.header_timeout_s / 2)
            try:
                sock.sendall(b"X-Slow: 1\r\n")
            except OSError:
                break
        assert b"200 OK" not in _closed_by_server(sock)


def test_a_body_that_never_finishes_is_a_408_and_closed(timed):
    with _connect(timed.url) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{\"prompt\": \"x"
        )
        reply = _closed_by_server(sock)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b'"code":"body_timeout"' in reply


def test_the_server_answers_after_closing_slow_clients(timed):
    assert httpx.post(f"{timed.url}/v1/completions", json=GOOD, timeout=30).status_code == 200


def test_connections_beyond_the_limit_are_refused_with_503(tiny_checkpoint):
    with serve(tiny_checkpoint, engine_config(), options=ServerOptions(max_connections=2)) as running:
        held = [_connect(running.url) for _ in range(2)]
        try:
            response = httpx.get(f"{running.url}/health", timeout=10)
            assert response.status_code == 503
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + 10
        while httpx.get(f"{running.url}/health", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "the freed connections were not counted back"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def guarded(tiny_checkpoint):
    options = ServerOptions(api_key="sk-test-123", allowed_origins=("https://app.example",))
    with serve(tiny_checkpoint, engine_config(), options=options) as running:
        yield running


@pytest.mark.parametrize("header", [None, "Bearer wrong", "Bearer sk-test-1234", "sk-test-123", "Basic sk-test-123"])
def test_a_missing_or_wrong_api_key_is_a_401_in_openai_shape(guarded, header):
    headers = {"Authorization": header} if header else {}
    for path in ("/v1/completions", "/v1/models"):
        response = httpx.request(
            "POST" if path.endswith("completions") else "GET", f"{guarded.url}{path}", json=GOOD, headers=headers, timeout=30
        )
        assert response.status_code == 401, response.text
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == "invalid_api_key"


def test_the_right_api_key_is_served_and_probes_need_none(guarded):
    headers = {"Authorization": "Bearer sk-test-123"}
    assert httpx.post(f"{guarded.url}/v1/completions", json=GOOD, headers=headers, timeout=30).status_code == 200
    assert httpx.get(f"{guarded.url}/health", timeout=10).status_code == 200
    assert httpx.get(f"{guarded.url}/metrics", timeout=10).status_code == 200


def test_cors_allows_only_the_configured_origins(guarded, server):
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    allowed = httpx.options(f"{guarded.url}/v1/completions", headers=preflight, timeout=10)
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "https://app.example"
    other = httpx.options(f"{guarded.url}/v1/completions", headers={**preflight, "Origin": "https://evil.example"}, timeout=10)
    assert "access-control-allow-origin" not in other.headers
    default = httpx.get(f"{server.url}/health", headers={"Origin": "https://app.example"}, timeout=10)
    assert "access-control-allow-origin" not in default.headers  # no CORS unless configured


def test_docs_are_off_unless_enabled(server, tiny_checkpoint):
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert httpx.get(f"{server.url}{path}", timeout=10).status_code == 404
    with serve(tiny_checkpoint, engine_config(), options=ServerOptions(enable_docs=True)) as running:
        assert httpx.get(f"{running.url}/openapi.json", timeout=10).status_code == 200
        assert httpx.get(f"{running.url}/docs", timeout=10).status_code == 200


def test_health_answers_503_while_draining_until_the_streams_end(tiny_checkpoint):
    with serve(tiny_checkpoint, engine_config(), drain_timeout_s=30) as running:
        reader = StreamReader(running.url, {**LONG, "max_tokens": 300})
        reader.start()
        assert reader.started.wait(30)
        running.server.should_exit = True  # what SIGTERM does
        deadline = time.monotonic() + 10
        while running.async_engine.accepting:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        health = httpx.get(f"{running.url}/health", timeout=10)
        assert health.status_code == 503 and health.json() == {"status": "shutting_down"}
        refused = httpx.post(f"{running.url}/v1/completions", json=GOOD, timeout=10)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        reader.finish(60)
        assert reader.finish_reason == "length"
        running.thread.join(30)
        assert not running.thread.is_alive()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{running.url}/health", timeout=5)


def test_serve_flags_build_the_server_options(monkeypatch):
    from speculant import cli

    captured = {}
    monkeypatch.setattr("speculant.server.run_server", lambda config, **kw: captured.update(kw) or 0)  # the exit status
    monkeypatch.setenv("SPECULANT_API_KEY", "from-env")
    args = cli.build_parser().parse_args(
        ["serve", "--allowed-origins", "https://a.example,https://b.example", "--enable-docs",
         "--max-body-mb", "2", "--header-timeout", "3", "--body-timeout", "4", "--max-connections", "9"]
    )
    assert cli.main.__module__ and args.func(args) == 0
    options = captured["options"]
    assert options == ServerOptions(
        api_key="from-env", allowed_origins=("https://a.example", "https://b.example"), enable_docs=True,
        max_body_bytes=2 << 20, header_timeout_s=3.0, body_timeout_s=4.0, max_connections=9,
    )
    args = cli.build_parser().parse_args(["serve", "--api-key", "from-flag"])
    args.func(args)
    assert captured["options"].api_key == "from-flag"


