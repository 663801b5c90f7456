"""The bfloat16 side of the recurrent models: the dtype (from ml_dtypes,
an optional package) and the conversions between bfloat16 and float32."""
from __future__ import annotations

from typing import (
    Any,
    Optional,
)

import numpy as np
import numpy.typing as npt

from .. import _lib, _optional
from .._dtypes import BFLOAT16 as _BF16

_Array = npt.NDArray[Any]


def _is_bf16(dtype: Any) -> bool:
    """Whether dtype is ml_dtypes' bfloat16: never without ml_dtypes (NumPy
    reads ``dtype == None`` as ``dtype == float64``, so _BF16 is never
    compared while it is None)."""
    return _BF16 is not None and dtype == _BF16


def _to_bf16(a: _Array, out: Optional[_Array] = None) -> _Array:
    """a's values (float32) rounded to nearest even into bfloat16: into out
    (C-contiguous, a's shape), or a new array."""
    a = np.require(a, requirements=["C", "A"])
    if out is None:
        out = np.empty(a.shape, _BF16)
    _lib._half_convert(a, out.view(np.uint16))
    return out


def _from_bf16(a: _Array) -> _Array:
    """A new C-contiguous float32 array of a's values (bfloat16)."""
    out = np.empty(a.shape, np.float32)
    _lib._half_convert(np.require(a, requirements=["C", "A"]).view(np.uint16), out)
    return out


def _model_dtype(dtype: Any, name: str) -> np.dtype[Any]:
    """dtype as a model's: float32, float64 or bfloat16 (ml_dtypes), else a TypeError."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        if _BF16 is None and "bfloat16" in str(dtype):
            raise _optional.missing("ml_dtypes", "a bfloat16 model") from None
        raise TypeError(f"{name} must be float32, float64 or ml_dtypes.bfloat16, "
                        f"got {dtype!r}") from None
    if dt not in (np.float32, np.float64) and not _is_bf16(dt):
        raise TypeError(f"{name} must be float32, float64 or ml_dtypes.bfloat16, got {dt}")
    return dt

