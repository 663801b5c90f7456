"""Property-based fuzzing (hypothesis) of every LN function and of the LN-RNN cells.

LN functions (layer_norm, layer_norm_backward, rms_norm, rms_norm_backward,
add_layer_norm): random shapes (1-4 dims, 0..300 per dim, at most 20000 elements), axes
(an int or a tuple, negative or not, in any order), dtypes (float16, float32, float64),
weight/bias present or not, eps (0 for float16/float32 too), memory layouts, ISA paths
and thread counts, and values row by row from a mixture of kinds: plain normal, large
offsets (|mean| 1e4..1e6, float16 1e3..2e4, relative spread down to below one ulp),
subnormals, magnitudes mixed element by element over the dtype's exponent range, rows
scaled as a whole to tiny or huge values, constant rows, small integers (ties) and rows
with one outlier; and now and then inf/NaN at random places. A normalized size of 0
must raise ValueError; 0 rows give empty results.

Oracle: fastln/reference.py (float64), applied to rows shifted by their first element
(LN forward and backward are invariant under a shift of x and mean together). The shift
takes out the reference's own rounding of a large mean (u64*|mean|*rstd: 1e-7 at mean
1e6 and rstd 1e3, more than the float64 tolerance), so that both sides are held to
errors relative to the row's spread.

Tolerances
----------
Notation, per row (all normalized axes) of H elements: u = unit roundoff of the kernel
dtype (float64: 2**-53; float32 and float16, which computes in float32: 2**-24) plus
2**-53 for the reference's own rounding (numpy's float64 sums are no better than
fastln's: 30 u in the mean square of a constant row of H=300, where fastln is off by
0.3 u); u_o = that of the output dtype (its final rounding; float16: 2**-11); r = rstd;
d = x - mean; xhat = (x - mean) * r; range = max(x) - min(x); kappa = range * r, the
row's conditioning (x - x[0] is rounded relative to |x - x[0]| <= range, and an error e
in the mean moves y by e*r; kappa <= 2*sqrt(H) for any row, and it does not grow with
the offset of the row); tiny = 16 times the output's smallest subnormal, plus 16 times
the kernel dtype's times (1 + r)(1 + |w|) (subnormal intermediates lose absolute, not
relative, precision).
s(H) = sqrt(1 + min(H, 1024)/8 + H/1024): a row sum in fastln runs in >= 8 independent
lanes over chunks of 1024 elements, the chunk sums added in double (norm_sums.h),
and its rounding error grows like the square root of that depth (the worst case is the
depth itself: e.g. 21 u in a float64 rstd of a row of H=830 magnitudes up to 1e149,
where s = 10.3).

* layer_norm  y:    C * u * s(H) * kappa * |w|  +  2 u_o |y|  +  tiny
              mean: C * u * (|mean| + s(H) * range);   rstd: C * u * s(H) * r
  A constant row (eps > 0) must give exactly the bias (README).
* rms_norm    y:    (C * u * s(H) + 2 u_o) |y| + tiny  (no cancellation);  rstd as above.
* add_layer_norm: s must be exactly x + residual rounded once in the kernel dtype (then
  to float16); y, mean, rstd as layer_norm of that s.
* layer_norm_backward, fastln's own mean/rstd given to both sides; g = dy*w,
  A = mean|g|, B = mean(|g| |d|) r, Bd = mean|d| r, K = max|d| r, c2 = mean(g xhat):
    dx: C * u * r * (|g| + s(H) (A + |xhat| (B + Bd A)) + K |c2|) + 2 u_o |dx| + tiny
        + C * sub * r**2 * (1 + |xhat|) (1 + |w|)
  (the rounding of g; of the row sums of g [A] and of g*d with the mean correction,
  times xhat; of xhat itself, times c2. d is taken from the *saved* mean: a float32
  mean rounded away from the true one -- large offset, small spread -- enters through
  K, Bd and B, the honest price of float32 arithmetic on d. sub = the kernel dtype's
  smallest subnormal: products g*d that underflow are scaled by r twice, in c2 and in
  dx. Only float32 rows with |x - mean| < ~1e-19 and eps = 0 have r large enough for
  this; there fastln's dx is off by up to ~2e-5 of r*|g|, e.g. x = [-3.3e-39, -1.1e-38]:
  the backward has no double path like the forward's.)
    dweight_j: C * (u (sqrt(N) sum_n |dy xhat| + sum_n |dy| K) + tiny_k sum_n |dy| (1 + r))
    dbias_j:   C * u * sqrt(N) * sum_n |dy|
  (sums over N rows: sqrt(N) growth of their rounding; the worst case is N.)
* rms_norm_backward: dx: C * u * r * (|g| + s(H) |xhat| B) + 2 u_o |dx| + tiny + the
  r**2 term, with B = mean|g xhat|; dweight as above with |xhat| for K.

C = 5 everywhere: about twice the worst ratio error/bound measured with C = 1 over
25000 random cases of these strategies on all three ISA paths (y 1.9, mean and rstd
2.4, dx 1.6, dweight and dbias 1.5). Nothing is widened per dtype or per kind of input.

Non-finite values: rows with inf/NaN must come out NaN/+inf/-inf exactly where the
float64 reference (run on those rows unshifted) is, and every other row must still match
within the bounds above. With eps = 0 a constant float32 row, or one whose rstd
overflows float32, has rstd = inf: its backward dx must be non-finite throughout (there
is no finite answer to give from rstd = inf).

LN-RNN cells (LNRNN tanh/relu, LNLSTM, LNGRU): T 1..6, B 1..4, I 1..5, H 1..9, 1-2
layers, optional lengths and initial state, batch_first, eps, random parameters away
from the init, weight and input scales:
* float64 forward vs fastln/rnn_reference.py: 1e-10 relative to max(1, max|ref|)
  per array (measured worst 6e-13 over 4000 cases);
* float64 backward (dx, dstate, every parameter gradient) vs tests/_rnn_torch.py
  (PyTorch float64 autograd): 1e-9 relative to max(1, max|ref|) per array (measured
  worst 2.4e-12 over 2500 cases; ill-conditioned cells, e.g. H = 1 or 2
  with a pre-LN variance near eps, amplify rounding);
* float32 forward vs the float64 reference: 2e-4 relative to max(1, max|ref|) (measured
  worst 2e-5 over 4000 cases: the float32 rounding of every step carried through up to 6
  steps and 2 layers);
* y is exactly 0 (and dx too) after each sequence's end; forward(cache=False) gives the
  same bits as forward().

Bugs it found, fixed, and now pinned with @example in the main tests:
* float32 layer_norm_backward and rms_norm_backward summed dy*w*(x - mean) (dy*w*x) in
  float32 lanes: past FLT_MAX (|x| ~ 1e36, |dy| ~ 400) dx was inf/NaN for finite inputs
  with a finite gradient. Such rows now redo their sums in double.
* float32 rms_norm with eps=0 on a row with rms below 2.9e-39 multiplied by a float rstd
  past FLT_MAX: y was inf where the answer is O(1). Such rows now compute y in double.

Every example is reproducible: derandomize=True and no example database; the NumPy
values come from seeds that hypothesis draws (and shrinks).
"""
import functools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import fastln
from fastln import reference as ref
from fastln import rnn_reference as rref
from fastln.rnn import LNGRU, LNLSTM, LNRNN

from _rnn_torch import torch_rnn
from _util import F16, F32, F64, LAYOUTS

# ---------------------------------------------------------------- tolerance constants

# One constant for every bound below: about twice the worst ratio error/bound measured with
# C = 1 over 25000 random cases of these strategies on all ISA paths (y 1.9, mean/rstd 2.4,
# dx 1.6, dweight/dbias 1.5).
C = 5.0

SETTINGS = dict(deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

DTYPES = [np.dtype(F16), np.dtype(F32), np.dtype(F64)]
KINDS = ("normal", "offset", "subnormal", "mixed", "scaled", "constant", "ints", "outlier")
EPS = (1e-5, 1e-6, 1e-3, 1e-12, 0.5)
# eps = 0 for float16/float32 only: their rows whose float statistics under- or overflow
# are redone in double (docs/design.md). float64 has no such path, and with eps = 0 a float64 row
# whose squares underflow is garbage in the reference as much as in fastln.
EPS0_DTYPES = (np.dtype(F16), np.dtype(F32))
LAYOUT_KINDS = ("C", "C", "F", "negstride", "sliced")
ISAS = tuple(fastln.supported_isas())
MAX_SIZE = 20000

def kernel_dtype(dtype):
    return np.dtype(F64) if np.dtype(dtype) == np.dtype(F64) else np.dtype(F32)


U64 = 2.0 ** -53


def unit(dtype):
    """Unit roundoff of ``dtype`` plus float64's: the reference rounds too (numpy sums in a
    few lanes as fastln does; for a float64 row the two errors are of one size)."""
    return float(np.finfo(dtype).eps) / 2 + U64


def unit_out(dtype):
    """Unit roundoff of the output dtype: its final rounding."""
    return float(np.finfo(dtype).eps) / 2


def tiny(dtype):
    return 16 * float(np.finfo(dtype).smallest_subnormal)


def sfac(H):
    """Growth of the rounding error of a row sum of H terms (see the module docstring)."""
    return math.sqrt(1 + min(H, 1024) / 8 + H / 1024)


# ---------------------------------------------------------------- shapes, axes, values

@st.composite
def shapes_axes(draw):
    """(shape, axis): 1-4 dims of 1..300, at most MAX_SIZE elements, and in about one case in
    ten one dim of 0; axis an int or a tuple."""
    ndim = draw(st.integers(1, 4))
    shape, budget = [], MAX_SIZE
    for _ in range(ndim):
        n = draw(st.integers(1, min(300, budget)))
        shape.append(n)
        budget //= n
    if draw(st.integers(0, 9)) == 9:
        shape[draw(st.integers(0, ndim - 1))] = 0
    shape = tuple(draw(st.permutations(shape)))
    k = draw(st.integers(1, ndim))
    axes = draw(st.permutations(range(ndim)))[:k]
    axes = tuple(a - ndim if draw(st.booleans()) else a for a in axes)
    axis = axes[0] if k == 1 and draw(st.booleans()) else axes
    return shape, axis


# log10 ranges that stay inside each dtype: |mean| of offset rows, relative spread digits
# of offset rows, magnitudes of mixed/scaled rows
_RANGES = {
    np.dtype(F16): dict(offset=(3.0, 4.3), digits=3.3, mag=(-7.0, 4.0)),
    np.dtype(F32): dict(offset=(4.0, 6.0), digits=7.5, mag=(-44.0, 36.0)),
    np.dtype(F64): dict(offset=(4.0, 6.0), digits=16.0, mag=(-320.0, 150.0)),
}


def block_values(rng, kind, n, H, dtype, mag_hi):
    """n rows of H float64 values of ``kind``, finite in ``dtype``; mixed and scaled
    magnitudes go up to 10**mag_hi."""
    R = _RANGES[np.dtype(dtype)]
    fin = np.finfo(dtype)
    z = rng.standard_normal((n, H))

    def per_row(lo, hi):
        return rng.uniform(lo, hi, (n, 1))

    if kind == "normal":
        v = per_row(-3, 3) + 10 ** per_row(-2, 1) * z
    elif kind == "offset":        # large |mean|, relative spread down to 10**-digits
        mean = np.where(per_row(0, 1) < 0.5, -1, 1) * 10 ** per_row(*R["offset"])
        v = mean * (1 + 10 ** -per_row(1, R["digits"]) * z)
    elif kind == "subnormal":
        lo, hi = math.log10(float(fin.smallest_subnormal)), math.log10(float(fin.smallest_normal))
        v = np.sign(z) * 10 ** rng.uniform(lo, hi, (n, H))
        v[rng.random((n, H)) < 0.1] = 0.0
    elif kind == "mixed":         # every element its own magnitude
        v = z * 10 ** rng.uniform(R["mag"][0], mag_hi, (n, H))
    elif kind == "scaled":        # the whole row tiny or huge
        v = z * 10 ** per_row(R["mag"][0], mag_hi)
    elif kind == "constant":
        v = np.broadcast_to(rng.standard_normal((n, 1)) * 10 ** per_row(-3, R["offset"][1]),
                            (n, H)).copy()
    elif kind == "ints":          # ties
        v = rng.integers(-3, 4, (n, H)).astype(F64)
    elif kind == "outlier":       # one element far from the rest
        v = z
        v[np.arange(n), rng.integers(0, H, n)] = (np.where(rng.random(n) < 0.5, -1, 1) *
                                                  math.sqrt(H) * 10 ** rng.uniform(0, 2.5, n))
    else:
        raise AssertionError(kind)
    big = float(fin.max) / 8
    return np.clip(v, -big, big)


def inject_nonfinite(rng, rows):
    """Puts inf/-inf/NaN at a few places of a few rows (in place)."""
    N, H = rows.shape
    for n in rng.choice(N, size=min(N, int(rng.integers(1, 4))), replace=False):
        for i in rng.choice(H, size=min(H, int(rng.integers(1, 4))), replace=False):
            rows[n, i] = rng.choice([np.inf, -np.inf, np.nan])


@st.composite
def values_spec(draw):
    """What the rows are made of: a seed, a set of kinds, and whether inf/NaN appear."""
    return dict(seed=draw(st.integers(0, 2 ** 32 - 1)),
                kinds=draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=3, unique=True)),
                nonfinite=draw(st.integers(0, 4)) == 0)


def make_rows(spec, N, H, dtype, mag_hi, salt=0):
    """(N, H) array of ``dtype``: each row of a kind drawn from spec['kinds'] (or the
    explicit spec['values'] of a pinned example)."""
    if "values" in spec:
        return np.array(spec["values"], dtype).reshape(N, H)
    rng = np.random.default_rng([spec["seed"], salt])
    rows = np.empty((N, H))
    if rows.size == 0:
        return rows.astype(dtype)
    kinds = rng.integers(0, len(spec["kinds"]), N)
    for k, kind in enumerate(spec["kinds"]):
        sel = kinds == k
        rows[sel] = block_values(rng, kind, int(sel.sum()), H, dtype, mag_hi)
    rows = rows.astype(dtype)
    if spec["nonfinite"]:
        inject_nonfinite(rng, rows)
    return rows


class Geometry:
    """How x's shape maps to (N, H) rows: the normalized axes moved to the end in the
    order given (as fastln and the reference do), the others flattened."""

    def __init__(self, shape, axis):
        ndim = len(shape)
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        self.shape = shape
        self.axes = tuple(a % ndim for a in axes)
        self.dest = tuple(range(ndim - len(axes), ndim))
        self.batch = tuple(n for i, n in enumerate(shape) if i not in self.axes)
        self.norm = tuple(shape[a] for a in self.axes)
        self.N = int(np.prod(self.batch, dtype=np.int64))
        self.H = int(np.prod(self.norm, dtype=np.int64))

    def to_rows(self, a):
        return np.moveaxis(np.asarray(a), self.axes, self.dest).reshape(self.N, self.H)

    def from_rows(self, r):
        return np.ascontiguousarray(np.moveaxis(r.reshape(self.batch + self.norm),
                                                self.dest, self.axes))


@st.composite
def ln_cases(draw, with_bias=True, mag_hi=None, eps0_dtypes=EPS0_DTYPES):
    shape, axis = draw(shapes_axes())
    dtype = draw(st.sampled_from(DTYPES))
    affine = draw(st.sampled_from(["none", "weight", "bias", "both"] if with_bias
                                  else ["none", "weight"]))
    wscale = 1.0 if dtype == np.dtype(F16) else draw(st.sampled_from([1.0, 1e-2, 1e2]))
    top = _RANGES[dtype]["mag"][1]
    return dict(shape=shape, axis=axis, dtype=dtype, affine=affine, wscale=wscale,
                x=draw(values_spec()), r=draw(values_spec()),
                eps=draw(st.sampled_from(EPS + (0.0,) if dtype in eps0_dtypes else EPS)),
                mag_hi=top if mag_hi is None else min(mag_hi, top),
                layout=draw(st.sampled_from(LAYOUT_KINDS)),
                isa=draw(st.sampled_from(ISAS)), threads=draw(st.sampled_from([1, 2])),
                pseed=draw(st.integers(0, 2 ** 16)))


def pinned(values, dy=None, dtype=F32, eps=1e-5):
    """A case of explicit rows (for @example), on the first ISA path."""
    values = np.asarray(values, F64)
    case = dict(shape=values.shape, axis=-1, dtype=np.dtype(dtype), affine="none", wscale=1.0,
                x=dict(values=values.tolist()), r=dict(values=np.zeros_like(values).tolist()),
                eps=eps, mag_hi=0.0, layout="C", isa=ISAS[0], threads=1, pseed=0)
    if dy is not None:
        case["dy"] = np.asarray(dy, F64).tolist()
    return case


def build(case):
    """x (in the case's layout), weight, bias, and the Geometry, from a drawn case."""
    g = Geometry(case["shape"], case["axis"])
    dtype = case["dtype"]
    xr = make_rows(case["x"], g.N, g.H, dtype, case["mag_hi"])
    x = relayout(g.from_rows(xr), case["layout"])
    rng = np.random.default_rng(case["pseed"])
    w = b = None
    if case["affine"] in ("weight", "both"):
        w = (case["wscale"] * (1 + 0.5 * rng.standard_normal(g.norm))).astype(dtype)
    if case["affine"] in ("bias", "both"):
        b = (0.5 * rng.standard_normal(g.norm)).astype(dtype)
    return g, x, w, b


def relayout(a, kind):
    """The same values in another memory layout (C, F, negative strides, strided view)."""
    return LAYOUTS[kind](np.asarray(a))


def quiet(f):
    """Runs the test body without NumPy floating-point warnings (inf/NaN inputs are meant)."""
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        with np.errstate(all="ignore"):
            return f(*args, **kwargs)
    return wrapper


class on_path:
    """Runs fastln on ISA path ``isa`` with ``n`` threads; restores both after."""

    def __init__(self, isa, n):
        self.isa, self.n = isa, n

    def __enter__(self):
        self.prev = fastln.get_isa()
        fastln._lib._set_isa(self.isa)
        self.threads = fastln.threads(self.n)
        self.threads.__enter__()

    def __exit__(self, *exc):
        self.threads.__exit__(*exc)
        fastln._lib._set_isa(self.prev)


# ---------------------------------------------------------------- comparison helpers

def _assert_within(what, got, want, tol, context=""):
    """|got - want| <= tol elementwise (float64 arrays of one shape); the message names the
    worst element and its ratio error/tolerance."""
    got = np.asarray(got, F64)
    want = np.asarray(want, F64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    tol = np.broadcast_to(np.asarray(tol, F64), want.shape)
    err = np.abs(got - want)
    bad = ~(err <= tol)
    if bad.any():
        ratio = np.where(tol > 0, err / np.where(tol > 0, tol, 1), np.inf)
        ratio[np.isnan(err)] = np.inf
        k = np.unravel_index(int(np.argmax(np.where(bad, ratio, -1))), want.shape)
        raise AssertionError(
            "%s: %d of %d elements out of tolerance; worst at %s: got %r, want %r, "
            "|err| %.3g > tol %.3g (ratio %.3g) %s"
            % (what, int(bad.sum()), bad.size, k, got[k], want[k], err[k], tol[k],
               ratio[k], context))


def assert_nonfinite_like(what, got, want, exact=True, context=""):
    """The same places are NaN, +inf, -inf (``exact``) or just non-finite."""
    got = np.asarray(got, F64)
    want = np.asarray(want, F64)
    tests = ((("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)) if exact
             else (("non-finite", lambda a: ~np.isfinite(a)),))
    for name, f in tests:
        a, b = f(got), f(want)
        if not np.array_equal(a, b):
            k = tuple(np.argwhere(a != b)[0])
            raise AssertionError("%s: %s differs from the reference at %s: got %r, want %r %s"
                                 % (what, name, k, got[k], want[k], context))


def compare(what, got, want, tol, dtype, context="", exact=True):
    """got (of ``dtype``) against the float64 ``want``: non-finite exactly where ``want``
    rounded to ``dtype`` is (a result past the dtype's range is inf), the finite
    elements within ``tol``."""
    got = np.asarray(got, F64)
    want = np.asarray(want, F64)
    rounded = want.astype(dtype).astype(F64)
    assert_nonfinite_like(what, got, rounded, exact, context)
    fin = np.isfinite(rounded)
    _assert_within(what, got[fin], want[fin], np.broadcast_to(tol, want.shape)[fin], context)


def split_rows(rows):
    """(good, x0): rows without inf/NaN, and the shift per row (x[0]; 0 for bad rows)."""
    good = np.isfinite(rows).all(axis=1)
    x0 = np.where(good, rows[:, 0] if rows.shape[1] else 0.0, 0.0)
    return good, x0


def row_range(rows, good):
    """max - min of each good row (0 for the others)."""
    if rows.shape[0] == 0:
        return np.zeros(0)
    r = np.where(good[:, None], rows, 0.0)
    return np.max(r, axis=1) - np.min(r, axis=1)


def absw(W, H):
    return np.ones(H) if W is None else np.abs(W)


def tiny_term(dtype, R, W, H):
    """Absolute slack for subnormal intermediates: a subnormal rounding error of the kernel
    dtype (scaled by rstd and |w| after it) plus one of the output dtype."""
    R = np.nan_to_num(np.asarray(R, F64), nan=0.0, posinf=0.0)
    return tiny(kernel_dtype(dtype)) * (1 + R)[:, None] * (1 + absw(W, H)) + tiny(dtype)


def ln_reference(X, W, B, eps, good, x0):
    """float64 layer_norm of rows X (N, H): good rows shifted by x0, the others as they are."""
    y = np.empty_like(X)
    mean, rstd = np.empty(X.shape[0]), np.empty(X.shape[0])
    for sel in (good, ~good):
        if sel.any():
            sh = x0[sel]
            y[sel], m, rstd[sel] = ref.layer_norm(X[sel] - sh[:, None], W, B, eps=eps,
                                                  return_stats=True)
            mean[sel] = m + sh
    return y, mean, rstd


def check_ln_forward(tag, g, dtype, X, W, B, eps, y, mean, rstd):
    """y, mean, rstd (fastln, as float64 rows) against the reference on rows X."""
    kt = kernel_dtype(dtype)
    uk, uo, sH = unit(kt), unit_out(dtype), sfac(g.H)
    good, x0 = split_rows(X)
    ry, rmean, rrstd = ln_reference(X, W, B, eps, good, x0)
    rr = row_range(X, good)
    kappa = np.where(good, rr * np.nan_to_num(rrstd, nan=0.0, posinf=0.0), 0.0)[:, None]
    ctx = "[%s; rows %d x %d; eps %r]" % (tag, g.N, g.H, eps)
    tol_y = (C * uk * sH * kappa * absw(W, g.H) + 2 * uo * np.abs(ry)
             + tiny_term(dtype, rrstd, W, g.H))
    compare("y", y, ry, tol_y, dtype, ctx)
    compare("mean", mean, rmean, C * uk * (np.abs(rmean) + sH * rr) + tiny(kt), kt, ctx)
    compare("rstd", rstd, rrstd, C * uk * sH * np.abs(rrstd) + tiny(kt), kt, ctx)
    # README: a constant row returns exactly the bias
    const = good & (rr == 0)
    if eps > 0 and const.any():
        want = np.zeros(g.H) if B is None else B
        np.testing.assert_array_equal(y[const], np.broadcast_to(want, y[const].shape),
                                      err_msg="a constant row must give exactly the bias " + ctx)


def f64_rows(g, a):
    return None if a is None else g.to_rows(np.asarray(a, F64))


def f64_param(a):
    return None if a is None else np.asarray(a, F64).ravel()


def stats_rows(a):
    return np.asarray(a, F64).ravel()


# ---------------------------------------------------------------- LN functions: forward

ln_settings = settings(max_examples=400, **SETTINGS)


@ln_settings
@given(case=ln_cases())
@quiet
def test_fuzz_layer_norm(case):
    g, x, w, b = build(case)
    dtype, eps = case["dtype"], case["eps"]
    with on_path(case["isa"], case["threads"]):
        if g.H == 0:
            with pytest.raises(ValueError, match="x"):
                fastln.layer_norm(x, w, b, axis=case["axis"], eps=eps)
            return
        y, mean, rstd = fastln.layer_norm(x, w, b, axis=case["axis"], eps=eps, return_stats=True)
        y2 = fastln.layer_norm(x, w, b, axis=case["axis"], eps=eps)
    assert y.dtype == dtype and y.shape == g.shape
    assert mean.dtype == rstd.dtype == kernel_dtype(dtype) and mean.shape == rstd.shape == g.batch
    np.testing.assert_array_equal(y2, y)
    check_ln_forward("layer_norm", g, dtype, f64_rows(g, x), f64_param(w), f64_param(b), eps,
                     f64_rows(g, y), stats_rows(mean), stats_rows(rstd))


def run_rms_forward(case):
    g, x, w, _ = build(case)
    dtype, eps = case["dtype"], case["eps"]
    kt = kernel_dtype(dtype)
    with on_path(case["isa"], case["threads"]):
        if g.H == 0:
            with pytest.raises(ValueError, match="x"):
                fastln.rms_norm(x, w, axis=case["axis"], eps=eps)
            return
        y, rstd = fastln.rms_norm(x, w, axis=case["axis"], eps=eps, return_stats=True)
    assert y.dtype == dtype and y.shape == g.shape
    assert rstd.dtype == kt and rstd.shape == g.batch
    X, W = f64_rows(g, x), f64_param(w)
    ry, rrstd = ref.rms_norm(X, W, eps=eps, return_stats=True)
    uk, uo, sH = unit(kt), unit_out(dtype), sfac(g.H)
    ctx = "[rms_norm; rows %d x %d; eps %r]" % (g.N, g.H, eps)
    compare("y", f64_rows(g, y), ry,
            (C * uk * sH + 2 * uo) * np.abs(ry) + tiny_term(dtype, rrstd, W, g.H), dtype, ctx)
    compare("rstd", stats_rows(rstd), rrstd, C * uk * sH * np.abs(rrstd) + tiny(kt), kt, ctx)


@ln_settings
@given(case=ln_cases(with_bias=False))
@example(case=pinned([[1e-40, -2e-40, 3e-40, 4e-40]], eps=0.0))   # float rstd past FLT_MAX
@quiet
def test_fuzz_rms_norm(case):
    run_rms_forward(case)


@ln_settings
@given(case=ln_cases())
@quiet
def test_fuzz_add_layer_norm(case):
    g, x, w, b = build(case)
    dtype, eps = case["dtype"], case["eps"]
    kt = kernel_dtype(dtype)
    res = relayout(g.from_rows(make_rows(case["r"], g.N, g.H, dtype, case["mag_hi"], salt=1)),
                   case["layout"])
    with on_path(case["isa"], case["threads"]):
        if g.H == 0:
            with pytest.raises(ValueError, match="x"):
                fastln.add_layer_norm(x, res, w, b, axis=case["axis"], eps=eps)
            return
        y, s, mean, rstd = fastln.add_layer_norm(x, res, w, b, axis=case["axis"], eps=eps,
                                                 return_stats=True)
    assert y.dtype == s.dtype == dtype and y.shape == s.shape == g.shape
    assert mean.dtype == rstd.dtype == kt and mean.shape == rstd.shape == g.batch
    # s is x + residual rounded once in the kernel dtype (then to float16)
    s_k = np.asarray(x).astype(kt) + np.asarray(res).astype(kt)
    np.testing.assert_array_equal(s, s_k.astype(dtype), err_msg="s")
    check_ln_forward("add_layer_norm", g, dtype, f64_rows(g, s_k), f64_param(w), f64_param(b),
                     eps, f64_rows(g, y), stats_rows(mean), stats_rows(rstd))


# ---------------------------------------------------------------- LN functions: backward

def dy_rows(case, g, dtype):
    if "dy" in case:
        return np.array(case["dy"], dtype).reshape(g.N, g.H)
    rng = np.random.default_rng([case["x"]["seed"], 2])
    scale = 10.0 ** rng.integers(-3, 4) if dtype != np.dtype(F16) else 1.0
    return (scale * rng.standard_normal((g.N, g.H))).astype(dtype)


def reductions_tol(uk, kt, N, G, XH, dxhat, R):
    """Tolerance of sum_n G*XH over N rows: sqrt(N) growth of the rounding of the sum, the
    error u*``dxhat`` of each xhat times |G|, and subnormal xhat (absolute error of one
    subnormal of the kernel dtype, times 1 + rstd)."""
    G = np.abs(G)
    return C * (uk * (math.sqrt(max(N, 1)) * np.sum(np.abs(G * XH), axis=0)
                          + np.sum(G * dxhat, axis=0))
                    + tiny(kt) * (np.sum(G * (1 + R), axis=0) + N))


def tiny_bwd(dtype, Rg, xhat, W, H):
    """tiny_term for dx, plus subnormal products dy*w*d in the row sum: their absolute error
    (a subnormal of the kernel dtype) is scaled by r twice, in c2 = r*sum(g*d)/H and in
    dx = r*(... - xhat*c2). Only float32 rows with |x - mean| below ~1e-19 and eps = 0 have
    r large enough for this to matter."""
    return (tiny_term(dtype, Rg[:, 0], W, H)
            + C * float(np.finfo(kernel_dtype(dtype)).smallest_subnormal) * Rg ** 2
            * (1 + np.abs(xhat)) * (1 + absw(W, H)))


def check_degenerate(what, got_rows, deg, context):
    """Rows of finite x whose rstd is inf (eps = 0): no finite gradient exists."""
    if deg.any() and not (~np.isfinite(got_rows[deg])).all():
        raise AssertionError("%s: a row with rstd = inf has finite gradients %s"
                             % (what, context))


def run_ln_backward(case):
    g, x, w, _ = build(case)
    dtype, eps, axis = case["dtype"], case["eps"], case["axis"]
    if g.H == 0:
        return                                   # covered by the forward tests
    dy = relayout(g.from_rows(dy_rows(case, g, dtype)), case["layout"])
    with on_path(case["isa"], case["threads"]):
        _, mean, rstd = fastln.layer_norm(x, w, axis=axis, eps=eps, return_stats=True)
        dx, dw, db = fastln.layer_norm_backward(dy, x, mean, rstd, w, axis=axis)
    kt = kernel_dtype(dtype)
    assert dx.dtype == dtype and dx.shape == g.shape
    assert dw.shape == db.shape == g.norm and dw.dtype == db.dtype == kt
    X, DY, W, DX = f64_rows(g, x), f64_rows(g, dy), f64_param(w), f64_rows(g, dx)
    M, R = stats_rows(mean), stats_rows(rstd)
    finite, x0 = split_rows(X)
    good = finite & np.isfinite(R)
    deg = finite & ~np.isfinite(R)
    x0 = np.where(good, x0, 0.0)
    uk, uo, sH = unit(kt), unit_out(dtype), sfac(g.H)
    ctx = "[layer_norm_backward; rows %d x %d; eps %r]" % (g.N, g.H, eps)
    check_degenerate("dx", DX, deg, ctx)

    # reference: good rows shifted by x0 (x and mean together), the others as they are
    rdx = np.empty_like(X)
    rdw, rdb = np.zeros(g.H), np.zeros(g.H)
    for sel in (good, ~good):
        if sel.any():
            sh = x0[sel]
            a, bw, bb = ref.layer_norm_backward(DY[sel], X[sel] - sh[:, None], M[sel] - sh,
                                                R[sel], W)
            rdx[sel] = a
            rdw += bw
            rdb += bb
    # tolerances, from the good rows
    D = (X[good] - x0[good, None]) - (M[good] - x0[good])[:, None]     # x - saved mean
    Gw = DY[good] * (1.0 if W is None else W)
    Rg = R[good][:, None]
    if D.size:
        xhat = (D - D.mean(axis=1, keepdims=True)) * Rg
        A = np.abs(Gw).mean(axis=1, keepdims=True)
        Bm = (np.abs(Gw) * np.abs(D)).mean(axis=1, keepdims=True) * Rg
        Bd = np.abs(D).mean(axis=1, keepdims=True) * Rg
        K = np.abs(D).max(axis=1, keepdims=True) * Rg
        c2 = np.abs((Gw * xhat).mean(axis=1, keepdims=True))
    else:
        xhat = D
        A = Bm = Bd = K = c2 = np.zeros((0, 1))
    tol_dx = np.zeros_like(X)
    tol_dx[good] = (C * uk * Rg * (np.abs(Gw) + sH * (A + np.abs(xhat) * (Bm + Bd * A))
                                      + K * c2)
                    + 2 * uo * np.abs(rdx[good]) + tiny_bwd(dtype, Rg, xhat, W, g.H))
    compare("dx", DX[~deg], rdx[~deg], tol_dx[~deg], dtype, ctx)
    tol_dw = reductions_tol(uk, kt, g.N, DY[good], xhat, K, Rg)
    compare("dweight", stats_rows(dw), rdw, tol_dw, kt, ctx, exact=not deg.any())
    tol_db = reductions_tol(uk, kt, g.N, DY, 1.0, 0.0, 0.0)
    compare("dbias", stats_rows(db), rdb, tol_db, kt, ctx)


def run_rms_backward(case):
    g, x, w, _ = build(case)
    dtype, eps, axis = case["dtype"], case["eps"], case["axis"]
    if g.H == 0:
        return
    dy = relayout(g.from_rows(dy_rows(case, g, dtype)), case["layout"])
    with on_path(case["isa"], case["threads"]):
        _, rstd = fastln.rms_norm(x, w, axis=axis, eps=eps, return_stats=True)
        dx, dw = fastln.rms_norm_backward(dy, x, rstd, w, axis=axis)
    kt = kernel_dtype(dtype)
    assert dx.dtype == dtype and dx.shape == g.shape
    assert dw.shape == g.norm and dw.dtype == kt
    X, DY, W, DX = f64_rows(g, x), f64_rows(g, dy), f64_param(w), f64_rows(g, dx)
    R = stats_rows(rstd)
    rdx, rdw = ref.rms_norm_backward(DY, X, R, W)
    finite = np.isfinite(X).all(axis=1)
    good = finite & np.isfinite(R)
    deg = finite & ~np.isfinite(R)
    uk, uo, sH = unit(kt), unit_out(dtype), sfac(g.H)
    ctx = "[rms_norm_backward; rows %d x %d; eps %r]" % (g.N, g.H, eps)
    check_degenerate("dx", DX, deg, ctx)
    Gw, Rg = DY[good] * (1.0 if W is None else W), R[good][:, None]
    xhat = X[good] * Rg
    Bm = np.abs(Gw * xhat).mean(axis=1, keepdims=True) if Gw.size else np.zeros((0, 1))
    tol_dx = np.zeros_like(X)
    tol_dx[good] = (C * uk * Rg * (np.abs(Gw) + sH * np.abs(xhat) * Bm)
                    + 2 * uo * np.abs(rdx[good]) + tiny_bwd(dtype, Rg, xhat, W, g.H))
    compare("dx", DX[~deg], rdx[~deg], tol_dx[~deg], dtype, ctx)
    tol_dw = reductions_tol(uk, kt, g.N, DY[good], xhat, np.abs(xhat), Rg)
    compare("dweight", stats_rows(dw), rdw, tol_dw, kt, ctx, exact=not deg.any())


# rows whose float32 sums of dy*w*(x - mean) pass FLT_MAX
PIN_BWD_OVERFLOW = pinned([[1e36, -1e36, 0.0, 0.0]], dy=[[400.0, -100.0, 200.0, 50.0]])
# the row test_edge_cases.py holds the forward to, with dy of 1
PIN_BWD_OVERFLOW_2 = pinned([[3e38, -3e38, 1.0, 2.0]], dy=[[1.0, -1.0, 0.5, 0.25]])


@ln_settings
@given(case=ln_cases(with_bias=False))
@example(case=PIN_BWD_OVERFLOW)
@example(case=PIN_BWD_OVERFLOW_2)
@quiet
def test_fuzz_layer_norm_backward(case):
    run_ln_backward(case)


@ln_settings
@given(case=ln_cases(with_bias=False))
@example(case=PIN_BWD_OVERFLOW)
@example(case=PIN_BWD_OVERFLOW_2)
@quiet
def test_fuzz_rms_norm_backward(case):
    run_rms_backward(case)


# ---------------------------------------------------------------- LN-RNN cells

VARIANTS = [("rnn", "tanh"), ("rnn", "relu"), ("lstm", None), ("gru", None)]
CLASSES = {"rnn": LNRNN, "lstm": LNLSTM, "gru": LNGRU}
RNN_REF = {"rnn": rref.lnrnn_forward, "lstm": rref.lnlstm_forward, "gru": rref.lngru_forward}


@st.composite
def rnn_cases(draw):
    return dict(variant=draw(st.sampled_from(VARIANTS)), T=draw(st.integers(1, 6)),
                B=draw(st.integers(1, 4)), I=draw(st.integers(1, 5)), H=draw(st.integers(1, 9)),
                L=draw(st.integers(1, 2)), batch_first=draw(st.booleans()),
                lengths=draw(st.booleans()), state=draw(st.booleans()),
                wscale=draw(st.sampled_from([0.3, 1.0, 3.0])),
                xscale=draw(st.sampled_from([0.1, 1.0, 10.0])),
                eps=draw(st.sampled_from([1e-5, 1e-3])),
                seed=draw(st.integers(0, 2 ** 32 - 1)))


def rnn_setup(case, dtype):
    """(model with random parameters, x, state, lengths, rng)."""
    cell, nl = case["variant"]
    T, B, I, H, L = case["T"], case["B"], case["I"], case["H"], case["L"]
    rng = np.random.default_rng(case["seed"])
    kw = dict(input_size=I, hidden_size=H, num_layers=L, batch_first=case["batch_first"],
              eps=case["eps"], dtype=dtype, seed=0)
    if cell == "rnn":
        kw["nonlinearity"] = nl
    m = CLASSES[cell](**kw)
    params = {}
    for name, shape in rref.param_shapes(cell, I, H, L).items():
        if name.startswith("weight_"):
            a = case["wscale"] * rng.uniform(-1, 1, shape) / math.sqrt(H)
        elif "_weight_" in name:                                 # LN gains
            a = 1.0 + 0.3 * rng.standard_normal(shape)
        else:                                                    # LN biases, LSTM bias
            a = 0.3 * rng.standard_normal(shape)
        params[name] = a.astype(dtype)
    m.load_state_dict(params)
    x = (case["xscale"] * rng.standard_normal((B, T, I) if case["batch_first"] else (T, B, I))
         ).astype(dtype)
    nstate = 2 if cell == "lstm" else 1
    state = None
    if case["state"]:
        parts = tuple(rng.standard_normal((L, B, H)).astype(dtype) for _ in range(nstate))
        state = parts if cell == "lstm" else parts[0]
    lengths = rng.integers(1, T + 1, size=B) if case["lengths"] else None
    return m, x, state, lengths, rng


def rnn_ref_forward(m, case, x, state, lengths):
    cell, nl = case["variant"]
    kw = dict(num_layers=m.num_layers, eps=m.eps, batch_first=m.batch_first)
    if cell == "rnn":
        kw["nonlinearity"] = nl
    return RNN_REF[cell](m.params, x, state, lengths, **kw)


def as_tuple(s):
    return tuple(s) if isinstance(s, tuple) else (s,)


def rnn_close(what, got, want, rel, dtype, case):
    got = np.asarray(got)
    assert got.dtype == np.dtype(dtype), (what, got.dtype)
    want = np.asarray(want, F64)
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    _assert_within(what, got, want, rel * scale, context=repr(case))


def check_rnn_forward(case, dtype, rel):
    m, x, state, lengths, _ = rnn_setup(case, dtype)
    y, s = m.forward(x, state, lengths)
    ry, rs = rnn_ref_forward(m, case, x, state, lengths)
    rnn_close("y", y, ry, rel, dtype, case)
    assert isinstance(s, tuple) == (case["variant"][0] == "lstm")
    for k, (a, b) in enumerate(zip(as_tuple(s), as_tuple(rs))):
        rnn_close("state[%d]" % k, a, b, rel, dtype, case)
    if lengths is not None:                 # y is exactly 0 after each sequence's end
        yt = y.transpose(1, 0, 2) if case["batch_first"] else y
        for b_, n in enumerate(lengths):
            assert np.all(yt[n:, b_] == 0), ("y after the end", b_, case)
    # inference (cache=False) gives the same bits
    y2, s2 = m.forward(x, state, lengths, cache=False)
    np.testing.assert_array_equal(y2, y)
    for a, b in zip(as_tuple(s2), as_tuple(s)):
        np.testing.assert_array_equal(a, b)


rnn_settings = settings(max_examples=400, **SETTINGS)


@rnn_settings
@given(case=rnn_cases())
@quiet
def test_fuzz_rnn_forward_float64(case):
    check_rnn_forward(case, F64, 1e-10)


@rnn_settings
@given(case=rnn_cases())
@quiet
def test_fuzz_rnn_forward_float32(case):
    check_rnn_forward(case, F32, 2e-4)


@settings(max_examples=300, **SETTINGS)
@given(case=rnn_cases())
@quiet
def test_fuzz_rnn_backward_float64(torch, case):
    m, x, state, lengths, rng = rnn_setup(case, F64)
    cell, nl = case["variant"]
    y, s = m.forward(x, state, lengths)
    dy = rng.standard_normal(y.shape)
    ds_parts = tuple(rng.standard_normal(a.shape) for a in as_tuple(s))
    dstate = ds_parts if cell == "lstm" else ds_parts[0]
    dx, ds = m.backward(dy, dstate)
    want = torch_rnn(torch, cell, m.params, x, state, lengths, num_layers=m.num_layers,
                     eps=m.eps, nonlinearity=nl or "tanh", batch_first=m.batch_first,
                     dy=dy, dstate=dstate)
    rel = 1e-9
    rnn_close("y", y, want.y, 1e-10, F64, case)
    rnn_close("dx", dx, want.dx, rel, F64, case)
    assert len(as_tuple(ds)) == len(as_tuple(want.dstate))
    for k, (a, b) in enumerate(zip(as_tuple(ds), as_tuple(want.dstate))):
        rnn_close("dstate[%d]" % k, a, b, rel, F64, case)
    assert sorted(m.grads) == sorted(want.grads)
    for name, gw in want.grads.items():
        rnn_close("grad " + name, m.grads[name], gw, rel, F64, case)
    if lengths is not None:
        dxt = dx.transpose(1, 0, 2) if case["batch_first"] else dx
        for b_, n in enumerate(lengths):
            assert np.all(dxt[n:, b_] == 0), ("dx after the end", b_, case)
