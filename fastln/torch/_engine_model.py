"""fastln.rnn models on a fastln.torch module's weights, and modules on a
model's: the conversions both ways, int8 quantization, and the calls that
run on a model (the bfloat16 and int8 forwards, which have no autograd, and
the streaming step)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from .. import _dtypes
from .. import rnn as _rnn
from ..rnn import functional


def _key(module: Any) -> Tuple[Any, ...]:
    """What a model built from module depends on: its tensors' memory and
    versions (an inference-mode tensor has no version: it is changed in
    place only inside inference mode, which the model does not see)."""
    return tuple((t.data_ptr(), None if t.is_inference() else t._version, t.dtype)
                 for t in (*module._parameters.values(), *module._buffers.values()))


def _to_numpy(t: Tensor) -> Any:
    """t as an ndarray on its memory; a bfloat16 tensor as float32 (exactly)."""
    t = t.detach()
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


def _model_keys(module: Any, k: int, d: int) -> List[str]:
    sfx = module._suffix(k, d)
    return [name + sfx for name in functional.param_names(module.cell)]


def build(module: Any, share: bool, batch_first: Optional[bool] = None) -> Any:
    """The fastln.rnn model on module's weights (see RecurrentModule.to_rnn);
    share: float parameters as NumPy views of the module's (else copies)."""
    w = module._weight()
    if module.quantized:
        dtype: Any = np.float32
    elif w.dtype == torch.bfloat16:
        dtype = _dtypes.bfloat16("a bfloat16 module's fastln.rnn model")
    else:
        dtype = np.float32 if w.dtype == torch.float32 else np.float64
    model = module._rnn_class(module.input_size, module.hidden_size, module.num_layers,
                              batch_first=module.batch_first if batch_first is None
                              else batch_first, dtype=dtype,
                              bidirectional=module.bidirectional, **module._rnn_kwargs())
    if module.quantized:
        for name, buf in module.named_buffers(recurse=False):
            if buf.dtype not in (torch.int8, torch.float32):
                raise TypeError(f"the int8 module's buffer {name} has dtype {buf.dtype}: an "
                                f"int8 module keeps its scales and LayerNorm parameters in "
                                f"float32 (do not convert it with .to())")
        model = _rnn.quantize(model)
        model.load_state_dict({name: buf.numpy() for name, buf in module.named_buffers()})
        return model
    values: Dict[str, Any] = {}
    with torch.no_grad():
        for k in range(module.num_layers):
            for d in range(module.num_directions):
                for key, p in zip(_model_keys(module, k, d), module._engine_params(k, d)):
                    if key in model.params:   # not a bias the model goes without
                        values[key] = _to_numpy(p)
    if share and dtype in (np.float32, np.float64):
        model.params.update(values)
    else:   # copies, as a bfloat16 model stores them
        model.load_state_dict(values)
    return model


def _cached(module: Any) -> Any:
    """The time-major model the module's calls run on, rebuilt when a
    parameter changes (the optimizer's in-place updates bump its version)."""
    key = _key(module)
    hit = module._engine_models.get("model")
    if hit is None or hit[0] != key:
        hit = module._engine_models["model"] = (key, build(module, share=False,
                                                           batch_first=False))
    return hit[1]


def _inference_only(module: Any, *tensors: Optional[Tensor]) -> None:
    if torch.is_grad_enabled() and (
            any(t is not None and t.requires_grad for t in tensors)
            or any(p.requires_grad for p in module._parameters.values())):
        kind = "int8" if module.quantized else "bfloat16"
        raise TypeError(f"a {kind} module runs fastln's {kind} inference engine, which has no "
                        f"backward: call it under torch.no_grad(), or train in float32")


def _tensor(a: Any) -> Tensor:
    if _dtypes.is_half(a.dtype):
        return torch.from_numpy(np.ascontiguousarray(a).view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _state_arrays(states: List[Optional[Tensor]], has_cell: bool) -> Any:
    arrays = [None if s is None else s.detach().numpy() for s in states]
    return tuple(arrays) if has_cell else arrays[0]


def _state_tensors(state: Any, has_cell: bool) -> List[Tensor]:
    return [torch.from_numpy(s) for s in (state if has_cell else (state,))]


def forward(module: Any, x: Tensor, states: List[Optional[Tensor]],
            lengths: Optional[Tensor]) -> Tuple[Tensor, List[Tensor]]:
    """A forward without autograd on module's model, time-major: every call
    of a bfloat16 or int8 module, and a float module's inference."""
    _inference_only(module, x, *states)
    y, state = _cached(module).forward(_to_numpy(x),
                                       _state_arrays(states, module._has_cell),
                                       lengths=None if lengths is None else lengths.numpy(),
                                       cache=False)
    return _tensor(y), _state_tensors(state, module._has_cell)


def step(module: Any, input: Tensor, hx: Any) -> Tuple[Tensor, Any]:
    """One step of module on its model (see RecurrentModule.step)."""
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input must be a torch.Tensor, got {type(input).__name__}")
    module._check_tensor(input, "input")
    if input.dim() != 2 or input.shape[1] != module.input_size:
        raise ValueError(f"input must have shape (B, input_size) = (B, {module.input_size}), "
                         f"got {tuple(input.shape)}")
    states = module._states(hx, input.shape[0], False)
    y, state = _cached(module).step(_to_numpy(input),
                                    _state_arrays(states, module._has_cell))
    finals = _state_tensors(state, module._has_cell)
    return _tensor(y), (tuple(finals) if module._has_cell else finals[0])


def _torch_dtype(model: Any) -> Tuple[torch.dtype, bool]:
    """The module dtype of model, and whether model is int8."""
    if model.params["weight_ih_l0"].dtype == np.int8:
        return torch.float32, True
    if _dtypes.is_half(model.dtype):
        return torch.bfloat16, False
    return (torch.float32 if model.dtype == np.float32 else torch.float64), False


def _parameter(a: Any, dtype: torch.dtype) -> torch.nn.Parameter:
    """a as a parameter of dtype, on a's memory where a is a writable array
    of that dtype, C-contiguous or a Fortran-ordered matrix (a copy keeps a's
    order)."""
    if _dtypes.is_half(a.dtype):
        return torch.nn.Parameter(_tensor(np.array(a, order="K")))
    if (a.flags.c_contiguous or a.flags.f_contiguous) and a.flags.writeable and \
            a.dtype.isnative and torch.from_numpy(a[:0]).dtype == dtype:
        return torch.nn.Parameter(torch.from_numpy(a))
    return torch.nn.Parameter(torch.from_numpy(np.array(a, dtype=a.dtype.newbyteorder("="),
                                                        order="K")).to(dtype))


def module_from(cls: Any, model: Any) -> Any:
    """A module of class cls on model's weights (see RecurrentModule.from_rnn)."""
    if type(model) is not cls._rnn_class:
        raise TypeError(f"model must be a {cls._rnn_class.__module__}."
                        f"{cls._rnn_class.__name__}, got {type(model).__name__}")
    if model.reverse:
        raise ValueError("model runs in reverse (ONNX's direction='reverse'), which the "
                         "torch modules do not")
    if getattr(model, "linear_before_reset", True) is False:
        raise ValueError("model has linear_before_reset=False, which torch's GRU does not")
    dtype, int8 = _torch_dtype(model)
    extra = cls._module_kwargs(model)
    module = cls(model.input_size, model.hidden_size, model.num_layers,
                 batch_first=model.batch_first, bidirectional=model.bidirectional,
                 dtype=torch.float32 if _dtypes.is_half(model.dtype) else dtype, **extra)
    if int8:
        module._hold_int8(model.params)
        return module
    H = model.hidden_size
    for k in range(model.num_layers):
        for d in range(model.num_directions):
            sfx = module._suffix(k, d)
            p = {name: model.params[key] for name, key in zip(
                functional.param_names(module.cell), _model_keys(module, k, d))
                if key in model.params}
            if module._plain:
                new = {"weight_ih": p["weight_ih"], "weight_hh": p["weight_hh"],
                       "bias_ih": p["bias"]}
                if "bias_hn" in p:
                    new["bias_hh"] = np.concatenate([np.zeros(2 * H, p["bias_hn"].dtype),
                                                     p["bias_hn"]])
                else:
                    new["bias_hh"] = np.zeros_like(p["bias"])
            else:
                new = p
            for name, value in new.items():
                w_dtype = dtype if name.startswith("weight_") or not _dtypes.is_half(
                    model.dtype) else torch.float32
                setattr(module, name + sfx, _parameter(np.asarray(value), w_dtype))
    return module


def quantize(module: Any) -> Any:
    """An int8 copy of a fastln.torch module (see fastln.torch.quantize)."""
    if module.quantized:
        raise ValueError("module is int8 already")
    return module_from(type(module), _rnn.quantize(build(module, share=False)))
