"""Type stubs for the compiled module fastln._rows (source: fastln/_rows.pyx).

Checked against the built module by ``python -m mypy.stubtest fastln``
(tests/test_typing.py).
"""
from typing import Any

import numpy.typing as npt
from typing_extensions import TypeAlias

_Array: TypeAlias = npt.NDArray[Any]

# Cython's table of docstrings for doctest (empty)
__test__: dict[str, str]
# the kernels that fastln._norms and fastln._add_norms cimport (fastln/_rows.pxd),
# as capsules
__pyx_capi__: dict[str, Any]

def empty_rows(N: int, H: int, dtype: npt.DTypeLike) -> _Array: ...

# ---- row kernels on canonical (N, H) arrays (used by fastln._general) --------

def norm_rows(
    rms: bool,
    x: _Array,
    w: _Array | None,
    b: _Array | None,
    eps: float,
    y: _Array,
    mean: _Array | None,
    rstd: _Array | None,
) -> None: ...
def norm_backward_rows(
    rms: bool,
    dy: _Array,
    x: _Array,
    mean: _Array | None,
    rstd: _Array,
    w: _Array | None,
    dx: _Array,
    dw: _Array,
    db: _Array | None,
) -> None: ...
def add_norm_rows(
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
def add_norm_backward_rows(
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

# ---- channels first, (N, C, S) arrays ----------------------------------------

def norm_channels(
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
def norm_channels_backward(
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

