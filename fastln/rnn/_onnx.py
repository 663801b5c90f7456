"""Loading the recurrent node of an ONNX graph (LSTM, GRU or RNN) into the
matching plain model of :mod:`fastln.rnn`, and ONNX Runtime's quantized LSTM
(DynamicQuantizeLSTM) into an int8 LSTM: :func:`from_onnx`.

onnx is an optional dependency (``pip install "fastln[onnx]"``): it is imported
on the first call, never by ``import fastln``.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import numpy.typing as npt

from .. import _optional
from ._cells import GRU, LSTM, RNN
from .base import quantize

_Array = npt.NDArray[Any]

# ONNX Runtime's LSTM with int8 weights (domain com.microsoft), which
# onnxruntime.quantization.quantize_dynamic writes
_QLSTM = "DynamicQuantizeLSTM"

# per operator: the gate blocks G, the default activations of one direction,
# and the attributes it may carry besides the common ones
_OPS: Dict[str, Tuple[int, Tuple[str, ...], Tuple[str, ...]]] = {
    "LSTM": (4, ("sigmoid", "tanh", "tanh"), ("input_forget", "layout")),
    "GRU": (3, ("sigmoid", "tanh"), ("linear_before_reset", "layout")),
    "RNN": (1, ("tanh",), ("layout",)),
    _QLSTM: (4, ("sigmoid", "tanh", "tanh"), ("input_forget",)),
}
_COMMON_ATTRIBUTES = ("activation_alpha", "activation_beta", "activations", "clip",
                      "direction", "hidden_size")
_INPUTS = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")
_QUANT_INPUTS = ("W_scale", "W_zero_point", "R_scale", "R_zero_point")   # DynamicQuantizeLSTM's

# fastln's gate blocks, as indices of ONNX's: the LSTM's [i, o, f, c] become
# [i, f, g, o] (g is ONNX's c), the GRU's [z, r, h] become [r, z, n]
_LSTM_ORDER = (0, 2, 3, 1)
_GRU_ORDER = (1, 0, 2)


def _import_onnx() -> Any:
    try:
        import onnx
        import onnx.numpy_helper  # noqa: F401  (a submodule: import it explicitly)
    except ImportError:
        raise _optional.missing("onnx", "fastln.rnn.from_onnx") from None
    return onnx


# a node found by _walk: its path, the node, and the graphs whose names it
# sees, its own first, then the graphs around it
_Found = Tuple[str, Any, Tuple[Any, ...]]


def _label(node: Any, index: int) -> str:
    return node.name if node.name else f"<unnamed, node {index}>"


def _walk(onnx: Any, graph: Any, prefix: str = "", outer: Tuple[Any, ...] = ()) -> List[_Found]:
    """Every node of graph and of the graphs inside its nodes (If's branches,
    Loop's and Scan's bodies, any graph attribute), in order. A nested node's
    path is its parent's, the attribute's name and its own name, joined by
    "/": "if_node/then_branch/lstm"."""
    scopes = (graph,) + outer
    found: List[_Found] = []
    for i, n in enumerate(graph.node):
        path = prefix + _label(n, i)
        found.append((path, n, scopes))
        for attr in n.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                found += _walk(onnx, attr.g, f"{path}/{attr.name}/", scopes)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for k, g in enumerate(attr.graphs):
                    found += _walk(onnx, g, f"{path}/{attr.name}[{k}]/", scopes)
    return found


def _recurrent(n: Any) -> bool:
    if n.op_type == _QLSTM:
        return bool(n.domain == "com.microsoft")
    return bool(n.op_type in _OPS and n.domain in ("", "ai.onnx"))


def _find_node(onnx: Any, graph: Any, name: Optional[str]) -> _Found:
    """The LSTM, GRU or RNN node of the graph or of any graph inside it: the
    only one, or the one whose path or name is name."""
    found = _walk(onnx, graph)
    recurrent = [f for f in found if _recurrent(f[1])]

    def listed(fs: List[_Found]) -> str:
        return ", ".join(f"{path!r} ({n.op_type})" for path, n, _ in fs) or "none"
    if name is not None:
        hits = [f for f in found if f[0] == name] or [f for f in found if f[1].name == name]
        if len(hits) > 1:
            raise ValueError(f"several nodes are named {name!r}: {listed(hits)}; pass node= "
                             f"one of these paths")
        if not hits:
            raise ValueError(f"node {name!r} is not in the graph; its LSTM, GRU and RNN "
                             f"nodes: {listed(recurrent)}")
        n = hits[0][1]
        if not _recurrent(n):
            raise ValueError(f"node {name!r} is a {n.domain + '.' if n.domain else ''}"
                             f"{n.op_type} node, not an LSTM, GRU or RNN node")
        return hits[0]
    if len(recurrent) == 1:
        return recurrent[0]
    if not recurrent:
        raise ValueError(f"model has no LSTM, GRU or RNN node, in its graph or the graphs "
                         f"inside it (its nodes: {listed(found)})")
    raise ValueError(f"model has {len(recurrent)} LSTM, GRU and RNN nodes: "
                     f"{listed(recurrent)}; pass node= one of their paths")


def _constant(onnx: Any, model: Any, scopes: Tuple[Any, ...], name: str, what: str) -> _Array:
    """The value of the tensor called name as the node's graph sees it
    (scopes: that graph, then the graphs around it): an initializer, or the
    output of nodes whose inputs are all, in the end, initializers and
    Constant nodes (Unsqueeze of a constant, say), which ONNX's reference
    evaluator computes."""
    def producer(tensor: str) -> Tuple[Any, Any]:
        """(initializer, None), (None, node), or (None, None) for a graph
        input or an unknown name: the innermost graph that names it wins."""
        for g in scopes:
            for t in g.initializer:
                if t.name == tensor:
                    return t, None
            for n in g.node:
                if tensor in n.output:
                    return None, n
            if any(v.name == tensor for v in g.input):
                break
        return None, None

    subgraph = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    needed: List[Any] = []      # the producer nodes, each once, inputs before users
    made: set[str] = set()      # their outputs
    tensors: Dict[str, Any] = {}   # the initializers they read

    def visit(tensor: str, trail: Tuple[str, ...]) -> None:
        if not tensor or tensor in tensors or tensor in made:
            return
        init, n = producer(tensor)
        if init is not None:
            tensors[tensor] = init
            return
        if n is None or any(a.type in subgraph for a in n.attribute):
            via = f" (through {', '.join(repr(t) for t in trail)})" if trail else ""
            raise ValueError(f"input {what} ({name!r}) must come from initializers and "
                             f"Constant nodes alone: {tensor!r}{via} is a graph input or the "
                             f"output of an If, Loop or Scan node; fastln reads the weights "
                             f"when it builds the model")
        for inp in n.input:
            visit(inp, trail + (tensor,))
        needed.append(n)
        made.update(n.output)

    visit(name, ())
    if not needed:
        return np.asarray(onnx.numpy_helper.to_array(tensors[name]))
    from onnx.reference import ReferenceEvaluator
    graph = onnx.helper.make_graph(
        needed, "fold", [], [onnx.helper.make_tensor_value_info(name, 0, None)],
        list(tensors.values()))
    folded = onnx.helper.make_model(graph, opset_imports=list(model.opset_import),
                                    ir_version=model.ir_version)
    try:
        (value,) = ReferenceEvaluator(folded).run(None, {})
    except Exception as e:
        raise ValueError(f"input {what} ({name!r}) is computed from constants by nodes that "
                         f"ONNX's reference evaluator cannot run: {e}") from e
    return np.asarray(value)


def _attributes(onnx: Any, node: Any) -> Dict[str, Any]:
    allowed = _COMMON_ATTRIBUTES + _OPS[node.op_type][2]
    out: Dict[str, Any] = {}
    for a in node.attribute:
        if a.name not in allowed:
            raise ValueError(f"attribute {a.name!r} is not one of the {node.op_type} "
                             f"operator's: {', '.join(allowed)}")
        value = onnx.helper.get_attribute_value(a)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, list):
            value = [v.decode() if isinstance(v, bytes) else v for v in value]
        out[a.name] = value
    return out


def _check_dtype(name: str, a: _Array, dtype: Optional[np.dtype[Any]]) -> np.dtype[Any]:
    if a.dtype not in (np.float32, np.float64):
        raise TypeError(f"input {name} has dtype {a.dtype}; fastln's RNN engine runs float32 "
                        f"or float64: convert the model first")
    if dtype is not None and a.dtype != dtype:
        raise TypeError(f"input {name} has dtype {a.dtype}, but W has {dtype}")
    return a.dtype


def _check_shape(name: str, a: _Array, shape: Tuple[int, ...], form: str) -> None:
    if a.shape != shape:
        raise ValueError(f"input {name} must have shape {form} = {shape}, got {a.shape}")


def _int8_weights(onnx: Any, model: Any, scopes: Tuple[Any, ...], given: Dict[str, str],
                  name: str, D: int, path: str) -> Tuple[_Array, _Array]:
    """A DynamicQuantizeLSTM's W or R, stored (D, K, N) as int8 or uint8
    values q with a scale and a zero point z per direction (D,) or per
    column (D, N): its int8 values q - z in that layout, and its float32
    scales, one per column (D, N)."""
    q = _constant(onnx, model, scopes, given[name], name)
    scale = _constant(onnx, model, scopes, given[f"{name}_scale"], f"{name}_scale")
    zero = _constant(onnx, model, scopes, given[f"{name}_zero_point"], f"{name}_zero_point")
    if q.dtype not in (np.int8, np.uint8):
        raise TypeError(f"input {name} of node {path!r} has dtype {q.dtype}; a "
                        f"{_QLSTM}'s weights are int8 or uint8")
    if q.ndim != 3 or q.shape[0] != D or q.shape[2] % 4 or 0 in q.shape:
        size = "input_size" if name == "W" else "hidden_size"
        raise ValueError(f"input {name} must have shape (num_directions, {size}, "
                         f"4*hidden_size) with num_directions = {D}, got {q.shape}")
    N = q.shape[2]
    for what, a, dtype in ((f"{name}_scale", scale, np.float32),
                           (f"{name}_zero_point", zero, q.dtype)):
        if a.dtype != dtype:
            raise TypeError(f"input {what} has dtype {a.dtype}, expected {np.dtype(dtype)}")
        if a.shape not in ((D,), (D, N)):
            raise ValueError(f"input {what} must have shape (num_directions,) = {(D,)} or "
                             f"(num_directions, 4*hidden_size) = {(D, N)}, got {a.shape}")
    z = zero.reshape(D, 1, -1).astype(np.int32)
    if q.dtype == np.int8 and np.any(z != 0):
        raise ValueError(f"node {path!r}: input {name}_zero_point must be 0 for int8 "
                         f"weights, got values from {z.min()} to {z.max()}")
    values = q.astype(np.int32) - z
    if values.min() < -128 or values.max() > 127:
        raise ValueError(f"node {path!r}: {name} - {name}_zero_point takes values from "
                         f"{values.min()} to {values.max()}, outside int8's [-128, 127]")
    return values.astype(np.int8), np.broadcast_to(scale.reshape(D, -1), (D, N))


def from_onnx(model: Any, node: Optional[str] = None) -> Any:
    """A fastln LSTM, GRU or RNN equivalent to an ONNX graph's recurrent node.

    The node is an ONNX LSTM, GRU or RNN, or ONNX Runtime's quantized LSTM
    (``DynamicQuantizeLSTM`` of the ``com.microsoft`` domain, as
    ``onnxruntime.quantization.quantize_dynamic`` writes it), which loads as
    an int8 LSTM (see :func:`fastln.rnn.quantize`) holding the node's own
    int8 weights and scales.

    Parameters
    ----------
    model : onnx.ModelProto, str or os.PathLike
        The model, or the path of a ``.onnx`` file (read with ``onnx.load``,
        external data included).
    node : str, optional
        The LSTM, GRU, RNN or DynamicQuantizeLSTM node to load, by its name
        or its path; it may be left out when the model has exactly one such
        node. The bodies of If, Loop and Scan nodes (any graph attribute, at
        any depth) are searched too; a nested node's path joins its parent's
        path, the attribute's name and its own name with "/", as in
        ``"if/then_branch/lstm"`` (an unnamed node is
        ``"<unnamed, node K>"``, K its index in its graph). A name that two
        nodes share must be given as a path.

    Returns
    -------
    LSTM, GRU or RNN
        A one-layer plain model (:class:`fastln.rnn.LSTM`, :class:`GRU` or
        :class:`RNN`) with the node's weights, in their dtype (float32 or
        float64): ``bidirectional=True`` for ``direction="bidirectional"``,
        ``batch_first=True`` for ``layout=1``, the GRU's
        ``linear_before_reset`` and the RNN's ``nonlinearity`` ("relu" for
        ``activations=["Relu"]``) as in the node. For
        ``direction="reverse"`` it is a unidirectional model with
        ``reverse = True``: its one direction runs from each sequence's last
        step back to its first, and its parameters keep the unsuffixed names.
        A DynamicQuantizeLSTM gives an int8 LSTM (as
        :func:`fastln.rnn.quantize` gives: float32 inputs, outputs and
        state), which runs ``forward(x, state, lengths, cache=False)`` and
        :meth:`step`.

    Raises
    ------
    ImportError
        onnx is not installed (``pip install "fastln[onnx]"``).
    TypeError
        model is neither a ModelProto nor a path; node is not a str; the
        weights are not float32 or float64 (float16: convert the model
        first), or not all of one dtype; a DynamicQuantizeLSTM's W or R is
        not int8 or uint8, its zero points not of W's or R's dtype, or its
        scales not float32.
    ValueError
        The model has no LSTM, GRU or RNN node, several and no ``node``, or
        none named ``node``, or several of that name; W, R, B or P is not
        computed from initializers and Constant nodes alone (a graph input,
        or the output of an If, Loop or Scan node, on the way), or has the
        wrong shape; the node uses what fastln's cells do not
        have: peepholes (an input P that is not all zeros), ``clip``,
        ``input_forget=1``, activations other than the defaults (LSTM:
        Sigmoid, Tanh, Tanh; GRU: Sigmoid, Tanh; RNN: Tanh, or Relu for
        every direction), ``activation_alpha`` or ``activation_beta``, or a
        ``layout`` other than 0 and 1. A DynamicQuantizeLSTM lacks a scale
        or zero point, or has one of the wrong shape, or a zero point that
        fastln's int8 weights cannot hold (nonzero for int8 weights; for
        uint8 weights, one that puts W - zero point or R - zero point outside
        [-128, 127]). The message names the input or attribute.

    Notes
    -----
    W, R, B and P may be initializers of the node's graph or of a graph
    around it, Constant nodes, or outputs of nodes whose inputs come from
    those alone (an ``Unsqueeze`` of a 2-D constant, as exported streaming
    models have): ONNX's reference evaluator (``onnx.reference``) computes
    them once, when the model is built.

    The weights map onto fastln's parameters (suffix ``_reverse`` for the
    second direction of a bidirectional node): W[d] becomes ``weight_ih_l0``,
    R[d] ``weight_hh_l0``, with the gate blocks reordered from ONNX's
    [i, o, f, c] to the LSTM's [i, f, g, o] and from [z, r, h] to the GRU's
    [r, z, n]. Of B[d] = [Wb, Rb], the LSTM and RNN get
    ``bias_l0 = Wb + Rb``; the GRU gets ``bias_l0 = [Wb_r + Rb_r,
    Wb_z + Rb_z, Wb_h]`` and ``bias_hn_l0 = Rb_h`` (sums in float64, rounded
    once).

    A DynamicQuantizeLSTM stores W (D, I, 4H) and R (D, H, 4H) transposed,
    as int8 or uint8 values q with a float32 scale s and a zero point z per
    direction, ``W_scale`` (D,), or per column, (D, 4H): its weight is
    s * (q - z). Column j of W[d] becomes a row of ``weight_ih_l0``, holding
    q - z as int8, and its scale the same row of ``weight_ih_scale_l0`` (the
    gate blocks reordered as above; a per-direction scale is every row's);
    R[d] likewise ``weight_hh_l0`` and ``weight_hh_scale_l0``. The values
    are the file's, not quantized again. fastln quantizes the activations of each
    batch row with a scale of its own, ONNX Runtime those of the whole batch
    with one, so the two differ by about as much as ONNX Runtime's results
    for a row alone and in a batch do (2e-2 to 4e-2 for H = 32 on N(0, 1)
    data).

    The node's other inputs are arguments of ``forward(x, state, lengths)``:

    ========================== ==============================================
    ONNX                       fastln
    ========================== ==============================================
    X (T, B, I)                x (T, B, I); layout=1: both (B, T, I)
    sequence_lens (B,)         ``lengths``
    initial_h (D, B, H)        state h, (D, B, H) (one layer: index d is the
                               direction); layout=1: initial_h is (B, D, H),
                               so h = ``initial_h.transpose(1, 0, 2)``
    initial_c (D, B, H)        the LSTM's state ``(h, c)``: c as h
    Y (T, D, B, H)             ``y.reshape(T, B, D, H).transpose(0, 2, 1, 3)``
                               for y (T, B, D*H); layout=1: Y (B, T, D, H) =
                               ``y.reshape(B, T, D, H)``
    Y_h (D, B, H)              the final h; layout=1: ``h.transpose(1, 0, 2)``
    Y_c (D, B, H)              the LSTM's final c, as Y_h
    ========================== ==============================================

    with D = 2 for a bidirectional node, else 1. As in ONNX Runtime, Y is 0
    past each sequence's length, and a reverse direction starts at its
    sequence's last valid step.

    Examples
    --------
    A bidirectional ONNX LSTM, built in memory, and ONNX's reference
    implementation of it:

    >>> import numpy as np
    >>> import onnx
    >>> from onnx import TensorProto, helper, numpy_helper
    >>> from onnx.reference import ReferenceEvaluator
    >>> from fastln.rnn import from_onnx
    >>> T, B, I, H, D = 5, 2, 3, 4, 2
    >>> rng = np.random.default_rng(0)
    >>> W = rng.normal(0, 0.3, (D, 4 * H, I)).astype(np.float32)
    >>> R = rng.normal(0, 0.3, (D, 4 * H, H)).astype(np.float32)
    >>> Bias = rng.normal(0, 0.3, (D, 8 * H)).astype(np.float32)
    >>> lstm = helper.make_node("LSTM", ["X", "W", "R", "B", "", "h0", "c0"],
    ...                         ["Y", "Y_h", "Y_c"], name="lstm", hidden_size=H,
    ...                         direction="bidirectional")
    >>> graph = helper.make_graph(
    ...     [lstm], "g",
    ...     [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
    ...      for n in ("X", "h0", "c0")],
    ...     [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
    ...      for n in ("Y", "Y_h", "Y_c")],
    ...     [numpy_helper.from_array(W, "W"), numpy_helper.from_array(R, "R"),
    ...      numpy_helper.from_array(Bias, "B")])
    >>> model = helper.make_model(graph)
    >>> m = from_onnx(model)
    >>> m
    LSTM(input_size=3, hidden_size=4, num_layers=1, batch_first=False, dtype=float32,
        bidirectional=True)
    >>> x = rng.standard_normal((T, B, I)).astype(np.float32)
    >>> h0 = rng.standard_normal((D, B, H)).astype(np.float32)
    >>> c0 = rng.standard_normal((D, B, H)).astype(np.float32)
    >>> y, (h, c) = m.forward(x, (h0, c0))
    >>> Y = y.reshape(T, B, D, H).transpose(0, 2, 1, 3)       # ONNX's (T, D, B, H)
    >>> Y_ref, Yh_ref, Yc_ref = ReferenceEvaluator(model).run(
    ...     None, {"X": x, "h0": h0, "c0": c0})
    >>> [bool(np.allclose(a, b, atol=1e-5)) for a, b in [(Y, Y_ref), (h, Yh_ref), (c, Yc_ref)]]
    [True, True, True]
    """
    onnx = _import_onnx()
    if isinstance(model, (str, os.PathLike)):
        model = onnx.load(os.fspath(model))
    elif not isinstance(model, onnx.ModelProto):
        raise TypeError(f"model must be an onnx.ModelProto or the path of a .onnx file, "
                        f"got {type(model).__name__}")
    if node is not None and not isinstance(node, str):
        raise TypeError(f"node must be a node's name (str) or None, got {type(node).__name__}")
    path, n, scopes = _find_node(onnx, model.graph, node)
    quantized = n.op_type == _QLSTM
    op = "LSTM" if quantized else n.op_type
    G, default_acts, _ = _OPS[op]
    attrs = _attributes(onnx, n)

    direction = attrs.get("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ValueError(f"attribute direction must be 'forward', 'reverse' or "
                         f"'bidirectional', got {direction!r}")
    D = 2 if direction == "bidirectional" else 1
    layout = attrs.get("layout", 0)
    if layout not in (0, 1):
        raise ValueError(f"attribute layout must be 0 or 1, got {layout!r}")
    if "clip" in attrs:
        raise ValueError(f"attribute clip ({attrs['clip']}) is not supported: fastln's cells "
                         f"do not clip their gates")
    for name in ("activation_alpha", "activation_beta"):
        if name in attrs:
            raise ValueError(f"attribute {name} is not supported: fastln's activations "
                             f"take no parameters")
    if attrs.get("input_forget", 0) != 0:
        raise ValueError(f"attribute input_forget={attrs['input_forget']} is not supported "
                         f"(coupled input and forget gates)")
    lbr = attrs.get("linear_before_reset", 0)
    if lbr not in (0, 1):
        raise ValueError(f"attribute linear_before_reset must be 0 or 1, got {lbr!r}")
    nonlinearity = "tanh"
    if "activations" in attrs:
        acts = [str(a).lower() for a in attrs["activations"]]
        per = [tuple(acts[d * len(default_acts):(d + 1) * len(default_acts)])
               for d in range(D)]
        allowed = [default_acts] + ([("relu",)] if op == "RNN" else [])
        if len(acts) != D * len(default_acts) or any(p not in allowed for p in per):
            want = ", ".join(a.capitalize() for a in default_acts)
            also = " (or Relu)" if op == "RNN" else ""
            raise ValueError(f"attribute activations={attrs['activations']} is not supported: "
                             f"fastln's {op} runs {want}{also} per direction, with "
                             f"num_directions = {D}")
        if len(set(per)) > 1:
            raise ValueError(f"attribute activations={attrs['activations']} is not supported: "
                             f"the two directions must use the same activation")
        if op == "RNN" and per[0] == ("relu",):
            nonlinearity = "relu"

    slots = _INPUTS + (_QUANT_INPUTS if quantized else ())
    given = dict(zip(slots, list(n.input) + [""] * (len(slots) - len(n.input))))
    required = ("W", "R") + (_QUANT_INPUTS if quantized else ())
    if len(n.input) > len(slots) or not all(given[name] for name in required):
        raise ValueError(f"node {path!r} must have the inputs X, {', '.join(required)} (and "
                         f"optionally {', '.join(_INPUTS[3:])}), got {list(n.input)}")
    if quantized:
        # the file's columns are fastln's rows: W (D, I, 4H) and R (D, H, 4H)
        # become (D, 4H, I) and (D, 4H, H); W and R are their float values
        W8, w_scale = _int8_weights(onnx, model, scopes, given, "W", D, path)
        R8, r_scale = _int8_weights(onnx, model, scopes, given, "R", D, path)
        N = W8.shape[2]
        _check_shape("R", R8, (D, N // 4, N), "(num_directions, hidden_size, 4*hidden_size)")
        W8, R8 = W8.transpose(0, 2, 1), R8.transpose(0, 2, 1)
        W, R = W8 * w_scale[:, :, None], R8 * r_scale[:, :, None]
    else:
        W = _constant(onnx, model, scopes, given["W"], "W")
        R = _constant(onnx, model, scopes, given["R"], "R")
    dtype = _check_dtype("W", W, None)
    if W.ndim != 3 or W.shape[0] != D or W.shape[1] % G or W.shape[1] == 0 or W.shape[2] == 0:
        raise ValueError(f"input W must have shape (num_directions, {G}*hidden_size, "
                         f"input_size) with num_directions = {D} for direction={direction!r}, "
                         f"got {W.shape}")
    H, I = W.shape[1] // G, W.shape[2]
    if "hidden_size" in attrs and attrs["hidden_size"] != H:
        raise ValueError(f"attribute hidden_size={attrs['hidden_size']} does not match W, "
                         f"whose shape {W.shape} gives {H}")
    _check_dtype("R", R, dtype)
    _check_shape("R", R, (D, G * H, H), "(num_directions, G*H, H)")
    if given["B"]:
        bias = _constant(onnx, model, scopes, given["B"], "B")
        _check_dtype("B", bias, dtype)
        _check_shape("B", bias, (D, 2 * G * H), "(num_directions, 2*G*H)")
    else:
        bias = np.zeros((D, 2 * G * H), dtype)
    if given["P"]:
        if op != "LSTM":
            raise ValueError(f"input P is an LSTM's; {op} has no such input")
        P = _constant(onnx, model, scopes, given["P"], "P")
        _check_dtype("P", P, dtype)
        _check_shape("P", P, (D, 3 * H), "(num_directions, 3*H)")
        if np.any(P != 0):
            raise ValueError("input P (peephole weights) is not supported: fastln's LSTM has "
                             "no peepholes; only an all-zero P loads")

    extra: Dict[str, Any] = {}
    cls: Any
    if op == "LSTM":
        cls = LSTM
    elif op == "GRU":
        cls = GRU
        extra["linear_before_reset"] = bool(lbr)
    else:
        cls = RNN
        extra["nonlinearity"] = nonlinearity
    m = cls(I, H, 1, batch_first=layout == 1, dtype=dtype, bidirectional=D == 2, **extra)
    state = m.state_dict()
    for d in range(D):
        suffix = "_reverse" if d == 1 else ""
        w, r = W[d], R[d]
        wb, rb = (bias[d, :G * H].astype(np.float64), bias[d, G * H:].astype(np.float64))
        params: List[Tuple[str, _Array]]
        if op == "LSTM":
            w, r, b = (_blocks(a, _LSTM_ORDER) for a in (w, r, wb + rb))
            params = [("weight_ih", w), ("weight_hh", r), ("bias", b)]
        elif op == "GRU":
            w, r = _blocks(w, _GRU_ORDER), _blocks(r, _GRU_ORDER)
            (wz, wr, wh), (rz, rr, rh) = np.split(wb, 3), np.split(rb, 3)
            params = [("weight_ih", w), ("weight_hh", r),
                      ("bias", np.concatenate([wr + rr, wz + rz, wh])), ("bias_hn", rh)]
        else:
            params = [("weight_ih", w), ("weight_hh", r), ("bias", wb + rb)]
        for name, value in params:
            state[f"{name}_l0{suffix}"] = value
    m.load_state_dict(state)
    if quantized:
        # the int8 structure of quantize(), holding the file's own int8 values
        # and scales (not a quantization of their float values)
        m = quantize(m)
        state = m.state_dict()
        for d in range(D):
            suffix = "_reverse" if d == 1 else ""
            for name, q, scale in (("weight_ih", W8[d], w_scale[d]),
                                   ("weight_hh", R8[d], r_scale[d])):
                state[f"{name}_l0{suffix}"] = _blocks(q, _LSTM_ORDER)
                state[f"{name}_scale_l0{suffix}"] = _blocks(scale, _LSTM_ORDER)
        m.load_state_dict(state)
    if direction == "reverse":
        m.reverse = True
    return m


def _blocks(a: _Array, order: Tuple[int, ...]) -> _Array:
    """a's gate blocks (equal parts along axis 0) in the given order."""
    parts = np.split(a, len(order))
    return np.concatenate([parts[i] for i in order])
