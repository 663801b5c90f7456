"""Layer objects over the functional kernels: LayerNorm and RMSNorm.

Each layer holds its parameters (``weight``, and ``bias`` for LayerNorm)
under PyTorch's names, normalizes the trailing ``normalized_shape`` axes of
its input with :func:`fastln.layer_norm` / :func:`fastln.rms_norm`, keeps
what ``backward`` needs, and fills ``grads``. Both are re-exported by
:mod:`fastln`.

A backward consumes the cache of its forward: each ``forward`` serves one
``backward``, and a second backward without a new forward raises a
RuntimeError (as in the models of :mod:`fastln.rnn`).

Examples
--------
>>> import numpy as np, fastln
>>> ln = fastln.LayerNorm(4)
>>> y = ln(np.arange(8, dtype=np.float32).reshape(2, 4))
>>> dx = ln.backward(np.ones_like(y))
>>> sorted(ln.grads)
['bias', 'weight']
"""
from __future__ import annotations

import abc
import numbers
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from fastln import _dtypes, _norms, _torch, _validate

if TYPE_CHECKING:
    import numpy.typing as npt
    from typing_extensions import Self

    _Array = npt.NDArray[Any]

__all__ = ["LayerNorm", "RMSNorm"]

_NO_CACHE = ("backward needs the cache of a forward: call forward(x) again first (each "
             "forward's cache serves one backward, which frees it)")


def _shape(normalized_shape: Any) -> Tuple[int, ...]:
    """normalized_shape (an int or a sequence of ints) as a tuple of positive ints."""
    def is_int(n: Any) -> bool:
        return isinstance(n, numbers.Integral) and not isinstance(n, (bool, np.bool_))
    shape: Tuple[int, ...]
    if is_int(normalized_shape):
        shape = (int(normalized_shape),)
    elif (isinstance(normalized_shape, (tuple, list)) and all(map(is_int, normalized_shape))):
        shape = tuple(int(n) for n in normalized_shape)
    else:
        raise TypeError(f"normalized_shape must be an int or a tuple of ints, "
                        f"got {normalized_shape!r}")
    if not shape or any(n < 1 for n in shape):
        raise ValueError(f"normalized_shape must be positive sizes, got {normalized_shape!r}")
    return shape


def _is_meta(v: Any) -> bool:
    """Whether v is a torch tensor on the meta device (a shape, no values)."""
    return _torch.is_tensor(v) and bool(getattr(v, "is_meta", False))


def _check_materialized(module: Any) -> None:
    """ValueError where a parameter or buffer of a torch module is on the meta
    device: it has a shape but no values to copy."""
    tensors = list(module.named_parameters()) + list(module.named_buffers())
    meta = [name for name, t in tensors if _is_meta(t)]
    if meta:
        raise ValueError(f"module's parameters are on the meta device and hold no values "
                         f"({', '.join(meta)}): materialize them first, e.g. "
                         f"module.to_empty(device='cpu') and then initialize or load them")


def _axes(shape: Tuple[int, ...]) -> Union[int, Tuple[int, ...]]:
    """The trailing axes: -1 itself for one axis (the kernels' fast path takes a plain int)."""
    return -1 if len(shape) == 1 else tuple(range(-len(shape), 0))


class _Norm(abc.ABC):
    """What LayerNorm and RMSNorm share: parameters, state_dict, the cache."""

    _param_names: Tuple[str, ...] = ()
    weight: Optional[_Array]

    def __init__(self, normalized_shape: Union[int, Sequence[int]], eps: float,
                 dtype: npt.DTypeLike) -> None:
        self.normalized_shape: Tuple[int, ...] = _shape(normalized_shape)
        self.eps: float = _validate.check_eps(eps)
        self.dtype: np.dtype[Any] = np.dtype(dtype)
        if self.dtype.kind != "f" and self.dtype not in _dtypes.LOW_PRECISION:
            raise TypeError(f"dtype must be a floating dtype, got {self.dtype}")
        self.grads: Dict[str, _Array] = {}
        self._cache: Optional[Tuple[_Array, ...]] = None

    def _axis(self) -> Union[int, Tuple[int, ...]]:
        return _axes(self.normalized_shape)

    def _take_cache(self) -> Tuple[_Array, ...]:
        """The cache of the last forward, or the RuntimeError that says there is none."""
        if self._cache is None:
            raise RuntimeError(_NO_CACHE)
        return self._cache

    def state_dict(self) -> Dict[str, _Array]:
        """The parameters under PyTorch's names, as copies.

        Returns
        -------
        dict of str to ndarray
            ``"weight"`` (and ``"bias"`` for a LayerNorm with one): copies of
            the parameters, of ``normalized_shape`` and the layer's dtype.
            Empty without ``elementwise_affine``.

        Examples
        --------
        >>> import fastln
        >>> sd = fastln.LayerNorm(3).state_dict()
        >>> sorted(sd), sd["weight"]
        (['bias', 'weight'], array([1., 1., 1.], dtype=float32))
        """
        return {k: getattr(self, k).copy() for k in self._param_names
                if getattr(self, k) is not None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Loads the parameters by PyTorch name (a torch module's state_dict too).

        Parameters
        ----------
        state : mapping of str to array_like
            Exactly the keys of :meth:`state_dict`. Values are arrays, array
            likes or torch tensors (bfloat16 tensors need ml_dtypes) of a
            real dtype and of ``normalized_shape``; they are copied and cast
            to the layer's dtype.

        Raises
        ------
        TypeError
            state is not a mapping, or a value is not of a real number type.
        ValueError
            A key is missing or unexpected (the message names them, as the
            models of :mod:`fastln.rnn` do), a value is not of
            ``normalized_shape``, or a value is a torch tensor on the meta
            device (no values).

        Notes
        -----
        On error nothing is changed.

        Examples
        --------
        >>> import numpy as np, fastln
        >>> ln = fastln.RMSNorm(3)
        >>> ln.load_state_dict({"weight": [1, 2, 3]})
        >>> ln.weight
        array([1., 2., 3.], dtype=float32)
        """
        if not hasattr(state, "keys"):
            raise TypeError(f"state_dict must be a mapping, got {type(state).__name__}")
        expected = {k for k in self._param_names if getattr(self, k) is not None}
        missing, unexpected = expected - set(state.keys()), set(state.keys()) - expected
        if missing or unexpected:
            raise ValueError(f"state_dict keys do not match the layer's: missing "
                             f"{sorted(missing, key=str)}, "
                             f"unexpected {sorted(unexpected, key=str)}")
        new = {}
        for k in expected:
            if _is_meta(state[k]):
                raise ValueError(f"state_dict[{k!r}] is a tensor on the meta device, which "
                                 f"holds no values")
            v = _validate.real_array(_torch.to_numpy(state[k]), f"state_dict[{k!r}]")
            if v.shape != self.normalized_shape:
                raise ValueError(f"state_dict[{k!r}] has shape {v.shape}, "
                                 f"expected {self.normalized_shape}")
            new[k] = v.astype(self.dtype, copy=True)
        for k, v in new.items():
            setattr(self, k, v)

    def _check_input(self, x: Any) -> _Array:
        """x as an ndarray (a torch tensor read as in fastln.layer_norm) whose
        trailing axes are normalized_shape (also without weights)."""
        a = _validate.asarray(x, "x")
        shape = a.shape
        n = len(self.normalized_shape)
        if tuple(shape[len(shape) - n:]) != self.normalized_shape or len(shape) < n:
            raise ValueError(f"x must end in the normalized shape {self.normalized_shape}, "
                             f"got shape {tuple(shape)}")
        return a

    @abc.abstractmethod
    def forward(self, x: npt.ArrayLike) -> _Array:
        """Normalizes x; the subclasses define it."""

    def __call__(self, x: npt.ArrayLike) -> _Array:
        """Same as :meth:`forward`: ``layer(x)`` is ``layer.forward(x)``.

        Parameters
        ----------
        x : array_like
            As for :meth:`forward`.

        Returns
        -------
        ndarray
            y, as :meth:`forward` returns it.
        """
        return self.forward(x)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.normalized_shape}, eps={self.eps}, "
                f"dtype={self.dtype.name})")


class LayerNorm(_Norm):
    """Layer normalization over the trailing ``normalized_shape`` axes.

    The counterpart of ``torch.nn.LayerNorm``, with the same arguments,
    defaults and parameter names, over :func:`fastln.layer_norm`.

    Parameters
    ----------
    normalized_shape : int or tuple of int
        The trailing shape normalized together (positive sizes).
    eps : float, default 1e-5
        Added to the variance; finite and >= 0.
    elementwise_affine : bool, default True
        Learn a gain ``weight`` (ones) and, with ``bias=True``, a ``bias``
        (zeros); else both are None.
    bias : bool, default True
        Whether the affine part has a bias.
    dtype : dtype, default numpy.float32
        The parameters' dtype: a floating dtype (float16, bfloat16 where
        ml_dtypes is installed, float32, float64).

    Attributes
    ----------
    weight, bias : ndarray or None
        The parameters, of ``normalized_shape`` and ``dtype``.
    grads : dict of str to ndarray
        Filled by :meth:`backward`: ``"weight"`` and ``"bias"``, those the
        layer has.
    normalized_shape : tuple of int
    eps : float
    dtype : numpy.dtype

    Raises
    ------
    TypeError
        normalized_shape is not an int or a tuple/list of ints; dtype is not
        a floating dtype; eps is not a real number; elementwise_affine or
        bias is not a bool.
    ValueError
        A size in normalized_shape is below 1, or eps is negative or not
        finite.

    Notes
    -----
    ``forward(x)`` (or calling the layer) keeps what ``backward(dy)`` needs:
    a reference to x (not a copy, so x must not change in between) and the
    row statistics. ``backward`` consumes that cache: each forward serves one
    backward, and a second backward without a new forward raises a
    RuntimeError. The output follows x's dtype (the parameters are cast to
    x's compute dtype, see :func:`fastln.layer_norm`), and so do dx and the
    gradients: float32 for float16 and bfloat16 x.

    Torch tensors: x and dy may be CPU tensors that do not require grad;
    y and dx are NumPy arrays (fastln has no autograd).

    Examples
    --------
    >>> import numpy as np, fastln
    >>> ln = fastln.LayerNorm(4)
    >>> ln
    LayerNorm((4,), eps=1e-05, dtype=float32)
    >>> x = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> y = ln(x)
    >>> dx = ln.backward(np.ones_like(y))
    >>> ln.grads["bias"]
    array([2., 2., 2., 2.], dtype=float32)
    """

    _param_names = ("weight", "bias")

    def __init__(self, normalized_shape: Union[int, Sequence[int]], eps: float = 1e-5,
                 elementwise_affine: bool = True, bias: bool = True,
                 dtype: npt.DTypeLike = np.float32) -> None:
        super().__init__(normalized_shape, eps, dtype)
        self.elementwise_affine: bool = _validate.flag(elementwise_affine, "elementwise_affine")
        has_bias = _validate.flag(bias, "bias")
        self.weight = (np.ones(self.normalized_shape, self.dtype) if self.elementwise_affine
                       else None)
        self.bias: Optional[_Array] = (np.zeros(self.normalized_shape, self.dtype)
                                       if self.elementwise_affine and has_bias else None)

    @classmethod
    def from_torch(cls, module: Any) -> Self:
        """A LayerNorm with the configuration and parameters of a torch module.

        Parameters
        ----------
        module : torch.nn.LayerNorm
            Or a subclass. torch itself is not imported by fastln.

        Returns
        -------
        LayerNorm
            The same ``normalized_shape``, ``eps``, affine parameters (copied)
            and dtype as ``module`` (float32 where it has no parameters); its
            output matches ``module(x)`` to rounding.

        Raises
        ------
        TypeError
            module is not a ``torch.nn.LayerNorm``.
        ValueError
            module's parameters are on the meta device (they hold no values).

        Examples
        --------
        >>> import torch, fastln
        >>> t = torch.nn.LayerNorm(8)
        >>> fastln.LayerNorm.from_torch(t)
        LayerNorm((8,), eps=1e-05, dtype=float32)
        """
        _torch.check_module(module, "LayerNorm")
        _check_materialized(module)
        layer = cls(tuple(module.normalized_shape), eps=module.eps,
                    elementwise_affine=module.elementwise_affine,
                    bias=module.bias is not None, dtype=_torch.module_dtype(module))
        layer.load_state_dict(module.state_dict())
        return layer

    def forward(self, x: npt.ArrayLike) -> _Array:
        """Normalizes x over its trailing ``normalized_shape`` axes.

        Parameters
        ----------
        x : array_like
            Any shape ending in ``normalized_shape``; any real dtype. A CPU
            torch tensor that does not require grad is read as an array (y is
            a NumPy array either way).

        Returns
        -------
        y : ndarray
            x's shape. The dtype is x's for float input and float64 for
            integers and bool, as :func:`fastln.layer_norm` (not the layer's
            dtype: the parameters are cast instead).

        Raises
        ------
        ValueError
            x does not end in ``normalized_shape``.
        TypeError
            x has a dtype that is not a real number type, or is a torch
            tensor that requires grad (pass ``x.detach()``).

        Notes
        -----
        Keeps a reference to x and the row statistics for :meth:`backward`
        (replacing those of an earlier call): do not change x in between.
        """
        x = self._check_input(x)
        y, mean, rstd = _norms.layer_norm(x, self.weight, self.bias, axis=self._axis(),
                                         eps=self.eps, return_stats=True)
        self._cache = (x, mean, rstd)
        return y

    def backward(self, dy: npt.ArrayLike) -> _Array:
        """Back-propagates through the last :meth:`forward`, consuming its cache.

        Parameters
        ----------
        dy : array_like
            Gradient of the loss with respect to the forward's y: its shape,
            any real dtype (a torch tensor as x in :meth:`forward`).

        Returns
        -------
        dx : ndarray
            Gradient with respect to the forward's x: its shape, and y's dtype.

        Raises
        ------
        RuntimeError
            No forward cache: no forward has run, or a backward has used
            the last one's already. Call :meth:`forward` again first.
        ValueError
            dy does not have the forward's x's shape.

        Notes
        -----
        Replaces ``grads`` with ``{"weight": dweight, "bias": dbias}`` (the
        parameters the layer has), of ``normalized_shape`` in the compute
        dtype of x (float32 for float16, bfloat16 and float32; else float64).
        Frees the forward's cache: each forward serves one backward. A
        backward that raises leaves the cache as it was.
        """
        x, mean, rstd = self._take_cache()
        dx, dw, db = _norms.layer_norm_backward(dy, x, mean, rstd, self.weight,
                                               axis=self._axis())
        self._cache = None
        self.grads = {}
        if self.weight is not None:
            self.grads["weight"] = dw
        if self.bias is not None:
            self.grads["bias"] = db
        return dx


class RMSNorm(_Norm):
    """RMS normalization over the trailing ``normalized_shape`` axes.

    The counterpart of ``torch.nn.RMSNorm`` over :func:`fastln.rms_norm`:
    ``y = x / sqrt(mean(x**2) + eps) * weight``. Same interface as
    :class:`LayerNorm`, with a gain ``weight`` only.

    Parameters
    ----------
    normalized_shape : int or tuple of int
        The trailing shape normalized together (positive sizes).
    eps : float, default 1e-6
        Added to the mean square; finite and >= 0.
    elementwise_affine : bool, default True
        Learn a gain ``weight`` (ones); else it is None.
    dtype : dtype, default numpy.float32
        The parameter's dtype: a floating dtype.

    Attributes
    ----------
    weight : ndarray or None
        The gain, of ``normalized_shape`` and ``dtype``.
    grads : dict of str to ndarray
        Filled by :meth:`backward`: ``"weight"`` where the layer has one.

    Raises
    ------
    TypeError, ValueError
        As :class:`LayerNorm`.

    Notes
    -----
    As for :class:`LayerNorm`: ``forward`` keeps a reference to x and the
    row statistics, ``backward`` consumes them (one backward per forward),
    and x and dy may be torch tensors that do not require grad.

    Examples
    --------
    >>> import numpy as np, fastln
    >>> rms = fastln.RMSNorm((2, 3))
    >>> y = rms(np.ones((5, 2, 3)))
    >>> y.shape, bool(np.allclose(y, 1.0, atol=1e-5))
    ((5, 2, 3), True)
    """

    _param_names = ("weight",)

    def __init__(self, normalized_shape: Union[int, Sequence[int]], eps: float = 1e-6,
                 elementwise_affine: bool = True, dtype: npt.DTypeLike = np.float32) -> None:
        super().__init__(normalized_shape, eps, dtype)
        self.elementwise_affine: bool = _validate.flag(elementwise_affine, "elementwise_affine")
        self.weight = (np.ones(self.normalized_shape, self.dtype) if self.elementwise_affine
                       else None)

    @classmethod
    def from_torch(cls, module: Any) -> Self:
        """An RMSNorm with the configuration and parameters of a torch module.

        Parameters
        ----------
        module : torch.nn.RMSNorm
            Or a subclass. With ``eps=None`` torch uses the machine epsilon
            of the input's dtype; the layer takes that of the module's
            parameter dtype (float32 when it has none),
            ``np.finfo(dtype).eps``.

        Returns
        -------
        RMSNorm
            The same ``normalized_shape``, ``eps``, weight (copied) and dtype
            as ``module``.

        Raises
        ------
        TypeError
            module is not a ``torch.nn.RMSNorm``.
        ValueError
            module's parameters are on the meta device (they hold no values).

        Examples
        --------
        >>> import torch, fastln
        >>> fastln.RMSNorm.from_torch(torch.nn.RMSNorm(8, eps=1e-6))
        RMSNorm((8,), eps=1e-06, dtype=float32)
        """
        _torch.check_module(module, "RMSNorm")
        _check_materialized(module)
        dtype = _torch.module_dtype(module)
        eps = module.eps if module.eps is not None else float(np.finfo(dtype).eps)
        layer = cls(tuple(module.normalized_shape), eps=eps,
                    elementwise_affine=module.elementwise_affine, dtype=dtype)
        layer.load_state_dict(module.state_dict())
        return layer

    def forward(self, x: npt.ArrayLike) -> _Array:
        """RMS-normalizes x over its trailing ``normalized_shape`` axes.

        Parameters
        ----------
        x : array_like
            Any shape ending in ``normalized_shape``; any real dtype. A CPU
            torch tensor that does not require grad is read as an array (y is
            a NumPy array either way).

        Returns
        -------
        y : ndarray
            x's shape; x's dtype for float input, float64 for integers and
            bool (as :func:`fastln.rms_norm`).

        Raises
        ------
        ValueError
            x does not end in ``normalized_shape``.
        TypeError
            x has a dtype that is not a real number type, or is a torch
            tensor that requires grad (pass ``x.detach()``).

        Notes
        -----
        Keeps a reference to x and the row statistics for :meth:`backward`
        (replacing those of an earlier call): do not change x in between.
        """
        x = self._check_input(x)
        y, rstd = _norms.rms_norm(x, self.weight, axis=self._axis(), eps=self.eps,
                                 return_stats=True)
        self._cache = (x, rstd)
        return y

    def backward(self, dy: npt.ArrayLike) -> _Array:
        """Back-propagates through the last :meth:`forward`, consuming its cache.

        Parameters
        ----------
        dy : array_like
            Gradient of the loss with respect to the forward's y (its shape;
            a torch tensor as x in :meth:`forward`).

        Returns
        -------
        dx : ndarray
            Gradient with respect to the forward's x: its shape, y's dtype.

        Raises
        ------
        RuntimeError
            No forward cache: no forward has run, or a backward has used
            the last one's already. Call :meth:`forward` again first.
        ValueError
            dy does not have the forward's x's shape.

        Notes
        -----
        Replaces ``grads`` with ``{"weight": dweight}`` (empty without a
        weight), dweight of ``normalized_shape`` in x's compute dtype. Frees
        the forward's cache: each forward serves one backward. A backward
        that raises leaves the cache as it was.
        """
        x, rstd = self._take_cache()
        dx, dw = _norms.rms_norm_backward(dy, x, rstd, self.weight, axis=self._axis())
        self._cache = None
        self.grads = {"weight": dw} if self.weight is not None else {}
        return dx
