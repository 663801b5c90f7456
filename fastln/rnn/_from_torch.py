"""Loading torch modules into the recurrent models: torch.nn.LSTM, GRU and
RNN into the plain models, and PyTorch's benchmark LayerNormLSTMCell
(benchmarks/fastrnns/custom_lstms.py) into LNLSTM, for the models'
from_torch methods."""
from __future__ import annotations

import re
import warnings
from typing import Any, Dict, Optional, Type, TypeVar

import numpy as np

from .. import _torch
from ._bf16 import _is_bf16
from ._params import DIRECTIONS
from .base import RecurrentModel

_BENCH_KEY = re.compile(r"^(?:layers\.(\d+)\.)?(?:cell\.)?"
                        r"(weight_ih|weight_hh|layernorm_[ihc]\.(?:weight|bias))$")
_BENCH_NAMES = {"weight_ih": "weight_ih", "weight_hh": "weight_hh",
                "layernorm_i.weight": "ln_ih_weight", "layernorm_i.bias": "ln_ih_bias",
                "layernorm_h.weight": "ln_hh_weight", "layernorm_h.bias": "ln_hh_bias",
                "layernorm_c.weight": "ln_c_weight", "layernorm_c.bias": "ln_c_bias"}


_M = TypeVar("_M", bound=RecurrentModel[Any])


def rnn_from_torch(cls: Type[_M], module: Any, extra: Dict[str, Any]) -> _M:
    """A model of class cls (LSTM, GRU or RNN; extra: its further arguments)
    of module's sizes and directions whose parameters are module's, the two
    biases of each layer summed where the cell's equations allow (in
    float64, then rounded once)."""
    if getattr(module, "proj_size", 0):
        raise ValueError("module must be without proj_size")
    dtype = _torch.module_dtype(module)
    if dtype not in (np.float32, np.float64) and not _is_bf16(dtype):
        raise TypeError(f"module has dtype {dtype}; fastln's RNN engine runs float32, "
                        f"float64 or bfloat16: convert it first, e.g. module.float()")
    if module.num_layers > 1 and module.dropout:
        warnings.warn(f"module has dropout={module.dropout} between layers; fastln's "
                      f"RNNs apply no dropout (as torch in eval mode)", stacklevel=3)
    model = cls(module.input_size, module.hidden_size, module.num_layers,
                module.batch_first, dtype=dtype, bidirectional=bool(module.bidirectional),
                **extra)
    sd = {k: _torch.to_numpy(v) for k, v in module.state_dict().items()}
    H, state = model.hidden_size, {}
    for k in range(model.num_layers):
        for sfx in DIRECTIONS[:model.num_directions]:
            layer = f"_l{k}{sfx}"
            state["weight_ih" + layer] = sd["weight_ih" + layer]
            state["weight_hh" + layer] = sd["weight_hh" + layer]
            b_ih = b_hh = np.zeros(model.params["weight_ih" + layer].shape[0])
            if module.bias:
                b_ih = sd["bias_ih" + layer].astype(np.float64)
                b_hh = sd["bias_hh" + layer].astype(np.float64)
            if "bias_hn" + layer in model.params:   # a GRU: b_hn stays inside r * (...)
                state["bias" + layer] = np.concatenate([b_ih[:2 * H] + b_hh[:2 * H],
                                                        b_ih[2 * H:]])
                state["bias_hn" + layer] = b_hh[2 * H:]
            else:
                state["bias" + layer] = b_ih + b_hh
    model.load_state_dict(state)
    return model


def lnlstm_from_torch(cls: Type[_M], module: Any, eps: Optional[float] = None) -> _M:
    """An LNLSTM (cls) of PyTorch's benchmark LN-LSTM: see LNLSTM.from_torch."""
    if hasattr(module, "state_dict") and callable(module.state_dict):
        state = module.state_dict()
        if eps is None:   # a torch LayerNorm's eps; the benchmark's own LayerNorm has none
            lns = [m for n, m in module.named_modules() if n.endswith("layernorm_i")]
            eps = getattr(lns[0], "eps", 0.0) if lns else 1e-5
    elif hasattr(module, "keys"):
        state = module
    else:
        raise TypeError(f"module must be a torch module or a state_dict mapping, "
                        f"got {type(module).__name__}")
    layers: Dict[int, Dict[str, Any]] = {}
    unmapped = []
    for key, value in state.items():
        m = _BENCH_KEY.match(key)
        if m is None:
            unmapped.append(key)
            continue
        layers.setdefault(int(m.group(1) or 0), {})[_BENCH_NAMES[m.group(2)]] = value
    if unmapped or not layers:
        raise ValueError(f"module's parameters do not map to LNLSTM's: unmapped keys "
                         f"{sorted(unmapped)}; expected the names of the benchmark "
                         f"LayerNormLSTMCell (weight_ih, weight_hh, layernorm_i/h/c.weight, "
                         f".bias), optionally under layers.{{k}}.cell.")
    if sorted(layers) != list(range(len(layers))):
        raise ValueError(f"module's layers must be numbered 0..n-1, got {sorted(layers)}")
    first = {k: _torch.to_numpy(v) for k, v in layers[0].items()}
    if "weight_ih" not in first or "weight_hh" not in first:
        raise ValueError("module must have weight_ih and weight_hh")
    dtype = first["weight_ih"].dtype
    if dtype not in (np.float32, np.float64) and not _is_bf16(dtype):
        raise TypeError(f"module has dtype {dtype}; the RNN engine runs float32, float64 "
                        f"or bfloat16")
    H, I = first["weight_hh"].shape[1], first["weight_ih"].shape[1]
    model = cls(I, H, len(layers), eps=1e-5 if eps is None else eps, dtype=dtype)
    new = model.state_dict()   # starts from the defaults: LNLSTM's bias (none there) is 0
    for k, params in layers.items():
        new.update({f"{name}_l{k}": _torch.to_numpy(v) for name, v in params.items()})
    model.load_state_dict(new)
    return model
