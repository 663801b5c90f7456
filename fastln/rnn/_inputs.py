"""The argument checks of the recurrent models: what a caller hands in (x,
dy, states, lengths, out arrays, sizes) checked and made into the arrays the
engine reads, or a TypeError or ValueError naming the argument."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, TypeVar, Union

import numpy as np
import numpy.typing as npt

from .. import _dtypes, _torch, _validate
from ._bf16 import _from_bf16, _is_bf16

_Array = npt.NDArray[Any]

# a model's state: h for LNRNN, LNGRU, GRU and RNN; (h, c) for LNLSTM and LSTM
State = TypeVar("State", _Array, Tuple[_Array, _Array])
# a state argument: None for zeros; either part of (h, c) may be None too
StateArg = Union[None, npt.ArrayLike, Tuple[Optional[npt.ArrayLike], Optional[npt.ArrayLike]]]


def as_array(a: Any, name: str, dt: np.dtype[Any], dtype: np.dtype[Any],
             strict: bool = False, layout: bool = True, data: bool = False) -> _Array:
    """a as an array of dt, the compute dtype of a model of dtype `dtype`
    (float32 for bfloat16; native byte order, aligned and C-contiguous
    unless layout is False). Another real type is cast, or with strict
    (data: x, dy, states) a TypeError; non-numbers raise a TypeError naming
    the argument. With data (x), a bfloat16 model also takes bfloat16. A
    torch tensor is read as an array (one that requires grad is a
    TypeError) and then held to the rule of an ndarray of its dtype: a
    float64 tensor into a float32 model is refused as a float64 ndarray is,
    never rounded silently."""
    tensor = _torch.is_tensor(a)
    if tensor:
        a = _validate.tensor(a, name)
    if data and isinstance(a, np.ndarray) and _is_bf16(a.dtype) and _is_bf16(dtype):
        a = _from_bf16(a)
    if isinstance(a, np.ndarray):
        kind = "f" if a.dtype in _dtypes.LOW_PRECISION else a.dtype.kind
        if kind not in "fiub":
            raise TypeError(f"{name} must hold real numbers, got dtype {a.dtype}")
        if strict and (kind != "f" or a.dtype.itemsize != dt.itemsize):
            takes = (f"the {dtype} model takes {'bfloat16 or ' if data else ''}{dt}"
                     if dt != dtype else f"the model is {dt}")
            how = f"{name}.to(torch.{dt})" if tensor else f"{name}.astype(np.{dt})"
            raise TypeError(f"{name} has dtype {a.dtype}, but {takes}; convert it with {how}")
    else:
        try:
            a = np.asarray(a, dtype=dt)
        except (ValueError, TypeError) as e:
            raise TypeError(f"{name} must be an array of numbers: {e}") from None
    arr: _Array = a
    if layout:
        return np.require(arr, dt, ["C", "A"])
    return arr if arr.dtype == dt else arr.astype(dt)


class Inputs:
    """The checks of a model's arguments that depend on its configuration
    (a base of :class:`fastln.rnn.RecurrentModel`, which sets the
    attributes declared here)."""

    input_size: int
    hidden_size: int
    proj_size: int          # LSTM's projection P, or 0
    num_layers: int
    batch_first: bool
    bidirectional: bool
    dtype: np.dtype[Any]    # the model's dtype
    _dt: np.dtype[Any]      # the state's: float32 for bfloat16 and int8 models
    _has_cell: bool         # the state is (h, c)

    @property
    def num_directions(self) -> int:
        """2 for a bidirectional model, else 1."""
        return 2 if self.bidirectional else 1

    def _input(self, x: Any, name: str, last: int, T: Optional[int] = None,
               B: Optional[int] = None) -> _Array:
        """x (x or dy) as a time-major C-contiguous (T, B, last) array of the
        state's dtype; T and B, where given, are the forward's."""
        x = as_array(x, name, self._dt, self.dtype, strict=True, layout=False,
                     data=name == "x")
        order = "(B, T, {})" if self.batch_first else "(T, B, {})"
        if x.ndim != 3 or x.shape[2] != last:
            raise ValueError(f"{name} must have shape {order.format(last)}, got {x.shape}")
        if self.batch_first:
            x = x.transpose(1, 0, 2)
        if x.shape[0] < 1:
            raise ValueError(f"{name} must have at least one time step, got shape {x.shape}")
        if T is not None and x.shape[:2] != (T, B):
            want: Tuple[Optional[int], ...] = (B, T) if self.batch_first else (T, B)
            raise ValueError(f"{name} must have shape {order.format(last)} = "
                             f"{want + (last,)} to match the forward, got "
                             f"{(x.transpose(1, 0, 2) if self.batch_first else x).shape}")
        return np.require(x, requirements=["C", "A"])

    @property
    def _out_size(self) -> int:
        """The features of h and of each direction's y: P with a projection, else H."""
        return self.proj_size or self.hidden_size

    def _state_shapes(self, B: int, layers: int) -> List[Tuple[int, int, int]]:
        """The shapes of the state's parts, [h] or [h, c], for B rows and
        layers (D * num_layers, or num_layers for a step): c has H features,
        h those of _out_size."""
        h = (layers, B, self._out_size)
        return [h, (layers, B, self.hidden_size)] if self._has_cell else [h]

    def _states(self, state: Any, B: int, name: str) -> List[_Array]:
        """The state as a list of (D * num_layers, B, H) arrays (copies): [h] or [h, c]
        (h of P features with a projection)."""
        shapes = self._state_shapes(B, self.num_directions * self.num_layers)
        shape = shapes[0]
        n = len(shapes)
        if state is None:
            return [np.zeros(s, self._dt) for s in shapes]
        if not self._has_cell and isinstance(state, tuple):
            raise TypeError(f"{name} of {type(self).__name__} is h itself, an array of shape "
                            f"(D * num_layers, B, H) = {shape}, not a tuple: pass h, "
                            f"not (h,)")
        parts = state if self._has_cell and type(state) is tuple else (state,)
        if len(parts) == n:   # the common case, quickly
            dt = self._dt
            a = parts[0]
            if type(a) is np.ndarray and a.dtype is dt and a.shape == shape:
                if n == 1:
                    return [a.copy()]
                b = parts[1]
                if type(b) is np.ndarray and b.dtype is dt and b.shape == shapes[1]:
                    return [a.copy(), b.copy()]
        if self._has_cell:
            if not isinstance(state, (tuple, list)) or len(state) != 2:
                raise TypeError(f"{name} must be a tuple (h, c) for {type(self).__name__}, "
                                f"got {type(state).__name__}")
            parts = tuple(state)
        else:
            parts = (state,)
        out = []
        for part, shape in zip(parts, shapes):
            if part is None:
                out.append(np.zeros(shape, self._dt))
                continue
            a = as_array(part, name, self._dt, self.dtype, strict=True, layout=False)
            if a.shape != shape:
                what = "(2 * num_layers, B, " if self.bidirectional else "(num_layers, B, "
                what += "P)" if self.proj_size and shape is shapes[0] else "H)"
                raise ValueError(f"{name} must have shape {what} = {shape}, got {a.shape}")
            out.append(np.array(a, dtype=self._dt, order="C"))
        return out

    @staticmethod
    def _lengths(lengths: Any, T: int, B: int) -> Optional[_Array]:
        """lengths (a forward's) as a C-contiguous int64 array (B,) of values in
        [1, T], or None for None."""
        if lengths is None:
            return None
        a = np.asarray(lengths)
        if a.size == 0 and not isinstance(lengths, np.ndarray):
            a = a.astype(np.int64)   # [] for B = 0
        if a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"lengths must hold integers, got dtype {a.dtype}")
        if a.shape != (B,):
            raise ValueError(f"lengths must have shape (B,) = ({B},), got {a.shape}")
        if a.size and (a.min() < 1 or a.max() > T):
            raise ValueError(f"lengths must lie in [1, T] = [1, {T}], "
                             f"got values from {a.min()} to {a.max()}")
        return np.require(a, np.int64, ["C", "A"])

    def _outputs(self, arrays: Any, shapes: Sequence[Tuple[int, ...]],
                 name: str) -> List[_Array]:
        """arrays (an array, or a tuple (h, c) for a model with a cell state
        when name is state_out) checked as outputs of shapes (one per part)
        and dtype (the model's for out, the state's for the state):
        C-contiguous, aligned and writable; [] for None."""
        if arrays is None:
            return []
        n = 2 if self._has_cell and name == "state_out" else 1
        parts = arrays if n == 2 else (arrays,)
        if n == 2 and not (type(arrays) is tuple and len(arrays) == 2):
            raise TypeError(f"{name} must be a tuple (h, c) for {type(self).__name__}, "
                            f"got {type(arrays).__name__}")
        want = self.dtype if name == "out" else self._dt
        for a, shape in zip(parts, shapes):
            if not isinstance(a, np.ndarray):
                raise TypeError(f"{name} must be a NumPy array, got {type(a).__name__}")
            if a.dtype != want:
                raise TypeError(f"{name} has dtype {a.dtype}, expected {want}")
            if a.shape != shape:
                raise ValueError(f"{name} must have shape {shape}, got {a.shape}")
            if not (a.flags.c_contiguous and a.flags.aligned and a.flags.writeable
                    and a.dtype.isnative):
                raise ValueError(f"{name} must be a C-contiguous, aligned, writable array")
        return list(parts)
