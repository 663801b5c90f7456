"""fastln.rnn with bidirectional=True (all six classes) and the plain GRU (both forms of
linear_before_reset): forward against fastln/rnn_reference.py, every gradient against float64
central finite differences and against the plain PyTorch autograd reference
(tests/_rnn_torch.py), parity with torch.nn.LSTM/GRU/RNN loaded by ``from_torch`` (packed
sequences for lengths), bitwise determinism across thread counts, every ISA path, errors,
state_dict and repr; and a unidirectional model with ``reverse = True``.
"""
import numpy as np
import pytest

import fastln
from fastln import rnn_reference as ref
from fastln.rnn import GRU, LNLSTM, LSTM, RNN

from _rnn_torch import torch_rnn
from _util import F32, F64, FLOAT_DTYPES, named
from test_rnn import (
    CLASSES,
    REF,
    as_tuple,
    check,
    check_state,
    from_tuple,
    has_cell,
    is_plain,
    rand_lengths,
    rand_x,
)
from test_rnn import random_params as _random_params

# (cell, option): option is the nonlinearity of the RNNs and linear_before_reset of the GRU
VARIANTS = [("rnn", "tanh"), ("rnn", "relu"), ("lstm", None), ("gru", None),
            ("rnn_plain", "tanh"), ("rnn_plain", "relu"), ("lstm_plain", None),
            ("gru_plain", True), ("gru_plain", False)]
VIDS = ["lnrnn-tanh", "lnrnn-relu", "lnlstm", "lngru", "rnn-tanh", "rnn-relu", "lstm",
        "gru-lbr", "gru-nolbr"]

# every variant bidirectional, and the plain GRU also unidirectional
CASES = ([pytest.param(v, True, id=i + "-bidir") for v, i in zip(VARIANTS, VIDS)]
         + [pytest.param(v, False, id=i) for v, i in zip(VARIANTS, VIDS) if v[0] == "gru_plain"])
cases = pytest.mark.parametrize("variant,bidir", CASES)
dtypes = pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=["f32", "f64"])


# ---------------------------------------------------------------- helpers


def options(variant):
    """The keyword arguments of variant's option, for the model and the references."""
    cell, opt = variant
    if cell == "gru_plain":
        return {"linear_before_reset": opt}
    return {} if opt is None else {"nonlinearity": opt}


def make(variant, I, H, L=1, dtype=F64, batch_first=False, bidir=True, seed=0):
    kw = dict(num_layers=L, batch_first=batch_first, dtype=dtype, seed=seed,
              bidirectional=bidir, **options(variant))
    return CLASSES[variant[0]](I, H, **kw)


def random_params(rng, variant, I, H, L, dtype, bidir=True):
    """test_rnn's random parameters, for both directions unless bidir is False."""
    return _random_params(rng, variant, I, H, L, dtype, bidirectional=bidir)


def randomized(rng, variant, I, H, L=1, dtype=F64, batch_first=False, bidir=True):
    """A model with random parameters (loaded with load_state_dict)."""
    m = make(variant, I, H, L, dtype, batch_first, bidir)
    m.load_state_dict(random_params(rng, variant, I, H, L, dtype, bidir))
    return m


def rand_state(rng, variant, n, B, H, dtype):
    """A random state of n = directions * layers rows."""
    k = 2 if has_cell(variant) else 1
    return from_tuple(variant, [rng.standard_normal((n, B, H)).astype(dtype) for _ in range(k)])


def ref_forward(m, variant, x, state=None, lengths=None, bidir=True):
    kw = dict(num_layers=m.num_layers, batch_first=m.batch_first, bidirectional=bidir,
              **options(variant))
    if not is_plain(variant):
        kw["eps"] = m.eps
    return REF[variant[0]](m.params, x, state, lengths, **kw)


def torch_ref(torch, m, variant, x, state, lengths, dy, dstate, bidir=True):
    """The plain PyTorch autograd reference (float64) of model ``m``."""
    opt = options(variant)
    return torch_rnn(torch, variant[0], m.params, x, state, lengths, num_layers=m.num_layers,
                     eps=m.eps, nonlinearity=opt.get("nonlinearity", "tanh"),
                     batch_first=m.batch_first, dy=dy, dstate=dstate, bidirectional=bidir,
                     linear_before_reset=opt.get("linear_before_reset", True))


def time_major(a, batch_first):
    return a.transpose(1, 0, 2) if batch_first else a


# ---------------------------------------------------------------- parameters and init

@cases
def test_param_names_shapes_and_init(variant, bidir):
    I, H, L = 5, 6, 3
    for dtype in FLOAT_DTYPES:
        m = make(variant, I, H, L, dtype, bidir=bidir, seed=3)
        want = ref.param_shapes(variant[0], I, H, L, bidirectional=bidir)
        assert sorted(m.params) == sorted(want)
        assert sorted(m.state_dict()) == sorted(want)
        for name, shape in want.items():
            p = m.params[name]
            assert isinstance(p, np.ndarray) and p.shape == shape and p.dtype == dtype, name
    # init: weights U(-1/sqrt(H), 1/sqrt(H)), LN gains 1, biases 0; each direction its own draws
    m = make(variant, I, 16, 2, F64, bidir=bidir, seed=3)
    bound = 1.0 / 4
    for name, p in m.params.items():
        if name.startswith("weight_"):
            assert np.all(np.abs(p) <= bound * (1 + 1e-12)), name
            assert abs(p.std() / (bound / np.sqrt(3)) - 1) < 0.3, name
        elif "_weight_" in name:
            assert np.all(p == 1), name
        else:
            assert "bias" in name and np.all(p == 0), name
    if bidir:
        assert not np.array_equal(m.params["weight_hh_l0"], m.params["weight_hh_l0_reverse"])
        assert m.params["weight_ih_l1_reverse"].shape[1] == 2 * 16


# ---------------------------------------------------------------- forward vs the NumPy reference

# (num_layers, batch_first, with lengths, with an initial state)
MODES = [(L, bf, ln, st) for L in (1, 2) for bf in (False, True) for ln in (False, True)
         for st in [(L == 2) != bf]]


@pytest.mark.parametrize("mode", MODES, ids=lambda c: "L%d%s%s%s" % (
    c[0], "-bf" if c[1] else "", "-lengths" if c[2] else "", "-state" if c[3] else ""))
@dtypes
@cases
def test_forward_matches_reference(variant, bidir, dtype, mode, rng):
    L, bf, with_lengths, with_state = mode
    T, B, I, H = 5, 3, 4, 6
    D = 2 if bidir else 1
    m = randomized(rng, variant, I, H, L, dtype, batch_first=bf, bidir=bidir)
    x = rand_x(rng, T, B, I, dtype, bf)
    state = rand_state(rng, variant, D * L, B, H, dtype) if with_state else None
    lengths = rand_lengths(rng, T, B) if with_lengths else None
    y, s = m.forward(x, state, lengths)
    assert y.shape == ((B, T, D * H) if bf else (T, B, D * H))
    for a in as_tuple(variant, s):
        assert a.shape == (D * L, B, H)
    ry, rs = ref_forward(m, variant, x, state, lengths, bidir)
    check(y, ry, dtype, "y")
    check_state(variant, s, rs, dtype)
    if lengths is not None:
        yt = time_major(y, bf)
        for b, n in enumerate(lengths):
            assert np.all(yt[n:, b] == 0), "y after the end of sequence %d is not 0" % b
    y0, s0 = m.forward(x, state, lengths, cache=False)
    check(y0, ry, dtype, "y with cache=False")
    check_state(variant, s0, rs, dtype, "state with cache=False")


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v[0] in ("lstm", "gru_plain")],
                         ids=["lnlstm", "gru-lbr", "gru-nolbr"])
def test_reverse_half_is_the_reversed_sequence(variant, rng):
    """The reverse half of y for sequence b is a unidirectional run of the _reverse
    parameters over b's own steps reversed in time (one layer)."""
    T, B, I, H = 6, 3, 3, 5
    m = randomized(rng, variant, I, H, 1, F64)
    uni = make(variant, I, H, 1, F64, bidir=False)
    uni.load_state_dict({k[:-len("_reverse")]: v for k, v in m.params.items()
                         if k.endswith("_reverse")})
    x = rand_x(rng, T, B, I, F64)
    lengths = np.array([6, 4, 1])
    y, s = m.forward(x, None, lengths)
    for b, n in enumerate(lengths):
        yb, sb = uni.forward(x[:n, b:b + 1][::-1].copy())
        check(y[:n, b:b + 1, H:], yb[::-1], F64, "reverse half of sequence %d" % b)
        for k, (a, w) in enumerate(zip(as_tuple(variant, s), as_tuple(variant, sb))):
            check(a[1:2, b:b + 1], w, F64, "reverse final state[%d] of sequence %d" % (k, b))


@dtypes
@pytest.mark.parametrize("lbr", [True, False], ids=["lbr", "nolbr"])
def test_gru_step_equals_forward(lbr, dtype, rng):
    T, B, I, H, L = 5, 3, 4, 6, 2
    variant = ("gru_plain", lbr)
    m = randomized(rng, variant, I, H, L, dtype, bidir=False)
    x = rand_x(rng, T, B, I, dtype)
    state = rand_state(rng, variant, L, B, H, dtype)
    y, s = m.forward(x, state)
    st = state
    for t in range(T):
        h, st = m.step(np.ascontiguousarray(x[t]), st)
        check(h, y[t], dtype, "step %d" % t)
    check(st, s, dtype, "state")


# ------------------------------------------------------- all gradients vs the PyTorch reference

@dtypes
@cases
def test_torch_reference_parity(torch, variant, bidir, dtype, rng):
    """Forward and every gradient against tests/_rnn_torch.py (float64 autograd)."""
    T, B, I, H, L = 5, 3, 4, 5, 2
    D = 2 if bidir else 1
    m = randomized(rng, variant, I, H, L, dtype, batch_first=True, bidir=bidir)
    x = rand_x(rng, T, B, I, dtype, True)
    state = rand_state(rng, variant, D * L, B, H, dtype)
    lengths = rand_lengths(rng, T, B)
    dy = rng.standard_normal((B, T, D * H)).astype(dtype)
    dstate = rand_state(rng, variant, D * L, B, H, dtype)

    y, s = m.forward(x, state, lengths)
    dx, ds = m.backward(dy, dstate)
    want = torch_ref(torch, m, variant, x, state, lengths, dy, dstate, bidir)
    check(y, want.y, dtype, "y")
    check_state(variant, s, want.state, dtype)
    check(dx, want.dx, dtype, "dx")
    check_state(variant, ds, want.dstate, dtype, "dstate")
    assert sorted(m.grads) == sorted(m.params)
    for name, g in want.grads.items():
        check(m.grads[name], g, dtype, "grad " + name)
    for b, n in enumerate(lengths):
        assert np.all(dx[b, n:] == 0), "dx after the end of sequence %d is not 0" % b


@dtypes
@pytest.mark.parametrize("variant", [v for v in VARIANTS if v[0] in ("rnn", "lstm", "gru_plain")],
                         ids=["lnrnn-tanh", "lnrnn-relu", "lnlstm", "gru-lbr", "gru-nolbr"])
def test_reverse_attribute(torch, variant, dtype, rng):
    """A unidirectional model with ``reverse = True`` runs each sequence from its last
    step back to its first: forward against the NumPy reference (reverse=True), every
    gradient against the PyTorch reference; step() refuses it and repr shows it."""
    T, B, I, H, L = 5, 3, 4, 5, 2
    m = randomized(rng, variant, I, H, L, dtype, bidir=False)
    m.reverse = True
    x = rand_x(rng, T, B, I, dtype)
    state = rand_state(rng, variant, L, B, H, dtype)
    lengths = rand_lengths(rng, T, B)
    dy = rng.standard_normal((T, B, H)).astype(dtype)
    dstate = rand_state(rng, variant, L, B, H, dtype)
    y, s = m.forward(x, state, lengths)
    dx, ds = m.backward(dy, dstate)
    kw = dict(num_layers=L, reverse=True, **options(variant))
    if not is_plain(variant):
        kw["eps"] = m.eps
    ry, rs = REF[variant[0]](m.params, x, state, lengths, **kw)
    check(y, ry, dtype, "y")
    check_state(variant, s, rs, dtype)
    opt = options(variant)
    want = torch_rnn(torch, variant[0], m.params, x, state, lengths, num_layers=L, eps=m.eps,
                     nonlinearity=opt.get("nonlinearity", "tanh"), dy=dy, dstate=dstate,
                     linear_before_reset=opt.get("linear_before_reset", True), reverse=True)
    check(y, want.y, dtype, "y (torch)")
    check(dx, want.dx, dtype, "dx")
    check_state(variant, ds, want.dstate, dtype, "dstate")
    for name, g in want.grads.items():
        check(m.grads[name], g, dtype, "grad " + name)
    assert "reverse=True" in repr(m)
    with pytest.raises(ValueError, match="reverse"):
        m.step(x[0])


@pytest.mark.parametrize("variant", VARIANTS, ids=VIDS)
@pytest.mark.parametrize("bidir", [False, True], ids=["uni", "bidir"])
@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
def test_padding_is_never_read(variant, bidir, dtype):
    """NaN and inf past each sequence's length change no output and no gradient:
    the results are bitwise those of zero padding (two layers, so the second
    layer reads the first's padded y too)."""
    m = make(variant, 3, 4, L=2, dtype=dtype, bidir=bidir)
    x = np.random.default_rng(0).standard_normal((6, 3, 3)).astype(dtype)
    lengths = np.array([6, 2, 4])
    runs = []
    for pad in (0.0, np.nan, np.inf):
        xp = x.copy()
        xp[2:, 1], xp[4:, 2] = pad, -pad
        y, state = m.forward(xp, lengths=lengths)
        dx, dstate = m.backward(np.ones_like(y))
        runs.append([y, dx, *as_tuple(variant, state), *as_tuple(variant, dstate),
                     *(m.grads[k].copy() for k in sorted(m.grads))])
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            np.testing.assert_array_equal(a, b)


def test_reverse_on_a_bidirectional_model_raises():
    m = _bidir(VARIANTS[2])
    m.reverse = True
    with pytest.raises(ValueError, match="reverse"):
        m.forward(_x())


# ---------------------------------------------------------------- float64 finite differences

def _fd_coords(shape, rng, limit):
    """All coordinates of ``shape`` if at most ``limit``, else ``limit`` random ones."""
    coords = list(np.ndindex(*shape))
    if len(coords) <= limit:
        return coords
    return [coords[i] for i in rng.choice(len(coords), size=limit, replace=False)]


@cases
def test_finite_differences(variant, bidir, rng):
    T, B, I, H, L = 4, 3, 3, 4, 2
    D = 2 if bidir else 1
    step, limit = 1e-6, 48            # 48 sampled entries of each larger array
    m = randomized(rng, variant, I, H, L, F64, bidir=bidir)
    params = {k: v.copy() for k, v in m.params.items()}
    x = rand_x(rng, T, B, I, F64)
    state = rand_state(rng, variant, D * L, B, H, F64)
    lengths = np.array([4, 2, 1])
    dy = rng.standard_normal((T, B, D * H))
    dstate = rand_state(rng, variant, D * L, B, H, F64)

    m.forward(x, state, lengths)
    dx, ds = m.backward(dy, dstate)
    grads = {k: g.copy() for k, g in m.grads.items()}
    assert sorted(grads) == sorted(params)

    def loss():
        m.load_state_dict(params)
        y, s = m.forward(x, state, lengths, cache=False)
        total = float(np.sum(y * dy))
        for a, da in zip(as_tuple(variant, s), as_tuple(variant, dstate)):
            total += float(np.sum(a * da))
        return total

    def fd_check(name, arr, got):
        """central differences of loss() w.r.t. ``arr`` (perturbed in place) vs ``got``."""
        got = np.asarray(got)
        assert got.shape == arr.shape, (name, got.shape, arr.shape)
        scale = max(1.0, float(np.abs(got).max()))
        for i in _fd_coords(arr.shape, rng, limit):
            old = arr[i]
            arr[i] = old + step
            lp = loss()
            arr[i] = old - step
            lm = loss()
            arr[i] = old
            fd = (lp - lm) / (2 * step)
            assert abs(fd - got[i]) <= 1e-6 * scale + 1e-5 * abs(fd), (name, i, got[i], fd)

    for name in sorted(params):
        fd_check("grad " + name, params[name], grads[name])
    fd_check("dx", x, dx)
    for k, (s, g) in enumerate(zip(as_tuple(variant, state), as_tuple(variant, ds))):
        fd_check("dstate[%d]" % k, s, g)
    for b, n in enumerate(lengths):
        assert np.all(dx[n:, b] == 0), "dx after the end of sequence %d is not 0" % b


# ------------------------------------------------- torch.nn modules: from_torch, forward, backward

TORCH_KINDS = [("LSTM", LSTM, {}), ("GRU", GRU, {}), ("RNN", RNN, {"nonlinearity": "tanh"}),
               ("RNN", RNN, {"nonlinearity": "relu"})]
TORCH_IDS = ["lstm", "gru", "rnn-tanh", "rnn-relu"]
# (bidirectional, with lengths, batch_first)
TORCH_CASES = [(True, False, False), (True, True, False), (True, True, True),
               (False, True, False)]


@pytest.mark.parametrize("case", TORCH_CASES, ids=lambda c: "%s%s%s" % (
    "bidir" if c[0] else "uni", "-lengths" if c[1] else "", "-bf" if c[2] else ""))
@pytest.mark.parametrize("kind", TORCH_KINDS, ids=TORCH_IDS)
def test_torch_nn_parity(torch, kind, case, rng):
    """fastln's X.from_torch(module) against module itself, float64: y, the final state,
    dx, the initial state's gradient and every weight and bias gradient."""
    bidir, with_lengths, bf = case
    name, cls, kw = kind
    T, B, I, H, L = 5, 3, 4, 5, 2
    D = 2 if bidir else 1
    lstm = name == "LSTM"
    torch.manual_seed(int(rng.integers(1 << 30)))
    module = getattr(torch.nn, name)(I, H, num_layers=L, batch_first=bf, bidirectional=bidir,
                                     **kw).double()
    with torch.no_grad():
        for p in module.parameters():                  # biases != 0, weights a bit larger
            p.uniform_(-1.5 / np.sqrt(H), 1.5 / np.sqrt(H))
    m = cls.from_torch(module)
    assert isinstance(m, cls) and m.dtype == F64 and m.batch_first == bf
    assert ("bidirectional=True" in repr(m)) == bidir

    x = rand_x(rng, T, B, I, F64, bf)
    h0 = rng.standard_normal((D * L, B, H))
    c0 = rng.standard_normal((D * L, B, H))
    lengths = rand_lengths(rng, T, B) if with_lengths else None
    dy = rng.standard_normal((B, T, D * H) if bf else (T, B, D * H))
    dh = rng.standard_normal((D * L, B, H))
    dc = rng.standard_normal((D * L, B, H))

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        xt = torch.tensor(x, requires_grad=True)
        h0t = torch.tensor(h0, requires_grad=True)
        c0t = torch.tensor(c0, requires_grad=True)
        inp = xt
        if with_lengths:
            inp = torch.nn.utils.rnn.pack_padded_sequence(
                xt, torch.as_tensor(lengths), batch_first=bf, enforce_sorted=False)
        out, st = module(inp, (h0t, c0t) if lstm else h0t)
        if with_lengths:
            out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=bf,
                                                            total_length=T)
        finals = list(st) if lstm else [st]
        loss = (out * torch.from_numpy(dy)).sum() + (finals[0] * torch.from_numpy(dh)).sum()
        if lstm:
            loss = loss + (finals[1] * torch.from_numpy(dc)).sum()
        loss.backward()
    finally:
        torch.set_num_threads(saved)

    def np64(t):
        return t.detach().numpy()

    y, s = m.forward(x, (h0, c0) if lstm else h0, lengths)
    dx, ds = m.backward(dy, (dh, dc) if lstm else dh)
    check(y, np64(out), F64, "y")
    check(dx, np64(xt.grad), F64, "dx")
    if lstm:
        check(s[0], np64(finals[0]), F64, "h_n")
        check(s[1], np64(finals[1]), F64, "c_n")
        check(ds[0], np64(h0t.grad), F64, "dh0")
        check(ds[1], np64(c0t.grad), F64, "dc0")
    else:
        check(s, np64(finals[0]), F64, "h_n")
        check(ds, np64(h0t.grad), F64, "dh0")

    tp = dict(module.named_parameters())
    checked = set()
    for k in range(L):
        for sfx in ("", "_reverse")[:D]:
            key = "_l%d%s" % (k, sfx)
            for w in ("weight_ih", "weight_hh"):
                check(m.grads[w + key], np64(tp[w + key].grad), F64, "grad " + w + key)
            g_ih, g_hh = np64(tp["bias_ih" + key].grad), np64(tp["bias_hh" + key].grad)
            # the summed bias: its gradient is that of either torch bias (GRU: of bias_ih,
            # whose n block is b_in; b_hn is bias_hh's n block)
            check(m.grads["bias" + key], g_ih, F64, "grad bias" + key)
            checked |= {"weight_ih" + key, "weight_hh" + key, "bias" + key}
            if name == "GRU":
                check(m.grads["bias" + key][:2 * H], g_hh[:2 * H], F64, "grad bias[r,z]" + key)
                check(m.grads["bias_hn" + key], g_hh[2 * H:], F64, "grad bias_hn" + key)
                checked.add("bias_hn" + key)
            else:
                check(m.grads["bias" + key], g_hh, F64, "grad bias (hh)" + key)
    assert checked == set(m.grads)


# ---------------------------------------------------------------- determinism and ISA paths

ENGINE_MODELS = [(LNLSTM, {}), (GRU, {"linear_before_reset": True}),
                 (GRU, {"linear_before_reset": False})]
ENGINE_IDS = ["lnlstm", "gru-lbr", "gru-nolbr"]


def engine_model(cls, kw, dtype, I, H, L=2, seed=3):
    m = cls(I, H, num_layers=L, dtype=dtype, seed=seed, bidirectional=True, **kw)
    rng = np.random.default_rng(seed)
    for key, p in m.params.items():   # gains and biases away from 1 and 0
        if not key.startswith("weight_"):
            p += rng.normal(0, 0.3, p.shape).astype(dtype)
    return m


def run_all(m, x, lengths, dy, dstate):
    """Every output of a forward and backward, as a dict of arrays."""
    y, state = m.forward(x, lengths=lengths)
    dx, ds = m.backward(dy, dstate)
    out = {"y": y, "dx": dx}
    for i, s in enumerate(state if isinstance(state, tuple) else (state,)):
        out["state%d" % i] = s
    for i, s in enumerate(ds if isinstance(ds, tuple) else (ds,)):
        out["dstate%d" % i] = s
    out.update({"grad " + k: v.copy() for k, v in m.grads.items()})
    return out


@pytest.mark.parametrize("cls, kw", ENGINE_MODELS[:2], ids=ENGINE_IDS[:2])
@dtypes
def test_bitwise_identical_on_any_thread_count(restore_threads, cls, kw, dtype):
    """Large enough for parallel steps: every output of forward and backward is bitwise
    the same on 1, 2, 3 and 8 threads."""
    T, B, I, H, L = 5, 24, 16, 128, 2
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, B, I)).astype(dtype)
    lengths = np.arange(B) % T + 1
    dy = rng.standard_normal((T, B, 2 * H)).astype(dtype)
    n_states = 2 if cls is LNLSTM else 1
    dstate = [rng.standard_normal((2 * L, B, H)).astype(dtype) for _ in range(n_states)]
    dstate = tuple(dstate) if n_states == 2 else dstate[0]
    results = []
    for n in (1, 2, 3, 8):
        fastln.set_num_threads(n)
        results.append(run_all(engine_model(cls, kw, dtype, I, H, L), x, lengths, dy, dstate))
    for n, other in zip((2, 3, 8), results[1:]):
        assert sorted(other) == sorted(results[0])
        for key in results[0]:
            assert np.array_equal(results[0][key], other[key]), (key, n)


@pytest.mark.parametrize("cls, kw", ENGINE_MODELS, ids=ENGINE_IDS)
@pytest.mark.parametrize("B", [1, 9])
@dtypes
def test_isa_paths(isa, torch, cls, kw, B, dtype):
    """Each ISA path (packed kernels with a partial panel at H = 40 and row tails at
    B = 9, the B == 1 dot kernel): forward against the NumPy reference and backward
    against the PyTorch reference."""
    T, I, H, L = 5, 5, 40, 2
    rng = np.random.default_rng(B)
    variant = ("lstm", None) if cls is LNLSTM else ("gru_plain", kw["linear_before_reset"])
    m = engine_model(cls, kw, dtype, I, H, L)
    x = rng.standard_normal((T, B, I)).astype(dtype)
    lengths = rng.integers(1, T + 1, B) if B > 1 else None
    dy = rng.standard_normal((T, B, 2 * H)).astype(dtype)
    dstate = rand_state(rng, variant, 2 * L, B, H, dtype)
    got = run_all(m, x, lengths, dy, dstate)
    ry, rs = ref_forward(m, variant, x, None, lengths)
    check(got["y"], ry, dtype, "y")
    for i, r in enumerate(as_tuple(variant, rs)):
        check(got["state%d" % i], r, dtype, "state%d" % i)
    want = torch_ref(torch, m, variant, x, None, lengths, dy, dstate)
    check(got["dx"], want.dx, dtype, "dx")
    for i, r in enumerate(as_tuple(variant, want.dstate)):
        check(got["dstate%d" % i], r, dtype, "dstate%d" % i)
    for name, g in want.grads.items():
        check(got["grad " + name], g, dtype, "grad " + name)


# ---------------------------------------------------------------- state_dict and repr

def test_state_dict_roundtrip_savez(rng, tmp_path):
    I, H, L, T, B = 4, 6, 2, 5, 3
    variant = ("gru_plain", True)
    m = randomized(rng, variant, I, H, L, F32)
    d = m.state_dict()
    assert sorted(d) == sorted(ref.param_shapes("gru_plain", I, H, L, bidirectional=True))
    assert all(isinstance(v, np.ndarray) for v in d.values())
    path = tmp_path / "gru.npz"
    np.savez(path, **d)
    fresh = make(variant, I, H, L, F32, seed=123)
    with np.load(path) as f:
        fresh.load_state_dict({k: f[k] for k in f.files})
    for name in m.params:
        assert np.array_equal(fresh.params[name], m.params[name]), name
    x = rand_x(rng, T, B, I, F32)
    lengths = rand_lengths(rng, T, B)
    y1, s1 = m.forward(x, None, lengths, cache=False)
    y2, s2 = fresh.forward(x, None, lengths, cache=False)
    assert np.array_equal(y1, y2) and np.array_equal(s1, s2)


@pytest.mark.parametrize("variant", VARIANTS, ids=VIDS)
def test_repr(variant):
    bi = repr(make(variant, 3, 4, 2, F32, bidir=True))
    uni = repr(make(variant, 3, 4, 2, F32, bidir=False))
    assert bi.startswith(CLASSES[variant[0]].__name__ + "(")
    assert "bidirectional=True" in bi
    assert "bidirectional" not in uni


# ---------------------------------------------------------------- errors

I0, H0, L0, T0, B0 = 3, 4, 2, 5, 2


def _bidir(variant):
    return make(variant, I0, H0, L0, F32)


def _x():
    return np.linspace(-1, 1, T0 * B0 * I0).reshape(T0, B0, I0).astype(F32)


def _states(variant, n):
    k = 2 if has_cell(variant) else 1
    return from_tuple(variant, [np.zeros((n, B0, H0), F32) for _ in range(k)])


ERROR_VARIANTS = pytest.mark.parametrize("variant", [VARIANTS[2], VARIANTS[7], VARIANTS[0]],
                                         ids=["lnlstm", "gru", "lnrnn"])


@ERROR_VARIANTS
def test_step_on_bidirectional_raises(variant):
    m = _bidir(variant)
    with pytest.raises(ValueError, match="bidirectional"):
        m.step(_x()[0])


@ERROR_VARIANTS
def test_state_of_one_direction_raises(variant):
    m = _bidir(variant)
    with pytest.raises(ValueError, match=named("state")):
        m.forward(_x(), _states(variant, L0))
    m.forward(_x(), _states(variant, 2 * L0))
    with pytest.raises(ValueError, match=named("dstate")):
        m.backward(np.ones((T0, B0, 2 * H0), F32), _states(variant, L0))
    m.forward(_x())
    with pytest.raises(ValueError, match=named("dy")):      # dy of one direction's width
        m.backward(np.ones((T0, B0, H0), F32))


@ERROR_VARIANTS
def test_load_state_dict_without_reverse_keys(variant):
    m = _bidir(variant)
    before = m.state_dict()
    d = {k: v for k, v in before.items() if not k.endswith("_reverse")}
    with pytest.raises(ValueError, match=named("weight_ih_l0_reverse")):
        m.load_state_dict(d)
    # a unidirectional model's state_dict: keys missing, and weight_ih_l1 of the wrong width
    uni = make(variant, I0, H0, L0, F32, bidir=False)
    with pytest.raises(ValueError, match="_reverse"):
        m.load_state_dict(uni.state_dict())
    for k, v in before.items():                      # on error nothing changes
        assert np.array_equal(m.params[k], v), k


@pytest.mark.parametrize("bad", [1, "True", None], ids=["int", "str", "None"])
@pytest.mark.parametrize("variant", [VARIANTS[i] for i in (0, 2, 3, 4, 6, 7)],
                         ids=["lnrnn", "lnlstm", "lngru", "rnn", "lstm", "gru"])
def test_bidirectional_not_a_bool(variant, bad):
    kw = dict(num_layers=1, dtype=F32, **options(variant))
    with pytest.raises(TypeError, match=named("bidirectional")):
        CLASSES[variant[0]](I0, H0, bidirectional=bad, **kw)


@pytest.mark.parametrize("bad", [1, "False", None], ids=["int", "str", "None"])
def test_linear_before_reset_not_a_bool(bad):
    with pytest.raises(TypeError, match=named("linear_before_reset")):
        GRU(I0, H0, linear_before_reset=bad)


def test_from_torch_errors(torch):
    with pytest.raises(TypeError, match=named("module")):
        GRU.from_torch(torch.nn.LSTM(I0, H0))
    with pytest.raises(TypeError, match=named("module")):
        LSTM.from_torch(torch.nn.GRU(I0, H0, bidirectional=True))
    with pytest.raises(TypeError, match=named("module")):
        RNN.from_torch(torch.nn.GRU(I0, H0))
    for bidir in (False, True):   # a projection loads (tests/test_rnn_lstmp.py)
        assert LSTM.from_torch(torch.nn.LSTM(I0, H0, proj_size=2,
                                             bidirectional=bidir)).proj_size == 2
