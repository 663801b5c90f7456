"""The general path of the public functions: any arguments, checked and canonicalized.

fastln._norms and fastln._add_norms handle the common case (C-contiguous
float32/float64 normalized over the last axis) themselves and call here for
everything else: several axes, any layout or byte order, integer and bool
dtypes, lists, torch tensors, out= of any layout. This module reads the
arguments (fastln._validate), presents them as the kernels' canonical rows
(fastln._layout), calls the kernels of fastln._rows, and puts the results back
in the caller's shape and dtype (or into ``out``). Every error a user can
trigger is raised here or in fastln._validate, and names the argument at
fault.

Each function takes ``rms``: False for LayerNorm, True for RMSNorm (no bias,
no mean). The results are NumPy arrays; an out= tensor is written through the
NumPy array that shares its memory, and that array is returned.

Imports fastln._dtypes, fastln._layout, fastln._rows and fastln._validate.
"""
from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Tuple

import numpy as np

from fastln import _dtypes, _rows, _validate
from fastln._layout import (
    Rows,
    by_channels,
    by_rows,
    c_ordered,
    c_rows,
    cast_into,
    channels,
    overlap_partly,
    unalias,
)

if TYPE_CHECKING:
    import numpy.typing as npt

    _Array = npt.NDArray[Any]


def _array(a: Any, name: str) -> Tuple[_Array, np.dtype[Any]]:
    """a as an ndarray, and the kernel dtype (float32 or float64) for it."""
    a = _validate.asarray(a, name)
    dt = a.dtype
    if _dtypes.is_half(dt):
        return a, np.dtype(np.float32)
    if dt.kind == "f":
        if dt.itemsize == 4:
            return a, np.dtype(np.float32)
        if dt.itemsize == 8:
            return a, np.dtype(np.float64)
        raise TypeError(f"{name}: unsupported floating dtype {dt}")
    if dt.kind in "biu":
        return a, np.dtype(np.float64)
    raise TypeError(f"{name} must be a real floating, integer or bool array, got dtype {dt}")


def _storage(kernel_dtype: np.dtype[Any], *arrays: _Array) -> np.dtype[Any]:
    """The dtype the row kernels read and write: float16/bfloat16 itself where
    every array has that one dtype (the kernels convert in registers and
    compute in float32), else the kernel dtype."""
    dt = arrays[0].dtype.newbyteorder("=")
    if _dtypes.is_half(dt) and all(a.dtype.newbyteorder("=") == dt for a in arrays):
        return dt
    return kernel_dtype


def _result_dtype(a: _Array, kernel_dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The dtype of outputs shaped like a: a's own for float types, else the kernel's."""
    return a.dtype.newbyteorder("=") if a.dtype.kind == "f" or _dtypes.is_half(a.dtype) \
        else kernel_dtype


def _target(out: Optional[_Array], L: Rows, dt: np.dtype[Any], name: str = "out",
            rows: bool = True) -> _Array:
    """The array of x's shape that a forward writes: out (checked), or fresh
    memory of dtype dt, laid out as the kernel's rows (rows) or as x (C order)."""
    if out is not None:
        L.check_out(out, name, dt)
        return out
    fresh = _rows.empty_rows(L.N, L.H, dt)
    return L.unrows(fresh) if rows else fresh.reshape(L.shape)


def norm(rms: bool, x: Any, weight: Any, bias: Any, axis: Any, eps: Any, out: Any,
         return_stats: bool) -> Any:
    """layer_norm, or rms_norm with rms (bias None): y, or (y, mean, rstd) or
    (y, rstd) with return_stats."""
    x, kt = _array(x, "x")
    out = _validate.out_array(out, "out")
    eps = _validate.check_eps(eps)
    L = Rows(x, axis)
    w = L.param(weight, "weight", kt)
    b = L.param(bias, "bias", kt)
    mean = np.empty(L.N, kt) if return_stats and not rms else None
    rstd = np.empty(L.N, kt) if return_stats else None
    cf = channels(x, L, kt)
    y = _target(out, L, _result_dtype(x, kt), rows=cf is None)
    x, w, b = unalias([y], [x, w, b])
    if cf is not None:
        by_channels(L, kt, x, y, (mean, rstd), lambda xs, ys, st, n, c, s:
                    _rows.norm_channels(xs, w, b, eps, ys, st[0], st[1], n, c, s, rms))
    else:
        by_rows(L, _storage(kt, x), [x], [y], (mean, rstd), lambda i, o, st:
                _rows.norm_rows(rms, i[0], w, b, eps, o[0], *st))
    if rstd is None:
        return y
    if mean is None:
        return y, rstd.reshape(L.batch_shape)
    return y, mean.reshape(L.batch_shape), rstd.reshape(L.batch_shape)


def _widened(a: _Array) -> _Array:
    """a as a C-contiguous float32 array (a itself where it is one already)."""
    if a.dtype == np.float32 and a.flags.c_contiguous and a.flags.aligned:
        return a
    w = np.empty(a.shape, np.float32)
    cast_into(w, a if a.flags.c_contiguous else np.ascontiguousarray(a))
    return w


def _channels_backward(L: Rows, cf: Tuple[int, int, int], dy: _Array, x: _Array,
                       out: Optional[_Array], call: Callable[[_Array, _Array, _Array], Any]
                       ) -> _Array:
    """dx of the channels-first backward, for float16/bfloat16 x: dy and x
    widened to float32 C-contiguous arrays as the float32 call would take
    them, call(dyw, xw, dx32), and dx32 rounded into out or a fresh array."""
    dyw, xw = (_widened(a) for a in (dy, x))
    dx32 = np.empty(x.shape, np.float32)
    call(dyw, xw, dx32)
    dx = _target(out, L, _result_dtype(x, np.dtype(np.float32)), rows=False)
    cast_into(dx, dx32)
    return dx


def _backward_channels(x: _Array, dy: _Array, L: Rows, kt: np.dtype[Any]
                       ) -> Optional[Tuple[int, int, int]]:
    """(N, C, S) where a backward takes the channels-first kernel, else None:
    x as in channels and dy C-contiguous rows of kt; for float16/bfloat16 x,
    as the float32 call on x and dy widened does (dy float16, bfloat16 or
    float32, its widening C-contiguous)."""
    if not _dtypes.is_half(x.dtype):
        return channels(x, L, kt) if c_rows(dy, kt) else None
    if not (_dtypes.is_half(dy.dtype) or dy.dtype == np.float32) or not c_ordered(dy):
        return None
    return channels(x, L, np.dtype(np.float32))


def _channels_output(x: _Array, L: Rows, out: Optional[_Array], inputs: Sequence[_Array] = ()
                     ) -> Tuple[_Array, Callable[[], _Array]]:
    """The array the channels-first backward writes, and a function that
    returns the result: out itself when it is C-contiguous and aligned (x or
    another input of x's shape itself included), else fresh memory (copied
    into out at the end), so that out= never changes the values."""
    if out is not None:
        L.check_out(out, "out", x.dtype)
        if (out.dtype.isnative and out.flags.c_contiguous and out.flags.aligned
                and not any(overlap_partly(out, a) for a in (x, *inputs))):
            return out, lambda: out
    fresh = _rows.empty_rows(L.N, L.H, x.dtype).reshape(x.shape)
    if out is None:
        return fresh, lambda: fresh

    def finish() -> _Array:
        np.copyto(out, fresh)
        return out
    return fresh, finish


def norm_backward(rms: bool, dy: Any, x: Any, mean: Any, rstd: Any, weight: Any, axis: Any,
                  out: Any) -> Tuple[_Array, ...]:
    """layer_norm_backward: (dx, dweight, dbias); rms_norm_backward with rms
    (mean None): (dx, dweight)."""
    x, kt = _array(x, "x")
    dy, _ = _array(dy, "dy")
    out = _validate.out_array(out, "out")
    L = Rows(x, axis)
    L.check_shape(dy, "dy")
    m = None if rms else L.stats(mean, "mean", kt)
    r = L.stats(rstd, "rstd", kt)
    w = L.param(weight, "weight", kt)
    cf = _backward_channels(x, dy, L, kt)
    if cf is not None:
        dw = np.empty(L.norm_shape, kt)
        db = None if rms else np.empty(L.norm_shape, kt)
        if _dtypes.is_half(x.dtype):
            dx = _channels_backward(L, cf, dy, x, out, lambda dyw, xw, dx32:
                                    _rows.norm_channels_backward(dyw, xw, m, r, w, dx32, dw,
                                                                 db, *cf))
        else:
            dx, done = _channels_output(x, L, out, (dy,))
            _rows.norm_channels_backward(dy, x, m, r, w, dx, dw, db, *cf)
            dx = done()
        return (dx, dw) if db is None else (dx, dw, db)
    st = _storage(kt, x, dy)
    dx, finish, (dyr, xr, m, r, w) = L.output(out, "out", _result_dtype(x, kt), st,
                                              [L.rows(dy, st), L.rows(x, st), m, r, w])
    dw = np.empty(L.H, kt)
    db = None if rms else np.empty(L.H, kt)
    _rows.norm_backward_rows(rms, dyr, xr, m, r, w, dx, dw, db)
    if db is None:
        return finish(), dw.reshape(L.norm_shape)
    return finish(), dw.reshape(L.norm_shape), db.reshape(L.norm_shape)


def _residual_period(L: Rows, shape: Tuple[int, ...], name: str) -> Tuple[Tuple[int, ...], int]:
    """A residual's shape padded to x's dimensions, and its rows' period R:
    row n of x takes residual row n % R. R = N where it has x's shape, fewer
    where it broadcasts over leading batch axes only (those before the first
    axis where it has x's size), and 0 where it broadcasts otherwise (a
    broadcast copy then holds its N rows). Only batch (non-normalized) axes may
    broadcast: a ValueError naming ``name`` otherwise."""
    nd = len(L.shape)
    padded = (1,) * (nd - len(shape)) + tuple(shape)
    if len(shape) > nd or any(p not in (1, n) for p, n in zip(padded, L.shape)):
        raise ValueError(f"{name} has shape {tuple(shape)}, which does not broadcast to "
                         f"x's shape {L.shape}")
    if any(padded[a] != L.shape[a] for a in L.axes):
        raise ValueError(f"{name} has shape {tuple(shape)}: it may broadcast over the batch "
                         f"axes only, not the normalized ones ({L.where()})")
    rb = [n for i, n in enumerate(padded) if i not in L.axes]
    k = len(rb)
    while k > 0 and rb[k - 1] == L.batch_shape[k - 1]:
        k -= 1
    if any(n != 1 for n in rb[:k]):
        return padded, 0
    return padded, int(np.prod(rb, dtype=np.int64))


def add_norm(rms: bool, x: Any, residual: Any, input_bias: Any, weight: Any, bias: Any,
             axis: Any, eps: Any, out: Any, return_stats: bool) -> Tuple[_Array, ...]:
    """add_layer_norm, or add_rms_norm with rms (bias None)."""
    x, kx = _array(x, "x")
    residual, kr = _array(residual, "residual")
    eps = _validate.check_eps(eps)
    L = Rows(x, axis)
    kt = np.promote_types(kx, kr)
    rdt = np.result_type(_result_dtype(x, kx), _result_dtype(residual, kr))
    bi = L.param(input_bias, "input_bias", kt)
    w = L.param(weight, "weight", kt)
    b = L.param(bias, "bias", kt)
    out = _validate.out_array(out, "out")
    if out is None or isinstance(out, np.ndarray):
        out_y, out_s = out, None
    elif isinstance(out, tuple) and len(out) == 2:
        out_y, out_s = (_validate.out_array(out[0], "out"),
                        _validate.out_array(out[1], "out[1]"))
    else:
        raise TypeError("out must be an ndarray (for y) or a tuple (y_out, s_out)")
    if out_y is not None and out_s is not None and np.may_share_memory(out_y, out_s):
        raise ValueError("out: the y and s buffers overlap")
    st = _storage(kt, x, residual)
    padded, R = (L.shape, L.N) if residual.shape == L.shape else \
        _residual_period(L, residual.shape, "residual")
    y = _target(out_y, L, rdt, "out")
    s = _target(out_s, L, rdt, "out[1]")
    x, residual, bi, w, b = unalias([y, s], [x, residual, bi, w, b])
    mean = np.empty(L.N, kt) if return_stats and not rms else None
    rstd = np.empty(L.N, kt) if return_stats else None

    def kernel(i: Sequence[_Array], o: Sequence[_Array], stats: Sequence[Any]) -> None:
        _rows.add_norm_rows(rms, i[0], i[1], bi, w, b, eps, o[0], o[1], *stats)
    # a residual that repeats with period R < N rows is read in place where it
    # is such rows, else a block's rows of its broadcast are gathered
    rm = L.moved(residual.reshape(padded))
    if (0 < R < L.N and c_rows(rm, st)
            and all(c_rows(L.moved(a), st) for a in (x, y, s))):
        kernel([L.moved(x).reshape(L.N, L.H), rm.reshape(R, L.H)],
               [L.moved(y).reshape(L.N, L.H), L.moved(s).reshape(L.N, L.H)], (mean, rstd))
    else:
        by_rows(L, st, [x, np.broadcast_to(residual.reshape(padded), L.shape)], [y, s],
                 (mean, rstd), kernel)
    if rstd is None:
        return y, s
    if mean is None:
        return y, s, rstd.reshape(L.batch_shape)
    return y, s, mean.reshape(L.batch_shape), rstd.reshape(L.batch_shape)


def _reduce_to(a: _Array, shape: Tuple[int, ...], dtype: np.dtype[Any]) -> _Array:
    """a summed (in float64) over the axes along which shape broadcasts to a's shape."""
    lead = a.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape)
                                      if n == 1 and a.shape[lead + i] != 1)
    return a.sum(axis=axes, dtype=np.float64).reshape(shape).astype(dtype)


def add_norm_backward(rms: bool, dy: Any, s: Any, mean: Any, rstd: Any, weight: Any, ds: Any,
                      axis: Any, out: Optional[_Array], input_bias_grad: bool,
                      residual_shape: Any) -> Tuple[_Array, ...]:
    """add_layer_norm_backward, or add_rms_norm_backward with rms (mean None)."""
    s, kt = _array(s, "s")
    dy, _ = _array(dy, "dy")
    out = _validate.out_array(out, "out")
    L = Rows(s, axis)
    L.check_shape(dy, "dy")
    if ds is not None:
        ds, _ = _array(ds, "ds")
        L.check_shape(ds, "ds")
    m = None if rms else L.stats(mean, "mean", kt)
    r = L.stats(rstd, "rstd", kt)
    w = L.param(weight, "weight", kt)
    rshape, period = None, 0
    if residual_shape is not None:
        try:
            rshape = tuple(operator.index(n) for n in residual_shape)
        except TypeError:
            raise TypeError(f"residual_shape must be a tuple of ints, got "
                            f"{residual_shape!r}") from None
        period = _residual_period(L, rshape, "residual_shape")[1]
    # float16/bfloat16 rows are widened to float32 (the fused backward's kernels
    # take float32 and float64); dsum is rounded back on the way out
    rdt = _result_dtype(s, kt)
    dsum, finish, (dyr, sr, dsr, m, r, w) = L.output(
        out, "out", rdt, kt,
        [L.rows(dy, kt), L.rows(s, kt), None if ds is None else L.rows(ds, kt), m, r, w])
    dw = np.empty(L.H, kt)
    db = None if rms else np.empty(L.H, kt)
    # a residual of one row (every batch axis broadcast, the normalized ones in
    # order): its gradient is dsum's column sums, as input_bias's
    bias_like = rshape is not None and period == 1 and list(L.axes) == sorted(L.axes)
    di = np.empty(L.H, kt) if input_bias_grad or bias_like else None
    _rows.add_norm_backward_rows(rms, dyr, sr, dsr, m, r, w, dsum, dw, db, di)
    res: list[_Array] = [finish(), dw.reshape(L.norm_shape)]
    if db is not None:
        res.append(db.reshape(L.norm_shape))
    if input_bias_grad and di is not None:
        res.append(di.reshape(L.norm_shape))
    if rshape is not None:
        if rshape == L.shape:
            res.append(res[0])
        elif bias_like and di is not None:
            res.append(di.reshape(rshape).astype(rdt))
        else:   # from the unrounded dsum, as the column sums are
            res.append(_reduce_to(L.unrows(dsum), rshape, rdt))
    return tuple(res)
