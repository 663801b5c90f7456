"""LSTM with proj_size (LSTMP): against torch.nn.LSTM(proj_size=P) and the
float64 reference, step() and StreamTable against forward, bfloat16 and
int8, every ISA path, thread counts, batch invariance, packed weights, and
the refusals (training, serving, bad sizes)."""
import numpy as np
import pytest

import fastln
from fastln import rnn_reference as ref
from fastln.rnn import LSTM, StreamTable, quantize

X86 = ("avx2", "avx512")


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint32 if a.dtype.itemsize == 4 else np.uint64)


def _model(H=24, P=7, I=5, L=2, dtype=np.float32, seed=0, **kw):
    m = LSTM(I, H, num_layers=L, proj_size=P, dtype=dtype, seed=seed, **kw)
    rng = np.random.default_rng(seed + 1)
    for key, p in m.params.items():   # biases away from 0, weights a bit larger
        p[...] = rng.uniform(-1.2, 1.2, p.shape) / np.sqrt(p.shape[-1]) if "weight" in key \
            else 0.3 * rng.standard_normal(p.shape)
    return m


@pytest.fixture
def threads():
    before = fastln.get_num_threads()
    yield fastln.set_num_threads
    fastln.set_num_threads(before)


@pytest.mark.parametrize("bi,bf,L", [(False, False, 1), (False, True, 2), (True, False, 2)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matches_torch_nn_lstm_with_proj_size(torch, dtype, bi, bf, L):
    """from_torch of nn.LSTM(proj_size): 50 steps within 1e-10 in float64,
    the first 10 within 1e-5 in float32, outputs and final states."""
    torch.manual_seed(0)
    t = torch.nn.LSTM(6, 32, num_layers=L, proj_size=9, bidirectional=bi, batch_first=bf,
                      dtype=getattr(torch, dtype))
    m = LSTM.from_torch(t)
    assert m.proj_size == 9 and m.params["weight_hh_l0"].shape == (128, 9)
    T = 50 if dtype == "float64" else 10
    D = 2 if bi else 1
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, T, 6) if bf else (T, 3, 6)).astype(dtype)
    h0 = rng.standard_normal((D * L, 3, 9)).astype(dtype)
    c0 = rng.standard_normal((D * L, 3, 32)).astype(dtype)
    y, (h, c) = m.forward(x, (h0, c0), cache=False)
    with torch.no_grad():
        yt, (ht, ct) = t(torch.from_numpy(x), (torch.from_numpy(h0), torch.from_numpy(c0)))
    tol = 1e-10 if dtype == "float64" else 1e-5
    assert y.shape == yt.shape and h.shape == (D * L, 3, 9) and c.shape == (D * L, 3, 32)
    for got, want in ((y, yt), (h, ht), (c, ct)):
        np.testing.assert_allclose(got, want.numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("bi", [False, True])
def test_matches_reference_with_lengths(bi):
    m = _model(dtype=np.float64, bidirectional=bi)
    x = np.random.default_rng(2).standard_normal((8, 4, 5))
    lengths = np.array([8, 3, 1, 6])
    y, (h, c) = m.forward(x, lengths=lengths, cache=False)
    yr, (hr, cr) = ref.lstm_forward(m.params, x, lengths=lengths, num_layers=2,
                                    bidirectional=bi)
    for got, want in ((y, yr), (h, hr), (c, cr)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert not y[3:, 1].any() and not y[1:, 2].any()   # 0 after each sequence's end


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "int8"])
def test_step_and_stream_table_equal_forward(fmt):
    m = _model()
    if fmt == "int8":
        m = quantize(m)
    elif fmt == "bfloat16":
        m = m.to(pytest.importorskip("ml_dtypes").bfloat16)
    x = np.random.default_rng(3).standard_normal((6, 3, 5)).astype(np.float32)
    y, (h, c) = m.forward(x, cache=False)
    state = None
    out = np.empty((3, 7), y.dtype)
    for t in range(6):
        yt, state = m.step(x[t], state, out=out if t else None,
                           state_out=state if t else None)
        assert yt.tobytes() == y[t].tobytes(), t
    assert state[0].tobytes() == h.tobytes() and state[1].tobytes() == c.tobytes()
    table = StreamTable(m, capacity=5)
    ids = [table.open() for _ in range(3)]
    for t in range(6):
        yt = table.step(ids, x[t])
    assert yt.tobytes() == y[-1].tobytes()
    hs, cs = table.export_state(ids[1])
    assert hs.shape == (2, 1, 7) and cs.shape == (2, 1, 24)


def test_int8_products_as_the_reference_computes_them():
    """The int8 model against the reference with the same int8 products
    (W_hr's too), and within 1e-2 of the float32 model."""
    m = _model()
    q = quantize(m)
    assert q.params["weight_hr_l0"].dtype == np.int8 and "weight_hr_scale_l0" in q.params
    x = np.random.default_rng(4).standard_normal((5, 3, 5)).astype(np.float32)
    yq, _ = q.forward(x, cache=False)
    yr, _ = ref.lstm_forward(q.params, x, num_layers=2)
    np.testing.assert_allclose(yq, yr, atol=2e-2)
    np.testing.assert_allclose(yq, m.forward(x, cache=False)[0], atol=2e-2)


def test_bfloat16_within_its_rounding():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    m = _model(H=64, P=16, I=32)
    b = m.to(ml_dtypes.bfloat16)
    x = np.random.default_rng(5).standard_normal((1, 4, 32)).astype(np.float32)
    yb, _ = b.forward(x, cache=False)
    assert yb.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(yb.astype(np.float32), m.forward(x, cache=False)[0], atol=2e-2)


@pytest.mark.parametrize("fmt", ["float32", "float64", "int8"])
def test_batch_and_threads_bitwise(fmt, threads):
    """Each row alone equals the row in batches of 2 to 40 (with lengths),
    on 1, 2 and 3 threads."""
    m = _model(H=48, P=16, dtype=np.float64 if fmt == "float64" else np.float32)
    m = quantize(m) if fmt == "int8" else m
    rng = np.random.default_rng(6)
    x = rng.standard_normal((5, 40, 5)).astype(m._dt)
    lengths = rng.integers(1, 6, 40)
    threads(1)
    alone = [m.forward(x[:, b:b + 1], lengths=lengths[b:b + 1], cache=False)[0]
             for b in (0, 1, 39)]
    for nt in (1, 2, 3):
        threads(nt)
        for B in (2, 9, 40):
            y = m.forward(x[:, :B], lengths=lengths[:B], cache=False)[0]
            assert np.array_equal(_bits(y[:, :2]), _bits(np.concatenate(alone[:2], 1))), (nt, B)
        assert np.array_equal(_bits(y[:, 39:]), _bits(alone[2])), nt


@pytest.mark.parametrize("fmt", ["float32", "int8"])
def test_isa_paths(isa, fmt):
    """Every path against the float64 reference (float32), and the x86 paths'
    int8 results bitwise alike (test_int8_paths_agree)."""
    m = _model(H=40, P=13)
    m = quantize(m) if fmt == "int8" else m
    x = np.random.default_rng(7).standard_normal((4, 9, 5)).astype(np.float32)
    y = m.forward(x, cache=False)[0]
    yr = ref.lstm_forward(m.params, x, num_layers=2)[0]
    np.testing.assert_allclose(y, yr, atol=2e-2 if fmt == "int8" else 1e-5)


def test_int8_paths_agree():
    q = quantize(_model(H=40, P=13))
    x = np.random.default_rng(8).standard_normal((4, 9, 5)).astype(np.float32)
    before, out = fastln.get_isa(), {}
    try:
        for name in fastln.supported_isas():
            fastln._lib._set_isa(name)
            out[name] = q.forward(x, cache=False)[0]
    finally:
        fastln._lib._set_isa(before)
    x86 = [out[name] for name in X86 if name in out]
    for y in x86[1:]:
        assert np.array_equal(_bits(y), _bits(x86[0]))


def test_packed_weights_follow_a_replaced_projection():
    """A bfloat16 model packs its frozen weights once; replacing weight_hr
    (another frozen array) packs again."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    b = _model().to(ml_dtypes.bfloat16)
    x = np.random.default_rng(9).standard_normal((3, 2, 5)).astype(np.float32)
    y1 = b.forward(x, cache=False)[0]
    other = _model(seed=5).to(ml_dtypes.bfloat16)
    b.params["weight_hr_l1"] = other.params["weight_hr_l1"]
    y2 = b.forward(x, cache=False)[0]
    assert not np.array_equal(y1.astype(np.float32), y2.astype(np.float32))
    fresh = _model().to(ml_dtypes.bfloat16)
    fresh.params["weight_hr_l1"] = other.params["weight_hr_l1"]
    assert fresh.forward(x, cache=False)[0].tobytes() == y2.tobytes()


def test_refusals_name_the_argument():
    m = _model()
    x = np.zeros((2, 1, 5), np.float32)
    with pytest.raises(TypeError, match="proj_size runs inference only"):
        m.forward(x)
    with pytest.raises(ValueError, match=r"proj_size must be in \[0, hidden_size\)"):
        LSTM(5, 8, proj_size=8)
    with pytest.raises(TypeError, match="proj_size must be an int"):
        LSTM(5, 8, proj_size=2.0)
    with pytest.raises(ValueError, match="state must have shape"):
        m.forward(x, (np.zeros((2, 1, 24), np.float32), np.zeros((2, 1, 24), np.float32)),
                  cache=False)
    from fastln.serve.model import check_streamable
    with pytest.raises(ValueError, match="proj_size"):
        check_streamable(m)
    assert repr(m).endswith("dtype=float32, proj_size=7)")
    assert m.params["weight_hr_l1"].shape == (7, 24) and m.params["weight_ih_l1"].shape == (96, 7)


@pytest.mark.parametrize("P", [32, 13])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layouts_give_the_same_bits(P, dtype):
    """Weights in either order (Fortran-ordered ones are read in place where
    G and P are multiples of the panels' width, else copied) give the same
    bits, over a call long enough to pack and at T = 1."""
    m = _model(H=64, P=P, dtype=dtype)
    x = np.random.default_rng(10).standard_normal((40, 3, 5)).astype(dtype)
    layouts = {}
    for order in ("C", "F", "mixed"):
        for key in m.params:
            if key.startswith("weight_"):
                m.params[key] = np.asarray(m.params[key], order="C" if order == "C" or (
                    order == "mixed" and key.startswith("weight_hr")) else "F")
        layouts[order] = (m.forward(x, cache=False)[0], m.forward(x[:1], cache=False)[0])
    for order in ("F", "mixed"):
        for got, want in zip(layouts[order], layouts["C"]):
            assert got.tobytes() == want.tobytes(), order
