"""Layer objects over the functional kernels: LayerNorm and RMSNorm."""
import numbers

import numpy as np

from fastln import _core


def _shape(normalized_shape):
    if isinstance(normalized_shape, numbers.Integral):
        shape = (int(normalized_shape),)
    else:
        shape = tuple(int(n) for n in normalized_shape)
    if not shape or any(n < 1 for n in shape):
        raise ValueError(f"normalized_shape must be positive sizes, got {normalized_shape!r}")
    return shape


def _axes(shape):
    return tuple(range(-len(shape), 0))


def _as_numpy(v):
    """An ndarray from an array-like or a torch tensor."""
    if hasattr(v, "detach"):
        v = v.detach().cpu().numpy()
    return np.asarray(v)


class _Norm:
    """What LayerNorm and RMSNorm share: parameters, state_dict, the cache."""

    _param_names = ()

    def __init__(self, normalized_shape, eps, dtype):
        self.normalized_shape = _shape(normalized_shape)
        self.eps = float(eps)
        self.dtype = np.dtype(dtype)
        if self.dtype.kind != "f":
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
        """Loads parameters by PyTorch name; values may be arrays or torch tensors."""
        expected = {k for k in self._param_names if getattr(self, k) is not None}
        missing, unexpected = expected - set(state), set(state) - expected
        if missing or unexpected:
            raise KeyError(f"state_dict mismatch: missing {sorted(missing)}, "
                           f"unexpected {sorted(unexpected)}")
        for k in expected:
            v = _as_numpy(state[k])
            if v.shape != self.normalized_shape:
                raise ValueError(f"{k} has shape {v.shape}, expected {self.normalized_shape}")
            setattr(self, k, v.astype(self.dtype, copy=True))

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

    def forward(self, x):
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

    def forward(self, x):
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
