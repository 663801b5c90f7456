"""The bad-input matrix: every public function and class against hostile input.

Each row of the tables below is one distinct bad input, and expects exactly one of

* a specific exception whose message names the offending argument (``RAISES``), or
* a correct result, checked against the float64 references in ``fastln.reference`` and
  ``fastln.rnn_reference`` (``RESULTS``, ``NONFINITE``), or
* for inputs that could crash the interpreter (unaligned, byte-swapped, huge, overlapping
  ``out=``, an RNN model with tampered internals): a child interpreter that runs the row and
  exits 0 (``SUBPROCESS``), so that a segfault fails that row instead of killing pytest.

A row may be marked ``bug=...`` for a known defect of fastln: a strict xfail, so the row starts
to pass (and the xfail to fail) once the library is fixed. None is marked now.

The helpers ``all_five``, ``unaligned``, ``byteswapped`` and the RNN helpers are imported by
the child interpreters (``import test_bad_inputs as T``), so they must stay importable.
"""
import os

import numpy as np
import pytest

import fastln
from fastln import reference as ref
from fastln import rnn_reference as rref
from fastln.rnn import LNGRU, LNLSTM, LNRNN

from _util import (
    F16,
    F32,
    F64,
    assert_close,
    named,
    relayout,
    result_dtype,
    run_python,
    started_ahead,
    stats_dtype,
)

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

LN, RMS, ADD = fastln.layer_norm, fastln.rms_norm, fastln.add_layer_norm
LNB, RMSB = fastln.layer_norm_backward, fastln.rms_norm_backward


def case(id, *values, bug=None, marks=()):
    """One row of a table; ``bug`` marks a known defect (strict xfail)."""
    marks = list(marks) + ([pytest.mark.xfail(strict=True, reason="BUG: " + bug)] if bug else [])
    return pytest.param(*values, id=id, marks=marks)


# ---------------------------------------------------------------- inputs

_rng = np.random.default_rng(20240607)
X = (_rng.standard_normal((4, 8)) + 0.5).astype(F32)     # (4, 8): normalized size 8
X3 = _rng.standard_normal((3, 4, 5))                     # float64
DY = _rng.standard_normal((4, 8)).astype(F32)
W8 = (1 + 0.3 * _rng.standard_normal(8)).astype(F32)
B8 = (0.3 * _rng.standard_normal(8)).astype(F32)
S4 = np.ones(4, F32)                                      # mean / rstd of X's rows


def _ro(a):
    a = np.array(a)
    a.setflags(write=False)
    return a


def _enter(cm):
    with cm:
        pass


# ---- layout transforms: the same values in another memory layout / dtype byte order ----

def unaligned(offset):
    """A transform: a copy of ``a`` in a bytearray at byte ``offset`` (np.frombuffer)."""
    def tf(a):
        a = np.asarray(a)
        buf = bytearray(a.nbytes + offset)
        u = np.frombuffer(buf, dtype=a.dtype, offset=offset, count=a.size).reshape(a.shape)
        u[...] = a
        if offset % a.dtype.itemsize:
            assert not u.flags.aligned
        return u
    return tf


def simd_misaligned(a):
    """A C-contiguous, numpy-aligned copy that starts one element past a 64-byte boundary
    (the fast path takes it as is; vector kernels must not assume more alignment)."""
    a = np.asarray(a)
    raw = np.empty(a.size + 64, a.dtype)
    start = (-raw.ctypes.data % 64) // a.itemsize + 1
    u = raw[start:start + a.size].reshape(a.shape)
    u[...] = a
    assert u.flags.c_contiguous and u.flags.aligned and u.ctypes.data % 64
    return u


def byteswapped(a):
    """The same values in non-native byte order ('>f4' / '>f8' on little-endian)."""
    a = np.asarray(a)
    return a.astype(a.dtype.newbyteorder("S"))


def layout(kind):
    return lambda a: relayout(np.asarray(a), kind)


def _native(dtype):
    return np.dtype(dtype).newbyteorder("=")


def _match(got, want, dtype, what):
    """got (a tuple of fastln outputs) against want (float64 references), dtype's tolerance."""
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        assert isinstance(g, np.ndarray), (what, i, type(g))
        assert g.dtype.isnative, (what, i, g.dtype)
        assert_close(g, w, dtype, err_msg="%s output %d" % (what, i))


def close_chunked(got, want, dtype, chunk=1 << 20):
    """assert_close on a long last axis in slices (bounded temporaries); the tolerance scale
    is that of the whole of want."""
    scale = max(1.0, float(np.max(want)), -float(np.min(want)))
    for i in range(0, want.shape[-1], chunk):
        assert_close(got[..., i:i + chunk], want[..., i:i + chunk], dtype, scale=scale)


def all_five(tf, dtype=F32, N=5, H=37, seed=0, isas=False):
    """Every public function on inputs passed through ``tf`` (all of them: x, dy, residual,
    weight, bias, mean, rstd) against the reference on the clean values; with ``isas``, on
    every instruction-set path of this CPU."""
    kt = _native(dtype)
    rng = np.random.default_rng(seed)
    x = (2 * rng.standard_normal((N, H)) + 0.5).astype(kt)
    r, dy = (rng.standard_normal((N, H)).astype(kt) for _ in range(2))
    w = (1 + 0.5 * rng.standard_normal(H)).astype(kt)
    b = (0.5 * rng.standard_normal(H)).astype(kt)
    _, mean, rstd = ref.layer_norm(x, return_stats=True)
    mean, rstd = mean.astype(kt), rstd.astype(kt)
    rms_rstd = ref.rms_norm(x, return_stats=True)[1].astype(kt)
    rdt, sdt = result_dtype(kt), stats_dtype(kt)
    want = {
        "layer_norm": ref.layer_norm(x, w, b, return_stats=True),
        "layer_norm_backward": ref.layer_norm_backward(dy, x, mean, rstd, w),
        "rms_norm": ref.rms_norm(x, w, return_stats=True),
        "rms_norm_backward": ref.rms_norm_backward(dy, x, rms_rstd, w),
        "add_layer_norm": ref.add_layer_norm(x, r, w, b, return_stats=True),
    }
    previous = fastln.get_isa()
    try:
        for isa in (fastln.supported_isas() if isas else [previous]):
            fastln._lib._set_isa(isa)
            got = {
                "layer_norm": LN(tf(x), tf(w), tf(b), return_stats=True),
                "layer_norm_backward": LNB(tf(dy), tf(x), tf(mean), tf(rstd), tf(w)),
                "rms_norm": RMS(tf(x), tf(w), return_stats=True),
                "rms_norm_backward": RMSB(tf(dy), tf(x), tf(rms_rstd), tf(w)),
                "add_layer_norm": ADD(tf(x), tf(r), tf(w), tf(b), return_stats=True),
            }
            for name in want:
                _match(got[name], want[name], kt, "%s on %s" % (name, isa))
                assert got[name][0].dtype == rdt, (name, got[name][0].dtype)
            assert got["layer_norm"][1].dtype == sdt and got["rms_norm"][1].dtype == sdt
    finally:
        fastln._lib._set_isa(previous)


def check_out(tf, dtype=F32, N=5, H=37):
    """out= buffers passed through ``tf`` (e.g. unaligned): written in place, correct;
    then in place on a transformed x (out=x)."""
    kt = _native(dtype)
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((N, H)) + 1).astype(kt)
    dy = rng.standard_normal((N, H)).astype(kt)
    w = (1 + 0.5 * rng.standard_normal(H)).astype(kt)
    _, mean, rstd = ref.layer_norm(x, return_stats=True)
    mean, rstd = mean.astype(kt), rstd.astype(kt)
    for call, want in [
        (lambda o: LN(x, w, out=o), ref.layer_norm(x, w)),
        (lambda o: RMS(x, w, out=o), ref.rms_norm(x, w)),
        (lambda o: LNB(dy, x, mean, rstd, w, out=o)[0], ref.layer_norm_backward(dy, x, mean, rstd, w)[0]),
        (lambda o: RMSB(dy, x, rstd, w, out=o)[0], ref.rms_norm_backward(dy, x, rstd, w)[0]),
        (lambda o: ADD(x, x, w, out=(o, tf(np.zeros_like(x))))[0], ref.add_layer_norm(x, x, w)[0]),
    ]:
        o = tf(np.zeros((N, H), kt))
        got = call(o)
        assert got is o
        assert_close(o, want, kt)
    xi = tf(x)
    assert LN(xi, w, out=xi) is xi
    assert_close(xi, ref.layer_norm(x, w), kt)


# ---------------------------------------------------------------- RNN helpers

T0, B0, I0, H0, L0 = 5, 2, 3, 4, 2


def _lstm(**kw):
    return LNLSTM(I0, H0, num_layers=L0, seed=0, **kw)


def _gru(**kw):
    return LNGRU(I0, H0, num_layers=L0, seed=0, **kw)


def _rnn(**kw):
    return LNRNN(I0, H0, num_layers=L0, seed=0, **kw)


def _rx(T=T0, B=B0, I=I0, dtype=F32, seed=1):
    return np.random.default_rng(seed).standard_normal((T, B, I)).astype(dtype)


def _rz(L=L0, B=B0, H=H0, dtype=F32):
    return np.zeros((L, B, H), dtype)


def _rnn_ref(m, x, state=None, lengths=None):
    """The float64 reference forward of model m (its current params)."""
    kw = dict(num_layers=m.num_layers, eps=m.eps, batch_first=m.batch_first)
    if isinstance(m, LNLSTM):
        f = rref.lnlstm_forward
    elif isinstance(m, LNGRU):
        f = rref.lngru_forward
    else:
        f = rref.lnrnn_forward
        kw["nonlinearity"] = m.nonlinearity
    return f(m.params, np.asarray(x, F64), state, lengths, **kw)


def _states(s):
    return tuple(s) if isinstance(s, (tuple, list)) else (s,)


def rnn_close(got, want, dtype, what="rnn"):
    """A whole recurrent pass in dtype against float64 (tolerances of test_rnn.py)."""
    t = 1e-4 if np.dtype(dtype) == np.dtype(F32) else 1e-10
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == np.dtype(dtype), (what, got.dtype)
    assert_close(got, want, dtype, rtol=t, atol=t, err_msg=what)


def rnn_forward_ok(m, x, state=None, lengths=None, clean_x=None, clean_state=None,
                   clean_lengths=None):
    """m.forward(x, state, lengths) matches the reference on the clean values."""
    cx = x if clean_x is None else clean_x
    cs = state if clean_state is None else clean_state
    cl = lengths if clean_lengths is None else clean_lengths
    y, s = m.forward(x, state, lengths)
    wy, ws = _rnn_ref(m, cx, cs, cl)
    rnn_close(y, wy, m.dtype, "y")
    for i, (g, w) in enumerate(zip(_states(s), _states(ws))):
        rnn_close(g, w, m.dtype, "state %d" % i)
    return y, s


def rnn_run(m, x, state=None, lengths=None, dy=None, dstate=None):
    """Every output of forward + backward as a dict (grads copied)."""
    y, s = m.forward(x, state, lengths)
    if dy is None:
        dy = np.random.default_rng(7).standard_normal(np.shape(y)).astype(m.dtype)
    dx, ds = m.backward(dy, dstate)
    out = {"y": y, "dx": dx}
    out.update({"state%d" % i: a for i, a in enumerate(_states(s))})
    out.update({"dstate%d" % i: a for i, a in enumerate(_states(ds))})
    out.update({"grad " + k: np.array(v) for k, v in m.grads.items()})
    return out


def rnn_same(got, want):
    """Two fastln runs on the same values (other layouts, or fewer sequences) agree."""
    for k, w in want.items():
        t = 2e-5 if np.asarray(w).dtype == np.dtype(F32) else 1e-12
        w = np.asarray(w, F64)
        np.testing.assert_allclose(np.asarray(got[k], F64), w, rtol=t,
                                   atol=t * max(1.0, float(np.abs(w).max())), err_msg=k)


# ================================================================ table 1: exceptions
# (id, exception type, the argument the message must name, call)

RAISES = [
    # ---- shapes
    case("ln weight shape", ValueError, "weight", lambda: LN(X, np.ones(7, F32))),
    case("ln bias shape", ValueError, "bias", lambda: LN(X, W8, np.ones((1, 8), F32))),
    case("lnb mean shape", ValueError, "mean", lambda: LNB(DY, X, np.ones(5, F32), S4)),
    case("lnb dy shape", ValueError, "dy", lambda: LNB(DY[:, :7], X, S4, S4)),
    case("rmsb rstd shape", ValueError, "rstd", lambda: RMSB(DY, X, np.ones((4, 1), F32))),
    case("add residual shape", ValueError, "residual", lambda: ADD(X, X.T)),
    case("add residual broadcast over the normalized axis", ValueError, "residual",
         lambda: ADD(X, X[:, :1])),
    # ---- dtypes
    case("ln x complex64", TypeError, "x", lambda: LN(X.astype(np.complex64))),
    case("rms x object", TypeError, "x", lambda: RMS(X.astype(object))),
    case("ln x str", TypeError, "x", lambda: LN(np.array([["a", "b"], ["c", "d"]]))),
    case("ln x bytes", TypeError, "x", lambda: LN(np.zeros((2, 3), "S3"))),
    case("ln x datetime64", TypeError, "x", lambda: LN(np.zeros((2, 3), "datetime64[s]"))),
    case("lnb dy timedelta64", TypeError, "dy", lambda: LNB(np.zeros((4, 8), "m8[s]"), X, S4, S4)),
    case("ln x structured", TypeError, "x", lambda: LN(np.zeros((2, 3), [("a", "f4")]))),
    case("ln x longdouble", TypeError, "x", lambda: LN(np.ones((2, 3), np.longdouble))),
    case("ln weight datetime64", TypeError, "weight", lambda: LN(X, np.zeros(8, "M8[s]"))),
    case("add residual str", TypeError, "residual", lambda: ADD(X, np.full((4, 8), "a"))),
    case("lnb mean complex", TypeError, "mean", lambda: LNB(DY, X, S4.astype(complex), S4)),
    case("rmsb rstd str", TypeError, "rstd", lambda: RMSB(DY, X, np.array(["a"] * 4))),
    # ---- axes
    case("ln axis out of range", ValueError, "axis", lambda: LN(X, axis=2)),
    case("rms axis too negative", ValueError, "axis", lambda: RMS(X, axis=-3)),
    case("ln axis 2**70", ValueError, "axis", lambda: LN(X, axis=2 ** 70)),
    case("add axis duplicate", ValueError, "axis", lambda: ADD(X3, X3, axis=(1, 1))),
    case("lnb axis duplicate negative", ValueError, "axis",
         lambda: LNB(DY, X, np.ones(8, F32), np.ones(8, F32), axis=(0, -2))),
    case("ln axis empty tuple", ValueError, "axis", lambda: LN(X, axis=())),
    case("ln axis float", TypeError, "axis", lambda: LN(X, axis=1.0)),
    case("rmsb axis str", TypeError, "axis", lambda: RMSB(DY, X, S4, axis="1")),
    case("ln axis None", TypeError, "axis", lambda: LN(X, axis=None)),
    case("ln axis tuple with float", TypeError, "axis", lambda: LN(X3, axis=(0, np.float64(1)))),
    # ---- out=
    case("ln out shape", ValueError, "out", lambda: LN(X, out=np.empty((4, 7), F32))),
    case("rms out dtype", TypeError, "out", lambda: RMS(X, out=np.empty((4, 8), F64))),
    case("ln int x out float32", TypeError, "out",
         lambda: LN(np.arange(8).reshape(2, 4), out=np.empty((2, 4), F32))),
    case("lnb out read-only", ValueError, "out", lambda: LNB(DY, X, S4, S4, out=_ro(X))),
    case("rmsb out byte-swapped", TypeError, "out",
         lambda: RMSB(DY, X, S4, out=np.empty((4, 8), ">f4"))),
    case("ln out list", TypeError, "out", lambda: LN(X, out=np.zeros((4, 8)).tolist())),
    case("add out y and s overlap", ValueError, "out",
         lambda: (lambda o: ADD(X, X, out=(o, o)))(np.empty((4, 8), F32))),
    case("add out 3-tuple", TypeError, "out",
         lambda: ADD(X, X, out=(np.empty((4, 8), F32),) * 3)),
    case("ln out np.matrix", (TypeError, ValueError), "out",
         lambda: LN(X, out=np.empty((4, 8), F32).view(np.matrix))),
    # ---- eps
    case("ln eps negative", ValueError, "eps", lambda: LN(X, eps=-1e-5)),
    case("rms eps nan", ValueError, "eps", lambda: RMS(X, eps=float("nan"))),
    case("add eps inf", ValueError, "eps", lambda: ADD(X, X, eps=np.inf)),
    case("ln eps float32 nan", ValueError, "eps", lambda: LN(X, eps=np.float32("nan"))),
    case("ln eps bool", TypeError, "eps", lambda: LN(X, eps=True)),
    case("rms eps str", TypeError, "eps", lambda: RMS(X, eps="1e-6")),
    case("add eps None", TypeError, "eps", lambda: ADD(X, X, eps=None)),
    case("ln eps complex", TypeError, "eps", lambda: LN(X, eps=1e-5j)),
    # ---- non-arrays, 0-d, H = 0
    case("ln x None", TypeError, "x", lambda: LN(None)),
    case("ln x str scalar", TypeError, "x", lambda: LN("abc")),
    case("rms x python float", ValueError, "x", lambda: RMS(3.0)),
    case("add x 0-d", ValueError, "x", lambda: ADD(np.array(1.0, F32), np.array(1.0, F32))),
    case("ln weight 0-d", ValueError, "weight", lambda: LN(X, np.array(2.0, F32))),
    case("lnb rstd 0-d", ValueError, "rstd", lambda: LNB(DY, X, S4, np.float32(1))),
    case("lnb mean None", TypeError, "mean", lambda: LNB(DY, X, None, S4)),
    case("add residual None", TypeError, "residual", lambda: ADD(X, None)),
    case("ln x ragged list", (TypeError, ValueError), "x", lambda: LN([[1.0, 2.0], [3.0]])),
    case("ln H=0", ValueError, "x", lambda: LN(np.ones((4, 0), F32))),
    case("lnb H=0", ValueError, "x", lambda: LNB(np.ones((2, 0)), np.ones((2, 0)), np.ones(2), np.ones(2))),
    case("rms H=0 on axis 0", ValueError, "x", lambda: RMS(np.ones((0, 5)), axis=0)),
    case("add H=0 tuple axis", ValueError, "x",
         lambda: ADD(np.ones((3, 0, 2)), np.ones((3, 0, 2)), axis=(1, 2))),
    case("rmsb H=0", ValueError, "x", lambda: RMSB(np.ones((2, 0)), np.ones((2, 0)), np.ones(2))),
    # ---- LayerNorm / RMSNorm
    case("LayerNorm(0)", ValueError, "normalized_shape", lambda: fastln.LayerNorm(0)),
    case("RMSNorm((4, -1))", ValueError, "normalized_shape", lambda: fastln.RMSNorm((4, -1))),
    case("LayerNorm(8.0)", TypeError, "normalized_shape", lambda: fastln.LayerNorm(8.0)),
    case("LayerNorm('8')", TypeError, "normalized_shape", lambda: fastln.LayerNorm("8")),
    case("RMSNorm(None)", TypeError, "normalized_shape", lambda: fastln.RMSNorm(None)),
    case("LayerNorm dtype int32", TypeError, "dtype", lambda: fastln.LayerNorm(8, dtype=np.int32)),
    case("LayerNorm eps negative", ValueError, "eps", lambda: fastln.LayerNorm(8, eps=-1.0)),
    case("RMSNorm eps nan", ValueError, "eps", lambda: fastln.RMSNorm(8, eps=float("nan"))),
    case("LayerNorm eps str", TypeError, "eps", lambda: fastln.LayerNorm(8, eps="x")),
    case("LayerNorm eps bool", TypeError, "eps", lambda: fastln.LayerNorm(8, eps=True)),
    case("LayerNorm x wrong H", ValueError, "x",
         lambda: fastln.LayerNorm(8)(np.ones((2, 7), F32))),
    case("LayerNorm no affine x wrong H", ValueError, "x",
         lambda: fastln.LayerNorm(8, elementwise_affine=False)(np.ones((2, 7), F32))),
    case("RMSNorm no affine x wrong H", ValueError, "x",
         lambda: fastln.RMSNorm(8, elementwise_affine=False)(np.ones((2, 7), F32))),
    case("LayerNorm x complex", TypeError, "x", lambda: fastln.LayerNorm(8)(X.astype(complex))),
    case("RMSNorm x 0-d", ValueError, "x", lambda: fastln.RMSNorm(8)(np.float32(1))),
    case("LayerNorm backward first", RuntimeError, "forward", lambda: fastln.LayerNorm(8).backward(DY)),
    case("RMSNorm backward dy shape", ValueError, "dy",
         lambda: (lambda l: (l(X), l.backward(DY[:3])))(fastln.RMSNorm(8))),
    case("LayerNorm load weight shape", ValueError, "weight",
         lambda: fastln.LayerNorm(8).load_state_dict({"weight": np.ones(7), "bias": np.ones(8)})),
    case("LayerNorm load missing bias", ValueError, "bias",
         lambda: fastln.LayerNorm(8).load_state_dict({"weight": np.ones(8)})),
    case("LayerNorm load complex", TypeError, "weight",
         lambda: fastln.LayerNorm(8).load_state_dict({"weight": np.ones(8, complex),
                                                       "bias": np.ones(8)}),
         marks=[pytest.mark.filterwarnings("ignore:Casting complex values")]),
    case("RMSNorm load str", TypeError, "weight",
         lambda: fastln.RMSNorm(8).load_state_dict({"weight": np.array(["a"] * 8)})),
    case("LayerNorm load None", TypeError, "state_dict",
         lambda: fastln.LayerNorm(8).load_state_dict(None)),
    # ---- threads
    case("set_num_threads(0)", ValueError, "n", lambda: fastln.set_num_threads(0)),
    case("set_num_threads(-3)", ValueError, "n", lambda: fastln.set_num_threads(-3)),
    case("set_num_threads(1.5)", TypeError, "n", lambda: fastln.set_num_threads(1.5)),
    case("set_num_threads('2')", TypeError, "n", lambda: fastln.set_num_threads("2")),
    case("set_num_threads(True)", TypeError, "n", lambda: fastln.set_num_threads(True)),
    case("threads(0)", ValueError, "n", lambda: _enter(fastln.threads(0))),
    case("set_num_threads(2**40)", ValueError, "n", lambda: fastln.set_num_threads(2 ** 40)),
    # ---- RNN: lengths
    case("rnn lengths 0", ValueError, "lengths", lambda: _lstm().forward(_rx(), lengths=[5, 0])),
    case("rnn lengths > T", ValueError, "lengths", lambda: _gru().forward(_rx(), lengths=[6, 1])),
    case("rnn lengths negative", ValueError, "lengths", lambda: _rnn().forward(_rx(), lengths=[-1, 2])),
    case("rnn lengths int64 max", ValueError, "lengths",
         lambda: _gru().forward(_rx(), lengths=np.array([2 ** 63 - 1, 2]))),
    case("rnn lengths float", TypeError, "lengths",
         lambda: _rnn().forward(_rx(), lengths=np.array([5.0, 2.0]))),
    case("rnn lengths bool", TypeError, "lengths",
         lambda: _lstm().forward(_rx(), lengths=np.array([True, True]))),
    case("rnn lengths None inside", TypeError, "lengths",
         lambda: _gru().forward(_rx(), lengths=[None, 2])),
    case("rnn lengths 2-D", ValueError, "lengths",
         lambda: _lstm().forward(_rx(), lengths=np.array([[5], [2]]))),
    case("rnn lengths too long", ValueError, "lengths",
         lambda: _gru().forward(_rx(), lengths=[5, 2, 1])),
    case("rnn lengths 0-d", ValueError, "lengths", lambda: _rnn().forward(_rx(), lengths=5)),
    # ---- RNN: states
    case("rnn state shape", ValueError, "state", lambda: _gru().forward(_rx(), _rz(B=3))),
    case("rnn lstm c shape", ValueError, "state",
         lambda: _lstm().forward(_rx(), (_rz(), _rz(H=H0 + 1)))),
    case("rnn state float64", TypeError, "state", lambda: _gru().forward(_rx(), _rz(dtype=F64))),
    case("rnn lstm state int", TypeError, "state",
         lambda: _lstm().forward(_rx(), (_rz(dtype=np.int64), _rz(dtype=np.int64)))),
    case("rnn state complex", TypeError, "state",
         lambda: _rnn().forward(_rx(), _rz(dtype=np.complex64))),
    case("rnn lstm state not tuple", TypeError, "state", lambda: _lstm().forward(_rx(), _rz())),
    case("rnn lstm state dict", TypeError, "state",
         lambda: _lstm().forward(_rx(), {"h": _rz(), "c": _rz()})),
    case("rnn lstm state 3-tuple", TypeError, "state",
         lambda: _lstm().forward(_rx(), (_rz(), _rz(), _rz()))),
    case("rnn state 0-d", ValueError, "state", lambda: _gru().forward(_rx(), np.float32(0))),
    case("rnn state list of str", TypeError, "state",
         lambda: _gru().forward(_rx(), [[["a"] * H0] * B0] * L0)),
    case("rnn step state shape", ValueError, "state",
         lambda: _lstm().step(_rx()[0], (_rz(B=1), _rz(B=1)))),
    case("rnn backward dstate shape", ValueError, "dstate",
         lambda: (lambda m: (m.forward(_rx()), m.backward(np.ones((T0, B0, H0), F32), _rz(L=1))))(_rnn())),
    case("rnn backward dstate not tuple", TypeError, "dstate",
         lambda: (lambda m: (m.forward(_rx()), m.backward(np.ones((T0, B0, H0), F32), _rz())))(_lstm())),
    # ---- RNN: x, dy, x_t
    case("rnn x 2-D", ValueError, "x", lambda: _gru().forward(_rx()[0])),
    case("rnn x T=0", ValueError, "x", lambda: _lstm().forward(_rx(T=0))),
    case("rnn x input size", ValueError, "x", lambda: _gru().forward(_rx(I=I0 + 1))),
    case("rnn x float64", TypeError, "x", lambda: _lstm().forward(_rx(dtype=F64))),
    case("rnn x int32", TypeError, "x", lambda: _gru().forward(_rx().astype(np.int32))),
    case("rnn x complex", TypeError, "x", lambda: _rnn().forward(_rx().astype(np.complex64))),
    case("rnn x python float", ValueError, "x", lambda: _lstm().forward(1.0)),
    case("rnn x str", TypeError, "x", lambda: _gru().forward("abc")),
    case("rnn step x_t 1-D", ValueError, "x_t", lambda: _gru().step(np.ones(I0, F32))),
    case("rnn step x_t float64", TypeError, "x_t", lambda: _lstm().step(np.ones((2, I0)))),
    case("rnn backward dy shape", ValueError, "dy",
         lambda: (lambda m: (m.forward(_rx()), m.backward(np.ones((T0, B0, H0 + 1), F32))))(_gru())),
    case("rnn backward dy float64", TypeError, "dy",
         lambda: (lambda m: (m.forward(_rx()), m.backward(np.ones((T0, B0, H0)))))(_lstm())),
    case("rnn backward before forward", RuntimeError, "forward",
         lambda: _rnn().backward(np.ones((T0, B0, H0), F32))),
    case("rnn backward after cache=False", RuntimeError, "forward",
         lambda: (lambda m: (m.forward(_rx(), cache=False), m.backward(np.ones((T0, B0, H0), F32))))(_gru())),
    # ---- RNN: constructor, load_state_dict
    case("rnn hidden_size 0", ValueError, "hidden_size", lambda: LNGRU(3, 0)),
    case("rnn input_size float", TypeError, "input_size", lambda: LNLSTM(3.0, 4)),
    case("rnn num_layers bool", TypeError, "num_layers", lambda: LNRNN(3, 4, num_layers=True)),
    case("rnn dtype float16", TypeError, "dtype", lambda: LNGRU(3, 4, dtype=F16)),
    case("rnn eps negative", ValueError, "eps", lambda: LNLSTM(3, 4, eps=-1e-5)),
    case("rnn eps nan", ValueError, "eps", lambda: LNRNN(3, 4, eps=float("nan"))),
    case("rnn eps str", TypeError, "eps", lambda: LNGRU(3, 4, eps="1e-5")),
    case("rnn nonlinearity", ValueError, "nonlinearity", lambda: LNRNN(3, 4, nonlinearity="sigmoid")),
    case("rnn load missing key", ValueError, "weight_hh_l1",
         lambda: (lambda m: m.load_state_dict({k: v for k, v in m.state_dict().items()
                                                if k != "weight_hh_l1"}))(_lstm())),
    case("rnn load wrong shape", ValueError, "ln_in_bias_l0",
         lambda: (lambda m: m.load_state_dict(dict(m.state_dict(), ln_in_bias_l0=np.zeros(H0 + 1))))(_gru())),
    case("rnn load complex", TypeError, "weight_ih_l0",
         lambda: (lambda m: m.load_state_dict(dict(m.state_dict(),
                                                   weight_ih_l0=m.params["weight_ih_l0"] + 0j)))(_rnn())),
    case("rnn load None", TypeError, "state_dict", lambda: _gru().load_state_dict(None)),
]


@pytest.mark.parametrize("exc, arg, call", RAISES)
def test_raises(exc, arg, call):
    requested = fastln._lib.get_requested_threads()
    try:
        with pytest.raises(exc, match=named(arg)):
            call()
    finally:
        fastln._lib.set_num_threads(requested)


# ================================================================ table 2: correct results
# (id, check): check() runs the call and compares with the float64 reference itself.

def _ints():
    xi = np.arange(24).reshape(4, 6) % 5 - 2
    for a in (xi, xi.astype(np.uint8), xi > 0):
        y, m, r = LN(a, return_stats=True)
        assert y.dtype == m.dtype == np.dtype(F64)
        _match((y, m, r), ref.layer_norm(a.astype(F64), return_stats=True), F64, str(a.dtype))
        _match(RMS(a, return_stats=True), ref.rms_norm(a.astype(F64), return_stats=True), F64, "rms")


def _lists():
    xl, wl = X.astype(F64).tolist(), W8.astype(F64).tolist()
    _match(LN(xl, wl, B8.tolist(), return_stats=True), ref.layer_norm(xl, wl, B8, return_stats=True),
           F64, "layer_norm")
    _match(ADD(xl, xl, wl), ref.add_layer_norm(xl, xl, wl), F64, "add_layer_norm")
    _, m, r = ref.layer_norm(xl, return_stats=True)
    _match(LNB(DY.astype(F64).tolist(), xl, m.tolist(), r.tolist(), wl),
           ref.layer_norm_backward(DY, xl, m, r, wl), F64, "layer_norm_backward")


def _float16():
    xh = X.astype(F16)
    y, r = RMS(xh, W8.astype(F16), return_stats=True)
    assert y.dtype == np.dtype(F16) and r.dtype == np.dtype(F32)
    assert_close(y, ref.rms_norm(xh, W8.astype(F16)), F16)


def _empty_rows():
    for dt in (F32, F64):
        x0 = np.zeros((0, 8), dt)
        y, m, r = LN(x0, return_stats=True)
        assert y.shape == (0, 8) and m.shape == r.shape == (0,) and y.dtype == m.dtype == dt
        y, r = RMS(x0, return_stats=True)
        assert y.shape == (0, 8) and r.shape == (0,)
        y, s, m, r = ADD(x0, x0, return_stats=True)
        assert y.shape == s.shape == (0, 8) and m.shape == (0,)
        dx, dw, db = LNB(x0, x0, np.zeros(0, dt), np.zeros(0, dt), np.ones(8, dt))
        assert dx.shape == (0, 8) and dw.shape == db.shape == (8,)
        np.testing.assert_array_equal(dw, 0)
        np.testing.assert_array_equal(db, 0)
        dx, dw = RMSB(x0, x0, np.zeros(0, dt))
        assert dx.shape == (0, 8) and dw.shape == (8,)
        np.testing.assert_array_equal(dw, 0)
        assert LN(x0, out=np.empty((0, 8), dt)).shape == (0, 8)
    y, m, r = LN(np.zeros((2, 0, 3, 5)), axis=(2, 3), return_stats=True)
    assert y.shape == (2, 0, 3, 5) and m.shape == r.shape == (2, 0)


def _empty_rows_layers():
    for layer in (fastln.LayerNorm((3, 4)), fastln.RMSNorm(4)):
        x0 = np.zeros((0, 3, 4), F32)
        assert layer(x0).shape == (0, 3, 4)
        assert layer.backward(x0).shape == (0, 3, 4)
        for g in layer.grads.values():
            np.testing.assert_array_equal(g, 0)


def _readonly_all_five():
    for dt in (F32, F64):
        all_five(layout("readonly"), dt)
    ro = np.frombuffer(X.tobytes(), F32).reshape(X.shape)      # read-only buffer
    assert not ro.flags.writeable
    _match((LN(ro, W8),), (ref.layer_norm(X, W8),), F32, "frombuffer(bytes)")


def _layers_on_odd_inputs():
    ln = fastln.LayerNorm(8)
    ln.load_state_dict({"weight": W8.astype(F64), "bias": B8.tolist()})
    x = relayout(X, "negstride")
    _match((ln(x),), (ref.layer_norm(X, W8, B8),), F32, "LayerNorm negstride")
    _, m, r = ref.layer_norm(X, return_stats=True)
    _match((ln.backward(_ro(DY)),), (ref.layer_norm_backward(DY, X, m, r, W8)[0],), F32, "backward")
    rms = fastln.RMSNorm((4, 8), dtype=F64)
    _match((rms(np.stack([X, X]).tolist()),), (ref.rms_norm(np.stack([X, X]), axis=(-2, -1)),),
           F64, "RMSNorm list")


def _noncontiguous_out():
    for kind in ("F", "sliced", "negstride"):
        o = relayout(np.zeros((4, 8), F32), kind)
        assert LN(X, W8, B8, out=o) is o
        assert_close(o, ref.layer_norm(X, W8, B8), F32)
        o = relayout(np.zeros((4, 8), F32), kind)
        assert LNB(DY, X, *ref.layer_norm(X, return_stats=True)[1:], out=o)[0] is o


def _fortran_axis0():
    xf = np.asfortranarray(X3)
    _, m, r = ref.layer_norm(X3, axis=0, return_stats=True)
    dy = relayout(np.ones_like(X3) + X3, "sliced")
    _match(LNB(dy, xf, m, r, axis=0), ref.layer_norm_backward(np.ones_like(X3) + X3, X3, m, r, axis=0),
           F64, "layer_norm_backward axis 0")


def _valid_numbers_accepted():
    _match((LN(X, axis=np.int64(-1), eps=np.float32(1e-5)),), (ref.layer_norm(X),), F32, "numpy scalars")
    _match((RMS(X, eps=0),), (ref.rms_norm(X, eps=0.0),), F32, "int eps 0")
    _match((LN(X, eps=1e300),), (ref.layer_norm(X, eps=1e300),), F32, "eps 1e300")


def _float32_near_max():
    """|x| near float32's max: statistics overflow in float32 and are redone in double."""
    x = np.array([[3e38, -3e38, 1.0, 2.0], [1e20, -1e20, 0, 5e19], [1, 2, 3, 4]], F32)
    for f, rf in ((LN, ref.layer_norm), (RMS, ref.rms_norm)):
        y = f(x)
        assert np.isfinite(y).all()
        assert_close(y, rf(x), F32)
    y, s = ADD(x, np.zeros_like(x))
    assert np.isfinite(y).all()
    assert_close(y, ref.layer_norm(x), F32)


def _set_num_threads_numpy_int():
    requested = fastln._lib.get_requested_threads()
    try:
        fastln.set_num_threads(np.int64(1))
        assert fastln.get_num_threads() == 1
    finally:
        fastln._lib.set_num_threads(requested)


def _rnn_x_layouts():
    x = _rx()
    for m in (_lstm(), _gru(), _rnn(nonlinearity="relu")):
        rnn_forward_ok(m, x.tolist(), clean_x=x)
        rnn_forward_ok(m, relayout(x, "negstride"), clean_x=x)
        rnn_forward_ok(m, _ro(x), clean_x=x)
        rnn_forward_ok(m, relayout(x, "sliced"), clean_x=x)
        rnn_forward_ok(m, byteswapped(x), clean_x=x)   # '>f4' is float32 too
    bf = _gru(batch_first=True)
    rnn_forward_ok(bf, x.transpose(1, 0, 2), clean_x=np.ascontiguousarray(x.transpose(1, 0, 2)))


def _rnn_lengths_forms():
    x, want = _rx(), np.array([5, 2])
    for lengths in ([5, 2], (5, 2), np.array([5, 2], np.uint8), np.array([5, 2], ">i8"),
                    _ro(np.array([5, 2])), np.array([2, 0, 5])[::-2]):
        for m in (_lstm(), _gru()):
            rnn_forward_ok(m, x, lengths=lengths, clean_lengths=want)


def _rnn_state_forms():
    x = _rx()
    rng = np.random.default_rng(3)
    h, c = (rng.standard_normal((L0, B0, H0)).astype(F32) for _ in range(2))
    m = _lstm()
    for state in ([h, c], (h.tolist(), c.tolist()), (_ro(h), relayout(c, "negstride")), (h, None)):
        clean = (h, c if state[1] is not None else np.zeros_like(c))
        rnn_forward_ok(m, x, state, clean_state=clean)
    g = _gru()
    for state in (h.tolist(), _ro(h), relayout(h, "sliced")):
        rnn_forward_ok(g, x, state, clean_state=h)
    y, s = g.step(x[0].tolist(), h.tolist())
    wy, ws = _rnn_ref(g, x[:1], h)
    rnn_close(y, wy[0], F32, "step")


def _rnn_backward_odd_dy():
    x = _rx()
    dy = np.random.default_rng(9).standard_normal((T0, B0, H0)).astype(F32)
    for make in (_lstm, _gru, _rnn):
        want = rnn_run(make(), x, dy=dy)
        rnn_same(rnn_run(make(), x, dy=dy.tolist()), want)
        rnn_same(rnn_run(make(), x, dy=relayout(dy, "negstride")), want)
        rnn_same(rnn_run(make(), x, dy=_ro(dy)), want)


RESULTS = [
    case("int, uint8 and bool x compute in float64", _ints),
    case("nested lists for x, weight, bias, dy, mean, rstd", _lists),
    case("float16 x and weight", _float16),
    case("0 rows: empty results, zero dweight/dbias", _empty_rows),
    case("0 rows through LayerNorm/RMSNorm forward and backward", _empty_rows_layers),
    case("read-only inputs, all five functions", _readonly_all_five),
    case("negative-stride inputs, all five functions", lambda: all_five(layout("negstride"), F32)),
    case("sliced (non-contiguous) inputs, all five functions", lambda: all_five(layout("sliced"), F64)),
    case("Fortran-order inputs, all five functions", lambda: all_five(layout("F"), F32, H=64)),
    case("Fortran x, strided dy, backward over axis 0", _fortran_axis0),
    case("non-contiguous out= buffers", _noncontiguous_out),
    case("layers: negstride x, read-only dy, list x, float64 state_dict", _layers_on_odd_inputs),
    case("numpy-scalar axis and eps, int eps, eps 1e300", _valid_numbers_accepted),
    case("float32 rows near float32 max", _float32_near_max),
    case("set_num_threads(np.int64(1))", _set_num_threads_numpy_int),
    case("rnn x as list, negstride, read-only, sliced, byte-swapped, batch_first view",
         _rnn_x_layouts),
    case("rnn lengths as list, tuple, uint8, >i8, read-only, strided", _rnn_lengths_forms),
    case("rnn state as list, nested lists, read-only, negstride, (h, None)", _rnn_state_forms),
    case("rnn backward dy as list, negstride, read-only", _rnn_backward_odd_dy),
]


@pytest.mark.parametrize("check", RESULTS)
def test_correct_result(check):
    check()


# ================================================================ table 3: NaN / inf
# NaN or inf in a row shows up in that row only; every other row is finite and correct.

BAD_ROWS = [1, 3, 4, 6]


def _poison(a):
    a = np.array(a)
    a[1, 5] = np.nan
    a[3, 0] = np.inf
    a[4, -1] = -np.inf
    a[6] = np.nan
    return a


def _confined(outs, wants, dtype, what):
    """Row-shaped outputs: bad rows are not all finite; clean rows are finite and match
    ``wants`` (the reference on the clean rows only)."""
    clean = [i for i in range(outs[0].shape[0]) if i not in BAD_ROWS]
    for k, (o, w) in enumerate(zip(outs, wants)):
        assert np.isfinite(o[clean]).all(), (what, k)
        assert_close(o[clean], w, dtype, err_msg="%s output %d" % (what, k))
        if o.ndim == 2:
            for i in BAD_ROWS:
                assert not np.isfinite(o[i]).all(), (what, k, i)


def _nonfinite_norms(kind, dtype):
    rng = np.random.default_rng(11)
    N, H = 8, 33
    x = (rng.standard_normal((N, H)) + 0.3).astype(dtype)
    r, dy = (rng.standard_normal((N, H)).astype(dtype) for _ in range(2))
    w = (1 + 0.3 * rng.standard_normal(H)).astype(dtype)
    b = rng.standard_normal(H).astype(dtype)
    clean = [i for i in range(N) if i not in BAD_ROWS]
    _, mean, rstd = (a.astype(dtype) for a in ref.layer_norm(x, return_stats=True))
    rrstd = ref.rms_norm(x, return_stats=True)[1].astype(dtype)
    xb, rb, dyb = _poison(x), _poison(r), _poison(dy)

    def c(a):
        return a[clean]

    if kind == "layer_norm x":
        outs = LN(xb, w, b, return_stats=True)
        wants = ref.layer_norm(c(x), w, b, return_stats=True)
    elif kind == "rms_norm x":
        outs = RMS(xb, w, return_stats=True)
        wants = ref.rms_norm(c(x), w, return_stats=True)
    elif kind == "add_layer_norm residual":
        outs = ADD(x, rb, w, b, return_stats=True)
        wants = ref.add_layer_norm(c(x), c(r), w, b, return_stats=True)
    elif kind == "layer_norm_backward dy":
        outs = LNB(dyb, x, mean, rstd, w)[:1]
        wants = ref.layer_norm_backward(c(dy), c(x), c(mean), c(rstd), w)[:1]
    elif kind == "layer_norm_backward x, stats of x":
        _, mb, sb = LN(xb, return_stats=True)
        outs = LNB(dy, xb, mb, sb, w)[:1]
        wants = ref.layer_norm_backward(c(dy), c(x), c(mean), c(rstd), w)[:1]
    elif kind == "rms_norm_backward dy":
        outs = RMSB(dyb, x, rrstd, w)[:1]
        wants = ref.rms_norm_backward(c(dy), c(x), c(rrstd), w)[:1]
    elif kind == "LayerNorm forward and backward":
        layer = fastln.LayerNorm(H, dtype=dtype)
        outs = (layer(xb), layer.backward(dy))
        _, m2, s2 = ref.layer_norm(c(x), return_stats=True)
        wants = (ref.layer_norm(c(x)), ref.layer_norm_backward(c(dy), c(x), m2, s2)[0])
    else:
        raise AssertionError(kind)
    _confined(outs, wants, dtype, kind)


def _nonfinite_rnn(make, dtype):
    """NaN at (t=2, b=1): y[2:, 1], its state and dx are non-finite; the other sequences are
    finite and equal to a run without sequence 1."""
    T, B = 6, 3
    x = _rx(T=T, B=B, dtype=dtype)
    dy = np.random.default_rng(5).standard_normal((T, B, H0)).astype(dtype)
    xb = x.copy()
    xb[2, 1, 0] = np.nan
    got = rnn_run(make(dtype=dtype), xb, dy=dy)
    keep = [0, 2]
    want = rnn_run(make(dtype=dtype), np.ascontiguousarray(x[:, keep]),
                   dy=np.ascontiguousarray(dy[:, keep]))
    y_ref, s_ref = _rnn_ref(make(dtype=dtype), x[:, keep])
    rnn_close(got["y"][:, keep], y_ref, dtype, "y vs reference")
    for key in ("y", "dx"):
        assert not np.isfinite(got[key][:, 1]).all(), key
        rnn_same({key: got[key][:, keep]}, {key: want[key]})
    assert np.isfinite(got["y"][:2, 1]).all()
    for key in got:
        if key.startswith("state") or key.startswith("dstate"):
            assert not np.isfinite(got[key][:, 1]).all(), key
            rnn_same({key: got[key][:, keep]}, {key: want[key]})


NONFINITE = [
    case("%s-%s" % (kind, np.dtype(dt).name), kind, dt)
    for kind in ["layer_norm x", "rms_norm x", "add_layer_norm residual", "layer_norm_backward dy",
                 "layer_norm_backward x, stats of x", "rms_norm_backward dy",
                 "LayerNorm forward and backward"]
    for dt in (F32, F64)
]

NONFINITE_RNN = [case("%s-%s" % (make.__name__[1:], np.dtype(dt).name), make, dt)
                 for make in (_lstm, _gru, _rnn) for dt in (F32, F64)]


@pytest.mark.parametrize("kind, dtype", NONFINITE)
def test_nonfinite_confined_to_rows(kind, dtype):
    _nonfinite_norms(kind, dtype)


@pytest.mark.parametrize("make, dtype", NONFINITE_RNN)
def test_nonfinite_confined_to_sequence(make, dtype):
    _nonfinite_rnn(make, dtype)


# ================================================================ table 4: in a child process
# (id, code): code runs in a fresh interpreter after the prelude; a crash (negative return
# code: killed by a signal) or any exception fails the row.

PRELUDE = """
import sys, warnings
sys.path.insert(0, %r)
import numpy as np, fastln
from fastln import reference as ref
from fastln.rnn import LNLSTM, LNGRU, LNRNN
import test_bad_inputs as T
from _util import assert_close, named
F32, F64 = np.float32, np.float64

def expect_raises(exc, arg, call):
    import re
    try:
        call()
    except exc as e:
        assert re.search(named(arg), str(e)), "message does not name %%r: %%s" %% (arg, e)
        return
    raise AssertionError("%%s not raised" %% (exc,))
""" % TESTS_DIR


def _huge_row(dtype, H):
    return "(np.random.default_rng(0).standard_normal((1, %d), dtype=np.float32) * 3 + 10)" \
           ".astype(%s)" % (H, dtype)


SUBPROCESS = [
    # ---- unaligned and byte-swapped buffers: all five functions, every ISA path
    case("unaligned float32 offset 1", "T.all_five(T.unaligned(1), F32, isas=True)"),
    case("unaligned float32 offset 2", "T.all_five(T.unaligned(2), F32, H=1031, isas=True)"),
    case("unaligned float64 offset 1", "T.all_five(T.unaligned(1), F64, isas=True)"),
    case("unaligned float64 offset 4", "T.all_five(T.unaligned(4), F64, H=1031, isas=True)"),
    case("SIMD-misaligned float32/float64 (fast path)",
         "for dt in (F32, F64):\n"
         "    for H in (37, 1031):\n"
         "        T.all_five(T.simd_misaligned, dt, H=H, isas=True)\n"
         "        T.check_out(T.simd_misaligned, dt, H=H)"),
    case("unaligned out= and in place on an unaligned buffer",
         "for dt in (F32, F64):\n"
         "    for off in (1, 3):\n"
         "        T.check_out(T.unaligned(off), dt)\n"
         "        T.check_out(T.unaligned(off), dt, N=3, H=1031)"),
    case("byte-swapped >f4", "T.all_five(T.byteswapped, np.dtype('>f4'), isas=True)"),
    case("byte-swapped >f8", "T.all_five(T.byteswapped, np.dtype('>f8'), H=1031, isas=True)"),
    case("byte-swapped and unaligned >f8 offset 3",
         "T.all_five(lambda a: T.unaligned(3)(T.byteswapped(a)), np.dtype('>f8'), isas=True)"),
    # ---- out= overlapping the inputs
    case("overlapping out= in forward",
         "rng = np.random.default_rng(0)\n"
         "for dt in (F32, F64):\n"
         "    for N, H in ((5, 37), (64, 1031)):\n"
         "        buf = rng.standard_normal((N + 1, H)).astype(dt)\n"
         "        x0, w0 = buf[:-1].copy(), buf[-1].copy()\n"
         "        y = fastln.layer_norm(buf[:-1], buf[-1], out=buf[1:])\n"   # shifted by a row
         "        assert_close(y, ref.layer_norm(x0, w0), dt)\n"
         "        buf = rng.standard_normal((N + 1, H)).astype(dt)\n"
         "        x0, w0 = buf[1:].copy(), buf[0].copy()\n"
         "        y = fastln.rms_norm(buf[1:], buf[0], out=buf[:-1])\n"    # and over the weight
         "        assert_close(y, ref.rms_norm(x0, w0), dt)\n"
         "        x, r = rng.standard_normal((2, N, H)).astype(dt)\n"
         "        wy, ws = ref.add_layer_norm(x, r)\n"
         "        x2, r2 = x.copy(), r.copy()\n"
         "        y, s = fastln.add_layer_norm(x2, r2, out=(r2, x2))\n"  # y into residual, s into x
         "        assert_close(y, wy, dt); assert_close(s, ws, dt)\n"
         "        sq = rng.standard_normal((16, 16)).astype(dt); s0 = sq.copy()\n"
         "        assert_close(fastln.layer_norm(sq, out=sq.T), ref.layer_norm(s0), dt)\n"
         "        buf = rng.standard_normal((N + 1, H)).astype(dt)\n"
         "        expect_raises(ValueError, 'out', lambda: fastln.add_layer_norm(\n"
         "            buf[:-1], buf[:-1], out=(buf[1:], buf[:-1])))"),
    case("overlapping out= in backward",
         "rng = np.random.default_rng(1)\n"
         "for dt in (F32, F64):\n"
         "    for N, H in ((5, 37), (64, 1031)):\n"
         "        x, dy = rng.standard_normal((2, N, H)).astype(dt)\n"
         "        w = (1 + 0.3 * rng.standard_normal(H)).astype(dt)\n"
         "        _, m, r = fastln.layer_norm(x, return_stats=True)\n"
         "        want = ref.layer_norm_backward(dy, x, m, r, w)\n"
         "        for which in ('x', 'dy'):\n"
         "            a, b = x.copy(), dy.copy()\n"
         "            o = a if which == 'x' else b\n"
         "            got = fastln.layer_norm_backward(b, a, m, r, w, out=o)\n"
         "            assert got[0] is o\n"
         "            for g, e in zip(got, want): assert_close(g, e, dt)\n"
         "        buf = np.concatenate([dy, dy[:1]])\n"
         "        assert_close(fastln.layer_norm_backward(buf[:-1], x, m, r, w, out=buf[1:])[0], want[0], dt)\n"
         "        _, rr = fastln.rms_norm(x, return_stats=True)\n"
         "        want = ref.rms_norm_backward(dy, x, rr, w)\n"
         "        b = dy.copy()\n"
         "        for g, e in zip(fastln.rms_norm_backward(b, x, rr, w, out=b), want): assert_close(g, e, dt)\n"
         "        o = np.zeros((N, H), dt); o[0, :N] = rr\n"
         "        assert_close(fastln.rms_norm_backward(dy, x, o[0, :N], w, out=o)[0], want[0], dt)"),
    # ---- RNN models with tampered internals (params, grads)
    case("rnn params wrong shape",
         "for cls in (LNLSTM, LNGRU, LNRNN):\n"
         "    m = cls(3, 4, num_layers=2, seed=0)\n"
         "    m.params['weight_hh_l1'] = np.zeros((3, 4), F32)\n"
         "    expect_raises(ValueError, 'weight_hh_l1', lambda: m.forward(T._rx()))\n"
         "    expect_raises(ValueError, 'weight_hh_l1', lambda: m.step(T._rx()[0]))"),
    case("rnn params key missing",
         "for cls in (LNLSTM, LNGRU, LNRNN):\n"
         "    m = cls(3, 4, num_layers=2, seed=0)\n"
         "    key = [k for k in m.params if k.endswith('bias_l1')][-1]\n"
         "    del m.params[key]\n"
         "    expect_raises(ValueError, key, lambda: m.forward(T._rx()))"),
    case("rnn params replaced between forward and backward",
         "for cls in (LNLSTM, LNGRU, LNRNN):\n"
         "    m = cls(3, 4, num_layers=2, seed=0)\n"
         "    m.forward(T._rx())\n"
         "    m.params['weight_ih_l0'] = np.zeros((1, 1), F32)\n"
         "    expect_raises(ValueError, 'weight_ih_l0', lambda: m.backward(np.ones((5, 2, 4), F32)))"),
    case("rnn params float64, Fortran, strided, byte-swapped in a float32 model",
         "for make in (T._lstm, T._gru, T._rnn):\n"
         "    want = T.rnn_run(make(), T._rx())\n"
         "    m = make()\n"
         "    ks = list(m.params)\n"
         "    m.params[ks[0]] = m.params[ks[0]].astype(F64)\n"
         "    m.params[ks[1]] = np.asfortranarray(m.params[ks[1]])\n"
         "    m.params[ks[2]] = np.repeat(m.params[ks[2]], 2)[::2]\n"
         "    m.params[ks[3]] = T.byteswapped(m.params[ks[3]])\n"
         "    T.rnn_forward_ok(m, T._rx())\n"
         "    T.rnn_same(T.rnn_run(m, T._rx()), want)"),
    case("rnn grads replaced by junk",
         "for make in (T._lstm, T._gru, T._rnn):\n"
         "    want = T.rnn_run(make(), T._rx())\n"
         "    m = make()\n"
         "    ks = list(m.grads)\n"
         "    m.grads[ks[0]] = 'junk'\n"
         "    m.grads[ks[1]] = np.zeros(3, F32)\n"
         "    m.grads[ks[2]] = T._ro(m.grads[ks[2]])\n"
         "    m.grads[ks[3]] = np.zeros_like(m.grads[ks[3]], F64)\n"
         "    del m.grads[ks[4]]\n"
         "    T.rnn_same(T.rnn_run(m, T._rx()), want)"),
    case("rnn unaligned state and dstate",
         "for make in (T._lstm, T._gru):\n"
         "    rng = np.random.default_rng(2)\n"
         "    h = rng.standard_normal((2, 2, 4)).astype(F32)\n"
         "    u = T.unaligned(1)\n"
         "    st, ust = ((h, h + 1), (u(h), u(h + 1))) if make is T._lstm else (h, u(h))\n"
         "    T.rnn_same(T.rnn_run(make(), T._rx(), ust, dstate=ust), T.rnn_run(make(), T._rx(), st, dstate=st))"),
    case("rnn params complex (assigned directly)",
         "warnings.simplefilter('error')\n"
         "m = T._gru()\n"
         "m.params['weight_hh_l0'] = m.params['weight_hh_l0'] + 1j\n"
         "expect_raises(TypeError, 'weight_hh_l0', lambda: m.forward(T._rx()))"),
    case("rnn forward unaligned x",
         "for make in (T._lstm, T._gru, T._rnn):\n"
         "    x = T._rx()\n"
         "    T.rnn_forward_ok(make(), T.unaligned(1)(x), clean_x=x)"),
    case("rnn step unaligned x_t",
         "m = T._lstm(); x = T._rx()\n"
         "y, s = m.step(T.unaligned(2)(x[0]))\n"
         "T.rnn_close(y, T._rnn_ref(m, x[:1])[0][0], F32)"),
    case("rnn backward unaligned dy",
         "dy = np.ones((5, 2, 4), F32)\n"
         "want = T.rnn_run(T._gru(), T._rx(), dy=dy)\n"
         "T.rnn_same(T.rnn_run(T._gru(), T._rx(), dy=T.unaligned(1)(dy)), want)"),
    case("rnn unaligned lengths",
         "m = T._lstm()\n"
         "T.rnn_forward_ok(m, T._rx(), lengths=T.unaligned(1)(np.array([5, 2])), clean_lengths=[5, 2])"),
    case("rnn unaligned params",
         "want = T.rnn_run(T._rnn(), T._rx())\n"
         "m = T._rnn()\n"
         "m.params['weight_hh_l0'] = T.unaligned(1)(m.params['weight_hh_l0'])\n"
         "T.rnn_same(T.rnn_run(m, T._rx()), want)"),
]




# Rows that need up to ~1 GB or a few seconds: never run two of them at once.
SUBPROCESS_HEAVY = [
    case("streaming-size outputs at SIMD-misaligned addresses",
         "x = np.random.default_rng(0).standard_normal((12300, 1031), dtype=F32)\n"   # 50 MB
         "rows = np.r_[0:3, 6150, 12297:12300]\n"     # rows are independent: check a sample
         "o = T.simd_misaligned(np.zeros_like(x))\n"
         "assert fastln.layer_norm(x, out=o) is o\n"
         "assert np.isfinite(o).all()\n"
         "assert_close(o[rows], ref.layer_norm(x[rows]), F32)\n"
         "ys, ss = T.simd_misaligned(np.zeros_like(x)), T.simd_misaligned(np.zeros_like(x))\n"
         "y, s = fastln.add_layer_norm(x, o, out=(ys, ss))\n"
         "assert y is ys and s is ss\n"
         "for g, w in zip((y[rows], s[rows]), ref.add_layer_norm(x[rows], o[rows])):\n"
         "    assert_close(g, w, F32)\n"
         "x, dy = x[:2100], o[:2100]\n"              # dx of 8.7 MB: streaming stores too
         "_, m, r = fastln.layer_norm(x, return_stats=True)\n"
         "dx = T.simd_misaligned(np.zeros_like(x))\n"
         "assert fastln.layer_norm_backward(dy, x, m, r, out=dx)[0] is dx\n"
         "rows = [0, 1, 1050, 2099]\n"
         "assert_close(dx[rows], ref.layer_norm_backward(dy[rows], x[rows], m[rows], r[rows])[0], F32)"),
    # huge H: one row of 2**24 float32 (64 MB); the float64 reference peaks below ~1 GB
    case("huge H: layer_norm (1, 2**24) float32",
         "x = %s\n"
         "y, m, r = fastln.layer_norm(x, return_stats=True)\n"
         "wy, wm, wr = ref.layer_norm(x, return_stats=True)\n"
         "del x\n"
         "T.close_chunked(y, wy, F32); assert_close(m, wm, F32); assert_close(r, wr, F32)" % _huge_row("F32", 2 ** 24)),
    case("huge H: rms_norm (1, 2**24) float32",
         "x = %s\n"
         "y, r = fastln.rms_norm(x, return_stats=True)\n"
         "wy, wr = ref.rms_norm(x, return_stats=True)\n"
         "del x\n"
         "T.close_chunked(y, wy, F32); assert_close(r, wr, F32)" % _huge_row("F32", 2 ** 24)),
    case("huge H: backward (1, 2**22) float32",
         "x = %s\n"
         "dy = np.cos(np.arange(x.size, dtype=F32)).reshape(x.shape)\n"
         "_, m, r = fastln.layer_norm(x, return_stats=True)\n"
         "for g, w in zip(fastln.layer_norm_backward(dy, x, m, r), ref.layer_norm_backward(dy, x, m, r)):\n"
         "    assert_close(g, w, F32)\n"
         "_, r = fastln.rms_norm(x, return_stats=True)\n"
         "for g, w in zip(fastln.rms_norm_backward(dy, x, r), ref.rms_norm_backward(dy, x, r)):\n"
         "    assert_close(g, w, F32)" % _huge_row("F32", 2 ** 22)),
]


def _run_child(code):
    return run_python(PRELUDE + code + "\nprint('CASE-OK')\n")


@pytest.fixture(scope="module")
def light_children(request):
    """The selected light rows' children, started ahead two at a time (each row still has a
    process of its own)."""
    with started_ahead(request, "test_in_subprocess", _run_child,
                       [(p.id, p.values[0]) for p in SUBPROCESS]) as futures:
        yield futures


@pytest.mark.parametrize("code", SUBPROCESS + SUBPROCESS_HEAVY)
def test_in_subprocess(code, request, light_children):
    future = light_children.pop(request.node.callspec.id, None)
    proc = future.result() if future is not None else _run_child(code)
    how = ("killed by signal %d (a crash)" % -proc.returncode if proc.returncode < 0
           else "exit status %d" % proc.returncode)
    assert proc.returncode == 0 and "CASE-OK" in proc.stdout, (
        "child %s\n--- stdout\n%s\n--- stderr\n%s" % (how, proc.stdout[-2000:], proc.stderr[-6000:]))


# ================================================================ the matrix itself

def test_matrix_has_enough_distinct_cases():
    ids = [p.id for table in (RAISES, RESULTS, NONFINITE, NONFINITE_RNN, SUBPROCESS,
                                                 SUBPROCESS_HEAVY) for p in table]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert len(ids) >= 45, len(ids)
