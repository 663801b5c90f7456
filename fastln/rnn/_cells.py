"""The six recurrent models: LNLSTM, LNGRU and LNRNN (Ba, Kiros & Hinton,
2016), and the plain LSTM, RNN and GRU, the same engine without LayerNorm."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, FrozenSet, Optional, Sequence, Tuple

import numpy as np
import numpy.typing as npt

from .. import _torch, _validate
from ._from_keras import lnlstm_from_keras
from ._from_torch import lnlstm_from_torch, rnn_from_torch
from ._inputs import State
from ._variants import Variant, variant
from .base import RecurrentModel

if TYPE_CHECKING:
    from typing_extensions import Self

_Array = npt.NDArray[Any]


class LNLSTM(RecurrentModel[Tuple[_Array, _Array]]):
    """Layer-normalized LSTM (Ba, Kiros & Hinton 2016, supplementary equations 20-22).

    ``gates = LN(x W_ih^T; ln_ih) + LN(h W_hh^T; ln_hh) + bias`` (each LN over all
    4H gates, order i, f, g, o), ``c' = f*c + i*g``, ``h' = o*tanh(LN(c'; ln_c))``.
    The keyword arguments select the variants that trained LN-LSTMs use
    (where the gates' LayerNorm sits, which c is carried, which biases
    exist): see the Notes.

    Parameters
    ----------
    input_size : int
        The features I of x (I_0; the layers above read H features).
    hidden_size : int
        The features H of the state and of y.
    num_layers : int, default 1
        Stacked layers; layer k+1 reads layer k's output.
    batch_first : bool, default False
        x and y are (B, T, features) instead of (T, B, features). States
        are (num_layers, B, H) either way.
    eps : float, default 1e-5
        Added to the variance in every LayerNorm; finite and >= 0. With 0, a
        zero state (the default) makes LN(h W_hh^T) of the first step 0/0,
        and the outputs NaN, as layer_norm of a constant row.
    dtype : {numpy.float32, numpy.float64, ml_dtypes.bfloat16}, default numpy.float32
        The dtype of the parameters and of the data (x, dy, states). A
        bfloat16 model (for inference) keeps its weight matrices in
        bfloat16 and its other parameters and states in float32: see
        :meth:`to`.
    seed : int or None, default None
        Seeds the generator of the initial weights, U(-1/sqrt(H), 1/sqrt(H));
        LN gains start at 1, LN biases and ``bias`` at 0.
    bidirectional : bool, default False
        Run every layer in both directions (see the module's notes): y has
        2 * hidden_size features, states 2 * num_layers layers, and the
        reverse direction's parameters the suffix ``_reverse``.
    gate_norm : {"pair", "sum", "per_gate"}, default "pair"
        Where the gates' LayerNorm sits: ``LN(x W_ih^T; ln_ih) + LN(h W_hh^T;
        ln_hh)`` (the paper), ``LN(x W_ih^T + h W_hh^T; ln)`` over all 4H
        (``"sum"``), or that LN over each gate's block of H apart
        (``"per_gate"``, the four blocks' gains and biases in one 4H ``ln``).
    carry : {"raw", "normalized"}, default "raw"
        The cell state carried to the next step: ``c'`` (the paper), or
        ``LN(c'; ln_c)`` (gain and bias applied), which then gives
        ``h' = o*tanh(c)`` directly.
    gate_bias : bool, default True
        Whether ``bias_l{k}`` exists (added after the gates' LayerNorm).
    ln_bias : bool, default True
        Whether the LayerNorms have biases (``ln_*_bias``).

    Attributes
    ----------
    params : dict of ndarray
        ``weight_ih_l{k}`` (4H, I_k), ``weight_hh_l{k}`` (4H, H), ``bias_l{k}``,
        ``ln_ih_weight_l{k}``, ``ln_ih_bias_l{k}``, ``ln_hh_weight_l{k}``,
        ``ln_hh_bias_l{k}`` (4H), ``ln_c_weight_l{k}``, ``ln_c_bias_l{k}`` (H);
        with gate_norm "sum" or "per_gate", ``ln_weight_l{k}`` and
        ``ln_bias_l{k}`` (4H) in place of the ``ln_ih_*`` and ``ln_hh_*``
        ones; without the biases that gate_bias or ln_bias turn off. A
        bidirectional model also has each with the suffix ``_reverse``.
        May be updated in place or replaced (by arrays of these shapes).
    gate_norm, carry : str
    gate_bias, ln_bias : bool
        As given.
    reverse : bool
        False; set it to True on a unidirectional model to run each sequence
        from its last valid step back to its first (ONNX's
        ``direction="reverse"``, the reverse half of a bidirectional layer).
    grads : dict of ndarray
        Filled by :meth:`backward` (zeros before).

    Raises
    ------
    TypeError
        A size that is not an int, eps that is not a real number, or a dtype
        other than float32 and float64.
    ValueError
        A size below 1, eps negative or not finite, or another gate_norm or
        carry.

    Notes
    -----
    The state is a tuple (h, c), each (D * num_layers, B, H), D = 2 if
    bidirectional else 1.

    Every variant runs in the engine (forward and backward in float32 and
    float64, bfloat16 and int8 inference, :meth:`step` and
    :class:`~fastln.rnn.StreamTable`) with the paper cell's guarantees. The
    guide's page "Variants of the LN-LSTM and loading trained models" maps the published
    implementations (torchaudio, NeMo, fastrnns, TF Addons, TF1) onto these
    options; :meth:`from_torch` and :meth:`from_keras` load their weights.

    Examples
    --------
    >>> import numpy as np
    >>> from fastln.rnn import LNLSTM
    >>> m = LNLSTM(input_size=8, hidden_size=16, seed=0)
    >>> m
    LNLSTM(input_size=8, hidden_size=16, num_layers=1, batch_first=False, eps=1e-05, dtype=float32)
    >>> y, (h, c) = m(np.zeros((5, 3, 8), np.float32))
    >>> y.shape, h.shape, c.shape
    ((5, 3, 16), (1, 3, 16), (1, 3, 16))
    """
    _kind = "lstm"
    _has_cell = True

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 batch_first: bool = False, eps: float = 1e-5,
                 dtype: npt.DTypeLike = np.float32, seed: Optional[int] = None,
                 bidirectional: bool = False, *, gate_norm: str = "pair", carry: str = "raw",
                 gate_bias: bool = True, ln_bias: bool = True) -> None:
        v = variant(gate_norm, carry, gate_bias, ln_bias)
        self.gate_norm, self.carry, self.gate_bias, self.ln_bias = v
        self._kind = v.kind()
        super().__init__(input_size, hidden_size, num_layers, batch_first, eps, dtype, seed,
                         bidirectional)

    def _options(self) -> Variant:
        return Variant(self.gate_norm, self.carry, self.gate_bias, self.ln_bias)

    def _cell_name(self) -> str:
        return self._options().cell()

    def _omitted(self) -> FrozenSet[str]:
        return self._options().omitted()

    def __repr__(self) -> str:
        changed = self._options().changed().items()
        return super().__repr__()[:-1] + "".join(f", {k}={v!r}" for k, v in changed) + ")"

    @classmethod
    def from_torch(cls, module: Any, eps: Optional[float] = None) -> Self:
        """An LNLSTM with the weights and the cell of a torch LN-LSTM.

        Recognizes by their parameters' names the ``LayerNormLSTMCell`` of
        PyTorch's fastrnns benchmark and of NeMo (a cell, an ``LSTMLayer`` or a
        ``StackedLSTM``, scripted or not: ``gate_norm="pair",
        carry="normalized", gate_bias=False``) and torchaudio's
        ``_CustomLSTM(layer_norm=True)`` (one, or a ModuleList such as the RNN-T
        predictor's ``lstm_layers``: ``gate_norm="sum", carry="normalized",
        gate_bias=False``). The user guide's "Variants of the LN-LSTM" maps them.

        Parameters
        ----------
        module : torch.nn.Module or mapping
            The module or its state_dict.
        eps : float, optional
            Default: the module's LayerNorms' eps, which must agree (0 for the
            fastrnns benchmark's decomposed LayerNorm); for a state_dict, 1e-5
            (torch.nn.LayerNorm's), and torchaudio's needs it given.

        Returns
        -------
        LNLSTM
            Of the weights' sizes and dtype (float32, float64, or bfloat16).

        Raises
        ------
        TypeError, ValueError
            A module of another type or dtype, keys of neither implementation
            (a ``_CustomLSTM`` without layer_norm is for :class:`LSTM`), or
            LayerNorms of different eps.
        """
        return lnlstm_from_torch(cls, module, eps)

    @classmethod
    def from_keras(cls, weights: Sequence[Any], cell: str = "LayerNormLSTMCell", *,
                   eps: Optional[float] = None, forget_bias: Optional[float] = None) -> Self:
        """An LNLSTM with the weights and the cell of a TensorFlow LN-LSTM.

        ``"LayerNormLSTMCell"``: TF Addons', its ``get_weights()`` (kernel,
        recurrent_kernel, bias unless use_bias=False, then gamma and beta of
        kernel_norm, recurrent_norm, state_norm): ``gate_norm="pair",
        carry="normalized"``. ``"LayerNormBasicLSTMCell"``: TF1's, its
        variables as the cell makes them (kernel over [x, h], then gamma and
        beta of input, transform, forget, output, state): ``gate_norm="per_gate",
        carry="normalized", gate_bias=False``, with forget_bias added to the
        forget gate's LayerNorm bias. See the user guide's "Variants of the
        LN-LSTM".

        Parameters
        ----------
        weights : list of ndarray
            A cell's weights in that order, stacked cells' one after another.
        cell : {"LayerNormLSTMCell", "LayerNormBasicLSTMCell"}, default "LayerNormLSTMCell"
            The cell the weights are of.
        eps : float, optional
            Default: the cell's, 1e-3 (TF Addons) or 1e-12 (TF1).
        forget_bias : float, optional
            LayerNormBasicLSTMCell's, default 1.0.

        Returns
        -------
        LNLSTM
            With ``batch_first=True`` (as Keras), of the weights' sizes and
            dtype (float32 or float64).

        Raises
        ------
        TypeError, ValueError
            weights of another type, dtype, shape or count, another cell, or
            forget_bias for TF Addons' cell.
        """
        return lnlstm_from_keras(cls, weights, cell, eps, forget_bias)


class LNGRU(RecurrentModel[_Array]):
    """Layer-normalized GRU (Ba, Kiros & Hinton 2016, supplementary equations 23-28).

    ``[z; r] = LN(x W_ih[z,r]^T; ln_ih) + LN(h W_hh[z,r]^T; ln_hh)`` (each LN over
    2H), ``n = tanh(LN(x W_ih[n]^T; ln_in) + sigmoid(r) * LN(h W_hh[n]^T; ln_hn))``,
    ``h' = (1 - sigmoid(z)) * h + sigmoid(z) * n``.

    Parameters
    ----------
    input_size, hidden_size : int
        The features I of x and H of the state and y.
    num_layers : int, default 1
        Stacked layers.
    batch_first : bool, default False
        x and y are (B, T, features) instead of (T, B, features).
    eps : float, default 1e-5
        Added to the variance in every LayerNorm.
    dtype : {numpy.float32, numpy.float64, ml_dtypes.bfloat16}, default numpy.float32
    seed : int or None, default None
        As for :class:`LNLSTM`.
    bidirectional : bool, default False
        As for :class:`LNLSTM`.

    Attributes
    ----------
    params : dict of ndarray
        ``weight_ih_l{k}`` (3H, I_k) and ``weight_hh_l{k}`` (3H, H) with rows
        in blocks [z, r, n]; ``ln_ih_weight_l{k}``, ``ln_ih_bias_l{k}``,
        ``ln_hh_weight_l{k}``, ``ln_hh_bias_l{k}`` (2H); ``ln_in_weight_l{k}``,
        ``ln_in_bias_l{k}``, ``ln_hn_weight_l{k}``, ``ln_hn_bias_l{k}`` (H).
    grads : dict of ndarray
        Filled by :meth:`backward`.

    Raises
    ------
    TypeError, ValueError
        As :class:`LNLSTM`.

    Notes
    -----
    The state is h, (D * num_layers, B, H), D = 2 if bidirectional else 1.

    Examples
    --------
    >>> import numpy as np
    >>> from fastln.rnn import LNGRU
    >>> m = LNGRU(input_size=3, hidden_size=4, batch_first=True, seed=0)
    >>> y, h = m(np.zeros((2, 5, 3), np.float32))      # (B, T, I)
    >>> y.shape, h.shape
    ((2, 5, 4), (1, 2, 4))
    """
    _kind = "gru"

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 batch_first: bool = False, eps: float = 1e-5,
                 dtype: npt.DTypeLike = np.float32, seed: Optional[int] = None,
                 bidirectional: bool = False) -> None:
        super().__init__(input_size, hidden_size, num_layers, batch_first, eps, dtype, seed,
                         bidirectional)


class LNRNN(RecurrentModel[_Array]):
    """Layer-normalized Elman RNN (Ba, Kiros & Hinton 2016, equation 4).

    ``h' = f(LN(x W_ih^T + h W_hh^T; ln))``, f = tanh or relu.

    Parameters
    ----------
    input_size, hidden_size : int
        The features I of x and H of the state and y.
    num_layers : int, default 1
        Stacked layers.
    batch_first : bool, default False
        x and y are (B, T, features) instead of (T, B, features).
    eps : float, default 1e-5
        Added to the variance in every LayerNorm.
    dtype : {numpy.float32, numpy.float64, ml_dtypes.bfloat16}, default numpy.float32
    seed : int or None, default None
        As for :class:`LNLSTM`.
    nonlinearity : {"tanh", "relu"}, default "tanh"
        The f above.
    bidirectional : bool, default False
        As for :class:`LNLSTM`.

    Attributes
    ----------
    params : dict of ndarray
        ``weight_ih_l{k}`` (H, I_k), ``weight_hh_l{k}`` (H, H),
        ``ln_weight_l{k}``, ``ln_bias_l{k}`` (H).
    grads : dict of ndarray
        Filled by :meth:`backward`.

    Raises
    ------
    TypeError, ValueError
        As :class:`LNLSTM`; ValueError also for another nonlinearity.

    Notes
    -----
    The state is h, (D * num_layers, B, H), D = 2 if bidirectional else 1.

    Examples
    --------
    >>> import numpy as np
    >>> from fastln.rnn import LNRNN
    >>> m = LNRNN(3, 4, nonlinearity="relu", dtype=np.float64, seed=0)
    >>> y, h = m(np.ones((5, 2, 3)))
    >>> y.dtype, bool((y >= 0).all())
    (dtype('float64'), True)
    """
    _kind = "rnn"

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 batch_first: bool = False, eps: float = 1e-5,
                 dtype: npt.DTypeLike = np.float32, seed: Optional[int] = None,
                 nonlinearity: str = "tanh", bidirectional: bool = False) -> None:
        self.nonlinearity = _validate.nonlinearity(nonlinearity)
        super().__init__(input_size, hidden_size, num_layers, batch_first, eps, dtype, seed,
                         bidirectional)

    def _cell_name(self) -> str:
        return "rnn_" + self.nonlinearity

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", nonlinearity={self.nonlinearity!r})"


# ---- the plain cells ----

class _Plain(RecurrentModel[State]):
    """LSTM, GRU and RNN: the engine's cells without LayerNorm (hence no eps)."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 batch_first: bool = False, dtype: npt.DTypeLike = np.float32,
                 seed: Optional[int] = None, bidirectional: bool = False) -> None:
        super().__init__(input_size, hidden_size, num_layers, batch_first, 0.0, dtype, seed,
                         bidirectional)


class LSTM(_Plain[Tuple[_Array, _Array]]):
    """Plain LSTM (no LayerNorm) in the same engine: the baseline of LNLSTM.

    ``gates = x W_ih^T + h W_hh^T + bias`` (order i, f, g, o),
    ``c' = sigmoid(f)*c + sigmoid(i)*tanh(g)``, ``h' = sigmoid(o)*tanh(c')``:
    torch.nn.LSTM's equations with its two biases summed into one; with
    ``proj_size`` P, ``h' = (sigmoid(o)*tanh(c')) W_hr^T`` (LSTMP).

    Parameters
    ----------
    input_size, hidden_size : int
        The features I of x and H of the state and y.
    num_layers : int, default 1
        Stacked layers.
    batch_first : bool, default False
        x and y are (B, T, features) instead of (T, B, features).
    dtype : {numpy.float32, numpy.float64, ml_dtypes.bfloat16}, default numpy.float32
    seed : int or None, default None
        Seeds the generator of the initial weights, U(-1/sqrt(H), 1/sqrt(H));
        ``bias`` starts at 0 (as in LNLSTM, so that the two compare fairly).
    bidirectional : bool, default False
        As for :class:`LNLSTM`.
    proj_size : int, default 0
        P in [0, hidden_size): with P > 0, h and y have P features (c keeps
        H), ``weight_hh_l{k}`` is (4H, P), ``weight_hr_l{k}`` (P, H) projects,
        and the model runs inference only (forward(x, cache=False), step(),
        StreamTable, bfloat16 and int8), as torch.nn.LSTM's proj_size.

    Attributes
    ----------
    params : dict of ndarray
        ``weight_ih_l{k}`` (4H, I_k), ``weight_hh_l{k}`` (4H, H), ``bias_l{k}`` (4H).
    grads : dict of ndarray
        Filled by :meth:`backward`.

    Raises
    ------
    TypeError, ValueError
        As :class:`LNLSTM`; a proj_size outside [0, hidden_size).

    Notes
    -----
    Methods and state are those of :class:`LNLSTM`: ``forward``, ``backward``,
    ``step``, ``state_dict``, ``load_state_dict``; the state is (h, c).

    Examples
    --------
    >>> import numpy as np
    >>> from fastln.rnn import LSTM
    >>> m = LSTM(input_size=4, hidden_size=8, seed=0)
    >>> y, (h, c) = m.forward(np.zeros((3, 2, 4), np.float32))
    >>> y.shape
    (3, 2, 8)
    """
    _kind = "lstm_plain"
    _has_cell = True

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 batch_first: bool = False, dtype: npt.DTypeLike = np.float32,
                 seed: Optional[int] = None, bidirectional: bool = False,
                 proj_size: int = 0) -> None:
        if _validate.proj_size(proj_size, hidden_size):
            self.proj_size = int(proj_size)
        super().__init__(input_size, hidden_size, num_layers, batch_first, dtype, seed,
                         bidirectional)

    @classmethod
    def from_torch(cls, module: Any) -> Self:
        """An LSTM with the sizes and weights of a ``torch.nn.LSTM``.

        Parameters
        ----------
        module : torch.nn.LSTM
            float32, float64 or bfloat16 (a bfloat16 module gives a bfloat16
            model, for inference), with its proj_size. Its ``bias_ih_l{k} +
            bias_hh_l{k}`` become ``bias_l{k}`` (and likewise with the suffix
            ``_reverse``); ``batch_first`` and ``bidirectional`` are kept;
            dropout between layers is not applied (a warning says so).

        Returns
        -------
        LSTM
            Its forward matches ``module(x)`` (in eval mode) to rounding.

        Raises
        ------
        TypeError
            module is not a ``torch.nn.LSTM``, or not float32, float64 or bfloat16.

        Warns
        -----
        UserWarning
            module has dropout between layers, which fastln does not apply.

        Examples
        --------
        >>> import numpy as np, torch
        >>> from fastln.rnn import LSTM
        >>> t = torch.nn.LSTM(4, 8, num_layers=2)
        >>> m = LSTM.from_torch(t)
        >>> m
        LSTM(input_size=4, hidden_size=8, num_layers=2, batch_first=False, dtype=float32)
        >>> x = np.random.default_rng(0).standard_normal((5, 3, 4)).astype(np.float32)
        >>> with torch.no_grad():
        ...     want = t(torch.from_numpy(x))[0].numpy()
        >>> bool(np.allclose(m.forward(x)[0], want, atol=1e-5))
        True
        """
        _torch.check_module(module, "LSTM")
        return rnn_from_torch(cls, module, {"proj_size": module.proj_size})


class RNN(_Plain[_Array]):
    """Plain Elman RNN (no LayerNorm) in the same engine: the baseline of LNRNN.

    ``h' = f(x W_ih^T + h W_hh^T + bias)``, f = tanh or relu: torch.nn.RNN's
    equation with its two biases summed into one.

    Parameters
    ----------
    input_size, hidden_size : int
        The features I of x and H of the state and y.
    num_layers : int, default 1
        Stacked layers.
    batch_first : bool, default False
        x and y are (B, T, features) instead of (T, B, features).
    dtype : {numpy.float32, numpy.float64, ml_dtypes.bfloat16}, default numpy.float32
    seed : int or None, default None
        As for :class:`LSTM`.
    nonlinearity : {"tanh", "relu"}, default "tanh"
        The f above.
    bidirectional : bool, default False
        As for :class:`LSTM`.

    Attributes
    ----------
    params : dict of ndarray
        ``weight_ih_l{k}`` (H, I_k), ``weight_hh_l{k}`` (H, H), ``bias_l{k}`` (H).
    grads : dict of ndarray
        Filled by :meth:`backward`.

    Raises
    ------
    TypeError, ValueError
        As :class:`LNLSTM`; ValueError also for another nonlinearity.

    Notes
    -----
    The state is h, (D * num_layers, B, H), D = 2 if bidirectional else 1.

    Examples
    --------
    >>> import numpy as np
    >>> from fastln.rnn import RNN
    >>> m = RNN(input_size=3, hidden_size=4, seed=0)
    >>> y, h = m.forward(np.zeros((5, 2, 3), np.float32))
    >>> bool(np.all(y == 0))        # zero input, zero state and zero bias
    True
    """
    _kind = "rnn_plain"

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 batch_first: bool = False, dtype: npt.DTypeLike = np.float32,
                 seed: Optional[int] = None, nonlinearity: str = "tanh",
                 bidirectional: bool = False) -> None:
        self.nonlinearity = _validate.nonlinearity(nonlinearity)
        super().__init__(input_size, hidden_size, num_layers, batch_first, dtype, seed,
                         bidirectional)

    def _cell_name(self) -> str:
        return f"rnn_{self.nonlinearity}_plain"

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", nonlinearity={self.nonlinearity!r})"

    @classmethod
    def from_torch(cls, module: Any) -> Self:
        """An RNN with the sizes, nonlinearity and weights of a ``torch.nn.RNN``.

        Parameters
        ----------
        module : torch.nn.RNN
            As for :meth:`LSTM.from_torch`; its ``nonlinearity`` is kept.

        Returns
        -------
        RNN
            Its forward matches ``module(x)`` (in eval mode) to rounding.

        Raises
        ------
        TypeError, ValueError
            As :meth:`LSTM.from_torch`, for a ``torch.nn.RNN``.

        Examples
        --------
        >>> import torch
        >>> from fastln.rnn import RNN
        >>> RNN.from_torch(torch.nn.RNN(4, 8, nonlinearity="relu", batch_first=True))
        RNN(input_size=4, hidden_size=8, num_layers=1, batch_first=True, dtype=float32,
            nonlinearity='relu')
        """
        _torch.check_module(module, "RNN")
        return rnn_from_torch(cls, module, {"nonlinearity": module.nonlinearity})


class GRU(_Plain[_Array]):
    """Plain GRU (no LayerNorm) in the same engine: the baseline of LNGRU.

    torch.nn.GRU's equations (gate blocks r, z, n)::

        r = sigmoid(x W_ir^T + h W_hr^T + bias[r])
        z = sigmoid(x W_iz^T + h W_hz^T + bias[z])
        n = tanh(x W_in^T + bias[n] + r * (h W_hn^T + bias_hn))
        h' = (1 - z) * n + z * h

    with torch's two biases summed where they add (r and z); ``bias_hn``
    stays inside ``r * (...)``. With ``linear_before_reset=False`` the reset
    gate scales h before its product, ONNX's default form:
    ``n = tanh(x W_in^T + bias[n] + (r * h) W_hn^T + bias_hn)``.

    Parameters
    ----------
    input_size, hidden_size : int
        The features I of x and H of the state.
    num_layers : int, default 1
        Stacked layers.
    batch_first : bool, default False
        x and y are (B, T, features) instead of (T, B, features).
    dtype : {numpy.float32, numpy.float64, ml_dtypes.bfloat16}, default numpy.float32
    seed : int or None, default None
        As for :class:`LSTM`.
    bidirectional : bool, default False
        As for :class:`LSTM`.
    linear_before_reset : bool, default True
        True: torch's (and Keras's) form above; False: ONNX's default form.

    Attributes
    ----------
    params : dict of ndarray
        ``weight_ih_l{k}`` (3H, I_k), ``weight_hh_l{k}`` (3H, H), rows in
        blocks [r, z, n]; ``bias_l{k}`` (3H) = [b_ir + b_hr, b_iz + b_hz,
        b_in]; ``bias_hn_l{k}`` (H) = b_hn. A bidirectional model also has
        each with the suffix ``_reverse``.
    grads : dict of ndarray
        Filled by :meth:`backward`.

    Raises
    ------
    TypeError, ValueError
        As :class:`LSTM`; TypeError also for a linear_before_reset that is
        not a bool.

    Notes
    -----
    The state is h, (D * num_layers, B, H), D = 2 if bidirectional else 1.

    Examples
    --------
    >>> import numpy as np
    >>> from fastln.rnn import GRU
    >>> m = GRU(input_size=3, hidden_size=4, bidirectional=True, seed=0)
    >>> y, h = m.forward(np.ones((5, 2, 3), np.float32))
    >>> y.shape, h.shape
    ((5, 2, 8), (2, 2, 4))
    """
    _kind = "gru_plain"

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 batch_first: bool = False, dtype: npt.DTypeLike = np.float32,
                 seed: Optional[int] = None, bidirectional: bool = False,
                 linear_before_reset: bool = True) -> None:
        self.linear_before_reset = _validate.flag(linear_before_reset, "linear_before_reset")
        super().__init__(input_size, hidden_size, num_layers, batch_first, dtype, seed,
                         bidirectional)

    def _cell_name(self) -> str:
        return "gru_plain" if self.linear_before_reset else "gru_plain_reset_first"

    def __repr__(self) -> str:
        if self.linear_before_reset:
            return super().__repr__()
        return super().__repr__()[:-1] + ", linear_before_reset=False)"

    @classmethod
    def from_torch(cls, module: Any) -> Self:
        """A GRU with the sizes, directions and weights of a ``torch.nn.GRU``.

        Parameters
        ----------
        module : torch.nn.GRU
            As for :meth:`LSTM.from_torch`: ``bias_ih_l{k} + bias_hh_l{k}``
            become ``bias_l{k}`` in the r and z blocks, ``bias_ih``'s n block
            is ``bias_l{k}``'s, and ``bias_hh``'s n block is ``bias_hn_l{k}``.

        Returns
        -------
        GRU
            Its forward matches ``module(x)`` (in eval mode) to rounding.

        Raises
        ------
        TypeError, ValueError
            As :meth:`LSTM.from_torch`, for a ``torch.nn.GRU``.

        Examples
        --------
        >>> import numpy as np, torch
        >>> from fastln.rnn import GRU
        >>> t = torch.nn.GRU(4, 8, num_layers=2, bidirectional=True)
        >>> m = GRU.from_torch(t)
        >>> x = np.random.default_rng(0).standard_normal((5, 3, 4)).astype(np.float32)
        >>> with torch.no_grad():
        ...     want = t(torch.from_numpy(x))[0].numpy()
        >>> bool(np.allclose(m.forward(x)[0], want, atol=1e-5))
        True
        """
        _torch.check_module(module, "GRU")
        return rnn_from_torch(cls, module, {})
