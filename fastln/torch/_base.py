"""RecurrentModule, the base of fastln.torch's modules: the configuration,
the parameters as ``torch.nn.Parameter``, the checks of what a call hands
in, and the forward, layer by layer through the engine's operators
(fastln/torch/_ops.py) or, for bfloat16 and int8 modules, through a
fastln.rnn model on the module's weights (fastln/torch/_engine_model.py)."""
from __future__ import annotations

import math
import numbers
from typing import Any, Dict, List, Optional, Tuple, Type

import numpy as np
import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from .. import _validate
from ..rnn import functional
from . import _engine_model, _ops

_FLOATS = (torch.float32, torch.float64, torch.bfloat16)


def _cpu(device: Any) -> torch.device:
    dev = torch.device("cpu" if device is None else device)
    if dev.type != "cpu":
        raise ValueError(f"device must be the CPU: fastln's engine runs on CPUs, got {dev}")
    return dev


def _column_major(shape: Tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """An uninitialized tensor of shape, a weight matrix in column-major
    (Fortran) order: the layout the engine's products read in place, as
    fastln.rnn's models keep theirs (a row-major one is repacked on every
    call)."""
    return torch.empty(shape[::-1], dtype=dtype).t() if len(shape) == 2 else \
        torch.empty(shape, dtype=dtype)


def _on_cpu(t: Tensor, name: str) -> None:
    if t.device.type != "cpu":
        raise ValueError(f"{name} is on {t.device}; fastln's engine runs on the CPU: "
                         f"move it with {name}.cpu()")


class RecurrentModule(torch.nn.Module):
    """The base of fastln.torch's modules: LNLSTM, LNGRU, LNRNN, LSTM, GRU and RNN.

    It holds what the six share: the configuration, the parameters, the
    forward, :meth:`step`, and the conversions :meth:`to_rnn` and
    :meth:`from_rnn`. It is not constructed itself (TypeError): construct
    one of the six, whose docstrings give their arguments in torch.nn's
    order. ``isinstance(m, RecurrentModule)`` tells a fastln.torch module.

    Parameters
    ----------
    input_size, hidden_size, num_layers : int
        The input features, the hidden units H and the stacked layers.
    bias, batch_first, bidirectional : bool
        As in torch.nn.LSTM.
    dropout : float
        Dropout on every layer's output but the last, in training mode.
    eps : float
        Added to the variance in every LayerNorm.
    device : torch.device, str or None
        The CPU.
    dtype : torch.dtype or None
        torch.float32, torch.float64 or torch.bfloat16 (None: torch's default).
    cell : str
        The engine's cell (see :mod:`fastln.rnn.functional`).

    Notes
    -----
    Every call runs the engine with the GIL released, on fastln's thread
    pool. A float32 or float64 module's forward and backward run through the
    operators ``torch.ops.fastln.rnn_layer`` and ``rnn_layer_backward``;
    bfloat16 and int8 modules and :meth:`step` run on a fastln.rnn model
    built from the module's tensors, which is rebuilt when a tensor
    changes.
    """

    _rnn_class: Type[Any] = type(None)   # the fastln.rnn model of the same cell
    _has_cell = False                    # the state is (h, c)
    _gates = 1                           # gate blocks of H rows in the weight matrices
    _plain = False                       # torch.nn's parameter names and biases

    input_size: int
    hidden_size: int
    num_layers: int
    bias: bool
    batch_first: bool
    bidirectional: bool
    dropout: float
    eps: float
    cell: str            # the engine's cell (fastln.rnn.functional)
    quantized: bool      # an int8 module (fastln.torch.quantize)

    def __init__(self, input_size: int, hidden_size: int, num_layers: int, bias: bool,
                 batch_first: bool, dropout: float, bidirectional: bool, eps: float,
                 device: Any, dtype: Any, cell: str) -> None:
        super().__init__()
        if type(self)._rnn_class is type(None):
            raise TypeError("RecurrentModule is the base of fastln.torch's modules: construct "
                            "LNLSTM, LNGRU, LNRNN, LSTM, GRU or RNN")
        self.input_size = _validate.positive_int(input_size, "input_size")
        self.hidden_size = _validate.positive_int(hidden_size, "hidden_size")
        self.num_layers = _validate.positive_int(num_layers, "num_layers")
        self.bias = _validate.flag(bias, "bias")
        self.batch_first = _validate.flag(batch_first, "batch_first")
        self.bidirectional = _validate.flag(bidirectional, "bidirectional")
        if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) \
                or not 0 <= dropout <= 1:
            raise ValueError(f"dropout must be a number in [0, 1], got {dropout!r}")
        self.dropout = float(dropout)
        self.eps = _validate.check_eps(eps)
        self.cell = cell
        _cpu(device)
        dtype = torch.get_default_dtype() if dtype is None else dtype
        if dtype not in _FLOATS:
            raise TypeError(f"dtype must be torch.float32, torch.float64 or torch.bfloat16, "
                            f"got {dtype}")
        self.quantized = False
        self._engine_models: Dict[str, Any] = {}
        for k in range(self.num_layers):
            for d in range(self.num_directions):
                for name, shape in self._layer_shapes(k, d).items():
                    self.register_parameter(name, torch.nn.Parameter(
                        _column_major(shape, dtype)))
        self.reset_parameters()

    # ---- configuration and parameters ----

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    def _suffix(self, k: int, d: int) -> str:
        return f"_l{k}" + ("_reverse" if d else "")

    def _layer_input(self, k: int) -> int:
        return self.input_size if k == 0 else self.num_directions * self.hidden_size

    def _layer_shapes(self, k: int, d: int) -> Dict[str, Tuple[int, ...]]:
        """Layer k, direction d's parameters: name -> shape, in registration order."""
        sfx, H, I = self._suffix(k, d), self.hidden_size, self._layer_input(k)
        G = self._gates * H
        if self._plain:
            names = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if self.bias else [])
            return {n + sfx: s for n, s in zip(names, [(G, I), (G, H), (G,), (G,)])}
        return {n + sfx: s for n, s in zip(functional.param_names(self.cell),
                                           functional.param_shapes(self.cell, I, H))
                if not self._omits(n)}

    def _omits(self, name: str) -> bool:
        """Whether the LN cell goes without its parameter name (of
        functional.param_names): the engine then takes zeros."""
        return name == "bias" and not self.bias

    def reset_parameters(self) -> None:
        """Initializes the parameters as torch.nn.LSTM does its own: every
        weight matrix (and a plain cell's biases) from U(-1/sqrt(H),
        1/sqrt(H)); the LayerNorms' gains to 1 and their biases, and the
        additive bias of LNLSTM, to 0. Draws from torch's generator."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        with torch.no_grad():
            for name, p in self.named_parameters(recurse=False):
                if self._plain or name.startswith("weight_"):   # drawn in row-major order
                    p.copy_(torch.empty(p.shape, dtype=p.dtype).uniform_(-bound, bound))
                else:
                    p.fill_(1.0 if "_weight_" in name else 0.0)

    def _engine_params(self, k: int, d: int) -> List[Tensor]:
        """Layer k, direction d's parameters in the engine's order (a plain
        cell's two biases summed where its equations allow, as torch ops)."""
        sfx, H, own = self._suffix(k, d), self.hidden_size, self._parameters
        w_ih, w_hh = own["weight_ih" + sfx], own["weight_hh" + sfx]
        G = self._gates * H
        if self._plain:
            if self.bias:
                b_ih, b_hh = own["bias_ih" + sfx], own["bias_hh" + sfx]
            else:
                b_ih = b_hh = w_ih.new_zeros(G)
            if self._gates == 3:   # a GRU: b_hh's n block stays inside r * (...)
                return [w_ih, w_hh, torch.cat([b_ih[:2 * H] + b_hh[:2 * H], b_ih[2 * H:]]),
                        b_hh[2 * H:]]
            return [w_ih, w_hh, b_ih + b_hh]
        out = []
        shapes = functional.param_shapes(self.cell, self._layer_input(k), H)
        for name, shape in zip(functional.param_names(self.cell), shapes):
            p = own.get(name + sfx)
            out.append(w_ih.new_zeros(shape) if p is None else p)
        return out

    def extra_repr(self) -> str:
        """The arguments that differ from their defaults, for the module's repr.

        Returns
        -------
        str
        """
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        for name, default in (("bias", True), ("batch_first", False), ("dropout", 0.0),
                              ("bidirectional", False)):
            if getattr(self, name) != default:
                s += f", {name}={getattr(self, name)}"
        if not self._plain:
            s += f", eps={self.eps}"
        if self.quantized:
            s += ", quantized=int8"
        return s + self._extra_repr_cell()

    def _extra_repr_cell(self) -> str:
        return ""

    # the further arguments of the module and of its fastln.rnn model, held
    # under the same names by both
    _cell_kwargs: Tuple[str, ...] = ()

    def _rnn_kwargs(self) -> Dict[str, Any]:
        """The further arguments of the fastln.rnn model of this module."""
        return {name: getattr(self, name) for name in self._cell_kwargs}

    @classmethod
    def _module_kwargs(cls, model: Any) -> Dict[str, Any]:
        """The further arguments of a module of this class on the fastln.rnn
        model (the inverse of _rnn_kwargs)."""
        return {name: getattr(model, name) for name in cls._cell_kwargs}

    def _hold_int8(self, params: Dict[str, Any]) -> None:
        """Makes this module int8: an int8 fastln.rnn model's params (int8
        weight matrices, their float32 row scales, the float32 gains and
        biases) become its buffers, under the model's keys, in place of its
        parameters."""
        for name, _ in list(self.named_parameters(recurse=False)):
            delattr(self, name)
        for key, value in params.items():
            self.register_buffer(key, torch.from_numpy(np.array(value)))
        self.quantized = True

    # ---- what a call hands in ----

    def _weight(self) -> Tensor:
        """The first layer's W_ih (a buffer of an int8 module): its dtype is the module's."""
        w = self._parameters.get("weight_ih_l0")
        return self._buffers["weight_ih_l0"] if w is None else w

    def _input(self, input: Any) -> Tuple[Tensor, Optional[Tensor], bool]:
        """input as a time-major (T, B, I) tensor, the lengths of a packed
        sequence, and whether input was one unbatched sequence."""
        lengths = None
        if isinstance(input, PackedSequence):
            x, lengths = pad_packed_sequence(input)
            unbatched = False
        else:
            if not isinstance(input, torch.Tensor):
                raise TypeError(f"input must be a torch.Tensor or a PackedSequence, "
                                f"got {type(input).__name__}")
            x = input
            unbatched = x.dim() == 2
            if unbatched:
                x = x.unsqueeze(1)
            elif self.batch_first:
                x = x.transpose(0, 1)
        self._check_tensor(x, "input")
        if x.dim() != 3 or x.shape[2] != self.input_size:
            want = "(B, T, input_size)" if self.batch_first else "(T, B, input_size)"
            raise ValueError(f"input must have shape {want} or (T, input_size) with "
                             f"input_size = {self.input_size}, got {tuple(input.shape)}"
                             if isinstance(input, torch.Tensor) else
                             f"input's sequences must have {self.input_size} features, "
                             f"got {x.shape[2]}")
        if x.shape[0] < 1:
            raise ValueError("input must have at least one time step")
        return x, lengths, unbatched

    def _check_tensor(self, t: Tensor, name: str) -> None:
        _on_cpu(t, name)
        want = self._weight().dtype
        accepts = (torch.float32,) if self.quantized else \
            (torch.bfloat16, torch.float32) if want == torch.bfloat16 else (want,)
        if t.dtype not in accepts:
            raise TypeError(f"{name} has dtype {t.dtype}, but the module is {want}"
                            f"{' (int8)' if self.quantized else ''}: convert it with "
                            f"{name}.to({accepts[0]})")

    def _state_dtype(self) -> torch.dtype:
        """The state's dtype: float32 for modules that run on a model, else the weights'."""
        return torch.float32 if self._runs_on_model() else self._weight().dtype

    def _states(self, hx: Any, B: int, unbatched: bool) -> List[Optional[Tensor]]:
        """hx as [h0] or [h0, c0], each (D * num_layers, B, H) or None for zeros."""
        dtype = self._state_dtype()
        shape = (self.num_directions * self.num_layers, B, self.hidden_size)
        n = 2 if self._has_cell else 1
        if hx is None:
            return [None] * n
        if self._has_cell:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise TypeError(f"hx of {type(self).__name__} must be a tuple (h_0, c_0), "
                                f"got {type(hx).__name__}")
            parts = list(hx)
        else:
            if not isinstance(hx, torch.Tensor):
                raise TypeError(f"hx of {type(self).__name__} must be a tensor h_0, "
                                f"got {type(hx).__name__}")
            parts = [hx]
        out: List[Optional[Tensor]] = []
        for i, part in enumerate(parts):
            name = "hx" if n == 1 else ("hx[0]", "hx[1]")[i]
            if not isinstance(part, torch.Tensor):
                raise TypeError(f"{name} must be a tensor, got {type(part).__name__}")
            _on_cpu(part, name)
            if unbatched:
                if part.dim() != 2:
                    raise ValueError(f"{name} of an unbatched input must have shape "
                                     f"{(shape[0], shape[2])}, got {tuple(part.shape)}")
                part = part.unsqueeze(1)
            if tuple(part.shape) != shape:
                raise ValueError(f"{name} must have shape (D * num_layers, B, hidden_size) "
                                 f"= {shape}, got {tuple(part.shape)}")
            if part.dtype == torch.bfloat16 and dtype == torch.float32:
                part = part.float()   # a bfloat16 module's state is float32 (exactly)
            elif part.dtype != dtype:
                raise TypeError(f"{name} has dtype {part.dtype}, expected {dtype}")
            out.append(part)
        return out

    # ---- forward ----

    def forward(self, input: Any, hx: Any = None) -> Tuple[Any, Any]:
        """Runs the module over a batch of sequences, as torch.nn.LSTM.

        Parameters
        ----------
        input : Tensor or PackedSequence
            (T, B, input_size), (B, T, input_size) with batch_first, or one
            unbatched sequence (T, input_size); a PackedSequence for
            sequences of different lengths.
        hx : Tensor, or tuple (h_0, c_0) for LNLSTM and LSTM, optional
            The initial state, each (D * num_layers, B, hidden_size)
            ((D * num_layers, hidden_size) unbatched); zeros where None.

        Returns
        -------
        output : Tensor or PackedSequence
            The top layer's output at every step, (T, B, D * hidden_size)
            (batch-first with batch_first), a PackedSequence for one.
        h_n : Tensor, or tuple (h_n, c_n) for LNLSTM and LSTM
            The final state, each (D * num_layers, B, hidden_size).
        """
        x, lengths, unbatched = self._input(input)
        B = x.shape[1]
        states = self._states(hx, B, unbatched)
        if B == 0:   # no sequences: empty results
            D, w = self.num_directions, self._weight()
            y = x.new_zeros((x.shape[0], 0, D * self.hidden_size),
                            dtype=w.dtype if w.is_floating_point() else torch.float32)
            finals = [x.new_zeros((D * self.num_layers, 0, self.hidden_size),
                                  dtype=self._state_dtype()) for _ in states]
        elif self._runs_on_model():
            y, finals = _engine_model.forward(self, x, states, lengths)
        else:
            y, finals = self._forward_ops(x, states, lengths)
        return self._outputs(input, y, finals, lengths, unbatched)

    def _runs_on_model(self) -> bool:
        """Whether calls run on a fastln.rnn model (bfloat16 and int8 modules)."""
        return self.quantized or self._weight().dtype == torch.bfloat16

    def _tracked(self, x: Tensor, states: List[Optional[Tensor]]) -> bool:
        """Whether autograd records a call on x and states (and so the
        forward must keep its cache for a backward)."""
        return torch.is_grad_enabled() and (
            x.requires_grad or any(p.requires_grad for p in self._parameters.values())
            or any(s is not None and s.requires_grad for s in states))

    def _forward_ops(self, x: Tensor, states: List[Optional[Tensor]],
                     lengths: Optional[Tensor]) -> Tuple[Tensor, List[Tensor]]:
        """Every layer through the engine's operators; dropout between layers
        as torch.nn.LSTM applies it (in training mode, on every layer's output
        but the last)."""
        D, L, H = self.num_directions, self.num_layers, self.hidden_size
        B = x.shape[1]
        params = [[p for d in range(D) for p in self._engine_params(k, d)] for k in range(L)]
        keep = self._tracked(x, states)
        # a call outside tracing runs the operator's implementation itself: what
        # the dispatcher adds is most of a short inference call's cost
        run = _ops.rnn_layer if keep or torch.compiler.is_compiling() else _ops.layer
        zeros = x.new_zeros((D, B, H))
        finals: List[List[Tensor]] = [[] for _ in states]
        for k in range(L):
            h0 = zeros if states[0] is None else states[0][D * k:D * k + D].contiguous()
            c0 = None
            if self._has_cell:
                c0 = zeros if states[1] is None else states[1][D * k:D * k + D].contiguous()
            y, h, c, _ = run(x.contiguous(), h0, c0, params[k], lengths, self.cell, self.eps,
                             D, keep)
            finals[0].append(h)
            if self._has_cell:
                finals[1].append(c)
            if self.dropout and self.training and k < L - 1:
                y = torch.nn.functional.dropout(y, self.dropout, training=True)
            x = y
        return x, [torch.cat(f) for f in finals]

    def _outputs(self, input: Any, y: Tensor, finals: List[Tensor],
                 lengths: Optional[Tensor], unbatched: bool) -> Tuple[Any, Any]:
        if isinstance(input, PackedSequence):
            assert lengths is not None   # pad_packed_sequence's
            order = input.sorted_indices
            if order is not None:
                y, lengths = y.index_select(1, order), lengths.index_select(0, order)
            packed = pack_padded_sequence(y, lengths, enforce_sorted=True)
            out: Any = PackedSequence(packed.data, packed.batch_sizes, input.sorted_indices,
                                      input.unsorted_indices)
        elif unbatched:
            out = y.squeeze(1)
            finals = [f.squeeze(1) for f in finals]
        else:
            out = y.transpose(0, 1) if self.batch_first else y
        return out, (tuple(finals) if self._has_cell else finals[0])

    # ---- conversions ----

    def to_rnn(self) -> Any:
        """The fastln.rnn model of this module's configuration on its weights.

        Returns
        -------
        fastln.rnn model
            Of the same cell (LNLSTM for LNLSTM, ...). A float32 or float64
            LN module's model holds NumPy views of the parameters (it shares
            their memory); a plain cell's model holds its two biases summed (a
            copy), as do bfloat16 and int8 modules' models their weights.
        """
        return _engine_model.build(self, share=True)

    @classmethod
    def from_rnn(cls, model: Any) -> Any:
        """A module of model's configuration on model's weights.

        Parameters
        ----------
        model : fastln.rnn model
            Of the same cell (a fastln.rnn.LNLSTM for LNLSTM, ...), float32,
            float64, bfloat16 or int8 (:func:`fastln.rnn.quantize`).

        Returns
        -------
        module
            Its float32 and float64 parameters share the memory of model's
            C-contiguous writable arrays (a plain cell's bias becomes
            ``bias_ih``, with ``bias_hh`` zero: copies); a bfloat16 model
            gives a bfloat16 module, an int8 model a quantized module.

        Raises
        ------
        TypeError
            model is not a fastln.rnn model of this cell.
        """
        return _engine_model.module_from(cls, model)

    def step(self, input: Tensor, hx: Any = None) -> Tuple[Tensor, Any]:
        """One time step, for streaming inference (no autograd).

        Parameters
        ----------
        input : Tensor, shape (B, input_size)
            The step's inputs (whatever batch_first is).
        hx : Tensor or tuple (h, c), optional
            The state before the step, each (D * num_layers, B, hidden_size),
            float32 for bfloat16 and int8 modules; zeros where None.

        Returns
        -------
        h : Tensor, shape (B, hidden_size)
            The top layer's output.
        state : Tensor or tuple (h, c)
            The state after the step, new tensors.

        Raises
        ------
        ValueError
            The module is bidirectional: its reverse direction needs the
            whole sequence (call the module instead).
        """
        return _engine_model.step(self, input, hx)
