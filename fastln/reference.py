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
from typing import (
    TYPE_CHECKING,
    List,
    Literal,
    Optional,
    Sequence,
    SupportsIndex,
    Tuple,
    Union,
    overload,
)

import numpy as np

from fastln import _validate

if TYPE_CHECKING:
    import numpy.typing as npt
    from typing_extensions import TypeAlias

    _Array: TypeAlias = npt.NDArray[np.float64]
    _Axis: TypeAlias = Union[SupportsIndex, Sequence[SupportsIndex]]
    _Param: TypeAlias = Optional[npt.ArrayLike]

__all__ = [
    "layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward",
    "add_layer_norm", "add_rms_norm", "add_layer_norm_backward", "add_rms_norm_backward",
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
@_validate.takes_no_bias
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


def _sum(x: npt.ArrayLike, residual: npt.ArrayLike, input_bias: _Param,
         axes: Tuple[int, ...]) -> _Array:
    """(x + residual) + input_bias in float64: residual broadcast to x's shape by
    NumPy's rules, input_bias (of the normalized shape, in the order of axes)
    added to every row."""
    xa = np.asarray(x, np.float64)
    s = xa + np.broadcast_to(np.asarray(residual, np.float64), xa.shape)
    if input_bias is None:
        return s
    r, moved = _to_rows(s, axes)
    return _from_rows(r + _param(input_bias, r.shape[1]), moved, axes)


def _unbroadcast(g: _Array, shape: Tuple[int, ...]) -> _Array:
    """g summed over the axes along which an array of ``shape`` broadcast to g's shape."""
    lead = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(lead))) if lead else g
    keep = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return (g.sum(axis=keep, keepdims=True) if keep else g).reshape(shape)


def _sum_grads(dx: _Array, ds: Optional[npt.ArrayLike], axes: Tuple[int, ...],
               input_bias_grad: bool, residual_shape: Optional[Sequence[SupportsIndex]]
               ) -> List[_Array]:
    """[dsum, (dinput_bias), (dresidual)] from the norm's dx and the incoming ds."""
    dsum = dx if ds is None else dx + np.asarray(ds, np.float64)
    grads = [dsum]
    if input_bias_grad:
        r, moved = _to_rows(dsum, axes)
        grads.append(r.sum(axis=0).reshape(moved[len(moved) - len(axes):]))
    if residual_shape is not None:
        grads.append(_unbroadcast(dsum, tuple(operator.index(n) for n in residual_shape)))
    return grads


@overload
def add_layer_norm(x: npt.ArrayLike, residual: npt.ArrayLike, weight: _Param = None,
                   bias: _Param = None, *, input_bias: _Param = None, axis: _Axis = -1,
                   eps: float = 1e-5, return_stats: Literal[False] = False
                   ) -> Tuple[_Array, _Array]: ...
@overload
def add_layer_norm(x: npt.ArrayLike, residual: npt.ArrayLike, weight: _Param = None,
                   bias: _Param = None, *, input_bias: _Param = None, axis: _Axis = -1,
                   eps: float = 1e-5, return_stats: Literal[True]
                   ) -> Tuple[_Array, _Array, _Array, _Array]: ...
@overload
def add_layer_norm(x: npt.ArrayLike, residual: npt.ArrayLike, weight: _Param = None,
                   bias: _Param = None, *, input_bias: _Param = None, axis: _Axis = -1,
                   eps: float = 1e-5, return_stats: bool = False
                   ) -> Union[Tuple[_Array, _Array], Tuple[_Array, _Array, _Array, _Array]]: ...
def add_layer_norm(x: npt.ArrayLike, residual: npt.ArrayLike, weight: _Param = None,
                   bias: _Param = None, *, input_bias: _Param = None, axis: _Axis = -1,
                   eps: float = 1e-5, return_stats: bool = False
                   ) -> Union[Tuple[_Array, _Array], Tuple[_Array, _Array, _Array, _Array]]:
    """(layer_norm(s), s) with s = (x + residual) + input_bias, in float64.

    The reference of :func:`fastln.add_layer_norm`.

    Parameters
    ----------
    x : array_like
        The first summand.
    residual : array_like
        The second summand: x's shape, or an array that broadcasts to it
        (NumPy's rules; fastln allows broadcasting over the batch axes only).
    weight, bias : array_like, optional
        Gain and bias of the normalized shape; None means 1 and 0.
    input_bias : array_like, optional
        A vector of the normalized shape added into the sum; None means 0.
    axis : int or tuple of int, default -1
        The normalized axes.
    eps : float, default 1e-5
        Added to the variance.
    return_stats : bool, default False
        Also return the ``mean`` and ``rstd`` of s.

    Returns
    -------
    y : ndarray of float64
        ``layer_norm(s)``, of x's shape.
    s : ndarray of float64
        ``(x + residual) + input_bias``, of x's shape.
    mean, rstd : ndarray of float64
        Only with ``return_stats=True``: s's statistics, of x's shape without
        the normalized axes.

    Examples
    --------
    >>> from fastln import reference
    >>> y, s = reference.add_layer_norm([[1., 2., 3.]], [[0., 2., 4.]])
    >>> s
    array([[1., 4., 7.]])
    >>> y, s = reference.add_layer_norm([[1., 2., 3.], [4., 5., 6.]], [1., 1., 1.],
    ...                                 input_bias=[0., 0., 1.])
    >>> s
    array([[2., 3., 5.],
           [5., 6., 8.]])
    """
    s = _sum(x, residual, input_bias, _axes(axis, np.ndim(x)))
    if not return_stats:
        return layer_norm(s, weight, bias, axis=axis, eps=eps), s
    y, mean, rstd = layer_norm(s, weight, bias, axis=axis, eps=eps, return_stats=True)
    return y, s, mean, rstd


@overload
def add_rms_norm(x: npt.ArrayLike, residual: npt.ArrayLike, weight: _Param = None, *,
                 input_bias: _Param = None, axis: _Axis = -1, eps: float = 1e-6,
                 return_stats: Literal[False] = False) -> Tuple[_Array, _Array]: ...
@overload
def add_rms_norm(x: npt.ArrayLike, residual: npt.ArrayLike, weight: _Param = None, *,
                 input_bias: _Param = None, axis: _Axis = -1, eps: float = 1e-6,
                 return_stats: Literal[True]) -> Tuple[_Array, _Array, _Array]: ...
@overload
def add_rms_norm(x: npt.ArrayLike, residual: npt.ArrayLike, weight: _Param = None, *,
                 input_bias: _Param = None, axis: _Axis = -1, eps: float = 1e-6,
                 return_stats: bool = False
                 ) -> Union[Tuple[_Array, _Array], Tuple[_Array, _Array, _Array]]: ...
@_validate.takes_no_bias
def add_rms_norm(x: npt.ArrayLike, residual: npt.ArrayLike, weight: _Param = None, *,
                 input_bias: _Param = None, axis: _Axis = -1, eps: float = 1e-6,
                 return_stats: bool = False
                 ) -> Union[Tuple[_Array, _Array], Tuple[_Array, _Array, _Array]]:
    """(rms_norm(s), s) with s = (x + residual) + input_bias, in float64.

    The reference of :func:`fastln.add_rms_norm`.

    Parameters
    ----------
    x : array_like
        The first summand.
    residual : array_like
        The second summand: x's shape, or an array that broadcasts to it.
    weight : array_like, optional
        Gain of the normalized shape; None means 1.
    input_bias : array_like, optional
        A vector of the normalized shape added into the sum; None means 0.
    axis : int or tuple of int, default -1
        The normalized axes.
    eps : float, default 1e-6
        Added to the mean square.
    return_stats : bool, default False
        Also return the ``rstd`` of s.

    Returns
    -------
    y : ndarray of float64
        ``rms_norm(s)``, of x's shape.
    s : ndarray of float64
        ``(x + residual) + input_bias``, of x's shape.
    rstd : ndarray of float64
        Only with ``return_stats=True``: ``1 / sqrt(mean(s**2) + eps)``, of
        x's shape without the normalized axes.

    Examples
    --------
    >>> from fastln import reference
    >>> y, s, rstd = reference.add_rms_norm([[1., 2.]], [[2., 2.]], eps=0.0,
    ...                                     return_stats=True)
    >>> s, y.round(4), rstd
    (array([[3., 4.]]), array([[0.8485, 1.1314]]), array([0.28284271]))
    """
    s = _sum(x, residual, input_bias, _axes(axis, np.ndim(x)))
    if not return_stats:
        return rms_norm(s, weight, axis=axis, eps=eps), s
    y, rstd = rms_norm(s, weight, axis=axis, eps=eps, return_stats=True)
    return y, s, rstd


@overload
def add_layer_norm_backward(dy: npt.ArrayLike, s: npt.ArrayLike, mean: npt.ArrayLike,
                            rstd: npt.ArrayLike, weight: _Param = None, *,
                            ds: Optional[npt.ArrayLike] = None, axis: _Axis = -1,
                            input_bias_grad: Literal[False] = False,
                            residual_shape: None = None) -> Tuple[_Array, _Array, _Array]: ...
@overload
def add_layer_norm_backward(dy: npt.ArrayLike, s: npt.ArrayLike, mean: npt.ArrayLike,
                            rstd: npt.ArrayLike, weight: _Param = None, *,
                            ds: Optional[npt.ArrayLike] = None, axis: _Axis = -1,
                            input_bias_grad: Literal[True], residual_shape: None = None
                            ) -> Tuple[_Array, _Array, _Array, _Array]: ...
@overload
def add_layer_norm_backward(dy: npt.ArrayLike, s: npt.ArrayLike, mean: npt.ArrayLike,
                            rstd: npt.ArrayLike, weight: _Param = None, *,
                            ds: Optional[npt.ArrayLike] = None, axis: _Axis = -1,
                            input_bias_grad: Literal[False] = False,
                            residual_shape: Sequence[SupportsIndex]
                            ) -> Tuple[_Array, _Array, _Array, _Array]: ...
@overload
def add_layer_norm_backward(dy: npt.ArrayLike, s: npt.ArrayLike, mean: npt.ArrayLike,
                            rstd: npt.ArrayLike, weight: _Param = None, *,
                            ds: Optional[npt.ArrayLike] = None, axis: _Axis = -1,
                            input_bias_grad: Literal[True],
                            residual_shape: Sequence[SupportsIndex]
                            ) -> Tuple[_Array, _Array, _Array, _Array, _Array]: ...
@overload
def add_layer_norm_backward(dy: npt.ArrayLike, s: npt.ArrayLike, mean: npt.ArrayLike,
                            rstd: npt.ArrayLike, weight: _Param = None, *,
                            ds: Optional[npt.ArrayLike] = None, axis: _Axis = -1,
                            input_bias_grad: bool = False,
                            residual_shape: Optional[Sequence[SupportsIndex]] = None
                            ) -> Tuple[_Array, ...]: ...
def add_layer_norm_backward(dy: npt.ArrayLike, s: npt.ArrayLike, mean: npt.ArrayLike,
                            rstd: npt.ArrayLike, weight: _Param = None, *,
                            ds: Optional[npt.ArrayLike] = None, axis: _Axis = -1,
                            input_bias_grad: bool = False,
                            residual_shape: Optional[Sequence[SupportsIndex]] = None
                            ) -> Tuple[_Array, ...]:
    """Gradients of add_layer_norm: (dsum, dweight, dbias[, dinput_bias][, dresidual]).

    The reference of :func:`fastln.add_layer_norm_backward`. With s = (x +
    residual) + input_bias and y = layer_norm(s), the gradient of the sum,
    ``dsum = dL/ds``, is layer_norm's dx plus ``ds``, the gradient that
    reaches s by another way; it is the gradient of x, and of residual and
    input_bias summed over the axes along which they broadcast.

    Parameters
    ----------
    dy : array_like
        Gradient of the loss with respect to y, of s's shape.
    s : array_like
        The sum the forward normalized.
    mean, rstd : array_like
        s's statistics: s's shape without the normalized axes.
    weight : array_like, optional
        The forward's gain, of the normalized shape; None means 1.
    ds : array_like, optional
        An incoming gradient of s, of s's shape, added into dsum; None means 0.
    axis : int or tuple of int, default -1
        The normalized axes.
    input_bias_grad : bool, default False
        Also return the gradient of input_bias: dsum summed over the batch
        axes.
    residual_shape : tuple of int, optional
        Also return the gradient of a residual of this shape (broadcast to
        s's shape in the forward): dsum summed over the broadcast axes.

    Returns
    -------
    dsum : ndarray of float64
        s's shape: the gradient of x (and of a residual of x's shape).
    dweight, dbias : ndarray of float64
        The normalized shape.
    dinput_bias : ndarray of float64
        Only with ``input_bias_grad=True``: the normalized shape.
    dresidual : ndarray of float64
        Only with ``residual_shape``: of that shape.

    Examples
    --------
    >>> import numpy as np
    >>> from fastln import reference
    >>> x, r = np.array([[1., 2., 3.], [2., 4., 7.]]), np.array([1., 0., -1.])
    >>> y, s, mean, rstd = reference.add_layer_norm(x, r, return_stats=True)
    >>> dsum, dweight, dbias, dr = reference.add_layer_norm_backward(
    ...     np.zeros_like(y), s, mean, rstd, ds=np.ones_like(y), residual_shape=r.shape)
    >>> dsum, dr
    (array([[1., 1., 1.],
           [1., 1., 1.]]), array([2., 2., 2.]))
    """
    axes = _axes(axis, np.ndim(s))
    dx, dweight, dbias = layer_norm_backward(dy, s, mean, rstd, weight, axis=axis)
    dsum, *rest = _sum_grads(dx, ds, axes, input_bias_grad, residual_shape)
    return (dsum, dweight, dbias, *rest)


@overload
def add_rms_norm_backward(dy: npt.ArrayLike, s: npt.ArrayLike, rstd: npt.ArrayLike,
                          weight: _Param = None, *, ds: Optional[npt.ArrayLike] = None,
                          axis: _Axis = -1, input_bias_grad: Literal[False] = False,
                          residual_shape: None = None) -> Tuple[_Array, _Array]: ...
@overload
def add_rms_norm_backward(dy: npt.ArrayLike, s: npt.ArrayLike, rstd: npt.ArrayLike,
                          weight: _Param = None, *, ds: Optional[npt.ArrayLike] = None,
                          axis: _Axis = -1, input_bias_grad: Literal[True],
                          residual_shape: None = None) -> Tuple[_Array, _Array, _Array]: ...
@overload
def add_rms_norm_backward(dy: npt.ArrayLike, s: npt.ArrayLike, rstd: npt.ArrayLike,
                          weight: _Param = None, *, ds: Optional[npt.ArrayLike] = None,
                          axis: _Axis = -1, input_bias_grad: Literal[False] = False,
                          residual_shape: Sequence[SupportsIndex]
                          ) -> Tuple[_Array, _Array, _Array]: ...
@overload
def add_rms_norm_backward(dy: npt.ArrayLike, s: npt.ArrayLike, rstd: npt.ArrayLike,
                          weight: _Param = None, *, ds: Optional[npt.ArrayLike] = None,
                          axis: _Axis = -1, input_bias_grad: Literal[True],
                          residual_shape: Sequence[SupportsIndex]
                          ) -> Tuple[_Array, _Array, _Array, _Array]: ...
@overload
def add_rms_norm_backward(dy: npt.ArrayLike, s: npt.ArrayLike, rstd: npt.ArrayLike,
                          weight: _Param = None, *, ds: Optional[npt.ArrayLike] = None,
                          axis: _Axis = -1, input_bias_grad: bool = False,
                          residual_shape: Optional[Sequence[SupportsIndex]] = None
                          ) -> Tuple[_Array, ...]: ...
def add_rms_norm_backward(dy: npt.ArrayLike, s: npt.ArrayLike, rstd: npt.ArrayLike,
                          weight: _Param = None, *, ds: Optional[npt.ArrayLike] = None,
                          axis: _Axis = -1, input_bias_grad: bool = False,
                          residual_shape: Optional[Sequence[SupportsIndex]] = None
                          ) -> Tuple[_Array, ...]:
    """Gradients of add_rms_norm: (dsum, dweight[, dinput_bias][, dresidual]).

    The reference of :func:`fastln.add_rms_norm_backward`: ``dsum`` is
    rms_norm's dx plus ``ds``, as in :func:`add_layer_norm_backward`.

    Parameters
    ----------
    dy : array_like
        Gradient of the loss with respect to y, of s's shape.
    s : array_like
        The sum the forward normalized.
    rstd : array_like
        s's statistic: s's shape without the normalized axes.
    weight : array_like, optional
        The forward's gain; None means 1.
    ds : array_like, optional
        An incoming gradient of s, added into dsum; None means 0.
    axis : int or tuple of int, default -1
        The normalized axes.
    input_bias_grad : bool, default False
        Also return the gradient of input_bias.
    residual_shape : tuple of int, optional
        Also return the gradient of a residual of this (broadcast) shape.

    Returns
    -------
    dsum : ndarray of float64
        s's shape.
    dweight : ndarray of float64
        The normalized shape.
    dinput_bias : ndarray of float64
        Only with ``input_bias_grad=True``.
    dresidual : ndarray of float64
        Only with ``residual_shape``.

    Examples
    --------
    >>> import numpy as np
    >>> from fastln import reference
    >>> x = np.array([[3., 4.], [1., -1.]])
    >>> y, s, rstd = reference.add_rms_norm(x, np.zeros(2), return_stats=True)
    >>> dsum, dweight, dbias = reference.add_rms_norm_backward(
    ...     np.zeros_like(y), s, rstd, ds=x, input_bias_grad=True)
    >>> dbias
    array([4., 3.])
    """
    axes = _axes(axis, np.ndim(s))
    dx, dweight = rms_norm_backward(dy, s, rstd, weight, axis=axis)
    dsum, *rest = _sum_grads(dx, ds, axes, input_bias_grad, residual_shape)
    return (dsum, dweight, *rest)
