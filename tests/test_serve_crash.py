"""Served streams that survive a crash: servers killed with SIGKILL, paused
with SIGSTOP, and a checkpoint store that goes away, with real processes
(fastln-serve, redis-server, nginx).

1. Killed mid-checkpoint: a server that writes checkpoints to a directory
   all the time is killed (SIGKILL) at random moments, three times; each
   restart on the directory loads every stream at a step between the last
   durable step its client heard of and the replies it received, and every
   stream goes on bit for bit.
2. Another server: a stream checkpointed to Redis by server A is taken over
   by server B when its client reconnects there (A killed: at once, since
   A's address refuses connections), at the checkpoint's step and state, and
   goes on bit for bit; while A lives and holds it, B refuses it (4409) until
   A stops (SIGTERM gives its streams up at once).
3. The clients replay: StreamClients (through nginx) and a MuxClient
   (through nginx's /mux) with ``resume``, on three servers behind nginx
   that share Redis; the server that holds the multiplexed connection is
   killed mid-run; every recv() returns each step's y once, bit for bit the
   stream run alone.
4. At scale, the load test's cluster runs: 256 streams in closed loops over
   three servers behind nginx, per-stream and multiplexed, one server killed
   (SIGKILL) partway: no stream lost, every reply bitwise the stream run
   alone, every step counted once; and Redis stopped for seconds under an
   open loop: no error, and the servers checkpoint again once it returns.
5. Two servers that both believe they own a stream: A is paused (SIGSTOP),
   its lease expires, B takes the stream over; A, resumed (SIGCONT), finds
   its lease lapsed, lets the stream go, and never writes over B's
   checkpoint; the stream goes on in B alone.
6. A network drop to a live server: the server has run steps whose replies
   went to the dead connection; the client's reconnect says how many it
   received, and the server rewinds each such stream to its last
   checkpoint (per stream, and several streams at different durable steps
   on /mux): every recv() gets each step's y once, bit for bit the stream
   run alone. received past the stream's t changes nothing; a bad one is
   refused (1008); a server without a store ignores it.

Skipped where redis-server is not installed, but a failure under CI=1, which
installs Debian's.
"""
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from fastln.rnn import LNLSTM

from _util import require, require_program

for _name in ("picows", "starlette", "uvicorn", "redis"):
    require(_name)

from fastln.serve.client import (  # noqa: E402
    Closed,
    MuxClient,
    StreamClient,
    request,
    run_server,
)
from fastln.serve.client.wire import Peer, mux_url, stream_url  # noqa: E402
from fastln.serve.loadtest.crash import cluster  # noqa: E402
from fastln.serve.loadtest.procs import RedisServer  # noqa: E402
from fastln.serve.model import save_model, stream_inputs  # noqa: E402

I, H, LAYERS = 8, 16, 2
CONF = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                    "nginx", "fastln.conf")
TOKENS = {}   # stream id -> resume token, across a test's servers
# a lease longer than a reconnect waits (20 s): a takeover under it shows that the
# owner was found dead, or had given the stream up, not that its lease ran out
LONG_LEASE = 600


@pytest.fixture(scope="module")
def redis_server():
    server = RedisServer(require_program("redis-server", "/usr/bin/redis-server")).start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("crash") / "m.npz"
    save_model(path, LNLSTM(I, H, LAYERS, seed=5))
    return path


def solo(model_file, xs):
    """The stream run alone: y of every step."""
    from fastln.serve.model import load_model
    m = load_model(model_file)
    ys, state = [], None
    for x in xs:
        y, state = m.step(x[None], state)
        ys.append(y[0])
    return ys


def server_args(model_file, redis_server, lease=LONG_LEASE):
    return ["--model", model_file, "--checkpoint-store", redis_server.url, "--advertise",
            "127.0.0.1", "--checkpoint-interval", "0.1", "--lease", lease]


async def steps(client, xs):
    out = []
    for x in xs:
        out.append(await client.step(x))
    return out


async def wait_durable(client, t, timeout=10.0):
    """Steps nothing; waits until a checkpoint holds the stream at t (the
    server's {"durable": t} frames come as text, which StreamClient keeps)."""
    deadline = time.monotonic() + timeout
    while client.durable is None or client.durable < t:
        assert time.monotonic() < deadline, f"no checkpoint at {t} (durable {client.durable})"
        await asyncio.sleep(0.02)


def bits(ys):
    return np.asarray(ys).view(np.uint32)


def streams_of(server):
    return request("GET", server.http + "/streams")[1]["streams"]


def test_kills_mid_checkpoint_leave_whole_checkpoints(tmp_path):
    path = tmp_path / "big.npz"
    save_model(path, LNLSTM(I, 256, 2, seed=9))
    n, rounds, steps = 24, 3, 400
    xs = [stream_inputs(4, i, steps, I) for i in range(n)]
    want = [solo(path, x) for x in xs]
    ys = [[] for _ in range(n)]
    tokens, durable = [None] * n, [0] * n
    rng = random.Random(0)
    args = ["--model", path, "--checkpoint-dir", tmp_path / "ckpt", "--checkpoint-interval",
            "0.01"]

    async def stream(server, i, stop):
        new = tokens[i] is None
        c = await StreamClient.connect(server.ws, f"k{i}", new=new, token=tokens[i])
        tokens[i], t0 = c.token, c.hello["t"]
        assert durable[i] <= t0 <= len(ys[i]), (i, durable[i], t0, len(ys[i]))
        t = t0
        with contextlib.suppress(Closed):
            while t < steps and not stop.is_set():
                y = await c.step(xs[i][t])
                if t < len(ys[i]):       # a step after the checkpoint, sent again
                    assert np.array_equal(bits(y), bits(ys[i][t])), (i, t)
                else:
                    ys[i].append(y)
                t += 1
                durable[i] = max(durable[i], c.durable or 0)
        return c

    async def main(server, kill):
        stop = asyncio.Event()
        tasks = [asyncio.ensure_future(stream(server, i, stop)) for i in range(n)]
        if kill:
            await asyncio.sleep(rng.uniform(0.3, 0.8))
            server.proc.kill()        # mid-write, often: a write every 10 ms
            server.proc.wait()
        clients = await asyncio.gather(*tasks)
        if not kill:
            for c in clients:
                await c.close(1000)

    for k in range(rounds + 1):
        with run_server(*args) as server:
            asyncio.run(asyncio.wait_for(main(server, k < rounds), 120))
    for i in range(n):
        assert len(ys[i]) == steps and np.array_equal(bits(ys[i]), bits(want[i])), i


def test_another_server_takes_a_killed_servers_stream_over(model_file, redis_server):
    xs = stream_inputs(1, 0, 30, I)
    want = solo(model_file, xs)
    with run_server(*server_args(model_file, redis_server)) as a, \
            run_server(*server_args(model_file, redis_server)) as b:
        async def main():
            c = await StreamClient.connect(a.ws, "s-1", new=True)
            got = await steps(c, xs[:10])
            await wait_durable(c, 10)
            # A lives and holds it: B refuses it, with 4409, and does not take it
            with pytest.raises(Closed) as e:
                await StreamClient.connect(b.ws, "s-1", token=c.token, timeout=20)
            assert e.value.code == 4409, e.value
            got += await steps(c, xs[10:14])       # after the checkpoint: lost in the crash
            a.proc.kill()
            a.proc.wait()
            # A's address refuses connections: B takes the stream at once, its lease notwithstanding
            c2 = await StreamClient.connect(b.ws, "s-1", token=c.token, timeout=20)
            assert (c2.hello["t"], c2.hello["durable"]) == (10, 10), c2.hello
            again = await steps(c2, xs[10:30])      # the client replays steps 10..13
            assert np.array_equal(bits(again[:4]), bits(got[10:14]))
            with pytest.raises(Closed) as e:
                await StreamClient.connect(b.ws, "s-1", token="not-the-token")
            assert e.value.code == 4403
            await c2.close(1001)
            return got[:10] + again, c.token
        got, token = asyncio.run(asyncio.wait_for(main(), 120))
        assert np.array_equal(bits(got), bits(want))
        assert list(streams_of(b)) == ["s-1"]
        # SIGTERM writes the streams and gives them up: a third server takes them at once
        assert b.stop() == 0
    with run_server(*server_args(model_file, redis_server)) as c:
        async def resume():
            c3 = await StreamClient.connect(c.ws, "s-1", token=token, timeout=20)
            assert (c3.hello["t"], c3.hello["durable"]) == (30, 30), c3.hello
            await c3.close(1000)       # ends the stream: the store forgets it
        asyncio.run(asyncio.wait_for(resume(), 60))


def test_the_clients_replay_through_a_kill_behind_nginx(model_file):
    require_program("nginx", "/usr/sbin/nginx")
    require_program("redis-server", "/usr/bin/redis-server")
    n, steps, pause = 12, 300, 0.005     # paced: the kill comes while they step
    xs = [stream_inputs(5, i, steps, I) for i in range(2 * n)]
    want = [solo(model_file, x) for x in xs]
    with cluster(model_file, [], CONF, interval=0.1, lease=5.0) as (_, servers, nginx):
        async def per_stream(i, half):
            c = await StreamClient.connect(nginx.ws, f"r{i}", new=True, resume=30)
            out = []
            for t in range(steps):
                c.send(xs[i][t])
                if t % 3 == 2 or t == steps - 1:      # three in flight
                    while c.pending:
                        out.append(await c.recv())
                    await asyncio.sleep(pause)
                if t == steps // 2:
                    half.set()
            await c.close(1000)
            return out

        async def multiplexed(half, ready):
            m = await MuxClient.connect(nginx.ws, resume=30)
            ids = [f"m{i}" for i in range(n)]
            await m.open(ids, new=True)
            ready.set_result(m)
            out = []
            for t in range(steps):
                m.send(ids, np.stack([xs[n + i][t] for i in range(n)]))
                out.append(await m.recv())
                await asyncio.sleep(pause)
                if t == steps // 2:
                    half.set()
            await m.close(1000)
            return np.stack(out, axis=1)      # (streams, steps, H)

        async def main():
            halves = [asyncio.Event() for _ in range(n + 1)]
            ready = asyncio.get_running_loop().create_future()
            tasks = [asyncio.ensure_future(per_stream(i, halves[i])) for i in range(n)]
            tasks.append(asyncio.ensure_future(multiplexed(halves[n], ready)))
            await ready
            for h in halves:
                await h.wait()
            await asyncio.sleep(0.25)         # a checkpoint or two past the half
            held = [set(streams_of(s)) for s in servers]
            victim = next(s for s, ids in zip(servers, held) if "m0" in ids)
            victim.proc.kill()
            return await asyncio.gather(*tasks)
        got = asyncio.run(asyncio.wait_for(main(), 180))
    for i in range(n):
        assert len(got[i]) == steps and np.array_equal(bits(got[i]), bits(want[i])), i
    for i in range(n):
        assert np.array_equal(bits(got[n][i]), bits(want[n + i])), n + i


def test_the_load_tests_cluster_runs():
    require_program("nginx", "/usr/sbin/nginx")
    require_program("redis-server", "/usr/bin/redis-server")
    done = subprocess.run(
        [sys.executable, "-m", "fastln.serve.loadtest", "--runs", "crash,mux-crash,outage",
         "--dtypes", "float32", "--crash-streams", "256", "--crash-steps", "150", "--outage",
         "2", "--checkpoint-interval", "0.5", "--no-write", "--nginx-conf", CONF],
        capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    rows = {m[0]: m[1:] for m in re.findall(
        r"^\| (crash|mux-crash|outage) \| float32 \| (\d+) \|.*\| (\d+) \| (\d+) \| (\d+) \|$",
        out, re.MULTILINE)}
    assert set(rows) == {"crash", "mux-crash", "outage"}, out[-3000:]
    for name, (streams, errors, mismatches, lost) in rows.items():
        assert (streams, errors, mismatches, lost) == ("256", "0", "0", "0"), (name, out)
    moved = [int(n) for n in re.findall(r"killed a server that held \d+ streams; (\d+) moved",
                                        out)]
    assert len(moved) == 2 and min(moved) > 0, out[-3000:]
    assert re.search(r"Redis down 2 s: [1-9]\d* checkpoint writes failed; every server "
                     r"checkpointed again \d+\.\d+ s", out), out[-3000:]


def test_a_paused_owner_lets_go_of_what_another_took(model_file, redis_server):
    """SIGSTOP: two servers that both believe they own a stream."""
    xs = stream_inputs(2, 0, 24, I)
    want = solo(model_file, xs)
    with run_server(*server_args(model_file, redis_server, 1.0)) as a, \
            run_server(*server_args(model_file, redis_server, 1.0)) as b:
        async def main():
            c = await StreamClient.connect(a.ws, "p-1", new=True)
            TOKENS["p-1"] = c.token
            got = await steps(c, xs[:8])
            await wait_durable(c, 8)
            os.kill(a.proc.pid, signal.SIGSTOP)
            try:
                # A's address accepts connections (the kernel's), so B waits out A's lease
                c2 = await StreamClient.connect(b.ws, "p-1", token=c.token, timeout=20)
                assert c2.hello["t"] == 8, c2.hello
                got += await steps(c2, xs[8:16])
                await wait_durable(c2, 16)
            finally:
                os.kill(a.proc.pid, signal.SIGCONT)
            # A resumes: its lease lapsed; it lets the stream go and writes nothing over B's
            deadline = time.monotonic() + 10
            while "p-1" in streams_of(a):
                assert time.monotonic() < deadline, "A still holds the stream B took"
                await asyncio.sleep(0.05)
            got += await steps(c2, xs[16:24])
            await wait_durable(c2, 24)
            await asyncio.sleep(0.5)       # A's next checkpoints, were it to write any
            await c2.close(1001)
            return got
        got = asyncio.run(asyncio.wait_for(main(), 120))
        assert np.array_equal(bits(got), bits(want))
        assert list(streams_of(b)) == ["p-1"] and "p-1" not in streams_of(a)
        assert b.stop() == 0
    # the store holds B's last checkpoint, not one of A's: a third server resumes at 24
    with run_server(*server_args(model_file, redis_server)) as c:
        async def resume():
            c3 = await StreamClient.connect(c.ws, "p-1", token=TOKENS["p-1"], timeout=20)
            assert c3.hello["t"] == 24, c3.hello
            await c3.close(1000)
        asyncio.run(asyncio.wait_for(resume(), 60))


# ---- 6. a network drop to a live server ----------------------------------------
# a checkpoint after every 10 steps of the server, and no other: none comes
# between the replies that a drop loses and the drop, so the rewinds are sure
DROP_ARGS = ["--checkpoint-interval", 600, "--checkpoint-steps", 10]


def until_server_ran(server, want):
    """Blocks the event loop (the client reads no reply meanwhile) until the
    server has answered the steps want ({id: t}) says."""
    deadline = time.monotonic() + 10
    while any(streams_of(server).get(sid) != t for sid, t in want.items()):
        assert time.monotonic() < deadline, (streams_of(server), want)
        time.sleep(0.005)


def metrics(server):
    with urllib.request.urlopen(server.http + "/metrics", timeout=30) as r:
        return r.read().decode()


def rewinds(server):
    return float(re.search(r"^fastln_serve_rewinds_total (\S+)$", metrics(server), re.M)[1])


async def hello_of(url):
    """The hello of a connection to url, closed with 1001 (the stream stays)."""
    peer = Peer()
    hello = await peer.connect(url)
    await peer.close(1001)
    return hello


def test_a_dropped_connection_rewinds_to_the_last_checkpoint(model_file, tmp_path):
    xs = stream_inputs(6, 0, 30, I)
    want = solo(model_file, xs)
    with run_server("--model", model_file, "--checkpoint-dir", tmp_path / "ckpt",
                    *DROP_ARGS) as server:
        async def main():
            c = await StreamClient.connect(server.ws, "d-1", new=True, resume=30)
            got = await steps(c, xs[:10])
            await wait_durable(c, 10)
            for x in xs[10:15]:
                c.send(x)
            until_server_ran(server, {"d-1": 15})
            c._peer.abort()                 # the replies of steps 10..14 are lost
            got += [await c.recv() for _ in range(5)]
            assert c.hello["t"] == 10 and c.closed is None and rewinds(server) == 1
            await wait_durable(c, 15)       # the replay's steps: a checkpoint at 15
            for x in xs[15:20]:             # dropped at once: they run, or are lost with it
                c.send(x)
            c._peer.abort()
            got += [await c.recv() for _ in range(5)]
            got += await steps(c, xs[20:25])
            await c.close(1001)
            # received past the stream's t (a server that restored an older checkpoint)
            hello = await hello_of(stream_url(server.ws, "d-1", token=c.token, received=99))
            assert hello["t"] == 25, hello
            c2 = await StreamClient.connect(server.ws, "d-1", token=c.token)
            got += await steps(c2, xs[25:])
            await c2.close(1000)
            return got
        got = asyncio.run(asyncio.wait_for(main(), 60))
    assert len(got) == 30 and np.array_equal(bits(got), bits(want))


def test_a_dropped_mux_connection_rewinds_each_stream(model_file, tmp_path):
    ids = ["e0", "e1", "e2"]
    xs = {sid: stream_inputs(7, i, 40, I) for i, sid in enumerate(ids)}
    want = {sid: solo(model_file, x) for sid, x in xs.items()}
    got = {sid: [] for sid in ids}
    with run_server("--model", model_file, "--checkpoint-dir", tmp_path / "ckpt",
                    *DROP_ARGS) as server:
        async def main():
            m = await MuxClient.connect(server.ws, resume=30)
            await m.open(ids, new=True)
            sent, pending = dict.fromkeys(ids, 0), []

            def send(names):
                m.send(names, np.stack([xs[s][sent[s]] for s in names]))
                pending.append(names)
                for s in names:
                    sent[s] += 1

            async def receive():
                while pending:
                    names, y = pending.pop(0), await m.recv()
                    for s, row in zip(names, y):
                        got[s].append(row)

            async def durable(want_t):
                deadline = time.monotonic() + 10
                while any(m.streams[s].durable != t for s, t in want_t.items()):
                    assert time.monotonic() < deadline, {s: m.streams[s].durable for s in ids}
                    await asyncio.sleep(0.01)
            for _ in range(4):              # 12 steps: a checkpoint of each at 4
                send(ids)
            await receive()
            await durable({"e0": 4, "e1": 4, "e2": 4})
            for names in [["e0", "e1"]] * 2 + [["e0"]] * 6:   # 10 steps: at 12, 6 (and 4)
                send(names)
            await receive()
            await durable({"e0": 12, "e1": 6, "e2": 4})
            for _ in range(2):
                send(ids)
            until_server_ran(server, {"e0": 14, "e1": 8, "e2": 6})
            m._peer.abort()                 # 2 replies of each are lost
            await receive()
            assert rewinds(server) == 3 and m.closed is None
            await durable({"e0": 14, "e1": 8, "e2": 6})   # the replay's: at 14, 8, 6
            for _ in range(2):              # dropped at once: they run, or are lost with it
                send(ids)
            m._peer.abort()
            await receive()
            for _ in range(3):
                send(ids)
            await receive()
            await m.close(1001)
            # received past a stream's t changes nothing
            peer = Peer()
            await peer.connect(mux_url(server.ws))
            answers = asyncio.Queue()
            peer.on_text = answers.put_nowait
            peer.send_frame(json.dumps({"open": [{"stream": "e0", "token": m.tokens["e0"],
                                                  "received": 99}]}).encode(), text=True)
            answer = await answers.get()
            while "durable" in answer:      # a checkpoint's, which may come first
                answer = await answers.get()
            (entry,) = answer["opened"]
            assert entry["t"] == 19, entry
            await peer.close(1000)
        asyncio.run(asyncio.wait_for(main(), 60))
    for s in ids:
        n = len(got[s])
        assert n == {"e0": 19, "e1": 13, "e2": 11}[s]
        assert np.array_equal(bits(got[s]), bits(want[s][:n])), s


def test_received_is_checked_and_a_server_without_a_store_ignores_it(model_file):
    with run_server("--model", model_file) as server:
        async def main():
            c = await StreamClient.connect(server.ws, "n-1", new=True)
            await steps(c, stream_inputs(8, 0, 3, I))
            await c.close(1001)
            hello = await hello_of(stream_url(server.ws, "n-1", token=c.token, received=0))
            assert hello["t"] == 3, hello
            for query in ("received=-1", "received=x", "received=99999999999999999999",
                          "new=1&received=0"):
                with pytest.raises(Closed) as e:
                    await hello_of(f"{server.ws}/ws/n-2?token={c.token}&{query}")
                assert e.value.code == 1008 and "received" in e.value.message, (query, e.value)
            peer = Peer()
            await peer.connect(mux_url(server.ws))
            answers = asyncio.Queue()
            peer.on_text = answers.put_nowait
            bad = [-1, "3", True, 1.0]
            peer.send_frame(json.dumps({"open": [
                {"stream": "n-1", "token": c.token, "received": r} for r in bad] + [
                {"stream": "n-3", "new": True, "received": 0}]}).encode(), text=True)
            entries = (await answers.get())["opened"]
            assert [e["code"] for e in entries] == [1008] * 5, entries
            assert all("received" in e["error"] for e in entries), entries
            await peer.close(1000)
        asyncio.run(asyncio.wait_for(main(), 60))
        assert "rewinds" not in metrics(server)
