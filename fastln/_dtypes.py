"""The 16-bit storage dtypes: float16 (NumPy's) and bfloat16 (ml_dtypes').

ml_dtypes is an optional package (the ``bfloat16`` extra), and this module
is fastln's one import of it: every other module that knows bfloat16 asks
here. Imports only NumPy and fastln._optional.
"""
from __future__ import annotations

from typing import Any, FrozenSet, Optional

import numpy as np

from fastln import _optional

BFLOAT16: Optional[np.dtype[Any]]   # None where ml_dtypes is not installed
try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    BFLOAT16 = None
else:
    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

# storage dtypes computed in float32 (results cast back on the way out)
LOW_PRECISION: FrozenSet[np.dtype[Any]] = frozenset(
    [np.dtype(np.float16)] + ([] if BFLOAT16 is None else [BFLOAT16]))


def is_half(dt: np.dtype[Any]) -> bool:
    """dt is float16 or bfloat16, in either byte order."""
    return dt.newbyteorder("=") in LOW_PRECISION


def bfloat16(feature: str = "bfloat16") -> np.dtype[Any]:
    """bfloat16's dtype; without ml_dtypes, the ImportError that names it and
    the extra that installs it (``feature``: what needed it)."""
    if BFLOAT16 is None:
        raise _optional.missing("ml_dtypes", feature)
    return BFLOAT16
