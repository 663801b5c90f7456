"""Bad input raises TypeError/ValueError whose message names the argument."""
import numpy as np
import pytest

import fastln

from _util import named

X = np.arange(32, dtype=np.float32).reshape(4, 8) % 5      # (4, 8), normalized size 8
X3 = np.arange(60, dtype=np.float64).reshape(3, 4, 5) % 7  # (3, 4, 5)
W8 = np.ones(8, np.float32)
STATS4 = np.ones(4, np.float32)


def _ro(a):
    a = a.copy()
    a.setflags(write=False)
    return a


LN, RMS, ADD = fastln.layer_norm, fastln.rms_norm, fastln.add_layer_norm
LNB, RMSB = fastln.layer_norm_backward, fastln.rms_norm_backward

CASES = [
    # ---- weight / bias shapes
    ("ln weight short", ValueError, "weight", lambda: LN(X, np.ones(7, np.float32))),
    ("ln weight 2d", ValueError, "weight", lambda: LN(X, np.ones((8, 1), np.float32))),
    ("ln weight full shape", ValueError, "weight", lambda: LN(X, np.ones((4, 8), np.float32))),
    ("ln weight scalar", ValueError, "weight", lambda: LN(X, np.float32(2.0))),
    ("ln weight axis order", ValueError, "weight",
     lambda: LN(X3, np.ones((3, 5)), axis=(2, 0))),
    ("ln bias short", ValueError, "bias", lambda: LN(X, W8, np.ones(9, np.float32))),
    ("ln bias without weight", ValueError, "bias", lambda: LN(X, None, np.ones(3, np.float32))),
    ("rms weight", ValueError, "weight", lambda: RMS(X, np.ones(7, np.float32))),
    ("add weight", ValueError, "weight", lambda: ADD(X, X, np.ones(7, np.float32))),
    ("add bias", ValueError, "bias", lambda: ADD(X, X, W8, np.ones(7, np.float32))),
    ("lnb weight", ValueError, "weight", lambda: LNB(X, X, STATS4, STATS4, np.ones(7))),
    ("rmsb weight", ValueError, "weight", lambda: RMSB(X, X, STATS4, np.ones(7))),
    # ---- axis
    ("ln axis too big", ValueError, "axis", lambda: LN(X, axis=2)),
    ("ln axis too negative", ValueError, "axis", lambda: LN(X, axis=-3)),
    ("ln axis tuple out of range", ValueError, "axis", lambda: LN(X3, axis=(0, 3))),
    ("ln axis duplicate", ValueError, "axis", lambda: LN(X3, axis=(1, 1))),
    ("ln axis duplicate negative", ValueError, "axis", lambda: LN(X3, axis=(2, -1))),
    ("ln axis float", TypeError, "axis", lambda: LN(X, axis=1.0)),
    ("ln axis str", TypeError, "axis", lambda: LN(X, axis="1")),
    ("ln axis tuple float", TypeError, "axis", lambda: LN(X3, axis=(0, 1.5))),
    ("rms axis", ValueError, "axis", lambda: RMS(X, axis=5)),
    ("rms axis duplicate", ValueError, "axis", lambda: RMS(X3, axis=(0, -3))),
    ("add axis", ValueError, "axis", lambda: ADD(X, X, axis=-5)),
    ("lnb axis", ValueError, "axis", lambda: LNB(X, X, STATS4, STATS4, axis=3)),
    ("rmsb axis", ValueError, "axis", lambda: RMSB(X, X, STATS4, axis=(1, 1))),
    # ---- eps
    ("ln eps negative", ValueError, "eps", lambda: LN(X, eps=-1e-5)),
    ("ln eps nan", ValueError, "eps", lambda: LN(X, eps=float("nan"))),
    ("ln eps inf", ValueError, "eps", lambda: LN(X, eps=float("inf"))),
    ("rms eps negative", ValueError, "eps", lambda: RMS(X, eps=-1.0)),
    ("rms eps nan", ValueError, "eps", lambda: RMS(X, eps=np.nan)),
    ("add eps inf", ValueError, "eps", lambda: ADD(X, X, eps=-np.inf)),
    # ---- mismatched shapes
    ("add residual shape", ValueError, "residual", lambda: ADD(X, np.ones((4, 7), np.float32))),
    ("add residual rows", ValueError, "residual", lambda: ADD(X, np.ones((2, 8), np.float32))),
    ("add residual transposed", ValueError, "residual",
     lambda: ADD(X, np.ones((8, 4), np.float32))),
    ("lnb dy shape", ValueError, "dy", lambda: LNB(np.ones((4, 7), np.float32), X, STATS4, STATS4)),
    ("lnb dy rows", ValueError, "dy", lambda: LNB(np.ones((3, 8), np.float32), X, STATS4, STATS4)),
    ("lnb mean shape", ValueError, "mean", lambda: LNB(X, X, np.ones(3, np.float32), STATS4)),
    ("lnb mean 2d", ValueError, "mean", lambda: LNB(X, X, np.ones((4, 8), np.float32), STATS4)),
    ("lnb rstd shape", ValueError, "rstd", lambda: LNB(X, X, STATS4, np.ones(5, np.float32))),
    ("lnb mean axis", ValueError, "mean",
     lambda: LNB(X3, X3, np.ones(3), np.ones(4), axis=(0, 2))),
    ("rmsb dy shape", ValueError, "dy", lambda: RMSB(np.ones((4, 9), np.float32), X, STATS4)),
    ("rmsb rstd shape", ValueError, "rstd", lambda: RMSB(X, X, np.ones(8, np.float32))),
    # ---- out
    ("ln out shape", ValueError, "out", lambda: LN(X, out=np.empty((4, 7), np.float32))),
    ("ln out transposed", ValueError, "out", lambda: LN(X, out=np.empty((8, 4), np.float32))),
    ("ln out dtype", TypeError, "out", lambda: LN(X, out=np.empty((4, 8), np.float64))),
    ("ln out dtype int", TypeError, "out", lambda: LN(X3, out=np.empty((3, 4, 5), np.int64))),
    ("ln out readonly", ValueError, "out", lambda: LN(X, out=_ro(np.empty((4, 8), np.float32)))),
    ("ln out not array", (TypeError, ValueError), "out", lambda: LN(X, out=[[0.0] * 8] * 4)),
    ("ln out float16 for float32", TypeError, "out",
     lambda: LN(X, out=np.empty((4, 8), np.float16))),
    ("rms out shape", ValueError, "out", lambda: RMS(X, out=np.empty((4, 8, 1), np.float32))),
    ("rms out dtype", TypeError, "out", lambda: RMS(X3, out=np.empty((3, 4, 5), np.float32))),
    ("rms out readonly", ValueError, "out", lambda: RMS(X, out=_ro(X))),
    ("add out shape", ValueError, "out", lambda: ADD(X, X, out=np.empty((4, 7), np.float32))),
    ("add out dtype", TypeError, "out", lambda: ADD(X, X, out=np.empty((4, 8), np.float64))),
    ("add out readonly", ValueError, "out", lambda: ADD(X, X, out=_ro(X))),
    ("add out tuple s shape", ValueError, "out",
     lambda: ADD(X, X, out=(np.empty((4, 8), np.float32), np.empty((4, 9), np.float32)))),
    ("add out tuple s dtype", TypeError, "out",
     lambda: ADD(X, X, out=(np.empty((4, 8), np.float32), np.empty((4, 8), np.float64)))),
    ("add out tuple s readonly", ValueError, "out",
     lambda: ADD(X, X, out=(np.empty((4, 8), np.float32), _ro(X)))),
    ("lnb out shape", ValueError, "out",
     lambda: LNB(X, X, STATS4, STATS4, out=np.empty((4, 9), np.float32))),
    ("lnb out dtype", TypeError, "out",
     lambda: LNB(X, X, STATS4, STATS4, out=np.empty((4, 8), np.float64))),
    ("lnb out readonly", ValueError, "out", lambda: LNB(X, X, STATS4, STATS4, out=_ro(X))),
    ("rmsb out shape", ValueError, "out", lambda: RMSB(X, X, STATS4, out=np.empty(32, np.float32))),
    ("rmsb out dtype", TypeError, "out",
     lambda: RMSB(X, X, STATS4, out=np.empty((4, 8), np.float64))),
    # ---- dtypes
    ("ln complex x", TypeError, "x", lambda: LN(X.astype(np.complex64))),
    ("ln object x", TypeError, "x", lambda: LN(X.astype(object))),
    ("ln str x", TypeError, "x", lambda: LN(np.array([["a", "b"], ["c", "d"]]))),
    ("ln complex weight", TypeError, "weight", lambda: LN(X, W8.astype(np.complex128))),
    ("ln str bias", TypeError, "bias", lambda: LN(X, W8, np.array(["a"] * 8))),
    ("rms complex x", TypeError, "x", lambda: RMS(X.astype(np.complex128))),
    ("rms object x", TypeError, "x", lambda: RMS(X.astype(object))),
    ("add complex residual", TypeError, "residual", lambda: ADD(X, X.astype(np.complex64))),
    ("add str x", TypeError, "x", lambda: ADD(np.array([["a", "b"]]), np.ones((1, 2)))),
    ("lnb complex dy", TypeError, "dy", lambda: LNB(X.astype(np.complex64), X, STATS4, STATS4)),
    ("rmsb object dy", TypeError, "dy", lambda: RMSB(X.astype(object), X, STATS4)),
]


@pytest.mark.parametrize("exc,arg,call", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(exc, arg, call):
    with pytest.raises(exc, match=named(arg)):
        call()


@pytest.mark.parametrize("call", [
    lambda: LN(np.ones((4, 0), np.float32)),
    lambda: LN(np.ones((0, 5)), axis=0),
    lambda: LN(np.ones((3, 0, 2)), axis=(1, 2)),
    lambda: RMS(np.ones((4, 0), np.float32)),
    lambda: ADD(np.ones((2, 0)), np.ones((2, 0))),
    lambda: LNB(np.ones((2, 0)), np.ones((2, 0)), np.ones(2), np.ones(2)),
    lambda: RMSB(np.ones((2, 0)), np.ones((2, 0)), np.ones(2)),
], ids=["ln", "ln axis0", "ln tuple", "rms", "add", "lnb", "rmsb"])
def test_normalized_size_zero(call):
    with pytest.raises(ValueError, match=r"%s|%s|normaliz" % (named("x"), named("axis"))):
        call()


def test_error_leaves_out_untouched():
    out = np.full((4, 8), 7.0, np.float32)
    with pytest.raises(ValueError, match=named("weight")):
        LN(X, np.ones(7, np.float32), out=out)
    np.testing.assert_array_equal(out, 7.0)


def test_valid_edge_values_do_not_raise():
    """The checks are not over-eager: eps=0, axis as numpy ints, same-shape out."""
    LN(X + np.arange(8, dtype=np.float32), eps=0.0)
    RMS(X + 1, eps=0)
    LN(X3, axis=(np.int64(0), np.int32(-1)))
    LN(X3, np.ones((5, 3)), axis=(2, 0))
    LNB(X, X, STATS4, STATS4, W8, out=np.empty((4, 8), np.float32))
