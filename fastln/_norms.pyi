"""Type stubs for the compiled module fastln._norms (source: fastln/_norms.pyx).

Checked against the built module by ``python -m mypy.stubtest fastln``
(tests/test_typing.py).
"""
from collections.abc import Sequence
from types import ModuleType
from typing import Any, Literal, SupportsIndex, overload

import numpy as np
import numpy.typing as npt
from typing_extensions import TypeAlias

_Array: TypeAlias = npt.NDArray[Any]
# an int, or a sequence of ints (operator.index is applied to each)
_Axis: TypeAlias = SupportsIndex | Sequence[SupportsIndex]
# a real number: Python float or int, or a NumPy floating scalar
_Eps: TypeAlias = float | np.floating[Any]

_general: ModuleType
_validate: ModuleType
# Cython's table of docstrings for doctest
__test__: dict[str, str]
# check_flag, which fastln._add_norms cimports (fastln/_norms.pxd), as a capsule
__pyx_capi__: dict[str, Any]

@overload
def layer_norm(
    x: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    bias: npt.ArrayLike | None = None,
    *,
    axis: _Axis = -1,
    eps: _Eps = 1e-05,
    out: _Array | None = None,
    return_stats: Literal[False] = False,
) -> _Array: ...
@overload
def layer_norm(
    x: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    bias: npt.ArrayLike | None = None,
    *,
    axis: _Axis = -1,
    eps: _Eps = 1e-05,
    out: _Array | None = None,
    return_stats: Literal[True],
) -> tuple[_Array, _Array, _Array]: ...
@overload
def layer_norm(
    x: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    bias: npt.ArrayLike | None = None,
    *,
    axis: _Axis = -1,
    eps: _Eps = 1e-05,
    out: _Array | None = None,
    return_stats: bool = False,
) -> _Array | tuple[_Array, _Array, _Array]: ...
def layer_norm_backward(
    dy: npt.ArrayLike,
    x: npt.ArrayLike,
    mean: npt.ArrayLike,
    rstd: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    *,
    axis: _Axis = -1,
    out: _Array | None = None,
) -> tuple[_Array, _Array, _Array]: ...
@overload
def rms_norm(
    x: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    *,
    axis: _Axis = -1,
    eps: _Eps = 1e-06,
    out: _Array | None = None,
    return_stats: Literal[False] = False,
) -> _Array: ...
@overload
def rms_norm(
    x: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    *,
    axis: _Axis = -1,
    eps: _Eps = 1e-06,
    out: _Array | None = None,
    return_stats: Literal[True],
) -> tuple[_Array, _Array]: ...
@overload
def rms_norm(
    x: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    *,
    axis: _Axis = -1,
    eps: _Eps = 1e-06,
    out: _Array | None = None,
    return_stats: bool = False,
) -> _Array | tuple[_Array, _Array]: ...
def rms_norm_backward(
    dy: npt.ArrayLike,
    x: npt.ArrayLike,
    rstd: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    *,
    axis: _Axis = -1,
    out: _Array | None = None,
) -> tuple[_Array, _Array]: ...
