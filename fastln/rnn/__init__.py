"""Layer-normalized recurrent networks: LNRNN, LNLSTM and LNGRU, and the
plain LSTM, GRU and RNN (the same engine without LayerNorm) as their
baselines, in one or both directions.

The cells of Ba, Kiros & Hinton, "Layer Normalization" (2016): eq. 4 for the
plain RNN and supplementary eqs. 20-28 for the LSTM and GRU, with one set of
gains and biases shared by every time step. The exact equations are in
docs/design.md ("Recurrent networks") and in :mod:`fastln.rnn_reference`, the
slow float64 reference these models are tested against.

Each layer runs in the C engine (src_c/api/fastln_rnn.h): one product for the
input projections of a chunk of time steps, then per step one recurrent product and
one fused row kernel (LN statistics, gates, state update, LN(c), output).
Backward runs the steps in reverse the same way and ends with the products
for the weight gradients and dx. Every product is the engine's own, in a
fixed order: no BLAS library is involved. Python here only checks arguments and moves
arrays between layers; nothing depends on the sequence length beyond the
cache kept for backward, so a model runs on sequences of any length.

All six models share one interface: ``forward`` (also ``model(x)``),
``backward``, ``step``, ``state_dict`` and ``load_state_dict``, with the
parameters in the dict ``params`` and their gradients in ``grads``; LNLSTM,
LSTM, GRU and RNN also have a ``from_torch`` constructor, LNLSTM a
``from_keras`` one (TensorFlow's LN-LSTMs), and :func:`from_onnx` loads an
ONNX LSTM, GRU or RNN node.

For serving many streams of one model: :class:`StreamTable` keeps their
states in one preallocated table and steps any subset of them in one batched
call; :class:`StreamBatcher` gathers single steps that arrive one request at
a time (``await batcher.step(stream_id, x)``) into such batches, for asyncio
servers.

``bidirectional=True`` runs every layer in both directions, as PyTorch does:
the reverse direction of each sequence runs from its last valid step (per
``lengths``) back to its first, y has 2H features (the forward direction's,
then the reverse's), layer k+1 reads them, states are (2 * num_layers, B, H)
with layer k's directions at 2k and 2k+1, and the reverse direction's
parameters carry the suffix ``_reverse``. The two directions of a layer are
independent and run side by side, each on half the threads, on the float32
x86 paths. A backward consumes the
cache of its forward: each ``forward`` (with ``cache=True``) serves one
``backward``, and a second backward without a new forward raises a
RuntimeError (as in :class:`fastln.LayerNorm`). Data (x, dy, states) may be
CPU torch tensors that do not require grad; results are NumPy arrays.

:mod:`fastln.rnn.functional` runs one layer at a time as functions over
arrays (what the models and :mod:`fastln.torch` run their layers through).

The package's modules (docs/design.md, "Architecture"): ``base.py``
(:class:`RecurrentModel`, the six models' base, on the layers ``_step.py``,
``_params.py`` and ``_inputs.py``, and :func:`quantize`), ``_formats.py``
(the formats of the weight matrices), ``_cells.py`` (the six models),
``functional.py`` (one layer's forward and backward),
``_from_torch.py``, ``_from_keras.py`` and ``_onnx.py`` (the loaders), ``_streams.py``
(:class:`StreamTable`), ``_batcher/`` (:class:`StreamBatcher`), ``_bf16.py``
and the engine's binding ``_engine.pyx``. They import NumPy and fastln's
``_lib``, ``_validate``, ``_dtypes``, ``_torch`` and ``_optional`` (torch and onnx only when
a loader runs), never fastln.serve or fastln.dask.

Examples
--------
>>> import numpy as np
>>> from fastln.rnn import LNLSTM
>>> m = LNLSTM(input_size=8, hidden_size=16, num_layers=2, seed=0)
>>> x = np.ones((5, 3, 8), np.float32)            # (T, B, I)
>>> y, (h, c) = m.forward(x)
>>> y.shape, h.shape
((5, 3, 16), (2, 3, 16))
>>> dx, (dh0, dc0) = m.backward(np.ones_like(y))
>>> sorted(m.grads) == sorted(m.params)
True
"""
from ._batcher import OverloadedError, StreamBatcher
from ._cells import GRU, LNGRU, LNLSTM, LNRNN, LSTM, RNN
from ._engine import int8_products
from ._onnx import from_onnx
from ._streams import StreamTable, TableFullError, UnknownStreamError
from .base import RecurrentModel, quantize

__all__ = ["LNRNN", "LNLSTM", "LNGRU", "LSTM", "RNN", "GRU", "RecurrentModel", "from_onnx",
           "quantize", "int8_products", "StreamTable", "TableFullError", "UnknownStreamError",
           "StreamBatcher", "OverloadedError"]

# the public names say where users import them from (reprs, pickles, docs)
for _obj in (LNRNN, LNLSTM, LNGRU, LSTM, RNN, GRU, RecurrentModel, from_onnx, quantize,
             StreamTable, TableFullError, UnknownStreamError, StreamBatcher, OverloadedError):
    _obj.__module__ = __name__
del _obj
