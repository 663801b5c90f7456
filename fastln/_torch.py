"""Reading torch modules and tensors without importing torch (fastln never
depends on it): what the ``from_torch`` constructors and ``load_state_dict``
share."""
from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from . import _dtypes


def is_tensor(v: Any) -> bool:
    return type(v).__module__.startswith("torch") and hasattr(v, "detach")


def to_numpy(v: Any) -> npt.NDArray[Any]:
    """An ndarray from an array-like or a torch tensor (a copy for tensors;
    bfloat16 tensors become ml_dtypes.bfloat16 arrays)."""
    if not is_tensor(v):
        return np.asarray(v)
    v = v.detach().cpu()
    if str(v.dtype) == "torch.bfloat16":
        return np.asarray(v.float().numpy()).astype(_dtypes.bfloat16("a bfloat16 tensor"))
    return np.array(v.numpy())


def module_dtype(module: Any, default: npt.DTypeLike = np.float32) -> np.dtype[Any]:
    """The NumPy dtype of a module's first floating parameter, or default."""
    for p in module.parameters():
        if p.dtype.is_floating_point:
            return to_numpy(p.detach()[:0]).dtype
    return np.dtype(default)


def check_module(module: Any, class_name: str, name: str = "module") -> None:
    """TypeError unless module is a torch.nn.<class_name> (or a subclass)."""
    mro = [f"{c.__module__}.{c.__qualname__}" for c in type(module).__mro__]
    if not any(m.startswith("torch.") and m.endswith("." + class_name) for m in mro):
        raise TypeError(f"{name} must be a torch.nn.{class_name}, got {type(module).__name__}")
