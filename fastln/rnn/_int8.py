"""int8 recurrent models: fastln.rnn.quantize, and the quantization of a
weight matrix (int8 values with a float32 scale per row)."""
from __future__ import annotations

from typing import Any, Tuple, TypeVar

import numpy as np
import numpy.typing as npt

from ._base import _frozen, _LNRecurrent
from ._bf16 import _is_bf16

_Array = npt.NDArray[Any]
_Model = TypeVar("_Model", bound=_LNRecurrent[Any])


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


def quantize(model: _Model) -> _Model:
    """An int8 copy of a recurrent model, for inference.

    Each weight matrix (``weight_ih`` and ``weight_hh`` of every layer and
    direction) becomes int8 with a float32 scale per row, its largest
    magnitude over 127: ``params["weight_ih_l0"]`` holds the int8 values
    and ``params["weight_ih_scale_l0"]`` the scales. The gains and biases
    stay float32. At run time each row of a product's input (x, or h) is
    quantized to int8 with a scale of its own, the int8 products are summed
    exactly in int32, and each sum is scaled back to float32; the gates, the
    LayerNorm statistics and the state are float32, as in a float32 model.

    Parameters
    ----------
    model : LNRNN, LNLSTM, LNGRU, LSTM, GRU or RNN
        A float32, float64 or bfloat16 model, of any number of layers, in
        one or both directions. It is not changed.

    Returns
    -------
    model
        A new model of the same class and configuration, of dtype float32
        (its inputs, outputs and state are float32). It has the float
        model's inference API: ``forward(x, state, lengths=...,
        cache=False)``, :meth:`step` (with ``out=`` and ``state_out=``),
        :class:`StreamTable` and :class:`StreamBatcher`; ``backward``,
        ``forward(..., cache=True)`` and ``.to()`` raise a TypeError. It
        pickles, and ``state_dict`` / ``load_state_dict`` carry the int8
        values and the scales.

    Raises
    ------
    TypeError
        model is not a fastln.rnn model.
    ValueError
        model is already int8, or a weight holds NaN or infinity.

    Notes
    -----
    Quantization is deterministic: the same float model gives bitwise the
    same int8 model. A row's results do not depend on the other rows of
    its batch, on the thread count, or on the kernel the CPU runs
    (:func:`fastln.rnn.int8_products`): the int32 sums are exact on every
    path. See the int8 page of the guide for the errors against float32.

    Examples
    --------
    >>> import numpy as np
    >>> from fastln.rnn import LSTM, quantize
    >>> m = LSTM(input_size=3, hidden_size=4, seed=0)
    >>> q = quantize(m)
    >>> q.params["weight_hh_l0"].dtype, q.params["weight_hh_scale_l0"].shape
    (dtype('int8'), (16,))
    >>> x = np.ones((5, 2, 3), np.float32)
    >>> y, _ = q.forward(x, cache=False)
    >>> bool(np.abs(y - m.forward(x, cache=False)[0]).max() < 0.02)
    True
    """
    if not isinstance(model, _LNRecurrent):
        raise TypeError(f"model must be a fastln.rnn model, got {type(model).__name__}")
    if model._int8:
        raise ValueError("model is int8 already")
    new = model._bare_copy()
    new.dtype = new._dt = np.dtype(np.float32)
    new._int8 = True
    new._shapes = dict(model._shapes)
    new._keys = [[list(keys) for keys in layer] for layer in model._keys]
    params = {}
    for layer in new._keys:
        for keys in layer:
            for key in keys[:2]:   # weight_ih_l{k}{sfx}, weight_hh_l{k}{sfx}
                w = model.params[key]
                if isinstance(w, np.ndarray) and _is_bf16(w.dtype):
                    w = w.astype(np.float32)
                q, scale = quantize_rows(w)
                name = key.replace("_l", "_scale_l", 1)
                params[key] = _frozen(q)
                params[name] = scale
                new._shapes[name] = scale.shape
                keys.append(name)
    for key, value in model.params.items():
        if key not in new._matrices:
            params[key] = np.array(value, np.float32)
    new.params = params
    new.grads = {}
    return new
