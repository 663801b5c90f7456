"""The formats of a recurrent model's weight matrices: Float (float32 or
float64, the model's own dtype), BFloat16 and Int8 (int8 values with a
float32 scale per row).

A model asks its format for what depends on how its weight matrices are
stored: the dtypes of its data and parameters, a matrix as ``params`` keeps
it and as the engine reads it, the engine's name for the storage, whether
the model trains, and how y leaves the engine. A model changes format only
by becoming a new model (``.to``, :func:`fastln.rnn.quantize`), whose
parameters the new format converts."""
from __future__ import annotations

import math
from typing import AbstractSet, Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import numpy.typing as npt

from .. import _validate
from . import _engine
from ._bf16 import _BF16, _is_bf16, _model_dtype, _to_bf16
from ._inputs import as_array

_Array = npt.NDArray[Any]
_Shape = Tuple[int, ...]


def aligned_empty(shape: _Shape, dtype: Any, order: str) -> _Array:
    """A new array whose data starts on a 64-byte boundary: the product
    kernels read a weight matrix in whole cache lines (a row that straddles
    two lines costs two loads)."""
    dt = np.dtype(dtype)
    n = math.prod(shape) * dt.itemsize
    buf = np.empty(n + 64, np.uint8)
    skip = -buf.ctypes.data % 64
    flat = buf[skip:skip + n].view(dt)
    return flat.reshape(shape, order=order)  # type: ignore[call-overload]


def frozen(a: npt.ArrayLike) -> _Array:
    """A read-only copy of a, in C order, whose memory is a bytes object.
    Nothing can write to it: no view of it predates it, and NumPy refuses to
    make a view of immutable memory writable. So the packed copy a model
    keeps of it stays valid (see _engine.immutable)."""
    a = np.asarray(a)
    return np.frombuffer(a.tobytes(order="C"), a.dtype).reshape(a.shape)


def int8_values(a: _Array, key: str) -> _Array:
    """a (an int8 model's weight matrix) as int8: integers in [-128, 127],
    else a TypeError or ValueError naming params[key]."""
    if a.dtype != np.int8:
        if a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"params[{key!r}] of an int8 model must hold int8 values, "
                            f"got dtype {a.dtype}")
        if a.size and (a.min() < -128 or a.max() > 127):
            raise ValueError(f"params[{key!r}] of an int8 model must lie in [-128, 127], "
                             f"got values from {a.min()} to {a.max()}")
        a = a.astype(np.int8)
    return a


def quantize_rows(w: npt.ArrayLike) -> Tuple[_Array, _Array]:
    """A weight matrix (N, K) as int8 values q (N, K) and a float32 scale
    per row (N): q = rint(w / scale) in [-127, 127], scale = max |w_row| /
    127 (0 for a row of zeros), in float64 from the matrix's values, so that
    quantizing the same matrix twice gives bitwise the same result."""
    a = np.asarray(w, np.float64)
    if not np.isfinite(a).all():
        raise ValueError("the weights hold NaN or infinity, which int8 cannot represent")
    amax = np.abs(a).max(axis=1) if a.shape[1] else np.zeros(a.shape[0])
    scale = (amax / 127.0).astype(np.float32)
    s = scale.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(s[:, None] > 0, np.rint(a / np.where(s > 0, s, 1.0)[:, None]), 0.0)
    return np.clip(q, -127, 127).astype(np.int8), scale


class Format:
    """How a model stores its weight matrices; the base of the three formats.

    dtype is the model's dtype (of x and y), compute that of the state, the
    arrays between layers and every parameter but the weight matrices, and
    weight that of the weight matrices in ``params``.
    """

    wtype = _engine.W_SAME   # the storage, as the engine names it
    order = "C"              # a weight matrix's memory order in params
    repr_extra = ""          # what the model's repr adds
    # the TypeErrors of a forward with a cache and of a backward, for a
    # format that runs inference only; empty for one that trains
    refusals: Tuple[str, ...] = ()

    def __init__(self, dtype: np.dtype[Any], compute: np.dtype[Any],
                 weight: np.dtype[Any]) -> None:
        self.dtype = dtype
        self.compute = compute
        self.weight = weight
        # the dtype the engine's float32 y is rounded to (the bfloat16 of a
        # bfloat16 model), or None where y leaves the engine as it is
        self.rounds_to: Optional[np.dtype[Any]] = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dtype})"

    def to(self, dtype: Any) -> Format:
        """The format of a copy of the model in dtype (``.to``)."""
        return format_of(dtype)

    def check_trains(self, backward: bool) -> None:
        """Raises the TypeError of a training call (a forward with a cache,
        or with backward True a backward) on a model that runs inference only."""
        if self.refusals:
            raise TypeError(self.refusals[backward])

    def keep(self, a: _Array) -> _Array:
        """A weight matrix of the weight dtype as params keeps it: as it is."""
        return a

    def param(self, key: str, value: Any, matrix: bool) -> _Array:
        """value as params[key]: a new array of the compute dtype, or for a
        weight matrix (matrix True) the format's own (see matrix)."""
        if matrix:
            return self.matrix(np.asarray(value), key)
        return np.array(value, dtype=self.compute)

    def matrix(self, value: _Array, key: str) -> _Array:
        """value as params[key], a weight matrix: a new array, as the format
        keeps it."""
        raise NotImplementedError

    def initial(self, shape: _Shape, rng: np.random.Generator, bound: float) -> _Array:
        """A new weight matrix of U(-bound, bound) draws: made in float64 a
        block of rows at a time (the same stream of draws as one call for
        the whole matrix) and rounded into place, so that no float64 copy
        of the matrix exists."""
        a = aligned_empty(shape, self.weight, self.order)
        rows = max(1, (1 << 20) // shape[1])   # 8 MiB of float64 draws at a time
        for r in range(0, shape[0], rows):
            block = a[r:r + rows]
            block[...] = rng.uniform(-bound, bound, block.shape)
        return self.keep(a)

    def engine_matrix(self, p: Any, name: str, key: str) -> _Array:
        """params[key] (p, a weight matrix; name says it in errors) as the
        engine reads it, or a TypeError or ValueError naming it."""
        raise NotImplementedError

    def companions(self, key: str, shape: _Shape) -> List[Tuple[str, _Shape]]:
        """The parameters that go with the weight matrix key of shape: none."""
        return []

    def convert(self, params: Mapping[str, Any], matrices: AbstractSet[str],
                source: Format) -> Dict[str, _Array]:
        """The parameters of a model of format source (params; matrices the
        keys of its weight matrices) as a model of this format holds them."""
        return {key: self.param(key, value, key in matrices) for key, value in params.items()}

    def gradients(self, shapes: Mapping[str, _Shape]) -> Dict[str, _Array]:
        """A new model's grads: zeros of the parameters' shapes."""
        return {key: np.zeros(shape, self.compute) for key, shape in shapes.items()}

    def engine_y(self, out: Optional[_Array], shape: _Shape) -> _Array:
        """Where the engine writes a step's y: out, or a new array."""
        return out if out is not None else np.empty(shape, self.compute)

    def output(self, y: _Array, out: Optional[_Array] = None) -> _Array:
        """The engine's y as the model returns it: y itself."""
        return y


class Float(Format):
    """float32 or float64 weight matrices, of the model's dtype, kept in
    Fortran order: the layout the product kernels read in place, so that a
    change to them, by any route, is seen by the next call, and a step packs
    nothing."""

    order = "F"

    def __init__(self, dtype: np.dtype[Any]) -> None:
        super().__init__(dtype, dtype, dtype)

    def matrix(self, value: _Array, key: str) -> _Array:
        """A new array of the model's dtype in Fortran order, aligned to 64 bytes."""
        new = aligned_empty(value.shape, self.weight, self.order)
        new[...] = value
        return new

    def engine_matrix(self, p: Any, name: str, key: str) -> _Array:
        """p of the model's dtype, C- or Fortran-ordered (the engine reads both)."""
        p = np.require(as_array(p, name, self.compute, self.dtype, layout=False),
                       self.compute, ["A"])
        if not (p.flags.c_contiguous or p.flags.f_contiguous):
            p = np.asfortranarray(p)
        return p


class _Frozen(Format):
    """A format whose weight matrices are frozen (see frozen): the model
    packs them for the kernels once and keeps the packed copy."""

    def keep(self, a: _Array) -> _Array:
        """A frozen copy of a."""
        return frozen(a)


class BFloat16(_Frozen):
    """bfloat16 weight matrices, for inference: every other parameter and
    the state are float32, and the model takes x and gives y in bfloat16
    (x in float32 too)."""

    wtype = _engine.W_BF16
    refusals = ("a bfloat16 model runs inference only: call forward(x, cache=False) or "
                "step(); train in float32 (the model's .to(np.float32)) and convert with "
                ".to(ml_dtypes.bfloat16)",
                "a bfloat16 model runs inference only and has no backward: train in "
                "float32 (the model's .to(np.float32))")

    def __init__(self, dtype: np.dtype[Any]) -> None:
        super().__init__(dtype, np.dtype(np.float32), dtype)
        self.rounds_to = dtype

    def matrix(self, value: _Array, key: str) -> _Array:
        """value rounded to bfloat16, frozen."""
        return frozen(value.astype(self.weight, copy=False))

    def engine_matrix(self, p: Any, name: str, key: str) -> _Array:
        """params[key] as its bits (uint16), C-contiguous."""
        return np.require(_validate.asarray(p, name), _BF16, ["C", "A"]).view(np.uint16)

    def engine_y(self, out: Optional[_Array], shape: _Shape) -> _Array:
        """A new float32 array (output rounds it into out)."""
        return np.empty(shape, self.compute)

    def output(self, y: _Array, out: Optional[_Array] = None) -> _Array:
        """y rounded to bfloat16: into out, or a new array."""
        return _to_bf16(y, out)


class Int8(_Frozen):
    """int8 weight matrices with a float32 scale per row (fastln.rnn.quantize),
    for inference: params["weight_ih_scale_l0"] holds the scales of
    params["weight_ih_l0"]; x, y, the state and every other parameter are
    float32."""

    wtype = _engine.W_INT8
    repr_extra = ", weights=int8"
    refusals = ("an int8 model runs inference only: call forward(x, cache=False) or "
                "step(); train the float model and quantize it again with "
                "fastln.rnn.quantize",
                "an int8 model runs inference only and has no backward: train the float "
                "model and quantize it again")

    def __init__(self) -> None:
        f32 = np.dtype(np.float32)
        super().__init__(f32, f32, np.dtype(np.int8))

    def __repr__(self) -> str:
        return "Int8()"

    def to(self, dtype: Any) -> Format:
        format_of(dtype)   # a bad dtype says so first
        raise TypeError("an int8 model keeps its weights in int8 and cannot change dtype: "
                        "quantize the float model instead")

    def matrix(self, value: _Array, key: str) -> _Array:
        """value's integers as int8, frozen."""
        return frozen(int8_values(value, key))

    def engine_matrix(self, p: Any, name: str, key: str) -> _Array:
        """p's integers as int8, C-contiguous."""
        return np.require(int8_values(_validate.asarray(p, name), key), None, ["C", "A"])

    def companions(self, key: str, shape: _Shape) -> List[Tuple[str, _Shape]]:
        """The scales of the matrix's rows (the engine reads each layer's
        two after its other parameters)."""
        return [(_scale_key(key), shape[:1])]

    def convert(self, params: Mapping[str, Any], matrices: AbstractSet[str],
                source: Format) -> Dict[str, _Array]:
        """A float model's parameters quantized: each weight matrix as int8
        values and row scales (quantize_rows), the others in float32."""
        if isinstance(source, Int8):
            raise ValueError("model is int8 already")
        out = {}
        for key, value in params.items():
            if key in matrices:
                w = value.astype(np.float32) if isinstance(value, np.ndarray) and \
                    _is_bf16(value.dtype) else value
                q, scale = quantize_rows(w)
                out[key] = frozen(q)
                out[_scale_key(key)] = scale
            else:
                out[key] = np.array(value, np.float32)
        return out

    def gradients(self, shapes: Mapping[str, _Shape]) -> Dict[str, _Array]:
        """None: an int8 model does not train, and keeps no gradients."""
        return {}


def _scale_key(key: str) -> str:
    """The key of the row scales of the int8 weight matrix key:
    weight_ih_l0 -> weight_ih_scale_l0."""
    return key.replace("_l", "_scale_l", 1)


def format_of(dtype: Any) -> Format:
    """The format of a model of dtype (float32, float64 or bfloat16), or a
    TypeError naming the argument dtype."""
    dt = _model_dtype(dtype, "dtype")
    return BFloat16(dt) if _is_bf16(dt) else Float(dt)
