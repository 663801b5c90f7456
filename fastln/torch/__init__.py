"""fastln's recurrent networks as PyTorch modules that train with autograd.

``pip install "fastln[torch]"``. :class:`LNLSTM`, :class:`LNGRU` and
:class:`LNRNN` (the layer-normalized cells of :mod:`fastln.rnn`) and
:class:`LSTM`, :class:`GRU` and :class:`RNN` (torch.nn's drop-ins, under
their parameter names) are ``torch.nn.Module`` subclasses called as
``torch.nn.LSTM`` is: ``module(input, hx) -> (output, h_n)``, with
``num_layers``, ``bidirectional``, ``batch_first``, ``dropout`` between
layers and PackedSequence inputs.

Forward and backward run fastln's C engine through two operators,
``torch.ops.fastln.rnn_layer`` and ``rnn_layer_backward``, registered with
``torch.library``: autograd reaches the input, the initial state and every
parameter; ``torch.compile(fullgraph=True)`` traces them without a graph
break and ``torch.export`` exports them. Results are bitwise those of the
:mod:`fastln.rnn` model on the same weights (:meth:`RecurrentModule.to_rnn`).

For inference, ``module.to(torch.bfloat16)`` runs fastln's bfloat16 engine
and :func:`quantize` gives an int8 module on its int8 engine, both under
``torch.no_grad()``; :meth:`RecurrentModule.step` runs one step of a stream.

Threads: the engine runs on fastln's own thread pool
(:func:`fastln.set_num_threads`, ``FASTLN_NUM_THREADS``), not on torch's
(``torch.set_num_threads`` does not change it).

The package's modules: ``_ops.py`` (the operators), ``_base.py``
(:class:`RecurrentModule`), ``_cells.py`` (the six modules) and
``_engine_model.py`` (fastln.rnn models on a module's weights, and modules
on a model's). They import torch, NumPy and fastln.rnn's public modules;
``import fastln`` and ``import fastln.rnn`` never import this package.

Examples
--------
>>> import torch
>>> from fastln.torch import LNLSTM
>>> model = torch.nn.Sequential()
>>> lstm = LNLSTM(4, 8)
>>> y, (h, c) = lstm(torch.randn(6, 2, 4, requires_grad=True))
>>> y.mean().backward()
>>> lstm.ln_c_weight_l0.grad.shape
torch.Size([8])
"""
from __future__ import annotations

from typing import Any

try:
    import torch  # noqa: F401
except ImportError:   # a clear message for the one feature that needs it
    from .._optional import missing

    raise missing("torch", "fastln.torch") from None

from . import _engine_model
from ._base import RecurrentModule
from ._cells import GRU, LNGRU, LNLSTM, LNRNN, LSTM, RNN

__all__ = ["LNLSTM", "LNGRU", "LNRNN", "LSTM", "GRU", "RNN", "RecurrentModule", "quantize"]


def quantize(module: Any) -> Any:
    """An int8 copy of a fastln.torch module, for inference.

    Each weight matrix becomes int8 with a float32 scale per row (as
    :func:`fastln.rnn.quantize`); the module holds them as buffers under
    fastln.rnn's keys (``weight_ih_l0``, ``weight_ih_scale_l0``, ...), so
    that its ``state_dict`` carries them. It runs under ``torch.no_grad()``
    on fastln's int8 engine, with float32 inputs, outputs and state; it has
    no parameters, and a call with a tensor that requires grad is a
    TypeError.

    Parameters
    ----------
    module : LNLSTM, LNGRU, LNRNN, LSTM, GRU or RNN
        A float32, float64 or bfloat16 module. It is not changed.

    Returns
    -------
    module
        A new module of the same class and configuration.

    Raises
    ------
    TypeError
        module is not a fastln.torch module.
    ValueError
        module is int8 already, or a weight holds NaN or infinity.

    Examples
    --------
    >>> import torch
    >>> from fastln.torch import LSTM, quantize
    >>> q = quantize(LSTM(8, 16))
    >>> q.weight_hh_l0.dtype, q.quantized
    (torch.int8, True)
    >>> with torch.no_grad():
    ...     y, (h, c) = q(torch.randn(5, 3, 8))
    >>> y.dtype
    torch.float32
    """
    if not isinstance(module, RecurrentModule):
        raise TypeError(f"module must be a fastln.torch module, got {type(module).__name__}")
    return _engine_model.quantize(module)


for _obj in (LNLSTM, LNGRU, LNRNN, LSTM, GRU, RNN, RecurrentModule, quantize):
    _obj.__module__ = __name__
del _obj
