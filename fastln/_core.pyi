"""Type stubs for the compiled module fastln._core (source: fastln/_core.pyx).

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

_api: ModuleType
# Cython's table of docstrings for doctest (empty)
__test__: dict[str, str]
# the C functions that fastln.rnn._engine cimports (fastln/_core.pxd), as capsules
__pyx_capi__: dict[str, Any]

# ---- public functions --------------------------------------------------------

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

# ---- threads and instruction sets --------------------------------------------

def get_num_threads() -> int: ...
def set_num_threads(n: int) -> None: ...
def get_requested_threads() -> int: ...
def has_openmp() -> bool: ...
def get_isa() -> str: ...
def isa_supported(name: str) -> bool: ...
def _set_isa(name: str) -> None: ...
def _parallel_copy(dst: _Array, src: _Array, nt: bool = ...) -> None: ...
def _half_convert(src: _Array, dst: _Array) -> None: ...
def _set_default_threads(n: int) -> None: ...

# ---- the run-time policy -----------------------------------------------------

def _parse_bytes(s: object) -> int | None: ...
def _parse_cache_bytes(s: object) -> int | None: ...
def _cache_sizes() -> dict[str, Any]: ...
def _set_cache_sizes(
    l1: float | None = None, l2: float | None = None, l3: float | None = None,
    l3_shared: bool = False,
) -> None: ...
def _detect_caches(
    sysfs_root: object = None, use_sysconf: bool = False, use_cpuid: bool = False
) -> dict[str, Any]: ...
def _policy(
    kind: str, N: int, H: int, itemsize: int, isa: str, nthreads: int,
    l1: float, l2: float, l3: float, l3_shared: bool = False,
) -> dict[str, Any]: ...
def _invalid_cache_env(environ: Any) -> list[tuple[str, str]]: ...
def _warn_invalid_cache_env() -> None: ...

# ---- the cache of large outputs ----------------------------------------------

def _cache_set_limit(nbytes: int) -> None: ...
def _cache_release() -> None: ...
def _cache_stats() -> tuple[int, int, int, int, int]: ...
def _empty_rows(N: int, H: int, dtype: npt.DTypeLike) -> _Array: ...

# ---- row kernels on canonical (N, H) arrays (used by fastln._api) ------------

def _layer_norm_rows(
    x: _Array,
    w: _Array | None,
    b: _Array | None,
    eps: float,
    y: _Array,
    mean: _Array | None,
    rstd: _Array | None,
) -> None: ...
def _layer_norm_backward_rows(
    dy: _Array,
    x: _Array,
    mean: _Array,
    rstd: _Array,
    w: _Array | None,
    dx: _Array,
    dw: _Array,
    db: _Array,
) -> None: ...
def _add_norm_rows(
    rms: bool,
    x: _Array,
    res: _Array,
    bi: _Array | None,
    w: _Array | None,
    b: _Array | None,
    eps: float,
    y: _Array,
    s: _Array,
    mean: _Array | None,
    rstd: _Array | None,
) -> None: ...
def _add_norm_backward_rows(
    rms: bool,
    dy: _Array,
    x: _Array,
    ds: _Array | None,
    mean: _Array | None,
    rstd: _Array,
    w: _Array | None,
    dx: _Array,
    dw: _Array,
    db: _Array | None,
    di: _Array | None,
) -> None: ...
def _rms_norm_rows(
    x: _Array, w: _Array | None, eps: float, y: _Array, rstd: _Array | None
) -> None: ...
def _rms_norm_backward_rows(
    dy: _Array, x: _Array, rstd: _Array, w: _Array | None, dx: _Array, dw: _Array
) -> None: ...

def _norm_channels(
    x: _Array,
    w: _Array | None,
    b: _Array | None,
    eps: float,
    y: _Array,
    mean: _Array | None,
    rstd: _Array | None,
    N: int,
    C: int,
    S: int,
    rms: bool,
) -> int: ...
def _norm_channels_backward(
    dy: _Array,
    x: _Array,
    mean: _Array | None,
    rstd: _Array,
    w: _Array | None,
    dx: _Array,
    dw: _Array,
    db: _Array | None,
    N: int,
    C: int,
    S: int,
) -> int: ...

