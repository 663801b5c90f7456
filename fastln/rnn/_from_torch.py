"""Loading torch modules into the recurrent models, for their from_torch
methods: torch.nn.LSTM, GRU and RNN into the plain models, and the LN-LSTMs
of PyTorch's fastrnns benchmark, NeMo and torchaudio into LNLSTM, each with
the options of its cell."""
from __future__ import annotations

import re
import warnings
from typing import Any, Dict, NamedTuple, Optional, Tuple, Type, TypeVar

import numpy as np

from .. import _torch
from ._bf16 import _is_bf16
from ._params import DIRECTIONS
from .base import RecurrentModel

_M = TypeVar("_M", bound=RecurrentModel[Any])


def rnn_from_torch(cls: Type[_M], module: Any, extra: Dict[str, Any]) -> _M:
    """A model of class cls (LSTM, GRU or RNN; extra: its further arguments)
    of module's sizes and directions whose parameters are module's, the two
    biases of each layer summed where the cell's equations allow (in
    float64, then rounded once)."""
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
            if model.proj_size:
                state["weight_hr" + layer] = sd["weight_hr" + layer]
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


class _Layout(NamedTuple):
    """An LN-LSTM implementation's parameters: the keys of one layer (``prefix``
    with the layer's number as its group, then a name of ``names``), fastln's
    name of each, the LNLSTM options that give its cell, the names of its
    LayerNorm modules (whose eps the model takes) and the eps of a bare
    state_dict (None: eps must be given)."""
    name: str
    prefix: str
    names: Dict[str, str]
    options: Dict[str, Any]
    norms: Tuple[str, ...]
    eps: Optional[float]


_LN_PAIR = {"layernorm_i.weight": "ln_ih_weight", "layernorm_i.bias": "ln_ih_bias",
            "layernorm_h.weight": "ln_hh_weight", "layernorm_h.bias": "ln_hh_bias",
            "layernorm_c.weight": "ln_c_weight", "layernorm_c.bias": "ln_c_bias"}
_NORMALIZED_C = {"carry": "normalized", "gate_bias": False}
_CUSTOM_LSTM_PREFIX = r"(?:lstm_layers\.)?(?:(\d+)\.)?"
_LAYOUTS = (
    # PyTorch's benchmarks/fastrnns/custom_lstms.py and NeMo's
    # collections/common/parts/rnn.py: LayerNormLSTMCell, in LSTMLayer (.cell)
    # in StackedLSTM (.layers)
    _Layout("LayerNormLSTMCell", r"(?:layers\.(\d+)\.)?(?:cell\.)?",
            {"weight_ih": "weight_ih", "weight_hh": "weight_hh", **_LN_PAIR},
            {"gate_norm": "pair", **_NORMALIZED_C},
            ("layernorm_i", "layernorm_h", "layernorm_c"), 1e-5),
    # torchaudio's models/rnnt.py: _CustomLSTM(layer_norm=True), alone or in a
    # ModuleList such as the RNN-T predictor's lstm_layers
    _Layout("torchaudio _CustomLSTM", _CUSTOM_LSTM_PREFIX,
            {"x2g.weight": "weight_ih", "p2g.weight": "weight_hh", "g_norm.weight": "ln_weight",
             "g_norm.bias": "ln_bias", "c_norm.weight": "ln_c_weight",
             "c_norm.bias": "ln_c_bias"},
            {"gate_norm": "sum", **_NORMALIZED_C}, ("g_norm", "c_norm"), None),
)
# _CustomLSTM(layer_norm=False): x2g has a bias, and there is no LayerNorm
_PLAIN_CUSTOM_LSTM = re.compile(f"^{_CUSTOM_LSTM_PREFIX}" r"(?:x2g\.(?:weight|bias)|p2g\.weight)$")


def _layers(layout: _Layout, state: Any) -> Optional[Dict[int, Dict[str, Any]]]:
    """{layer number: {fastln's name: value}} of state's entries under layout,
    or None where state is empty or has a key that does not fit it."""
    key = re.compile(f"^{layout.prefix}({'|'.join(map(re.escape, layout.names))})$")
    layers: Dict[int, Dict[str, Any]] = {}
    for name, value in state.items():
        m = key.match(name)
        if m is None:
            return None
        layers.setdefault(int(m.group(1) or 0), {})[layout.names[m.group(2)]] = value
    return layers or None


def _module_eps(layout: _Layout, module: Any) -> Optional[float]:
    """The eps of module's LayerNorms of layout (0 for a LayerNorm without
    one, such as the fastrnns benchmark's decomposed LayerNorm), one for all."""
    found = {float(getattr(m, "eps", 0.0)) for name, m in module.named_modules()
             if name.rsplit(".", 1)[-1] in layout.norms}
    if len(found) > 1:
        raise ValueError(f"module's LayerNorms have different eps {sorted(found)}; an "
                         f"LNLSTM has one: pass eps to choose it")
    return found.pop() if found else layout.eps


def lnlstm_from_torch(cls: Type[_M], module: Any, eps: Optional[float] = None) -> _M:
    """An LNLSTM (cls) of an LN-LSTM's torch module or state_dict: see
    LNLSTM.from_torch."""
    if hasattr(module, "state_dict") and callable(module.state_dict):
        state = module.state_dict()
    elif hasattr(module, "keys"):
        state, module = module, None
    else:
        raise TypeError(f"module must be a torch module or a state_dict mapping, "
                        f"got {type(module).__name__}")
    for layout in _LAYOUTS:
        layers = _layers(layout, state)
        if layers is not None:
            break
    else:
        if state and all(_PLAIN_CUSTOM_LSTM.match(k) for k in state):
            raise ValueError("module is torchaudio's _CustomLSTM without layer_norm, a plain "
                             "LSTM: load it into fastln.rnn.LSTM, its x2g.weight, p2g.weight "
                             "and x2g.bias as weight_ih_l{k}, weight_hh_l{k} and bias_l{k} "
                             "(load_state_dict)")
        raise ValueError(f"module's parameters do not map to LNLSTM's: keys "
                         f"{sorted(state)[:8]}; expected those of a LayerNormLSTMCell "
                         f"(PyTorch's fastrnns benchmark, NeMo: weight_ih, weight_hh, "
                         f"layernorm_i/h/c.weight and .bias, optionally under "
                         f"layers.{{k}}.cell.) or of torchaudio's _CustomLSTM (x2g.weight, "
                         f"p2g.weight, g_norm and c_norm .weight and .bias, optionally under "
                         f"{{k}}. or lstm_layers.{{k}}.)")
    if eps is None:
        eps = layout.eps if module is None else _module_eps(layout, module)
        if eps is None:
            raise ValueError(f"eps must be given with a state_dict of {layout.name}: its "
                             f"LayerNorms' eps (1e-3 in torchaudio's emformer_rnnt_base)")
    if sorted(layers) != list(range(len(layers))):
        raise ValueError(f"module's layers must be numbered 0..n-1, got {sorted(layers)}")
    if any("weight_ih" not in p or "weight_hh" not in p for p in layers.values()):
        raise ValueError(f"module must have the input and hidden weights of {layout.name} "
                         f"in every layer")
    first = {k: _torch.to_numpy(v) for k, v in layers[0].items()}
    dtype = first["weight_ih"].dtype
    if dtype not in (np.float32, np.float64) and not _is_bf16(dtype):
        raise TypeError(f"module has dtype {dtype}; the RNN engine runs float32, float64 "
                        f"or bfloat16")
    H, I = first["weight_hh"].shape[1], first["weight_ih"].shape[1]
    model = cls(I, H, len(layers), eps=eps, dtype=dtype, **layout.options)
    new = model.state_dict()   # starts from the defaults, for entries the state lacks
    for k, params in layers.items():
        new.update({f"{name}_l{k}": _torch.to_numpy(v) for name, v in params.items()})
    model.load_state_dict(new)
    return model
