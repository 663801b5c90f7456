"""int8 inference of the recurrent models (fastln.rnn.quantize).

- The products: through a plain ReLU RNN at one step, the engine's int8
  product x W^T (and h W_hh^T) is recovered exactly and compared bit for bit
  with the NumPy scheme (rnn_reference.int8_product), on every path, odd
  sizes included, and with NaN, infinity and zero rows.
- Whole models against the float64 reference run with the same int8
  products, every cell, layers and directions.
- Bitwise: a row alone and in batches up to 256, 1 to 3 threads, the x86
  paths against each other, step() against forward; quantizing twice,
  pickling, state_dict.
- Accuracy: the plain LSTM against ONNX Runtime's int8 on the same weights
  and inputs; the LN-LSTM's first steps; weights' bytes.
- Refusals: backward, cache=True, .to(), a second quantize, bad weights.
"""
import pickle

import numpy as np
import pytest

import fastln
from fastln import rnn_reference
from fastln.rnn import GRU, LNGRU, LNLSTM, LNRNN, LSTM, RNN, StreamTable, int8_products, quantize

from _util import run_python

X86 = ("avx2", "avx512")

MODELS = [
    pytest.param(lambda I, H, **kw: LNLSTM(I, H, num_layers=2, seed=1, **kw), id="LNLSTM"),
    pytest.param(lambda I, H, **kw: LNGRU(I, H, seed=2, **kw), id="LNGRU"),
    pytest.param(lambda I, H, **kw: LNRNN(I, H, seed=3, **kw), id="LNRNN"),
    pytest.param(lambda I, H, **kw: LSTM(I, H, seed=4, **kw), id="LSTM"),
    pytest.param(lambda I, H, **kw: GRU(I, H, seed=5, **kw), id="GRU"),
    pytest.param(lambda I, H, **kw: GRU(I, H, seed=6, linear_before_reset=False, **kw),
                 id="GRU-rf"),
    pytest.param(lambda I, H, **kw: RNN(I, H, seed=7, **kw), id="RNN"),
    pytest.param(lambda I, H, **kw: LNLSTM(I, H, num_layers=2, seed=8, gate_norm="sum",
                                           carry="normalized", gate_bias=False, **kw),
                 id="LNLSTM-sum"),
    pytest.param(lambda I, H, **kw: LNLSTM(I, H, seed=9, gate_norm="per_gate", **kw),
                 id="LNLSTM-per-gate"),
]

REFERENCE = {LNLSTM: "lnlstm_forward", LNGRU: "lngru_forward", LNRNN: "lnrnn_forward",
             LSTM: "lstm_forward", GRU: "gru_forward", RNN: "rnn_forward"}


def _reference(m, x, **kw):
    fn = getattr(rnn_reference, REFERENCE[type(m)])
    extra = {}
    if isinstance(m, GRU):
        extra["linear_before_reset"] = m.linear_before_reset
    if isinstance(m, (RNN, LNRNN)):
        extra["nonlinearity"] = m.nonlinearity
    if isinstance(m, (LNLSTM, LNGRU, LNRNN)):
        extra["eps"] = m.eps
    if isinstance(m, LNLSTM):
        extra.update(gate_norm=m.gate_norm, carry=m.carry)
    return fn(m.params, x, num_layers=m.num_layers, bidirectional=m.bidirectional,
              **extra, **kw)


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.fixture
def threads():
    before = fastln.get_num_threads()
    yield fastln.set_num_threads
    fastln.set_num_threads(before)


# ---- the products, exactly ----

@pytest.mark.parametrize("I,H,B", [(1, 1, 1), (3, 5, 2), (17, 33, 7), (64, 100, 9),
                                   (130, 64, 33), (5, 7, 256)])
def test_products_exact(isa, I, H, B):
    """y = relu(x W_ih^T + h W_hh^T) at one step with zero biases: with h =
    0 the positive and negative parts of x W_ih^T come from x and -x (whose
    quantization is the mirror image), with x = 0 those of h W_hh^T; each
    is bitwise the NumPy scheme's."""
    rng = np.random.default_rng(I * 1000 + H)
    m = quantize(RNN(I, H, seed=I + H, nonlinearity="relu"))
    x = (rng.standard_normal((1, B, I)) * rng.uniform(0.1, 10, (1, B, 1))).astype(np.float32)
    h = (rng.standard_normal((1, B, H)) * 3).astype(np.float32)
    x[0, 0] = 0   # a row of zeros
    zero_x, zero_h = np.zeros_like(x), np.zeros_like(h)
    got_ih = m.forward(x, cache=False)[0][0] - m.forward(-x, cache=False)[0][0]
    got_hh = m.forward(zero_x, h, cache=False)[0][0] - m.forward(zero_x, -h, cache=False)[0][0]
    want_ih = rnn_reference.int8_product(x[0], m.params["weight_ih_l0"],
                                         m.params["weight_ih_scale_l0"])
    want_hh = rnn_reference.int8_product(h[0], m.params["weight_hh_l0"],
                                         m.params["weight_hh_scale_l0"])
    assert np.array_equal(_bits(got_ih), _bits(want_ih.astype(np.float32)))
    assert np.array_equal(_bits(got_hh), _bits(want_hh.astype(np.float32)))
    assert np.array_equal(m.forward(zero_x, zero_h, cache=False)[0], np.zeros((1, B, H)))


def test_non_finite_rows(isa):
    """A row of x with NaN or infinity gives NaN in that row only (its whole
    product is NaN: the row has no int8 scale); others are as alone."""
    m = quantize(LNLSTM(6, 8, seed=0))
    x = np.random.default_rng(0).standard_normal((3, 4, 6)).astype(np.float32)
    x[1, 1, 2] = np.nan
    x[1, 2, 0] = np.inf
    y = m.forward(x, cache=False)[0]
    assert np.isnan(y[1:, 1:3]).all()
    assert np.isfinite(y[:, [0, 3]]).all() and np.isfinite(y[0]).all()
    assert np.array_equal(y[:, 3], m.forward(x[:, 3:], cache=False)[0][:, 0])


# ---- whole models ----

@pytest.mark.parametrize("make", MODELS)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_matches_reference(make, bidirectional):
    """The int8 model against the float64 reference with the same int8
    products (their inputs differ in the last bits of float32 against
    float64, so an input value may round to the next int8 step)."""
    m = quantize(make(5, 24, bidirectional=bidirectional))
    x = np.random.default_rng(1).standard_normal((4, 3, 5)).astype(np.float32)
    y, state = m.forward(x, cache=False)
    yr, stater = _reference(m, x)
    np.testing.assert_allclose(y, yr, atol=2e-2)
    for a, b in zip(state if isinstance(state, tuple) else (state,),
                    stater if isinstance(stater, tuple) else (stater,)):
        np.testing.assert_allclose(a, b, atol=2e-2)
    assert y.dtype == np.float32


@pytest.mark.parametrize("make", MODELS)
def test_batch_and_threads_bitwise(make, threads):
    """Each row alone equals the row in batches of 2 to 256 (with lengths
    too), for 1, 2 and 3 threads: bitwise."""
    m = quantize(make(7, 40))
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 256, 7)).astype(np.float32)
    lengths = rng.integers(1, 7, 256)
    threads(1)
    alone = [m.forward(x[:, b:b + 1], cache=False, lengths=lengths[b:b + 1])[0]
             for b in (0, 1, 100, 255)]
    for nt in (1, 2, 3):
        threads(nt)
        for B in (2, 7, 33, 256):
            y = m.forward(x[:, :B], cache=False, lengths=lengths[:B])[0]
            assert np.array_equal(_bits(y[:, :1]), _bits(alone[0])), (nt, B)
            assert np.array_equal(_bits(y[:, 1:2]), _bits(alone[1])), (nt, B)
        y = m.forward(x, cache=False, lengths=lengths)[0]
        assert np.array_equal(_bits(y[:, 100:101]), _bits(alone[2])), nt
        assert np.array_equal(_bits(y[:, 255:]), _bits(alone[3])), nt


@pytest.mark.parametrize("make", MODELS[:2])
def test_bidirectional_rows_bitwise(make, threads):
    """Both directions, lengths, batches whose rows the threads split among
    them (2 to 32 rows a thread) or share: each row as alone."""
    m = quantize(make(5, 32, bidirectional=True))
    rng = np.random.default_rng(6)
    x = rng.standard_normal((7, 40, 5)).astype(np.float32)
    lengths = rng.integers(1, 8, 40)
    threads(2)
    for B in (4, 9, 40):
        y = m.forward(x[:, :B], cache=False, lengths=lengths[:B])[0]
        for b in (0, B - 1):
            alone = m.forward(x[:, b:b + 1], cache=False, lengths=lengths[b:b + 1])[0]
            assert np.array_equal(_bits(y[:, b:b + 1]), _bits(alone)), (B, b)


@pytest.mark.parametrize("H", [48, 37])
@pytest.mark.parametrize("make", MODELS)
def test_paths_agree(make, H):
    """The x86 paths give bitwise the same outputs (their int8 kernels,
    VPDPBUSD or VPMADDWD, sum exactly, and an int8 layer's LayerNorm sums run
    in one order on every path); the generic path's row kernels round without
    fused multiply-adds, so it agrees to float32 rounding. H 37: LN sums
    whose last block of lanes is partial."""
    m = quantize(make(9, H))
    x = np.random.default_rng(3).standard_normal((5, 6, 9)).astype(np.float32)
    before = fastln.get_isa()
    out = {}
    try:
        for name in fastln.supported_isas():
            fastln._lib._set_isa(name)
            out[name] = m.forward(x, cache=False)[0]
    finally:
        fastln._lib._set_isa(before)
    x86 = [out[name] for name in X86 if name in out]
    for y in x86[1:]:
        assert np.array_equal(_bits(y), _bits(x86[0]))
    if x86:
        np.testing.assert_allclose(out["generic"], x86[0], atol=1e-5)


def test_vpmaddwd_kernel_agrees_with_vpdpbusd():
    """On AVX-512, FASTLN_NO_VNNI=1 runs the VPMADDWD kernel instead of
    VPDPBUSD: the same outputs, bit for bit (and the same as the AVX2 path's
    where the CPU has no VNNI at all)."""
    code = """
import numpy as np, fastln
from fastln.rnn import LNLSTM, GRU, quantize, int8_products
out = []
for make in (lambda: LNLSTM(9, 48, seed=1), lambda: GRU(9, 48, seed=2)):
    q = quantize(make())
    x = np.random.default_rng(3).standard_normal((5, 11, 9)).astype(np.float32)
    out.append(q.forward(x, cache=False)[0].tobytes().hex())
print(int8_products(), *out, sep="|")
"""
    import os
    runs = [run_python(code, env=dict(os.environ, FASTLN_NO_VNNI=flag)) for flag in ("0", "1")]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    (k0, *y0), (k1, *y1) = (r.stdout.strip().split("|") for r in runs)
    assert y0 == y1
    if fastln.get_isa() == "avx512":
        assert k1 == "AVX-512 (VPMADDWD)", k1


def test_kernel_names(isa):
    assert int8_products() in {"avx512": ("AVX512-VNNI", "AVX-512 (VPMADDWD)"),
                               "avx2": ("AVX2 (VPMADDWD)",),
                               "generic": ("C",)}[isa]


@pytest.mark.parametrize("make", MODELS)
def test_step_and_table_match_forward(make):
    """A stream of step() calls, with out= and state_out= in place, and a
    StreamTable give bitwise one forward's outputs."""
    m = quantize(make(4, 32))
    x = np.random.default_rng(4).standard_normal((5, 3, 4)).astype(np.float32)
    y, final = m.forward(x, cache=False)
    state, out = None, np.empty((3, 32), np.float32)
    for t in range(5):
        h, state = m.step(x[t], state, out=out if t else None)
        assert np.array_equal(_bits(h), _bits(y[t]))
    for a, b in zip(state if isinstance(state, tuple) else (state,),
                    final if isinstance(final, tuple) else (final,)):
        assert np.array_equal(_bits(a), _bits(b))
    table = StreamTable(m, capacity=8)
    ids = [table.open() for _ in range(3)]
    for t in range(5):
        ht = table.step(ids, x[t])
    assert np.array_equal(_bits(ht), _bits(y[-1]))


# ---- the model: determinism, storage, refusals ----

def test_quantize_is_deterministic_and_keeps_the_float_model():
    m = LNLSTM(6, 16, num_layers=2, bidirectional=True, seed=0)
    before = {k: v.copy() for k, v in m.params.items()}
    a, b = quantize(m), quantize(m)
    assert sorted(a.params) == sorted(b.params)
    for key in a.params:
        assert np.array_equal(a.params[key], b.params[key]), key
    for key, v in before.items():
        assert np.array_equal(m.params[key], v)
    assert a.params["weight_ih_l1_reverse"].dtype == np.int8
    assert a.params["weight_ih_scale_l1_reverse"].shape == (64,)
    w, q, s = (m.params["weight_hh_l0"], a.params["weight_hh_l0"],
               a.params["weight_hh_scale_l0"])
    assert np.abs(q).max() == 127
    np.testing.assert_allclose(q * s[:, None].astype(np.float64), w, atol=s.max() / 2 * 1.0001)
    assert "weights=int8" in repr(a) and a.dtype == np.float32


def test_pickle_and_state_dict_keep_it_bitwise(tmp_path):
    m = quantize(LNGRU(5, 12, seed=1))
    x = np.random.default_rng(5).standard_normal((4, 2, 5)).astype(np.float32)
    y = m.forward(x, cache=False)[0]
    back = pickle.loads(pickle.dumps(m))
    assert np.array_equal(back.forward(x, cache=False)[0], y)
    np.savez(tmp_path / "q.npz", **m.state_dict())
    other = quantize(LNGRU(5, 12, seed=9))
    other.load_state_dict(dict(np.load(tmp_path / "q.npz")))
    assert np.array_equal(other.forward(x, cache=False)[0], y)
    assert not other.params["weight_ih_l0"].flags.writeable


def test_refusals():
    m = quantize(LSTM(3, 4, seed=0))
    x = np.ones((2, 1, 3), np.float32)
    with pytest.raises(TypeError, match="inference only"):
        m.forward(x)
    with pytest.raises(TypeError, match="no backward"):
        m.backward(np.ones((2, 1, 4), np.float32))
    with pytest.raises(TypeError, match="int8"):
        m.to(np.float64)
    with pytest.raises(ValueError, match="int8 already"):
        quantize(m)
    with pytest.raises(TypeError, match="fastln.rnn model"):
        quantize(np.ones(3))
    bad = LSTM(3, 4, seed=0)
    bad.params["weight_hh_l0"][0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        quantize(bad)
    sd = m.state_dict()
    sd["weight_ih_l0"] = sd["weight_ih_l0"].astype(np.float32)
    with pytest.raises(TypeError, match="int8 values"):
        m.load_state_dict(sd)
    sd["weight_ih_l0"] = np.full((16, 3), 300)
    with pytest.raises(ValueError, match=r"\[-128, 127\]"):
        m.load_state_dict(sd)


def test_quantizes_float64_and_bfloat16_models():
    m = LNRNN(3, 8, seed=0, dtype=np.float64)
    a = quantize(m)
    b = quantize(m.to(np.float32))
    for key in a.params:
        assert np.array_equal(a.params[key], b.params[key]) or key.startswith("weight"), key
    x = np.ones((2, 1, 3), np.float32)
    assert a.forward(x, cache=False)[0].dtype == np.float32
    ml_dtypes = pytest.importorskip("ml_dtypes")
    c = quantize(m.to(ml_dtypes.bfloat16))
    assert c.params["weight_hh_l0"].dtype == np.int8


def test_weight_bytes():
    """int8 weights take about a quarter of float32's bytes (the scales and
    the float32 gains and biases add the rest)."""
    for H in (256, 1024):
        for cls in (LSTM, LNLSTM):
            m = cls(128, H, seed=0)
            ratio = (sum(v.nbytes for v in quantize(m).params.values())
                     / sum(v.nbytes for v in m.params.values()))
            assert ratio <= 0.27, (cls.__name__, H, ratio)


# ---- accuracy ----

def test_lnlstm_first_steps_close_to_float():
    """The LN-LSTM's first ten steps stay near the float32 model's (the
    default LN-LSTM is chaotic over long sequences, see docs/performance.md)."""
    m = LNLSTM(64, 128, seed=1)
    x = np.random.default_rng(0).standard_normal((10, 4, 64)).astype(np.float32)
    err = np.abs(quantize(m).forward(x, cache=False)[0] - m.forward(x, cache=False)[0]).max()
    assert err < 0.1, err


def test_lstm_error_within_onnxruntime_int8(torch):
    """A torch.nn.LSTM's weights, 100 steps of N(0, 1) input: fastln's int8
    error against float32 is no larger than ONNX Runtime's int8
    (quantize_dynamic) on the same weights and input."""
    import onnxruntime as ort

    from bench.rnn_grid import INPUT, _onnx_model
    from fastln._selfcheck import ort_int8_model
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(INPUT, 64)
    m = LSTM.from_torch(lstm)
    x = np.random.default_rng(0).standard_normal((100, 4, INPUT)).astype(np.float32)
    y32 = m.forward(x, cache=False)[0]
    fast = np.abs(quantize(m).forward(x, cache=False)[0] - y32).max()
    model = ort_int8_model(_onnx_model("lstm", lstm))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    yq = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    yq = yq.reshape(100, 4, 64) if yq.ndim == 3 else yq[:, 0]
    peer = np.abs(yq - y32).max()
    assert fast <= peer, (fast, peer)
