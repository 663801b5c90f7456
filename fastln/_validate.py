"""The argument checks that fastln's modules share.

Arrays and torch tensors read with errors that name the argument, flags, eps,
the normalized axes, and RMSNorm's refusal of a bias. The public functions'
general path (fastln._general), the layers, the recurrent models and
fastln.dask use them, so that one argument gets the same error everywhere.

A CPU torch tensor that does not require grad is read as an ndarray sharing
its memory (fastln has no autograd and returns NumPy arrays); one that
requires grad, or lives on another device, is refused.

Imports fastln._dtypes and fastln._torch.
"""
from __future__ import annotations

import functools
import inspect
import numbers
import operator
from typing import Any, Callable, NoReturn, Sequence, Tuple, TypeVar, cast

import numpy as np
import numpy.typing as npt

from fastln import _dtypes, _torch

_Array = npt.NDArray[Any]


def flag(value: Any, name: str) -> bool:
    """value as a bool: flags take True or False (NumPy's bools too), not
    truthy values such as "yes" or 1."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def positive_int(value: Any, name: str) -> int:
    """value as an int of at least 1 (not a bool), else a TypeError or ValueError naming it."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return int(value)


def proj_size(value: Any, hidden_size: Any) -> int:
    """An LSTM's proj_size as an int in [0, hidden_size), as torch.nn.LSTM
    takes it, else a TypeError or ValueError naming it."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"proj_size must be an int, got {type(value).__name__}")
    P = int(value)
    if not 0 <= P < hidden_size:
        raise ValueError(f"proj_size must be in [0, hidden_size) = [0, {hidden_size}), "
                         f"got {P}")
    return P


def choice(value: Any, name: str, options: Sequence[str]) -> str:
    """value as one of the strings options, else a ValueError naming it."""
    if not isinstance(value, str) or value not in options:
        quoted = [repr(o) for o in options]
        raise ValueError(f"{name} must be {', '.join(quoted[:-1])} or {quoted[-1]}, "
                         f"got {value!r}")
    return value


def nonlinearity(value: Any) -> str:
    """value as an RNN cell's activation, 'tanh' or 'relu', else a ValueError."""
    return choice(value, "nonlinearity", ("tanh", "relu"))


def check_eps(eps: Any) -> float:
    """eps as a float: a real number (not a bool), finite and >= 0."""
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a real number, got {type(eps).__name__}")
    e = float(eps)
    if not np.isfinite(e) or e < 0:
        raise ValueError(f"eps must be finite and >= 0, got {eps!r}")
    return e


# ---- arrays and torch tensors ------------------------------------------------

def _cpu_tensor(t: Any, name: str, detach: str, cpu: str) -> None:
    """A TypeError naming ``name`` unless t is a tensor on the CPU that does not
    require grad; ``detach`` and ``cpu`` end the two messages."""
    if getattr(t, "requires_grad", False):
        raise TypeError(f"{name} is a torch tensor that requires grad, and fastln does not "
                        f"autograd{detach}")
    device = getattr(t, "device", None)
    if device is not None and getattr(device, "type", "cpu") != "cpu":
        raise TypeError(f"{name} is a torch tensor on device {device}; {cpu}")


def tensor(t: Any, name: str) -> _Array:
    """A torch tensor as an ndarray (sharing its memory where NumPy has its
    dtype; bfloat16 becomes an ml_dtypes.bfloat16 copy)."""
    _cpu_tensor(t, name, f" (it returns NumPy arrays); pass {name}.detach() to use its values",
                f"fastln runs on the CPU: pass {name}.cpu()")
    if str(t.dtype) == "torch.bfloat16":
        return _torch.to_numpy(t)
    try:
        return np.asarray(t.numpy())
    except (RuntimeError, TypeError, ValueError) as e:
        raise TypeError(f"{name} is a torch tensor that NumPy cannot read: {e}") from None


def asarray(a: Any, name: str) -> _Array:
    """np.asarray(a), with NumPy's errors for non-arrays (ragged lists, ...) naming the
    argument; torch tensors through :func:`tensor`."""
    if _torch.is_tensor(a):
        return tensor(a, name)
    try:
        return np.asarray(a)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{name} cannot be read as an array: {e}") from None


def real_array(a: Any, name: str) -> _Array:
    """a as an ndarray of a real (float, int, bool) dtype, else TypeError naming it."""
    arr = asarray(a, name)
    if arr.dtype.kind not in "fiub" and not _dtypes.is_half(arr.dtype):
        raise TypeError(f"{name} must be a real floating array, got dtype {arr.dtype}")
    return arr


def out_array(out: Any, name: str) -> Any:
    """out, with a CPU torch tensor as the ndarray that shares its memory (a
    bfloat16 tensor as an ml_dtypes.bfloat16 view of its bits), so that the
    results are written into the tensor."""
    if not _torch.is_tensor(out):
        return out
    _cpu_tensor(out, name, f"; pass {name}.detach() (it shares the tensor's memory)",
                "fastln writes CPU memory only")
    try:
        if str(out.dtype) == "torch.bfloat16":
            import torch
            return out.view(torch.int16).numpy().view(_dtypes.bfloat16("a bfloat16 tensor"))
        return out.numpy()
    except (RuntimeError, TypeError, ValueError) as e:
        raise TypeError(f"{name} is a torch tensor that NumPy cannot write: {e}") from None


def normalize_axes(axis: Any, ndim: int) -> Tuple[int, ...]:
    """axis (int or tuple of ints) as a tuple of non-negative axes, in order."""
    axes: Tuple[int, ...]
    try:
        axes = (operator.index(axis),)
    except TypeError:
        try:
            axes = tuple(operator.index(a) for a in axis)
        except TypeError:
            raise TypeError(f"axis must be an int or a tuple of ints, got {axis!r}") from None
    if not axes:
        raise ValueError("axis must name at least one axis")
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(f"axis {a} is out of bounds for an array of dimension {ndim}")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"axis {axis!r} contains a duplicate axis")
    return tuple(out)


# ---- RMSNorm has no bias: a bias passed positionally is a TypeError that names
# the LayerNorm function, which takes one

_F = TypeVar("_F", bound=Callable[..., Any])

# each RMSNorm function's counterpart with a bias, in the same module
_WITH_BIAS = {"rms_norm": "layer_norm(x, weight, bias)",
              "add_rms_norm": "add_layer_norm(x, residual, weight, bias)"}


def _positional(func: Callable[..., Any]) -> list[str]:
    """The names of func's parameters that a call may pass by position."""
    return [p.name for p in inspect.signature(func).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def no_bias(func: Callable[..., Any], extra: Sequence[Any]) -> NoReturn:
    """Raise the TypeError of a call of func, an RMSNorm function, that passed
    ``extra`` positional arguments past func's own (a bias, as a LayerNorm call
    passes it). A function of a private module is named as fastln's, which
    exports it."""
    names = _positional(func)
    module = func.__module__
    if module.rpartition(".")[2].startswith("_"):
        module = "fastln"
    raise TypeError(
        f"{func.__name__}() takes at most {len(names)} positional arguments "
        f"({', '.join(names)}) but {len(names) + len(extra)} were given: RMSNorm has no "
        f"bias; {module}.{_WITH_BIAS[func.__name__]} is the norm with one")


def hide_bias(func: _F) -> _F:
    """func, a Cython function whose ``*bias`` parameter takes a positional
    bias only to raise :func:`no_bias`'s error, with the signature of the
    arguments it accepts: ``*`` in place of ``*bias``, in
    ``inspect.signature`` and in the signature line Cython embeds in the
    docstring."""
    sig = inspect.signature(func)
    func.__signature__ = sig.replace(parameters=[  # type: ignore[attr-defined]
        p for p in sig.parameters.values() if p.kind is not p.VAR_POSITIONAL])
    func.__doc__ = (func.__doc__ or "").replace(", *bias, ", ", *, ", 1)
    return func


def takes_no_bias(func: _F) -> _F:
    """func, a Python RMSNorm function, wrapped to raise :func:`no_bias`'s
    error where a call passes more positional arguments than func takes."""
    n = len(_positional(func))

    @functools.wraps(func)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if len(args) > n:
            no_bias(func, args[n:])
        return func(*args, **kwargs)
    return cast(_F, checked)
