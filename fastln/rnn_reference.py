"""Slow, obviously-correct float64 NumPy references for :mod:`fastln.rnn`.

The yardstick the tests hold LNRNN, LNLSTM and LNGRU to (forward only).  Each
function follows the equations of docs/design.md ("Recurrent networks") line by
line, with a plain Python loop over time and layers and every value in float64:

* ``lnrnn_forward``:  h_t = f(LN(x_t W_ih^T + h_{t-1} W_hh^T; ln))
* ``lnlstm_forward``: gates = LN(x_t W_ih^T; ln_ih) + LN(h_{t-1} W_hh^T; ln_hh) + bias
  (gate order i, f, g, o);  c_t = f*c_{t-1} + i*g;  h_t = o*tanh(LN(c_t; ln_c))
* ``lngru_forward``:  [z;r] = LN(x_t W_ih[z,r]^T; ln_ih) + LN(h_{t-1} W_hh[z,r]^T; ln_hh);
  n = tanh(LN(x_t W_ih[n]^T; ln_in) + sigmoid(r)*LN(h_{t-1} W_hh[n]^T; ln_hn));
  h_t = (1-sigmoid(z))*h_{t-1} + sigmoid(z)*n
* ``lstm_forward`` (the plain LSTM, no LN): gates = x_t W_ih^T + h_{t-1} W_hh^T + bias;
  c_t = f*c_{t-1} + i*g;  h_t = o*tanh(c_t)
* ``rnn_forward`` (the plain RNN, no LN): h_t = f(x_t W_ih^T + h_{t-1} W_hh^T + bias)

The five ``*_forward`` functions take ``params`` (the model's dict, names as
in ``param_shapes``), ``x`` of shape (T, B, I) (or (B, T, I) with
``batch_first=True``), an initial ``state`` (None means zeros; LSTM: a tuple
(h, c)), optional ``lengths`` (B,), and return ``(y, final_state)`` as
float64 arrays.  With ``lengths``, sequence b holds its state after step
lengths[b] and its y there is 0; layer k+1 reads layer k's (zeroed) output,
which does not matter because its state holds too.

Examples
--------
>>> import numpy as np
>>> from fastln.rnn import LNLSTM
>>> from fastln import rnn_reference
>>> m = LNLSTM(input_size=3, hidden_size=4, num_layers=2, dtype=np.float64, seed=0)
>>> x = np.random.default_rng(0).standard_normal((6, 2, 3))
>>> y, (h, c) = m.forward(x)
>>> y_ref, (h_ref, c_ref) = rnn_reference.lnlstm_forward(m.params, x, num_layers=2)
>>> bool(np.allclose(y, y_ref)), bool(np.allclose(c, c_ref))
(True, True)
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional, Tuple

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt
    from typing_extensions import TypeAlias

    _Array: TypeAlias = npt.NDArray[np.float64]
    _Params: TypeAlias = Dict[str, _Array]
    # one step: (layer parameters, x_t, states) -> new states; states[0] is h
    _Step: TypeAlias = Callable[[_Params, _Array, Tuple[_Array, ...]], Tuple[_Array, ...]]

__all__ = ["param_shapes", "layer_norm", "lnrnn_forward", "lnlstm_forward", "lngru_forward",
           "lstm_forward", "rnn_forward"]


def param_shapes(cell: str, input_size: int, hidden_size: int,
                 num_layers: int) -> Dict[str, Tuple[int, ...]]:
    """{name: shape} of the parameters of ``cell`` in "rnn", "lstm", "gru" (the LN cells)
    and "rnn_plain", "lstm_plain" (the plain ones).

    Parameters
    ----------
    cell : {"rnn", "lstm", "gru", "rnn_plain", "lstm_plain"}
        The cell: LNRNN, LNLSTM, LNGRU, RNN or LSTM of :mod:`fastln.rnn`.
    input_size, hidden_size, num_layers : int
        I, H and the number of layers.

    Returns
    -------
    dict of str to tuple of int
        The parameter names with their ``_l{k}`` suffix, as in the models'
        ``params``.

    Raises
    ------
    ValueError
        An unknown cell.

    Examples
    --------
    >>> from fastln.rnn_reference import param_shapes
    >>> param_shapes("rnn_plain", 3, 4, 1)
    {'weight_ih_l0': (4, 3), 'weight_hh_l0': (4, 4), 'bias_l0': (4,)}
    """
    H = hidden_size
    shapes: Dict[str, Tuple[int, ...]] = {}
    layer: Dict[str, Tuple[int, ...]]
    for k in range(num_layers):
        I = input_size if k == 0 else H
        if cell == "rnn":
            layer = {"weight_ih": (H, I), "weight_hh": (H, H), "ln_weight": (H,), "ln_bias": (H,)}
        elif cell == "lstm":
            layer = {"weight_ih": (4 * H, I), "weight_hh": (4 * H, H), "bias": (4 * H,),
                     "ln_ih_weight": (4 * H,), "ln_ih_bias": (4 * H,),
                     "ln_hh_weight": (4 * H,), "ln_hh_bias": (4 * H,),
                     "ln_c_weight": (H,), "ln_c_bias": (H,)}
        elif cell == "gru":
            layer = {"weight_ih": (3 * H, I), "weight_hh": (3 * H, H),
                     "ln_ih_weight": (2 * H,), "ln_ih_bias": (2 * H,),
                     "ln_hh_weight": (2 * H,), "ln_hh_bias": (2 * H,),
                     "ln_in_weight": (H,), "ln_in_bias": (H,),
                     "ln_hn_weight": (H,), "ln_hn_bias": (H,)}
        elif cell in ("rnn_plain", "lstm_plain"):
            G = (4 if cell == "lstm_plain" else 1) * H
            layer = {"weight_ih": (G, I), "weight_hh": (G, H), "bias": (G,)}
        else:
            raise ValueError("cell must be 'rnn', 'lstm', 'gru', 'rnn_plain' or 'lstm_plain', "
                             "got %r" % (cell,))
        shapes.update({"%s_l%d" % (name, k): shape for name, shape in layer.items()})
    return shapes


def layer_norm(a: _Array, weight: npt.ArrayLike, bias: npt.ArrayLike, eps: float) -> _Array:
    """LN over the last axis: (a - mean)/sqrt(var + eps)*weight + bias (biased variance).

    Parameters
    ----------
    a : ndarray
        Rows to normalize over the last axis (a NumPy array: ``a.mean`` is
        used).
    weight, bias : array_like
        Gain and bias, broadcast against a's rows (no None).
    eps : float
        Added to the variance.

    Returns
    -------
    ndarray
        a's shape, in the dtype of the arithmetic (float64 for float64 input).

    Examples
    --------
    >>> import numpy as np
    >>> from fastln.rnn_reference import layer_norm
    >>> layer_norm(np.array([[1., 2., 3.]]), 1.0, 0.0, 0.0).round(4)
    array([[-1.2247,  0.    ,  1.2247]])
    """
    mean = a.mean(axis=-1, keepdims=True)
    var = ((a - mean) ** 2).mean(axis=-1, keepdims=True)
    y: _Array = (a - mean) / np.sqrt(var + eps) * weight + bias
    return y


def _relu(a: _Array) -> _Array:
    return np.maximum(a, 0.0)


_ACTIVATIONS: Dict[str, Callable[[_Array], _Array]] = {"tanh": np.tanh, "relu": _relu}


def _sigmoid(a: _Array) -> _Array:
    return 1.0 / (1.0 + np.exp(-a))


def _layer_params(params: Mapping[str, npt.ArrayLike], k: int) -> _Params:
    """Layer k's parameters as float64, without the "_l{k}" suffix."""
    suffix = "_l%d" % k
    return {name[:-len(suffix)]: np.asarray(p, np.float64)
            for name, p in params.items() if name.endswith(suffix)}


def _run(step: _Step, nstates: int, params: Mapping[str, npt.ArrayLike], x: npt.ArrayLike,
         state: Any, lengths: Optional[npt.ArrayLike], num_layers: int,
         batch_first: bool) -> Tuple[_Array, Any]:
    """Generic multi-layer loop. ``step(p, x_t, states) -> new states`` (a tuple;
    states[0] is h)."""
    x = np.asarray(x, np.float64)
    if batch_first:
        x = x.transpose(1, 0, 2)
    T, B, _ = x.shape
    H = np.shape(params["weight_hh_l0"])[1]
    if state is None:
        state = tuple(np.zeros((num_layers, B, H)) for _ in range(nstates))
    elif nstates == 1:
        state = (state,)
    state = [np.array(s, np.float64) for s in state]          # copies: (num_layers, B, H) each
    alive = np.ones((T, B, 1), bool) if lengths is None else \
        (np.arange(T)[:, None] < np.asarray(lengths)[None, :])[:, :, None]
    inp = x
    for k in range(num_layers):
        p = _layer_params(params, k)
        out = np.zeros((T, B, H))
        for t in range(T):
            new = step(p, inp[t], tuple(s[k] for s in state))
            for s, n in zip(state, new):
                s[k] = np.where(alive[t], n, s[k])            # a finished sequence holds its state
            out[t] = np.where(alive[t], state[0][k], 0.0)     # ... and outputs 0
        inp = out
    y = inp.transpose(1, 0, 2) if batch_first else inp
    return y, (state[0] if nstates == 1 else tuple(state))


def lnrnn_forward(params: Mapping[str, npt.ArrayLike], x: npt.ArrayLike,
                  state: Optional[npt.ArrayLike] = None,
                  lengths: Optional[npt.ArrayLike] = None, num_layers: int = 1,
                  eps: float = 1e-5, nonlinearity: str = "tanh", batch_first: bool = False
                  ) -> Tuple[_Array, _Array]:
    """LN-RNN: returns y (T, B, H) and h_n (num_layers, B, H).

    Parameters
    ----------
    params : mapping of str to ndarray
        The model's parameters, as :func:`param_shapes` names them for
        ``"rnn"``.
    x : array_like, shape (T, B, I), or (B, T, I) with batch_first
        The input.
    state : ndarray, optional
        The initial state h, (num_layers, B, H); None means zeros.
    lengths : array_like of int, shape (B,), optional
        The length of each sequence of a padded batch.
    num_layers : int, default 1
        The number of layers in ``params``.
    eps : float, default 1e-5
        Added to the variance in every LayerNorm.
    nonlinearity : {"tanh", "relu"}, default "tanh"
        The f of ``h_t = f(...)``.
    batch_first : bool, default False
        x and y are (B, T, ...) instead of (T, B, ...).

    Returns
    -------
    y : ndarray of float64, shape (T, B, H), or (B, T, H) with batch_first
        The top layer's output.
    h_n : ndarray of float64, shape (num_layers, B, H)
        The final state.

    Raises
    ------
    KeyError
        Another nonlinearity.
    """
    f = _ACTIVATIONS[nonlinearity]

    def step(p: _Params, x_t: _Array, states: Tuple[_Array, ...]) -> Tuple[_Array, ...]:
        (h,) = states
        a = x_t @ p["weight_ih"].T + h @ p["weight_hh"].T
        return (f(layer_norm(a, p["ln_weight"], p["ln_bias"], eps)),)

    return _run(step, 1, params, x, state, lengths, num_layers, batch_first)


def lnlstm_forward(params: Mapping[str, npt.ArrayLike], x: npt.ArrayLike,
                   state: Optional[Tuple[npt.ArrayLike, npt.ArrayLike]] = None,
                   lengths: Optional[npt.ArrayLike] = None, num_layers: int = 1,
                   eps: float = 1e-5, batch_first: bool = False
                   ) -> Tuple[_Array, Tuple[_Array, _Array]]:
    """LN-LSTM: returns y (T, B, H) and (h_n, c_n), each (num_layers, B, H).

    Parameters
    ----------
    params : mapping of str to ndarray
        The model's parameters, as :func:`param_shapes` names them for
        ``"lstm"``.
    x : array_like, shape (T, B, I), or (B, T, I) with batch_first
        The input.
    state : tuple of ndarray, optional
        The initial state (h, c), each (num_layers, B, H); None means zeros.
    lengths : array_like of int, shape (B,), optional
        The length of each sequence of a padded batch.
    num_layers : int, default 1
        The number of layers in ``params``.
    eps : float, default 1e-5
        Added to the variance in every LayerNorm.
    batch_first : bool, default False
        x and y are (B, T, ...) instead of (T, B, ...).

    Returns
    -------
    y : ndarray of float64, shape (T, B, H), or (B, T, H) with batch_first
        The top layer's output.
    state : tuple of ndarray of float64
        The final state (h_n, c_n), each (num_layers, B, H).
    """
    def step(p: _Params, x_t: _Array, states: Tuple[_Array, ...]) -> Tuple[_Array, ...]:
        h, c = states
        gates = (layer_norm(x_t @ p["weight_ih"].T, p["ln_ih_weight"], p["ln_ih_bias"], eps)
                 + layer_norm(h @ p["weight_hh"].T, p["ln_hh_weight"], p["ln_hh_bias"], eps)
                 + p["bias"])
        o, c_new = _lstm_update(gates, c)
        h_new = o * np.tanh(layer_norm(c_new, p["ln_c_weight"], p["ln_c_bias"], eps))
        return h_new, c_new

    return _run(step, 2, params, x, state, lengths, num_layers, batch_first)


def lngru_forward(params: Mapping[str, npt.ArrayLike], x: npt.ArrayLike,
                  state: Optional[npt.ArrayLike] = None,
                  lengths: Optional[npt.ArrayLike] = None, num_layers: int = 1,
                  eps: float = 1e-5, batch_first: bool = False) -> Tuple[_Array, _Array]:
    """LN-GRU: returns y (T, B, H) and h_n (num_layers, B, H).

    Parameters
    ----------
    params : mapping of str to ndarray
        The model's parameters, as :func:`param_shapes` names them for
        ``"gru"``.
    x : array_like, shape (T, B, I), or (B, T, I) with batch_first
        The input.
    state : ndarray, optional
        The initial state h, (num_layers, B, H); None means zeros.
    lengths : array_like of int, shape (B,), optional
        The length of each sequence of a padded batch.
    num_layers : int, default 1
        The number of layers in ``params``.
    eps : float, default 1e-5
        Added to the variance in every LayerNorm.
    batch_first : bool, default False
        x and y are (B, T, ...) instead of (T, B, ...).

    Returns
    -------
    y : ndarray of float64, shape (T, B, H), or (B, T, H) with batch_first
        The top layer's output.
    h_n : ndarray of float64, shape (num_layers, B, H)
        The final state.
    """
    def step(p: _Params, x_t: _Array, states: Tuple[_Array, ...]) -> Tuple[_Array, ...]:
        (h,) = states
        H = h.shape[-1]
        w_ih, w_hh = p["weight_ih"], p["weight_hh"]
        zr = (layer_norm(x_t @ w_ih[:2 * H].T, p["ln_ih_weight"], p["ln_ih_bias"], eps)
              + layer_norm(h @ w_hh[:2 * H].T, p["ln_hh_weight"], p["ln_hh_bias"], eps))
        z, r = _sigmoid(zr[:, :H]), _sigmoid(zr[:, H:])
        n = np.tanh(layer_norm(x_t @ w_ih[2 * H:].T, p["ln_in_weight"], p["ln_in_bias"], eps)
                    + r * layer_norm(h @ w_hh[2 * H:].T, p["ln_hn_weight"], p["ln_hn_bias"], eps))
        return ((1.0 - z) * h + z * n,)

    return _run(step, 1, params, x, state, lengths, num_layers, batch_first)


def _lstm_update(gates: _Array, c: _Array) -> Tuple[_Array, _Array]:
    gi, gf, gg, go = np.split(gates, 4, axis=-1)
    i, f, g, o = _sigmoid(gi), _sigmoid(gf), np.tanh(gg), _sigmoid(go)
    return o, f * c + i * g


def lstm_forward(params: Mapping[str, npt.ArrayLike], x: npt.ArrayLike,
                 state: Optional[Tuple[npt.ArrayLike, npt.ArrayLike]] = None,
                 lengths: Optional[npt.ArrayLike] = None, num_layers: int = 1,
                 batch_first: bool = False) -> Tuple[_Array, Tuple[_Array, _Array]]:
    """Plain LSTM: returns y (T, B, H) and (h_n, c_n), each (num_layers, B, H).

    Parameters
    ----------
    params : mapping of str to ndarray
        The model's parameters, as :func:`param_shapes` names them for
        ``"lstm_plain"``.
    x : array_like, shape (T, B, I), or (B, T, I) with batch_first
        The input.
    state : tuple of ndarray, optional
        The initial state (h, c), each (num_layers, B, H); None means zeros.
    lengths : array_like of int, shape (B,), optional
        The length of each sequence of a padded batch.
    num_layers : int, default 1
        The number of layers in ``params``.
    batch_first : bool, default False
        x and y are (B, T, ...) instead of (T, B, ...).

    Returns
    -------
    y : ndarray of float64, shape (T, B, H), or (B, T, H) with batch_first
        The top layer's output.
    state : tuple of ndarray of float64
        The final state (h_n, c_n), each (num_layers, B, H).
    """
    def step(p: _Params, x_t: _Array, states: Tuple[_Array, ...]) -> Tuple[_Array, ...]:
        h, c = states
        o, c_new = _lstm_update(x_t @ p["weight_ih"].T + h @ p["weight_hh"].T + p["bias"], c)
        return o * np.tanh(c_new), c_new

    return _run(step, 2, params, x, state, lengths, num_layers, batch_first)


def rnn_forward(params: Mapping[str, npt.ArrayLike], x: npt.ArrayLike,
                state: Optional[npt.ArrayLike] = None,
                lengths: Optional[npt.ArrayLike] = None, num_layers: int = 1,
                nonlinearity: str = "tanh", batch_first: bool = False
                ) -> Tuple[_Array, _Array]:
    """Plain RNN: returns y (T, B, H) and h_n (num_layers, B, H).

    Parameters
    ----------
    params : mapping of str to ndarray
        The model's parameters, as :func:`param_shapes` names them for
        ``"rnn_plain"``.
    x : array_like, shape (T, B, I), or (B, T, I) with batch_first
        The input.
    state : ndarray, optional
        The initial state h, (num_layers, B, H); None means zeros.
    lengths : array_like of int, shape (B,), optional
        The length of each sequence of a padded batch.
    num_layers : int, default 1
        The number of layers in ``params``.
    nonlinearity : {"tanh", "relu"}, default "tanh"
        The f of ``h_t = f(...)``.
    batch_first : bool, default False
        x and y are (B, T, ...) instead of (T, B, ...).

    Returns
    -------
    y : ndarray of float64, shape (T, B, H), or (B, T, H) with batch_first
        The top layer's output.
    h_n : ndarray of float64, shape (num_layers, B, H)
        The final state.

    Raises
    ------
    KeyError
        Another nonlinearity.
    """
    f = _ACTIVATIONS[nonlinearity]

    def step(p: _Params, x_t: _Array, states: Tuple[_Array, ...]) -> Tuple[_Array, ...]:
        (h,) = states
        return (f(x_t @ p["weight_ih"].T + h @ p["weight_hh"].T + p["bias"]),)

    return _run(step, 1, params, x, state, lengths, num_layers, batch_first)
