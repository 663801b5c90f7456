"""The multiplexed protocol of the served model (fastln.serve.ws.mux): many
streams on one WebSocket, the steps of several streams in one frame.

1. Results: streams on several multiplexed connections, frames of random
   subsets of them with several frames in flight, beside per-stream
   connections: every reply row equals, bit for bit, the stream run alone,
   for float32, bfloat16 (bfloat16 x frames too) and int8 models; a step of
   more streams than --max-frame holds goes as several frames.
2. Order: answers come in the order of the client's frames, even when the
   batcher runs a later frame first; a stream's steps keep their order with
   its single steps (HTTP); the hello, the frame encoding and the limits; a
   stream taken over while the steps of its dropped connection run is
   greeted (hello, or open's answer) once they are answered, with their t.
3. Bad frames and refused opens: each gets its close code (or its
   per-stream refusal code) and a message, the server goes on, and the
   streams resume bit for bit at the t of the steps the server ran.
4. Leaving: close ends streams, detach keeps them for another connection
   (multiplexed or not), a WebSocket close 1000 ends every stream attached
   and 1001 keeps them; an export tells the client (a gone notice), refuses
   the frames that name the stream, and leaves the others running.
5. Restarts and moves: SIGTERM with frames in flight closes with 1012 after
   every taken step is answered; after a restart the streams reopen with
   their tokens at their t and continue bit for bit; a stream moved to
   another server continues there.

The load generator's multiplexed runs check every reply in
tests/test_cli_papercuts.py's --quick run.
"""
import asyncio
import json
import urllib.request

import numpy as np
import pytest

from fastln.rnn import LNLSTM, quantize

from _util import require

for _name in ("picows", "starlette", "uvicorn", "ml_dtypes"):
    require(_name)

import ml_dtypes  # noqa: E402

from fastln.serve import model as serve_model  # noqa: E402
from fastln.serve.client import (  # noqa: E402
    Closed,
    FrameRefused,
    MuxClient,
    StreamClient,
    move_stream,
    request,
    run_server,
)
from fastln.serve.frames import encode, frame_bytes, header_bytes  # noqa: E402
from fastln.serve.service import Service  # noqa: E402
from fastln.serve.ws import mux, stream  # noqa: E402

I, H, LAYERS = 12, 24, 2


def bits(a):
    return np.asarray(a).astype(np.float64).view(np.uint64)


def same(a, b):
    return np.array_equal(bits(a), bits(b))


def inputs(n, steps, seed=0):
    return [serve_model.stream_inputs(seed, i, steps, I) for i in range(n)]


def run(coro, timeout=90):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def saved(tmp_path, model, name="m.npz"):
    path = tmp_path / name
    serve_model.save_model(path, model)
    return path


def make_model(dtype):
    model = LNLSTM(I, H, LAYERS, seed=7)
    if dtype == "bfloat16":
        return model.to(ml_dtypes.bfloat16)
    return quantize(model) if dtype == "int8" else model


@pytest.fixture(scope="module", params=["float32", "bfloat16", "int8"])
def served(request, tmp_path_factory):
    """(server, in-process model, x dtype of the frames)."""
    model = make_model(request.param)
    path = saved(tmp_path_factory.mktemp("mux"), model)
    with run_server("--model", path, "--threads", 1, "--capacity", 64,
                    "--max-queue-per-stream", 8, "--max-frame", 4096,
                    "--max-streams-per-connection", 16) as server:
        yield server, model, "bfloat16" if request.param == "bfloat16" else "float32"


# ---------------------------------------------------------------- 1. results

def test_streams_on_multiplexed_connections_match_each_stream_alone(served):
    server, model, dtype = served
    n_mux, per_conn, n_single, T = 3, 5, 3, 12
    xs = inputs(n_mux * per_conn + n_single, T, seed=1)
    wants = [serve_model.reference_run(model, x) for x in xs]
    xdt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32

    async def conn_run(c):
        rng = np.random.default_rng(c)
        async with await MuxClient.connect(server.ws, dtype=dtype) as m:
            ids = [f"m{c}-{k}" for k in range(per_conn)]
            entries = await m.open(ids, new=True)
            assert [e["index"] for e in entries] == list(range(per_conn))
            got = {sid: [] for sid in ids}
            nxt = dict.fromkeys(ids, 0)
            sent = []
            while any(v < T for v in nxt.values()):
                left = [sid for sid in ids if nxt[sid] < T]
                pick = list(rng.choice(left, size=rng.integers(1, len(left) + 1),
                                       replace=False))
                x = np.stack([xs[c * per_conn + ids.index(s)][nxt[s]] for s in pick])
                m.send(pick, x.astype(xdt))
                sent.append(pick)
                for s in pick:
                    nxt[s] += 1
                if m.pending >= 3:
                    ys = await m.recv()
                    for s, y in zip(sent.pop(0), ys):
                        got[s].append(y.copy())
            while m.pending:
                ys = await m.recv()
                for s, y in zip(sent.pop(0), ys):
                    got[s].append(y.copy())
            assert {s: m.streams[s].t for s in ids} == dict.fromkeys(ids, T)
        return [got[s] for s in ids]

    async def single_run(k):
        async with await StreamClient.connect(server.ws, f"one{k}", new=True,
                                              dtype=dtype) as c:
            return [(await c.step(x.astype(xdt))).copy() for x in xs[n_mux * per_conn + k]]

    async def main():
        return await asyncio.gather(*(conn_run(c) for c in range(n_mux)),
                                    *(single_run(k) for k in range(n_single)))
    before = server.health()["batcher"]
    results = run(main())
    got = [g for r in results[:n_mux] for g in r] + results[n_mux:]
    for g, want in zip(got, wants):
        assert same(np.stack(g), want)
    after = server.health()
    assert after["batcher"]["batch_max"] > 1
    assert after["batcher"]["steps"] - before["steps"] == len(xs) * T
    assert after["streams"] == 0            # every close was 1000


def test_a_step_past_max_frame_goes_as_several_frames(served):
    server, model, dtype = served
    xdt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    n, T = 16, 3
    xs = inputs(n, T, seed=2)
    wants = [serve_model.reference_run(model, x) for x in xs]

    async def main():
        async with await MuxClient.connect(server.ws, dtype=dtype) as m:
            assert m.hello["max_frame"] == 4096
            # 16 rows of 12 float32 x fit 4096 bytes; force several frames
            m.rows_per_frame = 5
            ids = [f"wide{k}" for k in range(n)]
            await m.open(ids, new=True)
            return [await m.step(ids, np.stack([x[t] for x in xs]).astype(xdt))
                    for t in range(T)]
    ys = run(main())
    for k in range(n):
        assert same(np.stack([y[k] for y in ys]), wants[k])


def test_hello_and_frame_encoding():
    assert [header_bytes(n) for n in (1, 2, 3, 4)] == [8, 16, 16, 24]
    frame = encode([7, 2], np.ones((2, 3), np.float32))
    assert len(frame) == frame_bytes(2, 12) == 16 + 24
    head = np.frombuffer(frame[:16], "<u4")
    assert head.tolist() == [2, 7, 2, 0]
    assert np.frombuffer(frame[16:], np.float32).tolist() == [1.0] * 6


# ---------------------------------------------------------------- 2. order, in process

class FakeTransport:
    """What a Connection sends, kept: (kind, bytes), and its close."""

    def __init__(self):
        self.sent, self.closed = [], None

    @property
    def is_close_frame_sent(self):
        return self.closed is not None

    def send(self, kind, data):
        self.sent.append((kind, bytes(data)))

    def send_close(self, code, reason=b""):
        self.closed = (int(code), reason.decode())

    def disconnect(self):
        pass

    def texts(self):
        return [json.loads(d) for k, d in self.sent if k == mux.TEXT]


async def inproc(model, capacity=16, max_streams=4, max_batch=256):
    """A Service and an in-process multiplexed Connection on a FakeTransport."""
    svc = Service(model, capacity=capacity, max_batch=max_batch,
                  max_streams_per_connection=max_streams)
    conn = mux.Connection(svc)
    conn.on_ws_connected(FakeTransport())
    return svc, conn


async def until(cond, timeout=10):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.001)


def test_answers_keep_the_order_of_the_frames_and_single_steps_keep_theirs():
    """Stream a has two single steps (as over HTTP) waiting when frame F1 [a]
    and frame F2 [b] come: the batcher runs F2 first, with a's first single
    step, and F1 two batches later; F2's answer still goes after F1's, and
    a's rows are its third step."""
    model = LNLSTM(I, H, seed=3)
    xs = inputs(2, 3, seed=3)
    wants = [serve_model.reference_run(model, x) for x in xs]

    async def main():
        svc, conn = await inproc(model)
        conn.control(json.dumps({"open": [{"stream": "a", "new": True},
                                          {"stream": "b", "new": True}]}).encode())
        tr = conn.transport
        await until(lambda: len(tr.sent) == 2)
        a = svc.streams["a"]
        singles = []

        def answered(y, error):
            svc.finish((a,), error)
            return a.t - 1, y.copy()
        for t in range(2):
            svc.submit((a,), xs[0][t], lambda y, e: singles.append(answered(y, e)))
        conn.step(encode([0], xs[0][2:3]))
        conn.step(encode([1], xs[1][0:1]))
        await until(lambda: len(tr.sent) == 4)
        sizes = dict(svc.batcher.metrics()["batch_sizes"])
        await svc.batcher.aclose()
        return tr, singles, sizes, a.t, svc.streams["b"].t

    tr, singles, sizes, ta, tb = run(main())
    hello, opened = tr.texts()
    assert hello["mux"] == 1 and hello["input_size"] == I and hello["max_streams"] == 4
    assert [e["index"] for e in opened["opened"]] == [0, 1]
    y1, y2 = (np.frombuffer(d, np.float32) for _, d in tr.sent[2:])
    assert same(y1, wants[0][2]) and same(y2, wants[1][0])
    assert [t for t, _ in singles] == [0, 1]
    assert all(same(y, wants[0][t]) for t, y in singles)
    assert sizes.get(2) == 1 and (ta, tb) == (3, 1)      # F2 ran with a's first step


def test_a_gone_stream_is_told_and_its_frames_refused_until_closed():
    model = LNLSTM(I, H, seed=4)
    xs = inputs(2, 4, seed=4)
    wants = [serve_model.reference_run(model, x) for x in xs]

    async def main():
        svc, conn = await inproc(model)
        tr = conn.transport
        conn.control(b'{"open": [{"stream": "a", "new": true}, {"stream": "b", "new": true}]}')
        await until(lambda: len(tr.sent) == 2)
        conn.step(encode([0, 1], np.stack([xs[0][0], xs[1][0]])))
        exported = asyncio.ensure_future(svc.export("a"))   # while the frame runs
        await asyncio.sleep(0)
        conn.step(encode([1, 0], np.stack([xs[1][1], xs[0][1]])))   # a is leaving
        payload = await exported
        conn.step(encode([0], xs[0][1:2]))                          # a is gone
        conn.step(encode([1], xs[1][1:2]))                          # b goes on
        await until(lambda: len(tr.sent) == 7)
        conn.control(b'{"close": [0]}')                     # frees index 0
        conn.control(b'{"open": [{"stream": "c", "new": true}]}')
        await until(lambda: len(tr.sent) == 9)
        await svc.batcher.aclose()
        return tr, payload, svc

    tr, payload, svc = run(main())
    kinds = [k for k, _ in tr.sent]
    texts = iter(tr.texts()[2:])
    assert kinds[2] == mux.BINARY                                # the first frame, answered
    y = np.frombuffer(tr.sent[2][1], np.float32).reshape(2, H)
    assert same(y[0], wants[0][0]) and same(y[1], wants[1][0])
    assert next(texts)["refused"]["code"] == 4410                # the frame while a left
    gone = next(texts)["gone"]
    assert gone == [{"index": 0, "stream": "a", "t": 1, "code": 4410,
                     "error": "the stream was exported to another server"}]
    assert next(texts)["refused"] == {"index": 0, "stream": "a", "code": 4410,
                                      "error": "stream 'a' left this server"}
    assert kinds[6] == mux.BINARY
    assert same(np.frombuffer(tr.sent[6][1], np.float32), wants[1][1])
    assert next(texts) == {"closed": [{"index": 0, "stream": "a", "t": 1}]}
    assert next(texts)["opened"][0]["index"] == 0
    assert payload["t"] == 1 and "a" not in svc.streams and tr.closed is None


def test_a_stream_taken_over_while_its_steps_run_is_greeted_with_their_count():
    """A stream whose connection drops with steps in flight, taken over at
    once by a connection of each protocol in turn: the hello (a connection
    per stream) or the open's answer (multiplexed) waits until those steps
    are answered, and its t counts them."""
    model = LNLSTM(I, H, seed=5)
    xs = inputs(1, 5, seed=5)[0]

    async def take_over(svc, conn, steps):
        """Submits steps of conn's stream, drops conn, and returns the stream."""
        a = svc.streams["a"]
        for x in steps:
            svc.submit((a,), x, lambda y, e: svc.finish((a,), e))
        conn.on_ws_disconnected(conn.transport)
        return a

    async def main():
        svc = Service(model)
        first = stream.Connection(svc, "a", new=True)
        first.on_ws_connected(FakeTransport())
        token = json.loads(first.transport.sent[0][1])["token"]
        a = await take_over(svc, first, xs[:3])
        second = stream.Connection(svc, "a", token=token)
        second.on_ws_connected(FakeTransport())
        early = list(second.transport.sent)       # the steps run in the batcher's thread
        await until(lambda: second.transport.sent)
        hello = json.loads(second.transport.sent[0][1])
        await take_over(svc, second, xs[3:])
        conn = mux.Connection(svc)
        conn.on_ws_connected(FakeTransport())
        conn.control(json.dumps({"open": [{"stream": "a", "token": token}]}).encode())
        opened = list(conn.transport.sent)
        await until(lambda: len(conn.transport.sent) == 2)
        await svc.batcher.aclose()
        return early, hello, opened, conn.transport.texts()[1], a.t

    early, hello, opened, answer, t = run(main())
    assert early == [] and hello["t"] == 3
    assert len(opened) == 1 and answer["opened"][0]["t"] == 5 == t


# ---------------------------------------------------------------- 3. bad frames

async def close_of(url, payloads=(), text=False, fragment=False, dtype="float32",
                   tokens=None, ids=("victim",)):
    """Attaches ids, sends raw frames, then a good step; the Closed that
    ends the connection."""
    m = await MuxClient.connect(url, dtype=dtype)
    await m.open(list(ids), tokens=tokens)
    for p in payloads:
        if fragment:
            m._peer.transport.send(mux.BINARY, p, False)
        else:
            m.send_frame(p, text)
    try:
        await asyncio.wait_for(m.step([ids[0]], np.zeros((1, I), np.float32)), 10)
    except Closed as e:
        return e
    raise AssertionError("the server did not close the connection")


def test_bad_frames_get_close_codes_and_the_streams_resume(tmp_path):
    model = LNLSTM(I, H, seed=5)
    path = saved(tmp_path, model)
    xs = inputs(2, 4, seed=5)
    wants = [serve_model.reference_run(model, x) for x in xs]
    x_bytes = 4 * I

    async def main(url):
        m = await MuxClient.connect(url)
        await m.open(["victim", "other"], new=True)
        y0 = await m.step(["victim", "other"], np.stack([xs[0][0], xs[1][0]]))
        tokens = dict(m.tokens)
        await m.close(1001)
        nan = np.zeros((1, I), np.float32)
        nan[0, 5] = np.nan
        codes = {}
        for name, frames in {
                "short": [b"\1\0\0\0"],
                "no steps": [bytes(8)],
                "wrong length": [encode([0], np.zeros((1, I), np.float32))[:-4]],
                "unknown index": [encode([3], np.zeros((1, I), np.float32))],
                "index twice": [encode([0, 0], np.zeros((2, I), np.float32))],
                "nan": [encode([0], nan)],
                "inf": [encode([0], np.full((1, I), np.inf, np.float32))],
                "oversized": [bytes(5000)]}.items():
            codes[name] = await close_of(url, frames, tokens=tokens)
        for name, text in {"not json": b"{", "bad verb": b'{"step": []}',
                           "close unknown": b'{"close": [9]}'}.items():
            codes[name] = await close_of(url, [text], text=True, tokens=tokens)
        codes["fragment"] = await close_of(url, [bytes(8)], fragment=True, tokens=tokens)
        try:
            await MuxClient.connect(url, dtype="int8")
        except Closed as e:
            codes["bad dtype"] = e
        # none of them ran a step: each stream goes on from t = 1
        async with await MuxClient.connect(url) as m:
            entries = await m.open(["victim", "other"], tokens=tokens)
            y1 = await m.step(["other", "victim"], np.stack([xs[1][1], xs[0][1]]))
        return codes, y0, entries, y1

    with run_server("--model", path, "--max-frame", 4096) as server:
        codes, y0, entries, y1 = run(main(server.ws))
        assert server.health()["status"] == "ok"
    expect = {
        "short": (1007, "a frame holds at least 8 bytes"),
        "no steps": (1007, "at least one step: n is 0"),
        "wrong length": (1007, f"a frame of n = 1 steps is {8 + x_bytes} bytes (8 of header "
                               f"and 1 x rows of {I} float32 values), got {4 + x_bytes}"),
        "unknown index": (1008, "index 3 holds no stream on this connection"),
        "index twice": (1007, "index 0 appears twice in one frame"),
        "nan": (1007, "x of index 0 (row 0) is not finite at [5]"),
        "inf": (1007, "x of index 0 (row 0) is not finite at [0]"),
        "oversized": (1009, ""),
        "not json": (1008, "a text frame must be JSON"),
        "bad verb": (1008, "a control message is"),
        "close unknown": (1008, "close takes the indices of streams attached here, got 9"),
        "fragment": (1003, "not in fragments"),
        "bad dtype": (1008, "dtype must be one of float32")}
    for name, (code, message) in expect.items():
        assert codes[name].code == code, (name, codes[name])
        assert message in codes[name].message, (name, codes[name].message)
    assert [e["t"] for e in entries] == [1, 1]
    assert same(y0[0], wants[0][0]) and same(y0[1], wants[1][0])
    assert same(y1[0], wants[1][1]) and same(y1[1], wants[0][1])


def test_refused_opens_get_the_per_stream_codes(tmp_path):
    path = saved(tmp_path, LNLSTM(I, H, seed=6))

    async def main(url):
        m = await MuxClient.connect(url)
        first = await m.open(["a", "b"], new=True)
        holder = await StreamClient.connect(url, "held", new=True)
        other = await MuxClient.connect(url)
        refusals = await other.open(["a"], new=True)                      # exists
        refusals += await other.open(["a"])                               # no token
        refusals += await other.open(["a"], tokens={"a": "x" * 32})       # wrong token
        refusals += await other.open(["nobody"], tokens={"nobody": "x"})  # no such stream
        refusals += await other.open(["a"], tokens=m.tokens)              # m holds it
        refusals += await other.open(["held"], tokens={"held": holder.token})
        refusals += await other.open(["x" * 65], new=True)                # a bad id
        refusals += await m.open(["c", "d", "e"], new=True)               # the limit is 3
        refusals += await other.open(["f", "g"], new=True)                # the table is full
        await holder.close()
        await other.close()
        await m.close()
        return first, refusals

    with run_server("--model", path, "--capacity", 5, "--max-streams-per-connection",
                    3) as server:
        first, refusals = run(main(server.ws))
    assert [e["index"] for e in first] == [0, 1]
    got = [(e.get("code"), e.get("error", "")) for e in refusals]
    expect = [(4409, "stream 'a' exists"), (4401, "needs its resume token"),
              (4403, "not the resume token of stream 'a'"), (4404, "no stream 'nobody' here"),
              (4409, "another connection holds stream 'a'"),
              (4409, "another connection holds stream 'held'"),
              (1008, "a stream id is 1 to 64"), (None, ""),
              (1013, "this connection holds 3 streams, the server's "
                     "--max-streams-per-connection"),
              (1013, "this connection holds 3 streams"), (None, ""),
              (1013, "the server holds 5 streams, its --capacity")]
    assert len(got) == len(expect)
    for (code, message), (want_code, want_message) in zip(got, expect):
        assert code == want_code and want_message in message, (code, message)
    assert refusals[7]["index"] == 2 and refusals[10]["index"] == 0


def test_a_flood_of_frames_closes_with_1013_and_counts(tmp_path):
    """More frames of one connection waiting than --max-queue-per-stream:
    1013; the steps taken are counted in the streams' t, and the refusals
    in /metrics."""
    model = LNLSTM(I, H, seed=7)
    path = saved(tmp_path, model)
    xs = inputs(2, 40, seed=7)
    wants = [serve_model.reference_run(model, x) for x in xs]

    async def main(url):
        m = await MuxClient.connect(url)
        await m.open(["a", "b"], new=True)
        for t in range(40):                       # in one go: 2 may wait
            m.send(["a", "b"], np.stack([xs[0][t], xs[1][t]]))
        got = []
        try:
            while True:
                got.append((await m.recv()).copy())
        except Closed as e:
            flood = e
        async with await MuxClient.connect(url) as m2:
            entries = await m2.open(["a", "b"], tokens=m.tokens)
            t = entries[0]["t"]
            y = await m2.step(["a", "b"], np.stack([xs[0][t], xs[1][t]]))
        return flood, got, entries, y

    with run_server("--model", path, "--max-queue-per-stream", 2) as server:
        flood, got, entries, y = run(main(server.ws))
        with urllib.request.urlopen(server.http + "/metrics") as r:
            scraped = r.read().decode()
    assert flood.code == 1013 and "frames of this connection wait" in flood.message
    t = entries[0]["t"]
    assert entries[1]["t"] == t and len(got) <= t < 40
    for k in range(2):
        assert all(same(g[k], wants[k][i]) for i, g in enumerate(got))
        assert same(y[k], wants[k][t])
    assert 'fastln_serve_rejections_total{reason="queue_full"} 1.0' in scraped


# ---------------------------------------------------------------- 4. leaving

def test_close_detach_and_websocket_close_codes(tmp_path):
    model = LNLSTM(I, H, seed=8)
    path = saved(tmp_path, model)
    xs = inputs(3, 4, seed=8)
    wants = [serve_model.reference_run(model, x) for x in xs]

    async def main(url, http):
        m = await MuxClient.connect(url)
        await m.open(["ends", "moves", "stays"], new=True)
        y0 = await m.step(["ends", "moves", "stays"], np.stack([x[0] for x in xs]))
        closed = await m.close_streams(["ends"])
        detached = await m.detach(["moves"])
        listed = request("GET", http + "/streams")[1]["streams"]
        # the detached stream goes on over a per-stream connection
        async with await StreamClient.connect(url, "moves", token=m.tokens["moves"]) as s:
            t_moves = s.t
            y1 = await s.step(xs[1][1])
        y2 = await m.step(["stays"], xs[2][1:2])
        await m.close(1001)                               # keeps "stays"
        kept = request("GET", http + "/streams")[1]["streams"]
        m2 = await MuxClient.connect(url)
        again = await m2.open(["stays"], tokens=m.tokens)
        y3 = await m2.step(["stays"], xs[2][2:3])
        await m2.close(1000)                              # ends "stays"
        await asyncio.sleep(0.2)
        left = request("GET", http + "/streams")[1]["streams"]
        return y0, closed, detached, listed, t_moves, y1, y2, kept, again, y3, left

    with run_server("--model", path) as server:
        y0, closed, detached, listed, t_moves, y1, y2, kept, again, y3, left = run(
            main(server.ws, server.http))
    assert closed == {"ends": 1} and detached == {"moves": 1}
    assert listed == {"moves": 1, "stays": 1}
    assert t_moves == 1 and kept == {"stays": 2} and again[0]["t"] == 2 and left == {}
    assert all(same(y0[k], wants[k][0]) for k in range(3))
    assert same(y1, wants[1][1]) and same(y2[0], wants[2][1]) and same(y3[0], wants[2][2])


# ---------------------------------------------------------------- 5. restarts and moves

def test_restart_loses_nothing(tmp_path):
    """SIGTERM while two multiplexed connections have frames in flight:
    both close with 1012 once the steps taken are answered; after a restart
    every stream reopens at the t of the replies its client got."""
    model = LNLSTM(I, H, LAYERS, seed=9)
    path = saved(tmp_path, model)
    state = tmp_path / "streams.npz"
    n_conn, per_conn, T = 2, 4, 60
    xs = inputs(n_conn * per_conn, T, seed=9)
    wants = [serve_model.reference_run(model, x) for x in xs]
    got = [[] for _ in xs]
    tokens = {}

    def sid(k):
        return f"r{k}"

    async def first(url, c):
        ks = list(range(c * per_conn, (c + 1) * per_conn))
        m = await MuxClient.connect(url)
        await m.open([sid(k) for k in ks], new=True)
        tokens.update(m.tokens)
        try:
            for t in range(T):
                m.send([sid(k) for k in ks], np.stack([xs[k][t] for k in ks]))
                if m.pending >= 2 + c:
                    for k, y in zip(ks, await m.recv()):
                        got[k].append(y.copy())
                await asyncio.sleep(0.001)
        except (Closed, FrameRefused):      # a refusal: the server drains
            pass
        try:                                # the replies that came are still read
            while m.pending:
                for k, y in zip(ks, await m.recv()):
                    got[k].append(y.copy())
        except (Closed, FrameRefused):
            pass
        await m._peer.transport.wait_disconnected()
        return m.closed

    async def second(url):
        async with await MuxClient.connect(url) as m:
            entries = await m.open([sid(k) for k in range(len(xs))], tokens=tokens)
            ts = [e["t"] for e in entries]
            for k, t in enumerate(ts):
                for x in xs[k][t:]:
                    got[k].append((await m.step([sid(k)], x[None]))[0].copy())
        return ts

    with run_server("--model", path, "--state-file", state) as server:
        async def stop_midway():
            tasks = [asyncio.ensure_future(first(server.ws, c)) for c in range(n_conn)]
            while sum(map(len, got)) < len(xs) * 20:
                await asyncio.sleep(0.002)
            stopping = asyncio.get_running_loop().run_in_executor(None, server.stop)
            return await asyncio.gather(*tasks), await stopping
        closes, code = run(stop_midway())
        assert code == 0, server.output()
    assert all(c is not None and c.code == 1012 for c in closes), closes
    received = [len(g) for g in got]
    assert all(0 < r < T for r in received), received
    with run_server("--model", path, "--state-file", state) as server:
        ts = run(second(server.ws))
    assert ts == received                       # every step the server ran reached its client
    for g, want in zip(got, wants):
        assert same(np.stack(g), want)


def test_a_stream_moves_while_the_others_go_on(tmp_path):
    """A stream of a multiplexed connection moves to another server while
    its frames run: the frames that name it while it leaves are refused (none
    of their steps run), the client is told it is gone, the connection's
    other streams go on, and the mover continues at the other server."""
    model = LNLSTM(I, H, seed=12)
    path = saved(tmp_path, model)
    T = 30
    xs = inputs(3, T, seed=12)
    wants = [serve_model.reference_run(model, x) for x in xs]
    ids = ["mover", "s1", "s2"]
    with run_server("--model", path) as a, run_server("--model", path) as b:
        async def main():
            m = await MuxClient.connect(a.ws)
            await m.open(ids, new=True)
            got = {s: [] for s in ids}
            refused, moving = 0, None
            while len(got["s1"]) < T:
                if len(got["s1"]) == 5 and moving is None:
                    moving = asyncio.get_running_loop().run_in_executor(
                        None, move_stream, "mover", a.http, b.http)
                pick = [s for s in ids if s in m.streams and len(got[s]) < T]
                try:
                    ys = await m.step(pick, np.stack([xs[ids.index(s)][len(got[s])]
                                                      for s in pick]))
                except FrameRefused as e:     # none of its steps ran: sent again
                    assert e.code == 4410 and e.stream == "mover", e
                    refused += 1
                    continue
                for s, y in zip(pick, ys):
                    got[s].append(y.copy())
            t_moved = await moving
            gone = m.gone["mover"]
            await m.close()
            # the mover goes on at the other server from the t of its replies
            async with await MuxClient.connect(b.ws) as mb:
                entries = await mb.open(["mover"], tokens=m.tokens)
                for x in xs[0][entries[0]["t"]:]:
                    got["mover"].append((await mb.step(["mover"], x[None]))[0].copy())
            return got, refused, t_moved, gone, entries
        got, refused, t_moved, gone, entries = run(main())
        assert request("GET", a.http + "/streams")[1]["streams"] == {}
    assert gone["code"] == 4410 and gone["t"] == t_moved == entries[0]["t"]
    assert 5 <= t_moved < T
    for k, s in enumerate(ids):
        assert same(np.stack(got[s]), wants[k]), s
