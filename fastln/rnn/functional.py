"""One recurrent layer at a time, as functions over arrays: the engine's
forward and backward without a model object.

The models of :mod:`fastln.rnn` run their layers through these two
functions, and :mod:`fastln.torch` calls them from its autograd operators.
A caller holds every array: the parameters (in the engine's order, see
:func:`param_names`), the state (updated in place), the cache a forward
keeps for the backward, and the gradients the backward writes.

Cells, by name: ``"lstm"``, ``"gru"``, ``"rnn_tanh"`` and ``"rnn_relu"``
(the layer-normalized cells), LNLSTM's variants ``"lstm_sum"``,
``"lstm_per_gate"``, ``"lstm_carry_ln"``, ``"lstm_sum_carry_ln"`` and
``"lstm_per_gate_carry_ln"`` (its ``gate_norm`` and ``carry="normalized"``),
and ``"lstm_plain"``, ``"gru_plain"``,
``"gru_plain_reset_first"`` (ONNX's linear_before_reset=0),
``"rnn_tanh_plain"`` and ``"rnn_relu_plain"`` (without LayerNorm).
docs/design.md ("Recurrent networks") gives their equations.

Examples
--------
>>> import numpy as np
>>> from fastln.rnn import functional as F
>>> T, B, I, H = 5, 2, 3, 4
>>> F.param_names("rnn_tanh")
('weight_ih', 'weight_hh', 'ln_weight', 'ln_bias')
>>> rng = np.random.default_rng(0)
>>> params = [rng.standard_normal((H, I)), rng.standard_normal((H, H)), np.ones(H), np.zeros(H)]
>>> x = rng.standard_normal((T, B, I))
>>> h = np.zeros((1, B, H))
>>> cache = [np.empty(F.cache_size("rnn_tanh", T, B, H))]
>>> y = F.layer_forward("rnn_tanh", x, [params], h, caches=cache)
>>> grads = [[np.empty_like(p) for p in params]]
>>> dh = np.zeros((1, B, H))
>>> dx = F.layer_backward("rnn_tanh", x, [params], cache, np.ones_like(y), dh, grads=grads)
>>> y.shape, dx.shape, grads[0][0].shape
((5, 2, 4), (5, 2, 3), (4, 3))
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import numpy as np
import numpy.typing as npt

from . import _engine
from ._params import LAYOUTS, layer_shape

__all__ = ["layer_forward", "layer_backward", "param_names", "param_shapes", "cache_size",
           "work_size"]

_Array = npt.NDArray[Any]

# the engine's cells, by name
CELLS = tuple(_engine.CELLS)


def _layout(cell: str) -> str:
    """cell's key of LAYOUTS."""
    if cell not in _engine.CELLS:
        raise ValueError(f"cell must be one of {CELLS}, got {cell!r}")
    if cell.startswith(("lstm_sum", "lstm_per_gate")):
        return "lstm_sum"
    if cell == "lstm_carry_ln":
        return "lstm"
    if cell.startswith("gru_plain"):
        return "gru_plain"
    if cell.startswith("rnn_"):
        return "rnn_plain" if cell.endswith("_plain") else "rnn"
    return cell


def param_names(cell: str) -> Tuple[str, ...]:
    """The names of one layer's parameters of cell, in the order the engine
    takes them (a model's keys without their ``_l{k}`` suffix).

    Parameters
    ----------
    cell : str
        One of the engine's cells (see the module's docstring).

    Returns
    -------
    tuple of str

    Raises
    ------
    ValueError
        cell is not one of the engine's cells.
    """
    return tuple(name for name, _, _ in LAYOUTS[_layout(cell)][1])


def param_shapes(cell: str, input_size: int, hidden_size: int) -> Tuple[Tuple[int, ...], ...]:
    """The shapes of one layer's parameters of cell, in :func:`param_names`' order.

    Parameters
    ----------
    cell : str
        One of the engine's cells.
    input_size, hidden_size : int
        The layer's input features I and hidden units H.

    Returns
    -------
    tuple of tuple of int
        A weight matrix is (gates * H, I) or (gates * H, H); a gain or bias
        (units * H,).
    """
    gates, layout = LAYOUTS[_layout(cell)]
    return tuple(layer_shape(gates, name, units, input_size, hidden_size)
                 for name, units, _ in layout)


def cache_size(cell: str, T: int, B: int, H: int) -> int:
    """The elements of the cache one direction of a layer keeps for its backward.

    Parameters
    ----------
    cell : str
        One of the engine's cells.
    T, B, H : int
        Steps, sequences and hidden units.

    Returns
    -------
    int
        Elements of the forward's dtype.
    """
    _layout(cell)
    return int(_engine.cache_size(cell, T, B, H))


def work_size(cell: str, T: int, B: int, H: int) -> int:
    """The elements of scratch one direction of a layer's backward uses.

    Parameters
    ----------
    cell : str
        One of the engine's cells.
    T, B, H : int
        Steps, sequences and hidden units.

    Returns
    -------
    int
        Elements of the forward's dtype (``works`` of :func:`layer_backward`).
    """
    _layout(cell)
    return int(_engine.work_size(cell, T, B, H))


def _directions(params: Sequence[Any], h: _Array) -> int:
    D = len(params)
    if D not in (1, 2) or h.shape[0] != D:
        raise ValueError(f"params must hold one list per direction (1 or 2), as h's first "
                         f"axis: got {D} lists and h of shape {h.shape}")
    return D


def layer_forward(cell: str, x: _Array, params: Sequence[Sequence[_Array]], h: _Array,
                  c: Optional[_Array] = None, *, lengths: Optional[_Array] = None,
                  eps: float = 1e-5, caches: Optional[Sequence[_Array]] = None,
                  reverse: bool = False, out: Optional[_Array] = None,
                  wtype: int = _engine.W_SAME,
                  packed: Optional[Sequence[Optional[_Array]]] = None,
                  proj: int = 0) -> _Array:
    """One layer forward, in one direction or both.

    Parameters
    ----------
    cell : str
        One of the engine's cells (see the module's docstring).
    x : ndarray, shape (T, B, I)
        C-contiguous float32 or float64, T >= 1, B >= 1.
    params : list of D lists of ndarray
        Per direction (D = 1, or 2 for both: the forward's, then the
        reverse's) the layer's parameters in :func:`param_names`' order,
        C-contiguous, of x's dtype (or Fortran-ordered weight matrices).
    h : ndarray, shape (D, B, H)
        The initial state, overwritten with the final one.
    c : ndarray, shape (D, B, H), optional
        The LSTM cells' initial cell state, overwritten with the final one.
    lengths : ndarray of int64, shape (B,), optional
        Each sequence's length, in [1, T]; after it a sequence keeps its state
        and its outputs are 0.
    eps : float
        Added to the variance in every LayerNorm.
    caches : list of D ndarray, optional
        Per direction, :func:`cache_size` elements of x's dtype that keep
        what :func:`layer_backward` needs.
    reverse : bool
        With D = 1, run each sequence from its last valid step to its first.
    out : ndarray, shape (T, B, D * H), optional
        Receives y.
    wtype, packed
        How a model of :mod:`fastln.rnn` stores and packs its weight
        matrices (bfloat16 or int8); leave them for float weights.
    proj : int
        A ``"lstm_plain"`` layer's projection P (torch.nn.LSTM's
        proj_size), or 0: its params then end with W_hr (P, H) and W_hh is
        (4H, P); h and y have P features, c has H; forward without caches
        only.

    Returns
    -------
    y : ndarray, shape (T, B, D * H)
        The layer's output (out, where given).

    Raises
    ------
    ValueError
        An array of the wrong size, type or layout, or an unknown cell.
    """
    D = _directions(params, h)
    T, B, I = x.shape
    W = h.shape[2]
    H = c.shape[2] if proj and c is not None else W
    y = np.empty((T, B, D * W), x.dtype) if out is None else out
    if D == 1:
        _engine.forward(cell, T, B, I, H, eps, x, params[0], lengths,
                        None if caches is None else caches[0], y, h[0],
                        None if c is None else c[0], bool(reverse), wtype,
                        None if packed is None else packed[0], proj)
    else:
        _engine.forward2(cell, T, B, I, H, eps, x, params, lengths, caches, y, h, c,
                         wtype, packed, proj)
    return y


def layer_backward(cell: str, x: _Array, params: Sequence[Sequence[_Array]],
                   caches: Sequence[_Array], dy: _Array, dh: _Array,
                   dc: Optional[_Array] = None, *, grads: Sequence[Sequence[_Array]],
                   lengths: Optional[_Array] = None, eps: float = 1e-5,
                   reverse: bool = False, out: Optional[_Array] = None,
                   works: Optional[Sequence[Optional[_Array]]] = None) -> _Array:
    """One layer backward, of a :func:`layer_forward` that kept ``caches``.

    Parameters
    ----------
    cell, x, params, lengths, eps, reverse
        The forward's.
    caches : list of D ndarray
        The forward's caches.
    dy : ndarray, shape (T, B, D * H)
        The gradient of the loss with respect to y.
    dh, dc : ndarray, shape (D, B, H)
        The gradient with respect to the final state (dc: the cell state of
        the LSTM cells), overwritten with the gradient with respect to the
        initial state.
    grads : list of D lists of ndarray
        Per direction, arrays of the parameters' shapes that receive their
        gradients (overwritten, not accumulated).
    out : ndarray, shape (T, B, I), optional
        Receives dx.
    works : list of D ndarray or None, optional
        Scratch of the engine's work size per direction; None allocates it.

    Returns
    -------
    dx : ndarray, shape (T, B, I)
        The gradient with respect to x (out, where given); with D = 2 the sum
        of the two directions'.
    """
    D = _directions(params, dh)
    T, B, I = x.shape
    H = dh.shape[2]
    dx = np.empty((T, B, I), x.dtype) if out is None else out
    if works is None:
        works = [None] * D
    if D == 1:
        _engine.backward(cell, T, B, I, H, eps, x, params[0], lengths, caches[0], dy, dh[0],
                         None if dc is None else dc[0], dx, grads[0], works[0], bool(reverse))
    else:
        _engine.backward2(cell, T, B, I, H, eps, x, params, lengths, caches, dy, dh, dc, dx,
                          grads, works)
    return dx
