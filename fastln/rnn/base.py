"""RecurrentModel, the base of the recurrent models of fastln.rnn (their
configuration, forward and backward over the C engine layer by layer, and
copies in another dtype), and quantize, their int8 copies."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Dict, FrozenSet, List, Optional, Tuple, TypeVar

import numpy as np
import numpy.typing as npt

from .. import _validate
from . import _engine, functional
from ._formats import Format, Int8, format_of
from ._inputs import State, StateArg
from ._params import Schema
from ._step import Stepping

if TYPE_CHECKING:
    from typing_extensions import Self

_Array = npt.NDArray[Any]


class RecurrentModel(Stepping[State]):
    """The base of fastln.rnn's models: LNRNN, LNLSTM, LNGRU, LSTM, GRU and RNN.

    It holds what the six share: the configuration, the parameters
    (``params``, ``grads``, :meth:`state_dict`, :meth:`load_state_dict`),
    :meth:`forward`, :meth:`backward`, :meth:`step` and :meth:`to`. It is
    not constructed itself (TypeError): construct one of the six, whose
    docstrings give the equations and parameters. ``isinstance(m,
    RecurrentModel)`` tells a fastln.rnn model, as :class:`StreamTable` and
    :func:`quantize` take.

    Parameters
    ----------
    input_size : int
        The features I of x (the layers above the first read D * H).
    hidden_size : int
        The features H of the state and of y.
    num_layers : int, default 1
        Stacked layers.
    batch_first : bool, default False
        x and y are (B, T, features) instead of (T, B, features).
    eps : float, default 1e-5
        Added to the variance in every LayerNorm (the plain cells have none).
    dtype : {numpy.float32, numpy.float64, ml_dtypes.bfloat16}, default numpy.float32
        The dtype of the parameters and of the data.
    seed : int or None, default None
        Seeds the generator of the initial weights.
    bidirectional : bool, default False
        Run every layer in both directions.

    Notes
    -----
    Threads: the C engine releases the GIL. One model may serve ``step()``
    and ``forward(..., cache=False)`` from several threads at once; a
    forward with a cache and its backward hold state in the model and must
    not overlap other calls on the same model.

    Examples
    --------
    >>> from fastln.rnn import GRU, LNLSTM, RecurrentModel
    >>> [isinstance(m, RecurrentModel) for m in (LNLSTM(2, 3), GRU(2, 3))]
    [True, True]
    """

    _kind = ""         # a key of LAYOUTS (fastln/rnn/_params.py)
    _has_cell = False  # the state is (h, c)
    proj_size = 0      # LSTM's projection P (h and y then have P features), else 0
    # what calls keep (see _call_state)
    _cache: Optional[Tuple[int, int, List[_Array], List[_Array], Optional[_Array]]]
    _spare: List[_Array]
    _work: List[_Array]

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 batch_first: bool = False, eps: float = 1e-5,
                 dtype: npt.DTypeLike = np.float32, seed: Optional[int] = None,
                 bidirectional: bool = False) -> None:
        if not self._kind:
            raise TypeError("RecurrentModel is the base of fastln.rnn's models: construct "
                            "LNRNN, LNLSTM, LNGRU, LSTM, GRU or RNN")
        self.input_size = _validate.positive_int(input_size, "input_size")
        self.hidden_size = _validate.positive_int(hidden_size, "hidden_size")
        self.num_layers = _validate.positive_int(num_layers, "num_layers")
        self.batch_first = _validate.flag(batch_first, "batch_first")
        self.bidirectional = _validate.flag(bidirectional, "bidirectional")
        # a unidirectional model whose one direction runs each sequence from
        # its last valid step back to its first (ONNX's direction="reverse")
        self.reverse = False
        self.eps = _validate.check_eps(eps)
        self._use_format(format_of(dtype))
        self._reset_calls()
        schema = self._schema
        rng = np.random.default_rng(seed)
        bound = 1.0 / np.sqrt(self.hidden_size)
        try:
            self.params = {key: schema.initial(key, rng, bound) for key in schema.inits}
            self.grads = self._format.gradients(schema.shapes)
        except MemoryError:
            need = sum(math.prod(shape) * (schema.dtype(key).itemsize + self._dt.itemsize)
                       for key, shape in schema.shapes.items())
            raise MemoryError(f"{type(self).__name__}(input_size={self.input_size}, "
                              f"hidden_size={self.hidden_size}, num_layers={self.num_layers}) "
                              f"in {self.dtype} needs {need / 2**30:.1f} GiB for its "
                              f"parameters and their gradients, which this process cannot "
                              f"allocate") from None

    def _use_format(self, fmt: Format) -> None:
        """Sets the format of the weight matrices, and with it the dtypes
        and the schema of the parameters."""
        self._format = fmt
        self.dtype = fmt.dtype
        # the dtype of the state, the arrays between layers and every parameter
        # but the weight matrices: float32 for bfloat16 and int8 models
        self._dt = fmt.compute
        self._schema = Schema(self._kind, self.input_size, self.hidden_size, self.num_layers,
                              self.num_directions, fmt, self._omitted(), self.proj_size)

    def _omitted(self) -> FrozenSet[str]:
        """The names of the layout's parameters this model goes without (the
        engine adds zeros in their place)."""
        return frozenset()

    @staticmethod
    def _call_state() -> Dict[str, Any]:
        """What calls keep in a model, empty: the cache, scratch, checked and
        packed arrays and the compiled step (a model rebuilds them)."""
        # _cache: (T, B, each layer's input, each layer's cache array, lengths);
        # _spare: the cache arrays of a finished forward, reused by the next;
        # _work: the backward's scratch per direction, likewise
        return dict(_checked={}, _packs={}, _cache=None, _spare=[], _work=[], _step=None,
                    _zero_params=None, _zero_grads=None)

    def _set(self, attributes: Dict[str, Any]) -> None:
        """Sets the attributes one by one: a model whose __dict__ is never
        read keeps CPython's faster attribute access (its values inline)."""
        for name, value in attributes.items():
            setattr(self, name, value)

    def _reset_calls(self) -> None:
        """Empties what calls keep (see _call_state)."""
        self._set(self._call_state())

    def __getstate__(self) -> Dict[str, Any]:
        """Pickles the configuration and parameters, not what a call keeps
        (see _call_state), which an unpickled model rebuilds."""
        state = self.__dict__.copy()
        state.update(self._call_state())
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self._set(state)
        for key in self._schema.matrices:   # frozen weights stay frozen
            value = self.params.get(key)
            if isinstance(value, np.ndarray):
                self.params[key] = self._format.keep(value)

    def _with_format(self, fmt: Format) -> Self:
        """A copy of the model in format fmt, its parameters converted by
        fmt, without what this one's calls keep (its cache and gradients)."""
        new = type(self).__new__(type(self))
        new._set(self.__getstate__())
        new._use_format(fmt)
        new.params = fmt.convert(self.params, new._schema.matrices, self._format)
        new.grads = fmt.gradients(new._schema.shapes)
        return new

    # ---- the cache of forward for backward ----

    def _release_cache(self) -> None:
        """Drops the cache; its arrays serve the next forward, as the backward
        scratch serves the next backward (fresh allocations of these sizes
        would page-fault on every call)."""
        if self._cache is not None:
            self._spare = self._cache[3]
        self._cache = None

    def _cache_array(self, size: int) -> _Array:
        for i, a in enumerate(self._spare):
            if a.size == size:
                return self._spare.pop(i)
        self._spare = []   # a different shape: let the old arrays go
        return np.empty(size, self._dt)

    def forward(self, x: npt.ArrayLike, state: StateArg = None,
                lengths: Optional[npt.ArrayLike] = None, cache: bool = True
                ) -> Tuple[_Array, State]:
        """Runs the model over a batch of sequences (``model(x)`` is the same).

        Parameters
        ----------
        x : array_like, shape (T, B, input_size), or (B, T, input_size) with batch_first
            The input sequences, T >= 1 steps of B sequences (B = 0 gives
            empty results). An ndarray or a CPU torch tensor (one that does
            not require grad: fastln has no autograd, and the results are
            NumPy arrays) must have the model's float type (an ndarray in
            either byte order; a bfloat16 model takes bfloat16 or float32):
            another dtype is a TypeError, never a silent cast. Lists and
            other array-likes are converted.
        state : ndarray or tuple of ndarray, optional
            The initial state, None for zeros. LNLSTM and LSTM: a tuple
            ``(h, c)`` (either may be None); LNRNN, LNGRU, GRU and RNN:
            ``h``. Each of shape (D * num_layers, B, hidden_size), D = 2 if
            bidirectional else 1, and the model's float type (float32 for a
            bfloat16 model, whose state stays float32), as x: ndarrays or
            torch tensors. It is not modified.
        lengths : array_like of int, shape (B,), optional
            The length of each sequence of a padded batch, in [1, T]. After its
            length a sequence holds its state and its output is 0; the
            padding of x is never read (it may hold anything, NaN included).
        cache : bool, default True
            Keep what :meth:`backward` needs (about 11 H values per sequence,
            step and layer for LNLSTM), replacing the cache of an earlier
            forward. With False nothing is kept (and an earlier cache is
            dropped). A bfloat16 model runs inference only: it needs False.

        Returns
        -------
        y : ndarray, shape (T, B, D * hidden_size), or (B, T, D * hidden_size) with batch_first
            The top layer's output at every step, in the model's dtype
            (bidirectional: the forward direction's H features, then the
            reverse direction's).
        state : ndarray or tuple of ndarray
            The final state, in the form of ``state`` (h, or (h, c) for
            LNLSTM and LSTM), each (D * num_layers, B, hidden_size), new
            arrays. With lengths, each sequence's state at its own last step
            (the reverse direction's: after its first step).

        Raises
        ------
        TypeError
            x or a state array or tensor of another dtype than the model's
            (or not numbers), or a torch tensor that requires grad (pass
            ``x.detach()``); an LNLSTM/LSTM state that is not an (h, c) tuple;
            lengths not integers; a parameter in ``params`` that is not
            numbers; cache=True on a bfloat16 model.
        ValueError
            x not 3-D with ``input_size`` features, or without a step or a
            sequence; a state not of shape (D * num_layers, B, hidden_size);
            lengths not of shape (B,) or outside [1, T]; a parameter in
            ``params`` missing or of the wrong shape.

        Notes
        -----
        A row's results do not depend on the other rows of its batch: row b
        of a batch is bitwise what the same sequence gives alone, for any B,
        in every dtype and on every instruction-set path.

        Examples
        --------
        >>> import numpy as np
        >>> from fastln.rnn import LNGRU
        >>> m = LNGRU(input_size=3, hidden_size=4, num_layers=2, seed=0)
        >>> x = np.zeros((5, 2, 3), np.float32)
        >>> y, h = m.forward(x, lengths=[5, 2])
        >>> y.shape, h.shape
        ((5, 2, 4), (2, 2, 4))
        >>> bool(np.all(y[2:, 1] == 0))          # sequence 1 ended after 2 steps
        True
        """
        cache = _validate.flag(cache, "cache")
        if self.reverse and self.bidirectional:
            raise ValueError("reverse=True runs the one direction of a unidirectional model "
                             "backwards; a bidirectional model already runs both")
        if cache:
            self._format.check_trains(backward=False)
            if self.proj_size:
                raise TypeError("an LSTM with proj_size runs inference only: call "
                                "forward(x, cache=False)")
        xs = self._input(x, "x", self.input_size)
        T, B = xs.shape[:2]
        states = self._states(state, B, "state")
        lens = self._lengths(lengths, T, B)
        self._release_cache()
        if not cache:
            self._spare, self._work = [], []   # inference keeps nothing
        H, cell, D = self.hidden_size, self._cell_name(), self.num_directions
        W = self._out_size   # y's features per direction
        if B == 0:   # no sequences: empty results, and a cache for an empty backward
            if cache:
                self._cache = (T, 0, [], [], lens)
            y = np.zeros((0, T, D * W) if self.batch_first else (T, 0, D * W), self.dtype)
            return y, self._pack_state(states)
        inputs: List[_Array] = []
        caches: List[_Array] = []
        size = _engine.cache_size(cell, T, B, H)
        wtype = self._format.wtype
        for k in range(self.num_layers):
            y = np.empty((T, B, D * W), self._dt)
            store = [self._cache_array(size) for _ in range(D)] if cache else None
            h = states[0][D * k:D * k + D]
            c = states[1][D * k:D * k + D] if self._has_cell else None
            ps = [self._layer_params(k, d) for d in range(D)]
            packed = [self._packed(k, d, ps[d]) for d in range(D)]
            functional.layer_forward(cell, xs, ps, h, c, lengths=lens, eps=self.eps,
                                     caches=store, reverse=self.reverse, out=y, wtype=wtype,
                                     packed=packed, proj=self.proj_size)
            if store is not None:
                inputs.append(xs)
                caches.extend(store)
            xs = y
        if cache:
            self._cache = (T, B, inputs, caches, lens)
        xs = self._format.output(xs)
        y = xs.transpose(1, 0, 2).copy() if self.batch_first else xs
        return y, self._pack_state(states)

    __call__ = forward

    def backward(self, dy: npt.ArrayLike, dstate: StateArg = None) -> Tuple[_Array, State]:
        """Back-propagates through the last forward (with cache=True) in time.

        A bfloat16 model has no backward (TypeError): train in float32.

        Parameters
        ----------
        dy : array_like, the shape of the forward's y
            The gradient of the loss with respect to y, of the model's float
            type (as x in :meth:`forward`).
        dstate : ndarray or tuple of ndarray, optional
            The gradient with respect to the forward's final state, in the
            form of the state (h, or (h, c) for LNLSTM and LSTM, either part
            may be None), each (D * num_layers, B, hidden_size); None for
            zeros.

        Returns
        -------
        dx : ndarray, the shape of the forward's x
            The gradient with respect to x, in the model's dtype.
        dstate0 : ndarray or tuple of ndarray
            The gradient with respect to the initial state, in the form of
            the state.

        Raises
        ------
        RuntimeError
            No cached forward: none ran with ``cache=True``, or its cache was
            used by a backward already. Call :meth:`forward` again first.
        TypeError, ValueError
            dy or dstate of the wrong type or shape, as x and state in
            :meth:`forward`.

        Notes
        -----
        The parameter gradients are written to ``self.grads`` (same keys and
        shapes as ``self.params``), replacing the previous values; the
        arrays there are reused and overwritten in place, so copy them to
        keep them. The forward's cache is consumed (freed): each forward
        serves one backward, and a second backward needs a new forward. A
        backward that raises on its arguments leaves the cache as it was.
        The cache refers to the forward's x (without a copy where x
        was already time-major and contiguous) and its parameters: change
        neither in between.

        Examples
        --------
        >>> import numpy as np
        >>> from fastln.rnn import LNRNN
        >>> m = LNRNN(input_size=3, hidden_size=4, seed=0)
        >>> x = np.ones((5, 2, 3), np.float32)
        >>> y, h = m.forward(x)
        >>> dx, dh0 = m.backward(np.ones_like(y))
        >>> dx.shape, dh0.shape, m.grads["weight_ih_l0"].shape
        ((5, 2, 3), (1, 2, 4), (4, 3))
        """
        self._format.check_trains(backward=True)
        if self._cache is None:
            raise RuntimeError("backward needs the cache of a forward: call forward(x) "
                               "again first, with cache=True (the default); each forward's "
                               "cache serves one backward, which frees it")
        T, B, inputs, caches, lens = self._cache
        H, cell, D = self.hidden_size, self._cell_name(), self.num_directions
        g = self._input(dy, "dy", D * H, T, B)
        dstates = self._states(dstate, B, "dstate")
        if B == 0:   # no sequences: empty gradients of the data, zero ones of the parameters
            for k in range(self.num_layers):
                for d in range(D):
                    for grad in self._layer_grads(k, d):
                        grad.fill(0)
            self._release_cache()
            shape = (0, T, self.input_size) if self.batch_first else (T, 0, self.input_size)
            return np.zeros(shape, self.dtype), self._pack_state(dstates)
        size = _engine.work_size(cell, T, B, H)
        if len(self._work) != D or self._work[0].size != size:
            self._work = [np.empty(size, self.dtype) for _ in range(D)]
        work = self._work
        for k in reversed(range(self.num_layers)):
            I = inputs[k].shape[2]
            dx = np.empty((T, B, I), self.dtype)
            dh = dstates[0][D * k:D * k + D]
            dc = dstates[1][D * k:D * k + D] if self._has_cell else None
            functional.layer_backward(cell, inputs[k],
                                      [self._layer_params(k, d) for d in range(D)],
                                      caches[D * k:D * k + D], g, dh, dc,
                                      grads=[self._layer_grads(k, d) for d in range(D)],
                                      lengths=lens, eps=self.eps, reverse=self.reverse,
                                      out=dx, works=work)
            g = dx
        self._release_cache()
        dx = g.transpose(1, 0, 2).copy() if self.batch_first else g
        return dx, self._pack_state(dstates)

    def to(self, dtype: npt.DTypeLike) -> Self:
        """A copy of the model with its parameters in dtype (as PyTorch's ``.to``).

        Parameters
        ----------
        dtype : float32, float64 or ml_dtypes.bfloat16
            The new model's dtype. A bfloat16 model stores its weight
            matrices in bfloat16 (read-only arrays) and every other
            parameter in float32; it runs inference only (``forward(x,
            cache=False)`` and :meth:`step`): the products take their
            inputs rounded to bfloat16 with float32 sums (VDPBF16PS where
            the CPU has AVX512-BF16), and the state, the LN statistics and
            the gates stay float32.

        Returns
        -------
        model
            A new model of the same class and configuration; this one is not
            changed (its cache and gradients are not copied).

        Raises
        ------
        TypeError
            dtype is not one of the three.
        ImportError
            dtype is ``"bfloat16"`` and ml_dtypes is not installed
            (``pip install "fastln[bfloat16]"``).

        Examples
        --------
        >>> import ml_dtypes, numpy as np
        >>> from fastln.rnn import LNLSTM
        >>> m = LNLSTM(input_size=3, hidden_size=4, seed=0).to(ml_dtypes.bfloat16)
        >>> m.params["weight_hh_l0"].dtype, m.params["ln_c_weight_l0"].dtype
        (dtype(bfloat16), dtype('float32'))
        >>> y, (h, c) = m.forward(np.ones((2, 1, 3), np.float32), cache=False)
        >>> y.dtype, c.dtype
        (dtype(bfloat16), dtype('float32'))
        """
        return self._with_format(self._format.to(dtype))

    def __repr__(self) -> str:
        eps = "" if self._kind.endswith("_plain") else f"eps={self.eps}, "
        extra = "".join(f", {name}=True" for name in ("bidirectional", "reverse")
                        if getattr(self, name)) + self._format.repr_extra
        if self.proj_size:
            extra += f", proj_size={self.proj_size}"
        return (f"{type(self).__name__}(input_size={self.input_size}, "
                f"hidden_size={self.hidden_size}, num_layers={self.num_layers}, "
                f"batch_first={self.batch_first}, {eps}dtype={self.dtype}{extra})")


_Model = TypeVar("_Model", bound=RecurrentModel[Any])


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
    if not isinstance(model, RecurrentModel):
        raise TypeError(f"model must be a fastln.rnn model, got {type(model).__name__}")
    return model._with_format(Int8())
