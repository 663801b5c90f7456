"""Scale-out behind a real nginx: servers come and go as docs/serving.md
says, and no stream notices but for a short wait.

nginx runs from docs/nginx/fastln.conf, the file docs/serving.md includes,
as it is but for its listen port and its log folder, in a prefix of its own
beside a nginx.conf that includes it and the test's own
fastln/upstream.conf.

- The routing: behind nginx, servers that answer ``/owner/ID`` with their
  name, under several upstream lists (weights, a down server, a unix socket,
  one server); for a thousand ids each, nginx's answer is the server that
  fastln.serve.cluster.NginxUpstream computes.
- The procedure: three servers (with an admin token, --advertise 127.0.0.1)
  sit behind nginx, and STREAMS streams open through it and step, two frames
  in flight, paced so that the machine stays responsive. CYCLES times, as
  the guide says and without waiting for nginx's old workers: a new server
  starts and joins fastln/upstream.conf, ``nginx -s reload``, and
  ``rebalance(..., upstream=that file)`` moves the streams whose ids now hash
  to it, to it only, while the clients keep stepping; a second rebalance
  moves none, and every stream is on the server that the list routes its id
  to. Then the oldest server leaves the list, ``nginx -s reload``, and
  ``drain(..., upstream=...)`` moves its streams, and the others move none;
  then it holds nothing, and SIGTERM saves no stream. Before the first
  reload, rebalance and drain refuse, and move nothing.

A client closed with 4410 reconnects through nginx with its resume token,
retrying 4404 for a few seconds as the docs say (an old worker still routes
it to the server it left), finds the hello's t equal to the replies it
received, and goes on from there. At the end every stream's replies equal,
bit for bit, the stream run alone, and none is lost: each client closes with
1000, and the servers then hold no stream. ``pytest -s`` shows the waits, from
a 4410 to the first reply through nginx after reconnecting, and the moves.

Skipped where nginx is not installed, but a failure under CI=1, which
installs Debian's.
"""
import asyncio
import contextlib
import http.server
import json
import os
import random
import re
import socketserver
import tempfile
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from fastln.rnn import LNLSTM

from _util import require

for _name in ("picows", "starlette", "uvicorn"):
    require(_name)

from fastln.serve import cluster  # noqa: E402
from fastln.serve.client import Closed, StreamClient, run, run_server  # noqa: E402
from fastln.serve.cluster import (  # noqa: E402
    NginxUpstream,
    drain,
    owner,
    owners,
    rebalance,
    streams,
)
from fastln.serve.loadtest.procs import Nginx, binary  # noqa: E402
from fastln.serve.model import reference_run, save_model, stream_inputs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONF = os.path.join(ROOT, "docs", "nginx", "fastln.conf")
I, H, LAYERS = 12, 24, 2
STREAMS = 300
CYCLES = 3               # servers that join, and servers that leave
MAX_STEPS = 2000         # inputs made per stream; a stream runs far fewer
PAUSE = (0.2, 0.5)       # seconds between a stream's pairs of steps: ~1000 steps/s in all
ADMIN = "nginx-test-admin-token-0123456789"


def nginx_binary():
    """nginx's path; a skip where it is missing, a failure under CI."""
    path = binary("nginx", "/usr/sbin/nginx", "/usr/local/sbin/nginx")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("nginx is not installed: CI installs Debian's")
        pytest.skip("nginx is not installed")
    return path


class Client(StreamClient):
    """A StreamClient that notes when its connection ended, and whose pause()
    ends early when it does (so that a close during a pause is seen at once)."""

    def __init__(self):
        super().__init__()
        self.closed_at = None
        self._wake = None

    def _end(self, closed):      # called once, when the connection ends
        self.closed_at = time.monotonic()
        super()._end(closed)
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def pause(self, seconds):
        if self.closed is not None:
            return
        loop = asyncio.get_running_loop()
        self._wake = loop.create_future()
        timer = loop.call_later(seconds, lambda w=self._wake: w.done() or w.set_result(None))
        await self._wake
        timer.cancel()


class Stream:
    """One client stream through nginx: its replies, and the waits of its moves."""

    def __init__(self, index, proxy_ws):
        self.index, self.id, self.proxy_ws = index, f"st-{index:03d}", proxy_ws
        self.xs = stream_inputs(7, index, MAX_STEPS, I)
        self.ys, self.waits, self.reconnects = [], [], 0
        self.rng = random.Random(index)

    async def reconnect(self, token, closed_at):
        """Reconnects through nginx with the resume token, retrying 4404
        (the import is not done yet) for up to 5 seconds."""
        deadline = closed_at + 5.0
        while True:
            try:
                c = await Client.connect(self.proxy_ws, self.id, token=token)
            except Closed as e:
                if e.code != 4404 or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.005)
                continue
            self.reconnects += 1
            return c

    async def run(self, stop):
        c = await Client.connect(self.proxy_ws, self.id, new=True)
        token, moved_at = c.token, None
        while True:
            if stop.is_set() and moved_at is None:
                await c.close(1000)      # ends the stream on its server
                return
            t = len(self.ys)
            with contextlib.suppress(Closed):    # c.closed says why
                c.send(self.xs[t])
                c.send(self.xs[t + 1])
                for _ in range(2):
                    self.ys.append(await c.recv())
                    if moved_at is not None:
                        self.waits.append(time.monotonic() - moved_at)
                        moved_at = None
                await c.pause(self.rng.uniform(*PAUSE))
            if c.closed is None:
                continue
            e = c.closed
            assert e.code == 4410, f"{self.id}: closed with {e.code}: {e.message}"
            moved_at = c.closed_at
            c = await self.reconnect(token, moved_at)
            assert c.hello["t"] == len(self.ys), (self.id, c.hello["t"], len(self.ys))


def percentile(values, q):
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def get(url):
    """(status, body bytes) of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class Named(http.server.BaseHTTPRequestHandler):
    """Answers every GET with its server's name as JSON, {"server": name},
    as a fastln server's /owner answers with its own addresses."""

    def do_GET(self):
        self.answer({"server": self.server.name})

    def answer(self, reply):
        body = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@contextlib.contextmanager
def named_server(handler, path=None):
    """An HTTP server of handler in a thread, on loopback (or the unix
    socket path), named as an upstream list writes it: yields the name."""
    if path is None:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.name = f"127.0.0.1:{server.server_address[1]}"
    else:
        server = UnixHTTPServer(path, handler)
        os.chmod(path, 0o777)        # nginx's workers may run as another user
        server.name = f"unix:{path}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def random_ids(n, seed):
    """n stream ids of 1 to 64 of the characters a stream id may hold."""
    rng = random.Random(seed)
    chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-"
    return ["".join(rng.choice(chars) for _ in range(rng.randint(1, 64))) for _ in range(n)]


def test_upstream_routes_each_id_as_nginx_does(tmp_path):
    """For a thousand ids under each of several upstream lists, nginx (the
    docs' fastln.conf) routes /owner/ID to the server that
    NginxUpstream(list).route(ID) names."""
    nginx_path = nginx_binary()
    with contextlib.ExitStack() as stack:
        # a folder that nginx's workers may enter, whatever user they run as
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="fastln-nginx-"))
        os.chmod(folder, 0o755)
        tcp = [stack.enter_context(named_server(Named)).name for _ in range(6)]
        unix = stack.enter_context(named_server(Named, os.path.join(folder, "s.sock"))).name
        lists = {
            "the docs' lines": [f"server {a} max_fails=0;" for a in tcp[:3]],
            "weights, a down server, a unix socket": [
                f"server {tcp[0]} weight=3;", f"server {tcp[1]} down;",
                f"server {tcp[2]} weight=2 max_fails=0;", f"server {unix};",
                f"server {tcp[3]};  # a comment"],
            "six in another order, one of them down": [
                f"server {a}{' down' if a == tcp[4] else ''};" for a in tcp[::-1]],
            "one server": [f"server {tcp[5]};"],
        }
        nginx = Nginx(nginx_path, tmp_path / "nginx", CONF)
        stack.callback(nginx.stop)
        ids = random_ids(1000, seed=5)
        for i, (what, lines) in enumerate(lists.items()):
            nginx.upstream(lines)
            if i == 0:
                nginx.start()
            else:
                nginx.reload_and_wait()
            upstream = NginxUpstream.read(nginx.upstream_file)
            routes, wrong = {}, []
            for sid in ids:
                status, body = get(f"{nginx.http}/owner/{sid}")
                assert status == 200, (what, sid, status, body[:200], nginx.log())
                routes[sid] = upstream.route(sid)
                if json.loads(body)["server"] != routes[sid]:
                    wrong.append((sid, json.loads(body)["server"], routes[sid]))
            assert not wrong, f"{what}: nginx routes {len(wrong)} of {len(ids)} ids otherwise, " \
                              f"(id, nginx's, NginxUpstream's): {wrong[:3]}"
            up = {address for address, _, down in upstream.servers if not down}
            assert set(routes.values()) == up, what    # every server takes some ids


def test_upstream_list_is_read_as_nginx_reads_it():
    with open(os.path.join(ROOT, "docs", "nginx", "upstream.conf"), encoding="utf-8") as f:
        docs = NginxUpstream(f.read())
    assert docs.servers == [(f"10.0.0.{n}:8001", 1, False) for n in (11, 12, 13)]
    assert docs.ws("mic-7") == f"ws://{docs.route('mic-7')}"
    text = ("# servers\nserver 'a:1'\n    weight=2;server \"b\\\"c:22\" down; # b\n"
            "server unix:/run/s.sock max_fails=0 fail_timeout=3s;\n")
    listed = NginxUpstream(text, "u.conf")
    assert listed.servers == [("a:1", 2, False), ('b"c:22', 1, True),
                              ("unix:/run/s.sock", 1, False)]
    assert listed.name == "u.conf"
    assert NginxUpstream("server h;").ws("x") == "ws://h:80"    # nginx's default port
    ids = random_ids(2000, seed=6)
    assert {listed.route(sid) for sid in ids} == {"a:1", "unix:/run/s.sock"}
    # adding a server moves only ids to it: the consistent hash
    more = NginxUpstream(text + "server d:4;")
    moved = [sid for sid in ids if more.route(sid) != listed.route(sid)]
    assert moved and {more.route(sid) for sid in moved} == {"d:4"}


@pytest.mark.parametrize("text, message", [
    ("", "lists no server"),
    ("# nothing\n", "lists no server"),
    ("server a:1", "line 1: a statement without its ';'"),
    ("server a:1;\n\nkeepalive 8;", "line 3: 'keepalive' is not a server line"),
    ("server;", "line 1: 'server' is not a server line"),
    ("server a:1 weight=0;", "'weight=0': a weight is an integer from 1 to 10000"),
    ("server a:1 weight=x;", "'weight=x': a weight is an integer"),
    ("server a:1 weight=10001;", "'weight=10001': a weight is an integer"),
    ("server a:1 backup;", "takes no backup servers"),
    ("server a:1;\n;", "line 2: an empty statement"),
    ("upstream u {\n server a:1;\n}", "line 1: a block"),
    ("server 'a:1;", "line 1: a quote that does not close"),
])
def test_upstream_list_refusals(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        NginxUpstream(text)


def test_cluster_argument_types():
    with pytest.raises(TypeError, match="text must be a str"):
        NginxUpstream(b"server a:1;")
    with pytest.raises(TypeError, match="stream_id must be a str"):
        NginxUpstream("server a:1;").route(7)
    with pytest.raises(ValueError, match="round robin"):
        NginxUpstream("server a:1; server b:1;").route("")
    with pytest.raises(ValueError, match="round robin"):
        NginxUpstream("server a:1 down; server b:1 down;").route("x")
    with pytest.raises(TypeError, match="servers must be a sequence"):
        rebalance("http://127.0.0.1:9", "http://127.0.0.1:8", upstream="/no/such/file")
    with pytest.raises(TypeError, match="upstream must be"):
        owners("http://127.0.0.1:9", ["x"], upstream=3)
    with pytest.raises(FileNotFoundError):
        owners("http://127.0.0.1:9", ["x"], upstream="/no/such/upstream.conf")


def test_owners_without_the_list_wait_until_the_answers_settle():
    """Without the upstream list, owners acts on the proxy's answers only
    once two passes agree: answers that change during a pass (a reload) are
    asked again, and answers that never settle raise."""
    ids = [f"s{i}" for i in range(10)]
    old = {sid: f"http://old-{i % 3}" for i, sid in enumerate(ids)}
    new = {sid: f"http://new-{i % 4}" for i, sid in enumerate(ids)}
    asked = []

    class Proxy(Named):
        flapping = False

        def do_GET(self):
            sid = self.path.removeprefix("/owner/")
            asked.append(sid)
            if self.flapping:    # by the old list and the new one, a pass each
                answer = (old, new)[(len(asked) - 1) // len(ids) % 2][sid]
            else:    # the first 15 answers by the old list, the rest by the new
                answer = (old if len(asked) <= 15 else new)[sid]
            self.answer({"http": answer, "ws": "ws" + answer[4:]})

    with named_server(Proxy) as proxy:
        url = f"http://{proxy.name}"
        assert owners(url, ids, settle=0.01) == new
        assert asked == ids * 4      # old, half and half, new, new: each id once a pass
        assert owners(url, [], settle=0.01) == {}
        Proxy.flapping = True
        with pytest.raises(RuntimeError, match="did not settle within 0.3 s"):
            owners(url, ids, settle=0.01, timeout=0.3)


def test_scale_up_and_drain_as_documented(tmp_path):
    nginx_path = nginx_binary()
    model = LNLSTM(I, H, LAYERS, seed=21)
    model_file = tmp_path / "m.npz"
    save_model(model_file, model)
    token_file = tmp_path / "admin.token"
    token_file.write_text(ADMIN + "\n")

    def serve(name):     # a start may take long where the machine is busy
        return run_server("--model", model_file, "--admin-token-file", token_file,
                          "--advertise", "127.0.0.1", "--state-file", tmp_path / f"{name}.npz",
                          timeout=300)

    nginx = Nginx(nginx_path, tmp_path / "nginx", CONF)
    servers = {}
    clients = [Stream(i, None) for i in range(STREAMS)]
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        stack.callback(nginx.stop)
        try:
            for name in "abc":
                servers[name] = stack.enter_context(serve(name))
            # on the way out, SIGTERM them all at once: each then waits for its own end
            stack.callback(lambda: [srv.proc.terminate() for srv in servers.values()
                                    if srv.proc.poll() is None])
            nginx.upstream([servers[name] for name in "abc"])
            nginx.start()
            for s in clients:
                s.proxy_ws = nginx.ws
            report = run(scenario(nginx, servers, clients, stack, serve))
        except BaseException:
            print(f"nginx's error log:\n{nginx.log()}")
            for name, server in servers.items():
                print(f"server {name}:\n{server.output()[-3000:]}")
            raise

    for s in clients:
        want = reference_run(model, s.xs[:len(s.ys)])
        got = np.stack(s.ys)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), s.id
    waits = [w for s in clients for w in s.waits]
    moved_up, moved_out = report["moves"]
    print(f"\n{STREAMS} streams through nginx, {sum(len(s.ys) for s in clients)} steps, "
          f"{report['per_server']} per server at first; {CYCLES} servers joined "
          f"(rebalance moved {[len(m) for m in moved_up]}) and {CYCLES} left (drain moved "
          f"{[len(m) for m in moved_out]}); a moved stream's wait: "
          f"p50 {percentile(waits, 50) * 1e3:.1f} ms, p99 {percentile(waits, 99) * 1e3:.1f} ms, "
          f"max {max(waits) * 1e3:.1f} ms over {len(waits)} moves; "
          f"{time.monotonic() - started:.1f} s in all")
    moves = sum(map(len, moved_up + moved_out))
    assert len(waits) == moves == sum(s.reconnects for s in clients)
    assert all(moved_up) and all(moved_out)


def check_endpoints(nginx, servers):
    """The proxy carries /ws/ and /owner/ only: /metrics, /health and the
    JSON API answer 404 through it, and each server answers them itself."""
    for path in ("/metrics", "/health", "/health/ready", "/streams", "/streams/st-000/step", "/"):
        status, body = get(nginx.http + path)
        assert status == 404, (path, status, body[:300])
    for srv in servers:
        status, body = get(srv.http + "/metrics")
        assert status == 200 and b"\nfastln_serve_" in body, (srv.http, status, body[:300])
        status, body = get(srv.http + "/health")
        assert status == 200, (srv.http, status, body[:300])
        assert json.loads(body)["streams"] == len(streams(srv.http, ADMIN))


def check_placed(listed, upstream):
    """Every stream of the listed servers is on the one the list routes its id to."""
    routes = NginxUpstream.read(upstream)
    for srv in listed:
        for sid in streams(srv.http, ADMIN):
            assert routes.ws(sid) == srv.ws, (sid, srv.ws, routes.ws(sid))


async def scenario(nginx, servers, clients, stack, serve):
    """Opens the streams; CYCLES times, a server joins and the oldest leaves,
    as the guide says; closes the streams. Returns what the checks need."""
    def progress():
        return [len(s.ys) for s in clients]

    def reconnects():
        return sum(s.reconnects for s in clients)

    async def until(condition, what, timeout=60):
        deadline = time.monotonic() + timeout
        while not condition():
            failed = [t for t in tasks if t.done()]
            if failed:
                await failed[0]          # raises what ended a stream early
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)

    async def step_on(steps=2):
        """Waits until every stream took steps more steps."""
        now = progress()
        await until(lambda: all(n >= m + steps for n, m in zip(progress(), now)),
                    f"every stream's next {steps} steps")

    stop = asyncio.Event()
    tasks = []
    for s in clients:
        tasks.append(asyncio.ensure_future(s.run(stop)))
        await asyncio.sleep(0.002)       # the streams open over about a second
    await step_on(4)
    thread = asyncio.to_thread
    per_server = sorted([len(await thread(streams, srv.http, ADMIN))
                         for srv in servers.values()])
    assert sum(per_server) == STREAMS
    await thread(check_endpoints, nginx, servers.values())

    upstream = nginx.upstream_file
    listed = [servers[name] for name in "abc"]
    moved_up, moved_out = [], []
    for cycle in range(CYCLES):
        # scale-up: a server joins the list; the ids that now hash to it move there, only those
        joining = servers["def"[cycle]] = await thread(stack.enter_context, serve("def"[cycle]))
        listed.append(joining)
        urls = [srv.http for srv in listed]
        nginx.upstream(listed)
        if cycle == 0:     # nginx still routes by the old list: rebalance waits, and moves none
            with pytest.raises(RuntimeError, match="has nginx loaded that list"):
                await thread(rebalance, nginx.http, urls, ADMIN, upstream=upstream, timeout=0.5)
            assert await thread(streams, joining.http, ADMIN) == {}
            assert reconnects() == 0
        await thread(nginx.reload)       # nginx -s reload, and on at once
        moves = await thread(rebalance, nginx.http, urls, ADMIN, upstream=upstream)
        assert moves and {m.target for m in moves} == {joining.http}, moves
        assert await thread(rebalance, nginx.http, urls, ADMIN, upstream=upstream) == []
        await thread(check_placed, listed, upstream)
        moved_up.append(moves)
        await until(lambda: reconnects() == sum(map(len, moved_up + moved_out)), "the reconnects")
        await step_on()

        # drain: the oldest server leaves the list; its streams move, and no other stream
        leaving = listed[0]
        if cycle == 0:     # the list still holds it: drain refuses, at once with the list
            with pytest.raises(RuntimeError, match="is it out of the list"):
                await thread(drain, nginx.http, leaving.http, ADMIN, upstream=upstream)
            with pytest.raises(RuntimeError, match="after 0.2 s .* out of the proxy's list"):
                await thread(drain, nginx.http, leaving.http, ADMIN, 0.2, settle=0.05)
            assert reconnects() == sum(map(len, moved_up))
        listed.remove(leaving)
        nginx.upstream(listed)
        if cycle == 0:     # nginx still routes by the old list: drain waits, and moves none
            with pytest.raises(RuntimeError, match="has nginx loaded that list"):
                await thread(drain, nginx.http, leaving.http, ADMIN, 0.5, upstream=upstream)
            assert reconnects() == sum(map(len, moved_up))
        await thread(nginx.reload)
        moves = await thread(drain, nginx.http, leaving.http, ADMIN, upstream=upstream)
        assert moves and {m.source for m in moves} == {leaving.http}, moves
        assert {m.target for m in moves} <= {srv.http for srv in listed}, moves
        assert await thread(rebalance, nginx.http, [srv.http for srv in listed], ADMIN,
                            upstream=upstream) == []
        await thread(check_placed, listed, upstream)
        assert await thread(streams, leaving.http, ADMIN) == {}
        assert await thread(leaving.stop) == 0
        assert "saved 0 streams" in leaving.output(), leaving.output()[-2000:]
        moved_out.append(moves)
        await until(lambda: reconnects() == sum(map(len, moved_up + moved_out)), "the reconnects")
        await step_on()
    assert leaving.http not in {await thread(owner, nginx.http, m.stream) for m in moved_out[-1]}

    # a stream that ends between a listing and its export (export: 404) is passed over
    moves, failed = [], []
    await thread(cluster._move, "no-such-stream", listed[0].http, listed[1].http, ADMIN,
                 moves, failed)
    assert moves == failed == []

    # the end: each client closes with 1000, which ends its stream
    stop.set()
    await asyncio.gather(*tasks)
    for srv in listed:
        assert await thread(streams, srv.http, ADMIN) == {}, srv.http
    return {"moves": (moved_up, moved_out), "per_server": per_server}
