"""The LN-RNN engine's internals: every ISA path (packed-weight kernels, the
B == 1 dot kernel, BLAS), determinism across thread counts, the cache's size,
Ctrl-C, and the C-level argument checks. (The API is in test_rnn.py.)"""
import numpy as np
import pytest

import fastln
from fastln import _lib
from fastln.rnn import LNGRU, LNLSTM, LNRNN, LSTM, RNN, _engine

from _util import run_python

CELLS = [(LNLSTM, {}), (LNGRU, {}), (LNRNN, {}), (LNRNN, {"nonlinearity": "relu"}),
         (LSTM, {}), (RNN, {}), (RNN, {"nonlinearity": "relu"}),
         (LNLSTM, {"gate_norm": "sum", "carry": "normalized", "gate_bias": False}),
         (LNLSTM, {"gate_norm": "per_gate", "carry": "normalized", "ln_bias": False})]
IDS = ["lstm", "gru", "rnn_tanh", "rnn_relu", "plain_lstm", "plain_rnn_tanh", "plain_rnn_relu",
       "lstm_sum_carry_ln", "lstm_per_gate_carry_ln"]


def model(cls, kw, dtype, I=5, H=40, L=2, seed=3):
    m = cls(I, H, num_layers=L, dtype=dtype, seed=seed, **kw)
    rng = np.random.default_rng(seed)
    for key, p in m.params.items():   # gains and biases away from 1 and 0
        if "weight_" not in key:
            p += rng.normal(0, 0.3, p.shape).astype(dtype)
    return m


def run_all(m, x, lengths):
    """Every output of a forward and backward, as a dict of float64 arrays."""
    rng = np.random.default_rng(7)
    y, state = m.forward(x, lengths=lengths)
    dy = rng.standard_normal(y.shape).astype(m.dtype)
    dx, dstate = m.backward(dy)
    out = {"y": y, "dx": dx}
    for i, s in enumerate(state if isinstance(state, tuple) else (state,)):
        out[f"state{i}"] = s
    for i, s in enumerate(dstate if isinstance(dstate, tuple) else (dstate,)):
        out[f"dstate{i}"] = s
    out.update({f"grad {k}": v.copy() for k, v in m.grads.items()})
    return out


@pytest.mark.parametrize("cls, kw", CELLS, ids=IDS)
@pytest.mark.parametrize("B", [1, 2, 9, 33])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_isa_paths_agree(isa, cls, kw, B, dtype):
    """Each ISA path (packed AVX-512/AVX2 kernels, the B == 1 dot kernel, BLAS
    on the generic path) against the float64 BLAS-only run."""
    T, I, H = 6, 5, 40   # H = 40: a partial 32-column panel; B = 9, 33: row tails
    x = np.random.default_rng(B).standard_normal((T, B, I))
    lengths = np.random.default_rng(B).integers(1, T + 1, B)
    got = run_all(model(cls, kw, dtype, I=I, H=H), x.astype(dtype), lengths)
    previous = fastln.get_isa()
    _lib._set_isa("generic")
    try:
        want = run_all(model(cls, kw, np.float64, I=I, H=H), x, lengths)
    finally:
        _lib._set_isa(previous)
    rtol = 2e-4 if dtype == np.float32 else 1e-11
    for key, w in want.items():
        scale = max(1.0, np.abs(w).max())
        np.testing.assert_allclose(got[key], w, rtol=rtol, atol=rtol * scale, err_msg=key)


@pytest.mark.parametrize("cls, kw", CELLS, ids=IDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bitwise_identical_on_any_thread_count(restore_threads, cls, kw, dtype):
    """Large enough for parallel steps (B*G*H >= 2^17): every output of forward
    and backward is bitwise the same on 1, 2, 3 and 8 threads."""
    T, B, I, H = 5, 24, 16, 128
    x = np.random.default_rng(0).standard_normal((T, B, I)).astype(dtype)
    lengths = np.arange(B) % T + 1
    results = []
    for n in (1, 2, 3, 8):
        fastln.set_num_threads(n)
        results.append(run_all(model(cls, kw, dtype, I=I, H=H), x, lengths))
    for other in results[1:]:
        for key in results[0]:
            assert np.array_equal(results[0][key], other[key]), key


@pytest.mark.parametrize("cls, kw, per_h", [(LNLSTM, {}, 12), (LNGRU, {}, 11), (LNRNN, {}, 3),
                                           (LSTM, {}, 7), (RNN, {}, 2)],
                         ids=["lstm", "gru", "rnn", "plain_lstm", "plain_rnn"])
def test_cache_size(cls, kw, per_h):
    """The cache kept for backward, per row and step: LNLSTM 11 H + 3 (at
    most 16 H), LNGRU 10 H + 4, LNRNN 2 H + 1, LSTM 6 H, RNN H,
    plus one step for the initial state; nothing at all with cache=False."""
    T, B, H = 50, 4, 64
    cell = cls(8, H)._cell_name()
    size = _engine.cache_size(cell, T, B, H)
    assert size <= per_h * H * T * B
    m = cls(8, H)
    m.forward(np.zeros((T, B, 8), np.float32), cache=False)
    assert m._cache is None
    with pytest.raises(RuntimeError, match="forward"):
        m.backward(np.zeros((T, B, H), np.float32))


def test_ctrl_c_stops_a_long_forward():
    """The engine polls for signals between chunks of steps: a simulated Ctrl-C
    (a SIGINT from another thread) raises KeyboardInterrupt long before the
    sequence ends. Run in a child process, so that a miss cannot hit pytest."""
    code = """
import signal, threading, time, _thread
import numpy as np
from fastln.rnn import LNLSTM
# Python's own SIGINT handler, which interrupt_main needs: a child of a shell
# job started in the background inherits SIGINT ignored
signal.signal(signal.SIGINT, signal.default_int_handler)
m = LNLSTM(4, 256)
x = np.zeros((50000, 8, 4), np.float32)   # seconds of work on 2 cores, many chunks
threading.Timer(0.5, _thread.interrupt_main).start()
t0 = time.perf_counter()
try:
    m.forward(x, cache=False)
    print("finished")
except KeyboardInterrupt:
    print("interrupted after %.1f s" % (time.perf_counter() - t0))
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("interrupted"), r.stdout + r.stderr


def test_engine_rechecks_sizes():
    """The Cython layer re-checks every buffer against the sizes, so that no
    caller of the private entry points can make the engine overrun one."""
    T, B, I, H = 3, 2, 4, 5
    m = LNLSTM(I, H)
    params = m._layer_params(0)
    x = np.zeros((T, B, I), np.float32)
    y, h, c = (np.zeros((T, B, H), np.float32), np.zeros((B, H), np.float32),
               np.zeros((B, H), np.float32))
    _engine.forward("lstm", T, B, I, H, 1e-5, x, params, None, None, y, h, c)
    with pytest.raises(ValueError, match="internal"):
        _engine.forward("lstm", T + 1, B, I, H, 1e-5, x, params, None, None, y, h, c)
    with pytest.raises(ValueError, match="internal"):
        _engine.forward("lstm", T, B, I, H, 1e-5, x, params, None, None, y, h, None)
    with pytest.raises(ValueError, match="internal"):
        _engine.forward("lstm", T, B, I, H, 1e-5, x, params[:-1], None, None, y, h, c)
    with pytest.raises(ValueError, match="internal"):
        _engine.forward("lstm", T, B, I, H, 1e-5, x, params, np.ones(B, np.int32), None,
                           y, h, c)
    with pytest.raises(ValueError, match="internal"):
        _engine.backward("lstm", T, B, I, H, 1e-5, x, params, None, None, y, h, c, None,
                            [np.zeros_like(p) for p in params])


def test_one_model_serves_threads():
    """step() and forward(cache=False) on one model from 4 threads at once give
    the serial results (the engine releases the GIL and keeps no shared state)."""
    import threading
    m = model(LNLSTM, {}, np.float32, I=8, H=64)
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((12, 3, 8)).astype(np.float32) for _ in range(4)]
    want = [m.forward(x, cache=False)[0] for x in xs]
    want_step = [m.step(x[0])[0] for x in xs]
    errors = []

    def work(i):
        try:
            for _ in range(50):
                y, _ = m.forward(xs[i], cache=False)
                h, _ = m.step(xs[i][0])
                if not (np.array_equal(y, want[i]) and np.array_equal(h, want_step[i])):
                    errors.append(i)
                    return
        except Exception as e:   # reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
