"""The served model (fastln.serve): fastln-serve in a subprocess, driven
through fastln.serve.client's StreamClient over WebSocket and through HTTP JSON.

1. Model files: save_model / load_model keep each forward fastln.rnn class, its
   configuration and its parameters bit for bit, with read-only weights; an
   int8 model (fastln.rnn.quantize) is stored as its int8 arrays and scales,
   and loads bit for bit from save_model's file, from a bare state_dict and
   from python -m fastln.serve.model --dtype int8.
2. Streams: 16 concurrent streams with several frames in flight each, float32,
   bfloat16 (bfloat16 x frames too) and int8 models, 2 layers: every reply
   equals, bit for bit, the stream run alone (B=1 steps in this process), and
   batches of several streams formed. A stream stepped over
   HTTP JSON continues over WebSocket, and the reverse. An ONNX model serves.
3. Bad frames: wrong length, a bfloat16-sized frame on a float32 connection,
   non-finite x, a text frame, a frame over the size limit, an unknown
   stream, a second open of a stream, a second connection to it, a bad id or
   query, a full table, a flood of frames, and a client that vanishes
   mid-step: each gets its close code and a message, the server goes on, and
   the stream continues bit for bit from the steps the server ran.
4. Restarts: SIGTERM while frames are in flight saves every stream; a new
   server on the same --state-file resumes each at the step count its client
   received, and the rest of every stream matches the run alone. A state
   file of another model is refused.
5. Moves: a stream exported from one server and put into another continues
   there, bit for bit; the first no longer holds it.
6. Endings: a close with 1000 ends a stream, any other keeps it,
   --idle-timeout ends one left alone, and a peer that answers no ping is
   dropped while its stream stays.
7. HTTP JSON: every 4xx case gets its status and a message.
"""
import asyncio
import json
import re
import time
import urllib.request

import numpy as np
import pytest

from fastln.rnn import GRU, LNGRU, LNLSTM, LNRNN, LSTM, RNN, from_onnx, quantize

from _util import require

for _name in ("picows", "starlette", "uvicorn", "ml_dtypes"):
    require(_name)

import ml_dtypes  # noqa: E402

from fastln.serve import model as serve_model  # noqa: E402
from fastln.serve.client import (  # noqa: E402
    Closed,
    StreamClient,
    move_stream,
    request,
    run_server,
)

I, H, LAYERS = 12, 24, 2
STREAMS, STEPS = 16, 20


def bf16(model):
    return model.to(ml_dtypes.bfloat16)


def bits(a):
    """The bits of a's values as float64 (exact for float32, bfloat16 and float64)."""
    return np.asarray(a).astype(np.float64).view(np.uint64)


def same(a, b):
    return np.array_equal(bits(a), bits(b))


def inputs(n, steps=STEPS, seed=0):
    return [serve_model.stream_inputs(seed, i, steps, I) for i in range(n)]


def http(server, method, path, body=None):
    """(status, JSON reply) of one HTTP request to the server."""
    return request(method, server.http + path, body)


def run(coro, timeout=60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def refused(url, stream_id, **kw):
    """The Closed that ends a connection the server refuses at once."""
    try:
        c = await StreamClient.connect(url, stream_id, **kw)
    except Closed as e:
        return e
    await c.close(1001)
    raise AssertionError(f"the server took {stream_id!r} {kw}")


# ---------------------------------------------------------------- model files

@pytest.mark.parametrize("make", [
    lambda: LNLSTM(I, H, LAYERS, seed=1),
    lambda: bf16(LNLSTM(I, H, LAYERS, seed=1)),
    lambda: LNGRU(I, H, eps=1e-3, dtype=np.float64, seed=2),
    lambda: LNRNN(I, H, nonlinearity="relu", seed=3),
    lambda: bf16(LSTM(I, H, seed=4)),
    lambda: GRU(I, H, linear_before_reset=False, seed=5),
    lambda: RNN(I, H, 3, nonlinearity="relu", seed=6),
    lambda: quantize(LNLSTM(I, H, LAYERS, seed=1)),
    lambda: quantize(GRU(I, H, linear_before_reset=False, seed=5)),
], ids=["lnlstm", "lnlstm_bf16", "lngru_f64", "lnrnn_relu", "lstm_bf16", "gru_onnx_form",
        "rnn_relu", "lnlstm_int8", "gru_int8"])
def test_model_file_round_trip(tmp_path, make):
    model = make()
    path = tmp_path / "m.npz"
    serve_model.save_model(path, model)
    loaded = serve_model.load_model(path)
    assert type(loaded) is type(model)
    assert serve_model.config_of(loaded) == serve_model.config_of(model)
    assert repr(loaded) == repr(model)
    assert sorted(loaded.params) == sorted(model.params)
    for key, value in model.params.items():
        assert loaded.params[key].dtype == value.dtype, key
        assert np.array_equal(bits(loaded.params[key]), bits(value)), key
        assert not loaded.params[key].flags.writeable, key
    xs = serve_model.stream_inputs(0, 0, 5, I)
    want = serve_model.reference_run(model, xs)
    assert same(serve_model.reference_run(loaded, xs), want)


def test_int8_model_file(tmp_path):
    """An int8 model's file records dtype int8 and holds the int8 matrices and the
    float32 row scales as they are; save_model's file, a bare state_dict and
    fastln.serve.model --dtype int8 load as the same model, bit for bit."""
    model = quantize(LNLSTM(I, H, LAYERS, seed=16))
    path = saved(tmp_path, model)
    with np.load(path) as f:
        cfg = json.loads(str(f["config"]))
        stored = {key: f[key] for key in f.files if key != "config"}
    assert cfg["dtype"] == "int8" and cfg["class"] == "LNLSTM"
    want = model.state_dict()
    assert sorted(stored) == sorted(want)
    for key, value in want.items():
        assert stored[key].dtype == value.dtype, key
        assert np.array_equal(stored[key], value), key
    assert stored["weight_hh_l1"].dtype == np.int8
    assert stored["weight_hh_scale_l1"].dtype == np.float32

    np.savez(tmp_path / "bare.npz", **want)
    xs = serve_model.stream_inputs(1, 0, 6, I)
    ys = serve_model.reference_run(model, xs)
    assert ys.dtype == np.float32
    for loaded in (serve_model.load_model(path), serve_model.load_model(tmp_path / "bare.npz")):
        assert "weights=int8" in repr(loaded) and serve_model.dtype_name(loaded) == "int8"
        assert serve_model.config_of(loaded) == cfg
        for key, value in model.params.items():
            assert loaded.params[key].dtype == value.dtype, key
            assert np.array_equal(loaded.params[key], value), key
        assert serve_model.input_dtype(loaded) == np.float32
        assert same(serve_model.reference_run(loaded, xs), ys)

    serve_model.main([str(tmp_path / "cli.npz"), "--input", str(I), "--hidden", str(H),
                      "--layers", "2", "--dtype", "int8", "--seed", "16"])
    cli = serve_model.load_model(tmp_path / "cli.npz")
    assert all(np.array_equal(cli.params[k], v) for k, v in model.params.items())
    assert same(serve_model.reference_run(cli, xs), ys)

    del want["weight_ih_scale_l0"], want["weight_hh_scale_l0"]
    del want["weight_ih_scale_l1"], want["weight_hh_scale_l1"]
    np.savez(tmp_path / "no_scales.npz", **want)
    with pytest.raises(ValueError, match="row scales .* are missing"):
        serve_model.load_model(tmp_path / "no_scales.npz")


def test_model_file_refusals(tmp_path):
    with pytest.raises(ValueError, match="bidirectional"):
        serve_model.save_model(tmp_path / "m.npz", LNLSTM(I, H, bidirectional=True))
    np.savez(tmp_path / "plain.npz", w=np.zeros(3))
    with pytest.raises(ValueError, match="config"):
        serve_model.load_model(tmp_path / "plain.npz")


# ---------------------------------------------------------------- servers

def saved(tmp_path, model, name="m.npz"):
    path = tmp_path / name
    serve_model.save_model(path, model)
    return path


@pytest.fixture(scope="module", params=[("float32", 20), ("bfloat16", 20), ("int8", 20),
                                        ("float32", 0)],
                ids=["float32-delay", "bfloat16-delay", "int8-delay", "float32-no_delay"])
def served(request, tmp_path_factory):
    """(server, in-process model): a 2-layer LN-LSTM (int8: through quantize);
    batches wait 20 ms for more streams, so that several streams share them,
    or form at once."""
    dtype, delay_ms = request.param
    model = LNLSTM(I, H, LAYERS, seed=7)
    if dtype == "bfloat16":
        model = bf16(model)
    elif dtype == "int8":
        model = quantize(model)
    path = saved(tmp_path_factory.mktemp("serve"), model)
    with run_server("--model", path, "--threads", 1, "--capacity", 40,
                    "--max-delay-ms", delay_ms, "--max-queue-per-stream", 8,
                    "--max-frame", 4096) as server:
        yield server, model


async def stream_run(url, sid, xs, inflight=1, dtype="float32", new=True):
    """Runs one stream over xs with up to inflight frames in flight; its ys."""
    async with await StreamClient.connect(url, sid, new=new, dtype=dtype) as c:
        ys = []
        for k, x in enumerate(xs):
            c.send(x)
            if k + 1 >= inflight:
                ys.append((await c.recv()).copy())
        while len(ys) < len(xs):
            ys.append((await c.recv()).copy())
    return ys


def test_streams_match_each_stream_alone(served):
    server, model = served
    before = server.health()["batcher"]["batches"]
    xs = inputs(STREAMS)
    dtypes = ["float32"] * STREAMS
    if serve_model.dtype_name(model) == "bfloat16":   # half the streams send bfloat16 x
        dtypes[::2] = ["bfloat16"] * (STREAMS // 2)
        xs = [x.astype(ml_dtypes.bfloat16).astype(np.float32) if d == "bfloat16" else x
              for x, d in zip(xs, dtypes)]

    async def main():
        return await asyncio.gather(*(
            stream_run(server.ws, f"alone-{k}", x, inflight=1 + k % 3, dtype=d)
            for k, (x, d) in enumerate(zip(xs, dtypes))))
    got = run(main())
    for x, ys in zip(xs, got):
        assert same(np.stack(ys), serve_model.reference_run(model, x))
    health = server.health()
    assert health["model"]["dtype"] == serve_model.dtype_name(model)
    assert health["batcher"]["batch_max"] > 1, health      # batches of several streams formed
    assert health["batcher"]["batches"] - before < STREAMS * STEPS
    assert health["streams"] == 0                           # each closed with 1000


def test_http_and_websocket_share_a_stream(served):
    server, model = served
    xs = inputs(1, 9, seed=3)[0]
    want = serve_model.reference_run(model, xs)
    status, reply = http(server, "POST", "/streams", {"stream": "both"})
    assert status == 201 and reply["stream"] == "both", reply
    token = reply["token"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{32}", token), token        # 192 random bits
    for t in range(3):
        status, reply = http(server, "POST", "/streams/both/step",
                             {"x": xs[t].tolist(), "token": token})
        assert status == 200 and reply["t"] == t and same(reply["y"], want[t])

    async def middle():
        c = await StreamClient.connect(server.ws, "both", token=token)
        assert c.hello["t"] == 3
        # y in the model's dtype: float32 for an int8 model, as is x
        assert (c.hello["x_dtype"], c.hello["y_dtype"]) == ("float32", np.dtype(model.dtype).name)
        ys = [await c.step(x) for x in xs[3:6]]
        await c.close(1001)                                  # keeps the stream
        return ys
    assert same(np.stack(run(middle())), want[3:6])
    for t in range(6, 9):
        status, reply = http(server, "POST", "/streams/both/step",
                             {"x": xs[t].tolist(), "token": token})
        assert status == 200 and reply["t"] == t and same(reply["y"], want[t])
    assert http(server, "DELETE", "/streams/both") == (200, {"stream": "both", "steps": 9})

    status, reply = http(server, "POST", "/streams")          # the server names it
    assert status == 201 and re.fullmatch("[0-9a-f]{16}", reply["stream"]), reply

    async def by_name(sid, token):
        async with await StreamClient.connect(server.ws, sid, token=token) as c:
            return c.hello["t"], await c.step(xs[0])
    t, y = run(by_name(reply["stream"], reply["token"]))
    assert t == 0 and same(y, want[0])


def onnx_lstm(path, input_size, hidden, seed=0):
    """An ONNX file with one forward LSTM node, random weights and biases."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = {"W": rng.normal(0, 0.3, (1, 4 * hidden, input_size)),
         "R": rng.normal(0, 0.3, (1, 4 * hidden, hidden)),
         "B": rng.normal(0, 0.3, (1, 8 * hidden))}
    node = helper.make_node("LSTM", ["X", "W", "R", "B"], ["Y", "Y_h", "Y_c"],
                            hidden_size=hidden, name="lstm")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in node.output],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    with open(path, "wb") as f:
        f.write(model.SerializeToString())


def test_onnx_model(tmp_path):
    require("onnx")
    path = tmp_path / "lstm.onnx"
    onnx_lstm(path, I, 9)
    model = from_onnx(str(path))
    xs = inputs(3, 10, seed=3)

    async def main(url):
        return await asyncio.gather(*(stream_run(url, f"o{k}", x, inflight=2)
                                      for k, x in enumerate(xs)))
    with run_server("--onnx", path) as server:
        got = run(main(server.ws))
        assert server.health()["model"]["class"] == "LSTM"
    for x, ys in zip(xs, got):
        assert same(np.stack(ys), serve_model.reference_run(model, x))


# ---------------------------------------------------------------- bad frames

async def close_of(client, frames=(), text=False):
    """Sends raw frames (and then one good step); the Closed the server answers with."""
    for f in frames:
        client.send_frame(f, text)
    try:
        await asyncio.wait_for(client.step(np.zeros(I, np.float32)), 10)
    except Closed as e:
        return e
    raise AssertionError("the server did not close the connection")


def test_bad_frames_get_close_codes_and_the_server_goes_on(served):
    server, model = served
    bf = serve_model.dtype_name(model) == "bfloat16"
    xs = inputs(1, 6, seed=5)[0]
    want = serve_model.reference_run(model, xs)

    async def main():
        url = server.ws
        c = await StreamClient.connect(url, "victim", new=True)
        token = c.token
        y0 = await c.step(xs[0])
        await c.close(1001)
        codes = {}

        async def bad(name, frames=(), text=False):
            c = await StreamClient.connect(url, "victim", token=token)
            codes[name] = await close_of(c, frames, text)

        await bad("short", [b"\0" * (4 * I - 4)])
        await bad("half size", [np.zeros(I, ml_dtypes.bfloat16).tobytes()])
        nan = np.zeros(I, np.float32)
        nan[3] = np.nan
        await bad("nan", [nan.tobytes()])
        await bad("inf", [np.full(I, np.inf, np.float32).tobytes()])
        await bad("text", [b"{}"], text=True)
        await bad("oversized", [b"\0" * 5000])
        codes["unknown"] = await refused(url, "nobody", token=token)
        codes["new twice"] = await refused(url, "victim", new=True)
        codes["no token"] = await refused(url, "victim")
        codes["wrong token"] = await refused(url, "victim", token=token[::-1])
        other = await StreamClient.connect(url, "other", new=True)
        codes["another stream's token"] = await refused(url, "victim", token=other.token)
        await other.close()
        holder = await StreamClient.connect(url, "victim", token=token)
        codes["second connection"] = await refused(url, "victim", token=token)
        await holder.close(1001)
        codes["bad id"] = await refused(url, "x" * 65, new=True)
        codes["bad dtype"] = await refused(url, "fine", new=True, dtype="int8")
        # none of them ran a step: the stream goes on from t = 1
        c = await StreamClient.connect(url, "victim", token=token)
        t = c.hello["t"]
        y1 = await c.step(xs[1])
        await c.close()
        return codes, y0, t, y1

    codes, y0, t, y1 = run(main())
    expect = {"short": (1007, f"must be {4 * I} bytes ({I} float32 values), got {4 * I - 4}"),
              "half size": (1007, f"got {2 * I}" + (": the size of bfloat16 x, which needs "
                                                    "?dtype=bfloat16" if bf else "")),
              "nan": (1007, "x[3] is not finite"), "inf": (1007, "x[0] is not finite"),
              "text": (1003, "must be binary"), "oversized": (1009, ""),
              "unknown": (4404, "no stream 'nobody' here"),
              "new twice": (4409, "stream 'victim' exists"),
              "no token": (4401, "stream 'victim' needs its resume token"),
              "wrong token": (4403, "not the resume token of stream 'victim'"),
              "another stream's token": (4403, "not the resume token of stream 'victim'"),
              "second connection": (4409, "another connection holds stream 'victim'"),
              "bad id": (1008, "a stream id is 1 to 64"),
              "bad dtype": (1008, "dtype must be one of float32")}
    for name, (code, message) in expect.items():
        assert codes[name].code == code, (name, codes[name])
        assert message in codes[name].message, (name, codes[name].message)
    assert t == 1 and same(y0, want[0]) and same(y1, want[1])
    assert server.health()["status"] == "ok"


def test_a_full_table_and_a_flood(tmp_path):
    model = LNLSTM(I, H, seed=8)
    path = saved(tmp_path, model)
    xs = inputs(1, 60, seed=6)[0]
    want = serve_model.reference_run(model, xs)

    async def main(url):
        held = [await StreamClient.connect(url, f"s{k}", new=True) for k in range(3)]
        full = await refused(url, "one-more", new=True)
        flooder = held[0]
        for x in xs:                                  # 60 frames at once, 4 may wait
            flooder.send(x)
        got = []
        try:
            while True:
                got.append((await flooder.recv()).copy())
        except Closed as e:
            flood = e
        for c in held[1:]:
            await c.close()
        await asyncio.sleep(0.2)
        c = await StreamClient.connect(url, "s0", token=flooder.token)   # its steps ran
        t = c.hello["t"]
        rest = [await c.step(x) for x in xs[t:t + 3]]
        await c.close()
        return full, flood, got, t, rest

    with run_server("--model", path, "--capacity", 3, "--max-queue-per-stream", 4) as server:
        full, flood, got, t, rest = run(main(server.ws))
        assert server.health()["status"] == "ok"
    assert (full.code, full.message) == (1013, "the server holds 3 streams, its --capacity")
    assert flood.code == 1013 and "max_queue_per_stream" in flood.message, flood
    assert len(got) <= t < len(xs)
    assert all(same(y, w) for y, w in zip(got, want))
    assert same(np.stack(rest), want[t:t + 3])


def test_a_client_that_vanishes_mid_step(served):
    server, model = served
    xs = inputs(1, 12, seed=9)[0]
    want = serve_model.reference_run(model, xs)

    async def main():
        c = await StreamClient.connect(server.ws, "ghost", new=True)
        token = c.token
        for x in xs[:6]:
            c.send(x)
        c.abort()
        deadline = time.monotonic() + 10
        while True:                                  # until the server sees it gone
            try:
                c = await StreamClient.connect(server.ws, "ghost", token=token)
                break
            except Closed as e:
                assert e.code == 4409 and time.monotonic() < deadline, e
                await asyncio.sleep(0.05)
        t = c.hello["t"]
        ys = [await c.step(x) for x in xs[t:]]
        await c.close()
        return t, ys
    t, ys = run(main())
    assert 0 <= t <= 6
    assert same(np.stack(ys), want[t:])


# ---------------------------------------------------------------- restarts and moves

@pytest.mark.parametrize("n,batching", [
    (6, ()),
    (16, ("--max-delay-ms", 0.5, "--max-batch", 4)),
    (16, ("--max-delay-ms", 5, "--max-batch", 16)),
], ids=["no_delay", "delay_0.5ms", "delay_5ms"])
def test_restart_loses_nothing(tmp_path, n, batching):
    """A SIGTERM while every stream has frames in flight: each step the
    server took is answered before the 1012 close and saved, and the streams
    resume after a restart at the step their clients last received, with
    batches formed at once or after a delay."""
    model = LNLSTM(I, H, LAYERS, seed=10)
    path = saved(tmp_path, model)
    state = tmp_path / "streams.npz"
    xs = inputs(n, 60, seed=10)
    wants = [serve_model.reference_run(model, x) for x in xs]
    got, tokens = [[] for _ in range(n)], []

    async def first(url):
        clients = [await StreamClient.connect(url, f"r{k}", new=True) for k in range(n)]
        tokens.extend(c.token for c in clients)

        async def drive(k, c):
            pace = np.random.default_rng(k)   # frames at random moments, not in lockstep
            try:
                for x in xs[k]:
                    if c.closed is not None:      # the replies that came are still read
                        break
                    c.send(x)
                    if c.pending >= 1 + k % 3:
                        got[k].append((await c.recv()).copy())
                    await asyncio.sleep(pace.random() * 0.002)
                while c.pending:
                    got[k].append((await c.recv()).copy())
            except Closed as e:
                return e
            return c.closed
        return await asyncio.gather(*(drive(k, c) for k, c in enumerate(clients)))

    async def second(url):
        ts = []
        for k in range(n):
            async with await StreamClient.connect(url, f"r{k}", token=tokens[k]) as c:
                assert c.token == tokens[k]          # the state file kept it
                ts.append(c.hello["t"])
                for x in xs[k][c.t:]:
                    got[k].append((await c.step(x)).copy())
        return ts

    with run_server("--model", path, "--state-file", state, *batching) as server:
        async def stop_midway():
            task = asyncio.ensure_future(first(server.ws))
            while sum(map(len, got)) < n * 20:
                await asyncio.sleep(0.002)
            stopping = asyncio.get_running_loop().run_in_executor(None, server.stop)
            return await task, await stopping
        closes, code = run(stop_midway())
        assert code == 0, server.output()
        assert f"saved {n} streams" in server.output()
    assert all(c.code == 1012 for c in closes), closes
    received = [len(g) for g in got]
    assert all(0 < r < 60 for r in received), received
    with run_server("--model", path, "--state-file", state, *batching) as server:
        assert f"loaded {n} streams" in server.output()
        ts = run(second(server.ws))
    assert ts == received                      # every step the server ran reached its client
    for g, want in zip(got, wants):
        assert same(np.stack(g), want)

    other = saved(tmp_path, LNLSTM(I, H, LAYERS, seed=11), "other.npz")
    with pytest.raises(RuntimeError, match="holds the streams of another model"):
        with run_server("--model", other, "--state-file", state):
            pass


def test_a_stream_moves_between_two_servers(tmp_path):
    model = LNLSTM(I, H, seed=12)
    path = saved(tmp_path, model)
    xs = inputs(1, 20, seed=12)[0]
    want = serve_model.reference_run(model, xs)
    with run_server("--model", path) as a, run_server("--model", path) as b:
        async def main():
            c = await StreamClient.connect(a.ws, "mover", new=True)
            ys = [await c.step(x) for x in xs[:8]]
            c.send(xs[8])                          # in flight while it moves
            t = await asyncio.get_running_loop().run_in_executor(
                None, move_stream, "mover", a.http, b.http)
            try:
                ys.append(await c.recv())
            except Closed as e:
                gone = e
            else:
                gone = await close_of(c)
            lost = await refused(a.ws, "mover", token=c.token)
            c = await StreamClient.connect(b.ws, "mover", token=c.token)   # the export kept it
            assert c.hello["t"] == len(ys) == t
            ys += [await c.step(x) for x in xs[len(ys):]]
            await c.close()
            return gone, lost, ys
        gone, lost, ys = run(main())
        assert gone.code == 4410 and lost.code == 4404
        assert same(np.stack(ys), want)
        assert http(a, "GET", "/streams") == (200, {"streams": {}})

        other = saved(tmp_path, LNLSTM(I, H, seed=13), "other.npz")
        with run_server("--model", other) as c:
            assert http(a, "POST", "/streams", {"stream": "x"})[0] == 201
            with pytest.raises(RuntimeError, match="another model.*returned to"):
                move_stream("x", a.http, c.http)
            assert http(a, "GET", "/streams") == (200, {"streams": {"x": 0}})
            assert http(c, "GET", "/streams") == (200, {"streams": {}})


def test_owner_names_the_server(tmp_path):
    with run_server("--model", saved(tmp_path, LNLSTM(I, H, seed=1)),
                    "--advertise", "10.1.2.3") as server:
        port = server.ws.rsplit(":", 1)[1]
        with urllib.request.urlopen(server.ws.replace("ws:", "http:") + "/owner/abc") as r:
            owner = json.loads(r.read())
    assert owner == {"http": f"http://10.1.2.3:{server.http.rsplit(':', 1)[1]}",
                     "ws": f"ws://10.1.2.3:{port}"}


# ---------------------------------------------------------------- endings

def test_close_codes_end_or_keep_a_stream_and_idle_ones_go(tmp_path):
    path = saved(tmp_path, LNLSTM(I, H, seed=14))

    async def main(url):
        tokens = {}
        for sid, code in (("ended", 1000), ("kept", 1001), ("idle", 1001)):
            c = await StreamClient.connect(url, sid, new=True)
            tokens[sid] = c.token
            await c.step(np.zeros(I, np.float32))
            await c.close(code)
        ended = await refused(url, "ended", token=tokens["ended"])
        c = await StreamClient.connect(url, "kept", token=tokens["kept"])
        await asyncio.sleep(2.0)                      # "idle" is left alone meanwhile
        gone = await refused(url, "idle", token=tokens["idle"])
        t = c.hello["t"]
        await c.close()
        return ended, t, gone

    with run_server("--model", path, "--idle-timeout", 0.5) as server:
        ended, t, gone = run(main(server.ws))
    assert ended.code == 4404 and gone.code == 4404 and t == 1


def test_a_peer_that_answers_no_ping_lets_its_stream_go(tmp_path):
    """A connection whose peer answers no ping is dropped, and the stream can
    be resumed (it is not held by a dead connection)."""
    from picows import WSListener, ws_connect

    path = saved(tmp_path, LNLSTM(I, H, seed=15))

    async def main(url):
        hello = asyncio.get_running_loop().create_future()

        class Silent(WSListener):
            def on_ws_frame(self, transport, frame):
                if not hello.done():
                    hello.set_result(json.loads(frame.get_payload_as_utf8_text()))

        silent, _ = await ws_connect(Silent, f"{url}/ws/quiet?new=1", enable_auto_pong=False)
        token = (await hello)["token"]
        held = await refused(url, "quiet", token=token)   # the silent connection holds it
        await asyncio.wait_for(silent.wait_disconnected(), 10)
        c = await StreamClient.connect(url, "quiet", token=token)
        t = c.hello["t"]
        await c.close()
        return held, t

    with run_server("--model", path, "--ping", 0.3) as server:
        held, t = run(main(server.ws))
    assert held.code == 4409 and t == 0


# ---------------------------------------------------------------- HTTP JSON

def test_http_errors(served):
    server, model = served
    x = serve_model.stream_inputs(2, 0, 1, I)
    status, reply = http(server, "POST", "/streams", {"stream": "j"})
    assert status == 201 and reply["stream"] == "j"
    token = reply["token"]

    def check(reply, status, message):
        assert reply[0] == status, reply
        assert message in reply[1]["error"], reply

    step = "/streams/j/step"
    check(http(server, "POST", step, {"x": [0.0] * I}), 401, "needs its resume token")
    check(http(server, "POST", step, {"x": [0.0] * I, "token": token[::-1]}), 403,
          "the token given is not the resume token of stream 'j'")
    check(http(server, "POST", step, {"x": [0.0] * I, "token": 7}), 422, "token must be a string")
    check(http(server, "POST", step, b'{"x": [1,'), 400, "not valid JSON")
    check(http(server, "POST", step, b'{"x": [NaN]}'), 400, "NaN is not a JSON number")
    check(http(server, "POST", step, [1, 2]), 422, 'a JSON object {"x"')
    check(http(server, "POST", step, {"x": [0.0] * (I - 1)}), 422,
          f"x must be a list of {I} numbers, got a list of {I - 1}")
    for bad in ("1", True, None, [1.0]):
        check(http(server, "POST", step, {"x": [0.0] * (I - 1) + [bad]}), 422,
              f"x[{I - 1}] must be a number, got {json.dumps(bad)}")
    check(http(server, "POST", step, {"x": [1e39] + [0.0] * (I - 1)}), 422,
          "x must hold finite float32 numbers, x[0] is not")
    check(http(server, "POST", step, b" " * (1 << 17)), 413, "at most 65536 bytes")
    check(http(server, "POST", "/streams/nope/step", {"x": [0.0] * I}), 404,
          "no stream 'nope' here")
    check(http(server, "DELETE", "/streams/nope"), 404, "no stream 'nope' here")
    check(http(server, "POST", "/streams", {"stream": "j"}), 409, "stream 'j' exists")
    check(http(server, "POST", "/streams", {"stream": "a b"}), 422, "a stream id is 1 to 64")
    check(http(server, "PUT", "/streams/k/state", {"t": 1}), 422, "export's JSON")
    check(http(server, "PUT", "/streams/k/state", {"t": 0, "state": [[[[0.5]]]] * 2,
                                                   "token": "k" * 32}), 422,
          "each state array must have shape")
    # none of the above ran a step: the stream starts at t = 0
    status, reply = http(server, "POST", step, {"x": x[0].tolist(), "token": token})
    assert status == 200 and reply["t"] == 0
    assert same(reply["y"], serve_model.reference_run(model, x)[0])
    assert http(server, "DELETE", "/streams/j") == (200, {"stream": "j", "steps": 1})
