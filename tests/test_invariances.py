"""Property tests (hypothesis) of the invariances of LayerNorm in Table 1 of Ba, Kiros &
Hinton, "Layer Normalization" (2016), and of the two non-invariances it lists, on every
ISA path (the ``isa`` fixture), in float32 and float64.

What is tested
--------------
With LN(a) = (a - mean) / sqrt(var + eps) * w + b over the last axis (rows of H values):

1. Single training case re-scaling: LN(c x) = LN(x) for c > 0 drawn per row (one c for
   every row too: dataset re-scaling), and the same for rms_norm. Single training case
   re-centring: LN(x + d) = LN(x) for a shift d drawn per row.
2. Weight matrix re-scaling and re-centring: for pre-activations a = x W^T (W of shape
   (H, I)), LN(x (c W)^T) = LN(x W^T) for c > 0, and LN(x (W + 1 u^T)^T) = LN(x W^T),
   where the same vector u is added to every row of W: every pre-activation of a row
   moves by the same x . u, which LN removes.
3. In LNLSTM and LNGRU every gate sees x_t only through LN(x_t W_ih^T) (the input
   projection is normalized on its own), so re-scaling each x_t by its own c > 0 leaves
   the whole output y and the final state unchanged, on every layer.
4. What LN is not invariant to: re-scaling one unit's incoming weights (one row of W)
   by c != 1 changes LN(x W^T) in the other units too (through the row's mean and
   variance), and re-centring the dataset (x + d with one vector d for every row: a shift
   along the input dimension) changes LN(x W^T) for a generic W (the pre-activations move
   by W d, not by a constant). These tests require a change well above the rounding, and
   equal to the change of a float64 reference within the rounding.

Tolerances
----------
Notation, per row: v = var(a) (float64, of the values the kernel reads), r = 1/sqrt(v + eps),
xhat = (a - mean) r, kappa = (max(a) - min(a)) r, u = unit roundoff of the dtype plus
float64's (2**-24 + 2**-53 for float32, 2**-52 for float64), u_o = the output dtype's,
s(H) = sqrt(1 + min(H, 1024)/8 + H/1024) (the growth of a row sum's rounding in fastln's
lanes, as in tests/test_fuzz.py), C = 5 (as in tests/test_fuzz.py: a margin over the
rounding analysis, whose constants it leaves out).

* One call of layer_norm is off from the exact LN of its input by at most
  C u (s(H) kappa + max|a| r) |w| + 2 u_o (|xhat w| + |b|): the row statistics' rounding,
  the rounding of the mean (u |mean|), which moves y by u |mean| r, and that of xhat w + b.
  rms_norm: (C u s(H) + 2 u_o) |y| (no cancellation).
* Rounding an input that the test computes (c x, x + d, c W, W + 1 u^T, x W^T) perturbs
  each of its values by at most E (per row: u times its largest magnitude; a product
  x W^T of I terms: (I + 2) u (|x| |W|^T)); that moves y by at most
  r E (2 + 2 |xhat|) |w| (the mean moves by E and sqrt(v + eps) by at most 2 E).
* eps: LN(c a) = (a - mean) / sqrt(v + eps / c^2) exactly, so LN(c a) - b =
  rho (LN(a) - b) with rho = sqrt((v + eps) / (v + eps / c^2)), i.e. a relative change
  |rho - 1| = |1 - 1/c^2| eps / ((v + eps/c^2) (1 + rho)), about |1/c^2 - 1| eps / (2 v).
  The re-scaling tests assert the exact form (LN(c a) - b against rho (LN(a) - b)) within
  the rounding of both calls, and the bound form (|LN(c a) - LN(a)| <= |rho - 1| |y - b|
  plus the rounding) too, for eps in {0, 1e-12, 1e-5, 1e-2}: with eps = 0 the invariance is
  exact, with eps = 1e-2 and c = 1e-3 it is mostly gone and rho says by how much.
  Re-centring leaves v unchanged: it holds for every eps within the rounding alone, whose
  input part grows as u |d| r (a shift d of a row of spread 1/r).
* The recurrent models (3.) use eps = 1e-30, so that the eps term, at most
  |1/c^2 - 1| eps / v <= 1e6 * 1e-30 / v, is below u / 100 for the rows of x W_ih^T
  drawn (an example where a row of x near 0 makes it larger is skipped). The initial
  state is zero or random: a zero h gives LN(h W_hh^T) of a zero row, which is exactly
  ln_hh_bias for any eps > 0 (eps = 0 would give 0/0 = NaN there). What is left is
  rounding: that of c x_t, of the two LN(x_t W_ih^T) and of every later operation, carried
  through T <= 5 steps and 2 layers, where an LN of a row of small spread (LN(c_t) with
  H = 2 or 3, say) amplifies it. Its size is the float64 reference's sensitivity kappa:
  the largest change of an output array (y, h, c) under a random relative perturbation
  delta = 1e-7 of every parameter and of x (4 draws), divided by delta; a computed
  forward is the exact one of data perturbed by some u, so it is off by about u kappa.
  Bound per array: K u (kappa + max(1, max|out|)), K = 16 (a margin for the first-order
  estimate of kappa and the steps' compounding). A broken
  invariance moves the outputs by O(eps / (c^2 v)) or more, far above it.
"""
import math

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import fastln
from fastln import rnn_reference as rref
from fastln.rnn import LNGRU, LNLSTM

from _util import F32, F64

C = 5.0
U64 = 2.0 ** -53

SETTINGS = dict(deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.function_scoped_fixture])

DTYPES = [np.dtype(F32), np.dtype(F64)]
# 2 and 3 (short rows), 7 (tail only), 8/16/17/33/64/65 (whole vectors of 8 float64 or
# 16 float32 lanes, with and without a tail), 300 (several vectors and a tail)
SIZES = [2, 3, 5, 7, 8, 16, 17, 33, 64, 65, 300]
EPS = [0.0, 1e-12, 1e-5, 1e-2]

# a log-uniform scale factor c in [1e-3, 1e3]
exponents = st.floats(-3.0, 3.0, allow_nan=False)
seeds = st.integers(0, 2 ** 32 - 1)


def unit(dtype):
    """Unit roundoff of ``dtype`` plus float64's (the test's own float64 arithmetic)."""
    return float(np.finfo(dtype).eps) / 2 + U64


def unit_in(dtype):
    """Unit roundoff of ``dtype``: one rounding of an input the test computes."""
    return float(np.finfo(dtype).eps) / 2


def sfac(H):
    """Growth of the rounding error of a row sum of H terms (as in tests/test_fuzz.py)."""
    return math.sqrt(1 + min(H, 1024) / 8 + H / 1024)


def f64(a):
    return np.asarray(a).astype(F64)


def stats(a, eps):
    """float64 (mean, var, r, xhat, kappa, max|a|) of the rows of ``a``, kept 2-D."""
    a = f64(a)
    mean = a.mean(axis=-1, keepdims=True)
    d = a - mean
    var = (d * d).mean(axis=-1, keepdims=True)
    r = 1.0 / np.sqrt(var + eps)
    kappa = (a.max(axis=-1, keepdims=True) - a.min(axis=-1, keepdims=True)) * r
    return mean, var, r, d * r, kappa, np.abs(a).max(axis=-1, keepdims=True)


def ln_err(a, eps, dtype, w, b):
    """Bound on |layer_norm(a) - exact LN(a)| per element (see the module docstring)."""
    _, _, r, xhat, kappa, amax = stats(a, eps)
    H = a.shape[-1]
    y = np.abs(xhat * w) + np.abs(b)
    return C * unit(dtype) * (sfac(H) * kappa + amax * r) * np.abs(w) + 2 * unit_in(dtype) * y


def input_err(a, eps, e, w):
    """Bound on how far a perturbation of at most ``e`` (per row) of ``a`` moves LN(a)."""
    _, _, r, xhat, _, _ = stats(a, eps)
    return r * e * (2 + 2 * np.abs(xhat)) * np.abs(w)


def product_err(x, W, dtype):
    """Bound on the rounding of the product x W^T computed in ``dtype`` (per element)."""
    return (W.shape[1] + 2) * unit_in(dtype) * (np.abs(f64(x)) @ np.abs(f64(W)).T)


def rho(var, eps, c):
    """sqrt((v + eps) / (v + eps / c**2)): LN(c a) - b = rho (LN(a) - b) exactly."""
    return np.sqrt((var + eps) / (var + eps / c ** 2))


def check(diff, bound, what):
    """Asserts |diff| <= bound everywhere; the message names the worst element."""
    diff, bound = np.abs(f64(diff)), f64(bound)
    assert diff.shape == bound.shape, (diff.shape, bound.shape)
    ratio = diff / bound
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    assert np.all(diff <= bound), (
        f"{what}: |difference| {diff[worst]:.3e} > bound {bound[worst]:.3e} at {worst} "
        f"(ratio {ratio[worst]:.3g})")


def rows(rng, N, H, dtype, spread=(-2.0, 2.0), offset=20.0):
    """N rows of H values: a per-row spread 10**U(spread) around a per-row mean of up to
    ``offset`` spreads, in ``dtype``."""
    std = 10.0 ** rng.uniform(*spread, (N, 1))
    mean = std * rng.uniform(-offset, offset, (N, 1))
    return (mean + std * rng.standard_normal((N, H))).astype(dtype)


def affine(rng, H, dtype, kind):
    """(w, b) as passed to layer_norm and (w, b) as float64 arrays for the bounds."""
    w = (1.0 + 0.5 * rng.standard_normal(H)).astype(dtype) if kind in ("w", "wb") else None
    b = (0.5 * rng.standard_normal(H)).astype(dtype) if kind in ("b", "wb") else None
    return w, b, (np.ones(H) if w is None else f64(w)), (np.zeros(H) if b is None else f64(b))


def well_conditioned(a, limit=1e3):
    """Rows with a spread: max|a| r below ``limit`` in every row (no near-constant rows,
    whose rounding bound would say nothing)."""
    _, var, _, _, _, amax = stats(a, 0.0)
    return bool(np.all(var > 0) and np.all(amax <= limit * np.sqrt(var)))


# ---------------------------------------------------------------- 1. single training case

@st.composite
def case_cases(draw, eps_values=EPS):
    N = draw(st.integers(1, 8))
    return dict(dtype=draw(st.sampled_from(DTYPES)), N=N, H=draw(st.sampled_from(SIZES)),
                eps=draw(st.sampled_from(eps_values)), affine=draw(st.sampled_from(
                    ["none", "w", "b", "wb"])),
                exps=draw(st.one_of(st.lists(exponents, min_size=N, max_size=N),
                                    exponents.map(lambda e: [e] * N))),
                seed=draw(seeds))


@settings(max_examples=50, **SETTINGS)
@given(case=case_cases())
def test_single_case_rescaling_layer_norm(isa, case):
    dtype, N, H, eps = case["dtype"], case["N"], case["H"], case["eps"]
    rng = np.random.default_rng(case["seed"])
    x = rows(rng, N, H, dtype)
    assume(well_conditioned(x))
    w, b, w64, b64 = affine(rng, H, dtype, case["affine"])
    c = 10.0 ** np.array(case["exps"])[:, None]
    xc = (c * f64(x)).astype(dtype)                      # one rounding of c x

    y = f64(fastln.layer_norm(x, w, b, eps=eps))
    yc = f64(fastln.layer_norm(xc, w, b, eps=eps))

    _, var, _, _, _, xmax = stats(x, eps)
    p = rho(var, eps, c)
    err = (np.maximum(1.0, p) * ln_err(x, eps, dtype, w64, b64) + ln_err(xc, eps, dtype, w64, b64)
           + input_err(c * f64(x), eps, unit_in(dtype) * c * xmax, w64)
           + 4 * U64 * (np.abs(y) + np.abs(b64)))
    check((yc - b64) - p * (y - b64), err, "LN(c x) - b against rho (LN(x) - b)")
    check(yc - y, np.abs(p - 1) * np.abs(y - b64) + err, "LN(c x) against LN(x)")
    if eps == 0.0:
        check(yc - y, err, "LN(c x) against LN(x), eps = 0")


@settings(max_examples=40, **SETTINGS)
@given(case=case_cases(eps_values=[0.0, 1e-12, 1e-6, 1e-2]))
def test_single_case_rescaling_rms_norm(isa, case):
    dtype, N, H, eps = case["dtype"], case["N"], case["H"], case["eps"]
    rng = np.random.default_rng(case["seed"])
    x = rows(rng, N, H, dtype)
    w = (1.0 + 0.5 * rng.standard_normal(H)).astype(dtype) if "w" in case["affine"] else None
    w64 = np.ones(H) if w is None else f64(w)
    c = 10.0 ** np.array(case["exps"])[:, None]
    xc = (c * f64(x)).astype(dtype)

    y = f64(fastln.rms_norm(x, w, eps=eps))
    yc = f64(fastln.rms_norm(xc, w, eps=eps))

    ms = (f64(x) ** 2).mean(axis=-1, keepdims=True)
    assume(np.all(ms > 0))
    p = rho(ms, eps, c)                       # the same algebra with the mean square
    yhat = np.abs(f64(x)) / np.sqrt(ms + eps) * np.abs(w64)
    # each call: (C u s(H) + 2 u_o) |y|; the rounding of c x: 2 u_o |y| (element and mean
    # square); the float64 arithmetic here: 4 u64 |y|
    per = (C * unit(dtype) * sfac(H) + 2 * unit_in(dtype)) * yhat
    err = (np.maximum(1.0, p) * per + p * per + 2 * unit_in(dtype) * p * yhat
           + 4 * U64 * np.abs(y))
    check(yc - p * y, err, "rms_norm(c x) against rho rms_norm(x)")
    check(yc - y, np.abs(p - 1) * np.abs(y) + err, "rms_norm(c x) against rms_norm(x)")


@settings(max_examples=50, **SETTINGS)
@given(case=case_cases(), shift_exps=st.lists(st.floats(-2.0, 3.0), min_size=8, max_size=8),
       signs=st.lists(st.booleans(), min_size=8, max_size=8))
def test_single_case_recentring(isa, case, shift_exps, signs):
    dtype, N, H, eps = case["dtype"], case["N"], case["H"], case["eps"]
    rng = np.random.default_rng(case["seed"])
    x = rows(rng, N, H, dtype)
    assume(well_conditioned(x))
    w, b, w64, b64 = affine(rng, H, dtype, case["affine"])
    _, var, _, _, _, _ = stats(x, 0.0)
    # a shift of 1e-2 to 1e3 row spreads, either sign
    d = (np.where(signs[:N], 1.0, -1.0) * 10.0 ** np.array(shift_exps[:N]))[:, None]
    d = d * np.sqrt(var)
    xd = (f64(x) + d).astype(dtype)                      # one rounding of x + d

    y = f64(fastln.layer_norm(x, w, b, eps=eps))
    yd = f64(fastln.layer_norm(xd, w, b, eps=eps))

    xmax = np.abs(f64(x) + d).max(axis=-1, keepdims=True)
    err = (ln_err(x, eps, dtype, w64, b64) + ln_err(xd, eps, dtype, w64, b64)
           + input_err(f64(x) + d, eps, unit_in(dtype) * xmax, w64)
           + 4 * U64 * (np.abs(y) + np.abs(b64)))
    check(yd - y, err, "LN(x + d) against LN(x)")


# ---------------------------------------------------------------- 2. weight matrix

@st.composite
def matrix_cases(draw, sizes=SIZES, eps_values=EPS):
    return dict(dtype=draw(st.sampled_from(DTYPES)), N=draw(st.integers(1, 8)),
                H=draw(st.sampled_from(sizes)), I=draw(st.integers(1, 12)),
                eps=draw(st.sampled_from(eps_values)),
                affine=draw(st.sampled_from(["none", "w", "b", "wb"])),
                exp=draw(exponents), seed=draw(seeds))


def inputs_and_weights(case):
    """x (N, I), W (H, I) in the case's dtype, and the generator for anything else."""
    rng = np.random.default_rng(case["seed"])
    N, H, I, dtype = case["N"], case["H"], case["I"], case["dtype"]
    x = rows(rng, N, I, dtype, spread=(-1.0, 1.0), offset=3.0)
    W = (rng.standard_normal((H, I)) / np.sqrt(I)).astype(dtype)
    return rng, x, W


@settings(max_examples=50, **SETTINGS)
@given(case=matrix_cases())
def test_weight_matrix_rescaling(isa, case):
    dtype, H, eps = case["dtype"], case["H"], case["eps"]
    rng, x, W = inputs_and_weights(case)
    c = 10.0 ** case["exp"]
    Wc = (c * f64(W)).astype(dtype)
    a, ac = x @ W.T, x @ Wc.T                       # computed in dtype
    exact = f64(x) @ f64(W).T
    assume(well_conditioned(exact))
    w, b, w64, b64 = affine(rng, H, dtype, case["affine"])

    y = f64(fastln.layer_norm(a, w, b, eps=eps))
    yc = f64(fastln.layer_norm(ac, w, b, eps=eps))

    _, var, _, _, _, _ = stats(exact, eps)
    p = rho(var, eps, c)
    # the products' rounding (the rounding of c W is one more u per term, in product_err)
    e1 = product_err(x, W, dtype).max(axis=-1, keepdims=True)
    err = (np.maximum(1.0, p) * (ln_err(a, eps, dtype, w64, b64) + input_err(exact, eps, e1, w64))
           + ln_err(ac, eps, dtype, w64, b64) + input_err(c * exact, eps, c * e1, w64)
           + 4 * U64 * (np.abs(y) + np.abs(b64)))
    check((yc - b64) - p * (y - b64), err, "LN(x (cW)^T) - b against rho (LN(x W^T) - b)")
    check(yc - y, np.abs(p - 1) * np.abs(y - b64) + err, "LN(x (cW)^T) against LN(x W^T)")


@settings(max_examples=50, **SETTINGS)
@given(case=matrix_cases(), shift_exp=st.floats(-2.0, 2.0))
def test_weight_matrix_recentring(isa, case, shift_exp):
    dtype, H, eps = case["dtype"], case["H"], case["eps"]
    rng, x, W = inputs_and_weights(case)
    u = 10.0 ** shift_exp * rng.standard_normal(case["I"])   # added to every row of W
    Wu = (f64(W) + u).astype(dtype)
    a, au = x @ W.T, x @ Wu.T
    exact = f64(x) @ f64(W).T
    assume(well_conditioned(exact))
    w, b, w64, b64 = affine(rng, H, dtype, case["affine"])

    y = f64(fastln.layer_norm(a, w, b, eps=eps))
    yu = f64(fastln.layer_norm(au, w, b, eps=eps))

    exact_u = f64(x) @ (f64(W) + u).T                # = exact + (x . u) in every unit
    e1 = product_err(x, W, dtype).max(axis=-1, keepdims=True)
    eu = product_err(x, np.abs(f64(W)) + np.abs(u), dtype).max(axis=-1, keepdims=True)
    err = (ln_err(a, eps, dtype, w64, b64) + input_err(exact, eps, e1, w64)
           + ln_err(au, eps, dtype, w64, b64) + input_err(exact_u, eps, eu, w64)
           + 4 * U64 * (np.abs(y) + np.abs(b64)))
    check(yu - y, err, "LN(x (W + 1 u^T)^T) against LN(x W^T)")


# ---------------------------------------------------------------- 3. LN-LSTM and LN-GRU

RNN_EPS = 1e-30
RNN_K = 16.0
REFERENCES = {"lstm": rref.lnlstm_forward, "gru": rref.lngru_forward}


def rnn_outputs(cell, out):
    """[(name, array)] of y and the final state of a forward's result."""
    y, state = out
    if cell == "lstm":
        return [("y", y), ("h", state[0]), ("c", state[1])]
    return [("y", y), ("h", state)]


def rnn_sensitivity(cell, params, x, state, L, rng, delta=1e-7, trials=4):
    """Per output array, the largest change of the float64 reference's output under a
    random relative perturbation delta of every parameter and input, divided by delta."""
    ref = REFERENCES[cell]
    p64 = {k: f64(v) for k, v in params.items()}
    base = rnn_outputs(cell, ref(p64, f64(x), state, num_layers=L, eps=RNN_EPS))
    worst = [0.0] * len(base)
    for _ in range(trials):
        p2 = {k: v * (1 + delta * rng.standard_normal(v.shape)) for k, v in p64.items()}
        x2 = f64(x) * (1 + delta * rng.standard_normal(x.shape))
        out = rnn_outputs(cell, ref(p2, x2, state, num_layers=L, eps=RNN_EPS))
        for i, ((_, a), (_, a2)) in enumerate(zip(base, out)):
            worst[i] = max(worst[i], float(np.max(np.abs(a2 - a))) / delta)
    return worst


@settings(max_examples=30, **SETTINGS)
@given(cell=st.sampled_from(["lstm", "gru"]), dtype=st.sampled_from(DTYPES),
       T=st.integers(1, 5), B=st.integers(1, 4), I=st.integers(1, 6),
       H=st.sampled_from([1, 2, 3, 5, 8, 16, 17]), L=st.integers(1, 2),
       per_step=st.booleans(), exp=exponents, state=st.booleans(), seed=seeds)
def test_rnn_input_rescaling(isa, cell, dtype, T, B, I, H, L, per_step, exp, state, seed):
    rng = np.random.default_rng(seed)
    cls = LNLSTM if cell == "lstm" else LNGRU
    m = cls(I, H, num_layers=L, eps=RNN_EPS, dtype=dtype, seed=seed % 1000)
    for key, value in m.params.items():         # gains and biases away from 1 and 0
        if key.startswith("ln_") and "_weight" in key:
            m.params[key] = (1.0 + 0.5 * rng.standard_normal(value.shape)).astype(dtype)
        elif "bias" in key:
            m.params[key] = (0.5 * rng.standard_normal(value.shape)).astype(dtype)
    x = rng.standard_normal((T, B, I)).astype(dtype)
    # one c for all, or one per step and sequence: each x_t row is normalized on its own
    c = 10.0 ** (rng.uniform(-3, 3, (T, B, 1)) if per_step else np.full((T, B, 1), exp))
    xc = (c * f64(x)).astype(dtype)
    s0 = None
    if state:
        h0 = rng.standard_normal((L, B, H)).astype(dtype)
        s0 = (h0, rng.standard_normal((L, B, H)).astype(dtype)) if cell == "lstm" else h0

    # the eps term of the first layer's LN(x_t W_ih^T) (per gate block for the GRU)
    proj = f64(x) @ f64(m.params["weight_ih_l0"]).T
    blocks = [proj] if cell == "lstm" else [proj[..., :2 * H], proj[..., 2 * H:]]
    vmin = min(float(blk.var(axis=-1).min()) for blk in blocks)
    assume(vmin > 0)
    eps_term = float(np.max(np.abs(1.0 - 1.0 / c ** 2))) * RNN_EPS / vmin
    assume(eps_term < unit(dtype) / 100)      # true but for rows of x near 0

    s0_64 = None if s0 is None else (
        tuple(f64(a) for a in s0) if cell == "lstm" else f64(s0))
    kappa = rnn_sensitivity(cell, m.params, x, s0_64, L, rng)
    outs = rnn_outputs(cell, m.forward(x, s0, cache=False))
    outs_c = rnn_outputs(cell, m.forward(xc, s0, cache=False))
    for (name, got), (_, got_c), k in zip(outs, outs_c, kappa):
        assert np.all(np.isfinite(got)), name
        scale = max(1.0, float(np.max(np.abs(got))))
        tol = RNN_K * unit(dtype) * (k + scale)
        check(f64(got_c) - f64(got), np.full(got.shape, tol),
              f"{cls.__name__} {name}(c x) against {name}(x)")


# ---------------------------------------------------------------- 4. non-invariances

def ln64(a, w, b, eps):
    """Float64 LN over the last axis (the reference for the expected change)."""
    _, _, r, xhat, _, _ = stats(a, eps)
    return xhat * w + b


@settings(max_examples=40, **SETTINGS)
@given(case=matrix_cases(sizes=[s for s in SIZES if s >= 3], eps_values=[0.0, 1e-5]),
       unit_index=st.integers(0, 299), sign=st.booleans(),
       exp=st.floats(0.1, 3.0))
def test_weight_vector_rescaling_changes_output(isa, case, unit_index, sign, exp):
    dtype, H, eps = case["dtype"], case["H"], case["eps"]
    rng, x, W = inputs_and_weights(case)
    k = unit_index % H
    c = 10.0 ** (exp if sign else -exp)                   # |log10 c| >= 0.1
    Wk = W.copy()
    Wk[k] = (c * f64(W[k])).astype(dtype)                 # one unit's incoming weights
    a, ak = x @ W.T, x @ Wk.T
    exact, exact_k = f64(x) @ f64(W).T, f64(x) @ f64(Wk).T
    assume(well_conditioned(exact) and well_conditioned(exact_k))
    w, b, w64, b64 = affine(rng, H, dtype, case["affine"])

    y = f64(fastln.layer_norm(a, w, b, eps=eps))
    yk = f64(fastln.layer_norm(ak, w, b, eps=eps))

    e = product_err(x, W, dtype).max(axis=-1, keepdims=True)
    ek = product_err(x, Wk, dtype).max(axis=-1, keepdims=True)
    err = (ln_err(a, eps, dtype, w64, b64) + input_err(exact, eps, e, w64)
           + ln_err(ak, eps, dtype, w64, b64) + input_err(exact_k, eps, ek, w64)
           + 4 * U64 * (np.abs(y) + np.abs(b64)))
    want = ln64(exact_k, w64, b64, eps) - ln64(exact, w64, b64, eps)
    others = np.arange(H) != k
    # the change in the other units, per row: generic x and W move the row's mean and
    # variance, so every row must change by far more than the rounding
    big = np.abs(want[:, others]).max(axis=-1) > 100 * err[:, others].max(axis=-1)
    assume(np.all(big))
    check((yk - y) - want, err, "LN change against the float64 reference")
    moved = np.abs(yk - y)[:, others].max(axis=-1)
    assert np.all(moved > 10 * err[:, others].max(axis=-1)), moved


@settings(max_examples=40, **SETTINGS)
@given(case=matrix_cases(sizes=[s for s in SIZES if s >= 3], eps_values=[0.0, 1e-5]),
       shift_exp=st.floats(-1.0, 1.0))
def test_dataset_recentring_changes_output(isa, case, shift_exp):
    dtype, H, eps = case["dtype"], case["H"], case["eps"]
    rng, x, W = inputs_and_weights(case)
    d = 10.0 ** shift_exp * rng.standard_normal(case["I"])   # the same d for every row
    xd = (f64(x) + d).astype(dtype)
    a, ad = x @ W.T, xd @ W.T
    exact, exact_d = f64(x) @ f64(W).T, (f64(x) + d) @ f64(W).T
    assume(well_conditioned(exact) and well_conditioned(exact_d))
    w, b, w64, b64 = affine(rng, H, dtype, case["affine"])

    y = f64(fastln.layer_norm(a, w, b, eps=eps))
    yd = f64(fastln.layer_norm(ad, w, b, eps=eps))

    e = product_err(x, W, dtype).max(axis=-1, keepdims=True)
    ed = product_err(np.abs(f64(x)) + np.abs(d), W, dtype).max(axis=-1, keepdims=True)
    err = (ln_err(a, eps, dtype, w64, b64) + input_err(exact, eps, e, w64)
           + ln_err(ad, eps, dtype, w64, b64) + input_err(exact_d, eps, ed, w64)
           + 4 * U64 * (np.abs(y) + np.abs(b64)))
    want = ln64(exact_d, w64, b64, eps) - ln64(exact, w64, b64, eps)
    # the pre-activations move by W d, which is not the same in every unit
    assume(np.all(np.abs(want).max(axis=-1) > 100 * err.max(axis=-1)))
    check((yd - y) - want, err, "LN change against the float64 reference")
    moved = np.abs(yd - y).max(axis=-1)
    assert np.all(moved > 10 * err.max(axis=-1)), moved

