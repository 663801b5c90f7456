"""fastln on dask arrays: Layer Normalization, RMSNorm and recurrent networks
for data beyond one machine.

``fastln.dask.layer_norm`` and ``fastln.dask.rms_norm`` take a dask array and
return a lazy dask array of the same shape and chunks: every block is
normalized by :func:`fastln.layer_norm` / :func:`fastln.rms_norm` where it lies
(a thread, a process or a ``dask.distributed`` worker). Rows are independent,
so the batch axes may be chunked freely; the normalized axes must be whole in
each block. Where they are split, the array is rechunked (with a
:class:`RechunkWarning`) so that they are.

``fastln.dask.rnn_forward`` runs a :mod:`fastln.rnn` model over a dask array
of sequences chunked along the batch: sequences are independent, so each
block of whole sequences runs ``model.forward`` where it lies. The model is
one key of the graph that every block depends on, so a distributed scheduler
sends it to each worker once.

``import fastln`` does not import this module (nor dask): ``import
fastln.dask``, or naming ``fastln.dask`` after ``import fastln``, loads it. It
needs dask (``pip install "fastln[dask]"``), and fastln installed wherever the
blocks run. weight and bias may be NumPy arrays, array-likes, dask arrays or
CPU torch tensors that do not require grad.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, SupportsIndex, Tuple, Union

import numpy as np
import numpy.typing as npt

from fastln import _optional

try:
    import dask
    import dask.array as da
except ImportError:  # pragma: no cover
    raise _optional.missing("dask", "fastln.dask") from None

from fastln import _norms, _validate
from fastln.rnn import RecurrentModel

__all__ = ["layer_norm", "rms_norm", "rnn_forward", "RechunkWarning"]

# a weight or bias argument
_Param = Optional[Union[npt.ArrayLike, da.Array]]
_Axis = Union[SupportsIndex, Sequence[SupportsIndex]]


class RechunkWarning(da.PerformanceWarning, UserWarning):
    """x was split across chunks along an axis that must be whole in each block
    (a normalized axis, or the time or feature axis of a sequence) and had to be
    rechunked."""


def _param(p: Any, name: str) -> Optional[npt.NDArray[Any]]:
    """weight / bias as a NumPy array (a dask array is computed), or None."""
    if p is None:
        return None
    return _validate.asarray(p.compute() if isinstance(p, da.Array) else p, name)


def _prepare(func: Callable[..., Any], x: Any, params: Dict[str, Any], axis: Any, eps: float,
             stacklevel: int = 4) -> Tuple[da.Array, Dict[str, Any], Tuple[int, ...], Any]:
    """Checks the arguments eagerly; returns (x with whole normalized axes, params, axes, meta).
    A RechunkWarning points stacklevel frames up: at the caller of the public function."""
    if not isinstance(x, da.Array):
        raise TypeError(f"x must be a dask array, got {type(x).__module__}.{type(x).__name__}; "
                        f"use fastln.{func.__name__} for NumPy arrays")
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension")
    axes = _validate.normalize_axes(axis, x.ndim)
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
    x = _whole(x, axes, "the normalized axis", "rows", stacklevel=stacklevel)
    return x, params, axes, meta


def _whole(x: da.Array, axes: Tuple[int, ...], what: str, unit: str, stacklevel: int
           ) -> da.Array:
    """x with the given axes whole in each block: x itself, or x rechunked with a
    RechunkWarning (at stacklevel, the caller's caller). The other axes keep their
    chunks unless a block would then pass dask's array.chunk-size, where dask
    picks them ("auto")."""
    split = [a for a in axes if len(x.chunks[a]) > 1]
    if not split:
        return x
    chunks: Dict[int, Union[int, str]] = {a: -1 for a in axes}
    block_bytes = x.dtype.itemsize * math.prod(
        x.shape[i] if i in axes else max(c, default=0) for i, c in enumerate(x.chunks))
    if block_bytes > dask.utils.parse_bytes(dask.config.get("array.chunk-size")):
        chunks.update({i: "auto" for i in range(x.ndim) if i not in axes})
    warnings.warn(f"x is split across chunks along {what} {tuple(split)} "
                  f"(chunks {x.chunksize}); fastln.dask rechunks it so that each block "
                  f"holds whole {unit}. Chunk x that way yourself, e.g. "
                  f"x.rechunk({dict.fromkeys(split, -1)}), to avoid this.",
                  RechunkWarning, stacklevel=stacklevel)
    return x.rechunk(chunks)


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
    x, p, axes, meta = _prepare(_norms.layer_norm, x, {"weight": weight, "bias": bias},
                                axis, eps)
    return _map_blocks(x, _norms.layer_norm, p, axes, eps, meta)


@_validate.takes_no_bias
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
    # one frame more than layer_norm's: that of the wrapper of _validate.takes_no_bias
    x, p, axes, meta = _prepare(_norms.rms_norm, x, {"weight": weight}, axis, eps,
                                stacklevel=5)
    return _map_blocks(x, _norms.rms_norm, p, axes, eps, meta)


# ------------------------------------------------------------------ recurrent networks

def _rnn_block(x: npt.NDArray[Any], model: RecurrentModel[Any],
               lengths: Optional[npt.NDArray[Any]] = None) -> npt.NDArray[Any]:
    """model's y over one block of whole sequences (the final state is dropped)."""
    if x.shape[0 if model.batch_first else 1] == 0:   # an empty chunk of the batch
        return np.empty(x.shape[:2] + (model.num_directions * model.hidden_size,),
                        model.dtype)
    return model.forward(x, lengths=lengths, cache=False)[0]


def _snapshot(model: RecurrentModel[Any]) -> RecurrentModel[Any]:
    """A copy of model with copies of its parameters and none of what it keeps
    for backward (cache, scratch, gradients): what the graph holds. Later
    changes to model's parameters do not reach a lazy result."""
    snap = model.to(model.dtype)
    snap.grads = {}   # forward(cache=False) never reads them
    return snap


def rnn_forward(model: RecurrentModel[Any], x: da.Array,
                lengths: Optional[Union[npt.ArrayLike, da.Array]] = None) -> da.Array:
    """A :mod:`fastln.rnn` model's output over a dask array of sequences, block by block.

    Each block of whole sequences runs ``model.forward(block,
    lengths=block_lengths, cache=False)[0]`` where it lies. Sequences are
    independent, so x may be chunked along the batch axis B; the time and
    feature axes must be whole in each block.

    Parameters
    ----------
    model : LNLSTM, LNGRU, LNRNN, LSTM, GRU or RNN
        The model, in any configuration (layers, ``bidirectional``,
        ``batch_first``). Its parameters are copied now, into one key of the
        graph that every block depends on: a distributed scheduler sends the
        model to each worker once, and later changes to ``model`` do not
        change the result.
    x : dask.array.Array, shape (T, B, input_size), or (B, T, input_size) with batch_first
        The input sequences, of a dtype ``model.forward`` takes: the
        model's (a bfloat16 model also takes float32). Where x is chunked
        along T or the features, it is rechunked so that they are whole in
        each block, with a :class:`RechunkWarning`; B keeps its chunks unless
        a block would then pass dask's ``array.chunk-size``, where dask picks
        them ("auto").
    lengths : array_like of int or dask.array.Array, shape (B,), optional
        The length of each sequence of a padded batch, in [1, T], as in
        ``model.forward``. A dask array is rechunked to x's chunks along B;
        its values are checked when the blocks run, those of other arrays
        now.

    Returns
    -------
    dask.array.Array
        y, lazy, of shape (T, B, D * hidden_size) (or (B, T, D *
        hidden_size) with batch_first), D = 2 if bidirectional else 1, with
        x's chunks along B and the model's dtype. The final state is not
        returned: each block's state is dropped where it is computed.

    Raises
    ------
    TypeError
        model is not a :mod:`fastln.rnn` model; x is not a dask array (use
        ``model.forward`` for NumPy arrays), or of a dtype the model does not
        take; lengths not integers.
    ValueError
        x not 3-D with ``input_size`` features, without a step or a
        sequence, or with unknown chunk sizes; lengths not of shape (B,), or
        (NumPy lengths) outside [1, T].

    Examples
    --------
    >>> import dask.array as da, numpy as np, fastln.dask
    >>> from fastln.rnn import LNLSTM
    >>> m = LNLSTM(input_size=8, hidden_size=16, seed=0)
    >>> x = da.random.default_rng(0).standard_normal((12, 400, 8), chunks=(12, 100, 8),
    ...                                               dtype=np.float32)
    >>> lengths = np.arange(400) % 12 + 1
    >>> y = fastln.dask.rnn_forward(m, x, lengths)
    >>> y.shape, y.chunks[1], y.dtype
    ((12, 400, 16), (100, 100, 100, 100), dtype('float32'))
    >>> want, _ = m.forward(x.compute(), lengths=lengths, cache=False)
    >>> bool(np.allclose(y.compute(), want, rtol=1e-5, atol=1e-6))
    True
    """
    if not isinstance(model, RecurrentModel):
        raise TypeError(f"model must be a fastln.rnn model (LNLSTM, LNGRU, LNRNN, LSTM, GRU "
                        f"or RNN), got {type(model).__module__}.{type(model).__name__}")
    if not isinstance(x, da.Array):
        raise TypeError(f"x must be a dask array, got {type(x).__module__}.{type(x).__name__}; "
                        f"use model.forward(x, cache=False) for NumPy arrays")
    I = model.input_size
    order = f"(B, T, {I})" if model.batch_first else f"(T, B, {I})"
    if x.ndim != 3 or x.shape[2] != I:
        raise ValueError(f"x must have shape {order} (input_size {I}), got {x.shape}")
    if any(math.isnan(n) for n in x.shape):
        raise ValueError(f"x has unknown chunk sizes (shape {x.shape}); "
                         f"call x.compute_chunk_sizes() first")
    t_axis, b_axis = (1, 0) if model.batch_first else (0, 1)
    T, B = x.shape[t_axis], x.shape[b_axis]
    if T == 0 or B == 0:
        raise ValueError(f"x must have at least one time step and one sequence, "
                         f"got shape {x.shape}")
    # the model checks x's dtype itself, on one step of one sequence
    model._input(np.zeros((1, 1, I), x.dtype), "x", I)
    if isinstance(lengths, da.Array):
        if lengths.shape != (B,):
            raise ValueError(f"lengths must have shape (B,) = ({B},), got {lengths.shape}")
        if lengths.dtype == np.bool_ or not np.issubdtype(lengths.dtype, np.integer):
            raise TypeError(f"lengths must hold integers, got dtype {lengths.dtype}")
    elif lengths is not None:
        lengths = model._lengths(lengths, T, B)   # shape, dtype and values, now
    x = _whole(x, (t_axis, 2), "the time or feature axis", "sequences", stacklevel=3)
    index = "bti" if model.batch_first else "tbi"
    snap = _snapshot(model)
    key = f"{type(model).__name__}-{dask.base.tokenize(type(snap), vars(snap))}"
    args: List[Any] = [x, index, dask.delayed(snap, name=key, pure=True, traverse=False), None]
    if lengths is not None:
        b_chunks = (x.chunks[b_axis],)
        lens = (lengths.rechunk(b_chunks) if isinstance(lengths, da.Array)
                else da.from_array(lengths, chunks=b_chunks))
        args += [lens, "b"]
    meta = np.empty((0, 0, 0), model.dtype)
    y: da.Array = da.blockwise(_rnn_block, index, *args, token="rnn_forward",
                               adjust_chunks={"i": model.num_directions * model.hidden_size},
                               dtype=model.dtype, meta=meta)
    return y
