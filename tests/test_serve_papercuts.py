"""What a newcomer to fastln.serve meets first, tried as they meet it:

1. fastln-serve on a port that is taken, or an address that is not this
   machine's, exits with status 1 and one line that names the option, the
   port and the reason, for either port.
2. ``StreamClient.abort()`` (and ``MuxClient.abort()``) inside ``async
   with`` drops the connection as a client that vanishes does: leaving the
   block sends nothing, and the server keeps the stream for a reconnect with
   its token, at its step count.
3. Without a package of the serve extra, importing a module of fastln.serve
   that needs it (``from fastln.serve.client import StreamClient``) raises
   an ImportError naming the package and ``pip install "fastln[serve]"``;
   the modules that do not need it import.
4. The admin endpoints take the scheme ``Bearer`` in any case, and an
   Authorization header without it is told so (401, ``WWW-Authenticate``),
   not that the token is wrong.
"""
import asyncio
import errno
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from fastln.rnn import LNLSTM

from _util import package_parent, require

for _name in ("picows", "starlette", "uvicorn", "prometheus_client"):
    require(_name)

from test_optional import run_blocked  # noqa: E402

from fastln.serve.client import Closed, MuxClient, StreamClient, run_server  # noqa: E402
from fastln.serve.model import save_model  # noqa: E402

I, H = 8, 16
ADMIN = "papercuts-admin-token-0123456789"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("papercuts") / "m.npz"
    save_model(path, LNLSTM(I, H, seed=6))
    return str(path)


def serve(*args):
    """The CompletedProcess of fastln-serve args, which should exit at once."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (package_parent(),
                                                      env.get("PYTHONPATH"))))
    return subprocess.run([sys.executable, "-m", "fastln.serve", *map(str, args)],
                          capture_output=True, text=True, timeout=300, env=env, check=False)


@pytest.mark.parametrize("flag, other", [("--port", "--ws-port"), ("--ws-port", "--port")])
def test_a_port_in_use_is_one_line(model_file, flag, other):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        r = serve("--model", model_file, flag, port, other, 0)
    assert r.returncode == 1 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.splitlines() == [f"fastln-serve: error: {flag} {port} on 127.0.0.1: "
                                     f"{os.strerror(errno.EADDRINUSE)}"], r.stderr


def test_an_address_not_of_this_machine_is_one_line(model_file):
    r = serve("--model", model_file, "--host", "192.0.2.1", "--allow-open-admin")  # TEST-NET-1
    assert r.returncode == 1 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.splitlines() == [f"fastln-serve: error: --ws-port 8001 on 192.0.2.1: "
                                     f"{os.strerror(errno.EADDRNOTAVAIL)}"], r.stderr


async def reconnect(connect):
    """connect(), retried while the server has not seen the dropped
    connection yet (4409: another connection holds the stream)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return await connect()
        except Closed as e:
            assert e.code == 4409 and time.monotonic() < deadline, e
            await asyncio.sleep(0.05)


def test_abort_keeps_the_stream(model_file):
    x = np.ones(I, np.float32)

    async def main(url):
        async with await StreamClient.connect(url, "kept", new=True) as c:
            await c.step(x)
            c.abort()
            with pytest.raises(Closed, match="aborted by the client"):
                c.send(x)
        c = await reconnect(lambda: StreamClient.connect(url, "kept", token=c.token))
        t = c.hello["t"]
        await c.close()

        async with await MuxClient.connect(url) as m:
            await m.open(["mkept"], new=True)
            await m.step(["mkept"], x[None])
            m.abort()
        m2 = await reconnect(lambda: MuxClient.connect(url))
        entries = await m2.open(["mkept"], tokens=m.tokens)
        await m2.close()
        return t, entries

    with run_server("--model", model_file) as server:
        t, entries = asyncio.run(asyncio.wait_for(main(server.ws), 120))
    assert t == 1
    assert entries[0].get("t") == 1, entries


# the modules of fastln.serve that each package of the serve extra is needed by
NEEDED_BY = {"picows": {"client", "cluster", "ws.stream", "ws.mux", "ws.routes", "cli",
                        "loadtest"},
             "starlette": {"http", "cli"},
             "uvicorn": {"cli"},
             "prometheus_client": {"metrics", "http", "cli"}}
MODULES = ["client", "cluster", "ws.stream", "ws.mux", "ws.routes", "http", "metrics", "cli",
           "loadtest", "service", "model", "errors", "frames", "loop"]
_IMPORTS = """
import importlib, json, sys
out = {}
for module in sys.argv[1:]:
    try:
        importlib.import_module("fastln.serve." + module)
        out[module] = None
    except ImportError as e:
        out[module] = str(e)
try:
    from fastln.serve.client import StreamClient
    out["StreamClient"] = None
except ImportError as e:
    out["StreamClient"] = str(e)
print(json.dumps(out))
"""


@pytest.mark.parametrize("package", sorted(NEEDED_BY))
def test_a_module_imported_without_the_extra_names_it(package):
    r = run_blocked([package], "-c", _IMPORTS, *MODULES)
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    needs = NEEDED_BY[package] | ({"StreamClient"} if "client" in NEEDED_BY[package] else set())
    assert {m for m, e in got.items() if e is not None} == needs, got
    for module in needs:
        assert package in got[module] and 'pip install "fastln[serve]"' in got[module], got
        assert "No module named" not in got[module], got


def test_the_bearer_scheme(model_file, tmp_path):
    import urllib.error
    import urllib.request

    path = tmp_path / "token"
    path.write_text(ADMIN + "\n")

    def get(authorization):
        req = urllib.request.Request(server.http + "/streams",
                                     headers={"Authorization": authorization})
        try:
            with urllib.request.urlopen(req, timeout=20) as r:
                return r.status, json.loads(r.read()), r.headers
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read()), e.headers

    with run_server("--model", model_file, "--admin-token-file", path) as server:
        bare = get(ADMIN)
        basic = get(f"Basic {ADMIN}")
        empty = get("Bearer ")
        wrong = get(f"Bearer {ADMIN[::-1]}")
        answers = [get(f"{scheme} {ADMIN}")[:2] for scheme in ("Bearer", "bearer", "BEARER")]
    for status, reply, headers in (bare, basic, empty):
        assert status == 401 and headers["WWW-Authenticate"] == "Bearer", reply
        assert "must be 'Bearer TOKEN'" in reply["error"], reply
    assert bare[1]["error"].endswith("got no scheme")
    assert basic[1]["error"].endswith("got the scheme 'Basic'")
    assert empty[1]["error"].endswith("got no token")
    assert wrong[:2] == (403, {"error": "the admin token is wrong"})
    assert answers == [(200, {"streams": {}})] * 3
