"""Scale-out behind a real nginx: servers come and go, and no stream notices
but for a short wait.

nginx runs from docs/nginx/fastln.conf, the file docs/serving.md includes,
as it is but for its listen port and its log folder, in a prefix of its own
beside a nginx.conf that includes it and the test's own
fastln/upstream.conf. Three servers (with an admin token, --advertise
127.0.0.1) sit behind it, and STREAMS streams open through it and step, two
frames in flight, paced so that the machine stays responsive:

1. Scale-up: a fourth server starts and joins the upstream list (nginx
   reloads, and the test waits until its new worker runs);
   fastln.serve.cluster.rebalance moves the streams whose ids now hash to it,
   to it only, while the clients keep stepping; a second rebalance moves none.
2. Drain: one of the first three leaves the list (reload);
   fastln.serve.cluster.drain moves its streams, and the others move none;
   then it holds nothing, and SIGTERM saves no stream.

A client closed with 4410 reconnects through nginx with its resume token,
retrying 4404 for a few seconds as the docs say, finds the hello's t equal
to the replies it received, and goes on from there. At the end every
stream's replies equal, bit for bit, the stream run alone; none is lost (each
client closes with 1000, and the servers then hold no stream); and a moved
stream's wait, from its 4410 to its first reply through nginx after
reconnecting, has p99 at most WAIT_P99 seconds. ``pytest -s`` shows the
waits and the moves.

Skipped where nginx is not installed, but a failure under CI=1, which
installs Debian's.
"""
import asyncio
import contextlib
import os
import random
import re
import resource
import shutil
import socket
import subprocess
import time

import numpy as np
import pytest

from fastln.rnn import LNLSTM

from _util import require

for _name in ("picows", "starlette", "uvicorn"):
    require(_name)

from fastln.serve import cluster  # noqa: E402
from fastln.serve.client import Closed, StreamClient, run, run_server  # noqa: E402
from fastln.serve.cluster import drain, owner, rebalance, streams  # noqa: E402
from fastln.serve.model import reference_run, save_model, stream_inputs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONF = os.path.join(ROOT, "docs", "nginx", "fastln.conf")
I, H, LAYERS = 12, 24, 2
STREAMS = 300
MAX_STEPS = 500          # inputs made per stream; a stream runs far fewer
PAUSE = (0.2, 0.5)       # seconds between a stream's pairs of steps: ~1000 steps/s in all
WAIT_P99 = 0.2           # seconds, the target
ADMIN = "nginx-test-admin-token-0123456789"


def nginx_binary():
    """nginx's path; a skip where it is missing, a failure under CI."""
    path = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("nginx is not installed: CI installs Debian's")
        pytest.skip("nginx is not installed")
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid):
    """{pid: command line} of the processes whose parent is pid."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    found[int(entry)] = f.read().replace(b"\0", b" ").decode().strip()
        except (OSError, ValueError, IndexError):
            continue         # it exited meanwhile
    return found


class Nginx:
    """nginx in a prefix of its own (prefix/nginx.conf includes
    docs/nginx/fastln.conf, copied with the listen port and the log folder
    changed, and prefix/fastln/upstream.conf lists the servers), in the
    foreground as this process's child."""

    def __init__(self, binary, prefix):
        self.binary, self.prefix = binary, str(prefix)
        self.proc, self.port = None, None
        for folder in ("fastln", "logs", "tmp"):
            os.makedirs(os.path.join(self.prefix, folder), exist_ok=True)
        self.error_log = os.path.join(self.prefix, "logs", "error.log")
        tmp = os.path.join(self.prefix, "tmp")
        with open(os.path.join(self.prefix, "nginx.conf"), "w") as f:
            # two connections per stream, and a few more: under the hard limit of open files
            files = min(4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
            f.write(f"worker_processes 1;\n"
                    f"worker_rlimit_nofile {files};\n"
                    f"events {{ worker_connections {files - 64}; }}\n"
                    "http {\n"
                    + "".join(f"    {kind}_temp_path {tmp}/{kind};\n"
                              for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
                    + "    include fastln.conf;\n}\n")

    def configure(self, port):
        """Copies the docs' fastln.conf with listen 127.0.0.1:port and the logs in the prefix."""
        with open(CONF, encoding="utf-8") as f:
            text = f.read()
        for pattern in (r"listen 80;", r"/var/log/nginx/"):
            assert len(re.findall(pattern, text)) == 1, f"{CONF} should hold {pattern!r} once"
        text = text.replace("listen 80;", f"listen 127.0.0.1:{port};")
        text = text.replace("/var/log/nginx/", os.path.join(self.prefix, "logs") + "/")
        with open(os.path.join(self.prefix, "fastln.conf"), "w", encoding="utf-8") as f:
            f.write(text)
        self.port = port

    def upstream(self, servers):
        """Writes fastln/upstream.conf: the servers' WebSocket addresses."""
        with open(os.path.join(self.prefix, "fastln", "upstream.conf"), "w") as f:
            for server in servers:
                f.write(f"server {server.ws.removeprefix('ws://')} max_fails=0;\n")

    def command(self, *args):
        return [self.binary, "-p", self.prefix + "/", "-e", self.error_log,
                "-c", os.path.join(self.prefix, "nginx.conf"), *args]

    def check(self):
        run_ = subprocess.run(self.command("-t"), capture_output=True, text=True, timeout=30)
        assert run_.returncode == 0, f"nginx -t failed:\n{run_.stderr}\n{self.log()}"

    def start(self, tries=3):
        for _ in range(tries):
            self.configure(free_port())
            self.check()
            self.proc = subprocess.Popen(self.command("-g", "daemon off;"),
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while self.proc.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(OSError), socket.create_connection(
                        ("127.0.0.1", self.port), timeout=1):
                    if self.workers()[0]:
                        return
                time.sleep(0.05)
            self.stop()
            if "Address already in use" not in self.log():
                break            # another port will not help
        raise AssertionError(f"nginx did not start:\n{self.log()}")

    def workers(self):
        """(pids of the workers that take connections, pids of those shutting down)."""
        procs = children(self.proc.pid)
        return ({p for p, cmd in procs.items() if cmd.endswith("worker process")},
                {p for p, cmd in procs.items() if cmd.endswith("is shutting down")})

    def reload(self, timeout=30):
        """Reloads the configuration (SIGHUP) and waits until only the new
        worker takes connections: the old ones have closed their listening
        sockets and serve just the connections they hold."""
        self.check()
        old, _ = self.workers()
        self.proc.send_signal(1)     # SIGHUP: reload
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            taking, _ = self.workers()
            if taking and not taking & old:
                return
            assert self.proc.poll() is None, f"nginx exited:\n{self.log()}"
            time.sleep(0.02)
        raise AssertionError(f"nginx did not reload within {timeout} s:\n{self.log()}")

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()    # SIGTERM: a fast shutdown
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self):
        try:
            with open(self.error_log, encoding="utf-8", errors="replace") as f:
                return f.read()[-5000:]
        except OSError:
            return "(no error log)"

    @property
    def http(self):
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self):
        return f"ws://127.0.0.1:{self.port}"


class Client(StreamClient):
    """A StreamClient that notes when its connection ended, and whose pause()
    ends early when it does (so that a close during a pause is seen at once)."""

    def __init__(self):
        super().__init__()
        self.closed_at = None
        self._wake = None

    def _end(self, closed):
        if self.closed is None:
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


def test_scale_up_and_drain_behind_nginx(tmp_path):
    binary = nginx_binary()
    model = LNLSTM(I, H, LAYERS, seed=21)
    model_file = tmp_path / "m.npz"
    save_model(model_file, model)
    token_file = tmp_path / "admin.token"
    token_file.write_text(ADMIN + "\n")

    def serve(name):
        return run_server("--model", model_file, "--admin-token-file", token_file,
                          "--advertise", "127.0.0.1", "--state-file", tmp_path / f"{name}.npz")

    nginx = Nginx(binary, tmp_path / "nginx")
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
    p50, p99 = percentile(waits, 50), percentile(waits, 99)
    print(f"\n{STREAMS} streams through nginx, {sum(len(s.ys) for s in clients)} steps, "
          f"{report['per_server']} per server at first; scale-up moved {len(moved_up)}, "
          f"the drain {len(moved_out)}; a moved stream's wait: p50 {p50 * 1e3:.1f} ms, "
          f"p99 {p99 * 1e3:.1f} ms, max {max(waits) * 1e3:.1f} ms over {len(waits)} moves; "
          f"{time.monotonic() - started:.1f} s in all")
    assert len(waits) == len(moved_up) + len(moved_out) == sum(s.reconnects for s in clients)
    assert moved_up and moved_out
    assert p99 <= WAIT_P99, f"a moved stream's wait: p99 {p99 * 1e3:.1f} ms"


async def scenario(nginx, servers, clients, stack, serve):
    """Opens the streams, adds server d, drains server b, closes the streams;
    returns what the checks need."""
    def progress():
        return [len(s.ys) for s in clients]

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

    # scale-up: d joins the list; the ids that now hash to d move there, and only those
    servers["d"] = await thread(stack.enter_context, serve("d"))
    listed = [servers[name] for name in "abcd"]
    nginx.upstream(listed)
    await thread(nginx.reload)
    urls = [srv.http for srv in listed]
    moved_up = await thread(rebalance, nginx.http, urls, ADMIN)
    assert {m.target for m in moved_up} == {servers["d"].http}, moved_up
    assert await thread(rebalance, nginx.http, urls, ADMIN) == []
    await until(lambda: sum(s.reconnects for s in clients) == len(moved_up), "the reconnects")
    await step_on()

    # drain: b leaves the list; its streams move to the others, and no other stream moves
    leaving = servers["b"]
    with pytest.raises(RuntimeError, match="still routes"):    # the list still holds b
        await thread(drain, nginx.http, leaving.http, ADMIN, 0.2)
    listed = [servers[name] for name in "acd"]
    nginx.upstream(listed)
    await thread(nginx.reload)
    moved_out = await thread(drain, nginx.http, leaving.http, ADMIN)
    assert {m.source for m in moved_out} == {leaving.http}, moved_out
    assert leaving.http not in {await thread(owner, nginx.http, m.stream) for m in moved_out}
    assert await thread(rebalance, nginx.http, [srv.http for srv in listed], ADMIN) == []
    assert await thread(streams, leaving.http, ADMIN) == {}
    assert await thread(leaving.stop) == 0
    assert "saved 0 streams" in leaving.output(), leaving.output()[-2000:]
    await until(lambda: sum(s.reconnects for s in clients) == len(moved_up) + len(moved_out),
                "the reconnects")
    await step_on()

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
