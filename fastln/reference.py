"""Slow, obviously-correct float64 NumPy references for every fastln kernel.

These are the yardstick the tests hold the C kernels to (in the spirit of
bottleneck's ``slow`` module).  They favour clarity over speed: every
computation is done in float64, with a two-pass (centered) variance.

All functions take the same arguments as their fast counterparts in
:mod:`fastln` (``axis`` is an int or a tuple of ints), except ``out``, and
return float64 arrays whatever the input dtype. They do not check their
arguments the way fastln does: bad input fails with NumPy's errors, if at
all.

Examples
--------
>>> import numpy as np, fastln, fastln.reference as ref
>>> x = np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32)
>>> bool(np.allclose(fastln.layer_norm(x), ref.layer_norm(x), atol=1e-5))
True
"""
from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Literal, Optional, Sequence, SupportsIndex, Tuple, Union, overload

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt
    from typing_extensions import TypeAlias

    _Array: TypeAlias = npt.NDArray[np.float64]
    _Axis: TypeAlias = Union[SupportsIndex, Sequence[SupportsIndex]]
    _Param: TypeAlias = Optional[npt.ArrayLike]

__all__ = [
    "layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward",
    "add_layer_norm",
]


def _axes(axis: _Axis, ndim: int) -> Tuple[int, ...]:
    axes = (axis,) if isinstance(axis, SupportsIndex) else tuple(axis)
    return tuple(operator.index(a) % ndim for a in axes)


def _to_rows(a: npt.ArrayLike, axes: Tuple[int, ...]) -> Tuple[_Array, Tuple[int, ...]]:
    """Move ``axes`` to the end (in the given order) and flatten to 2-D."""
    a = np.moveaxis(np.asarray(a, dtype=np.float64), axes, range(-len(axes), 0))
    nshape = a.shape[a.ndim - len(axes):]
    return a.reshape(-1, int(np.prod(nshape, dtype=np.int64))), a.shape


def _from_rows(r: _Array, moved_shape: Tuple[int, ...], axes: Tuple[int, ...]) -> _Array:
    out = r.reshape(moved_shape)
    return np.moveaxis(out, range(-len(axes), 0), axes)


def _param(p: _Param, H: int) -> _Array:
    return np.ones(H) if p is None else np.asarray(p, np.float64).reshape(H)


@overload
def layer_norm(x: npt.ArrayLike, weight: _Param = None, bias: _Param = None, *,
               axis: _Axis = -1, eps: float = 1e-5,
               return_stats: Literal[False] = False) -> _Array: ...
@overload
def layer_norm(x: npt.ArrayLike, weight: _Param = None, bias: _Param = None, *,
               axis: _Axis = -1, eps: float = 1e-5,
               return_stats: Literal[True]) -> Tuple[_Array, _Array, _Array]: ...
@overload
def layer_norm(x: npt.ArrayLike, weight: _Param = None, bias: _Param = None, *,
               axis: _Axis = -1, eps: float = 1e-5,
               return_stats: bool = False) -> Union[_Array, Tuple[_Array, _Array, _Array]]: ...
def layer_norm(x: npt.ArrayLike, weight: _Param = None, bias: _Param = None, *,
               axis: _Axis = -1, eps: float = 1e-5,
               return_stats: bool = False) -> Union[_Array, Tuple[_Array, _Array, _Array]]:
    """y = (x - mean) / sqrt(var + eps) * weight + bias over ``axis``.

    The reference of :func:`fastln.layer_norm`, in float64 with a two-pass
    (centered) biased variance.

    Parameters
    ----------
    x : array_like
        Input, at least 1-D; any real dtype.
    weight, bias : array_like, optional
        Gain and bias of the normalized shape (the sizes of ``axis``, in the
        order given); None means 1 and 0.
    axis : int or tuple of int, default -1
        The normalized axes.
    eps : float, default 1e-5
        Added to the variance.
    return_stats : bool, default False
        Also return ``mean`` and ``rstd``.

    Returns
    -------
    y : ndarray of float64
        x's shape.
    mean, rstd : ndarray of float64
        Only with ``return_stats=True``: x's shape without the normalized
        axes; ``rstd = 1 / sqrt(var + eps)``.

    Examples
    --------
    >>> import numpy as np
    >>> from fastln import reference
    >>> y, mean, rstd = reference.layer_norm([[1, 2, 3]], return_stats=True)
    >>> np.round(y, 4), mean
    (array([[-1.2247,  0.    ,  1.2247]]), array([2.]))
    """
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


def layer_norm_backward(dy: npt.ArrayLike, x: npt.ArrayLike, mean: npt.ArrayLike,
                        rstd: npt.ArrayLike, weight: _Param = None, *, axis: _Axis = -1
                        ) -> Tuple[_Array, _Array, _Array]:
    """Gradients (dx, dweight, dbias) of layer_norm.

    The reference of :func:`fastln.layer_norm_backward`.

    Parameters
    ----------
    dy : array_like
        Gradient of the loss with respect to y, of x's shape.
    x : array_like
        The forward's input.
    mean, rstd : array_like
        The forward's statistics: x's shape without the normalized axes.
    weight : array_like, optional
        The forward's gain, of the normalized shape; None means 1.
    axis : int or tuple of int, default -1
        The normalized axes.

    Returns
    -------
    dx : ndarray of float64
        x's shape.
    dweight, dbias : ndarray of float64
        The normalized shape.

    Notes
    -----
    The row mean is taken as ``mean + mean(x - mean)``: this repairs the
    rounding of a low-precision saved mean (as fastln's kernel does) and is
    the identity when ``mean`` is exact.

    Examples
    --------
    >>> import numpy as np
    >>> from fastln import reference
    >>> x = np.array([[1., 2., 3.], [2., 4., 6.]])
    >>> y, mean, rstd = reference.layer_norm(x, return_stats=True)
    >>> dx, dweight, dbias = reference.layer_norm_backward(np.ones_like(x), x, mean, rstd)
    >>> dbias
    array([2., 2., 2.])
    """
    x = np.asarray(x)
    axes = _axes(axis, x.ndim)
    r, moved = _to_rows(x, axes)
    g, _ = _to_rows(dy, axes)
    H = r.shape[1]
    m = np.asarray(mean, np.float64).reshape(-1, 1)
    rs = np.asarray(rstd, np.float64).reshape(-1, 1)
    m = m + (r - m).mean(axis=1, keepdims=True)
    xhat = (r - m) * rs
    gw = g * _param(weight, H)
    dx = rs * (gw - gw.mean(axis=1, keepdims=True)
               - xhat * (gw * xhat).mean(axis=1, keepdims=True))
    nshape = moved[len(moved) - len(axes):]
    dweight = (g * xhat).sum(axis=0).reshape(nshape)
    dbias = g.sum(axis=0).reshape(nshape)
    return _from_rows(dx, moved, axes), dweight, dbias


@overload
def rms_norm(x: npt.ArrayLike, weight: _Param = None, *, axis: _Axis = -1, eps: float = 1e-6,
             return_stats: Literal[False] = False) -> _Array: ...
@overload
def rms_norm(x: npt.ArrayLike, weight: _Param = None, *, axis: _Axis = -1, eps: float = 1e-6,
             return_stats: Literal[True]) -> Tuple[_Array, _Array]: ...
@overload
def rms_norm(x: npt.ArrayLike, weight: _Param = None, *, axis: _Axis = -1, eps: float = 1e-6,
             return_stats: bool = False) -> Union[_Array, Tuple[_Array, _Array]]: ...
def rms_norm(x: npt.ArrayLike, weight: _Param = None, *, axis: _Axis = -1, eps: float = 1e-6,
             return_stats: bool = False) -> Union[_Array, Tuple[_Array, _Array]]:
    """y = x / sqrt(mean(x**2) + eps) * weight over ``axis``.

    The reference of :func:`fastln.rms_norm`.

    Parameters
    ----------
    x : array_like
        Input, at least 1-D; any real dtype.
    weight : array_like, optional
        Gain of the normalized shape; None means 1.
    axis : int or tuple of int, default -1
        The normalized axes.
    eps : float, default 1e-6
        Added to the mean square.
    return_stats : bool, default False
        Also return ``rstd``.

    Returns
    -------
    y : ndarray of float64
        x's shape.
    rstd : ndarray of float64
        Only with ``return_stats=True``: ``1 / sqrt(mean(x**2) + eps)``, of
        x's shape without the normalized axes.

    Examples
    --------
    >>> from fastln import reference
    >>> reference.rms_norm([[3., 4.]], eps=0.0).round(4)
    array([[0.8485, 1.1314]])
    """
    x = np.asarray(x)
    axes = _axes(axis, x.ndim)
    r, moved = _to_rows(x, axes)
    H = r.shape[1]
    rstd = 1.0 / np.sqrt((r * r).mean(axis=1, keepdims=True) + eps)
    y = _from_rows(r * rstd * _param(weight, H), moved, axes)
    if not return_stats:
        return y
    return y, rstd.reshape(moved[:len(moved) - len(axes)])


def rms_norm_backward(dy: npt.ArrayLike, x: npt.ArrayLike, rstd: npt.ArrayLike,
                      weight: _Param = None, *, axis: _Axis = -1) -> Tuple[_Array, _Array]:
    """Gradients (dx, dweight) of rms_norm.

    The reference of :func:`fastln.rms_norm_backward`.

    Parameters
    ----------
    dy : array_like
        Gradient of the loss with respect to y, of x's shape.
    x : array_like
        The forward's input.
    rstd : array_like
        The forward's statistic: x's shape without the normalized axes.
    weight : array_like, optional
        The forward's gain; None means 1.
    axis : int or tuple of int, default -1
        The normalized axes.

    Returns
    -------
    dx : ndarray of float64
        x's shape.
    dweight : ndarray of float64
        The normalized shape.

    Examples
    --------
    >>> import numpy as np
    >>> from fastln import reference
    >>> x = np.array([[3., 4.]])
    >>> y, rstd = reference.rms_norm(x, return_stats=True)
    >>> dx, dweight = reference.rms_norm_backward(np.ones_like(x), x, rstd)
    >>> dx.shape, dweight.shape
    ((1, 2), (2,))
    """
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


@overload
def add_layer_norm(x: npt.ArrayLike, residual: npt.ArrayLike, weight: _Param = None,
                   bias: _Param = None, *, axis: _Axis = -1, eps: float = 1e-5,
                   return_stats: Literal[False] = False) -> Tuple[_Array, _Array]: ...
@overload
def add_layer_norm(x: npt.ArrayLike, residual: npt.ArrayLike, weight: _Param = None,
                   bias: _Param = None, *, axis: _Axis = -1, eps: float = 1e-5,
                   return_stats: Literal[True]) -> Tuple[_Array, _Array, _Array, _Array]: ...
@overload
def add_layer_norm(x: npt.ArrayLike, residual: npt.ArrayLike, weight: _Param = None,
                   bias: _Param = None, *, axis: _Axis = -1, eps: float = 1e-5,
                   return_stats: bool = False
                   ) -> Union[Tuple[_Array, _Array], Tuple[_Array, _Array, _Array, _Array]]: ...
def add_layer_norm(x: npt.ArrayLike, residual: npt.ArrayLike, weight: _Param = None,
                   bias: _Param = None, *, axis: _Axis = -1, eps: float = 1e-5,
                   return_stats: bool = False
                   ) -> Union[Tuple[_Array, _Array], Tuple[_Array, _Array, _Array, _Array]]:
    """(layer_norm(x + residual), x + residual), computed in float64.

    The reference of :func:`fastln.add_layer_norm`.

    Parameters
    ----------
    x, residual : array_like
        The two summands, of the same shape.
    weight, bias : array_like, optional
        Gain and bias of the normalized shape; None means 1 and 0.
    axis : int or tuple of int, default -1
        The normalized axes.
    eps : float, default 1e-5
        Added to the variance.
    return_stats : bool, default False
        Also return the ``mean`` and ``rstd`` of the sum.

    Returns
    -------
    y : ndarray of float64
        ``layer_norm(x + residual)``.
    s : ndarray of float64
        ``x + residual``.
    mean, rstd : ndarray of float64
        Only with ``return_stats=True``.

    Examples
    --------
    >>> from fastln import reference
    >>> y, s = reference.add_layer_norm([[1., 2., 3.]], [[0., 2., 4.]])
    >>> s
    array([[1., 4., 7.]])
    """
    s = np.asarray(x, np.float64) + np.asarray(residual, np.float64)
    if not return_stats:
        return layer_norm(s, weight, bias, axis=axis, eps=eps), s
    y, mean, rstd = layer_norm(s, weight, bias, axis=axis, eps=eps, return_stats=True)
    return y, s, mean, rstd
