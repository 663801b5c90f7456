"""The engine's int8 products in NumPy, for :mod:`fastln.rnn_reference`:
``int8_product`` computes a W^T as the int8 kernels do, and ``Int8Matrix``
stands for an int8 W in the reference's equations."""
from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

_Array = npt.NDArray[np.float64]


def int8_product(a: npt.ArrayLike, q: npt.ArrayLike, scale: npt.ArrayLike) -> _Array:
    """a W^T for an int8 W, as fastln's int8 kernels compute it.

    Each row of a, in float32, is quantized to rint(a * (127 / max|a|))
    (float32 operations, ties to even) with the scale max|a| / 127; the
    int8 products are summed exactly; each sum is converted to float32 and
    multiplied by (its row's scale times scale[n]) in float32.

    Parameters
    ----------
    a : array_like, shape (M, K)
        The product's input rows (x, or h), read as float32.
    q : array_like, shape (N, K)
        W's int8 values.
    scale : array_like, shape (N,)
        The scale of each row of W (float32): W[n] = scale[n] * q[n].

    Returns
    -------
    ndarray of float64, shape (M, N)
        The products, each a float32 value. A row of a with NaN or
        infinity gives NaN, a row of zeros 0.
    """
    a = np.asarray(a, np.float32)
    q = np.asarray(q, np.int64)
    scale = np.asarray(scale, np.float32)
    amax = np.abs(a).max(axis=1) if a.shape[1] else np.zeros(a.shape[0], np.float32)
    bad = ~np.isfinite(a).all(axis=1)
    ok = ~bad & (amax > 0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = np.float32(127) / np.where(ok, amax, np.float32(1))
        r = np.clip(np.rint(a * inv[:, None]), -127, 127)
        sa = np.where(bad, np.float32(np.nan), np.where(ok, amax / np.float32(127),
                                                        np.float32(0)))
    qa = np.where(ok[:, None], r, 0).astype(np.int64)
    acc = (qa @ q.T).astype(np.float32)
    with np.errstate(invalid="ignore"):
        out = acc * (sa.astype(np.float32)[:, None] * scale[None, :])
    return out.astype(np.float64)


class Int8Matrix:
    """An int8 weight matrix with its row scales, standing for W in the
    reference's steps: W[rows] keeps the rows' scales, and ``a @ W.T`` is
    int8_product (NumPy defers the product to this class)."""

    __array_ufunc__ = None

    def __init__(self, q: Any, scale: Any, transposed: bool = False) -> None:
        self.q, self.scale, self.transposed = q, scale, transposed

    def __getitem__(self, rows: Any) -> "Int8Matrix":
        return Int8Matrix(self.q[rows], self.scale[rows])

    @property
    def T(self) -> "Int8Matrix":
        return Int8Matrix(self.q, self.scale, True)

    def __rmatmul__(self, a: Any) -> _Array:
        if not self.transposed:
            raise TypeError("an int8 weight matrix is used as W^T in products")
        return int8_product(np.asarray(a).reshape(-1, self.q.shape[1]), self.q,
                            self.scale).reshape(np.shape(a)[:-1] + (self.q.shape[0],))
