"""Stubs of fastln.rnn._engine, the Cython binding of the LN-RNN engine
(fastln/rnn/_engine.pyx), for type checkers."""
from collections.abc import Sequence
from typing import Any

import numpy.typing as npt
from typing_extensions import TypeAlias, disjoint_base

_Array: TypeAlias = npt.NDArray[Any]

# Cython's table of the module's doctests
__test__: dict[str, str]

def bf16_products() -> str: ...
def int8_products() -> str: ...

# the storage of a model's weight matrices (fastln_rnn_args.wtype)
W_SAME: int
W_BF16: int
W_INT8: int

# cell name -> the engine's cell code
CELLS: dict[str, int]
# (cell, input size, hidden size, projection) -> param_sizes' result
_SIZES: dict[tuple[str, int, int, int], tuple[int, ...]]

def param_sizes(cell: str, I: int, H: int, P: int = 0) -> tuple[int, ...]: ...
def cache_size(cell: str, T: int, B: int, H: int) -> int: ...
def work_size(cell: str, T: int, B: int, H: int) -> int: ...
def forward(
    cell: str,
    T: int,
    B: int,
    I: int,
    H: int,
    eps: float,
    x: _Array,
    params: Sequence[_Array],
    lengths: _Array | None,
    cache: _Array | None,
    y: _Array,
    h: _Array,
    c: _Array | None,
    reverse: bool = False,
    wtype: int = 0,
    packed: _Array | None = None,
    P: int = 0,
) -> int: ...
def pack(cell: str, wtype: int, I: int, H: int, w_ih: _Array, w_hh: _Array,
         w_hr: _Array | None = None, P: int = 0) -> _Array | None: ...
def forward2(
    cell: str,
    T: int,
    B: int,
    I: int,
    H: int,
    eps: float,
    x: _Array,
    params2: Sequence[Sequence[_Array]],
    lengths: _Array | None,
    caches2: Sequence[_Array] | None,
    y: _Array,
    h2: Sequence[_Array] | _Array,
    c2: Sequence[_Array] | _Array | None,
    wtype: int = 0,
    packed2: Sequence[_Array | None] | None = None,
    P: int = 0,
) -> int: ...
def backward(
    cell: str,
    T: int,
    B: int,
    I: int,
    H: int,
    eps: float,
    x: _Array,
    params: Sequence[_Array],
    lengths: _Array | None,
    cache: _Array,
    dy: _Array,
    dh: _Array,
    dc: _Array | None,
    dx: _Array | None,
    grads: Sequence[_Array],
    work: _Array | None = None,
    reverse: bool = False,
) -> int: ...
def backward2(
    cell: str,
    T: int,
    B: int,
    I: int,
    H: int,
    eps: float,
    x: _Array,
    params2: Sequence[Sequence[_Array]],
    lengths: _Array | None,
    caches2: Sequence[_Array],
    dy: _Array,
    dh2: Sequence[_Array] | _Array,
    dc2: Sequence[_Array] | _Array | None,
    dx: _Array | None,
    grads2: Sequence[Sequence[_Array]],
    works2: Sequence[_Array | None],
) -> int: ...
def immutable(a: object) -> bool: ...

@disjoint_base
class Step:
    @property
    def num_layers(self) -> int: ...
    @property
    def input_size(self) -> int: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def out_size(self) -> int: ...
    def __new__(
        cls,
        cell: str,
        I: int,
        H: int,
        eps: float,
        layers: list[list[_Array]],
        packs: list[_Array | None],
        wtype: int,
        bf16: Any,
        keys: list[str],
        owners: list[Any],
        P: int = 0,
    ) -> Step: ...
    def valid(self, params: Any) -> bool: ...
    def __call__(
        self, params: Any, x: Any, state: Any, out: Any = None, state_out: Any = None
    ) -> tuple[_Array, _Array | tuple[_Array, _Array]] | None: ...
    def run(
        self,
        B: int,
        x: _Array,
        h_in: _Array | None,
        c_in: _Array | None,
        y: _Array,
        h: _Array,
        c: _Array | None,
    ) -> int: ...
    def table(
        self, x: _Array, rows: _Array, h: _Array, c: _Array | None, y: _Array
    ) -> int: ...
