"""Loading the weights of TensorFlow's LN-LSTM cells into LNLSTM, for
LNLSTM.from_keras: TF Addons' Keras LayerNormLSTMCell and TF1's
LayerNormBasicLSTMCell, each with the options of its cell."""
from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type, TypeVar

import numpy as np
import numpy.typing as npt

from .base import RecurrentModel

_M = TypeVar("_M", bound=RecurrentModel[Any])
_Array = npt.NDArray[Any]

CELLS = ("LayerNormLSTMCell", "LayerNormBasicLSTMCell")
_EPS = {"LayerNormLSTMCell": 1e-3, "LayerNormBasicLSTMCell": 1e-12}
# TF1's gate blocks i, j, f, o in fastln's order i, f, g(= j), o
_TF1_ORDER = (0, 2, 1, 3)


def _tfa_layer(w: List[_Array], k: int, I: Optional[int],
               H: Optional[int]) -> Tuple[Dict[str, _Array], int]:
    """Layer k's parameters from the front of w (TF Addons' get_weights() order:
    kernel, recurrent_kernel, bias if use_bias, then the gamma and beta of
    kernel_norm, recurrent_norm and state_norm) and how many arrays it took;
    I, H: the sizes the layer must have (None: any, for the first layer)."""
    if H is None:
        H = w[1].shape[0] if len(w) > 1 and w[1].ndim == 2 else 0
    # the bias is a fifth 4H vector before state_norm's two H vectors
    n = 9 if len(w) >= 9 and all(a.shape == (4 * H,) for a in w[2:7]) else 8
    _check(w[:n], [(I, 4 * H), (H, 4 * H)] + [(4 * H,)] * (n - 4) + [(H,), (H,)], k,
           "TF Addons' LayerNormLSTMCell")
    ln = w[n - 6:n]
    p = {"weight_ih": w[0].T, "weight_hh": w[1].T,
         "ln_ih_weight": ln[0], "ln_ih_bias": ln[1], "ln_hh_weight": ln[2],
         "ln_hh_bias": ln[3], "ln_c_weight": ln[4], "ln_c_bias": ln[5]}
    if n == 9:
        p["bias"] = w[2]
    return p, n


def _tf1_layer(w: List[_Array], k: int, I: Optional[int], H: Optional[int],
               forget_bias: float) -> Tuple[Dict[str, _Array], int]:
    """Layer k's parameters from the front of w (TF1's variables in the order its
    cell makes them: kernel over [x, h], then the gamma and beta of input,
    transform, forget, output and state) and how many arrays it took; I, H as
    for _tfa_layer; forget_bias goes into the forget gate's LayerNorm bias."""
    if H is None:
        H = w[0].shape[1] // 4 if w[0].ndim == 2 else 0
    _check(w[:11], [(None if I is None else I + H, 4 * H)] + [(H,)] * 10, k,
           "TF1's LayerNormBasicLSTMCell", w[0].ndim == 2 and w[0].shape[0] > H)
    I = w[0].shape[0] - H
    kernel = w[0].reshape(I + H, 4, H)[:, _TF1_ORDER].reshape(I + H, 4 * H)
    gamma = [w[1 + 2 * b] for b in _TF1_ORDER]
    beta = [w[2 + 2 * b] for b in _TF1_ORDER]
    beta[1] = beta[1] + np.asarray(forget_bias, beta[1].dtype)   # f: sigmoid(LN(f) + forget_bias)
    return {"weight_ih": kernel[:I].T, "weight_hh": kernel[I:].T,
            "ln_weight": np.concatenate(gamma), "ln_bias": np.concatenate(beta),
            "ln_c_weight": w[9], "ln_c_bias": w[10]}, 11


def _check(w: List[_Array], shapes: Sequence[Tuple[Optional[int], ...]], k: int,
           cell: str, fits: bool = True) -> None:
    """A ValueError unless fits and w has the shapes (None: any size)."""
    got = [a.shape for a in w]
    fits = fits and len(w) == len(shapes) and all(
        len(s) == len(g) and all(n is None or n == m for n, m in zip(s, g))
        for s, g in zip(shapes, got))
    if not fits or any(0 in s for s in got):
        want = [tuple("?" if n is None else n for n in s) for s in shapes]
        raise ValueError(f"weights of layer {k} do not have the shapes of {cell}'s: got "
                         f"{got}, expected {want}")


def lnlstm_from_keras(cls: Type[_M], weights: Sequence[Any], cell: str = "LayerNormLSTMCell",
                      eps: Optional[float] = None,
                      forget_bias: Optional[float] = None) -> _M:
    """An LNLSTM (cls) of a TensorFlow LN-LSTM's weights: see LNLSTM.from_keras."""
    if cell not in CELLS:
        raise ValueError(f"cell must be one of {CELLS}, got {cell!r}")
    if forget_bias is not None and cell != "LayerNormBasicLSTMCell":
        raise ValueError("forget_bias is LayerNormBasicLSTMCell's; TF Addons' "
                         "LayerNormLSTMCell keeps its forget bias in its bias weight")
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise TypeError(f"weights must be a list of arrays (a cell's get_weights()), "
                        f"got {type(weights).__name__}")
    w = [np.asarray(a) for a in weights]
    if not w:
        raise ValueError("weights is empty")
    dtypes = {a.dtype for a in w}
    if not dtypes <= {np.dtype(np.float32), np.dtype(np.float64)} or len(dtypes) > 1:
        raise TypeError(f"weights must be float32 or float64 arrays of one dtype, "
                        f"got {sorted(map(str, dtypes))}")
    read = (_tfa_layer if cell == "LayerNormLSTMCell" else
            functools.partial(_tf1_layer, forget_bias=1.0 if forget_bias is None else forget_bias))
    layers: List[Dict[str, _Array]] = []
    I = H = None
    while w:
        p, n = read(w, len(layers), I, H)
        layers.append(p)
        I = H = p["weight_hh"].shape[1]
        w = w[n:]
    first = layers[0]
    options: Dict[str, Any] = {"carry": "normalized", **(
        {"gate_norm": "pair", "gate_bias": "bias" in first} if cell == "LayerNormLSTMCell"
        else {"gate_norm": "per_gate", "gate_bias": False})}
    if any(("bias" in p) != options["gate_bias"] for p in layers):
        raise ValueError("weights must have a bias in every layer or in none")
    model = cls(first["weight_ih"].shape[1], first["weight_hh"].shape[1], len(layers),
                batch_first=True, eps=_EPS[cell] if eps is None else eps,
                dtype=first["weight_ih"].dtype, **options)
    model.load_state_dict({f"{name}_l{k}": np.ascontiguousarray(v)
                           for k, p in enumerate(layers) for name, v in p.items()})
    return model
