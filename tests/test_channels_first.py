"""layer_norm and rms_norm, and their backward, over one axis that is not the
last (channels first, e.g. axis 1 of (N, C, H, W)): the kernels that read
such an array in place (src_c/norm/channels.h), against the float64
reference and PyTorch, on every ISA path and thread count, with NaN, inf,
large offsets, one channel, many channels, tails of tiles and empty batches;
and the general path they stand in for (taken with out=, or a non-contiguous
x) agrees with them.
"""
import numpy as np
import pytest

import fastln
from fastln import reference as ref

from _util import F32, F64

# (shape, axis): tiles with tails, one channel, many channels (short tiles),
# a middle axis, an empty batch
CASES = [((2, 5, 3, 4), 1), ((3, 7, 10), 1), ((2, 3, 4, 5), 2), ((4, 96, 7, 9), 1),
         ((1, 300, 65), 1), ((2, 1, 5), 1), ((3, 4, 1000), 1), ((2, 4099, 20), 1),
         ((0, 4, 6), 1), ((2, 6, 3), 0)]
IDS = ["x".join(map(str, s)) + f"-axis{a}" for s, a in CASES]


def tol(dtype):
    return (1e-5, 1e-5) if dtype == F32 else (1e-12, 1e-12)


def close(got, want, dtype, what):
    rtol, atol = tol(dtype)
    assert got.dtype == dtype, (what, got.dtype)
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * scale, err_msg=what)


def data(rng, shape, axis, dtype, offset=10.0):
    x = (rng.standard_normal(shape) * 3 + offset).astype(dtype)
    C = shape[axis]
    return x, (1 + 0.5 * rng.standard_normal(C)).astype(dtype), rng.standard_normal(C).astype(dtype)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("params", [True, False], ids=["wb", "none"])
def test_matches_reference(isa, case, dtype, params, rng):
    shape, axis = case
    x, w, b = data(rng, shape, axis, dtype)
    if not params:
        w = b = None
    y, mean, rstd = fastln.layer_norm(x, w, b, axis=axis, return_stats=True)
    yr, mr, rr = ref.layer_norm(x, w, b, axis=axis, return_stats=True)
    close(y, yr, dtype, "layer_norm y")
    close(mean, mr, dtype, "mean")
    close(rstd, rr, dtype, "rstd")
    assert y.shape == x.shape and mean.shape == mr.shape
    y, rs = fastln.rms_norm(x, w, axis=axis, return_stats=True)
    yr, rsr = ref.rms_norm(x, w, axis=axis, return_stats=True)
    close(y, yr, dtype, "rms_norm y")
    close(rs, rsr, dtype, "rms_norm rstd")


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
def test_same_as_the_general_path(dtype, rng):
    """out= (and a non-contiguous view) take the transposing general path."""
    x, w, b = data(rng, (3, 16, 9, 11), 1, dtype)
    y = fastln.layer_norm(x, w, b, axis=1)
    out = np.empty_like(x)
    fastln.layer_norm(x, w, b, axis=1, out=out)
    close(y, out.astype(F64), dtype, "out=")
    xs = np.asfortranarray(x)
    close(fastln.layer_norm(xs, w, b, axis=1), y.astype(F64), dtype, "Fortran-ordered x")
    close(fastln.rms_norm(x, w, axis=1), fastln.rms_norm(xs, w, axis=1).astype(F64), dtype,
          "rms_norm")


def test_bitwise_on_any_thread_count(rng):
    x, w, b = data(rng, (4, 40, 33, 17), 1, F32)
    runs = []
    for n in (1, 2, 3):
        with fastln.threads(n):
            runs.append(fastln.layer_norm(x, w, b, axis=1, return_stats=True)
                        + (fastln.rms_norm(x, w, axis=1),))
    for other in runs[1:]:
        for a, c in zip(runs[0], other):
            np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
def test_nan_and_inf_stay_in_their_position(isa, dtype, rng):
    x, w, b = data(rng, (2, 8, 5, 6), 1, dtype)
    x[0, 3, 1, 2] = np.nan
    x[1, 0, 4, 5] = np.inf
    y = fastln.layer_norm(x, w, b, axis=1)
    bad = np.zeros((2, 5, 6), bool)
    bad[0, 1, 2] = bad[1, 4, 5] = True
    assert np.isnan(np.moveaxis(y, 1, -1)[bad]).all()
    good = ~bad
    with np.errstate(invalid="ignore"):
        yr = ref.layer_norm(x, w, b, axis=1)
    close(np.moveaxis(y, 1, -1)[good], np.moveaxis(yr, 1, -1)[good], dtype, "finite positions")


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
def test_large_offset(isa, dtype, rng):
    """Values 1e4 from zero with a spread of 1: the statistics are taken around
    each position's first channel, as the row kernels take them."""
    x, w, b = data(rng, (2, 64, 7, 5), 1, dtype, offset=1e4)
    x = (x - 1e4) / 3 + 1e4
    close(fastln.layer_norm(x, w, b, axis=1), ref.layer_norm(x, w, b, axis=1), dtype,
          "offset 1e4")


def test_torch_parity(torch, rng):
    """NCHW LayerNorm as torch computes it: permute, F.layer_norm, permute back."""
    x, w, b = data(rng, (2, 24, 6, 7), 1, F64)
    t = torch.nn.functional.layer_norm(torch.from_numpy(x).permute(0, 2, 3, 1), (24,),
                                       torch.from_numpy(w), torch.from_numpy(b), 1e-5)
    close(fastln.layer_norm(x, w, b, axis=1), t.permute(0, 3, 1, 2).numpy(), F64, "torch")


def test_bad_weight_names_it(rng):
    x, w, _ = data(rng, (2, 6, 5), 1, F32)
    with pytest.raises(ValueError, match="weight"):
        fastln.layer_norm(x, w[:5], axis=1)
    with pytest.raises(ValueError, match="weight"):
        fastln.rms_norm(x, np.ones(5, F32), axis=1)


@pytest.mark.parametrize("value", [0.0, 5.0, 1e-30], ids=["zeros", "fives", "tiny"])
def test_constant_and_tiny_columns(isa, value, rng):
    """A constant column normalizes to the bias; values whose float squares
    underflow take the double redo and still match the reference."""
    x = np.full((2, 6, 5, 7), value, F32)
    x[1, :3, 2, 3] = [value, -value, 2 * value]
    w, b = rng.standard_normal(6).astype(F32), rng.standard_normal(6).astype(F32)
    y = fastln.layer_norm(x, w, b, axis=1)
    close(y, ref.layer_norm(x, w, b, axis=1), F32, "layer_norm")
    np.testing.assert_array_equal(y[0], np.broadcast_to(b[:, None, None], (6, 5, 7)))
    close(fastln.rms_norm(x, w, axis=1), ref.rms_norm(x, w, axis=1), F32, "rms_norm")


# ---- backward -----------------------------------------------------------------


def grads(x, axis, w, b, dy, rms):
    """fastln's backward at fastln's own forward statistics."""
    if rms:
        _, rstd = fastln.rms_norm(x, w, axis=axis, return_stats=True)
        return fastln.rms_norm_backward(dy, x, rstd, w, axis=axis)
    _, mean, rstd = fastln.layer_norm(x, w, b, axis=axis, return_stats=True)
    return fastln.layer_norm_backward(dy, x, mean, rstd, w, axis=axis)


def ref_grads(x, axis, w, dy, rms):
    if rms:
        _, rstd = ref.rms_norm(x, w, axis=axis, return_stats=True)
        return ref.rms_norm_backward(dy, x, rstd, w, axis=axis)
    _, mean, rstd = ref.layer_norm(x, w, None, axis=axis, return_stats=True)
    return ref.layer_norm_backward(dy, x, mean, rstd, w, axis=axis)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
def test_backward_matches_reference(isa, case, dtype, rms, rng):
    shape, axis = case
    x, w, b = data(rng, shape, axis, dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    got = grads(x, axis, w, b, dy, rms)
    want = ref_grads(x, axis, w, dy, rms)
    assert len(got) == len(want)
    # dweight and dbias sum over every position: their error grows with the count.
    # dx's terms are rstd * dy * weight in size, which may far exceed dx (one
    # channel: dx is 0, rstd 1/sqrt(eps))
    n = max(1, x.size // shape[axis])
    rstd = fastln.rms_norm(x, axis=axis, return_stats=True)[1] if rms else \
        fastln.layer_norm(x, axis=axis, return_stats=True)[2]
    terms = float(np.abs(rstd).max() * np.abs(dy).max() * np.abs(w).max()) if x.size else 1.0
    for g, r, what in zip(got, want, ("dx", "dweight", "dbias")):
        assert g.shape == r.shape, what
        rtol, atol = tol(dtype)
        scale = max(1.0, float(np.abs(r).max())) if r.size else 1.0
        if what == "dx":
            scale = max(scale, terms)
        k = 1 if what == "dx" else np.sqrt(n)
        np.testing.assert_allclose(g, r, rtol=rtol * k, atol=atol * scale * k, err_msg=what)


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
def test_backward_same_as_the_general_path(dtype, rms, rng):
    """A Fortran-ordered x takes the transposing general path."""
    x, w, b = data(rng, (3, 16, 9, 11), 1, dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    fast = grads(x, 1, w, b, dy, rms)
    general = grads(np.asfortranarray(x), 1, w, b, np.asfortranarray(dy), rms)
    for f, g in zip(fast, general):
        close(f, g.astype(F64), dtype, "general path")


def test_backward_bitwise_on_any_thread_count(rng):
    x, w, b = data(rng, (4, 40, 33, 17), 1, F32)
    dy = rng.standard_normal(x.shape).astype(F32)
    runs = []
    for n in (1, 2, 3):
        with fastln.threads(n):
            runs.append(grads(x, 1, w, b, dy, False) + grads(x, 1, w, b, dy, True))
    for other in runs[1:]:
        for a, c in zip(runs[0], other):
            np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
def test_backward_in_place_and_out(rms, rng):
    """out= may be dy itself (in place) or x; any other out gets the same values."""
    x, w, b = data(rng, (2, 8, 5, 6), 1, F32)
    dy = rng.standard_normal(x.shape).astype(F32)
    want = grads(x, 1, w, b, dy, rms)
    if rms:
        _, rstd = fastln.rms_norm(x, w, axis=1, return_stats=True)

        def call(dy_, x_, out):
            return fastln.rms_norm_backward(dy_, x_, rstd, w, axis=1, out=out)
    else:
        _, mean, rstd = fastln.layer_norm(x, w, b, axis=1, return_stats=True)

        def call(dy_, x_, out):
            return fastln.layer_norm_backward(dy_, x_, mean, rstd, w, axis=1, out=out)
    d = dy.copy()
    got = call(d, x, d)
    assert got[0] is d
    np.testing.assert_array_equal(d, want[0])
    xc = x.copy()
    got = call(dy, xc, xc)
    np.testing.assert_array_equal(xc, want[0])
    out = np.empty((2, 5, 8, 6), F32).transpose(0, 2, 1, 3)   # not C-contiguous
    got = call(dy, x, out)
    assert got[0] is out
    np.testing.assert_array_equal(out, want[0])


def test_backward_nan_stays_in_its_position(isa, rng):
    x, w, b = data(rng, (2, 8, 5, 6), 1, F32)
    dy = rng.standard_normal(x.shape).astype(F32)
    dx = grads(x, 1, w, b, dy, False)[0]
    dy[0, 3, 1, 2] = np.nan
    dx2 = grads(x, 1, w, b, dy, False)[0]
    bad = np.zeros((2, 5, 6), bool)
    bad[0, 1, 2] = True
    assert np.isnan(np.moveaxis(dx2, 1, -1)[bad]).all()
    np.testing.assert_array_equal(np.moveaxis(dx2, 1, -1)[~bad], np.moveaxis(dx, 1, -1)[~bad])


def test_backward_overflowing_sums_match_the_reference(isa, rng):
    """dy near 1e37 with spread-out x: the float sums overflow and the position is
    redone in double."""
    x, w, _ = data(rng, (2, 40, 5, 3), 1, F32)
    dy = (rng.standard_normal(x.shape) * 1e37).astype(F32)
    dx, dw, db = grads(x, 1, w, None, dy, False)
    rdx, rdw, rdb = ref_grads(x, 1, w, dy, False)
    assert np.isfinite(dx).all()
    np.testing.assert_allclose(dx, rdx, rtol=1e-4, atol=1e-4 * float(np.abs(rdx).max()))


def test_backward_torch_parity(torch, rng):
    """NCHW LayerNorm's gradients as torch autograd gives them through permute."""
    x, w, b = data(rng, (2, 24, 6, 7), 1, F64)
    dy = rng.standard_normal(x.shape)
    tx = torch.from_numpy(x).requires_grad_()
    tw, tb = torch.from_numpy(w).requires_grad_(), torch.from_numpy(b).requires_grad_()
    t = torch.nn.functional.layer_norm(tx.permute(0, 2, 3, 1), (24,), tw, tb, 1e-5)
    t.permute(0, 3, 1, 2).backward(torch.from_numpy(dy))
    dx, dw, db = grads(x, 1, w, b, dy, False)
    close(dx, tx.grad.numpy(), F64, "dx")
    close(dw, tw.grad.numpy(), F64, "dweight")
    close(db, tb.grad.numpy(), F64, "dbias")
