"""The general path of the public functions: argument checks and canonical layouts.

fastln._core handles the common case (C-contiguous float32/float64 normalized
over the last axis) itself and calls here for everything else. This module
turns any input into C-contiguous (N, H) rows of a kernel dtype, calls the row
kernels in fastln._core, and puts the results back in the caller's shape and
dtype (or into ``out``). Every error a user can trigger is raised here, and
names the argument at fault.

Where an input or out= is not such rows, the forwards work a block of rows
at a time (_by_rows, _by_channels): a block is gathered into scratch of at
most _BLOCK_BYTES, normalized, and scattered into the output, so that a
forward's scratch does not grow with the input. Rows (and channels-first
positions) are computed independently, so the blocks change no value.

Torch tensors are read here too (fastln._core's fast path takes only
ndarrays): a CPU tensor that does not require grad becomes an ndarray sharing
its memory. The results are NumPy arrays; an out= tensor is written through
the NumPy array that shares its memory, and that array is returned.
"""
from __future__ import annotations

import functools
import inspect
import numbers
import operator
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Iterable,
    Iterator,
    NoReturn,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
    cast,
)

import numpy as np

from fastln import _core, _torch

if TYPE_CHECKING:
    import numpy.typing as npt

    _Array = npt.NDArray[Any]
    _Axis = Union[int, Sequence[int]]

# storage dtypes computed in float32 (results cast back on the way out)
_LOW_PRECISION = {np.dtype(np.float16)}
try:  # bfloat16, where ml_dtypes is installed
    import ml_dtypes as _ml_dtypes
    _LOW_PRECISION.add(np.dtype(_ml_dtypes.bfloat16))
except ImportError:  # pragma: no cover
    pass


# Scratch bytes a block of the general path holds, per gathered input or
# scattered output (see the module docstring)
_BLOCK_BYTES = 4 << 20


def _half(dt: np.dtype[Any]) -> bool:
    """dt is float16 or bfloat16, in either byte order."""
    return dt.newbyteorder("=") in _LOW_PRECISION


def _cast_into(dst: _Array, src: _Array) -> None:
    """dst[...] = src, converted as NumPy's unsafe cast does. Between
    C-contiguous arrays of float32 and float16 or bfloat16 (native order) it
    takes fastln's converter, which is vectorized and threaded where NumPy's
    16-bit casts are not; it rounds to nearest even, as NumPy does."""
    f32 = np.dtype(np.float32)
    half = dst.dtype if src.dtype == f32 else src.dtype if dst.dtype == f32 else None
    if (half is not None and half.isnative and _half(half) and src.shape == dst.shape
            and dst.flags.writeable
            and all(a.flags.c_contiguous and a.flags.aligned for a in (src, dst))):
        def bits(a: _Array) -> _Array:   # bfloat16 goes to the converter as its bits
            return a if a.dtype in (f32, np.dtype(np.float16)) else a.view(np.uint16)
        _core._half_convert(bits(src), bits(dst))
        return
    np.copyto(dst, src, casting="unsafe")


def _tensor(t: Any, name: str) -> _Array:
    """A torch tensor as an ndarray (sharing its memory where NumPy has its
    dtype; bfloat16 becomes an ml_dtypes.bfloat16 copy). fastln has no
    autograd: a tensor that requires grad is refused, naming the argument."""
    if getattr(t, "requires_grad", False):
        raise TypeError(f"{name} is a torch tensor that requires grad, and fastln does not "
                        f"autograd (it returns NumPy arrays); pass {name}.detach() to use "
                        f"its values")
    device = getattr(t, "device", None)
    if device is not None and getattr(device, "type", "cpu") != "cpu":
        raise TypeError(f"{name} is a torch tensor on device {device}; fastln runs on the "
                        f"CPU: pass {name}.cpu()")
    if str(t.dtype) == "torch.bfloat16":
        return _torch.to_numpy(t)
    try:
        return np.asarray(t.numpy())
    except (RuntimeError, TypeError, ValueError) as e:
        raise TypeError(f"{name} is a torch tensor that NumPy cannot read: {e}") from None


def _asarray(a: Any, name: str) -> _Array:
    """np.asarray(a), with NumPy's errors for non-arrays (ragged lists, ...) naming the
    argument; torch tensors through :func:`_tensor`."""
    if _torch.is_tensor(a):
        return _tensor(a, name)
    try:
        return np.asarray(a)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{name} cannot be read as an array: {e}") from None


def _array(a: Any, name: str) -> Tuple[_Array, np.dtype[Any]]:
    """a as an ndarray, and the kernel dtype (float32 or float64) for it."""
    a = _asarray(a, name)
    dt = a.dtype
    if _half(dt):
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


def _real_array(a: Any, name: str) -> _Array:
    """a as an ndarray of a real (float, int, bool) dtype, else TypeError naming it."""
    arr = _asarray(a, name)
    if arr.dtype.kind not in "fiub" and not _half(arr.dtype):
        raise TypeError(f"{name} must be a real floating array, got dtype {arr.dtype}")
    return arr


def _storage(kernel_dtype: np.dtype[Any], *arrays: _Array) -> np.dtype[Any]:
    """The dtype the row kernels read and write: float16/bfloat16 itself where
    every array has that one dtype (the kernels convert in registers and
    compute in float32), else the kernel dtype."""
    dt = arrays[0].dtype.newbyteorder("=")
    if _half(dt) and all(a.dtype.newbyteorder("=") == dt for a in arrays):
        return dt
    return kernel_dtype


def _result_dtype(a: _Array, kernel_dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The dtype of outputs shaped like a: a's own for float types, else the kernel's."""
    return a.dtype.newbyteorder("=") if a.dtype.kind == "f" or _half(a.dtype) \
        else kernel_dtype


def _flag(value: Any, name: str) -> bool:
    """value as a bool: flags take True or False (NumPy's bools too), not
    truthy values such as "yes" or 1."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def _check_eps(eps: Any) -> float:
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a real number, got {type(eps).__name__}")
    e = float(eps)
    if not np.isfinite(e) or e < 0:
        raise ValueError(f"eps must be finite and >= 0, got {eps!r}")
    return e


# ---- RMSNorm has no bias: a bias passed positionally is a TypeError that names
# the LayerNorm function, which takes one

_F = TypeVar("_F", bound=Callable[..., Any])

# each RMSNorm function's counterpart with a bias, in the same module
_WITH_BIAS = {"rms_norm": "layer_norm(x, weight, bias)",
              "add_rms_norm": "add_layer_norm(x, residual, weight, bias)"}


def _positional(func: Callable[..., Any]) -> list[str]:
    """The names of func's parameters that a call may pass by position."""
    return [p.name for p in inspect.signature(func).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def no_bias(func: Callable[..., Any], extra: Sequence[Any]) -> NoReturn:
    """Raise the TypeError of a call of func, an RMSNorm function, that passed
    ``extra`` positional arguments past func's own (a bias, as a LayerNorm call
    passes it)."""
    names = _positional(func)
    module = "fastln" if func.__module__ == "fastln._core" else func.__module__
    raise TypeError(
        f"{func.__name__}() takes at most {len(names)} positional arguments "
        f"({', '.join(names)}) but {len(names) + len(extra)} were given: RMSNorm has no "
        f"bias; {module}.{_WITH_BIAS[func.__name__]} is the norm with one")


def hide_bias(func: _F) -> _F:
    """func, a function of fastln._core whose ``*bias`` parameter takes a
    positional bias only to raise :func:`no_bias`'s error, with the signature
    of the arguments it accepts: ``*`` in place of ``*bias``, in
    ``inspect.signature`` and in the signature line Cython embeds in the
    docstring."""
    sig = inspect.signature(func)
    func.__signature__ = sig.replace(parameters=[  # type: ignore[attr-defined]
        p for p in sig.parameters.values() if p.kind is not p.VAR_POSITIONAL])
    func.__doc__ = (func.__doc__ or "").replace(", *bias, ", ", *, ", 1)
    return func


def takes_no_bias(func: _F) -> _F:
    """func, a Python RMSNorm function, wrapped to raise :func:`no_bias`'s
    error where a call passes more positional arguments than func takes."""
    n = len(_positional(func))

    @functools.wraps(func)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if len(args) > n:
            no_bias(func, args[n:])
        return func(*args, **kwargs)
    return cast(_F, checked)


def _normalize_axes(axis: Any, ndim: int) -> Tuple[int, ...]:
    """axis (int or tuple of ints) as a tuple of non-negative axes, in order."""
    axes: Tuple[int, ...]
    try:
        axes = (operator.index(axis),)
    except TypeError:
        try:
            axes = tuple(operator.index(a) for a in axis)
        except TypeError:
            raise TypeError(f"axis must be an int or a tuple of ints, got {axis!r}") from None
    if not axes:
        raise ValueError("axis must name at least one axis")
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(f"axis {a} is out of bounds for an array of dimension {ndim}")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"axis {axis!r} contains a duplicate axis")
    return tuple(out)


class _Rows:
    """How an array of x's shape maps to C-contiguous (N, H) rows.

    The normalized axes move to the end, in the order given; the remaining
    (batch) axes keep their order and flatten into N rows.
    """

    def __init__(self, x: _Array, axis: Any) -> None:
        if x.ndim == 0:
            raise ValueError("x must have at least one dimension")
        self.shape: Tuple[int, ...] = x.shape
        self.axes = _normalize_axes(axis, x.ndim)
        self.dest = tuple(range(x.ndim - len(self.axes), x.ndim))
        self.batch_shape = tuple(n for i, n in enumerate(x.shape) if i not in self.axes)
        self.norm_shape = tuple(x.shape[a] for a in self.axes)
        self.H = int(np.prod(self.norm_shape, dtype=np.int64))
        self.N = int(np.prod(self.batch_shape, dtype=np.int64))
        if self.H == 0:
            raise ValueError(f"x has size 0 along the normalized axis {self.axes} "
                             f"(shape {x.shape}); nothing to normalize")

    def where(self) -> str:
        """x's shape and the normalized axes, for error messages."""
        axes = f"axis {self.axes[0]}" if len(self.axes) == 1 else f"axes {self.axes}"
        return f"x has shape {self.shape}, normalized over {axes}"

    def moved(self, a: _Array) -> _Array:
        return np.moveaxis(a, self.axes, self.dest)

    def rows(self, a: _Array, dtype: np.dtype[Any]) -> _Array:
        """a (of x's shape) as C-contiguous (N, H) rows of dtype; a view when possible."""
        m = np.require(self.moved(a), dtype=dtype, requirements=("C", "A"))
        return m.reshape(self.N, self.H)

    def unrows(self, r: _Array) -> _Array:
        """(N, H) rows back to an array of x's shape (a view)."""
        return np.moveaxis(r.reshape(self.batch_shape + self.norm_shape), self.dest, self.axes)

    def check_shape(self, a: _Array, name: str) -> None:
        if a.shape != self.shape:
            raise ValueError(f"{name} has shape {a.shape}, expected x's shape {self.shape}")

    def stats(self, a: Any, name: str, dtype: np.dtype[Any]) -> _Array:
        """mean / rstd: shape batch_shape, as (N,) contiguous dtype."""
        a = _real_array(a, name)
        if a.shape != self.batch_shape:
            raise ValueError(f"{name} has shape {a.shape}, expected {self.batch_shape}, the "
                             f"batch shape: {self.where()}")
        return np.require(a, dtype=dtype, requirements=("C", "A")).reshape(self.N)

    def param(self, p: Any, name: str, dtype: np.dtype[Any]) -> Optional[_Array]:
        """weight / bias: None, or shape norm_shape, as (H,) contiguous dtype."""
        if p is None:
            return None
        p = _real_array(p, name)
        if p.shape != self.norm_shape:
            raise ValueError(f"{name} has shape {p.shape}, expected the normalized shape "
                             f"{self.norm_shape}: {self.where()}")
        return np.require(p, dtype=dtype, requirements=("C", "A")).reshape(self.H)

    def check_out(self, out: Any, name: str, result_dtype: np.dtype[Any]) -> None:
        """A TypeError or ValueError naming ``name`` unless out is a writeable
        ndarray of x's shape and the result's dtype."""
        if type(out) is not np.ndarray:   # subclasses (np.matrix, masked arrays) too
            raise TypeError(f"{name} must be a numpy.ndarray, got {type(out).__name__}")
        if out.shape != self.shape:
            raise ValueError(f"{name} has shape {out.shape}, expected {self.shape}")
        if out.dtype != result_dtype:
            raise TypeError(f"{name} has dtype {out.dtype}, expected {result_dtype}")
        if not out.flags.writeable:
            raise ValueError(f"{name} is read-only")

    def output(self, out: Optional[_Array], name: str, result_dtype: np.dtype[Any],
               kernel_dtype: np.dtype[Any], inputs: Sequence[Optional[_Array]]
               ) -> Tuple[_Array, Callable[[], _Array], Sequence[Any]]:
        """Rows to write a result into, and a function that returns the result.

        With out=None the rows are fresh. With out=, they are a view of out when
        out's layout and dtype allow, else a temporary copied into out at the
        end. ``inputs`` are the input rows; an out view that overlaps one of
        them other than exactly forces a copy of that input (returned anew).
        """
        if out is None:
            r = _core._empty_rows(self.N, self.H, kernel_dtype)
            if result_dtype == kernel_dtype:
                return r, (lambda: self.unrows(r)), inputs
            return r, (lambda: self.unrows(r).astype(result_dtype)), inputs
        self.check_out(out, name, result_dtype)
        m = self.moved(out)
        if out.dtype == kernel_dtype and out.dtype.isnative and m.flags.c_contiguous \
                and m.flags.aligned:
            r = m.reshape(self.N, self.H)
            inputs = [i.copy() if i is not None and _overlap_partly(r, i) else i
                      for i in inputs]
            return r, (lambda: out), inputs
        r = _core._empty_rows(self.N, self.H, kernel_dtype)

        def finish() -> _Array:
            np.copyto(out, self.unrows(r), casting="unsafe")
            return out
        return r, finish, inputs


def _overlap_partly(a: _Array, b: _Array) -> bool:
    """a and b share memory but are not the same buffer."""
    if not np.may_share_memory(a, b):
        return False
    same = (a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
            and a.strides == b.strides and a.shape == b.shape)
    return not same


def _out_array(out: Any, name: str) -> Any:
    """out, with a CPU torch tensor as the ndarray that shares its memory (a
    bfloat16 tensor as an ml_dtypes.bfloat16 view of its bits), so that the
    results are written into the tensor. A tensor that requires grad is
    refused, naming the argument, as for inputs."""
    if not _torch.is_tensor(out):
        return out
    if getattr(out, "requires_grad", False):
        raise TypeError(f"{name} is a torch tensor that requires grad, and fastln does not "
                        f"autograd; pass {name}.detach() (it shares the tensor's memory)")
    device = getattr(out, "device", None)
    if device is not None and getattr(device, "type", "cpu") != "cpu":
        raise TypeError(f"{name} is a torch tensor on device {device}; fastln writes CPU "
                        f"memory only")
    try:
        if str(out.dtype) == "torch.bfloat16":
            import torch
            return out.view(torch.int16).numpy().view(_torch._bfloat16())
        return out.numpy()
    except (RuntimeError, TypeError, ValueError) as e:
        raise TypeError(f"{name} is a torch tensor that NumPy cannot write: {e}") from None


def _c_rows(a: _Array, dt: np.dtype[Any]) -> bool:
    """a can be handed to a kernel as it is: C-contiguous, aligned, native dtype dt."""
    return (a.dtype == dt and a.dtype.isnative and a.flags.c_contiguous
            and a.flags.aligned)


def _c_ordered(a: _Array) -> bool:
    """a.astype(float32) (which keeps a's memory order) is C-contiguous: a's
    axes of more than one element have non-increasing strides' magnitudes."""
    st = [abs(s) for n, s in zip(a.shape, a.strides) if n > 1]
    return all(p >= q for p, q in zip(st, st[1:]))


def _same_view(a: _Array, b: _Array) -> bool:
    """a and b are the same elements of the same memory, in the same order."""
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
            and a.shape == b.shape and a.strides == b.strides
            and a.dtype.itemsize == b.dtype.itemsize)


def _unalias(outs: Sequence[_Array], ins: Sequence[Optional[_Array]]) -> list[Optional[_Array]]:
    """ins, with a copy of each that shares memory with an output other than as
    the same view (an output that is its input itself is written in place,
    a block after it was read)."""
    return [a.copy() if a is not None and any(np.may_share_memory(o, a)
                                              and not _same_view(o, a) for o in outs)
            else a for a in ins]


def _runs(shape: Tuple[int, ...], per: int
          ) -> Iterator[Tuple[Tuple[Union[int, slice], ...], int, int]]:
    """Runs of consecutive positions (C order) of an array of shape, at most
    ``per`` (>= 1) each unless one position is all: (an index of the array's
    leading len(shape) axes, the run's first position, its length)."""
    j, inner = len(shape), 1
    while j > 0 and inner * shape[j - 1] <= per:
        j -= 1
        inner *= shape[j]
    if j == 0:
        yield (), 0, inner
        return
    step, first = max(1, per // inner), 0
    for outer in np.ndindex(*shape[:j - 1]):
        for a in range(0, shape[j - 1], step):
            n = min(step, shape[j - 1] - a)
            yield outer + (slice(a, a + n),), first, n * inner
            first += n * inner


class _Scratch:
    """Reusable blocks of scratch, one per slot, each of at most size elements."""

    def __init__(self, size: int, dtype: np.dtype[Any]) -> None:
        self.size, self.dtype = size, dtype
        self.bufs: dict[int, _Array] = {}

    def get(self, slot: int, shape: Tuple[int, ...]) -> _Array:
        buf = self.bufs.get(slot)
        if buf is None:
            buf = self.bufs[slot] = np.empty(self.size, self.dtype)
        return buf[:int(np.prod(shape, dtype=np.int64))].reshape(shape)


def _by_rows(L: _Rows, st: np.dtype[Any], ins: Sequence[_Array], outs: Sequence[_Array],
             stats: Sequence[Optional[_Array]], kernel: Callable[..., Any]) -> None:
    """kernel(in_rows, out_rows, stats) on C-contiguous (n, H) rows of dtype st.

    ins and outs have x's shape (outs writable, unaliased by ins: see
    _unalias); stats are (N,) or None, passed as the block's slice. Where
    every in and out is such rows already, one call takes all N rows. Else
    blocks of at most _BLOCK_BYTES a scratch array (one row where a row is
    larger): inputs gathered (and converted), outputs scattered (and
    converted). Rows are independent, so the blocks change no value.
    """
    if L.N == 0:
        return
    mi, mo = [L.moved(a) for a in ins], [L.moved(o) for o in outs]
    direct = all(_c_rows(m, st) for m in mi + mo)
    per = L.N if direct else max(1, _BLOCK_BYTES // (L.H * st.itemsize))
    scratch = _Scratch(min(per, L.N) * L.H, st)
    for idx, n0, n in _runs(L.batch_shape, per):
        rin: list[_Array] = []
        rout: list[_Array] = []
        back = []
        for k, m in enumerate(mi + mo):
            blk = m[idx]
            if _c_rows(blk, st):
                r = blk
            else:
                r = scratch.get(k, blk.shape)
                if k < len(mi):
                    _cast_into(r, blk)
                else:
                    back.append((blk, r))
            (rin if k < len(mi) else rout).append(r.reshape(n, L.H))
        kernel(rin, rout, [None if a is None else a[n0:n0 + n] for a in stats])
        for blk, r in back:
            _cast_into(blk, r)


def _by_channels(L: _Rows, kt: np.dtype[Any], x: _Array, y: _Array,
                 stats: Sequence[Optional[_Array]], kernel: Callable[..., Any]) -> None:
    """kernel(xs, ys, stats, n, C, s) on contiguous (n, C, s) arrays of dtype
    kt, x normalized over its one axis a: (N, C, S) with N the positions of
    the axes before a, S of those after.

    y has x's shape (writable, unaliased by x); stats are (N * S,) or None,
    passed as the block's slice. Where x and y are (N, C, S) arrays of kt
    already, one call takes them. Else blocks of at most _BLOCK_BYTES a
    scratch array (whole samples, or runs of one sample's positions): x
    gathered (16-bit widened), y scattered (rounded). Positions are
    independent, so the blocks change no value.
    """
    a = L.axes[0]
    pre, C, post = x.shape[:a], x.shape[a], x.shape[a + 1:]
    S = int(np.prod(post, dtype=np.int64))
    if L.N == 0:
        return
    if _c_rows(x, kt) and _c_rows(y, kt):
        kernel(x, y, stats, L.N // S, C, S)
        return
    per = max(1, _BLOCK_BYTES // (C * kt.itemsize))   # positions a block
    blocks: Iterable[Tuple[Tuple[Any, ...], int, int, int]]
    if S <= per:
        blocks = ((idx, n0 * S, n, S) for idx, n0, n in _runs(pre, per // S))
    else:
        blocks = ((p + (slice(None),) + idx, i * S + s0, 1, m)
                  for i, p in enumerate(np.ndindex(*pre)) for idx, s0, m in _runs(post, per))
    scratch = _Scratch(min(per, L.N) * C, kt)
    for idx, p0, n, s in blocks:
        xb, yb = x[idx], y[idx]
        xs = xb if _c_rows(xb, kt) else scratch.get(0, xb.shape)
        if xs is not xb:
            _cast_into(xs, xb)
        ys = yb if _c_rows(yb, kt) else scratch.get(1, yb.shape)
        kernel(xs, ys, [None if t is None else t[p0:p0 + n * s] for t in stats], n, C, s)
        if ys is not yb:
            _cast_into(yb, ys)


def _channels(x: _Array, L: _Rows, kt: np.dtype[Any]) -> Optional[Tuple[int, int, int]]:
    """(N, C, S) when x, normalized over one axis that is not the last, takes
    the channels-first kernel: read in place where it is C-contiguous,
    aligned, native and of the kernel's dtype; and for float16/bfloat16 x
    where its float32 widening is C-contiguous (_c_ordered), as the float32
    call on that widening does, widened a block at a time. Else None."""
    if len(L.axes) != 1:
        return None
    if not (_c_rows(x, kt) or (_half(x.dtype) and _c_ordered(x))):
        return None
    a = L.axes[0]
    S = int(np.prod(x.shape[a + 1:], dtype=np.int64))
    if S <= 1:
        return None
    return L.N // S, x.shape[a], S


def _target(out: Optional[_Array], L: _Rows, dt: np.dtype[Any], name: str = "out",
            rows: bool = True) -> _Array:
    """The array of x's shape that a forward writes: out (checked), or fresh
    memory of dtype dt, laid out as the kernel's rows (rows) or as x (C order)."""
    if out is not None:
        L.check_out(out, name, dt)
        return out
    fresh = _core._empty_rows(L.N, L.H, dt)
    return L.unrows(fresh) if rows else fresh.reshape(L.shape)


def layer_norm(x: Any, weight: Any, bias: Any, axis: Any, eps: Any, out: Optional[_Array],
               return_stats: bool) -> Union[_Array, Tuple[_Array, _Array, _Array]]:
    x, kt = _array(x, "x")
    out = _out_array(out, "out")
    eps = _check_eps(eps)
    L = _Rows(x, axis)
    w = L.param(weight, "weight", kt)
    b = L.param(bias, "bias", kt)
    mean = np.empty(L.N, kt) if return_stats else None
    rstd = np.empty(L.N, kt) if return_stats else None
    cf = _channels(x, L, kt)
    y = _target(out, L, _result_dtype(x, kt), rows=cf is None)
    x, w, b = _unalias([y], [x, w, b])
    if cf is not None:
        _by_channels(L, kt, x, y, (mean, rstd), lambda xs, ys, st, n, c, s:
                     _core._norm_channels(xs, w, b, eps, ys, st[0], st[1], n, c, s, False))
    else:
        _by_rows(L, _storage(kt, x), [x], [y], (mean, rstd), lambda i, o, st:
                 _core._layer_norm_rows(i[0], w, b, eps, o[0], *st))
    if mean is None or rstd is None:
        return y
    return y, mean.reshape(L.batch_shape), rstd.reshape(L.batch_shape)


def _widened(a: _Array) -> _Array:
    """a as a C-contiguous float32 array (a itself where it is one already)."""
    if a.dtype == np.float32 and a.flags.c_contiguous and a.flags.aligned:
        return a
    w = np.empty(a.shape, np.float32)
    _cast_into(w, a if a.flags.c_contiguous else np.ascontiguousarray(a))
    return w


def _channels_backward(L: _Rows, cf: Tuple[int, int, int], dy: _Array, x: _Array,
                       out: Optional[_Array], call: Callable[[_Array, _Array, _Array], Any]
                       ) -> _Array:
    """dx of the channels-first backward, for float16/bfloat16 x: dy and x
    widened to float32 C-contiguous arrays as the float32 call would take
    them, call(dyw, xw, dx32), and dx32 rounded into out or a fresh array."""
    dyw, xw = (_widened(a) for a in (dy, x))
    dx32 = np.empty(x.shape, np.float32)
    call(dyw, xw, dx32)
    dx = _target(out, L, _result_dtype(x, np.dtype(np.float32)), rows=False)
    _cast_into(dx, dx32)
    return dx


def _backward_channels(x: _Array, dy: _Array, L: _Rows, kt: np.dtype[Any]
                       ) -> Optional[Tuple[int, int, int]]:
    """(N, C, S) where a backward takes the channels-first kernel, else None:
    x as in _channels and dy C-contiguous rows of kt; for float16/bfloat16 x,
    as the float32 call on x and dy widened does (dy float16, bfloat16 or
    float32, its widening C-contiguous)."""
    if not _half(x.dtype):
        return _channels(x, L, kt) if _c_rows(dy, kt) else None
    if not (_half(dy.dtype) or dy.dtype == np.float32) or not _c_ordered(dy):
        return None
    return _channels(x, L, np.dtype(np.float32))


def _channels_output(x: _Array, L: _Rows, out: Optional[_Array], inputs: Sequence[_Array] = ()
                     ) -> Tuple[_Array, Callable[[], _Array]]:
    """The array the channels-first backward writes, and a function that
    returns the result: out itself when it is C-contiguous and aligned (x or
    another input of x's shape itself included), else fresh memory (copied
    into out at the end), so that out= never changes the values."""
    if out is not None:
        L.check_out(out, "out", x.dtype)
        if (out.dtype.isnative and out.flags.c_contiguous and out.flags.aligned
                and not any(_overlap_partly(out, a) for a in (x, *inputs))):
            return out, lambda: out
    fresh = _core._empty_rows(L.N, L.H, x.dtype).reshape(x.shape)
    if out is None:
        return fresh, lambda: fresh

    def finish() -> _Array:
        np.copyto(out, fresh)
        return out
    return fresh, finish


def layer_norm_backward(dy: Any, x: Any, mean: Any, rstd: Any, weight: Any, axis: Any,
                        out: Optional[_Array]) -> Tuple[_Array, _Array, _Array]:
    x, kt = _array(x, "x")
    dy, _ = _array(dy, "dy")
    out = _out_array(out, "out")
    L = _Rows(x, axis)
    L.check_shape(dy, "dy")
    m = L.stats(mean, "mean", kt)
    r = L.stats(rstd, "rstd", kt)
    w = L.param(weight, "weight", kt)
    cf = _backward_channels(x, dy, L, kt)
    if cf is not None:
        dw, db = np.empty(L.norm_shape, kt), np.empty(L.norm_shape, kt)
        if _half(x.dtype):
            dx = _channels_backward(L, cf, dy, x, out, lambda dyw, xw, dx32:
                                    _core._norm_channels_backward(dyw, xw, m, r, w, dx32, dw,
                                                                  db, *cf))
            return dx, dw, db
        dx, done = _channels_output(x, L, out, (dy,))
        _core._norm_channels_backward(dy, x, m, r, w, dx, dw, db, *cf)
        return done(), dw, db
    st = _storage(kt, x, dy)
    dx, finish, (dyr, xr, m, r, w) = L.output(out, "out", _result_dtype(x, kt), st,
                                              [L.rows(dy, st), L.rows(x, st), m, r, w])
    dw, db = np.empty(L.H, kt), np.empty(L.H, kt)
    _core._layer_norm_backward_rows(dyr, xr, m, r, w, dx, dw, db)
    return finish(), dw.reshape(L.norm_shape), db.reshape(L.norm_shape)


def rms_norm(x: Any, weight: Any, axis: Any, eps: Any, out: Optional[_Array],
             return_stats: bool) -> Union[_Array, Tuple[_Array, _Array]]:
    x, kt = _array(x, "x")
    out = _out_array(out, "out")
    eps = _check_eps(eps)
    L = _Rows(x, axis)
    w = L.param(weight, "weight", kt)
    rstd = np.empty(L.N, kt) if return_stats else None
    cf = _channels(x, L, kt)
    y = _target(out, L, _result_dtype(x, kt), rows=cf is None)
    x, w = _unalias([y], [x, w])
    if cf is not None:
        _by_channels(L, kt, x, y, (None, rstd), lambda xs, ys, st, n, c, s:
                     _core._norm_channels(xs, w, None, eps, ys, st[0], st[1], n, c, s, True))
    else:
        _by_rows(L, _storage(kt, x), [x], [y], (rstd,), lambda i, o, st:
                 _core._rms_norm_rows(i[0], w, eps, o[0], *st))
    if rstd is None:
        return y
    return y, rstd.reshape(L.batch_shape)


def rms_norm_backward(dy: Any, x: Any, rstd: Any, weight: Any, axis: Any,
                      out: Optional[_Array]) -> Tuple[_Array, _Array]:
    x, kt = _array(x, "x")
    dy, _ = _array(dy, "dy")
    out = _out_array(out, "out")
    L = _Rows(x, axis)
    L.check_shape(dy, "dy")
    r = L.stats(rstd, "rstd", kt)
    w = L.param(weight, "weight", kt)
    cf = _backward_channels(x, dy, L, kt)
    if cf is not None:
        dw = np.empty(L.norm_shape, kt)
        if _half(x.dtype):
            dx = _channels_backward(L, cf, dy, x, out, lambda dyw, xw, dx32:
                                    _core._norm_channels_backward(dyw, xw, None, r, w, dx32,
                                                                  dw, None, *cf))
            return dx, dw
        dx, done = _channels_output(x, L, out, (dy,))
        _core._norm_channels_backward(dy, x, None, r, w, dx, dw, None, *cf)
        return done(), dw
    st = _storage(kt, x, dy)
    dx, finish, (dyr, xr, r, w) = L.output(out, "out", _result_dtype(x, kt), st,
                                           [L.rows(dy, st), L.rows(x, st), r, w])
    dw = np.empty(L.H, kt)
    _core._rms_norm_backward_rows(dyr, xr, r, w, dx, dw)
    return finish(), dw.reshape(L.norm_shape)


def _residual_period(L: _Rows, shape: Tuple[int, ...], name: str) -> Tuple[Tuple[int, ...], int]:
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
    eps = _check_eps(eps)
    L = _Rows(x, axis)
    kt = np.promote_types(kx, kr)
    rdt = np.result_type(_result_dtype(x, kx), _result_dtype(residual, kr))
    bi = L.param(input_bias, "input_bias", kt)
    w = L.param(weight, "weight", kt)
    b = L.param(bias, "bias", kt)
    out = _out_array(out, "out")
    if out is None or isinstance(out, np.ndarray):
        out_y, out_s = out, None
    elif isinstance(out, tuple) and len(out) == 2:
        out_y, out_s = _out_array(out[0], "out"), _out_array(out[1], "out[1]")
    else:
        raise TypeError("out must be an ndarray (for y) or a tuple (y_out, s_out)")
    if out_y is not None and out_s is not None and np.may_share_memory(out_y, out_s):
        raise ValueError("out: the y and s buffers overlap")
    st = _storage(kt, x, residual)
    padded, R = (L.shape, L.N) if residual.shape == L.shape else \
        _residual_period(L, residual.shape, "residual")
    y = _target(out_y, L, rdt, "out")
    s = _target(out_s, L, rdt, "out[1]")
    x, residual, bi, w, b = _unalias([y, s], [x, residual, bi, w, b])
    mean = np.empty(L.N, kt) if return_stats and not rms else None
    rstd = np.empty(L.N, kt) if return_stats else None

    def kernel(i: Sequence[_Array], o: Sequence[_Array], stats: Sequence[Any]) -> None:
        _core._add_norm_rows(rms, i[0], i[1], bi, w, b, eps, o[0], o[1], *stats)
    # a residual that repeats with period R < N rows is read in place where it
    # is such rows, else a block's rows of its broadcast are gathered
    rm = L.moved(residual.reshape(padded))
    if (0 < R < L.N and _c_rows(rm, st)
            and all(_c_rows(L.moved(a), st) for a in (x, y, s))):
        kernel([L.moved(x).reshape(L.N, L.H), rm.reshape(R, L.H)],
               [L.moved(y).reshape(L.N, L.H), L.moved(s).reshape(L.N, L.H)], (mean, rstd))
    else:
        _by_rows(L, st, [x, np.broadcast_to(residual.reshape(padded), L.shape)], [y, s],
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
    out = _out_array(out, "out")
    L = _Rows(s, axis)
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
    _core._add_norm_backward_rows(rms, dyr, sr, dsr, m, r, w, dsum, dw, db, di)
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
