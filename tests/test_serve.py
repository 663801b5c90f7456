"""The served-model example (examples/serve): the real server in a subprocess.

1. Model files: save_model / load_model keep each forward fastln.rnn class, its
   configuration and its parameters bit for bit (float32, float64, bfloat16),
   and the loaded weights are read-only; bidirectional models are refused.
2. Dynamic batching: 16 concurrent streams x 20 steps of a 2-layer LN-LSTM
   (float32 and bfloat16), with a window long enough that batches of several
   streams form (the server's largest batch says so): every reply equals, bit
   for bit, the stream run alone in this process (B=1 steps of the model that
   was saved), with no errors. Concurrent requests of one stream run one after
   the other: their step indices are 0..n-1 and each y is that of the inputs
   in the order of the indices. Deleting a stream answers its waiting step 404.
3. An ONNX LSTM file, served with batching off, answers as fastln.rnn.from_onnx
   of the same file does in process.
4. Bad requests: each 4xx case (not JSON, wrong x, unknown stream, body too
   large by Content-Length and by its bytes, too many streams, unknown route)
   gets its status and a JSON message, and leaves the stream's state as it was.

The example needs starlette, uvicorn and httpx: skipped when one is missing,
unless the CI variable is set, where that is a failure.
"""
import asyncio
import json
import os
import sys

import numpy as np
import pytest

from fastln.rnn import GRU, LNGRU, LNLSTM, LNRNN, LSTM, RNN, from_onnx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

missing = []
for _name in ("starlette", "uvicorn", "httpx", "ml_dtypes"):
    try:
        __import__(_name)
    except ImportError as _e:
        missing.append(f"{_name} ({_e})")
if missing and os.environ.get("CI"):
    raise ImportError("CI is set but the served-model example needs " + ", ".join(missing))
if missing:
    pytest.skip("the served-model example needs " + ", ".join(missing), allow_module_level=True)

import httpx  # noqa: E402
import ml_dtypes  # noqa: E402

if ROOT not in sys.path:
    sys.path.append(ROOT)
from examples.serve import loadtest  # noqa: E402
from examples.serve import model as serve_model  # noqa: E402

I, H, LAYERS = 12, 24, 2
STREAMS, STEPS = 16, 20


def bf16(model):
    return model.to(ml_dtypes.bfloat16)


def reference(model, n, steps=STEPS, seed=0, input_size=I):
    """The inputs of n streams and each one's replies run alone (B=1 steps)."""
    inputs = [serve_model.stream_inputs(seed, i, steps, input_size) for i in range(n)]
    return inputs, [serve_model.reference_run(model, xs) for xs in inputs]


def bits(a):
    """The bits of a's values as float64 (exact for float32, bfloat16 and float64)."""
    return np.asarray(a).astype(np.float64).view(np.uint64)


# ---------------------------------------------------------------- model files

@pytest.mark.parametrize("make", [
    lambda: LNLSTM(I, H, LAYERS, seed=1),
    lambda: bf16(LNLSTM(I, H, LAYERS, seed=1)),
    lambda: LNGRU(I, H, eps=1e-3, dtype=np.float64, seed=2),
    lambda: LNRNN(I, H, nonlinearity="relu", seed=3),
    lambda: bf16(LSTM(I, H, seed=4)),
    lambda: GRU(I, H, linear_before_reset=False, seed=5),
    lambda: RNN(I, H, 3, nonlinearity="relu", seed=6),
], ids=["lnlstm", "lnlstm_bf16", "lngru_f64", "lnrnn_relu", "lstm_bf16", "gru_onnx_form",
        "rnn_relu"])
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
    assert np.array_equal(bits(serve_model.reference_run(loaded, xs)), bits(want))


def test_model_file_refusals(tmp_path):
    with pytest.raises(ValueError, match="bidirectional"):
        serve_model.save_model(tmp_path / "m.npz", LNLSTM(I, H, bidirectional=True))
    np.savez(tmp_path / "plain.npz", w=np.zeros(3))
    with pytest.raises(ValueError, match="config"):
        serve_model.load_model(tmp_path / "plain.npz")


# ---------------------------------------------------------------- servers

@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def batched(request, tmp_path_factory):
    """(url, in-process model) of a server with batching on, a 50 ms window."""
    model = LNLSTM(I, H, LAYERS, seed=7)
    if request.param == "bfloat16":
        model = bf16(model)
    path = tmp_path_factory.mktemp("serve") / f"{request.param}.npz"
    serve_model.save_model(path, model)
    with loadtest.start_server("--model", path, "--max-batch", 64, "--window-ms", 50,
                               "--max-streams", 40, "--threads", 1) as url:
        yield url, model


def test_batched_replies_match_single_stream(batched):
    url, model = batched
    inputs, wants = reference(model, STREAMS)
    out = asyncio.run(loadtest.drive(url, inputs, wants, time_limit=60, request_timeout=20))
    assert out["messages"] == []
    assert (out["errors"], out["mismatches"]) == (0, 0)
    assert out["steps"] == out["server_steps"] == STREAMS * STEPS
    assert not out["cut"]
    health = httpx.get(url + "/health").json()
    assert health["model"]["dtype"] == serve_model.dtype_name(model)
    assert health["batching"] is True and health["streams"] == 0 and health["threads"] == 1
    # batches of several streams formed (the batch invariance is what made them exact)
    assert 1 < health["largest_batch"] <= STREAMS, health
    assert out["batches"] < out["server_steps"], out


def test_requests_of_one_stream_run_in_order(batched):
    """n requests of one stream sent at once (while a second, idle stream is
    open, so that they wait out the window together): one per batch, so their
    step indices are 0..n-1 and each y follows from the inputs in that order."""
    url, model = batched
    xs = serve_model.stream_inputs(1, 0, 6, I)

    async def burst():
        async with httpx.AsyncClient(base_url=url, timeout=20) as client:
            stream, idle = [(await client.post("/streams")).json()["stream"] for _ in "ab"]
            replies = await asyncio.gather(*(
                client.post(f"/streams/{stream}/step", json={"x": x}) for x in xs.tolist()))
            for s in (stream, idle):
                await client.delete(f"/streams/{s}")
        return [r.json() for r in replies]

    replies = asyncio.run(burst())
    order = [r["t"] for r in replies]
    assert sorted(order) == list(range(len(xs)))
    by_t = sorted(range(len(xs)), key=order.__getitem__)   # request index of step t
    want = serve_model.reference_run(model, xs[by_t])
    for t, i in enumerate(by_t):
        assert loadtest.same_bits(replies[i]["y"], want[t]), t


def test_deleting_a_stream_fails_its_waiting_step(batched):
    """With two streams open, a lone step waits out the 50 ms window; a DELETE
    of its stream meanwhile answers it 404, and the other stream goes on."""
    url, model = batched
    x = serve_model.stream_inputs(4, 0, 1, I)

    async def race():
        async with httpx.AsyncClient(base_url=url, timeout=20) as client:
            a, b = [(await client.post("/streams")).json()["stream"] for _ in range(2)]
            step = asyncio.ensure_future(client.post(f"/streams/{a}/step",
                                                     json={"x": x[0].tolist()}))
            await asyncio.sleep(0.01)
            deleted = await client.delete(f"/streams/{a}")
            waited = await step
            other = await client.post(f"/streams/{b}/step", json={"x": x[0].tolist()})
            await client.delete(f"/streams/{b}")
            return deleted, waited, other

    deleted, waited, other = asyncio.run(race())
    assert deleted.json()["steps"] == 0
    assert waited.status_code == 404 and "was deleted" in waited.json()["error"], waited.text
    assert other.json()["t"] == 0
    assert loadtest.same_bits(other.json()["y"], serve_model.reference_run(model, x)[0])


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


def test_onnx_model_with_batching_off(tmp_path):
    path = tmp_path / "lstm.onnx"
    onnx_lstm(path, 5, 9)
    model = from_onnx(str(path))
    inputs, wants = reference(model, 4, steps=10, seed=3, input_size=5)
    with loadtest.start_server("--onnx", path, "--batching", "off") as url:
        out = asyncio.run(loadtest.drive(url, inputs, wants, time_limit=60,
                                         request_timeout=20))
        health = httpx.get(url + "/health").json()
    assert out["messages"] == []
    assert (out["errors"], out["mismatches"], out["steps"]) == (0, 0, 40)
    assert health["model"]["class"] == "LSTM" and health["batching"] is False
    assert health["largest_batch"] == 1 and health["batches"] == health["steps"] == 40


# ---------------------------------------------------------------- bad requests

def test_bad_requests(batched):
    url, model = batched
    x = serve_model.stream_inputs(2, 0, 1, I)
    with httpx.Client(base_url=url, timeout=20) as client:
        health = client.get("/health").json()
        stream = client.post("/streams").json()["stream"]
        step = f"/streams/{stream}/step"

        def check(response, status, message):
            assert response.status_code == status, response.text
            assert message in response.json()["error"], response.json()

        check(client.post(step, content=b'{"x": [1,'), 400, "not valid JSON")
        check(client.post(step, content=b"\xff\xfe"), 400, "not valid JSON")
        check(client.post(step, content='{"x": [NaN]}'), 400, "NaN is not a JSON number")
        check(client.post(step, json=[1, 2]), 422, 'a JSON object {"x"')
        check(client.post(step, json={"y": [0.0] * I}), 422, 'a JSON object {"x"')
        check(client.post(step, json={"x": [0.0] * (I - 1)}), 422,
              f"x must be a list of {I} numbers, got a list of {I - 1}")
        check(client.post(step, json={"x": "0.5"}), 422, "got a str")
        check(client.post(step, json={"x": [[0.0] * I]}), 422, f"a list of {I} numbers")
        for bad in ("1", True, None, [1.0]):
            check(client.post(step, json={"x": [0.0] * (I - 1) + [bad]}), 422,
                  f"x[{I - 1}] must be a number, got {json.dumps(bad)}")
        check(client.post(step, json={"x": [1e39] + [0.0] * (I - 1)}), 422,
              "x must hold finite float32 numbers, x[0] is not")
        check(client.post(step, json={"x": [0.0, 10 ** 400] + [0.0] * (I - 2)}), 422,
              "an integer in x is too large")
        limit = health["max_body"]
        check(client.post(step, content=b" " * (limit + 1)), 413, f"at most {limit} bytes")

        def chunks():   # no Content-Length: the server counts the bytes
            for _ in range(limit // 1000 + 2):
                yield b" " * 1000

        check(client.post(step, content=chunks()), 413, f"at most {limit} bytes")
        check(client.post("/streams/nope/step", json={"x": [0.0] * I}), 404,
              "unknown stream 'nope'")
        check(client.delete("/streams/nope"), 404, "unknown stream")
        check(client.get("/nowhere"), 404, "Not Found")
        check(client.get("/streams"), 405, "Method Not Allowed")
        assert client.get("/streams").headers["allow"] == "POST"

        # none of the above ran a step: the stream starts at t = 0
        reply = client.post(step, json={"x": x[0].tolist()}).json()
        assert reply["t"] == 0
        assert loadtest.same_bits(reply["y"], serve_model.reference_run(model, x)[0])
        assert client.delete(f"/streams/{stream}").json() == {"stream": stream, "steps": 1}
        check(client.post(step, json={"x": x[0].tolist()}), 404, "unknown stream")

        opened = [client.post("/streams") for _ in range(health["max_streams"])]
        try:
            assert all(r.status_code == 201 for r in opened)
            check(client.post("/streams"), 429, "too many streams")
        finally:
            for r in opened:
                client.delete(f"/streams/{r.json()['stream']}")
        assert client.get("/health").json()["streams"] == 0
