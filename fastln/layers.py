"""Layer objects over the functional kernels: LayerNorm and RMSNorm."""
import numbers

import numpy as np

from fastln import _api, _core, _torch


def _shape(normalized_shape):
    """normalized_shape (an int or a sequence of ints) as a tuple of positive ints."""
    def is_int(n):
        return isinstance(n, numbers.Integral) and not isinstance(n, (bool, np.bool_))
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


def _axes(shape):
    """The trailing axes: -1 itself for one axis (the kernels' fast path takes a plain int)."""
    return -1 if len(shape) == 1 else tuple(range(-len(shape), 0))


class _Norm:
    """What LayerNorm and RMSNorm share: parameters, state_dict, the cache."""

    _param_names = ()

    def __init__(self, normalized_shape, eps, dtype):
        self.normalized_shape = _shape(normalized_shape)
        self.eps = _api._check_eps(eps)
        self.dtype = np.dtype(dtype)
        if self.dtype.kind != "f" and self.dtype not in _api._LOW_PRECISION:
            raise TypeError(f"dtype must be a floating dtype, got {self.dtype}")
        self.grads = {}
        self._cache = None

    def _axis(self):
        return _axes(self.normalized_shape)

    def state_dict(self):
        """Parameters under PyTorch's names: a dict of ndarray copies."""
        return {k: getattr(self, k).copy() for k in self._param_names
                if getattr(self, k) is not None}

    def load_state_dict(self, state):
        """Loads parameters by PyTorch name; values may be arrays or torch tensors.
        On error nothing is changed."""
        if not hasattr(state, "keys"):
            raise TypeError(f"state_dict must be a mapping, got {type(state).__name__}")
        expected = {k for k in self._param_names if getattr(self, k) is not None}
        missing, unexpected = expected - set(state.keys()), set(state.keys()) - expected
        if missing or unexpected:
            raise KeyError(f"state_dict mismatch: missing {sorted(missing)}, "
                           f"unexpected {sorted(unexpected)}")
        new = {}
        for k in expected:
            v = _api._real_array(_torch.to_numpy(state[k]), f"state_dict[{k!r}]")
            if v.shape != self.normalized_shape:
                raise ValueError(f"state_dict[{k!r}] has shape {v.shape}, "
                                 f"expected {self.normalized_shape}")
            new[k] = v.astype(self.dtype, copy=True)
        for k, v in new.items():
            setattr(self, k, v)

    def _check_input(self, x):
        """x's trailing axes must be normalized_shape (also without weights)."""
        shape = getattr(x, "shape", None)
        if shape is None:
            x = np.asarray(x)
            shape = x.shape
        n = len(self.normalized_shape)
        if tuple(shape[len(shape) - n:]) != self.normalized_shape or len(shape) < n:
            raise ValueError(f"x must end in the normalized shape {self.normalized_shape}, "
                             f"got shape {tuple(shape)}")
        return x

    def __call__(self, x):
        return self.forward(x)

    def __repr__(self):
        return (f"{type(self).__name__}({self.normalized_shape}, eps={self.eps}, "
                f"dtype={self.dtype.name})")


class LayerNorm(_Norm):
    """Layer normalization over the trailing ``normalized_shape`` axes.

    Parameters
    ----------
    normalized_shape : int or tuple of int
        The trailing shape normalized together.
    eps : float
        Added to the variance.
    elementwise_affine : bool
        Learn a gain ``weight`` (ones) and, with ``bias=True``, a ``bias`` (zeros).
    bias : bool
        Whether the affine part has a bias.
    dtype : dtype
        Parameter dtype.

    ``forward(x)`` (or calling the layer) keeps what ``backward(dy)`` needs:
    a reference to x (not a copy, so x must not change in between) and the
    row statistics. ``backward`` returns dx and fills ``grads`` ("weight",
    "bias"), float32 for float16 parameters.
    """

    _param_names = ("weight", "bias")

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 dtype=np.float32):
        super().__init__(normalized_shape, eps, dtype)
        self.elementwise_affine = bool(elementwise_affine)
        self.weight = np.ones(self.normalized_shape, self.dtype) if elementwise_affine else None
        self.bias = (np.zeros(self.normalized_shape, self.dtype)
                     if elementwise_affine and bias else None)

    @classmethod
    def from_torch(cls, module):
        """A LayerNorm with the configuration and parameters of a torch module.

        Parameters
        ----------
        module : torch.nn.LayerNorm

        Returns
        -------
        LayerNorm
            The same ``normalized_shape``, ``eps``, affine parameters (copied)
            and dtype as ``module``; its output matches ``module(x)`` to
            rounding.

        Examples
        --------
        >>> import torch, fastln
        >>> t = torch.nn.LayerNorm(8)
        >>> fastln.LayerNorm.from_torch(t)
        LayerNorm((8,), eps=1e-05, dtype=float32)
        """
        _torch.check_module(module, "LayerNorm")
        layer = cls(tuple(module.normalized_shape), eps=module.eps,
                    elementwise_affine=module.elementwise_affine,
                    bias=module.bias is not None, dtype=_torch.module_dtype(module))
        layer.load_state_dict(module.state_dict())
        return layer

    def forward(self, x):
        x = self._check_input(x)
        y, mean, rstd = _core.layer_norm(x, self.weight, self.bias, axis=self._axis(),
                                         eps=self.eps, return_stats=True)
        self._cache = (x, mean, rstd)
        return y

    def backward(self, dy):
        if self._cache is None:
            raise RuntimeError("backward called before forward")
        x, mean, rstd = self._cache
        dx, dw, db = _core.layer_norm_backward(dy, x, mean, rstd, self.weight,
                                               axis=self._axis())
        self.grads = {}
        if self.weight is not None:
            self.grads["weight"] = dw
        if self.bias is not None:
            self.grads["bias"] = db
        return dx


class RMSNorm(_Norm):
    """RMS normalization over the trailing ``normalized_shape`` axes.

    Same interface as :class:`LayerNorm`, with a gain ``weight`` only.
    """

    _param_names = ("weight",)

    def __init__(self, normalized_shape, eps=1e-6, elementwise_affine=True, dtype=np.float32):
        super().__init__(normalized_shape, eps, dtype)
        self.elementwise_affine = bool(elementwise_affine)
        self.weight = np.ones(self.normalized_shape, self.dtype) if elementwise_affine else None

    @classmethod
    def from_torch(cls, module):
        """An RMSNorm with the configuration and parameters of a torch module.

        Parameters
        ----------
        module : torch.nn.RMSNorm
            With ``eps=None`` torch uses the machine epsilon of the input's
            dtype; the layer takes that of the module's parameter dtype
            (float32 when it has none), ``np.finfo(dtype).eps``.

        Returns
        -------
        RMSNorm
            The same ``normalized_shape``, ``eps``, weight (copied) and dtype
            as ``module``.

        Examples
        --------
        >>> import torch, fastln
        >>> fastln.RMSNorm.from_torch(torch.nn.RMSNorm(8, eps=1e-6))
        RMSNorm((8,), eps=1e-06, dtype=float32)
        """
        _torch.check_module(module, "RMSNorm")
        dtype = _torch.module_dtype(module)
        eps = module.eps if module.eps is not None else float(np.finfo(dtype).eps)
        layer = cls(tuple(module.normalized_shape), eps=eps,
                    elementwise_affine=module.elementwise_affine, dtype=dtype)
        layer.load_state_dict(module.state_dict())
        return layer

    def forward(self, x):
        x = self._check_input(x)
        y, rstd = _core.rms_norm(x, self.weight, axis=self._axis(), eps=self.eps,
                                 return_stats=True)
        self._cache = (x, rstd)
        return y

    def backward(self, dy):
        if self._cache is None:
            raise RuntimeError("backward called before forward")
        x, rstd = self._cache
        dx, dw = _core.rms_norm_backward(dy, x, rstd, self.weight, axis=self._axis())
        self.grads = {"weight": dw} if self.weight is not None else {}
        return dx
