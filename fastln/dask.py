"""fastln on dask arrays: Layer Normalization and RMSNorm for data beyond one machine.

``fastln.dask.layer_norm`` and ``fastln.dask.rms_norm`` take a dask array and
return a lazy dask array of the same shape and chunks: every block is
normalized by :func:`fastln.layer_norm` / :func:`fastln.rms_norm` where it lies
(a thread, a process or a ``dask.distributed`` worker). Rows are independent,
so the batch axes may be chunked freely; the normalized axes must be whole in
each block. Where they are split, the array is rechunked (with a
:class:`RechunkWarning`) so that they are.

``import fastln`` does not import this module (nor dask): ``import
fastln.dask``, or naming ``fastln.dask`` after ``import fastln``, loads it. It
needs dask (``pip install "dask[array]"``), and fastln installed wherever the
blocks run. weight and bias may be NumPy arrays, array-likes, dask arrays or
CPU torch tensors that do not require grad.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Dict, Optional, Sequence, SupportsIndex, Tuple, Union

import numpy as np
import numpy.typing as npt

try:
    import dask
    import dask.array as da
except ImportError as _e:  # pragma: no cover
    raise ImportError('fastln.dask needs dask: pip install "dask[array]"') from _e

import fastln
from fastln import _api
from fastln._api import _normalize_axes

__all__ = ["layer_norm", "rms_norm", "RechunkWarning"]

# a weight or bias argument
_Param = Optional[Union[npt.ArrayLike, da.Array]]
_Axis = Union[SupportsIndex, Sequence[SupportsIndex]]


class RechunkWarning(da.PerformanceWarning, UserWarning):
    """x was split across chunks along a normalized axis and had to be rechunked."""


def _param(p: Any, name: str) -> Optional[npt.NDArray[Any]]:
    """weight / bias as a NumPy array (a dask array is computed), or None."""
    if p is None:
        return None
    return _api._asarray(p.compute() if isinstance(p, da.Array) else p, name)


def _prepare(func: Callable[..., Any], x: Any, params: Dict[str, Any], axis: Any, eps: float
             ) -> Tuple[da.Array, Dict[str, Any], Tuple[int, ...], Any]:
    """Checks the arguments eagerly; returns (x with whole normalized axes, params, axes, meta)."""
    if not isinstance(x, da.Array):
        raise TypeError(f"x must be a dask array, got {type(x).__module__}.{type(x).__name__}; "
                        f"use fastln.{func.__name__} for NumPy arrays")
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension")
    axes = _normalize_axes(axis, x.ndim)
    if any(x.shape[a] == 0 for a in axes):
        raise ValueError(f"x has size 0 along the normalized axis {axes} (shape {x.shape}); "
                         f"nothing to normalize")
    params = {k: _param(p, k) for k, p in params.items()}
    norm_shape = tuple(x.shape[a] for a in axes)
    where = f"axis {axes[0]}" if len(axes) == 1 else f"axes {axes}"
    for k, p in params.items():
        if p is not None and p.shape != norm_shape:
            raise ValueError(f"{k} has shape {p.shape}, expected the normalized shape "
                             f"{norm_shape}: x has shape {x.shape}, normalized over {where}")
    # fastln itself checks dtypes and eps on an input with x's normalized shape
    # and no rows; its (empty) result is the output's meta.
    probe = np.zeros(tuple(n if i in axes else 0 for i, n in enumerate(x.shape)), x.dtype)
    meta = func(probe, **params, axis=axes, eps=eps)
    split = [a for a in axes if len(x.chunks[a]) > 1]
    if split:
        chunks: Dict[int, Union[int, str]] = {a: -1 for a in axes}
        block_bytes = x.dtype.itemsize * math.prod(
            x.shape[i] if i in axes else max(c, default=0) for i, c in enumerate(x.chunks))
        if block_bytes > dask.utils.parse_bytes(dask.config.get("array.chunk-size")):
            chunks.update({i: "auto" for i in range(x.ndim) if i not in axes})
        warnings.warn(f"x is split across chunks along the normalized axis {tuple(split)} "
                      f"(chunks {x.chunksize}); fastln.dask rechunks it so that each block "
                      f"holds whole rows. Chunk x that way yourself, e.g. "
                      f"x.rechunk({dict.fromkeys(split, -1)}), to avoid this.",
                      RechunkWarning, stacklevel=3)
        x = x.rechunk(chunks)
    return x, params, axes, meta


def _map_blocks(x: Any, func: Callable[..., Any], params: Dict[str, Any],
                axes: Tuple[int, ...], eps: float, meta: Any) -> da.Array:
    """func on every block of x (x is Any here: dask's annotations of
    map_blocks do not take a function as the first argument)."""
    return x.map_blocks(func, **params, axis=axes, eps=eps, dtype=meta.dtype, meta=meta)


def layer_norm(x: da.Array, weight: _Param = None, bias: _Param = None, *,
               axis: _Axis = -1, eps: float = 1e-5) -> da.Array:
    """Layer Normalization of a dask array, block by block with :func:`fastln.layer_norm`.

    Parameters
    ----------
    x : dask.array.Array
        The input. Float16, bfloat16, float32 and float64 keep their dtype;
        integers and bool give float64 (as :func:`fastln.layer_norm`).
    weight, bias : array_like or dask.array.Array, optional
        Gain and bias with the shape of the normalized axes, in the order given
        in ``axis``. A dask array is computed now (they are small) and shipped
        to every block as a NumPy array; a torch tensor must not require grad.
    axis : int or tuple of ints, default -1
        The normalized axes. Where x is chunked along one of them, x is
        rechunked so that they are whole in each block, with a
        :class:`RechunkWarning`; the other axes keep their chunks unless a
        block would then pass dask's ``array.chunk-size``, where dask picks
        them ("auto").
    eps : float, default 1e-5
        Added to the variance.

    Returns
    -------
    dask.array.Array
        y, lazy, of x's shape. There is no ``out=`` (nor ``return_stats``): the
        result is computed by ``.compute()``, ``dask.array.store`` or the like.

    Raises
    ------
    TypeError
        x is not a dask array (use :func:`fastln.layer_norm` for NumPy
        arrays), or a dtype fastln does not take.
    ValueError
        A bad axis or eps, or weight/bias of the wrong shape (checked now,
        not at compute time).

    Examples
    --------
    >>> import dask.array as da, numpy as np, fastln.dask
    >>> x = da.random.random((10_000, 512), chunks=(2_500, 512)).astype(np.float32)
    >>> y = fastln.dask.layer_norm(x, np.ones(512, np.float32), np.zeros(512, np.float32))
    >>> y.dtype, y.chunks == x.chunks
    (dtype('float32'), True)
    >>> float(abs(y.mean(axis=-1)).max().compute()) < 1e-5
    True
    """
    x, p, axes, meta = _prepare(fastln.layer_norm, x, {"weight": weight, "bias": bias},
                                axis, eps)
    return _map_blocks(x, fastln.layer_norm, p, axes, eps, meta)


def rms_norm(x: da.Array, weight: _Param = None, *, axis: _Axis = -1,
             eps: float = 1e-6) -> da.Array:
    """RMSNorm of a dask array, block by block with :func:`fastln.rms_norm`.

    Parameters
    ----------
    x : dask.array.Array
        The input; dtypes as in :func:`layer_norm`.
    weight : array_like or dask.array.Array, optional
        Gain with the shape of the normalized axes, in the order given in
        ``axis`` (a dask array is computed now).
    axis : int or tuple of ints, default -1
        The normalized axes; split ones are rechunked with a
        :class:`RechunkWarning`.
    eps : float, default 1e-6
        Added to the mean square.

    Returns
    -------
    dask.array.Array
        y, lazy, of x's shape (no ``out=``: dask arrays are lazy).

    Raises
    ------
    TypeError, ValueError
        As :func:`layer_norm`.

    Examples
    --------
    >>> import dask.array as da, numpy as np, fastln.dask
    >>> x = da.ones((4, 3, 8), chunks=(2, 3, 8))
    >>> y = fastln.dask.rms_norm(x, axis=(1, 2))
    >>> np.allclose(y.compute(), 1.0, atol=1e-5)
    True
    """
    x, p, axes, meta = _prepare(fastln.rms_norm, x, {"weight": weight}, axis, eps)
    return _map_blocks(x, fastln.rms_norm, p, axes, eps, meta)
