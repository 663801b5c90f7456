"""fastln-serve's access control, tried by someone who should not get in:

1. Resume tokens: 192 random bits per stream, unique; a stream cannot be
   taken by its id alone, with a wrong token or with another stream's
   (WebSocket 4401 / 4403, HTTP 401 / 403; tests/test_serve.py covers the
   close codes per model and the token kept through restarts and moves).
2. The admin endpoints (list, delete, export, import) with a token from
   --admin-token-file or $FASTLN_SERVE_ADMIN_TOKEN: no credential gets 401
   with WWW-Authenticate, a wrong one 403, the right one works, and a move
   between two servers with it keeps the stream's resume token.
3. The server refuses a non-loopback --host without an admin token unless
   --allow-open-admin is given, and refuses a short or unreadable token.
4. --max-connections: one connection past it closes with 1013, and a slot
   frees when a connection ends.
5. The state file is readable by its owner only (it holds the tokens).
"""
import asyncio
import os
import re
import stat

import numpy as np
import pytest

from fastln.rnn import LNLSTM

from _util import require

for _name in ("picows", "starlette", "uvicorn"):
    require(_name)

from test_serve import refused, run  # noqa: E402

from fastln.serve import cli  # noqa: E402
from fastln.serve.client import (  # noqa: E402
    Closed,
    StreamClient,
    move_stream,
    request,
    run_server,
)
from fastln.serve.model import save_model  # noqa: E402

I, H = 8, 16
ADMIN = "s3cret-admin-token-0123456789"


@pytest.fixture
def model_file(tmp_path):
    path = str(tmp_path / "m.npz")
    save_model(path, LNLSTM(I, H, seed=3))
    return path


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "admin.token"
    path.write_text(ADMIN + "\n")
    return str(path)


def test_tokens_are_random_and_a_stream_is_not_taken_without_its_own(model_file):
    with run_server("--model", model_file) as server:
        async def main(url):
            clients = [await StreamClient.connect(url, f"s{k}", new=True) for k in range(40)]
            tokens = [c.token for c in clients]
            for c in clients[1:]:
                await c.close()
            await clients[0].close(1001)                  # s0 waits for a reconnect
            tries = {"id alone": await refused(url, "s0"),
                     "wrong": await refused(url, "s0", token="A" * 32),
                     "empty": await refused(url, "s0", token=""),
                     "another's": await refused(url, "s0", token=tokens[1]),
                     "a prefix": await refused(url, "s0", token=tokens[0][:-1])}
            c = await StreamClient.connect(url, "s0", token=tokens[0])
            await c.close()
            return tokens, tries
        tokens, tries = run(main(server.ws))
        # over HTTP, the step needs the token too
        status, reply = request("POST", f"{server.http}/streams", {"stream": "h"})
        assert status == 201
        x = {"x": [0.5] * I}
        assert request("POST", f"{server.http}/streams/h/step", x)[0] == 401
        assert request("POST", f"{server.http}/streams/h/step", {**x, "token": tokens[0]})[0] \
            == 403
        assert request("POST", f"{server.http}/streams/h/step",
                       {**x, "token": reply["token"]})[0] == 200
    assert len(set(tokens)) == len(tokens)
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{32}", t) for t in tokens)   # 32 x 6 = 192 bits
    assert tries["id alone"].code == 4401 and tries["empty"].code == 4401   # token= is none
    assert all(tries[k].code == 4403 for k in ("wrong", "another's", "a prefix")), tries


@pytest.mark.parametrize("source", ["file", "env"])
def test_admin_endpoints_need_the_bearer_token(model_file, token_file, source, monkeypatch):
    if source == "file":
        args = ("--admin-token-file", token_file)
    else:
        monkeypatch.setenv(cli.ADMIN_TOKEN_ENV, ADMIN)
        args = ()
    with run_server("--model", model_file, *args) as server:
        base = server.http
        status, made = request("POST", f"{base}/streams", {"stream": "a"})   # open to clients
        assert status == 201
        calls = [("GET", "/streams", None), ("DELETE", "/streams/a", None),
                 ("POST", "/streams/a/export", None),
                 ("PUT", "/streams/b/state", {"t": 0, "token": "t" * 32, "state": []})]
        for method, path, body in calls:
            status, reply = request(method, base + path, body)
            assert status == 401 and "admin token" in reply["error"], (method, path, reply)
            status, reply = request(method, base + path, body, admin_token=ADMIN[::-1])
            assert status == 403, (method, path, reply)
            status, reply = request(method, base + path, body, admin_token=ADMIN[:-1])
            assert status == 403, (method, path, reply)
        # the header says how to authenticate
        import urllib.error
        import urllib.request
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"{base}/streams", timeout=10)
        assert info.value.code == 401 and info.value.headers["WWW-Authenticate"] == "Bearer"
        # nothing above changed the stream; the token lists it
        assert request("GET", f"{base}/streams", admin_token=ADMIN) == (200, {"streams": {"a": 0}})
        assert request("GET", f"{base}/health")[0] == 200            # health stays open


def test_a_move_with_the_admin_token_keeps_the_resume_token(model_file, token_file):
    serve = ("--model", model_file, "--admin-token-file", token_file)
    with run_server(*serve) as a, run_server(*serve) as b:
        async def main():
            c = await StreamClient.connect(a.ws, "mover", new=True)
            y0 = await c.step(np.ones(I, np.float32))
            token = c.token
            with pytest.raises(RuntimeError, match="403"):
                await asyncio.to_thread(move_stream, "mover", a.http, b.http, "wrong" * 4)
            await asyncio.to_thread(move_stream, "mover", a.http, b.http, ADMIN)
            with pytest.raises(Closed):
                await c.recv() if c.pending else await c.step(np.ones(I, np.float32))
            no = await refused(b.ws, "mover")
            c = await StreamClient.connect(b.ws, "mover", token=token)
            t = c.hello["t"]
            await c.close()
            return y0, no, t
        _, no, t = run(main())
    assert no.code == 4401 and t == 1


@pytest.fixture
def no_serving(monkeypatch):
    served = []

    async def record(args, service, token=None, store=None):
        served.append(token)
    monkeypatch.setattr(cli, "serve", record)
    return served


def _exit_message(argv, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::", "example.com"])
def test_a_public_address_needs_a_token_or_the_explicit_flag(model_file, token_file, host,
                                                             no_serving, capsys, monkeypatch):
    monkeypatch.delenv(cli.ADMIN_TOKEN_ENV, raising=False)
    line = _exit_message(["--model", model_file, "--host", host], capsys)
    assert f"--host {host} is not a loopback address" in line and "--allow-open-admin" in line
    cli.main(["--model", model_file, "--host", host, "--admin-token-file", token_file])
    cli.main(["--model", model_file, "--host", host, "--allow-open-admin"])
    assert no_serving == [ADMIN, None]


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.5", "::1", "localhost"])
def test_loopback_needs_no_token(model_file, host, no_serving, monkeypatch):
    monkeypatch.delenv(cli.ADMIN_TOKEN_ENV, raising=False)
    cli.main(["--model", model_file, "--host", host])
    assert no_serving == [None]


def test_bad_admin_tokens_are_refused(model_file, tmp_path, no_serving, capsys, monkeypatch):
    monkeypatch.delenv(cli.ADMIN_TOKEN_ENV, raising=False)
    short = tmp_path / "short"
    short.write_text("abc\n")
    line = _exit_message(["--model", model_file, "--admin-token-file", str(short)], capsys)
    assert "at least 16 printable characters" in line
    line = _exit_message(["--model", model_file, "--admin-token-file",
                          str(tmp_path / "missing")], capsys)
    assert "--admin-token-file" in line and "No such file" in line
    monkeypatch.setenv(cli.ADMIN_TOKEN_ENV, "short")
    line = _exit_message(["--model", model_file], capsys)
    assert cli.ADMIN_TOKEN_ENV in line and "at least 16" in line
    assert no_serving == []


def test_max_connections(model_file):
    with run_server("--model", model_file, "--max-connections", 2) as server:
        async def main(url):
            a = await StreamClient.connect(url, "a", new=True)
            b = await StreamClient.connect(url, "b", new=True)
            full = await refused(url, "c", new=True)
            await a.close()
            await asyncio.sleep(0.2)
            c = await StreamClient.connect(url, "c", new=True)       # a's slot is free
            await b.close()
            await c.close()
            return full
        full = run(main(server.ws))
    assert full.code == 1013 and "--max-connections" in full.message


def test_the_state_file_is_private(model_file, tmp_path):
    state = tmp_path / "streams.npz"
    with run_server("--model", model_file, "--state-file", state) as server:
        assert request("POST", f"{server.http}/streams", {"stream": "p"})[0] == 201
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o600
