"""The parameters of the recurrent models: their schema (the names, shapes
and engine order of each cell's parameters), and how a model stores them
in ``params`` and hands them to the engine."""
from __future__ import annotations

import operator
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Set, Tuple, cast

import numpy as np
import numpy.typing as npt

from .. import _validate
from . import _engine
from ._bf16 import _is_bf16
from ._formats import Format
from ._inputs import Inputs, as_array

_Array = npt.NDArray[Any]

# per cell: the parameters of layer k in engine order, as (name, size in
# units of H or None for a weight matrix, init), and the gate blocks G / H
LAYOUTS = {
    "lstm": (4, [("weight_ih", None, "uniform"), ("weight_hh", None, "uniform"),
                 ("bias", 4, "zeros"),
                 ("ln_ih_weight", 4, "ones"), ("ln_ih_bias", 4, "zeros"),
                 ("ln_hh_weight", 4, "ones"), ("ln_hh_bias", 4, "zeros"),
                 ("ln_c_weight", 1, "ones"), ("ln_c_bias", 1, "zeros")]),
    # LNLSTM's gate_norm "sum" and "per_gate": one LN's gain and bias over all gates
    "lstm_sum": (4, [("weight_ih", None, "uniform"), ("weight_hh", None, "uniform"),
                     ("bias", 4, "zeros"), ("ln_weight", 4, "ones"), ("ln_bias", 4, "zeros"),
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
    # LSTM with proj_size (a schema's proj): the projection's W_hr (P, H) last
    "lstm_plain_proj": (4, [("weight_ih", None, "uniform"), ("weight_hh", None, "uniform"),
                            ("bias", 4, "zeros"), ("weight_hr", None, "uniform")]),
}

def layer_shape(gates: int, name: str, units: Optional[int], I: int, H: int,
                P: int = 0) -> Tuple[int, ...]:
    """The shape of a layer's parameter of LAYOUTS: a weight matrix (units
    None) is (gates * H, I) for weight_ih, (gates * H, H) for weight_hh, or
    with a projection P (gates * H, P) and (P, H) for weight_hr; any other
    parameter (units * H,)."""
    if name == "weight_hr":
        return (P, H)
    if units is None:
        return (gates * H, I if name == "weight_ih" else P or H)
    return (units * H,)


# the directions of a bidirectional layer: parameter-name suffixes, in state order
DIRECTIONS = ("", "_reverse")

_Shape = Tuple[int, ...]


class Schema:
    """The parameters of one model: their keys, per layer and direction in
    engine order (a format's companions of a weight matrix, as int8 row
    scales, after the layout's), their shapes, which are weight matrices,
    their initial values and their dtypes in the model's format. The
    layout's names in ``omit`` (biases a model goes without) have no key:
    the engine takes zeros in their place (``zeros``)."""

    def __init__(self, kind: str, input_size: int, hidden_size: int, num_layers: int,
                 num_directions: int, fmt: Format, omit: FrozenSet[str] = frozenset(),
                 proj: int = 0) -> None:
        gates, layout = LAYOUTS[kind + ("_proj" if proj else "")]
        H = hidden_size
        self.format = fmt
        self.keys: List[List[List[str]]] = []   # [layer][direction] -> keys
        self.shapes: Dict[str, _Shape] = {}
        self.matrices: Set[str] = set()
        self.inits: Dict[str, str] = {}          # the layout's keys -> init
        # the engine's position and shape of each omitted parameter, in order
        self.zeros: List[Tuple[int, _Shape]] = [
            (i, (units * H,)) for i, (name, units, _) in enumerate(layout)
            if name in omit and units is not None]
        companions: Dict[str, _Shape] = {}
        for k in range(num_layers):
            I = input_size if k == 0 else num_directions * (proj or H)
            self.keys.append([])
            for sfx in DIRECTIONS[:num_directions]:
                keys, extra = [], []
                for name, units, init in layout:
                    if name in omit:
                        continue
                    key = f"{name}_l{k}{sfx}"
                    shape = layer_shape(gates, name, units, I, H, proj)
                    if units is None:
                        self.matrices.add(key)
                        extra += fmt.companions(key, shape)
                    self.shapes[key] = shape
                    self.inits[key] = init
                    keys.append(key)
                self.keys[k].append(keys + [key for key, _ in extra])
                companions.update(extra)
        self.shapes.update(companions)

    def dtype(self, key: str) -> np.dtype[Any]:
        """params[key]'s dtype."""
        return self.format.weight if key in self.matrices else self.format.compute

    def param(self, key: str, value: Any) -> _Array:
        """value as params[key]: a new array of the parameter's dtype (a
        weight matrix as the format keeps it)."""
        return self.format.param(key, value, key in self.matrices)

    def initial(self, key: str, rng: np.random.Generator, bound: float) -> _Array:
        """params[key]'s initial value: a weight matrix of U(-bound, bound)
        draws, a gain of ones or a bias of zeros."""
        init = self.inits[key]
        if init == "uniform":
            return self.format.initial(self.shapes[key], rng, bound)
        return np.full(self.shapes[key], 1.0 if init == "ones" else 0.0, self.dtype(key))


def _same_data(a: _Array, owner: Any) -> bool:
    """Whether a is owner, or a view of owner's data as a whole (NumPy points
    a view of a view at the array that owns the memory, so base alone does
    not tell)."""
    return a is owner or (isinstance(owner, np.ndarray)
                          and a.__array_interface__["data"][0]
                          == owner.__array_interface__["data"][0]
                          and a.nbytes == owner.nbytes)


class Parameters(Inputs):
    """A model's parameters as it stores them and hands them to the engine
    (a base of :class:`fastln.rnn.RecurrentModel`, which sets the attributes
    declared here)."""

    params: Dict[str, _Array]
    grads: Dict[str, _Array]
    _format: Format
    _schema: Schema
    # (layer, direction) -> (the params arrays, the arrays handed to the engine)
    _checked: Dict[Tuple[int, int], Tuple[List[Any], List[_Array]]]
    # (layer, direction) -> (W_ih, W_hh, their packed form, a projection's
    # W_hr or None): see _packed
    _packs: Dict[Tuple[int, int], Tuple[_Array, _Array, Optional[_Array], Optional[_Array]]]
    # the zeros of the schema's omitted parameters and their gradients' scratch
    _zero_params: Optional[List[_Array]]
    _zero_grads: Optional[List[_Array]]

    _kind: str   # the model's key of LAYOUTS

    def _cell_name(self) -> str:
        """The engine's name of the model's cell: its kind (LNRNN, RNN and
        GRU add their settings)."""
        return self._kind

    def _layer_keys(self, k: int, d: int = 0) -> List[str]:
        return self._schema.keys[k][d]

    def _layer_params(self, k: int, d: int = 0) -> List[_Array]:
        """Direction d of layer k's parameters as contiguous arrays of their
        dtypes (the weight matrices as the format hands them to the engine,
        the others C-ordered; the last good list is reused while params
        holds the same arrays; the engine re-checks sizes on every call
        anyway)."""
        current = list(map(self.params.get, self._layer_keys(k, d)))
        last = self._checked.get((k, d))
        if last is not None and all(map(operator.is_, current, last[0])):
            return last[1]
        out = []
        schema = self._schema
        for key in self._layer_keys(k, d):
            p = self.params.get(key)
            if p is None:
                raise ValueError(f"params[{key!r}] is missing")
            if isinstance(p, np.ndarray) and type(p) is not np.ndarray:
                p = p.view(np.ndarray)   # a subclass (np.memmap, say): its memory, read in place
            name = f"params[{key!r}]"
            if key in schema.matrices:
                p = self._format.engine_matrix(p, name, key)
            else:
                p = as_array(p, name, self._dt, self.dtype)
            if p.shape != schema.shapes[key]:
                raise ValueError(f"params[{key!r}] has shape {p.shape}, "
                                 f"expected {schema.shapes[key]}")
            out.append(p)
        same = all(map(_same_data, out, current))
        if self._schema.zeros:
            out = self._with_zeros(out, "_zero_params")
        if same:
            self._checked[(k, d)] = (current, out)
        return out

    def _with_zeros(self, arrays: List[_Array], attr: str) -> List[_Array]:
        """arrays (a layer's, in key order) with the schema's omitted
        parameters in their engine positions: zero arrays kept in attr (read
        only, for params; scratch whose sums are dropped, for grads)."""
        fill = getattr(self, attr)
        if fill is None:
            fill = [np.zeros(shape, self._dt) for _, shape in self._schema.zeros]
            if attr == "_zero_params":
                for a in fill:
                    a.flags.writeable = False
            setattr(self, attr, fill)
        out = list(arrays)
        for (i, _), a in zip(self._schema.zeros, fill):
            out.insert(i, a)
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
        keys = self._layer_keys(k, d)
        w_ih, w_hh = (self.params.get(key) for key in keys[:2])
        w_hr = self.params.get(keys[3]) if self.proj_size else None
        if not (_same_data(params[0], w_ih) and _same_data(params[1], w_hh)) or \
                not (_engine.immutable(w_ih) and _engine.immutable(w_hh)) or \
                (w_hr is not None and not (_same_data(params[3], w_hr)
                                           and _engine.immutable(w_hr))) or \
                (params[0].flags.f_contiguous and params[1].flags.f_contiguous
                 and not params[0].flags.c_contiguous):
            return None
        hit = self._packs.get((k, d))
        if hit is not None and hit[0] is w_ih and hit[1] is w_hh and hit[3] is w_hr:
            return hit[2]
        I = self.input_size if k == 0 else self.num_directions * self._out_size
        packed = _engine.pack(self._cell_name(), self._format.wtype, I, self.hidden_size,
                              params[0], params[1], params[3] if self.proj_size else None,
                              self.proj_size)
        self._packs[(k, d)] = (cast(_Array, w_ih), cast(_Array, w_hh), packed, w_hr)
        return packed

    def _layer_grads(self, k: int, d: int = 0) -> List[_Array]:
        out = []
        shapes = self._schema.shapes
        for key in self._layer_keys(k, d):
            g = self.grads.get(key)
            if not (isinstance(g, np.ndarray) and g.dtype == self._dt
                    and g.shape == shapes[key] and g.flags.c_contiguous
                    and g.flags.writeable):
                g = self.grads[key] = np.empty(shapes[key], self._dt)
            out.append(g)
        return self._with_zeros(out, "_zero_grads") if self._schema.zeros else out

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
        return {key: np.array(value, dtype=self._schema.dtype(key), order="C")
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
        shapes = self._schema.shapes
        keys = set(state_dict.keys())
        missing = sorted(set(shapes) - keys)
        unexpected = sorted(keys - set(shapes))
        if missing or unexpected:
            raise ValueError(f"state_dict keys do not match: missing {missing}, "
                             f"unexpected {unexpected}")
        new = {}
        for key, shape in shapes.items():
            value = _validate.asarray(state_dict[key], f"state_dict[{key!r}]")
            if value.shape != shape:
                raise ValueError(f"state_dict[{key!r}] has shape {value.shape}, "
                                 f"expected {shape}")
            if not (np.issubdtype(value.dtype, np.floating) or _is_bf16(value.dtype)
                    or np.issubdtype(value.dtype, np.integer)):
                raise TypeError(f"state_dict[{key!r}] has dtype {value.dtype}, "
                                f"expected a real number type")
            new[key] = self._schema.param(key, value)
        self.params.update(new)
