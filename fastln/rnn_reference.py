"""Slow, obviously-correct float64 NumPy references for :mod:`fastln.rnn`.

The yardstick the tests hold LNRNN, LNLSTM, LNGRU, LSTM, RNN and GRU to (forward
only).  Each function follows the equations of docs/design.md ("Recurrent
networks") line by line, with a plain Python loop over time and layers and every
value in float64:

* ``lnrnn_forward``:  h_t = f(LN(x_t W_ih^T + h_{t-1} W_hh^T; ln))
* ``lnlstm_forward``: gates = LN(x_t W_ih^T; ln_ih) + LN(h_{t-1} W_hh^T; ln_hh) + bias
  (gate order i, f, g, o);  c_t = f*c_{t-1} + i*g;  h_t = o*tanh(LN(c_t; ln_c)); and
  its variants: gates = LN(x_t W_ih^T + h_{t-1} W_hh^T; ln) + bias (``gate_norm="sum"``)
  or that LN taken over each gate's block of H apart (``"per_gate"``); the state
  carried c_t = LN(f*c_{t-1} + i*g; ln_c) with h_t = o*tanh(c_t) (``carry="normalized"``)
* ``lngru_forward``:  [z;r] = LN(x_t W_ih[z,r]^T; ln_ih) + LN(h_{t-1} W_hh[z,r]^T; ln_hh);
  n = tanh(LN(x_t W_ih[n]^T; ln_in) + sigmoid(r)*LN(h_{t-1} W_hh[n]^T; ln_hn));
  h_t = (1-sigmoid(z))*h_{t-1} + sigmoid(z)*n
* ``lstm_forward`` (the plain LSTM, no LN): gates = x_t W_ih^T + h_{t-1} W_hh^T + bias;
  c_t = f*c_{t-1} + i*g;  h_t = o*tanh(c_t)
* ``rnn_forward`` (the plain RNN, no LN): h_t = f(x_t W_ih^T + h_{t-1} W_hh^T + bias)
* ``gru_forward`` (the plain GRU, no LN, gate blocks [r, z, n] as in torch.nn.GRU):
  r = sigmoid(x_t W_ir^T + h W_hr^T + bias[r]);  z = sigmoid(x_t W_iz^T + h W_hz^T + bias[z]);
  n = tanh(x_t W_in^T + bias[n] + r*(h W_hn^T + bias_hn))  (linear_before_reset=True) or
  n = tanh(x_t W_in^T + bias[n] + (r*h) W_hn^T + bias_hn)  (linear_before_reset=False);
  h_t = (1-z)*n + z*h_{t-1}

The six ``*_forward`` functions take ``params`` (the model's dict, names as
in ``param_shapes``), ``x`` of shape (T, B, I) (or (B, T, I) with
``batch_first=True``), an initial ``state`` (None means zeros; LSTM: a tuple
(h, c)), optional ``lengths`` (B,), and return ``(y, final_state)`` as
float64 arrays.  With ``lengths``, sequence b holds its state after step
lengths[b] and its y there is 0; layer k+1 reads layer k's (zeroed) output,
which does not matter because its state holds too.

Directions.  With ``reverse=True`` the single direction runs backwards in
time: each sequence b's own steps x[:lengths[b], b] are reversed, the cell runs
forward over them, and the outputs are put back reversed at times
[0, lengths[b]) (zeros after); the final state is the one after step t = 0.
With ``bidirectional=True`` every layer runs both directions, the reverse one
with the parameters named with the suffix ``_reverse``; y is the forward
direction's output followed by the reverse one's on the last axis (2H
features, which layer k+1 reads), and the states are (2 * num_layers, B, H)
with direction d of layer k at index 2k + d, as in PyTorch.

int8 models (``fastln.rnn.quantize``).  Where ``params`` holds a scale per
row of a weight matrix (``weight_ih_scale_l0`` beside ``weight_ih_l0``), each
product with that matrix is :func:`int8_product`, the int8 scheme of the
engine computed in NumPy: every function above then gives the int8 model's
forward, its products bitwise those of the engine (for the same float32
input rows) and everything else in float64.

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

from ._int8_reference import Int8Matrix, int8_product

if TYPE_CHECKING:
    import numpy.typing as npt
    from typing_extensions import TypeAlias

    _Array: TypeAlias = npt.NDArray[np.float64]
    _Params: TypeAlias = Dict[str, _Array]
    # one step: (layer parameters, x_t, states) -> new states; states[0] is h
    _Step: TypeAlias = Callable[[_Params, _Array, Tuple[_Array, ...]], Tuple[_Array, ...]]

__all__ = ["param_shapes", "layer_norm", "lnrnn_forward", "lnlstm_forward", "lngru_forward",
           "lstm_forward", "rnn_forward", "gru_forward", "int8_product"]


def param_shapes(cell: str, input_size: int, hidden_size: int, num_layers: int,
                 bidirectional: bool = False) -> Dict[str, Tuple[int, ...]]:
    """{name: shape} of the parameters of ``cell`` in "rnn", "lstm", "gru" (the LN cells),
    "lstm_sum" (LNLSTM with ``gate_norm`` "sum" or "per_gate") and "rnn_plain",
    "lstm_plain", "gru_plain" (the plain ones).

    Parameters
    ----------
    cell : {"rnn", "lstm", "lstm_sum", "gru", "rnn_plain", "lstm_plain", "gru_plain"}
        The cell: LNRNN, LNLSTM, LNGRU, RNN, LSTM or GRU of :mod:`fastln.rnn`.
    input_size, hidden_size, num_layers : int
        I, H and the number of layers.
    bidirectional : bool, default False
        Both directions: layers k >= 1 read 2H features, and every name also
        exists with the suffix ``_reverse`` (the reverse direction's).

    Returns
    -------
    dict of str to tuple of int
        The parameter names with their ``_l{k}`` (and ``_reverse``) suffix,
        as in the models' ``params``.

    Raises
    ------
    ValueError
        An unknown cell.

    Examples
    --------
    >>> from fastln.rnn_reference import param_shapes
    >>> param_shapes("rnn_plain", 3, 4, 1)
    {'weight_ih_l0': (4, 3), 'weight_hh_l0': (4, 4), 'bias_l0': (4,)}
    >>> s = param_shapes("rnn_plain", 3, 4, 2, bidirectional=True)
    >>> s["weight_ih_l1"], s["weight_ih_l1_reverse"], len(s)
    ((4, 8), (4, 8), 12)
    """
    H = hidden_size
    shapes: Dict[str, Tuple[int, ...]] = {}
    layer: Dict[str, Tuple[int, ...]]
    for k in range(num_layers):
        I = input_size if k == 0 else (2 * H if bidirectional else H)
        if cell == "rnn":
            layer = {"weight_ih": (H, I), "weight_hh": (H, H), "ln_weight": (H,), "ln_bias": (H,)}
        elif cell == "lstm":
            layer = {"weight_ih": (4 * H, I), "weight_hh": (4 * H, H), "bias": (4 * H,),
                     "ln_ih_weight": (4 * H,), "ln_ih_bias": (4 * H,),
                     "ln_hh_weight": (4 * H,), "ln_hh_bias": (4 * H,),
                     "ln_c_weight": (H,), "ln_c_bias": (H,)}
        elif cell == "lstm_sum":
            layer = {"weight_ih": (4 * H, I), "weight_hh": (4 * H, H), "bias": (4 * H,),
                     "ln_weight": (4 * H,), "ln_bias": (4 * H,),
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
        elif cell == "gru_plain":
            layer = {"weight_ih": (3 * H, I), "weight_hh": (3 * H, H), "bias": (3 * H,),
                     "bias_hn": (H,)}
        else:
            raise ValueError("cell must be 'rnn', 'lstm', 'lstm_sum', 'gru', 'rnn_plain', "
                             "'lstm_plain' or 'gru_plain', got %r" % (cell,))
        for suffix in _suffixes(bidirectional):
            shapes.update({"%s_l%d%s" % (name, k, suffix): shape for name, shape in layer.items()})
    return shapes


def _suffixes(bidirectional: bool) -> Tuple[str, ...]:
    """The parameter-name suffixes of the directions: "" (forward) and "_reverse"."""
    return ("", "_reverse") if bidirectional else ("",)


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


def _layer_params(params: Mapping[str, npt.ArrayLike], k: int, suffix: str = "") -> _Params:
    """Layer k's parameters of one direction (``suffix`` "" or "_reverse") as float64,
    without the "_l{k}{suffix}" suffix; an int8 weight matrix (with a
    ``..._scale`` entry) as an Int8Matrix."""
    end = "_l%d%s" % (k, suffix)
    p: Dict[str, Any] = {name[:-len(end)]: np.asarray(v, np.float64)
                         for name, v in params.items() if name.endswith(end)}
    for name in ("weight_ih", "weight_hh", "weight_hr"):
        scale = p.pop(name + "_scale", None)
        if scale is not None:
            p[name] = Int8Matrix(p[name], scale.astype(np.float32))
    return p


def _reversed_in_time(a: _Array, lengths: _Array) -> _Array:
    """Each sequence b's own steps reversed: out[t, b] = a[lengths[b] - 1 - t, b] for
    t < lengths[b], and 0 after."""
    out = np.zeros_like(a)
    for b, n in enumerate(lengths):
        out[:n, b] = a[:n, b][::-1]
    return out


def _one_direction(step: _Step, p: _Params, inp: _Array, init: Tuple[_Array, ...],
                   lengths: _Array) -> Tuple[_Array, Tuple[_Array, ...]]:
    """One layer, one direction, forward in time over inp (T, B, F) from the states
    ``init`` (each (B, H)): the output (T, B, H) and the final states."""
    T = inp.shape[0]
    alive = (np.arange(T)[:, None] < lengths[None, :])[:, :, None]
    states = [s.copy() for s in init]
    out = np.zeros((T,) + states[0].shape)
    for t in range(T):
        new = step(p, inp[t], tuple(states))
        for s, n in zip(states, new):
            s[...] = np.where(alive[t], n, s)                 # a finished sequence holds its state
        out[t] = np.where(alive[t], states[0], 0.0)           # ... and outputs 0
    return out, tuple(states)


def _run(step: _Step, nstates: int, params: Mapping[str, npt.ArrayLike], x: npt.ArrayLike,
         state: Any, lengths: Optional[npt.ArrayLike], num_layers: int,
         batch_first: bool, bidirectional: bool = False, reverse: bool = False
         ) -> Tuple[_Array, Any]:
    """Generic multi-layer, one- or two-direction loop. ``step(p, x_t, states) -> new
    states`` (a tuple; states[0] is h)."""
    if bidirectional and reverse:
        raise ValueError("reverse applies to a unidirectional model; got bidirectional=True")
    x = np.asarray(x, np.float64)
    if batch_first:
        x = x.transpose(1, 0, 2)
    T, B, _ = x.shape
    H = np.shape(params["weight_hh_l0"])[1]             # h's features: P with a projection
    C = np.shape(params["weight_hr_l0"])[1] if "weight_hr_l0" in params else H   # c's
    directions = [("", False), ("_reverse", True)] if bidirectional else [("", reverse)]
    D = len(directions)
    shapes = [(D * num_layers, B, H), (D * num_layers, B, C)][:nstates]
    if state is None:
        state = tuple(np.zeros(shape) for shape in shapes)
    elif nstates == 1:
        state = (state,)
    state = [np.array(s, np.float64) for s in state]          # copies, of shapes
    for s, shape in zip(state, shapes):
        if s.shape != shape:
            raise ValueError("state must be %r, got %r" % (shape, s.shape))
    lengths = np.full(B, T) if lengths is None else np.asarray(lengths).astype(np.int64)
    inp = x
    for k in range(num_layers):
        outs = []
        for d, (suffix, backwards) in enumerate(directions):
            p = _layer_params(params, k, suffix)
            i = D * k + d
            seq = _reversed_in_time(inp, lengths) if backwards else inp
            out, final = _one_direction(step, p, seq, tuple(s[i] for s in state), lengths)
            outs.append(_reversed_in_time(out, lengths) if backwards else out)
            for s, f in zip(state, final):
                s[i] = f
        inp = np.concatenate(outs, axis=-1)
    y = inp.transpose(1, 0, 2) if batch_first else inp
    return y, (state[0] if nstates == 1 else tuple(state))


def lnrnn_forward(params: Mapping[str, npt.ArrayLike], x: npt.ArrayLike,
                  state: Optional[npt.ArrayLike] = None,
                  lengths: Optional[npt.ArrayLike] = None, num_layers: int = 1,
                  eps: float = 1e-5, nonlinearity: str = "tanh", batch_first: bool = False,
                  bidirectional: bool = False, reverse: bool = False) -> Tuple[_Array, _Array]:
    """LN-RNN: returns y (T, B, H) and h_n (num_layers, B, H).

    Parameters
    ----------
    params : mapping of str to ndarray
        The model's parameters, as :func:`param_shapes` names them for
        ``"rnn"``.
    x : array_like, shape (T, B, I), or (B, T, I) with batch_first
        The input.
    state : ndarray, optional
        The initial state h, (D*num_layers, B, H); None means zeros.
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
    bidirectional : bool, default False
        Run both directions (D = 2 below; else D = 1), the reverse one with
        the parameters named ``..._reverse``.
    reverse : bool, default False
        Run the single direction backwards in time (the reverse half of a
        bidirectional model, with unsuffixed names). Not with bidirectional.

    Returns
    -------
    y : ndarray of float64, shape (T, B, D*H), or (B, T, D*H) with batch_first
        The top layer's output (directions concatenated).
    h_n : ndarray of float64, shape (D*num_layers, B, H)
        The final state.

    Raises
    ------
    KeyError
        Another nonlinearity.
    ValueError
        A state of the wrong shape, or reverse with bidirectional.
    """
    f = _ACTIVATIONS[nonlinearity]

    def step(p: _Params, x_t: _Array, states: Tuple[_Array, ...]) -> Tuple[_Array, ...]:
        (h,) = states
        a = x_t @ p["weight_ih"].T + h @ p["weight_hh"].T
        return (f(layer_norm(a, p["ln_weight"], p["ln_bias"], eps)),)

    return _run(step, 1, params, x, state, lengths, num_layers, batch_first,
                bidirectional, reverse)


def lnlstm_forward(params: Mapping[str, npt.ArrayLike], x: npt.ArrayLike,
                   state: Optional[Tuple[npt.ArrayLike, npt.ArrayLike]] = None,
                   lengths: Optional[npt.ArrayLike] = None, num_layers: int = 1,
                   eps: float = 1e-5, batch_first: bool = False, bidirectional: bool = False,
                   reverse: bool = False, gate_norm: str = "pair", carry: str = "raw"
                   ) -> Tuple[_Array, Tuple[_Array, _Array]]:
    """LN-LSTM: returns y (T, B, H) and (h_n, c_n), each (num_layers, B, H).

    Parameters
    ----------
    params : mapping of str to ndarray
        The model's parameters, as :func:`param_shapes` names them for
        ``"lstm"`` (``gate_norm="pair"``) or ``"lstm_sum"`` (the other two).
        A missing ``bias`` or LN bias reads as 0 (a model made with
        ``gate_bias=False`` or ``ln_bias=False``).
    x : array_like, shape (T, B, I), or (B, T, I) with batch_first
        The input.
    state : tuple of ndarray, optional
        The initial state (h, c), each (D*num_layers, B, H); None means zeros.
    lengths : array_like of int, shape (B,), optional
        The length of each sequence of a padded batch.
    num_layers : int, default 1
        The number of layers in ``params``.
    eps : float, default 1e-5
        Added to the variance in every LayerNorm.
    batch_first : bool, default False
        x and y are (B, T, ...) instead of (T, B, ...).
    bidirectional : bool, default False
        Run both directions (D = 2 below; else D = 1), the reverse one with
        the parameters named ``..._reverse``.
    reverse : bool, default False
        Run the single direction backwards in time (the reverse half of a
        bidirectional model, with unsuffixed names). Not with bidirectional.
    gate_norm : {"pair", "sum", "per_gate"}, default "pair"
        Where the gates' LayerNorm sits: LN(x W_ih^T; ln_ih) + LN(h W_hh^T;
        ln_hh) (the paper), one LN(x W_ih^T + h W_hh^T; ln) over all 4H, or
        one LN of that sum per gate block of H (gains and biases ln[k*H:(k+1)*H]).
    carry : {"raw", "normalized"}, default "raw"
        The cell state carried: c_t = f*c_{t-1} + i*g, with h_t =
        o*tanh(LN(c_t; ln_c)) (the paper), or c_t = LN(f*c_{t-1} + i*g; ln_c)
        with h_t = o*tanh(c_t).

    Returns
    -------
    y : ndarray of float64, shape (T, B, D*H), or (B, T, D*H) with batch_first
        The top layer's output (directions concatenated).
    state : tuple of ndarray of float64
        The final state (h_n, c_n), each (D*num_layers, B, H).

    Raises
    ------
    ValueError
        A state of the wrong shape, reverse with bidirectional, or another
        gate_norm or carry.
    """
    if gate_norm not in ("pair", "sum", "per_gate"):
        raise ValueError("gate_norm must be 'pair', 'sum' or 'per_gate', got %r" % (gate_norm,))
    if carry not in ("raw", "normalized"):
        raise ValueError("carry must be 'raw' or 'normalized', got %r" % (carry,))

    def step(p: _Params, x_t: _Array, states: Tuple[_Array, ...]) -> Tuple[_Array, ...]:
        h, c = states
        a_ih, a_hh = x_t @ p["weight_ih"].T, h @ p["weight_hh"].T
        if gate_norm == "pair":
            gates = (layer_norm(a_ih, p["ln_ih_weight"], p.get("ln_ih_bias", 0.0), eps)
                     + layer_norm(a_hh, p["ln_hh_weight"], p.get("ln_hh_bias", 0.0), eps))
        else:
            a, w, b = a_ih + a_hh, p["ln_weight"], p.get("ln_bias", np.zeros_like(p["ln_weight"]))
            blocks = 4 if gate_norm == "per_gate" else 1
            gates = np.concatenate([layer_norm(ak, wk, bk, eps) for ak, wk, bk in zip(
                np.split(a, blocks, axis=-1), np.split(w, blocks), np.split(b, blocks))], axis=-1)
        o, c_new = _lstm_update(gates + p.get("bias", 0.0), c)
        c_ln = layer_norm(c_new, p["ln_c_weight"], p.get("ln_c_bias", 0.0), eps)
        return o * np.tanh(c_ln), (c_new if carry == "raw" else c_ln)

    return _run(step, 2, params, x, state, lengths, num_layers, batch_first,
                bidirectional, reverse)


def lngru_forward(params: Mapping[str, npt.ArrayLike], x: npt.ArrayLike,
                  state: Optional[npt.ArrayLike] = None,
                  lengths: Optional[npt.ArrayLike] = None, num_layers: int = 1,
                  eps: float = 1e-5, batch_first: bool = False, bidirectional: bool = False,
                  reverse: bool = False) -> Tuple[_Array, _Array]:
    """LN-GRU: returns y (T, B, H) and h_n (num_layers, B, H).

    Parameters
    ----------
    params : mapping of str to ndarray
        The model's parameters, as :func:`param_shapes` names them for
        ``"gru"``.
    x : array_like, shape (T, B, I), or (B, T, I) with batch_first
        The input.
    state : ndarray, optional
        The initial state h, (D*num_layers, B, H); None means zeros.
    lengths : array_like of int, shape (B,), optional
        The length of each sequence of a padded batch.
    num_layers : int, default 1
        The number of layers in ``params``.
    eps : float, default 1e-5
        Added to the variance in every LayerNorm.
    batch_first : bool, default False
        x and y are (B, T, ...) instead of (T, B, ...).
    bidirectional : bool, default False
        Run both directions (D = 2 below; else D = 1), the reverse one with
        the parameters named ``..._reverse``.
    reverse : bool, default False
        Run the single direction backwards in time (the reverse half of a
        bidirectional model, with unsuffixed names). Not with bidirectional.

    Returns
    -------
    y : ndarray of float64, shape (T, B, D*H), or (B, T, D*H) with batch_first
        The top layer's output (directions concatenated).
    h_n : ndarray of float64, shape (D*num_layers, B, H)
        The final state.

    Raises
    ------
    ValueError
        A state of the wrong shape, or reverse with bidirectional.
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

    return _run(step, 1, params, x, state, lengths, num_layers, batch_first,
                bidirectional, reverse)


def _lstm_update(gates: _Array, c: _Array) -> Tuple[_Array, _Array]:
    gi, gf, gg, go = np.split(gates, 4, axis=-1)
    i, f, g, o = _sigmoid(gi), _sigmoid(gf), np.tanh(gg), _sigmoid(go)
    return o, f * c + i * g


def lstm_forward(params: Mapping[str, npt.ArrayLike], x: npt.ArrayLike,
                 state: Optional[Tuple[npt.ArrayLike, npt.ArrayLike]] = None,
                 lengths: Optional[npt.ArrayLike] = None, num_layers: int = 1,
                 batch_first: bool = False, bidirectional: bool = False,
                 reverse: bool = False) -> Tuple[_Array, Tuple[_Array, _Array]]:
    """Plain LSTM: returns y (T, B, H) and (h_n, c_n), each (num_layers, B, H).

    Parameters
    ----------
    params : mapping of str to ndarray
        The model's parameters, as :func:`param_shapes` names them for
        ``"lstm_plain"``; with ``weight_hr_l{k}`` (P, H) too, an LSTM with
        proj_size P: h_t = (o*tanh(c_t)) W_hr^T, and h and y have P features.
    x : array_like, shape (T, B, I), or (B, T, I) with batch_first
        The input.
    state : tuple of ndarray, optional
        The initial state (h, c), each (D*num_layers, B, H) (h: P features
        with a projection); None means zeros.
    lengths : array_like of int, shape (B,), optional
        The length of each sequence of a padded batch.
    num_layers : int, default 1
        The number of layers in ``params``.
    batch_first : bool, default False
        x and y are (B, T, ...) instead of (T, B, ...).
    bidirectional : bool, default False
        Run both directions (D = 2 below; else D = 1), the reverse one with
        the parameters named ``..._reverse``.
    reverse : bool, default False
        Run the single direction backwards in time (the reverse half of a
        bidirectional model, with unsuffixed names). Not with bidirectional.

    Returns
    -------
    y : ndarray of float64, shape (T, B, D*H), or (B, T, D*H) with batch_first
        The top layer's output (directions concatenated).
    state : tuple of ndarray of float64
        The final state (h_n, c_n), each (D*num_layers, B, H).

    Raises
    ------
    ValueError
        A state of the wrong shape, or reverse with bidirectional.
    """
    def step(p: _Params, x_t: _Array, states: Tuple[_Array, ...]) -> Tuple[_Array, ...]:
        h, c = states
        o, c_new = _lstm_update(x_t @ p["weight_ih"].T + h @ p["weight_hh"].T + p["bias"], c)
        m = o * np.tanh(c_new)
        return (m @ p["weight_hr"].T if "weight_hr" in p else m), c_new

    return _run(step, 2, params, x, state, lengths, num_layers, batch_first,
                bidirectional, reverse)


def rnn_forward(params: Mapping[str, npt.ArrayLike], x: npt.ArrayLike,
                state: Optional[npt.ArrayLike] = None,
                lengths: Optional[npt.ArrayLike] = None, num_layers: int = 1,
                nonlinearity: str = "tanh", batch_first: bool = False,
                bidirectional: bool = False, reverse: bool = False) -> Tuple[_Array, _Array]:
    """Plain RNN: returns y (T, B, H) and h_n (num_layers, B, H).

    Parameters
    ----------
    params : mapping of str to ndarray
        The model's parameters, as :func:`param_shapes` names them for
        ``"rnn_plain"``.
    x : array_like, shape (T, B, I), or (B, T, I) with batch_first
        The input.
    state : ndarray, optional
        The initial state h, (D*num_layers, B, H); None means zeros.
    lengths : array_like of int, shape (B,), optional
        The length of each sequence of a padded batch.
    num_layers : int, default 1
        The number of layers in ``params``.
    nonlinearity : {"tanh", "relu"}, default "tanh"
        The f of ``h_t = f(...)``.
    batch_first : bool, default False
        x and y are (B, T, ...) instead of (T, B, ...).
    bidirectional : bool, default False
        Run both directions (D = 2 below; else D = 1), the reverse one with
        the parameters named ``..._reverse``.
    reverse : bool, default False
        Run the single direction backwards in time (the reverse half of a
        bidirectional model, with unsuffixed names). Not with bidirectional.

    Returns
    -------
    y : ndarray of float64, shape (T, B, D*H), or (B, T, D*H) with batch_first
        The top layer's output (directions concatenated).
    h_n : ndarray of float64, shape (D*num_layers, B, H)
        The final state.

    Raises
    ------
    KeyError
        Another nonlinearity.
    ValueError
        A state of the wrong shape, or reverse with bidirectional.
    """
    f = _ACTIVATIONS[nonlinearity]

    def step(p: _Params, x_t: _Array, states: Tuple[_Array, ...]) -> Tuple[_Array, ...]:
        (h,) = states
        return (f(x_t @ p["weight_ih"].T + h @ p["weight_hh"].T + p["bias"]),)

    return _run(step, 1, params, x, state, lengths, num_layers, batch_first,
                bidirectional, reverse)


def gru_forward(params: Mapping[str, npt.ArrayLike], x: npt.ArrayLike,
                state: Optional[npt.ArrayLike] = None,
                lengths: Optional[npt.ArrayLike] = None, num_layers: int = 1,
                batch_first: bool = False, linear_before_reset: bool = True,
                bidirectional: bool = False, reverse: bool = False) -> Tuple[_Array, _Array]:
    """Plain GRU (torch.nn.GRU's equations): returns y (T, B, H) and h_n (num_layers, B, H).

    Parameters
    ----------
    params : mapping of str to ndarray
        The model's parameters, as :func:`param_shapes` names them for
        ``"gru_plain"``: weight_ih (3H, I) and weight_hh (3H, H) in blocks
        [r, z, n], bias (3H,) = [b_ir + b_hr, b_iz + b_hz, b_in] and
        bias_hn (H,) = b_hn.
    x : array_like, shape (T, B, I), or (B, T, I) with batch_first
        The input.
    state : ndarray, optional
        The initial state h, (D*num_layers, B, H); None means zeros.
    lengths : array_like of int, shape (B,), optional
        The length of each sequence of a padded batch.
    num_layers : int, default 1
        The number of layers in ``params``.
    batch_first : bool, default False
        x and y are (B, T, ...) instead of (T, B, ...).
    linear_before_reset : bool, default True
        n = tanh(x W_in^T + bias[n] + r*(h W_hn^T + bias_hn)) (PyTorch's form)
        if True, else n = tanh(x W_in^T + bias[n] + (r*h) W_hn^T + bias_hn)
        (ONNX's default form).
    bidirectional : bool, default False
        Run both directions (D = 2 below; else D = 1), the reverse one with
        the parameters named ``..._reverse``.
    reverse : bool, default False
        Run the single direction backwards in time (the reverse half of a
        bidirectional model, with unsuffixed names). Not with bidirectional.

    Returns
    -------
    y : ndarray of float64, shape (T, B, D*H), or (B, T, D*H) with batch_first
        The top layer's output (directions concatenated).
    h_n : ndarray of float64, shape (D*num_layers, B, H)
        The final state.

    Raises
    ------
    ValueError
        A state of the wrong shape, or reverse with bidirectional.

    Examples
    --------
    >>> import numpy as np
    >>> from fastln.rnn_reference import gru_forward, param_shapes
    >>> rng = np.random.default_rng(0)
    >>> p = {k: rng.standard_normal(s) for k, s in param_shapes("gru_plain", 3, 4, 1).items()}
    >>> x = rng.standard_normal((5, 2, 3))
    >>> y, h = gru_forward(p, x)
    >>> y.shape, h.shape, bool(np.array_equal(y[-1], h[0]))
    ((5, 2, 4), (1, 2, 4), True)
    >>> yr, hr = gru_forward(p, x, reverse=True)     # the reverse direction ends at t = 0
    >>> bool(np.array_equal(yr[0], hr[0]))
    True
    """
    def step(p: _Params, x_t: _Array, states: Tuple[_Array, ...]) -> Tuple[_Array, ...]:
        (h,) = states
        H = h.shape[-1]
        w_ih, w_hh, bias = p["weight_ih"], p["weight_hh"], p["bias"]
        w_ir, w_iz, w_in = w_ih[:H], w_ih[H:2 * H], w_ih[2 * H:]
        w_hr, w_hz, w_hn = w_hh[:H], w_hh[H:2 * H], w_hh[2 * H:]
        b_r, b_z, b_n = bias[:H], bias[H:2 * H], bias[2 * H:]
        r = _sigmoid(x_t @ w_ir.T + h @ w_hr.T + b_r)
        z = _sigmoid(x_t @ w_iz.T + h @ w_hz.T + b_z)
        if linear_before_reset:
            n = np.tanh(x_t @ w_in.T + b_n + r * (h @ w_hn.T + p["bias_hn"]))
        else:
            n = np.tanh(x_t @ w_in.T + b_n + (r * h) @ w_hn.T + p["bias_hn"])
        return ((1.0 - z) * n + z * h,)

    return _run(step, 1, params, x, state, lengths, num_layers, batch_first,
                bidirectional, reverse)
