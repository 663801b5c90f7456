"""Slow, obviously-correct float64 NumPy references for every fastln kernel.

These are the yardstick the tests hold the C kernels to (in the spirit of
bottleneck's ``slow`` module).  They favour clarity over speed: every
computation is done in float64, with a two-pass (centered) variance.

All functions take the same arguments as their fast counterparts in
:mod:`fastln` (``axis`` is an int or a tuple of ints) and return float64
arrays.
"""
import numpy as np

__all__ = [
    "layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward",
    "add_layer_norm",
]


def _axes(axis, ndim):
    axes = (axis,) if np.isscalar(axis) else tuple(axis)
    return tuple(int(a) % ndim for a in axes)


def _to_rows(a, axes):
    """Move ``axes`` to the end (in the given order) and flatten to 2-D."""
    a = np.moveaxis(np.asarray(a, dtype=np.float64), axes, range(-len(axes), 0))
    nshape = a.shape[a.ndim - len(axes):]
    return a.reshape(-1, int(np.prod(nshape, dtype=np.int64))), a.shape


def _from_rows(r, moved_shape, axes):
    out = r.reshape(moved_shape)
    return np.moveaxis(out, range(-len(axes), 0), axes)


def _param(p, H):
    return np.ones(H) if p is None else np.asarray(p, np.float64).reshape(H)


def layer_norm(x, weight=None, bias=None, *, axis=-1, eps=1e-5, return_stats=False):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over ``axis``."""
    x = np.asarray(x)
    axes = _axes(axis, x.ndim)
    r, moved = _to_rows(x, axes)
    H = r.shape[1]
    mean = r.mean(axis=1, keepdims=True)
    var = ((r - mean) ** 2).mean(axis=1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    y = (r - mean) * rstd * _param(weight, H)
    if bias is not None:
        y = y + _param(bias, H)
    y = _from_rows(y, moved, axes)
    if not return_stats:
        return y
    bshape = moved[:len(moved) - len(axes)]
    return y, mean.reshape(bshape), rstd.reshape(bshape)


def layer_norm_backward(dy, x, mean, rstd, weight=None, *, axis=-1):
    """Gradients (dx, dweight, dbias) of layer_norm.

    The row mean is taken as ``mean + mean(x - mean)``: this repairs the
    rounding of a low-precision saved mean (as fastln's kernel does) and is
    the identity when ``mean`` is exact.
    """
    x = np.asarray(x)
    axes = _axes(axis, x.ndim)
    r, moved = _to_rows(x, axes)
    g, _ = _to_rows(dy, axes)
    H = r.shape[1]
    mean = np.asarray(mean, np.float64).reshape(-1, 1)
    rstd = np.asarray(rstd, np.float64).reshape(-1, 1)
    mean = mean + (r - mean).mean(axis=1, keepdims=True)
    xhat = (r - mean) * rstd
    gw = g * _param(weight, H)
    dx = rstd * (gw - gw.mean(axis=1, keepdims=True)
                 - xhat * (gw * xhat).mean(axis=1, keepdims=True))
    nshape = moved[len(moved) - len(axes):]
    dweight = (g * xhat).sum(axis=0).reshape(nshape)
    dbias = g.sum(axis=0).reshape(nshape)
    return _from_rows(dx, moved, axes), dweight, dbias


def rms_norm(x, weight=None, *, axis=-1, eps=1e-6, return_stats=False):
    """y = x / sqrt(mean(x**2) + eps) * weight over ``axis``."""
    x = np.asarray(x)
    axes = _axes(axis, x.ndim)
    r, moved = _to_rows(x, axes)
    H = r.shape[1]
    rstd = 1.0 / np.sqrt((r * r).mean(axis=1, keepdims=True) + eps)
    y = _from_rows(r * rstd * _param(weight, H), moved, axes)
    if not return_stats:
        return y
    return y, rstd.reshape(moved[:len(moved) - len(axes)])


def rms_norm_backward(dy, x, rstd, weight=None, *, axis=-1):
    """Gradients (dx, dweight) of rms_norm."""
    x = np.asarray(x)
    axes = _axes(axis, x.ndim)
    r, moved = _to_rows(x, axes)
    g, _ = _to_rows(dy, axes)
    H = r.shape[1]
    rstd = np.asarray(rstd, np.float64).reshape(-1, 1)
    xhat = r * rstd
    gw = g * _param(weight, H)
    dx = rstd * (gw - xhat * (gw * xhat).mean(axis=1, keepdims=True))
    nshape = moved[len(moved) - len(axes):]
    return _from_rows(dx, moved, axes), (g * xhat).sum(axis=0).reshape(nshape)


def add_layer_norm(x, residual, weight=None, bias=None, *, axis=-1, eps=1e-5,
                   return_stats=False):
    """(layer_norm(x + residual), x + residual), computed in float64."""
    s = np.asarray(x, np.float64) + np.asarray(residual, np.float64)
    res = layer_norm(s, weight, bias, axis=axis, eps=eps, return_stats=return_stats)
    if not return_stats:
        return res, s
    y, mean, rstd = res
    return y, s, mean, rstd
