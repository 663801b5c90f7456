"""The engine shared by every recurrent model of fastln.rnn: parameters,
state, forward, backward and step over the C engine, layer by layer."""
from __future__ import annotations

import copy
import math
import numbers
import operator
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    Generic,
    List,
    Mapping,
    Optional,
    Tuple,
    TypeVar,
    Union,
    cast,
)

import numpy as np
import numpy.typing as npt

from .. import _dtypes, _torch, _validate
from . import _engine
from ._bf16 import _BF16, _from_bf16, _is_bf16, _model_dtype, _to_bf16

if TYPE_CHECKING:
    from typing_extensions import Self

_Array = npt.NDArray[Any]


def _aligned_empty(shape: Tuple[int, ...], dtype: Any, order: str) -> _Array:
    """A new array whose data starts on a 64-byte boundary: the product
    kernels read a weight matrix in whole cache lines (a row that straddles
    two lines costs two loads)."""
    dt = np.dtype(dtype)
    n = math.prod(shape) * dt.itemsize
    buf = np.empty(n + 64, np.uint8)
    skip = -buf.ctypes.data % 64
    flat = buf[skip:skip + n].view(dt)
    return flat.reshape(shape, order=order)  # type: ignore[call-overload]


def _same_data(a: _Array, owner: Any) -> bool:
    """Whether a is owner, or a view of owner's data as a whole (NumPy points
    a view of a view at the array that owns the memory, so base alone does
    not tell)."""
    return a is owner or (isinstance(owner, np.ndarray)
                          and a.__array_interface__["data"][0]
                          == owner.__array_interface__["data"][0]
                          and a.nbytes == owner.nbytes)


def _int8_values(a: _Array, key: str) -> _Array:
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


def _frozen(a: _Array) -> _Array:
    """A read-only copy of a, in C order, whose memory is a bytes object.
    Nothing can write to it: no view of it predates it, and NumPy refuses to
    make a view of immutable memory writable. So the packed copy a model
    keeps of it stays valid (see _engine.immutable)."""
    a = np.asarray(a)
    return np.frombuffer(a.tobytes(order="C"), a.dtype).reshape(a.shape)


# a model's state: h for LNRNN, LNGRU and RNN; (h, c) for LNLSTM and LSTM
_State = TypeVar("_State", _Array, Tuple[_Array, _Array])
# a state argument: None for zeros; either part of (h, c) may be None too
_StateArg = Union[None, npt.ArrayLike, Tuple[Optional[npt.ArrayLike], Optional[npt.ArrayLike]]]

# per cell: the parameters of layer k in engine order, as (name, size in
# units of H or None for a weight matrix, init), and the gate blocks G / H
_LAYOUTS = {
    "lstm": (4, [("weight_ih", None, "uniform"), ("weight_hh", None, "uniform"),
                 ("bias", 4, "zeros"),
                 ("ln_ih_weight", 4, "ones"), ("ln_ih_bias", 4, "zeros"),
                 ("ln_hh_weight", 4, "ones"), ("ln_hh_bias", 4, "zeros"),
                 ("ln_c_weight", 1, "ones"), ("ln_c_bias", 1, "zeros")]),
    "gru": (3, [("weight_ih", None, "uniform"), ("weight_hh", None, "uniform"),
                ("ln_ih_weight", 2, "ones"), ("ln_ih_bias", 2, "zeros"),
                ("ln_hh_weight", 2, "ones"), ("ln_hh_bias", 2, "zeros"),
                ("ln_in_weight", 1, "ones"), ("ln_in_bias", 1, "zeros"),
                ("ln_hn_weight", 1, "ones"), ("ln_hn_bias", 1, "zeros")]),
    "rnn": (1, [("weight_ih", None, "uniform"), ("weight_hh", None, "uniform"),
                ("ln_weight", 1, "ones"), ("ln_bias", 1, "zeros")]),
    "lstm_plain": (4, [("weight_ih", None, "uniform"), ("weight_hh", None, "uniform"),
                       ("bias", 4, "zeros")]),
    "rnn_plain": (1, [("weight_ih", None, "uniform"), ("weight_hh", None, "uniform"),
                      ("bias", 1, "zeros")]),
    "gru_plain": (3, [("weight_ih", None, "uniform"), ("weight_hh", None, "uniform"),
                      ("bias", 3, "zeros"), ("bias_hn", 1, "zeros")]),
}

# the directions of a bidirectional layer: parameter-name suffixes, in state order
_DIRECTIONS = ("", "_reverse")


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return int(value)


class _LNRecurrent(Generic[_State]):
    """The engine shared by LNRNN, LNLSTM, LNGRU, LSTM and RNN (see their docstrings).

    Threads: the C engine releases the GIL. One model may serve ``step()`` and
    ``forward(..., cache=False)`` from several threads at once; a forward with
    a cache and its backward hold state in the model and must not overlap
    other calls on the same model.
    """

    _kind = ""         # a key of _LAYOUTS
    _has_cell = False  # the state is (h, c)
    _int8 = False      # int8 weight matrices with row scales (fastln.rnn.quantize)

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 batch_first: bool = False, eps: float = 1e-5,
                 dtype: npt.DTypeLike = np.float32, seed: Optional[int] = None,
                 bidirectional: bool = False) -> None:
        self.input_size = _positive_int(input_size, "input_size")
        self.hidden_size = _positive_int(hidden_size, "hidden_size")
        self.num_layers = _positive_int(num_layers, "num_layers")
        self.batch_first = _validate.flag(batch_first, "batch_first")
        self.bidirectional = _validate.flag(bidirectional, "bidirectional")
        # a unidirectional model whose one direction runs each sequence from
        # its last valid step back to its first (ONNX's direction="reverse")
        self.reverse = False
        self.eps = _validate.check_eps(eps)
        dt = _model_dtype(dtype, "dtype")
        self.dtype: np.dtype[Any] = dt
        # the dtype of the state, the arrays between layers and every parameter
        # but a bfloat16 model's weight matrices: float32 for bfloat16
        self._dt: np.dtype[Any] = np.dtype(np.float32) if _is_bf16(dt) else dt
        H = self.hidden_size
        gates, layout = _LAYOUTS[self._kind]
        rng = np.random.default_rng(seed)
        self.params: Dict[str, _Array] = {}
        self._shapes: Dict[str, Tuple[int, ...]] = {}
        self._matrices: set[str] = set()   # the weight matrices' keys
        D = self.num_directions
        self._keys = [[[f"{name}_l{k}{sfx}" for name, _, _ in layout] for sfx in _DIRECTIONS[:D]]
                      for k in range(self.num_layers)]
        # (layer, direction) -> (the params arrays, the arrays handed to the engine)
        self._checked: Dict[Tuple[int, int], Tuple[List[Any], List[_Array]]] = {}
        inits: List[Tuple[str, str]] = []
        for k, sfx in ((k, sfx) for k in range(self.num_layers) for sfx in _DIRECTIONS[:D]):
            I = self.input_size if k == 0 else D * H
            for name, units, init in layout:
                key = f"{name}_l{k}{sfx}"
                if units is None:
                    self._shapes[key] = (gates * H, I if name == "weight_ih" else H)
                    self._matrices.add(key)
                else:
                    self._shapes[key] = (units * H,)
                inits.append((key, init))
        try:
            for key, init in inits:
                self.params[key] = self._initial(key, init, rng, 1.0 / np.sqrt(H))
            self.grads: Dict[str, _Array] = {key: np.zeros(shape, self._dt)
                                              for key, shape in self._shapes.items()}
        except MemoryError:
            need = sum(math.prod(shape) * (self._param_dtype(key).itemsize + self._dt.itemsize)
                       for key, shape in self._shapes.items())
            raise MemoryError(f"{type(self).__name__}(input_size={self.input_size}, "
                              f"hidden_size={H}, num_layers={self.num_layers}) in {dt} "
                              f"needs {need / 2**30:.1f} GiB for its parameters and their "
                              f"gradients, which this process cannot allocate") from None
        # (T, B, each layer's input, each layer's cache array, lengths)
        self._cache: Optional[Tuple[int, int, List[_Array], List[_Array],
                                    Optional[_Array]]] = None
        self._spare: List[_Array] = []   # cache arrays of a finished forward, reused by the next
        self._work: List[_Array] = []    # backward scratch per direction, likewise
        # (layer, direction) -> (W_ih, W_hh, their packed form): see _packed
        self._packs: Dict[Tuple[int, int], Tuple[_Array, _Array, Optional[_Array]]] = {}
        self._step: Any = None   # the compiled step: see _compile_step

    @staticmethod
    def _call_state() -> Dict[str, Any]:
        """What calls keep in a model, empty: the cache, scratch, checked and
        packed arrays and the compiled step (a model rebuilds them)."""
        return dict(_checked={}, _packs={}, _cache=None, _spare=[], _work=[], _step=None)

    def __getstate__(self) -> Dict[str, Any]:
        """Pickles the configuration and parameters, not what a call keeps
        (see _call_state), which an unpickled model rebuilds."""
        state = self.__dict__.copy()
        state.update(self._call_state())
        return state

    def _bare_copy(self) -> Self:
        """A shallow copy of the model without what its calls keep: the
        start of a copy in another dtype or storage."""
        new = copy.copy(self)
        new.__dict__.update(self._call_state())
        return new

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        for key, value in self.params.items():   # bfloat16 and int8 weights stay frozen
            if isinstance(value, np.ndarray) and key in self._matrices and \
                    (_is_bf16(value.dtype) or self._int8):
                self.params[key] = _frozen(value)

    @property
    def num_directions(self) -> int:
        """2 for a bidirectional model, else 1."""
        return 2 if self.bidirectional else 1

    # ---- parameters ----

    def _layer_keys(self, k: int, d: int = 0) -> List[str]:
        return self._keys[k][d]

    def _param_dtype(self, key: str) -> np.dtype[Any]:
        if key in self._matrices:
            return np.dtype(np.int8) if self._int8 else self.dtype
        return self._dt

    @property
    def _wtype(self) -> int:
        """The storage of the weight matrices, as the engine names it."""
        return _engine.W_INT8 if self._int8 else \
            _engine.W_BF16 if self._dt is not self.dtype else _engine.W_SAME

    def _param_order(self, key: str) -> str:
        """The memory order of params[key] as the model makes it: a float32
        or float64 model keeps its weight matrices in column-major (Fortran)
        order, the layout the product kernels read in place (so that a change
        to them, by any route, is seen by the next call, and a step packs
        nothing); every other parameter is C-ordered."""
        return "F" if key in self._matrices and self._wtype == _engine.W_SAME else "C"

    def _initial(self, key: str, init: str, rng: np.random.Generator, bound: float) -> _Array:
        """params[key]'s initial value, made in the parameter's dtype: a weight
        matrix draws U(-bound, bound) in float64 a block of rows at a time
        (the same stream of draws as one call for the whole matrix) and rounds
        each block into place, so no float64 copy of the matrix exists."""
        shape = self._shapes[key]
        dt = self._param_dtype(key)
        if init != "uniform":   # a gain or a bias: a vector of float32 or float64
            return np.full(shape, 1.0 if init == "ones" else 0.0, dt)
        a = _aligned_empty(shape, dt, self._param_order(key))
        rows = max(1, (1 << 20) // shape[1])   # 8 MiB of float64 draws at a time
        for r in range(0, shape[0], rows):
            block = a[r:r + rows]
            block[...] = rng.uniform(-bound, bound, block.shape)
        return _frozen(a) if _is_bf16(dt) else a

    def _param_array(self, key: str, value: Any) -> _Array:
        """value as params[key]: a new array of the parameter's dtype, in the
        order of _param_order, a weight matrix aligned to 64 bytes (a
        bfloat16 model's weight matrices are frozen, see _frozen: the model
        keeps their packed form, see _packed)."""
        dt = self._param_dtype(key)
        if key in self._matrices:
            a = np.asarray(value)
            if self._int8:
                return _frozen(_int8_values(a, key))
            if _is_bf16(dt):
                return _frozen(a.astype(dt, copy=False))
            new = _aligned_empty(a.shape, dt, self._param_order(key))
            new[...] = a
            return new
        return np.array(value, dtype=dt)

    def _layer_params(self, k: int, d: int = 0) -> List[_Array]:
        """Direction d of layer k's parameters as contiguous arrays of their
        dtypes (the weight matrices C- or Fortran-ordered, the others
        C-ordered), a bfloat16 model's weight matrices as their uint16 bits (the
        last good list is reused while params holds the same arrays; the
        engine re-checks sizes on every call anyway)."""
        current = list(map(self.params.get, self._layer_keys(k, d)))
        last = self._checked.get((k, d))
        if last is not None and all(map(operator.is_, current, last[0])):
            return last[1]
        out = []
        for key in self._layer_keys(k, d):
            p = self.params.get(key)
            if p is None:
                raise ValueError(f"params[{key!r}] is missing")
            if isinstance(p, np.ndarray) and type(p) is not np.ndarray:
                p = p.view(np.ndarray)   # a subclass (np.memmap, say): its memory, read in place
            if self._int8 and key in self._matrices:
                p = np.require(_int8_values(_validate.asarray(p, f"params[{key!r}]"), key),
                               None, ["C", "A"])
            elif _is_bf16(self._param_dtype(key)):
                p = np.require(_validate.asarray(p, f"params[{key!r}]"), _BF16, ["C", "A"])
            elif key in self._matrices:   # C or Fortran order: the engine reads both
                p = np.require(self._array(p, f"params[{key!r}]", layout=False), self._dt, ["A"])
                if not (p.flags.c_contiguous or p.flags.f_contiguous):
                    p = np.asfortranarray(p) if self._param_order(key) == "F" else \
                        np.ascontiguousarray(p)
            else:
                p = self._array(p, f"params[{key!r}]")
            if p.shape != self._shapes[key]:
                raise ValueError(f"params[{key!r}] has shape {p.shape}, "
                                 f"expected {self._shapes[key]}")
            out.append(p.view(np.uint16) if _is_bf16(p.dtype) else p)
        if all(map(_same_data, out, current)):
            self._checked[(k, d)] = (current, out)
        return out

    def _packed(self, k: int, d: int, params: List[_Array]) -> Optional[_Array]:
        """Layer k, direction d's weight matrices packed for the engine's
        product kernels (params: _layer_params(k, d)), kept while params
        holds the same immutable W_ih and W_hh (see _engine.immutable: their
        memory is a bytes object, as a bfloat16 model's are); None for
        others: Fortran-ordered float32 and float64 ones the engine reads in
        place, and any other that it packs on every call, since it may change
        (a read-only array may still be written through a writable view made
        before, or after its owner is made writable again)."""
        w_ih, w_hh = (self.params.get(key) for key in self._layer_keys(k, d)[:2])
        if not (_same_data(params[0], w_ih) and _same_data(params[1], w_hh)) or \
                not (_engine.immutable(w_ih) and _engine.immutable(w_hh)) or \
                (params[0].flags.f_contiguous and params[1].flags.f_contiguous
                 and not params[0].flags.c_contiguous):
            return None
        hit = self._packs.get((k, d))
        if hit is not None and hit[0] is w_ih and hit[1] is w_hh:
            return hit[2]
        I = self.input_size if k == 0 else self.num_directions * self.hidden_size
        packed = _engine.pack(self._cell_name(), self._wtype, I, self.hidden_size,
                                 params[0], params[1])
        self._packs[(k, d)] = (cast(_Array, w_ih), cast(_Array, w_hh), packed)
        return packed

    def _layer_grads(self, k: int, d: int = 0) -> List[_Array]:
        out = []
        for key in self._layer_keys(k, d):
            g = self.grads.get(key)
            if not (isinstance(g, np.ndarray) and g.dtype == self._dt
                    and g.shape == self._shapes[key] and g.flags.c_contiguous
                    and g.flags.writeable):
                g = self.grads[key] = np.empty(self._shapes[key], self._dt)
            out.append(g)
        return out

    def state_dict(self) -> Dict[str, _Array]:
        """A dict of copies of the parameters (plain ndarrays, ``np.savez``-friendly).

        Returns
        -------
        dict of str to ndarray
            The keys of ``params`` (such as ``weight_ih_l0``), each a copy in
            the model's dtype (a bfloat16 model: its weight matrices in
            bfloat16, the other parameters in float32).

        Examples
        --------
        >>> from fastln.rnn import LNRNN
        >>> sorted(LNRNN(input_size=2, hidden_size=3).state_dict())
        ['ln_bias_l0', 'ln_weight_l0', 'weight_hh_l0', 'weight_ih_l0']
        """
        return {key: np.array(value, dtype=self._param_dtype(key), order="C")
                for key, value in self.params.items()}

    def load_state_dict(self, state_dict: Mapping[str, npt.ArrayLike]) -> None:
        """Copies every parameter from ``state_dict``, casting to the model's dtype
        (a bfloat16 model: its weight matrices to bfloat16, the rest to float32).

        Parameters
        ----------
        state_dict : mapping of str to array_like
            As written by :meth:`state_dict` (or loaded with ``np.load``): the
            keys must match exactly, the shapes must agree, and the values
            must be floating or integer numbers.

        Raises
        ------
        TypeError
            state_dict is not a mapping, or a value is of another type than
            floating or integer (bool included).
        ValueError
            A key is missing or unexpected, or a value has the wrong shape.

        Notes
        -----
        On error nothing is changed.

        Examples
        --------
        >>> import numpy as np
        >>> from fastln.rnn import LNGRU
        >>> a, b = LNGRU(2, 3, seed=0), LNGRU(2, 3, seed=1)
        >>> b.load_state_dict(a.state_dict())
        >>> bool(np.array_equal(a.params["weight_hh_l0"], b.params["weight_hh_l0"]))
        True
        """
        if not hasattr(state_dict, "keys"):
            raise TypeError(f"state_dict must be a mapping, got {type(state_dict).__name__}")
        keys = set(state_dict.keys())
        missing = sorted(set(self._shapes) - keys)
        unexpected = sorted(keys - set(self._shapes))
        if missing or unexpected:
            raise ValueError(f"state_dict keys do not match: missing {missing}, "
                             f"unexpected {unexpected}")
        new = {}
        for key, shape in self._shapes.items():
            value = _validate.asarray(state_dict[key], f"state_dict[{key!r}]")
            if value.shape != shape:
                raise ValueError(f"state_dict[{key!r}] has shape {value.shape}, "
                                 f"expected {shape}")
            if not (np.issubdtype(value.dtype, np.floating) or _is_bf16(value.dtype)
                    or np.issubdtype(value.dtype, np.integer)):
                raise TypeError(f"state_dict[{key!r}] has dtype {value.dtype}, "
                                f"expected a real number type")
            new[key] = self._param_array(key, value)
        self.params.update(new)

    # ---- argument checks ----

    def _input(self, x: Any, name: str, last: int, T: Optional[int] = None,
               B: Optional[int] = None) -> _Array:
        """x as a time-major C-contiguous (T, B, last) array of the model's dtype."""
        x = self._array(x, name, strict=True, layout=False, data=name == "x")
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

    def _array(self, a: Any, name: str, strict: bool = False, layout: bool = True,
               data: bool = False) -> _Array:
        """a as an array of the model's compute dtype (float32 for bfloat16;
        native byte order, aligned and C-contiguous unless layout is False).
        Another real type is cast, or with strict (data: x, dy, states) a
        TypeError; non-numbers raise a TypeError naming the argument. With
        data (x), a bfloat16 model also takes bfloat16. A torch tensor is
        read as an array (one that requires grad is a TypeError) and then
        held to the rule of an ndarray of its dtype: a float64 tensor into a
        float32 model is refused as a float64 ndarray is, never rounded
        silently."""
        dt = self._dt
        tensor = _torch.is_tensor(a)
        if tensor:
            a = _validate.tensor(a, name)
        if data and isinstance(a, np.ndarray) and _is_bf16(a.dtype) and _is_bf16(self.dtype):
            a = _from_bf16(a)
        if isinstance(a, np.ndarray):
            kind = "f" if a.dtype in _dtypes.LOW_PRECISION else a.dtype.kind
            if kind not in "fiub":
                raise TypeError(f"{name} must hold real numbers, got dtype {a.dtype}")
            if strict and (kind != "f" or a.dtype.itemsize != dt.itemsize):
                takes = (f"the {self.dtype} model takes {'bfloat16 or ' if data else ''}{dt}"
                         if dt != self.dtype else f"the model is {dt}")
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

    def _states(self, state: Any, B: int, name: str) -> List[_Array]:
        """The state as a list of (D * num_layers, B, H) arrays (copies): [h] or [h, c]."""
        shape = (self.num_directions * self.num_layers, B, self.hidden_size)
        n = 2 if self._has_cell else 1
        if state is None:
            return [np.zeros(shape, self._dt) for _ in range(n)]
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
                if type(b) is np.ndarray and b.dtype is dt and b.shape == shape:
                    return [a.copy(), b.copy()]
        if self._has_cell:
            if not isinstance(state, (tuple, list)) or len(state) != 2:
                raise TypeError(f"{name} must be a tuple (h, c) for {type(self).__name__}, "
                                f"got {type(state).__name__}")
            parts = tuple(state)
        else:
            parts = (state,)
        out = []
        for part in parts:
            if part is None:
                out.append(np.zeros(shape, self._dt))
                continue
            a = self._array(part, name, strict=True, layout=False)
            if a.shape != shape:
                what = "(2 * num_layers, B, H)" if self.bidirectional else "(num_layers, B, H)"
                raise ValueError(f"{name} must have shape {what} = {shape}, got {a.shape}")
            out.append(np.array(a, dtype=self._dt, order="C"))
        return out

    @staticmethod
    def _lengths(lengths: Any, T: int, B: int) -> Optional[_Array]:
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

    def _release_cache(self) -> None:
        """Drops the cache; its arrays serve the next forward, as the backward
        scratch serves the next backward (fresh allocations of these sizes
        would page-fault on every call)."""
        if self._cache is not None:
            self._spare = self._cache[3]
        self._cache = None

    def _cache_array(self, size: int) -> _Array:
        for i, a in enumerate(self._spare):
            if a.size == size:
                return self._spare.pop(i)
        self._spare = []   # a different shape: let the old arrays go
        return np.empty(size, self._dt)

    def _pack_state(self, parts: List[_Array]) -> _State:
        return cast(_State, tuple(parts) if self._has_cell else parts[0])

    # ---- forward / backward ----

    def forward(self, x: npt.ArrayLike, state: _StateArg = None,
                lengths: Optional[npt.ArrayLike] = None, cache: bool = True
                ) -> Tuple[_Array, _State]:
        """Runs the model over a batch of sequences (``model(x)`` is the same).

        Parameters
        ----------
        x : array_like, shape (T, B, input_size), or (B, T, input_size) with batch_first
            The input sequences, T >= 1 steps of B sequences (B = 0 gives
            empty results). An ndarray or a CPU torch tensor (one that does
            not require grad: fastln has no autograd, and the results are
            NumPy arrays) must have the model's float type (an ndarray in
            either byte order; a bfloat16 model takes bfloat16 or float32):
            another dtype is a TypeError, never a silent cast. Lists and
            other array-likes are converted.
        state : ndarray or tuple of ndarray, optional
            The initial state, None for zeros. LNLSTM and LSTM: a tuple
            ``(h, c)`` (either may be None); LNRNN, LNGRU, GRU and RNN:
            ``h``. Each of shape (D * num_layers, B, hidden_size), D = 2 if
            bidirectional else 1, and the model's float type (float32 for a
            bfloat16 model, whose state stays float32), as x: ndarrays or
            torch tensors. It is not modified.
        lengths : array_like of int, shape (B,), optional
            The length of each sequence of a padded batch, in [1, T]. After its
            length a sequence holds its state and its output is 0; the
            padding of x is never read (it may hold anything, NaN included).
        cache : bool, default True
            Keep what :meth:`backward` needs (about 11 H values per sequence,
            step and layer for LNLSTM), replacing the cache of an earlier
            forward. With False nothing is kept (and an earlier cache is
            dropped). A bfloat16 model runs inference only: it needs False.

        Returns
        -------
        y : ndarray, shape (T, B, D * hidden_size), or (B, T, D * hidden_size) with batch_first
            The top layer's output at every step, in the model's dtype
            (bidirectional: the forward direction's H features, then the
            reverse direction's).
        state : ndarray or tuple of ndarray
            The final state, in the form of ``state`` (h, or (h, c) for
            LNLSTM and LSTM), each (D * num_layers, B, hidden_size), new
            arrays. With lengths, each sequence's state at its own last step
            (the reverse direction's: after its first step).

        Raises
        ------
        TypeError
            x or a state array or tensor of another dtype than the model's
            (or not numbers), or a torch tensor that requires grad (pass
            ``x.detach()``); an LNLSTM/LSTM state that is not an (h, c) tuple;
            lengths not integers; a parameter in ``params`` that is not
            numbers; cache=True on a bfloat16 model.
        ValueError
            x not 3-D with ``input_size`` features, or without a step or a
            sequence; a state not of shape (D * num_layers, B, hidden_size);
            lengths not of shape (B,) or outside [1, T]; a parameter in
            ``params`` missing or of the wrong shape.

        Notes
        -----
        A row's results do not depend on the other rows of its batch: row b
        of a batch is bitwise what the same sequence gives alone, for any B,
        in every dtype and on every instruction-set path.

        Examples
        --------
        >>> import numpy as np
        >>> from fastln.rnn import LNGRU
        >>> m = LNGRU(input_size=3, hidden_size=4, num_layers=2, seed=0)
        >>> x = np.zeros((5, 2, 3), np.float32)
        >>> y, h = m.forward(x, lengths=[5, 2])
        >>> y.shape, h.shape
        ((5, 2, 4), (2, 2, 4))
        >>> bool(np.all(y[2:, 1] == 0))          # sequence 1 ended after 2 steps
        True
        """
        cache = _validate.flag(cache, "cache")
        if self.reverse and self.bidirectional:
            raise ValueError("reverse=True runs the one direction of a unidirectional model "
                             "backwards; a bidirectional model already runs both")
        if cache and _is_bf16(self.dtype):
            raise TypeError("a bfloat16 model runs inference only: call forward(x, "
                            "cache=False) or step(); train in float32 (the model's "
                            ".to(np.float32)) and convert with .to(ml_dtypes.bfloat16)")
        if cache and self._int8:
            raise TypeError("an int8 model runs inference only: call forward(x, "
                            "cache=False) or step(); train the float model and quantize "
                            "it again with fastln.rnn.quantize")
        xs = self._input(x, "x", self.input_size)
        T, B = xs.shape[:2]
        states = self._states(state, B, "state")
        lens = self._lengths(lengths, T, B)
        self._release_cache()
        if not cache:
            self._spare, self._work = [], []   # inference keeps nothing
        H, cell, D = self.hidden_size, self._cell_name(), self.num_directions
        if B == 0:   # no sequences: empty results, and a cache for an empty backward
            if cache:
                self._cache = (T, 0, [], [], lens)
            y = np.zeros((0, T, D * H) if self.batch_first else (T, 0, D * H), self.dtype)
            return y, self._pack_state(states)
        inputs: List[_Array] = []
        caches: List[_Array] = []
        size = _engine.cache_size(cell, T, B, H)
        bf = self._dt is not self.dtype   # a bfloat16 model
        wtype = self._wtype
        for k in range(self.num_layers):
            I = xs.shape[2]
            y = np.empty((T, B, D * H), self._dt)
            store = [self._cache_array(size) for _ in range(D)] if cache else None
            h = states[0][D * k:D * k + D]
            c = states[1][D * k:D * k + D] if self._has_cell else None
            ps = [self._layer_params(k, d) for d in range(D)]
            packed = [self._packed(k, d, ps[d]) for d in range(D)]
            if D == 1:
                _engine.forward(cell, T, B, I, H, self.eps, xs, ps[0], lens,
                                   None if store is None else store[0], y, h[0],
                                   None if c is None else c[0], bool(self.reverse), wtype,
                                   packed[0])
            else:
                _engine.forward2(cell, T, B, I, H, self.eps, xs, ps, lens, store, y, h, c,
                                    wtype, packed)
            if store is not None:
                inputs.append(xs)
                caches.extend(store)
            xs = y
        if cache:
            self._cache = (T, B, inputs, caches, lens)
        if bf:
            xs = _to_bf16(xs)
        y = xs.transpose(1, 0, 2).copy() if self.batch_first else xs
        return y, self._pack_state(states)

    __call__ = forward

    def backward(self, dy: npt.ArrayLike, dstate: _StateArg = None) -> Tuple[_Array, _State]:
        """Back-propagates through the last forward (with cache=True) in time.

        A bfloat16 model has no backward (TypeError): train in float32.

        Parameters
        ----------
        dy : array_like, the shape of the forward's y
            The gradient of the loss with respect to y, of the model's float
            type (as x in :meth:`forward`).
        dstate : ndarray or tuple of ndarray, optional
            The gradient with respect to the forward's final state, in the
            form of the state (h, or (h, c) for LNLSTM and LSTM, either part
            may be None), each (D * num_layers, B, hidden_size); None for
            zeros.

        Returns
        -------
        dx : ndarray, the shape of the forward's x
            The gradient with respect to x, in the model's dtype.
        dstate0 : ndarray or tuple of ndarray
            The gradient with respect to the initial state, in the form of
            the state.

        Raises
        ------
        RuntimeError
            No cached forward: none ran with ``cache=True``, or its cache was
            used by a backward already. Call :meth:`forward` again first.
        TypeError, ValueError
            dy or dstate of the wrong type or shape, as x and state in
            :meth:`forward`.

        Notes
        -----
        The parameter gradients are written to ``self.grads`` (same keys and
        shapes as ``self.params``), replacing the previous values; the
        arrays there are reused and overwritten in place, so copy them to
        keep them. The forward's cache is consumed (freed): each forward
        serves one backward, and a second backward needs a new forward. A
        backward that raises on its arguments leaves the cache as it was.
        The cache refers to the forward's x (without a copy where x
        was already time-major and contiguous) and its parameters: change
        neither in between.

        Examples
        --------
        >>> import numpy as np
        >>> from fastln.rnn import LNRNN
        >>> m = LNRNN(input_size=3, hidden_size=4, seed=0)
        >>> x = np.ones((5, 2, 3), np.float32)
        >>> y, h = m.forward(x)
        >>> dx, dh0 = m.backward(np.ones_like(y))
        >>> dx.shape, dh0.shape, m.grads["weight_ih_l0"].shape
        ((5, 2, 3), (1, 2, 4), (4, 3))
        """
        if _is_bf16(self.dtype):
            raise TypeError("a bfloat16 model runs inference only and has no backward: "
                            "train in float32 (the model's .to(np.float32))")
        if self._int8:
            raise TypeError("an int8 model runs inference only and has no backward: "
                            "train the float model and quantize it again")
        if self._cache is None:
            raise RuntimeError("backward needs the cache of a forward: call forward(x) "
                               "again first, with cache=True (the default); each forward's "
                               "cache serves one backward, which frees it")
        T, B, inputs, caches, lens = self._cache
        H, cell, D = self.hidden_size, self._cell_name(), self.num_directions
        g = self._input(dy, "dy", D * H, T, B)
        dstates = self._states(dstate, B, "dstate")
        if B == 0:   # no sequences: empty gradients of the data, zero ones of the parameters
            for k in range(self.num_layers):
                for d in range(D):
                    for grad in self._layer_grads(k, d):
                        grad.fill(0)
            self._release_cache()
            shape = (0, T, self.input_size) if self.batch_first else (T, 0, self.input_size)
            return np.zeros(shape, self.dtype), self._pack_state(dstates)
        size = _engine.work_size(cell, T, B, H)
        if len(self._work) != D or self._work[0].size != size:
            self._work = [np.empty(size, self.dtype) for _ in range(D)]
        work = self._work
        for k in reversed(range(self.num_layers)):
            I = inputs[k].shape[2]
            dx = np.empty((T, B, I), self.dtype)
            dh = dstates[0][D * k:D * k + D]
            dc = dstates[1][D * k:D * k + D] if self._has_cell else None
            if D == 1:
                _engine.backward(cell, T, B, I, H, self.eps, inputs[k],
                                    self._layer_params(k), lens, caches[k], g, dh[0],
                                    None if dc is None else dc[0], dx, self._layer_grads(k),
                                    work[0], bool(self.reverse))
            else:
                _engine.backward2(cell, T, B, I, H, self.eps, inputs[k],
                                     (self._layer_params(k, 0), self._layer_params(k, 1)), lens,
                                     caches[2 * k:2 * k + 2], g, dh, dc, dx,
                                     (self._layer_grads(k, 0), self._layer_grads(k, 1)), work)
            g = dx
        self._release_cache()
        dx = g.transpose(1, 0, 2).copy() if self.batch_first else g
        return dx, self._pack_state(dstates)

    def step(self, x_t: npt.ArrayLike, state: _StateArg = None, *,
             out: Optional[_Array] = None, state_out: Any = None) -> Tuple[_Array, _State]:
        """One time step, for streaming inference.

        Computes what ``forward(x_t[None], state, cache=False)`` computes for
        a time-major model, with less overhead per call.

        Parameters
        ----------
        x_t : array_like, shape (B, input_size)
            The inputs of one step (whatever ``batch_first`` is), of the
            model's float type (as x in :meth:`forward`: a bfloat16 model
            takes bfloat16 or float32).
        state : ndarray or tuple of ndarray, optional
            The state before the step, as in :meth:`forward`; None for zeros.
        out : ndarray, optional
            Where to write h: C-contiguous, (B, hidden_size), of the model's
            dtype (bfloat16 for a bfloat16 model).
        state_out : ndarray or tuple of ndarray, optional
            Where to write the new state, in the form of `state`: C-contiguous
            arrays of the state's dtype, writable. They may be the arrays
            of `state` itself, which the step then updates in place; a loop
            that passes the same arrays every time allocates nothing.

        Returns
        -------
        h : ndarray, shape (B, hidden_size)
            The top layer's output, in the model's dtype.
        state : ndarray or tuple of ndarray
            The state after the step, in the form of :meth:`forward`'s:
            `state_out`, or new arrays (float32 for a bfloat16 model); the
            given state is modified only when it is `state_out`.

        Raises
        ------
        TypeError, ValueError
            As :meth:`forward`, for x_t and state, and for out and state_out
            of the wrong type, shape, dtype or layout. ValueError also for
            a bidirectional or reverse model, whose reverse direction needs
            the whole sequence.

        Notes
        -----
        Keeps no cache, and leaves the cache of an earlier forward as it is.
        A stream of steps gives bitwise the outputs and state of one forward
        over the same inputs, and a row's results do not depend on the other
        rows of the batch, in every dtype and on every instruction-set path.
        B = 0 gives an empty h and returns the (empty) state.

        The step runs compiled: the model's parameters are checked once
        and kept while ``params`` holds the same arrays, and each call is
        one call into the C engine, for every layer. The weights are read
        where they are, so a change to them in place (``m.params[k] -=
        ...``) applies from the next step: a float32 or float64 model keeps
        its weight matrices in Fortran order, the layout of the product
        kernels. A
        weight matrix whose memory nothing can write (a bytes object's, as
        a bfloat16 model's are) is packed for the kernels once and kept;
        any other C-ordered one, as from ``m.params[k] = a``, read-only or
        not, is packed on every call. A step refused for its arguments
        (TypeError, ValueError) writes neither `out` nor `state_out`.

        Examples
        --------
        >>> import numpy as np
        >>> from fastln.rnn import LNLSTM
        >>> m = LNLSTM(input_size=3, hidden_size=4, seed=0)
        >>> state = None
        >>> for x_t in np.ones((6, 2, 3), np.float32):
        ...     h, state = m.step(x_t, state)
        >>> y, final = m.forward(np.ones((6, 2, 3), np.float32), cache=False)
        >>> bool(np.array_equal(h, y[-1]))
        True
        """
        run = self._step
        if run is not None:
            done = run(self.params, x_t, state, out, state_out)   # the common case, in one call
            if done is not None:
                return done
        run, xs = self._step_input(x_t, "x_t")
        dt = self._dt
        shape = xs.shape
        if len(shape) != 2 or shape[1] != self.input_size:
            raise ValueError(f"x_t must have shape (B, {self.input_size}), got {shape}")
        B = shape[0]
        full = (self.num_layers, B, self.hidden_size)
        given = self._outputs(out, (B, self.hidden_size), "out")   # before state_out is written
        cell = self._has_cell
        parts = state if cell and type(state) is tuple else (state,)
        if len(parts) == 1 + cell and all(type(p) is np.ndarray and p.dtype is dt
                                          and p.shape == full and p.flags.c_contiguous
                                          and p.flags.aligned for p in parts):
            ins: List[Optional[_Array]] = list(parts)   # read by the engine, not changed
            outs = self._outputs(state_out, full, "state_out") or \
                [np.empty(full, dt) for _ in parts]
        else:   # checked and copied (zeros for None): the step starts from the copies
            ins = [None] * (1 + cell)
            outs = self._outputs(state_out, full, "state_out")
            start = self._states(state, B, "state")
            for o, st in zip(outs, start):
                o[...] = st
            outs = outs or start
        y = given[0] if given and dt is self.dtype else np.empty((B, self.hidden_size), dt)
        if B:
            run.run(B, xs, ins[0], ins[-1] if cell else None, y, outs[0],
                    outs[-1] if cell else None)
        if dt is not self.dtype:   # bfloat16: rounded into out, or a new array
            y = _to_bf16(y, given[0] if given else None)
        return y, cast(_State, tuple(outs) if cell else outs[0])

    def _outputs(self, arrays: Any, shape: Tuple[int, ...], name: str) -> List[_Array]:
        """arrays (an array, or a tuple (h, c) for a model with a cell state
        when name is state_out) checked as outputs of shape and dtype (the
        model's for out, the state's for the state): C-contiguous, aligned
        and writable; [] for None."""
        if arrays is None:
            return []
        n = 2 if self._has_cell and name == "state_out" else 1
        parts = arrays if n == 2 else (arrays,)
        if n == 2 and not (type(arrays) is tuple and len(arrays) == 2):
            raise TypeError(f"{name} must be a tuple (h, c) for {type(self).__name__}, "
                            f"got {type(arrays).__name__}")
        want = self.dtype if name == "out" else self._dt
        for a in parts:
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

    def _step_input(self, x: Any, name: str) -> Tuple[Any, _Array]:
        """The compiled step for the parameters params holds now, and x as
        the step reads it (of the state's dtype, C-contiguous, aligned)."""
        run = self._step
        if run is None or not run.valid(self.params):
            run = self._compile_step()
        if not (type(x) is np.ndarray and x.dtype is self._dt and x.flags.c_contiguous
                and x.flags.aligned):
            x = self._array(x, name, strict=True, data=True)
        return run, x

    def _compile_step(self) -> Any:
        """The engine's compiled step (_engine.Step) for the parameters that
        params holds now, kept in self._step."""
        if self.bidirectional or self.reverse:
            raise ValueError(f"step() runs a stream forward in time; a "
                             f"{'bidirectional' if self.bidirectional else 'reverse'} model "
                             f"needs the whole sequence: call forward(x) instead")
        layers = [self._layer_params(k) for k in range(self.num_layers)]
        packs = [self._packed(k, 0, ps) for k, ps in enumerate(layers)]
        keys = [key for k in range(self.num_layers) for key in self._layer_keys(k)]
        self._step = _engine.Step(self._cell_name(), self.input_size, self.hidden_size,
                                  self.eps, layers, packs, self._wtype,
                                  self.dtype if self._dt is not self.dtype else None, keys,
                                  [self.params[key] for key in keys])
        return self._step

    def _table_step(self, h_table: _Array, c_table: Optional[_Array], rows: _Array,
                    x: npt.ArrayLike, out: Optional[_Array]) -> _Array:
        """One step of the streams whose states are `rows` of the tables
        (num_layers, capacity, H), which it updates (StreamTable.step)."""
        run, xs = self._step_input(x, "x")
        dt = self._dt
        B = len(rows)
        if xs.shape != (B, self.input_size):
            raise ValueError(f"x must have shape (len(ids), input_size) = "
                             f"{(B, self.input_size)}, got {xs.shape}")
        given = self._outputs(out, (B, self.hidden_size), "out")
        y = given[0] if given and dt is self.dtype else np.empty((B, self.hidden_size), dt)
        if B:
            run.table(xs, rows, h_table, c_table, y)
        if dt is not self.dtype:   # bfloat16: rounded into out, or a new array
            y = _to_bf16(y, given[0] if given else None)
        return y

    def to(self, dtype: npt.DTypeLike) -> Self:
        """A copy of the model with its parameters in dtype (as PyTorch's ``.to``).

        Parameters
        ----------
        dtype : float32, float64 or ml_dtypes.bfloat16
            The new model's dtype. A bfloat16 model stores its weight
            matrices in bfloat16 (read-only arrays) and every other
            parameter in float32; it runs inference only (``forward(x,
            cache=False)`` and :meth:`step`): the products take their
            inputs rounded to bfloat16 with float32 sums (VDPBF16PS where
            the CPU has AVX512-BF16), and the state, the LN statistics and
            the gates stay float32.

        Returns
        -------
        model
            A new model of the same class and configuration; this one is not
            changed (its cache and gradients are not copied).

        Raises
        ------
        TypeError
            dtype is not one of the three.
        ImportError
            dtype is ``"bfloat16"`` and ml_dtypes is not installed
            (``pip install "fastln[bfloat16]"``).

        Examples
        --------
        >>> import ml_dtypes, numpy as np
        >>> from fastln.rnn import LNLSTM
        >>> m = LNLSTM(input_size=3, hidden_size=4, seed=0).to(ml_dtypes.bfloat16)
        >>> m.params["weight_hh_l0"].dtype, m.params["ln_c_weight_l0"].dtype
        (dtype(bfloat16), dtype('float32'))
        >>> y, (h, c) = m.forward(np.ones((2, 1, 3), np.float32), cache=False)
        >>> y.dtype, c.dtype
        (dtype(bfloat16), dtype('float32'))
        """
        dt = _model_dtype(dtype, "dtype")
        if self._int8:
            raise TypeError("an int8 model keeps its weights in int8 and cannot change "
                            "dtype: quantize the float model instead")
        new = self._bare_copy()
        new.dtype = dt
        new._dt = np.dtype(np.float32) if _is_bf16(dt) else dt
        new.params = {key: new._param_array(key, value) for key, value in self.params.items()}
        new.grads = {key: np.zeros(shape, new._dt) for key, shape in self._shapes.items()}
        return new

    def _cell_name(self) -> str:
        return self._kind

    def __repr__(self) -> str:
        eps = "" if self._kind.endswith("_plain") else f"eps={self.eps}, "
        extra = "".join(f", {name}=True" for name in ("bidirectional", "reverse")
                        if getattr(self, name)) + (", weights=int8" if self._int8 else "")
        return (f"{type(self).__name__}(input_size={self.input_size}, "
                f"hidden_size={self.hidden_size}, num_layers={self.num_layers}, "
                f"batch_first={self.batch_first}, {eps}dtype={self.dtype}{extra})")
