"""Type stubs for the compiled module fastln._add_norms (source: fastln/_add_norms.pyx).

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
# out= of the fused add: y's buffer, or (y's, s's), either None
_Out: TypeAlias = _Array | tuple[_Array | None, _Array | None] | None

_general: ModuleType
_validate: ModuleType
# Cython's table of docstrings for doctest
__test__: dict[str, str]

@overload
def add_layer_norm(
    x: npt.ArrayLike,
    residual: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    bias: npt.ArrayLike | None = None,
    *,
    input_bias: npt.ArrayLike | None = None,
    axis: _Axis = -1,
    eps: _Eps = 1e-05,
    out: _Out = None,
    return_stats: Literal[False] = False,
) -> tuple[_Array, _Array]: ...
@overload
def add_layer_norm(
    x: npt.ArrayLike,
    residual: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    bias: npt.ArrayLike | None = None,
    *,
    input_bias: npt.ArrayLike | None = None,
    axis: _Axis = -1,
    eps: _Eps = 1e-05,
    out: _Out = None,
    return_stats: Literal[True],
) -> tuple[_Array, _Array, _Array, _Array]: ...
@overload
def add_layer_norm(
    x: npt.ArrayLike,
    residual: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    bias: npt.ArrayLike | None = None,
    *,
    input_bias: npt.ArrayLike | None = None,
    axis: _Axis = -1,
    eps: _Eps = 1e-05,
    out: _Out = None,
    return_stats: bool = False,
) -> tuple[_Array, _Array] | tuple[_Array, _Array, _Array, _Array]: ...
@overload
def add_rms_norm(
    x: npt.ArrayLike,
    residual: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    *,
    input_bias: npt.ArrayLike | None = None,
    axis: _Axis = -1,
    eps: _Eps = 1e-06,
    out: _Out = None,
    return_stats: Literal[False] = False,
) -> tuple[_Array, _Array]: ...
@overload
def add_rms_norm(
    x: npt.ArrayLike,
    residual: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    *,
    input_bias: npt.ArrayLike | None = None,
    axis: _Axis = -1,
    eps: _Eps = 1e-06,
    out: _Out = None,
    return_stats: Literal[True],
) -> tuple[_Array, _Array, _Array]: ...
@overload
def add_rms_norm(
    x: npt.ArrayLike,
    residual: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    *,
    input_bias: npt.ArrayLike | None = None,
    axis: _Axis = -1,
    eps: _Eps = 1e-06,
    out: _Out = None,
    return_stats: bool = False,
) -> tuple[_Array, _Array] | tuple[_Array, _Array, _Array]: ...
@overload
def add_layer_norm_backward(
    dy: npt.ArrayLike,
    s: npt.ArrayLike,
    mean: npt.ArrayLike,
    rstd: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    *,
    ds: npt.ArrayLike | None = None,
    axis: _Axis = -1,
    out: _Array | None = None,
    input_bias_grad: Literal[False] = False,
    residual_shape: None = None,
) -> tuple[_Array, _Array, _Array]: ...
@overload
def add_layer_norm_backward(
    dy: npt.ArrayLike,
    s: npt.ArrayLike,
    mean: npt.ArrayLike,
    rstd: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    *,
    ds: npt.ArrayLike | None = None,
    axis: _Axis = -1,
    out: _Array | None = None,
    input_bias_grad: Literal[True],
    residual_shape: None = None,
) -> tuple[_Array, _Array, _Array, _Array]: ...
@overload
def add_layer_norm_backward(
    dy: npt.ArrayLike,
    s: npt.ArrayLike,
    mean: npt.ArrayLike,
    rstd: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    *,
    ds: npt.ArrayLike | None = None,
    axis: _Axis = -1,
    out: _Array | None = None,
    input_bias_grad: Literal[False] = False,
    residual_shape: Sequence[SupportsIndex],
) -> tuple[_Array, _Array, _Array, _Array]: ...
@overload
def add_layer_norm_backward(
    dy: npt.ArrayLike,
    s: npt.ArrayLike,
    mean: npt.ArrayLike,
    rstd: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    *,
    ds: npt.ArrayLike | None = None,
    axis: _Axis = -1,
    out: _Array | None = None,
    input_bias_grad: Literal[True],
    residual_shape: Sequence[SupportsIndex],
) -> tuple[_Array, _Array, _Array, _Array, _Array]: ...
@overload
def add_layer_norm_backward(
    dy: npt.ArrayLike,
    s: npt.ArrayLike,
    mean: npt.ArrayLike,
    rstd: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    *,
    ds: npt.ArrayLike | None = None,
    axis: _Axis = -1,
    out: _Array | None = None,
    input_bias_grad: bool = False,
    residual_shape: Sequence[SupportsIndex] | None = None,
) -> tuple[_Array, ...]: ...
@overload
def add_rms_norm_backward(
    dy: npt.ArrayLike,
    s: npt.ArrayLike,
    rstd: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    *,
    ds: npt.ArrayLike | None = None,
    axis: _Axis = -1,
    out: _Array | None = None,
    input_bias_grad: Literal[False] = False,
    residual_shape: None = None,
) -> tuple[_Array, _Array]: ...
@overload
def add_rms_norm_backward(
    dy: npt.ArrayLike,
    s: npt.ArrayLike,
    rstd: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    *,
    ds: npt.ArrayLike | None = None,
    axis: _Axis = -1,
    out: _Array | None = None,
    input_bias_grad: Literal[True],
    residual_shape: None = None,
) -> tuple[_Array, _Array, _Array]: ...
@overload
def add_rms_norm_backward(
    dy: npt.ArrayLike,
    s: npt.ArrayLike,
    rstd: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    *,
    ds: npt.ArrayLike | None = None,
    axis: _Axis = -1,
    out: _Array | None = None,
    input_bias_grad: Literal[False] = False,
    residual_shape: Sequence[SupportsIndex],
) -> tuple[_Array, _Array, _Array]: ...
@overload
def add_rms_norm_backward(
    dy: npt.ArrayLike,
    s: npt.ArrayLike,
    rstd: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    *,
    ds: npt.ArrayLike | None = None,
    axis: _Axis = -1,
    out: _Array | None = None,
    input_bias_grad: Literal[True],
    residual_shape: Sequence[SupportsIndex],
) -> tuple[_Array, _Array, _Array, _Array]: ...
@overload
def add_rms_norm_backward(
    dy: npt.ArrayLike,
    s: npt.ArrayLike,
    rstd: npt.ArrayLike,
    weight: npt.ArrayLike | None = None,
    *,
    ds: npt.ArrayLike | None = None,
    axis: _Axis = -1,
    out: _Array | None = None,
    input_bias_grad: bool = False,
    residual_shape: Sequence[SupportsIndex] | None = None,
) -> tuple[_Array, ...]: ...
