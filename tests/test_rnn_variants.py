"""LNLSTM's variants (gate_norm, carry, gate_bias, ln_bias): forward against
the float64 reference of their equations, every gradient against central
finite differences, the paper cell unchanged by the options' defaults,
step() and StreamTable against forward, the parameters each variant has,
pickling, the served model's file, and the errors. The ISA paths, thread
counts, bfloat16 and int8 of two variants are in test_rnn_engine.py,
test_rnn_bf16.py and test_rnn_int8.py."""
import itertools
import pickle

import numpy as np
import pytest

from fastln import rnn_reference as ref
from fastln.rnn import LNLSTM, StreamTable

CELLS = list(itertools.product(("pair", "sum", "per_gate"), ("raw", "normalized")))
CELL_IDS = [f"{g}-{c}" for g, c in CELLS]
BIASES = [(True, True), (False, True), (True, False), (False, False)]
BIAS_IDS = ["biases", "no-gate-bias", "no-ln-bias", "no-biases"]


def make(gate_norm, carry, gate_bias=True, ln_bias=True, I=5, H=8, L=2, dtype=np.float64,
         seed=0, **kw):
    """A variant with weights, gains and biases drawn away from the init, so
    that every parameter matters."""
    m = LNLSTM(I, H, num_layers=L, dtype=dtype, seed=seed, gate_norm=gate_norm, carry=carry,
               gate_bias=gate_bias, ln_bias=ln_bias, **kw)
    rng = np.random.default_rng(seed + 100)
    for key, p in m.params.items():
        if key.startswith("weight_"):
            p[...] = rng.uniform(-1.5, 1.5, p.shape) / np.sqrt(H)
        elif "_weight_" in key:
            p[...] = 1.0 + 0.3 * rng.standard_normal(p.shape)
        else:
            p[...] = 0.3 * rng.standard_normal(p.shape)
    return m


def reference(m, x, state=None, lengths=None):
    return ref.lnlstm_forward(m.params, x, state, lengths, num_layers=m.num_layers, eps=m.eps,
                              bidirectional=m.bidirectional, gate_norm=m.gate_norm,
                              carry=m.carry)


def close(got, want, dtype):
    tol = 1e-4 if dtype == np.float32 else 1e-11
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("biases", BIASES, ids=BIAS_IDS)
@pytest.mark.parametrize("cell", CELLS, ids=CELL_IDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_forward_matches_reference(cell, biases, dtype):
    """50 steps in float64; float32 over the first 10 (the cells are chaotic
    over long float32 runs); with a given state and ragged lengths."""
    m = make(*cell, *biases, dtype=dtype)
    T = 50 if dtype == np.float64 else 10
    rng = np.random.default_rng(1)
    x = rng.standard_normal((T, 3, 5)).astype(dtype)
    state = tuple(rng.standard_normal((2, 3, 8)).astype(dtype) for _ in range(2))
    lengths = np.array([T, 4, 1])
    y, (h, c) = m.forward(x, state, lengths)
    yr, (hr, cr) = reference(m, x, state, lengths)
    for got, want in ((y, yr), (h, hr), (c, cr)):
        assert got.dtype == dtype
        close(got, want, dtype)


@pytest.mark.parametrize("cell", CELLS, ids=CELL_IDS)
def test_bidirectional_matches_reference(cell):
    m = make(*cell, bidirectional=True)
    x = np.random.default_rng(2).standard_normal((7, 2, 5))
    lengths = np.array([7, 3])
    y, (h, c) = m.forward(x, lengths=lengths)
    yr, (hr, cr) = reference(m, x, lengths=lengths)
    for got, want in ((y, yr), (h, hr), (c, cr)):
        close(got, want, np.float64)


@pytest.mark.parametrize("biases", BIASES[:1] + BIASES[3:], ids=BIAS_IDS[:1] + BIAS_IDS[3:])
@pytest.mark.parametrize("cell", CELLS, ids=CELL_IDS)
def test_finite_differences(cell, biases):
    """Every gradient (parameters, x, h0, c0), with ragged lengths, against
    float64 central differences of sum(y dy) + sum(h_n dh) + sum(c_n dc)."""
    T, B, I, H, L = 4, 3, 3, 4, 2
    m = make(*cell, *biases, I=I, H=H, L=L)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((T, B, I))
    state = tuple(rng.standard_normal((L, B, H)) for _ in range(2))
    lengths = np.array([4, 2, 1])
    dy = rng.standard_normal((T, B, H))
    dstate = tuple(rng.standard_normal((L, B, H)) for _ in range(2))
    m.forward(x, state, lengths)
    dx, (dh0, dc0) = m.backward(dy, dstate)
    assert sorted(m.grads) == sorted(m.params)

    def loss():
        y, (h, c) = m.forward(x, state, lengths, cache=False)
        return float(np.sum(y * dy) + np.sum(h * dstate[0]) + np.sum(c * dstate[1]))

    def check(name, arr, got):
        scale = max(1.0, float(np.abs(got).max()))
        for i in np.ndindex(*arr.shape):
            old = arr[i]
            arr[i] = old + 1e-6
            lp = loss()
            arr[i] = old - 1e-6
            lm = loss()
            arr[i] = old
            fd = (lp - lm) / 2e-6
            assert abs(fd - got[i]) <= 1e-6 * scale + 1e-5 * abs(fd), (name, i, got[i], fd)

    for key in sorted(m.params):
        check(key, m.params[key], m.grads[key].copy())
    check("dx", x, dx)
    check("dh0", state[0], dh0)
    check("dc0", state[1], dc0)


def test_defaults_are_the_paper_cell_bitwise():
    """The options' defaults run the paper's cell: the same parameters and
    bitwise the same outputs and gradients as a model made without them."""
    a = LNLSTM(6, 16, num_layers=2, seed=4)
    b = LNLSTM(6, 16, num_layers=2, seed=4, gate_norm="pair", carry="raw", gate_bias=True,
               ln_bias=True)
    assert sorted(a.params) == sorted(b.params)
    x = np.random.default_rng(5).standard_normal((9, 3, 6)).astype(np.float32)
    ya, sa = a.forward(x)
    yb, sb = b.forward(x)
    assert ya.tobytes() == yb.tobytes() and sa[1].tobytes() == sb[1].tobytes()
    dy = np.ones_like(ya)
    assert a.backward(dy)[0].tobytes() == b.backward(dy)[0].tobytes()
    assert all(a.grads[k].tobytes() == b.grads[k].tobytes() for k in a.grads)
    assert repr(a) == repr(b)


def test_parameters_of_each_variant():
    names = lambda m: sorted(k[:-3] for k in m.params if k.endswith("_l0"))   # noqa: E731
    assert names(LNLSTM(2, 3)) == ["bias", "ln_c_bias", "ln_c_weight", "ln_hh_bias",
                                   "ln_hh_weight", "ln_ih_bias", "ln_ih_weight", "weight_hh",
                                   "weight_ih"]
    assert names(LNLSTM(2, 3, gate_norm="sum")) == ["bias", "ln_bias", "ln_c_bias",
                                                    "ln_c_weight", "ln_weight", "weight_hh",
                                                    "weight_ih"]
    assert names(LNLSTM(2, 3, gate_norm="per_gate", gate_bias=False, ln_bias=False)) == [
        "ln_c_weight", "ln_weight", "weight_hh", "weight_ih"]
    assert names(LNLSTM(2, 3, ln_bias=False)) == ["bias", "ln_c_weight", "ln_hh_weight",
                                                  "ln_ih_weight", "weight_hh", "weight_ih"]
    m = LNLSTM(2, 3, gate_norm="sum", carry="normalized", gate_bias=False)
    assert m.params["ln_weight_l0"].shape == (12,) and m.params["ln_c_bias_l0"].shape == (3,)
    assert repr(m).endswith("dtype=float32, gate_norm='sum', carry='normalized', "
                            "gate_bias=False)")


@pytest.mark.parametrize("cell", CELLS, ids=CELL_IDS)
def test_step_and_stream_table_equal_forward(cell):
    """step() with state in and out, and a StreamTable's streams, bitwise one
    forward (float32)."""
    m = make(*cell, gate_bias=False, dtype=np.float32, H=16)
    x = np.random.default_rng(6).standard_normal((6, 3, 5)).astype(np.float32)
    y, (h, c) = m.forward(x, cache=False)
    state = None
    for t in range(6):
        yt, state = m.step(x[t], state)
        assert yt.tobytes() == y[t].tobytes()
    assert state[1].tobytes() == c.tobytes()
    table = StreamTable(m, capacity=4)
    ids = [table.open() for _ in range(3)]
    for t in range(6):
        yt = table.step(ids, x[t])
    assert yt.tobytes() == y[-1].tobytes()


def test_copies_keep_the_variant(tmp_path):
    """Pickling, .to, a float64 copy and the served model's file keep the
    options, the parameters and the outputs."""
    from fastln.serve.model import load_model, save_model

    m = make("per_gate", "normalized", gate_bias=False, dtype=np.float32, L=1)
    x = np.random.default_rng(7).standard_normal((4, 2, 5)).astype(np.float32)
    y = m.forward(x, cache=False)[0]
    back = pickle.loads(pickle.dumps(m))
    assert back.forward(x, cache=False)[0].tobytes() == y.tobytes()
    wide = m.to(np.float64)
    assert (wide.gate_norm, wide.carry, wide.gate_bias) == ("per_gate", "normalized", False)
    close(wide.forward(x.astype(np.float64), cache=False)[0], y.astype(np.float64),
          np.float32)
    save_model(tmp_path / "m.npz", m)
    served = load_model(tmp_path / "m.npz")
    assert repr(served) == repr(m)
    assert served.forward(x, cache=False)[0].tobytes() == y.tobytes()


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="gate_norm must be 'pair', 'sum' or 'per_gate'"):
        LNLSTM(2, 3, gate_norm="two")
    with pytest.raises(ValueError, match="carry must be 'raw' or 'normalized'"):
        LNLSTM(2, 3, carry=None)
    with pytest.raises(TypeError, match="gate_bias must be a bool"):
        LNLSTM(2, 3, gate_bias=0)
    with pytest.raises(TypeError, match="ln_bias must be a bool"):
        LNLSTM(2, 3, ln_bias="no")
    m = LNLSTM(2, 3, gate_bias=False)
    with pytest.raises(ValueError, match=r"unexpected \['bias_l0'\]"):
        m.load_state_dict(LNLSTM(2, 3).state_dict())
    with pytest.raises(ValueError, match="gate_norm must be"):
        ref.lnlstm_forward(m.params, np.zeros((1, 1, 2)), gate_norm="sums")
