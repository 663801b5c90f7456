"""The six modules of fastln.torch: LNLSTM, LNGRU and LNRNN, the
layer-normalized cells under fastln.rnn's parameter names, and LSTM, GRU
and RNN, the plain cells under torch.nn's."""
from __future__ import annotations

from typing import Any, Dict

from .. import _validate
from .. import rnn as _rnn
from ..rnn._variants import Variant, variant
from ._base import RecurrentModule

_ARGS = """
    Parameters
    ----------
    input_size : int
        The features of the input.
    hidden_size : int
        The features H of the state and of the output.
    num_layers : int, default 1
        Stacked layers.{nonlinearity}
    bias : bool, default True
        With False, the cell has no additive bias{bias}.
    batch_first : bool, default False
        input and output are (B, T, features) instead of (T, B, features).
    dropout : float, default 0
        In training mode, dropout on every layer's output but the last, as
        torch.nn.LSTM applies it.
    bidirectional : bool, default False
        Run every layer in both directions; the output has 2H features and
        the states 2 * num_layers layers, as in torch.nn.LSTM.{extra}
    device : torch.device or str, optional
        The CPU (fastln's engine runs on CPUs): another device is a ValueError.
    dtype : torch.dtype, optional
        torch.float32 (the default dtype), torch.float64 or torch.bfloat16
        (inference only, on fastln's bfloat16 engine).
"""
_EPS = """
    eps : float, default 1e-5 (keyword only)
        Added to the variance in every LayerNorm."""
_NONLINEARITY = """
    nonlinearity : {'tanh', 'relu'}, default 'tanh'
        The cell's activation."""
_LN_BIAS = " (LNLSTM's ``bias``; the LayerNorms keep their gains and biases)"
_PLAIN_BIAS = " (``bias_ih`` and ``bias_hh``)"


def _doc(nonlinearity: str = "", bias: str = _LN_BIAS, extra: str = _EPS) -> str:
    return _ARGS.format(nonlinearity=nonlinearity, bias=bias, extra=extra)


class LNLSTM(RecurrentModule):
    __doc__ = """The layer-normalized LSTM of Ba, Kiros & Hinton (2016), as a torch module.

    Called as torch.nn.LSTM: ``module(input, (h_0, c_0)) -> (output, (h_n, c_n))``.
    The parameters of layer k are fastln.rnn.LNLSTM's: ``weight_ih_l{k}``
    (4H, I), ``weight_hh_l{k}`` (4H, H), ``bias_l{k}`` (4H), the gains and
    biases of the LayerNorms ``ln_ih_*``, ``ln_hh_*`` (4H) and ``ln_c_*``
    (H), with the suffix ``_reverse`` for the reverse direction; the gates
    in torch's order (i, f, g, o). ``gate_norm``, ``carry`` and ``ln_bias``
    select the variants of fastln.rnn.LNLSTM (``bias`` is its ``gate_bias``),
    with their parameter names.
""" + _doc(extra=_EPS + """
    gate_norm : {'pair', 'sum', 'per_gate'}, default 'pair' (keyword only)
    carry : {'raw', 'normalized'}, default 'raw' (keyword only)
    ln_bias : bool, default True (keyword only)
        As fastln.rnn.LNLSTM's.""") + """
    Examples
    --------
    >>> import torch
    >>> from fastln.torch import LNLSTM
    >>> lstm = LNLSTM(8, 16, num_layers=2, batch_first=True)
    >>> y, (h, c) = lstm(torch.randn(3, 5, 8))
    >>> y.shape, h.shape
    (torch.Size([3, 5, 16]), torch.Size([2, 3, 16]))
    >>> y.sum().backward()
    >>> lstm.weight_hh_l0.grad.shape
    torch.Size([64, 16])
    """
    _rnn_class = _rnn.LNLSTM
    _has_cell = True
    _gates = 4
    _cell_kwargs = ("eps", "gate_norm", "carry", "ln_bias")

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, *, eps: float = 1e-5, gate_norm: str = "pair",
                 carry: str = "raw", ln_bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        v = variant(gate_norm, carry, True, ln_bias)   # bias: checked as torch.nn's below
        self.gate_norm, self.carry, self.ln_bias = v.gate_norm, v.carry, v.ln_bias
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, eps, device, dtype, v.cell())

    def _options(self) -> Variant:
        return Variant(self.gate_norm, self.carry, self.bias, self.ln_bias)

    def _omits(self, name: str) -> bool:
        return name in self._options().omitted()

    def _rnn_kwargs(self) -> Dict[str, Any]:
        return dict(super()._rnn_kwargs(), gate_bias=self.bias)

    @classmethod
    def _module_kwargs(cls, model: Any) -> Dict[str, Any]:
        return dict(super()._module_kwargs(model), bias=model.gate_bias)

    def _extra_repr_cell(self) -> str:   # bias shows as torch.nn's
        return "".join(f", {name}={value!r}" for name, value in
                       self._options().changed().items() if name != "gate_bias")


class LNGRU(RecurrentModule):
    __doc__ = """The layer-normalized GRU, as a torch module.

    Called as torch.nn.GRU: ``module(input, h_0) -> (output, h_n)``. The
    parameters of layer k are fastln.rnn.LNGRU's: ``weight_ih_l{k}`` (3H,
    I), ``weight_hh_l{k}`` (3H, H) in torch's gate order (r, z, n), and the
    LayerNorms' gains and biases ``ln_ih_*``, ``ln_hh_*`` (2H), ``ln_in_*``
    and ``ln_hn_*`` (H).
""" + _doc(bias=" (the LN-GRU has none besides its LayerNorms': bias is accepted for "
              "torch.nn.GRU's signature)") + """
    Examples
    --------
    >>> import torch
    >>> from fastln.torch import LNGRU
    >>> y, h = LNGRU(8, 16)(torch.randn(5, 3, 8))
    >>> y.shape, h.shape
    (torch.Size([5, 3, 16]), torch.Size([1, 3, 16]))
    """
    _rnn_class = _rnn.LNGRU
    _gates = 3
    _cell_kwargs = ("eps",)

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, *, eps: float = 1e-5, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, eps, device, dtype, "gru")


class LNRNN(RecurrentModule):
    __doc__ = """The layer-normalized RNN, h' = act(LN(W_ih x + W_hh h)), as a torch module.

    Called as torch.nn.RNN: ``module(input, h_0) -> (output, h_n)``. The
    parameters of layer k are fastln.rnn.LNRNN's: ``weight_ih_l{k}`` (H,
    I), ``weight_hh_l{k}`` (H, H), ``ln_weight_l{k}`` and ``ln_bias_l{k}`` (H).
""" + _doc(_NONLINEARITY, bias=" (the LN-RNN has none besides its LayerNorm's: bias is "
           "accepted for torch.nn.RNN's signature)") + """
    Examples
    --------
    >>> import torch
    >>> from fastln.torch import LNRNN
    >>> LNRNN(8, 16, nonlinearity="relu")
    LNRNN(8, 16, eps=1e-05, nonlinearity='relu')
    """
    _rnn_class = _rnn.LNRNN
    _cell_kwargs = ("eps", "nonlinearity")

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 nonlinearity: str = "tanh", bias: bool = True, batch_first: bool = False,
                 dropout: float = 0.0, bidirectional: bool = False, *, eps: float = 1e-5,
                 device: Any = None, dtype: Any = None) -> None:
        self.nonlinearity = _validate.nonlinearity(nonlinearity)
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, eps, device, dtype, "rnn_" + self.nonlinearity)


    def _extra_repr_cell(self) -> str:
        return f", nonlinearity={self.nonlinearity!r}"


class LSTM(RecurrentModule):
    __doc__ = """The LSTM without LayerNorm on fastln's engine: torch.nn.LSTM's drop-in.

    Its parameters are torch.nn.LSTM's, by name and shape, so that its
    ``state_dict`` loads into torch.nn.LSTM and back unchanged;
    ``proj_size`` must be 0.
""" + _doc(bias=_PLAIN_BIAS, extra="""
    proj_size : int, default 0
        Only 0: a projected LSTM is not supported (ValueError).""") + """
    Examples
    --------
    >>> import torch
    >>> from fastln.torch import LSTM
    >>> ref = torch.nn.LSTM(8, 16)
    >>> lstm = LSTM(8, 16)
    >>> lstm.load_state_dict(ref.state_dict())
    <All keys matched successfully>
    >>> x = torch.randn(5, 3, 8)
    >>> torch.allclose(lstm(x)[0], ref(x)[0], atol=1e-5)
    True
    """
    _rnn_class = _rnn.LSTM
    _has_cell = True
    _gates = 4
    _plain = True

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, device: Any = None,
                 dtype: Any = None) -> None:
        if proj_size != 0:
            raise ValueError(f"proj_size must be 0 (fastln.torch.LSTM has no projection), "
                             f"got {proj_size!r}")
        self.proj_size = 0
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, 1e-5, device, dtype, "lstm_plain")


class GRU(RecurrentModule):
    __doc__ = """The GRU without LayerNorm on fastln's engine: torch.nn.GRU's drop-in.

    Its parameters are torch.nn.GRU's, by name and shape (its
    ``state_dict`` loads into torch.nn.GRU and back unchanged).
""" + _doc(bias=_PLAIN_BIAS, extra="") + """
    Examples
    --------
    >>> import torch
    >>> from fastln.torch import GRU
    >>> sorted(GRU(8, 16).state_dict())
    ['bias_hh_l0', 'bias_ih_l0', 'weight_hh_l0', 'weight_ih_l0']
    """
    _rnn_class = _rnn.GRU
    _gates = 3
    _plain = True

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, device: Any = None, dtype: Any = None) -> None:
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, 1e-5, device, dtype, "gru_plain")


class RNN(RecurrentModule):
    __doc__ = """The Elman RNN on fastln's engine: torch.nn.RNN's drop-in.

    Its parameters are torch.nn.RNN's, by name and shape (its
    ``state_dict`` loads into torch.nn.RNN and back unchanged).
""" + _doc(_NONLINEARITY, bias=_PLAIN_BIAS, extra="") + """
    Examples
    --------
    >>> import torch
    >>> from fastln.torch import RNN
    >>> y, h = RNN(8, 16, nonlinearity="relu")(torch.randn(5, 8))   # unbatched
    >>> y.shape, h.shape
    (torch.Size([5, 16]), torch.Size([1, 16]))
    """
    _rnn_class = _rnn.RNN
    _plain = True
    _cell_kwargs = ("nonlinearity",)

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 nonlinearity: str = "tanh", bias: bool = True, batch_first: bool = False,
                 dropout: float = 0.0, bidirectional: bool = False, device: Any = None,
                 dtype: Any = None) -> None:
        self.nonlinearity = _validate.nonlinearity(nonlinearity)
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, 1e-5, device, dtype, f"rnn_{self.nonlinearity}_plain")


    def _extra_repr_cell(self) -> str:
        return f", nonlinearity={self.nonlinearity!r}"
