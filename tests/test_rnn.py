"""fastln.rnn (LNRNN, LNLSTM, LNGRU, and the plain LSTM and RNN): forward against
fastln/rnn_reference.py, forward and all gradients against a plain PyTorch autograd reference
(tests/_rnn_torch.py) and against float64 central finite differences; lengths, batch_first,
cache=False, step(), chunking, long sequences, state_dict, init, dtypes and errors, per the
documented API.
"""
import numpy as np
import pytest

from fastln import rnn_reference as ref
from fastln.rnn import GRU, LNGRU, LNLSTM, LNRNN, LSTM, RNN

from _rnn_torch import torch_rnn
from _util import F32, F64, FLOAT_DTYPES, named

# (cell, nonlinearity): every model variant
VARIANTS = [("rnn", "tanh"), ("rnn", "relu"), ("lstm", None), ("gru", None),
            ("rnn_plain", "tanh"), ("rnn_plain", "relu"), ("lstm_plain", None),
            ("gru_plain", None)]
VIDS = ["rnn-tanh", "rnn-relu", "lstm", "gru", "plain-rnn-tanh", "plain-rnn-relu", "plain-lstm",
        "plain-gru"]
CELLS = ["rnn", "lstm", "gru", "rnn_plain", "lstm_plain", "gru_plain"]
CLASSES = {"rnn": LNRNN, "lstm": LNLSTM, "gru": LNGRU, "rnn_plain": RNN, "lstm_plain": LSTM,
           "gru_plain": GRU}
REF = {"rnn": ref.lnrnn_forward, "lstm": ref.lnlstm_forward, "gru": ref.lngru_forward,
       "rnn_plain": ref.rnn_forward, "lstm_plain": ref.lstm_forward, "gru_plain": ref.gru_forward}

variants = pytest.mark.parametrize("variant", VARIANTS, ids=VIDS)
dtypes = pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=["f32", "f64"])


# ---------------------------------------------------------------- helpers

def make(variant, I, H, L=1, dtype=F64, batch_first=False, seed=0, eps=1e-5):
    cell, nl = variant
    kw = dict(input_size=I, hidden_size=H, num_layers=L, batch_first=batch_first,
              dtype=dtype, seed=seed)
    if not is_plain(variant):
        kw["eps"] = eps
    if nl is not None:
        kw["nonlinearity"] = nl
    return CLASSES[cell](**kw)


def random_params(rng, variant, I, H, L, dtype, bidirectional=False):
    """Parameters away from the init (gains != 1, biases != 0, weights a bit larger)."""
    p = {}
    for name, shape in ref.param_shapes(variant[0], I, H, L, bidirectional=bidirectional).items():
        if name.startswith("weight_"):
            a = rng.uniform(-1.5, 1.5, shape) / np.sqrt(H)
        elif "_weight_" in name:                        # LN gains
            a = 1.0 + 0.3 * rng.standard_normal(shape)
        else:                                           # LN biases and the LSTM bias
            a = 0.3 * rng.standard_normal(shape)
        p[name] = a.astype(dtype)
    return p


def randomized(rng, variant, I, H, L=1, dtype=F64, batch_first=False, eps=1e-5):
    """A model with random parameters (loaded with load_state_dict)."""
    m = make(variant, I, H, L, dtype, batch_first, eps=eps)
    m.load_state_dict(random_params(rng, variant, I, H, L, dtype))
    return m


def is_plain(variant):
    return variant[0].endswith("_plain")


def has_cell(variant):
    """The state is (h, c)."""
    return variant[0].startswith("lstm")


def as_tuple(variant, s):
    return tuple(s) if has_cell(variant) else (s,)


def from_tuple(variant, t):
    return tuple(t) if has_cell(variant) else t[0]


def rand_state(rng, variant, L, B, H, dtype):
    n = 2 if has_cell(variant) else 1
    return from_tuple(variant, [rng.standard_normal((L, B, H)).astype(dtype) for _ in range(n)])


def rand_x(rng, T, B, I, dtype, batch_first=False):
    return rng.standard_normal((B, T, I) if batch_first else (T, B, I)).astype(dtype)


def rand_lengths(rng, T, B):
    lengths = rng.integers(1, T + 1, size=B)
    lengths[0] = T                     # one full sequence and, if B > 1, one of length 1
    if B > 1:
        lengths[-1] = 1
    return lengths


def ref_forward(m, variant, x, state=None, lengths=None):
    kw = dict(num_layers=m.num_layers, batch_first=m.batch_first)
    if not is_plain(variant):
        kw["eps"] = m.eps
    if variant[1] is not None:
        kw["nonlinearity"] = variant[1]
    return REF[variant[0]](m.params, x, state, lengths, **kw)


def torch_ref(torch, m, variant, x, state=None, lengths=None, dy=None, dstate=None):
    """The PyTorch reference, in float64, of model ``m`` (its current params)."""
    return torch_rnn(torch, variant[0], m.params, x, state, lengths, num_layers=m.num_layers,
                     eps=m.eps, nonlinearity=variant[1] or "tanh", batch_first=m.batch_first,
                     dy=dy, dstate=dstate)


def tol(dtype):
    """(rtol, atol relative to scale) for a whole recurrent pass in ``dtype``."""
    return (1e-4, 1e-4) if np.dtype(dtype) == np.dtype(F32) else (1e-10, 1e-10)


def check(got, want, dtype, what):
    got = np.asarray(got)
    want = np.asarray(want, F64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert got.dtype == np.dtype(dtype), (what, got.dtype, dtype)
    rtol, atol = tol(dtype)
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    np.testing.assert_allclose(got.astype(F64), want, rtol=rtol, atol=atol * scale, err_msg=what)


def check_state(variant, got, want, dtype, what="state"):
    if has_cell(variant):
        assert isinstance(got, tuple) and len(got) == 2, (what, type(got))
    for i, (g, w) in enumerate(zip(as_tuple(variant, got), as_tuple(variant, want))):
        check(g, w, dtype, "%s[%d]" % (what, i))


def loss_of(variant, y, state, dy, dstate):
    """sum(y*dy) + sum(h_n*dh_n) [+ sum(c_n*dc_n)] in float64."""
    total = float(np.sum(np.asarray(y, F64) * dy))
    for s, ds in zip(as_tuple(variant, state), as_tuple(variant, dstate)):
        total += float(np.sum(np.asarray(s, F64) * ds))
    return total


# ---------------------------------------------------------------- parameters, init, attributes

@pytest.mark.parametrize("L", [1, 3])
@variants
def test_param_names_shapes_and_attributes(variant, L):
    I, H = 6, 5
    for dtype in FLOAT_DTYPES:
        m = make(variant, I, H, L, dtype, batch_first=True, eps=1e-3)
        assert (m.input_size, m.hidden_size, m.num_layers, m.batch_first) == (I, H, L, True)
        assert m.eps == (0.0 if is_plain(variant) else 1e-3)
        assert np.dtype(m.dtype) == np.dtype(dtype)
        want = ref.param_shapes(variant[0], I, H, L)
        assert sorted(m.params) == sorted(want)
        for name, shape in want.items():
            p = m.params[name]
            assert isinstance(p, np.ndarray) and p.shape == shape and p.dtype == dtype, name


@variants
def test_init(variant):
    I, H, L = 8, 16, 2
    bound = 1.0 / np.sqrt(H)
    for dtype in FLOAT_DTYPES:
        m = make(variant, I, H, L, dtype, seed=3)
        for name, p in m.params.items():
            if name.startswith("weight_"):
                assert np.all(np.abs(p.astype(F64)) <= bound * (1 + 1e-6)), name
                # uniform over the whole range: std = bound/sqrt(3), not a constant or a
                # narrow range
                assert abs(p.astype(F64).std() / (bound / np.sqrt(3)) - 1) < 0.25, name
                assert abs(p.astype(F64).mean()) < 0.25 * bound, name
            elif "_weight_" in name:
                assert np.all(p == 1), name
            else:
                assert "bias" in name, name
                assert np.all(p == 0), name
    a, b = make(variant, I, H, L, seed=7), make(variant, I, H, L, seed=7)
    c = make(variant, I, H, L, seed=8)
    for name in a.params:
        assert np.array_equal(a.params[name], b.params[name]), name
        if name.startswith("weight_"):
            assert not np.array_equal(a.params[name], c.params[name]), name
    # each weight matrix gets its own draws
    assert not np.array_equal(a.params["weight_hh_l0"], a.params["weight_hh_l1"])


# ---------------------------------------------------------------- forward vs the NumPy reference

# (T, B, I, H, num_layers)
SHAPES = [(1, 1, 3, 5, 1), (5, 1, 4, 37, 2), (7, 3, 6, 16, 1), (6, 4, 5, 5, 3), (1, 3, 2, 7, 2),
          (4, 2, 8, 256, 1)]
MODES = ["plain", "state", "batch_first", "lengths", "batch_first+lengths"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "T%dB%dI%dH%dL%d" % s)
@dtypes
@variants
def test_forward_matches_reference(variant, dtype, shape, mode, rng):
    T, B, I, H, L = shape
    bf = "batch_first" in mode
    m = randomized(rng, variant, I, H, L, dtype, batch_first=bf)
    x = rand_x(rng, T, B, I, dtype, bf)
    state = None if mode in ("plain", "batch_first") else rand_state(rng, variant, L, B, H, dtype)
    lengths = rand_lengths(rng, T, B) if "lengths" in mode else None
    y, s = m.forward(x, state, lengths)
    ry, rs = ref_forward(m, variant, x, state, lengths)
    check(y, ry, dtype, "y")
    check_state(variant, s, rs, dtype)
    if lengths is not None:
        yt = y.transpose(1, 0, 2) if bf else y
        for b, n in enumerate(lengths):
            assert np.all(yt[n:, b] == 0), "y after the end of sequence %d is not 0" % b


# -------------------------------------------------------- PyTorch parity: forward and all gradients

# (T, B, I, H, num_layers, batch_first, with lengths, with initial state)
TORCH_CASES = [
    (5, 3, 4, 7, 1, False, False, False),
    (6, 4, 5, 6, 2, False, True, True),
    (4, 3, 5, 37, 2, True, True, False),
    (5, 2, 3, 5, 3, True, False, True),
    (1, 1, 4, 5, 2, False, False, True),
    (3, 2, 16, 256, 1, False, True, True),
]


@pytest.mark.parametrize("case", TORCH_CASES, ids=lambda c: "T%dB%dI%dH%dL%d%s%s%s" % (
    c[:5] + ("-bf" if c[5] else "", "-lengths" if c[6] else "", "-state" if c[7] else "")))
@dtypes
@variants
def test_torch_parity(torch, variant, dtype, case, rng):
    T, B, I, H, L, bf, with_lengths, with_state = case
    m = randomized(rng, variant, I, H, L, dtype, batch_first=bf)
    x = rand_x(rng, T, B, I, dtype, bf)
    state = rand_state(rng, variant, L, B, H, dtype) if with_state else None
    lengths = rand_lengths(rng, T, B) if with_lengths else None
    dy = rng.standard_normal((B, T, H) if bf else (T, B, H)).astype(dtype)
    dstate = rand_state(rng, variant, L, B, H, dtype)

    y, s = m.forward(x, state, lengths)
    dx, ds = m.backward(dy, dstate)
    want = torch_ref(torch, m, variant, x, state, lengths, dy, dstate)

    check(y, want.y, dtype, "y")
    check_state(variant, s, want.state, dtype)
    check(dx, want.dx, dtype, "dx")
    check_state(variant, ds, want.dstate, dtype, "dstate")
    assert sorted(m.grads) == sorted(m.params)
    for name, g in want.grads.items():
        check(m.grads[name], g, dtype, "grad " + name)


# ---------------------------------------------------------------- float64 finite differences

def _fd_coords(shape, rng, limit):
    """All coordinates of ``shape`` if at most ``limit``, else ``limit`` random ones."""
    coords = list(np.ndindex(*shape))
    if len(coords) <= limit:
        return coords
    return [coords[i] for i in rng.choice(len(coords), size=limit, replace=False)]


@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
@variants
def test_finite_differences(variant, with_lengths, rng):
    T, B, I, H, L = 4, 3, 3, 4, 2
    step, limit = 1e-6, 64            # 64: every coordinate at these sizes
    m = randomized(rng, variant, I, H, L, F64)
    params = {k: v.copy() for k, v in m.params.items()}
    x = rand_x(rng, T, B, I, F64)
    state = rand_state(rng, variant, L, B, H, F64)
    lengths = np.array([4, 2, 1]) if with_lengths else None
    dy = rng.standard_normal((T, B, H))
    dstate = rand_state(rng, variant, L, B, H, F64)

    m.forward(x, state, lengths)
    dx, ds = m.backward(dy, dstate)
    grads = {k: g.copy() for k, g in m.grads.items()}

    def loss(p, x_, st):
        m.load_state_dict(p)
        y, s = m.forward(x_, st, lengths, cache=False)
        return loss_of(variant, y, s, dy, dstate)

    def fd_check(name, arr, got, call):
        """central differences of ``call()`` w.r.t. ``arr`` (perturbed in place) vs ``got``."""
        got = np.asarray(got)
        assert got.shape == arr.shape, (name, got.shape, arr.shape)
        scale = max(1.0, float(np.abs(got).max()))
        for i in _fd_coords(arr.shape, rng, limit):
            old = arr[i]
            arr[i] = old + step
            lp = call()
            arr[i] = old - step
            lm = call()
            arr[i] = old
            fd = (lp - lm) / (2 * step)
            assert abs(fd - got[i]) <= 1e-6 * scale + 1e-5 * abs(fd), (name, i, got[i], fd)

    call = lambda: loss(params, x, state)           # noqa: E731
    for name in sorted(params):
        fd_check("grad " + name, params[name], grads[name], call)
    fd_check("dx", x, dx, call)
    assert len(as_tuple(variant, ds)) == len(as_tuple(variant, state))
    for k, (s, g) in enumerate(zip(as_tuple(variant, state), as_tuple(variant, ds))):
        fd_check("dstate[%d]" % k, s, g, call)
    if with_lengths:
        for b, n in enumerate(lengths):
            assert np.all(dx[n:, b] == 0), "dx after the end of sequence %d is not 0" % b


# ---------------------------------------------------------------- lengths == the unpadded sequences

@variants
def test_lengths_equal_unpadded_sequences(variant, rng):
    T, B, I, H, L = 6, 3, 4, 5, 2
    m = randomized(rng, variant, I, H, L, F64)
    lengths = np.array([6, 2, 4], dtype=np.int32)
    # values of x and dy after each end are garbage and must not matter
    x = rand_x(rng, T, B, I, F64)
    state = rand_state(rng, variant, L, B, H, F64)
    dy = rng.standard_normal((T, B, H))
    dstate = rand_state(rng, variant, L, B, H, F64)

    y, s = m.forward(x, state, lengths)
    dx, ds = m.backward(dy, dstate)
    grads = {k: g.copy() for k, g in m.grads.items()}

    sum_grads = {k: np.zeros_like(g) for k, g in grads.items()}
    for b, n in enumerate(lengths):
        sb = from_tuple(variant, [a[:, b:b + 1].copy() for a in as_tuple(variant, state)])
        dsb = from_tuple(variant, [a[:, b:b + 1].copy() for a in as_tuple(variant, dstate)])
        yb, s_b = m.forward(x[:n, b:b + 1].copy(), sb)
        dxb, ds_b = m.backward(dy[:n, b:b + 1].copy(), dsb)
        check(y[:n, b:b + 1], yb, F64, "y of sequence %d" % b)
        assert np.all(y[n:, b] == 0)
        check(dx[:n, b:b + 1], dxb, F64, "dx of sequence %d" % b)
        assert np.all(dx[n:, b] == 0)
        for k, (a, w) in enumerate(zip(as_tuple(variant, s), as_tuple(variant, s_b))):
            check(a[:, b:b + 1], w, F64, "final state[%d] of sequence %d" % (k, b))
        for k, (a, w) in enumerate(zip(as_tuple(variant, ds), as_tuple(variant, ds_b))):
            check(a[:, b:b + 1], w, F64, "dstate[%d] of sequence %d" % (k, b))
        for name in sum_grads:
            sum_grads[name] += m.grads[name]
    for name in grads:
        check(grads[name], sum_grads[name], F64, "grad " + name)


# ----------------------------------------------------------- cache=False, step(), chunks, long runs

@dtypes
@variants
def test_cache_false_same_output(variant, dtype, rng):
    T, B, I, H, L = 6, 3, 5, 7, 2
    m = randomized(rng, variant, I, H, L, dtype)
    x = rand_x(rng, T, B, I, dtype)
    state = rand_state(rng, variant, L, B, H, dtype)
    lengths = rand_lengths(rng, T, B)
    for ln in (None, lengths):
        y1, s1 = m.forward(x, state, ln)
        y0, s0 = m.forward(x, state, ln, cache=False)
        check(y0, y1, dtype, "y")
        check_state(variant, s0, s1, dtype)


@pytest.mark.parametrize("batch_first", [False, True])
@dtypes
@variants
def test_step_equals_forward(variant, dtype, batch_first, rng):
    T, B, I, H, L = 7, 3, 4, 6, 2
    m = randomized(rng, variant, I, H, L, dtype, batch_first=batch_first)
    x = rand_x(rng, T, B, I, dtype, batch_first)
    y, s = m.forward(x)
    xt = x.transpose(1, 0, 2) if batch_first else x
    yt = y.transpose(1, 0, 2) if batch_first else y
    st = None
    for t in range(T):
        h, st = m.step(np.ascontiguousarray(xt[t]), st)
        check(h, yt[t], dtype, "step %d" % t)
    check_state(variant, st, s, dtype)
    # from a given state
    state = rand_state(rng, variant, L, B, H, dtype)
    y, s = m.forward(x, state)
    yt = y.transpose(1, 0, 2) if batch_first else y
    st = state
    for t in range(T):
        h, st = m.step(np.ascontiguousarray(xt[t]), st)
        check(h, yt[t], dtype, "step %d from a state" % t)
    check_state(variant, st, s, dtype)


@dtypes
@variants
def test_chunked_forward_equals_whole(variant, dtype, rng):
    T, B, I, H, L = 9, 2, 3, 5, 2
    m = randomized(rng, variant, I, H, L, dtype)
    x = rand_x(rng, T, B, I, dtype)
    state = rand_state(rng, variant, L, B, H, dtype)
    y, s = m.forward(x, state)
    ys, st = [], state
    for a, b in [(0, 4), (4, 5), (5, 9)]:
        yc, st = m.forward(x[a:b], st)
        ys.append(yc)
    check(np.concatenate(ys), y, dtype, "y")
    check_state(variant, st, s, dtype)


@variants
def test_long_sequence(variant, rng):
    """Trained on T=5, then T=2000: nothing depends on T beyond the cache.

    float64 is held to the reference tightly.  float32 only loosely to float64: over 2000
    steps a float32 run amplifies rounding at sensitive steps (PyTorch's own float32 run of
    the same equations drifts ~5e-4 from float64 here).
    """
    I, H, L, B, T = 3, 8, 2, 2, 2000
    p = random_params(rng, variant, I, H, L, F32)
    x = rand_x(rng, T, B, I, F32)
    ys = {}
    for dtype in (F64, F32):
        m = make(variant, I, H, L, dtype)
        m.load_state_dict({k: v.astype(dtype) for k, v in p.items()})
        m.forward(x[:5].astype(dtype))
        m.backward(np.ones((5, B, H), dtype))
        y, s = m.forward(x.astype(dtype), cache=False)
        y2, s2 = m.forward(x.astype(dtype))           # with a cache: same, and backward works
        check(y2, y, dtype, "y with a cache")
        dx, _ = m.backward(np.ones_like(y2))
        assert dx.shape == x.shape and dx.dtype == dtype and np.all(np.isfinite(dx))
        assert all(np.all(np.isfinite(g)) for g in m.grads.values())
        ys[dtype] = y
        if dtype == F64:
            ry, rs = ref_forward(m, variant, x)
            check(y, ry, F64, "y")
            check_state(variant, s, rs, F64)
    assert np.all(np.isfinite(ys[F32]))
    np.testing.assert_allclose(ys[F32], ys[F64], rtol=0, atol=5e-3, err_msg="float32 vs float64")


# ---------------------------------------------------------------- state_dict, dtypes, grads

@variants
def test_state_dict_roundtrip_savez(variant, rng, tmp_path):
    I, H, L, T, B = 4, 6, 3, 5, 2
    m = randomized(rng, variant, I, H, L, F32)
    d = m.state_dict()
    assert isinstance(d, dict) and sorted(d) == sorted(m.params)
    assert all(isinstance(v, np.ndarray) for v in d.values())
    path = tmp_path / "model.npz"
    np.savez(path, **d)
    fresh = make(variant, I, H, L, F32, seed=123)
    with np.load(path) as f:
        fresh.load_state_dict({k: f[k] for k in f.files})
    for name in m.params:
        assert np.array_equal(fresh.params[name], m.params[name]), name
    x = rand_x(rng, T, B, I, F32)
    y1, s1 = m.forward(x, cache=False)
    y2, s2 = fresh.forward(x, cache=False)
    assert np.array_equal(y1, y2)
    for a, b in zip(as_tuple(variant, s1), as_tuple(variant, s2)):
        assert np.array_equal(a, b)


@dtypes
@variants
def test_dtype_preserved(variant, dtype, rng):
    T, B, I, H, L = 4, 2, 3, 5, 2
    m = randomized(rng, variant, I, H, L, dtype)
    x = rand_x(rng, T, B, I, dtype)
    y, s = m.forward(x)
    assert y.dtype == dtype and y.shape == (T, B, H)
    if has_cell(variant):
        assert isinstance(s, tuple) and len(s) == 2
    for a in as_tuple(variant, s):
        assert a.dtype == dtype and a.shape == (L, B, H)
    dx, ds = m.backward(rng.standard_normal((T, B, H)).astype(dtype))
    assert dx.dtype == dtype and dx.shape == x.shape
    if has_cell(variant):
        assert isinstance(ds, tuple) and len(ds) == 2
    for a in as_tuple(variant, ds):
        assert a.dtype == dtype and a.shape == (L, B, H)
    for name, p in m.params.items():
        assert p.dtype == dtype, name
        assert m.grads[name].dtype == dtype and m.grads[name].shape == p.shape, name
    h, st = m.step(x[0], None)
    assert h.dtype == dtype and h.shape == (B, H)
    for a in as_tuple(variant, st):
        assert a.dtype == dtype and a.shape == (L, B, H)


@variants
def test_grads_overwritten_not_accumulated(variant, rng):
    T, B, I, H, L = 5, 3, 4, 5, 2
    m = randomized(rng, variant, I, H, L, F64)
    x = rand_x(rng, T, B, I, F64)
    dy = rng.standard_normal((T, B, H))
    m.forward(x)
    m.backward(dy)
    first = {k: g.copy() for k, g in m.grads.items()}
    m.forward(x)
    m.backward(dy)
    for name in first:
        check(m.grads[name], first[name], F64, "second backward, grad " + name)
    # a different problem: the grads are those of the last backward only
    x2 = rand_x(rng, 3, 2, I, F64)
    dy2 = rng.standard_normal((3, 2, H))
    m.forward(x2)
    m.backward(dy2)
    fresh = make(variant, I, H, L, F64, seed=5)
    fresh.load_state_dict(m.state_dict())
    fresh.forward(x2)
    fresh.backward(dy2)
    for name in first:
        check(m.grads[name], fresh.grads[name], F64, "third backward, grad " + name)


@variants
def test_dstate_none_means_zeros(variant, rng):
    T, B, I, H, L = 4, 2, 3, 5, 2
    m = randomized(rng, variant, I, H, L, F64)
    x = rand_x(rng, T, B, I, F64)
    dy = rng.standard_normal((T, B, H))
    zeros = from_tuple(variant, [np.zeros((L, B, H))] * (2 if has_cell(variant) else 1))
    m.forward(x)
    dx1, ds1 = m.backward(dy)
    g1 = {k: g.copy() for k, g in m.grads.items()}
    m.forward(x, zeros)
    dx2, ds2 = m.backward(dy, zeros)
    check(dx1, dx2, F64, "dx")
    check_state(variant, ds1, ds2, F64, "dstate")
    for name in g1:
        check(g1[name], m.grads[name], F64, "grad " + name)


@variants
def test_inplace_param_update_is_used(variant, rng):
    """A training step that updates m.params in place (p -= lr*g) changes the next forward."""
    T, B, I, H, L = 4, 2, 3, 5, 2
    m = randomized(rng, variant, I, H, L, F64)
    x = rand_x(rng, T, B, I, F64)
    m.forward(x)
    m.backward(rng.standard_normal((T, B, H)))
    for name, p in m.params.items():
        p -= 0.1 * m.grads[name]
    y, s = m.forward(x)
    ry, rs = ref_forward(m, variant, x)
    check(y, ry, F64, "y after an in-place update")
    check_state(variant, s, rs, F64)


# ---------------------------------------------------------------- errors

T0, B0, I0, H0, L0 = 5, 2, 3, 4, 2


def _x(T=T0, B=B0, I=I0, dtype=F32):
    return np.linspace(-1, 1, T * B * I).reshape(T, B, I).astype(dtype)


def _state(cell, L=L0, B=B0, H=H0):
    h = np.zeros((L, B, H), F32)
    return (h, h.copy()) if cell.startswith("lstm") else h


def _with_bad(cell, i, bad):
    """The good state with component ``i`` replaced by ``bad``."""
    s = list(_state(cell)) if cell.startswith("lstm") else [_state(cell)]
    s[i] = bad
    return tuple(s) if cell.startswith("lstm") else s[0]


def _forwarded(m, cell, **kw):
    m.forward(_x(), **kw)
    return m


def _dy(T=T0, B=B0, H=H0):
    return np.ones((T, B, H), F32)


def _drop(d, key):
    d = dict(d)
    del d[key]
    return d


def _reshape(d, key):
    d = dict(d)
    d[key] = np.zeros(d[key].shape[:-1] + (d[key].shape[-1] + 1,), d[key].dtype)
    return d


# (id, cells ("all" or a tuple), exception, name in the message, fn(m, cell))
ERROR_CASES = [
    ("x 2-D", "all", ValueError, "x", lambda m, c: m.forward(_x()[0])),
    ("x 4-D", "all", ValueError, "x", lambda m, c: m.forward(_x()[None])),
    ("x input size", "all", ValueError, "x", lambda m, c: m.forward(_x(I=I0 + 1))),
    ("x T=0", "all", ValueError, "x", lambda m, c: m.forward(_x(T=0))),
    ("x float64", "all", TypeError, "x", lambda m, c: m.forward(_x(dtype=F64))),
    ("x int32", "all", TypeError, "x", lambda m, c: m.forward(_x().astype(np.int32))),
    ("state layers", "all", ValueError, "state",
     lambda m, c: m.forward(_x(), _with_bad(c, 0, np.zeros((L0 + 1, B0, H0), F32)))),
    ("state batch", "all", ValueError, "state",
     lambda m, c: m.forward(_x(), _with_bad(c, 0, np.zeros((L0, B0 + 1, H0), F32)))),
    ("state hidden", "all", ValueError, "state",
     lambda m, c: m.forward(_x(), _with_bad(c, 0, np.zeros((L0, B0, H0 - 1), F32)))),
    ("state 2-D", "all", ValueError, "state",
     lambda m, c: m.forward(_x(), _with_bad(c, 0, np.zeros((B0, H0), F32)))),
    ("lstm c shape", ("lstm", "lstm_plain"), ValueError, "state",
     lambda m, c: m.forward(_x(), _with_bad(c, 1, np.zeros((L0, B0, H0 + 1), F32)))),
    ("lstm state not a tuple", ("lstm", "lstm_plain"), TypeError, "state",
     lambda m, c: m.forward(_x(), np.zeros((L0, B0, H0), F32))),
    ("h-only state as a tuple", ("gru", "rnn", "gru_plain", "rnn_plain"), TypeError, "state",
     lambda m, c: m.forward(_x(), (np.zeros((L0, B0, H0), F32),))),
    ("lstm state 3-tuple", ("lstm", "lstm_plain"), TypeError, "state",
     lambda m, c: m.forward(_x(), _state(c) + (np.zeros((L0, B0, H0), F32),))),
    ("lengths float", "all", TypeError, "lengths",
     lambda m, c: m.forward(_x(), lengths=np.array([5.0, 3.0]))),
    ("lengths too long", "all", ValueError, "lengths",
     lambda m, c: m.forward(_x(), lengths=np.array([5, 3, 2]))),
    ("lengths too short", "all", ValueError, "lengths",
     lambda m, c: m.forward(_x(), lengths=np.array([5]))),
    ("lengths 2-D", "all", ValueError, "lengths",
     lambda m, c: m.forward(_x(), lengths=np.array([[5], [3]]))),
    ("lengths 0", "all", ValueError, "lengths",
     lambda m, c: m.forward(_x(), lengths=np.array([5, 0]))),
    ("lengths negative", "all", ValueError, "lengths",
     lambda m, c: m.forward(_x(), lengths=np.array([-1, 3]))),
    ("lengths > T", "all", ValueError, "lengths",
     lambda m, c: m.forward(_x(), lengths=np.array([6, 3]))),
    ("dy T", "all", ValueError, "dy", lambda m, c: _forwarded(m, c).backward(_dy(T=T0 - 1))),
    ("dy B", "all", ValueError, "dy", lambda m, c: _forwarded(m, c).backward(_dy(B=B0 + 1))),
    ("dy H", "all", ValueError, "dy", lambda m, c: _forwarded(m, c).backward(_dy(H=H0 + 1))),
    ("dy 2-D", "all", ValueError, "dy", lambda m, c: _forwarded(m, c).backward(_dy()[0])),
    ("dstate layers", "all", ValueError, "dstate",
     lambda m, c: _forwarded(m, c).backward(
         _dy(), _with_bad(c, 0, np.zeros((L0 - 1, B0, H0), F32)))),
    ("dstate hidden", "all", ValueError, "dstate",
     lambda m, c: _forwarded(m, c).backward(
         _dy(), _with_bad(c, 0, np.zeros((L0, B0, H0 + 1), F32)))),
    ("lstm dc shape", ("lstm", "lstm_plain"), ValueError, "dstate",
     lambda m, c: _forwarded(m, c).backward(
         _dy(), _with_bad(c, 1, np.zeros((L0, B0 + 1, H0), F32)))),
    ("backward before forward", "all", RuntimeError, "forward", lambda m, c: m.backward(_dy())),
    ("backward after cache=False", "all", RuntimeError, "forward",
     lambda m, c: _forwarded(m, c, cache=False).backward(_dy())),
    ("backward twice", "all", RuntimeError, "forward",
     lambda m, c: (_forwarded(m, c).backward(_dy()), m.backward(_dy()))),
    ("load missing key", "all", ValueError, "weight_hh_l1",
     lambda m, c: m.load_state_dict(_drop(m.state_dict(), "weight_hh_l1"))),
    ("load unexpected key", "all", ValueError, "extra_l0",
     lambda m, c: m.load_state_dict(dict(m.state_dict(), extra_l0=np.zeros(3, F32)))),
    ("load wrong shape", "all", ValueError, "weight_ih_l1",
     lambda m, c: m.load_state_dict(_reshape(m.state_dict(), "weight_ih_l1"))),
]


ERROR_PARAMS = [pytest.param(cell, case, id="%s-%s" % (cell, case[0]))
                for cell in CELLS for case in ERROR_CASES if case[1] == "all" or cell in case[1]]


@pytest.mark.parametrize("cell,case", ERROR_PARAMS)
def test_errors(cell, case):
    _, _, exc, arg, fn = case
    m = make((cell, "tanh" if cell.startswith("rnn") else None), I0, H0, L0, F32)
    with pytest.raises(exc, match=named(arg)):
        fn(m, cell)


@pytest.mark.parametrize("cell", CELLS)
def test_errors_batch_first_dy(cell):
    """With batch_first, dy is (B, T, H): a time-major dy is the wrong shape."""
    m = make((cell, "tanh" if cell.startswith("rnn") else None), I0, H0, L0, F32, batch_first=True)
    m.forward(np.ones((B0, T0, I0), F32))
    with pytest.raises(ValueError, match=named("dy")):
        m.backward(_dy())
