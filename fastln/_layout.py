"""How an array of any layout meets the kernels' canonical rows.

The kernels (fastln._rows) take C-contiguous (N, H) rows of one dtype, or
channels-first (N, C, S) blocks. :class:`Rows` maps an array of x's shape to
such rows: the normalized axes move to the end and the batch axes flatten
into N. Where an input or output is not such rows already (Fortran order,
negative strides, byte-swapped, unaligned, a broadcast residual),
:func:`by_rows` and :func:`by_channels` work a block at a time: a block is
gathered into scratch of at most BLOCK_BYTES, normalized, and scattered into
the output, so that a forward's scratch does not grow with the input. Rows
(and channels-first positions) are computed independently, so the blocks
change no value.

fastln._general uses these names. Imports fastln._lib (the 16-bit converter),
fastln._rows (the cache of large outputs), fastln._dtypes and fastln._validate.
"""
from __future__ import annotations

from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Iterable,
    Iterator,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import numpy as np

from fastln import _dtypes, _lib, _rows, _validate

if TYPE_CHECKING:
    import numpy.typing as npt

    _Array = npt.NDArray[Any]

# Scratch bytes a block holds, per gathered input or scattered output (see the
# module docstring)
BLOCK_BYTES = 4 << 20


def cast_into(dst: _Array, src: _Array) -> None:
    """dst[...] = src, converted as NumPy's unsafe cast does. Between
    C-contiguous arrays of float32 and float16 or bfloat16 (native order) it
    takes fastln's converter, which is vectorized and threaded where NumPy's
    16-bit casts are not; it rounds to nearest even, as NumPy does."""
    f32 = np.dtype(np.float32)
    half = dst.dtype if src.dtype == f32 else src.dtype if dst.dtype == f32 else None
    if (half is not None and half.isnative and _dtypes.is_half(half)
            and src.shape == dst.shape and dst.flags.writeable
            and all(a.flags.c_contiguous and a.flags.aligned for a in (src, dst))):
        def bits(a: _Array) -> _Array:   # bfloat16 goes to the converter as its bits
            return a if a.dtype in (f32, np.dtype(np.float16)) else a.view(np.uint16)
        _lib._half_convert(bits(src), bits(dst))
        return
    np.copyto(dst, src, casting="unsafe")


class Rows:
    """How an array of x's shape maps to C-contiguous (N, H) rows.

    The normalized axes move to the end, in the order given; the remaining
    (batch) axes keep their order and flatten into N rows.
    """

    def __init__(self, x: _Array, axis: Any) -> None:
        if x.ndim == 0:
            raise ValueError("x must have at least one dimension")
        self.shape: Tuple[int, ...] = x.shape
        self.axes = _validate.normalize_axes(axis, x.ndim)
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
        a = _validate.real_array(a, name)
        if a.shape != self.batch_shape:
            raise ValueError(f"{name} has shape {a.shape}, expected {self.batch_shape}, the "
                             f"batch shape: {self.where()}")
        return np.require(a, dtype=dtype, requirements=("C", "A")).reshape(self.N)

    def param(self, p: Any, name: str, dtype: np.dtype[Any]) -> Optional[_Array]:
        """weight / bias: None, or shape norm_shape, as (H,) contiguous dtype."""
        if p is None:
            return None
        p = _validate.real_array(p, name)
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
            r = _rows.empty_rows(self.N, self.H, kernel_dtype)
            if result_dtype == kernel_dtype:
                return r, (lambda: self.unrows(r)), inputs
            return r, (lambda: self.unrows(r).astype(result_dtype)), inputs
        self.check_out(out, name, result_dtype)
        m = self.moved(out)
        if out.dtype == kernel_dtype and out.dtype.isnative and m.flags.c_contiguous \
                and m.flags.aligned:
            r = m.reshape(self.N, self.H)
            inputs = [i.copy() if i is not None and overlap_partly(r, i) else i
                      for i in inputs]
            return r, (lambda: out), inputs
        r = _rows.empty_rows(self.N, self.H, kernel_dtype)

        def finish() -> _Array:
            np.copyto(out, self.unrows(r), casting="unsafe")
            return out
        return r, finish, inputs


def overlap_partly(a: _Array, b: _Array) -> bool:
    """a and b share memory but are not the same buffer."""
    if not np.may_share_memory(a, b):
        return False
    same = (a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
            and a.strides == b.strides and a.shape == b.shape)
    return not same


def c_rows(a: _Array, dt: np.dtype[Any]) -> bool:
    """a can be handed to a kernel as it is: C-contiguous, aligned, native dtype dt."""
    return (a.dtype == dt and a.dtype.isnative and a.flags.c_contiguous
            and a.flags.aligned)


def c_ordered(a: _Array) -> bool:
    """a.astype(float32) (which keeps a's memory order) is C-contiguous: a's
    axes of more than one element have non-increasing strides' magnitudes."""
    st = [abs(s) for n, s in zip(a.shape, a.strides) if n > 1]
    return all(p >= q for p, q in zip(st, st[1:]))


def _same_view(a: _Array, b: _Array) -> bool:
    """a and b are the same elements of the same memory, in the same order."""
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
            and a.shape == b.shape and a.strides == b.strides
            and a.dtype.itemsize == b.dtype.itemsize)


def unalias(outs: Sequence[_Array], ins: Sequence[Optional[_Array]]) -> list[Optional[_Array]]:
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


def by_rows(L: Rows, st: np.dtype[Any], ins: Sequence[_Array], outs: Sequence[_Array],
             stats: Sequence[Optional[_Array]], kernel: Callable[..., Any]) -> None:
    """kernel(in_rows, out_rows, stats) on C-contiguous (n, H) rows of dtype st.

    ins and outs have x's shape (outs writable, unaliased by ins: see
    unalias); stats are (N,) or None, passed as the block's slice. Where
    every in and out is such rows already, one call takes all N rows. Else
    blocks of at most BLOCK_BYTES a scratch array (one row where a row is
    larger): inputs gathered (and converted), outputs scattered (and
    converted). Rows are independent, so the blocks change no value.
    """
    if L.N == 0:
        return
    mi, mo = [L.moved(a) for a in ins], [L.moved(o) for o in outs]
    direct = all(c_rows(m, st) for m in mi + mo)
    per = L.N if direct else max(1, BLOCK_BYTES // (L.H * st.itemsize))
    scratch = _Scratch(min(per, L.N) * L.H, st)
    for idx, n0, n in _runs(L.batch_shape, per):
        rin: list[_Array] = []
        rout: list[_Array] = []
        back = []
        for k, m in enumerate(mi + mo):
            blk = m[idx]
            if c_rows(blk, st):
                r = blk
            else:
                r = scratch.get(k, blk.shape)
                if k < len(mi):
                    cast_into(r, blk)
                else:
                    back.append((blk, r))
            (rin if k < len(mi) else rout).append(r.reshape(n, L.H))
        kernel(rin, rout, [None if a is None else a[n0:n0 + n] for a in stats])
        for blk, r in back:
            cast_into(blk, r)


def by_channels(L: Rows, kt: np.dtype[Any], x: _Array, y: _Array,
                 stats: Sequence[Optional[_Array]], kernel: Callable[..., Any]) -> None:
    """kernel(xs, ys, stats, n, C, s) on contiguous (n, C, s) arrays of dtype
    kt, x normalized over its one axis a: (N, C, S) with N the positions of
    the axes before a, S of those after.

    y has x's shape (writable, unaliased by x); stats are (N * S,) or None,
    passed as the block's slice. Where x and y are (N, C, S) arrays of kt
    already, one call takes them. Else blocks of at most BLOCK_BYTES a
    scratch array (whole samples, or runs of one sample's positions): x
    gathered (16-bit widened), y scattered (rounded). Positions are
    independent, so the blocks change no value.
    """
    a = L.axes[0]
    pre, C, post = x.shape[:a], x.shape[a], x.shape[a + 1:]
    S = int(np.prod(post, dtype=np.int64))
    if L.N == 0:
        return
    if c_rows(x, kt) and c_rows(y, kt):
        kernel(x, y, stats, L.N // S, C, S)
        return
    per = max(1, BLOCK_BYTES // (C * kt.itemsize))   # positions a block
    blocks: Iterable[Tuple[Tuple[Any, ...], int, int, int]]
    if S <= per:
        blocks = ((idx, n0 * S, n, S) for idx, n0, n in _runs(pre, per // S))
    else:
        blocks = ((p + (slice(None),) + idx, i * S + s0, 1, m)
                  for i, p in enumerate(np.ndindex(*pre)) for idx, s0, m in _runs(post, per))
    scratch = _Scratch(min(per, L.N) * C, kt)
    for idx, p0, n, s in blocks:
        xb, yb = x[idx], y[idx]
        xs = xb if c_rows(xb, kt) else scratch.get(0, xb.shape)
        if xs is not xb:
            cast_into(xs, xb)
        ys = yb if c_rows(yb, kt) else scratch.get(1, yb.shape)
        kernel(xs, ys, [None if t is None else t[p0:p0 + n * s] for t in stats], n, C, s)
        if ys is not yb:
            cast_into(yb, ys)


def channels(x: _Array, L: Rows, kt: np.dtype[Any]) -> Optional[Tuple[int, int, int]]:
    """(N, C, S) when x, normalized over one axis that is not the last, takes
    the channels-first kernel: read in place where it is C-contiguous,
    aligned, native and of the kernel's dtype; and for float16/bfloat16 x
    where its float32 widening is C-contiguous (_c_ordered), as the float32
    call on that widening does, widened a block at a time. Else None."""
    if len(L.axes) != 1:
        return None
    if not (c_rows(x, kt) or (_dtypes.is_half(x.dtype) and c_ordered(x))):
        return None
    a = L.axes[0]
    S = int(np.prod(x.shape[a + 1:], dtype=np.int64))
    if S <= 1:
        return None
    return L.N // S, x.shape[a], S
