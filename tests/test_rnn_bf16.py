"""bfloat16 inference of the recurrent models, batch invariance, and packed weights.

- Batch invariance: a row's outputs are bitwise the same alone and inside
  batches of 2, 7, 64 and 256 (step() and forward(cache=False)), on the
  float32 and bfloat16 paths of x86 (AVX2, AVX-512, and bfloat16 on AMX and
  on VDPBF16PS), which is what lets a served model's replies be checked bit
  for bit.
- bfloat16 models (``.to(ml_dtypes.bfloat16)``): parameters, errors,
  accuracy against the float32 model and the float64 reference with stated
  bounds, steps against one forward, bfloat16 and float32 inputs (strided
  and misaligned too), torch; the float32 <-> bfloat16 conversions against
  ml_dtypes' bits.
- Packed weights: read-only weights give bitwise what writable ones give,
  and a replaced array is packed again.
"""
import pickle

import numpy as np
import pytest

import fastln
from fastln import rnn_reference
from fastln.rnn import GRU, LNGRU, LNLSTM, LNRNN, LSTM, RNN

from _util import run_python

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)


MODELS = [
    pytest.param(lambda I, H: LNLSTM(I, H, num_layers=2, seed=1), id="LNLSTM"),
    pytest.param(lambda I, H: LNGRU(I, H, seed=2), id="LNGRU"),
    pytest.param(lambda I, H: LNRNN(I, H, seed=3), id="LNRNN"),
    pytest.param(lambda I, H: LSTM(I, H, seed=4), id="LSTM"),
    pytest.param(lambda I, H: GRU(I, H, seed=5), id="GRU"),
    pytest.param(lambda I, H: GRU(I, H, seed=6, linear_before_reset=False), id="GRU-rf"),
    pytest.param(lambda I, H: RNN(I, H, seed=7, nonlinearity="relu"), id="RNN"),
    pytest.param(lambda I, H: LNLSTM(I, H, num_layers=2, seed=8, gate_norm="sum",
                                     carry="normalized", gate_bias=False), id="LNLSTM-sum"),
    pytest.param(lambda I, H: LNLSTM(I, H, seed=9, gate_norm="per_gate", ln_bias=False),
                 id="LNLSTM-per-gate"),
]


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint16 if a.dtype == BF16 else np.uint32 if a.itemsize == 4 else np.uint64)


def _read_only(m):
    for a in m.params.values():
        a.flags.writeable = False
    return m


def _parts(state):
    """A state as a tuple of arrays: (h,) or (h, c)."""
    return state if isinstance(state, tuple) else (state,)


def _state_rows(state, rows):
    if isinstance(state, tuple):
        return tuple(s[:, rows] for s in state)
    return state[:, rows]


def _assert_row_invariant(m, I, T=4, rng=None):
    """Row 0 alone against row 0 (and the last row) inside batches of 2, 7, 64, 256."""
    rng = rng or np.random.default_rng(0)
    x = rng.standard_normal((T, 256, I)).astype(np.float64 if m.dtype == np.float64
                                                 else np.float32)
    st0 = None
    alone_y, alone_state = m.forward(x[:, :1], cache=False)
    last_y, _ = m.forward(x[:, 255:256], cache=False)
    _, st0 = m.forward(x[:1, :256], cache=False)   # a nonzero state for the steps
    alone_step, alone_sst = m.step(x[1, :1], _state_rows(st0, slice(0, 1)))
    for B in (2, 7, 64, 256):
        xb = np.concatenate([x[:, :B - 1], x[:, 255:256]], axis=1) if B < 256 else x
        y, state = m.forward(xb, cache=False)
        assert np.array_equal(_bits(y[:, :1]), _bits(alone_y)), B
        assert np.array_equal(_bits(y[:, B - 1:B]), _bits(last_y)), B
        for a, b in zip(_parts(state), _parts(alone_state)):
            assert np.array_equal(_bits(a[:, :1]), _bits(b)), B
        ys, sst = m.step(x[1, :B], _state_rows(st0, slice(0, B)))
        assert np.array_equal(_bits(ys[:1]), _bits(alone_step)), B
        for a, b in zip(_parts(sst), _parts(alone_sst)):
            assert np.array_equal(_bits(a[:, :1]), _bits(b)), B


@pytest.mark.parametrize("make", MODELS)
@pytest.mark.parametrize("dtype", ["float32", "float32-read-only", "bfloat16", "float64"])
def test_batch_invariance(make, dtype):
    m = make(12, 40)
    if dtype == "bfloat16":
        m = m.to(BF16)
    elif dtype == "float64":
        m = m.to(np.float64)
    elif dtype.endswith("read-only"):
        m = _read_only(m)
    _assert_row_invariant(m, 12)


def test_batch_invariance_bidirectional_and_lengths():
    m = LNLSTM(6, 33, num_layers=2, bidirectional=True, seed=3)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 64, 6)).astype(np.float32)
    lengths = rng.integers(1, 10, 64)
    for model in (m, m.to(BF16)):
        y, _ = model.forward(x, lengths=lengths, cache=False)
        for b in (0, 17, 63):
            yb, _ = model.forward(x[:, b:b + 1], lengths=lengths[b:b + 1], cache=False)
            assert np.array_equal(_bits(y[:, b:b + 1]), _bits(yb))


@pytest.mark.parametrize("env", [{"FASTLN_ISA": "avx2"}, {"FASTLN_ISA": "generic"},
                                 {"FASTLN_NO_AMX": "1"}], ids=["avx2", "generic", "no-amx"])
def test_batch_invariance_other_paths(env):
    """The same property on the AVX2 and generic paths (float and double
    kernels, bfloat16 weights widened) and on VDPBF16PS instead of AMX."""
    if env.get("FASTLN_ISA", "generic") not in fastln.supported_isas():
        pytest.skip(f"this CPU does not run {env['FASTLN_ISA']}")
    code = """
import numpy as np, ml_dtypes, fastln, fastln.rnn._engine
import test_rnn_bf16 as t
from fastln.rnn import LNLSTM, GRU
for make in (lambda: LNLSTM(12, 40, seed=1), lambda: GRU(12, 40, seed=2)):
    m = make()
    t._assert_row_invariant(m, 12)
    t._assert_row_invariant(m.to(ml_dtypes.bfloat16), 12)
    t._assert_row_invariant(m.to(np.float64), 12)
print("ok", fastln.rnn._engine.bf16_products())
"""
    import os
    env = dict(os.environ, **env)
    env["PYTHONPATH"] = os.path.dirname(os.path.abspath(__file__))
    out = run_python(code, env=env)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-2000:]
    # the products ran where the environment sent them: AVX2 has no bfloat16
    # products; without AMX, VDPBF16PS where the CPU has it
    here = fastln.rnn._engine.bf16_products()
    want = "float32" if "FASTLN_ISA" in env or here == "float32" else "AVX512-BF16"
    assert out.stdout.split()[1] == want, out.stdout


# ---- bfloat16 models ----

def test_to_and_parameters():
    m = LNLSTM(5, 7, num_layers=2, seed=0)
    b = m.to(BF16)
    assert b is not m and b.dtype == BF16 and m.dtype == np.float32
    assert "dtype=bfloat16" in repr(b)
    for key, value in b.params.items():
        if key.startswith("weight_"):
            assert value.dtype == BF16 and not value.flags.writeable
            assert np.array_equal(value, m.params[key].astype(BF16))
        else:
            assert value.dtype == np.float32
            assert np.array_equal(value, m.params[key])
    sd = b.state_dict()
    assert all(sd[k].dtype == b.params[k].dtype for k in sd)
    c = LNLSTM(5, 7, num_layers=2, dtype=BF16, seed=9)
    c.load_state_dict(sd)
    assert all(np.array_equal(_bits(c.params[k]), _bits(b.params[k])) for k in sd)
    assert not c.params["weight_hh_l1"].flags.writeable
    back = b.to(np.float32)
    assert back.params["weight_ih_l0"].dtype == np.float32
    assert np.array_equal(back.params["weight_ih_l0"], b.params["weight_ih_l0"].astype(np.float32))
    d = pickle.loads(pickle.dumps(b))
    assert not d.params["weight_ih_l0"].flags.writeable
    x = np.ones((3, 2, 5), np.float32)
    assert np.array_equal(_bits(d.forward(x, cache=False)[0]), _bits(b.forward(x, cache=False)[0]))


def test_inference_only_and_bad_dtypes():
    b = LNGRU(3, 4, seed=0).to(BF16)
    x = np.ones((2, 1, 3), np.float32)
    with pytest.raises(TypeError, match="inference only"):
        b.forward(x)
    with pytest.raises(TypeError, match="inference only"):
        b.backward(np.ones((2, 1, 4), BF16))
    with pytest.raises(TypeError, match="x has dtype float64, but the bfloat16 model takes"):
        b.forward(np.ones((2, 1, 3)), cache=False)
    with pytest.raises(TypeError, match="state has dtype bfloat16"):
        b.forward(x, np.zeros((1, 1, 4), BF16), cache=False)
    with pytest.raises(TypeError, match="dtype must be float32, float64 or ml_dtypes.bfloat16"):
        LNGRU(3, 4).to(np.float16)
    with pytest.raises(TypeError, match="dtype must be"):
        LNGRU(3, 4, dtype="int32")


@pytest.mark.parametrize("make", MODELS)
def test_inputs_in_bfloat16_or_float32(make):
    """The products round x to bfloat16: float32 x and x.astype(bfloat16)
    give the same bits; y is bfloat16, the state float32."""
    b = make(6, 20).to(BF16)
    x = np.random.default_rng(2).standard_normal((5, 3, 6)).astype(np.float32)
    y32, s32 = b.forward(x, cache=False)
    yb, sb = b.forward(x.astype(BF16), cache=False)
    assert y32.dtype == BF16
    assert np.array_equal(_bits(y32), _bits(yb))
    for a, c in zip(_parts(s32), _parts(sb)):
        assert a.dtype == np.float32 and np.array_equal(a, c)


def test_bfloat16_inputs_any_layout():
    """A bfloat16 x that is strided, or misaligned in its buffer (as a dask
    worker may receive it), gives the bits of a contiguous copy."""
    b = LNLSTM(6, 20, seed=3).to(BF16)
    x = np.random.default_rng(4).standard_normal((5, 6, 6)).astype(BF16)
    want, _ = b.forward(np.ascontiguousarray(x[:, ::2]), cache=False)
    got, _ = b.forward(x[:, ::2], cache=False)
    assert np.array_equal(_bits(got), _bits(want))
    raw = np.zeros(x.nbytes + 1, np.uint8)
    odd = raw[1:].view(BF16).reshape(x.shape)
    odd[...] = x
    assert not odd.flags.aligned
    got, _ = b.forward(odd[:, ::2], cache=False)
    assert np.array_equal(_bits(got), _bits(want))
    h, _ = b.step(odd[0, ::2])
    assert np.array_equal(_bits(h), _bits(want[0]))


def test_conversions_round_as_ml_dtypes():
    """The engine's float32 <-> bfloat16 conversions give ml_dtypes' bits:
    nearest even, subnormals kept, inf kept, NaN stays NaN."""
    from fastln import _lib

    rng = np.random.default_rng(5)
    f = (rng.standard_normal(4099) * 10.0 ** rng.integers(-40, 38, 4099)).astype(np.float32)
    f[:6] = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45]
    f[6:10] = np.array([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7F7FFFFF],
                       np.uint32).view(np.float32)   # ties to even, and to inf
    want = f.astype(BF16)
    got = np.empty(f.shape, np.uint16)
    _lib._half_convert(f, got)
    finite = ~np.isnan(f)
    assert np.array_equal(got[finite], _bits(want)[finite])
    assert np.isnan(got.view(BF16)[~finite].astype(np.float32)).all()
    back = np.empty(f.shape, np.float32)
    _lib._half_convert(_bits(want), back)
    assert np.array_equal(back.view(np.uint32), want.astype(np.float32).view(np.uint32))
    with pytest.raises(TypeError, match="float32 and float16 or uint16"):
        _lib._half_convert(f, np.empty(f.shape, np.float32))
    with pytest.raises(ValueError, match="same size"):
        _lib._half_convert(f, np.empty(3, np.uint16))


@pytest.mark.parametrize("make", MODELS)
def test_steps_equal_one_forward(make):
    """A stream of step() calls is bitwise one forward over the same inputs:
    the state crosses the API in float32 and loses nothing."""
    b = make(8, 24).to(BF16)
    x = np.random.default_rng(3).standard_normal((100, 2, 8)).astype(np.float32)
    y, final = b.forward(x, cache=False)
    state, ys = None, []
    for t in range(100):
        yt, state = b.step(x[t], state)
        ys.append(yt)
    assert np.array_equal(_bits(np.stack(ys)), _bits(y))
    for a, c in zip(_parts(state), _parts(final)):
        assert np.array_equal(a, c)


def _one_step_errors(make, I=32, H=64, T=30, B=4):
    """max |y_bf16 - y_f32| of one step taken from the float32 model's own state
    at each t, and the same against the float64 reference."""
    m = make(I, H)
    b = m.to(BF16)
    m64 = m.to(np.float64)
    x = np.random.default_rng(4).standard_normal((T, B, I)).astype(np.float32)
    state, err32, err64 = None, 0.0, 0.0
    for t in range(T):
        y32, nxt = m.step(x[t], state)
        yb, _ = b.step(x[t], state)
        s64 = None if state is None else (tuple(s.astype(np.float64) for s in state)
                                          if isinstance(state, tuple) else state.astype(np.float64))
        y64, _ = m64.step(x[t].astype(np.float64), s64)
        err32 = max(err32, float(np.abs(yb.astype(np.float64) - y32).max()))
        err64 = max(err64, float(np.abs(yb.astype(np.float64) - y64).max()))
        state = nxt
    return err32, err64


@pytest.mark.parametrize("make", MODELS)
def test_accuracy_one_step(make):
    """From the same state, a bfloat16 step is within 2e-2 of float32 and of
    float64 (weights and inputs rounded to bfloat16, about 3 significant
    digits, and y rounded to bfloat16; LN rescales the product's error by
    1/std, so LN cells get the looser end)."""
    err32, err64 = _one_step_errors(make)
    assert err32 < 2e-2 and err64 < 2e-2, (err32, err64)
    assert err32 > 0   # bfloat16 really ran


def test_accuracy_lstm_over_a_sequence():
    """A plain LSTM (contracting under the default init) stays within 5e-3 of
    float32 over 100 steps; the LN-LSTM is chaotic, so over a sequence it is
    compared to float32 over the first steps only (its float32 and float64
    runs part later too)."""
    x = np.random.default_rng(5).standard_normal((100, 8, 32)).astype(np.float32)
    m = LSTM(32, 64, seed=0)
    y32, _ = m.forward(x, cache=False)
    yb, _ = m.to(BF16).forward(x, cache=False)
    assert np.abs(yb.astype(np.float32) - y32).max() < 5e-3
    m = LNLSTM(32, 64, seed=0)
    y32, _ = m.forward(x[:5], cache=False)
    yb, _ = m.to(BF16).forward(x[:5], cache=False)
    assert np.abs(yb.astype(np.float32) - y32).max() < 3e-2


def test_reference_with_rounded_weights():
    """Against the float64 reference run on the bfloat16 weights (and x
    rounded to bfloat16): one step agrees to the rounding of h and y."""
    m = LNLSTM(16, 32, seed=1).to(BF16)
    x = np.random.default_rng(6).standard_normal((1, 3, 16)).astype(np.float32)
    y, _ = m.forward(x, cache=False)
    params = {k: v.astype(np.float64) for k, v in m.params.items()}
    want = rnn_reference.lnlstm_forward(params, x.astype(BF16).astype(np.float64),
                                        eps=m.eps)[0]
    np.testing.assert_allclose(y.astype(np.float64), want, atol=8e-3)


def test_from_torch_bfloat16(torch):
    torch.manual_seed(0)
    mod = torch.nn.LSTM(6, 10, num_layers=2).to(torch.bfloat16)
    m = LSTM.from_torch(mod)
    assert m.dtype == BF16 and m.params["weight_ih_l1"].dtype == BF16
    x = torch.randn(7, 3, 6)
    with torch.no_grad():
        want, _ = mod(x.to(torch.bfloat16))
    y, _ = m.forward(x.numpy(), cache=False)
    np.testing.assert_allclose(y.astype(np.float32), want.float().numpy(), atol=3e-2)


# ---- packed weights ----

@pytest.mark.parametrize("make", MODELS)
def test_read_only_weights_same_bits(make):
    m = make(9, 35)
    x = np.random.default_rng(7).standard_normal((6, 5, 9)).astype(np.float32)
    y, _ = m.forward(x, cache=False)
    ro = _read_only(m.to(np.float32))
    assert np.array_equal(ro.forward(x, cache=False)[0], y)
    assert np.array_equal(ro.forward(x, cache=False)[0], y)   # from the kept packing
    assert np.array_equal(ro.step(x[0])[0], m.step(x[0])[0])


def test_replaced_weights_are_packed_again():
    m = _read_only(LNLSTM(4, 8, seed=0))
    other = LNLSTM(4, 8, seed=1)
    x = np.ones((3, 2, 4), np.float32)
    m.forward(x, cache=False)
    w = other.params["weight_hh_l0"].copy()
    w.flags.writeable = False
    m.params["weight_hh_l0"] = w
    fresh = LNLSTM(4, 8, seed=0)
    fresh.params["weight_hh_l0"][...] = other.params["weight_hh_l0"]
    assert np.array_equal(m.forward(x, cache=False)[0], fresh.forward(x, cache=False)[0])
    b = LNLSTM(4, 8, seed=0).to(BF16)
    b.forward(x, cache=False)
    b.load_state_dict(other.state_dict())
    assert np.array_equal(_bits(b.forward(x, cache=False)[0]),
                          _bits(other.to(BF16).forward(x, cache=False)[0]))


def test_writable_weights_follow_in_place_changes():
    m = LNGRU(4, 8, seed=0)
    x = np.ones((3, 2, 4), np.float32)
    y0, _ = m.forward(x, cache=False)
    m.params["weight_ih_l0"] *= 0.5
    y1, _ = m.forward(x, cache=False)
    fresh = LNGRU(4, 8, seed=0)
    fresh.params["weight_ih_l0"] *= 0.5
    assert not np.array_equal(y0, y1)
    assert np.array_equal(y1, fresh.forward(x, cache=False)[0])
