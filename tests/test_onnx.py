"""fastln.rnn.from_onnx: ONNX LSTM, GRU and RNN nodes as fastln models, and
ONNX Runtime's DynamicQuantizeLSTM as an int8 LSTM.

1. ONNX's own operator test cases for LSTM, GRU and RNN (generated in-process
   from onnx.backend.test.case.node.lstm/gru/rnn, whose expected outputs come
   from ONNX's NumPy reference): each loads and its forward matches Y, Y_h and
   Y_c to 1e-5; the peephole case raises a ValueError.
2. ONNX Runtime on random weights and biases (every entry different, Wb and
   Rb different): LSTM, GRU (linear_before_reset 0 and 1), RNN (Tanh and
   Relu), each forward, reverse and bidirectional, with and without
   sequence_lens and initial states; layout=1 against ONNX Runtime on the
   layout=0 node with transposed data (ONNX Runtime runs layout 0 only), and
   against ONNX's reference evaluator. float64 against the reference
   evaluator (ONNX Runtime runs these operators in float32 only).
3. ONNX Runtime's quantized LSTM: float LSTMs quantized by
   onnxruntime.quantization.quantize_dynamic (per tensor and per channel;
   forward, reverse, bidirectional) load as int8 models holding the file's
   int8 values and scales, and match ONNX Runtime on the quantized file within
   its own batch-to-batch variation; uint8 weights with a zero point; errors.
4. Loading details: weights from Constant nodes, a path, empty optional
   inputs, explicit default activations, an all-zero P, node selection.
5. Errors: unsupported attributes and inputs, missing or ambiguous nodes,
   wrong argument types, onnx missing.
6. ``import fastln`` (and ``fastln.rnn``) does not import onnx; the
   docstring's example runs.
"""
import doctest
import importlib
import pathlib
import subprocess
import sys

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnxruntime.quantization import quantize_dynamic

import fastln.rnn._onnx
from fastln.rnn import GRU, LSTM, RNN, from_onnx

INPUTS = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")
WEIGHTS = ("W", "R", "B", "P")                        # graph initializers
FEEDS = ("X", "sequence_lens", "initial_h", "initial_c")  # forward's arguments
OUTPUTS = ("Y", "Y_h", "Y_c")
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
CLASSES = {"LSTM": LSTM, "GRU": GRU, "RNN": RNN}
ATOL = RTOL = 1e-5   # float32


# ---- building graphs and running them ---------------------------------------

def _elem_type(a):
    return helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype)


def make_model(node, arrays, opset=14, constants=()):
    """A model of the one node: its present inputs among W, R, B, P become
    initializers (or Constant nodes, for those named in constants), the others
    graph inputs; every present output is a graph output."""
    initializers, nodes, inputs = [], [], []
    for slot, name in zip(INPUTS, node.input):
        if not name:
            continue
        value = np.asarray(arrays[name])
        if slot in WEIGHTS and name in constants:
            nodes.append(helper.make_node("Constant", [], [name], name=f"const_{name}",
                                          value=numpy_helper.from_array(value, name)))
        elif slot in WEIGHTS:
            initializers.append(numpy_helper.from_array(value, name))
        else:
            inputs.append(helper.make_tensor_value_info(name, _elem_type(value), None))
    dtype = _elem_type(arrays[node.input[0]])
    outputs = [helper.make_tensor_value_info(name, dtype, None) for name in node.output if name]
    graph = helper.make_graph(nodes + [node], "g", inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run_fastln(m, op, feeds, layout):
    """fastln's forward on ONNX's inputs, its results in ONNX's forms: a dict
    of Y, Y_h (and Y_c for an LSTM), as documented in from_onnx."""
    D = 2 if m.bidirectional else 1
    H = m.hidden_size
    x = feeds["X"]
    h0, c0 = feeds.get("initial_h"), feeds.get("initial_c")
    if layout == 1:   # ONNX's states are (B, D, H) there, fastln's (D, B, H) always
        h0 = None if h0 is None else h0.transpose(1, 0, 2)
        c0 = None if c0 is None else c0.transpose(1, 0, 2)
    state = (h0, c0) if op == "LSTM" else h0
    y, out = m.forward(x, state, lengths=feeds.get("sequence_lens"), cache=False)
    h, c = out if op == "LSTM" else (out, None)
    if layout == 0:
        T, B = x.shape[:2]
        Y = y.reshape(T, B, D, H).transpose(0, 2, 1, 3)
    else:
        B, T = x.shape[:2]
        Y = y.reshape(B, T, D, H)
        h = h.transpose(1, 0, 2)
        c = None if c is None else c.transpose(1, 0, 2)
    return {"Y": Y, "Y_h": h, "Y_c": c}


def ort_run(model, feeds):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


def assert_outputs(got, want, atol=ATOL, rtol=RTOL):
    assert want, "nothing to compare"
    for name, expected in want.items():
        actual = got[name]
        assert actual is not None, name
        assert actual.shape == expected.shape, (name, actual.shape, expected.shape)
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=name)


# ---- 1. ONNX's operator test cases ----------------------------------------------

def _onnx_cases():
    """(name, op, node, {input name: array}, {output slot: array}) of each case
    that onnx.backend.test.case.node.lstm/gru/rnn export, captured by calling
    their export functions with expect replaced (seeded as ONNX seeds them)."""
    cases = []
    saved = np.random.get_state()
    try:
        for op in GATES:
            module = importlib.import_module(f"onnx.backend.test.case.node.{op.lower()}")
            captured = []
            original = module.expect
            def expect(node, inputs, outputs, name, captured=captured, **kw):
                captured.append((node, inputs, outputs, name))
            module.expect = expect
            try:
                exporters = getattr(module, op)
                for attr in sorted(vars(exporters)):
                    if attr.startswith("export"):
                        np.random.seed(0)
                        getattr(exporters, attr)()
            finally:
                module.expect = original
            for node, inputs, outputs, name in captured:
                present_in = [n for n in node.input if n]
                slots_out = [slot for slot, n in zip(OUTPUTS, node.output) if n]
                cases.append((name, op, node,
                              dict(zip(present_in, map(np.asarray, inputs))),
                              dict(zip(slots_out, map(np.asarray, outputs)))))
    finally:
        np.random.set_state(saved)
    return cases


ONNX_CASES = _onnx_cases()
PEEPHOLE_CASES = {"test_lstm_with_peepholes"}


def test_onnx_cases_found():
    """The cases exist (so the parametrized test below cannot pass empty)."""
    names = {case[0] for case in ONNX_CASES}
    for op in GATES:
        assert sum(case[1] == op for case in ONNX_CASES) >= 5, op
    for name in ("test_lstm_defaults", "test_lstm_reverse", "test_lstm_bidirectional",
                 "test_lstm_batchwise", "test_gru_reverse", "test_gru_bidirectional",
                 "test_simple_rnn_batchwise", "test_simple_rnn_bidirectional",
                 *PEEPHOLE_CASES):
        assert name in names, name


@pytest.mark.parametrize("case", ONNX_CASES, ids=[case[0] for case in ONNX_CASES])
def test_onnx_case(case):
    name, op, node, arrays, expected = case
    model = make_model(node, arrays, opset=onnx.defs.get_schema(op).since_version)
    if name in PEEPHOLE_CASES:
        with pytest.raises(ValueError, match="P.*peephole"):
            from_onnx(model)
        return
    m = from_onnx(model)
    assert type(m) is CLASSES[op]
    slots = dict(zip(INPUTS, node.input))
    feeds = {slot: arrays[slots[slot]] for slot in FEEDS if slots.get(slot)}
    layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
    assert_outputs(run_fastln(m, op, feeds, layout), expected)


# ---- 2. ONNX Runtime on random weights ------------------------------------------

T, B, I, H = 6, 4, 3, 5
LENGTHS = np.array([6, 1, 4, 3], np.int32)     # max == T, one of length 1

# (id, op, attributes)
VARIANTS = [
    ("lstm", "LSTM", {}),
    ("gru_lbr0", "GRU", {"linear_before_reset": 0}),
    ("gru_lbr1", "GRU", {"linear_before_reset": 1}),
    ("rnn_tanh", "RNN", {}),
    ("rnn_relu", "RNN", {"activations": ["Relu"]}),
]
REFERENCE_VARIANTS = VARIANTS[:-1]   # ONNX's reference evaluator has no Relu RNN


def random_case(op, attrs, direction, lengths, init, layout=0, dtype=np.float32, seed=0):
    """A node and its arrays: random normal weights and biases (std 0.3), x and
    initial states; sequence_lens and initial states only when asked."""
    rng = np.random.default_rng(seed)
    D = 2 if direction == "bidirectional" else 1
    G = GATES[op]
    attrs = dict(attrs)
    if "activations" in attrs:
        attrs["activations"] = attrs["activations"] * D
    arrays = {"W": rng.normal(0, 0.3, (D, G * H, I)),
              "R": rng.normal(0, 0.3, (D, G * H, H)),
              "B": rng.normal(0, 0.3, (D, 2 * G * H))}
    state_shape = (B, D, H) if layout else (D, B, H)
    arrays["X"] = rng.standard_normal((B, T, I) if layout else (T, B, I))
    inputs = ["X", "W", "R", "B", "", "", ""]
    if lengths:
        arrays["sequence_lens"] = LENGTHS
        inputs[4] = "sequence_lens"
    if init:
        arrays["initial_h"] = rng.standard_normal(state_shape)
        inputs[5] = "initial_h"
        if op == "LSTM":
            arrays["initial_c"] = rng.standard_normal(state_shape)
            inputs[6] = "initial_c"
    while not inputs[-1]:
        inputs.pop()
    arrays = {k: v if k == "sequence_lens" else v.astype(dtype) for k, v in arrays.items()}
    outputs = ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]
    node = helper.make_node(op, inputs, outputs, name=f"my_{op.lower()}", hidden_size=H,
                            direction=direction, layout=layout, **attrs)
    return node, arrays


def feeds_of(node, arrays):
    return {n: arrays[n] for n in node.input if n in FEEDS}


@pytest.mark.parametrize("init", [False, True], ids=["zero_state", "initial_state"])
@pytest.mark.parametrize("lengths", [False, True], ids=["full", "lengths"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("variant", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_onnxruntime(variant, direction, lengths, init):
    _, op, attrs = variant
    node, arrays = random_case(op, attrs, direction, lengths, init)
    model = make_model(node, arrays)
    m = from_onnx(model)
    assert type(m) is CLASSES[op]
    assert m.dtype == np.float32 and not m.batch_first and m.num_layers == 1
    assert m.bidirectional == (direction == "bidirectional")
    assert getattr(m, "reverse", False) == (direction == "reverse")
    feeds = feeds_of(node, arrays)
    want = ort_run(model, feeds)
    got = run_fastln(m, op, feeds, 0)
    assert_outputs(got, want)
    if lengths:   # ONNX Runtime's Y is 0 past each length, and so is fastln's
        for b, n in enumerate(LENGTHS):
            assert np.all(got["Y"][n:, :, b] == 0)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("variant", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_onnxruntime_layout1(variant, direction):
    """layout=1 (batch-major X, Y, states): against ONNX Runtime on the same
    node with layout=0 and the data transposed."""
    _, op, attrs = variant
    node, arrays = random_case(op, attrs, direction, True, True, layout=1)
    m = from_onnx(make_model(node, arrays))
    assert m.batch_first
    node0 = onnx.NodeProto()
    node0.CopyFrom(node)
    for a in node0.attribute:
        if a.name == "layout":
            a.i = 0
    arrays0 = dict(arrays, X=arrays["X"].transpose(1, 0, 2))
    for name in ("initial_h", "initial_c"):
        if name in arrays:
            arrays0[name] = arrays[name].transpose(1, 0, 2)
    want0 = ort_run(make_model(node0, arrays0), feeds_of(node0, arrays0))
    want = {"Y": want0["Y"].transpose(2, 0, 1, 3)}
    want.update({k: v.transpose(1, 0, 2) for k, v in want0.items() if k != "Y"})
    assert_outputs(run_fastln(m, op, feeds_of(node, arrays), 1), want)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("variant", REFERENCE_VARIANTS, ids=[v[0] for v in REFERENCE_VARIANTS])
def test_reference_layout1(variant, direction):
    """layout=1 against ONNX's reference evaluator, which runs it directly
    (it ignores sequence_lens: full sequences)."""
    _, op, attrs = variant
    node, arrays = random_case(op, attrs, direction, False, True, layout=1, seed=1)
    model = make_model(node, arrays)
    feeds = feeds_of(node, arrays)
    want = dict(zip([n for n in node.output if n], ReferenceEvaluator(model).run(None, feeds)))
    assert_outputs(run_fastln(from_onnx(model), op, feeds, 1), want)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("variant", REFERENCE_VARIANTS, ids=[v[0] for v in REFERENCE_VARIANTS])
def test_float64(variant, direction):
    """float64 weights give a float64 model, checked against ONNX's reference
    evaluator in float64."""
    _, op, attrs = variant
    node, arrays = random_case(op, attrs, direction, False, True, dtype=np.float64, seed=2)
    model = make_model(node, arrays)
    m = from_onnx(model)
    assert m.dtype == np.float64
    feeds = feeds_of(node, arrays)
    want = dict(zip([n for n in node.output if n], ReferenceEvaluator(model).run(None, feeds)))
    assert_outputs(run_fastln(m, op, feeds, 0), want, atol=1e-12, rtol=1e-12)


# ---- 3. ONNX Runtime's quantized LSTM ------------------------------------------

QT, QB, QI, QH = 20, 4, 16, 32
QLENGTHS = np.array([20, 7, 13, 1], np.int32)
LSTM_ORDER = [0, 2, 3, 1]   # ONNX's gate blocks [i, o, f, c] in fastln's order [i, f, g, o]


def quantized_case(direction, per_channel, tmp_path, seed=0):
    """A float ONNX LSTM on random weights (std 0.3) as quantize_dynamic writes
    it, its DynamicQuantizeLSTM node, and N(0, 1) feeds with sequence_lens and
    initial states."""
    rng = np.random.default_rng(seed)
    D = 2 if direction == "bidirectional" else 1
    arrays = {"W": rng.normal(0, 0.3, (D, 4 * QH, QI)).astype(np.float32),
              "R": rng.normal(0, 0.3, (D, 4 * QH, QH)).astype(np.float32),
              "B": rng.normal(0, 0.3, (D, 8 * QH)).astype(np.float32),
              "X": rng.standard_normal((QT, QB, QI)).astype(np.float32),
              "sequence_lens": QLENGTHS,
              "initial_h": rng.standard_normal((D, QB, QH)).astype(np.float32),
              "initial_c": rng.standard_normal((D, QB, QH)).astype(np.float32)}
    node = helper.make_node("LSTM", list(INPUTS[:7]), list(OUTPUTS), name="lstm",
                            hidden_size=QH, direction=direction)
    path = tmp_path / "quantized.onnx"
    quantize_dynamic(make_model(node, arrays), path, op_types_to_quantize=["LSTM"],
                     per_channel=per_channel)
    model = onnx.load(str(path))
    (qnode,) = model.graph.node
    assert (qnode.op_type, qnode.domain) == ("DynamicQuantizeLSTM", "com.microsoft")
    return model, qnode, feeds_of(node, arrays)


def initializers(model):
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def replace_initializers(model, **arrays):
    """A copy of model whose initializers named in arrays hold those values."""
    new = onnx.ModelProto()
    new.CopyFrom(model)
    for t in new.graph.initializer:
        if t.name in arrays:
            t.CopyFrom(numpy_helper.from_array(np.asarray(arrays[t.name]), t.name))
    return new


def batch_row(feeds, b):
    """The feeds of batch row b alone."""
    row = {"X": feeds["X"][:, b:b + 1], "sequence_lens": feeds["sequence_lens"][b:b + 1]}
    row.update({k: feeds[k][:, b:b + 1] for k in ("initial_h", "initial_c")})
    return row


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_dynamic_quantize_lstm(direction, per_channel, tmp_path):
    """quantize_dynamic's DynamicQuantizeLSTM loads as an int8 LSTM holding the
    file's int8 values and scales: W (D, I, 4H) and R (D, H, 4H) become
    fastln's rows (4H, I) and (4H, H) in its gate order, a per-tensor scale
    every row's; the bias is Wb + Rb.

    Its outputs (Y, Y_h, Y_c) match ONNX Runtime's on the quantized file
    within ONNX Runtime's own batch-to-batch variation. ONNX Runtime quantizes
    the activations of the whole batch with one scale, fastln each row with
    its own, so neither reproduces the other exactly. The variation is
    max |ORT(row b alone) - ORT(batch)[row b]| over rows and outputs (about
    the size of the int8 error itself); fastln's largest difference to
    ORT(batch) must be at most twice it plus 2e-3, far below what a layout
    mistake (two gate blocks of R swapped) gives."""
    model, qnode, feeds = quantized_case(direction, per_channel, tmp_path)
    D = 2 if direction == "bidirectional" else 1
    m = from_onnx(model)
    assert type(m) is LSTM and "weights=int8" in repr(m) and m.dtype == np.float32
    assert m.bidirectional == (D == 2)
    assert getattr(m, "reverse", False) == (direction == "reverse")
    arrays = initializers(model)
    Wq, Rq, Bias, w_scale, r_scale = (arrays[qnode.input[k]] for k in (1, 2, 3, 8, 10))
    assert Wq.dtype == np.int8 and w_scale.shape == ((D, 4 * QH) if per_channel else (D,))
    for d, suffix in enumerate(["", "_reverse"][:D]):
        for name, q, scale in (("weight_ih", Wq, w_scale), ("weight_hh", Rq, r_scale)):
            values = m.params[f"{name}_l0{suffix}"]
            assert values.dtype == np.int8
            np.testing.assert_array_equal(values, _blocks(q[d].T, LSTM_ORDER))
            rows = np.broadcast_to(scale[d], (4 * QH,))
            np.testing.assert_array_equal(m.params[f"{name}_scale_l0{suffix}"],
                                          _blocks(rows, LSTM_ORDER))
        wb, rb = np.split(Bias[d].astype(np.float64), 2)
        np.testing.assert_array_equal(m.params[f"bias_l0{suffix}"],
                                      _blocks(wb + rb, LSTM_ORDER).astype(np.float32))

    want = ort_run(model, feeds)
    variation = 0.0
    for b in range(QB):
        alone = ort_run(model, batch_row(feeds, b))
        variation = max(variation, np.abs(alone["Y"] - want["Y"][:, :, b:b + 1]).max(),
                        *(np.abs(alone[k] - want[k][:, b:b + 1]).max() for k in OUTPUTS[1:]))
    got = run_fastln(m, "LSTM", feeds, 0)
    diff = max(np.abs(got[k] - want[k]).max() for k in OUTPUTS)
    assert 0 < variation < 0.1
    assert diff <= 2 * variation + 2e-3, (diff, variation)
    for b, n in enumerate(QLENGTHS):   # Y is 0 past each length, as in ONNX Runtime
        assert np.all(got["Y"][n:, :, b] == 0)
    if direction == "forward":   # step() runs the int8 weights as forward does
        h0, c0 = feeds["initial_h"], feeds["initial_c"]
        y, _ = m.forward(feeds["X"], (h0, c0), cache=False)
        state = (h0, c0)
        for t in range(QT):
            h, state = m.step(feeds["X"][t], state)
            np.testing.assert_allclose(h, y[t], rtol=1e-6, atol=1e-6)


def test_dynamic_quantize_lstm_uint8(tmp_path):
    """uint8 weights with zero point 128 (the int8 values plus 128) load as the
    same int8 model, as ONNX Runtime runs them alike; a zero point that puts
    q - z outside int8's range is refused."""
    model, qnode, feeds = quantized_case("bidirectional", True, tmp_path)
    arrays = initializers(model)
    shifted = {}
    for k in (1, 2, 9, 11):   # W, R and their zero points
        name = qnode.input[k]
        shifted[name] = (arrays[name].astype(np.int16) + 128).astype(np.uint8)
    unsigned = replace_initializers(model, **shifted)
    m, mu = from_onnx(model), from_onnx(unsigned)
    assert "weights=int8" in repr(mu) and sorted(mu.params) == sorted(m.params)
    for key, value in m.params.items():
        np.testing.assert_array_equal(mu.params[key], value, err_msg=key)
    assert_outputs(ort_run(unsigned, feeds), ort_run(model, feeds), atol=0, rtol=0)
    zero = {qnode.input[9]: np.zeros_like(shifted[qnode.input[9]])}   # q - 0 reaches 255
    with pytest.raises(ValueError, match="'lstm_quant'.*W - W_zero_point.*outside int8"):
        from_onnx(replace_initializers(unsigned, **zero))


def test_dynamic_quantize_lstm_errors(tmp_path):
    """A nonzero zero point of int8 weights, wrong dtypes and shapes of the
    quantized inputs, an attribute of the LSTM operator that ONNX Runtime's
    quantized LSTM lacks (layout), and a missing zero point give clear
    errors."""
    model, qnode, _ = quantized_case("forward", True, tmp_path)
    arrays = initializers(model)
    W, R, W_scale, W_zero, R_zero = (qnode.input[k] for k in (1, 2, 8, 9, 11))
    zero = arrays[W_zero].copy()
    zero[0, 5] = 3
    with pytest.raises(ValueError, match="'lstm_quant': input W_zero_point must be 0 for int8"):
        from_onnx(replace_initializers(model, **{W_zero: zero}))
    with pytest.raises(ValueError, match="input R_zero_point must be 0 for int8"):
        from_onnx(replace_initializers(model, **{R_zero: np.ones(1, np.int8)}))
    with pytest.raises(TypeError, match="input W of node 'lstm_quant' has dtype float32"):
        from_onnx(replace_initializers(model, **{W: arrays[W].astype(np.float32)}))
    with pytest.raises(TypeError, match="input W_zero_point has dtype uint8"):
        from_onnx(replace_initializers(model, **{W_zero: zero.astype(np.uint8)}))
    with pytest.raises(ValueError, match="input W_scale must have shape"):
        from_onnx(replace_initializers(model, **{W_scale: arrays[W_scale][:, :-1]}))
    with pytest.raises(ValueError, match=r"input W must have shape \(num_directions, "
                                         r"input_size, 4\*hidden_size\)"):
        from_onnx(replace_initializers(model, **{W: arrays[W][:, :, :-1]}))
    with pytest.raises(ValueError, match="input R must have shape"):
        from_onnx(replace_initializers(model, **{R: arrays[R][:, 1:]}))
    qnode.attribute.append(helper.make_attribute("layout", 0))   # not an attribute of it
    with pytest.raises(ValueError, match="attribute 'layout' is not one of the "
                                         "DynamicQuantizeLSTM operator's"):
        from_onnx(model)
    qnode.attribute.pop()
    del qnode.input[-1]
    with pytest.raises(ValueError, match="must have the inputs X, W, R, W_scale, "
                                         "W_zero_point, R_scale, R_zero_point"):
        from_onnx(model)


# ---- 4. loading details --------------------------------------------------------

def _lstm(**kw):
    """A bidirectional ONNX LSTM node with the attributes kw, and its arrays."""
    node, arrays = random_case("LSTM", {}, "bidirectional", True, True)
    for key, value in kw.items():
        node.attribute.append(helper.make_attribute(key, value))
    return node, arrays


def _blocks(a, order):
    return np.concatenate([np.split(a, len(order))[i] for i in order])


def test_parameters():
    """The weights land where the docs say, gate blocks reordered, and the
    biases summed exactly as documented."""
    for op, order in (("LSTM", [0, 2, 3, 1]), ("GRU", [1, 0, 2]), ("RNN", [0])):
        node, arrays = random_case(op, {}, "bidirectional", False, False)
        m = from_onnx(make_model(node, arrays))
        for d, suffix in enumerate(["", "_reverse"]):
            W, R, Bias = arrays["W"][d], arrays["R"][d], arrays["B"][d].astype(np.float64)
            wb, rb = np.split(Bias, 2)
            np.testing.assert_array_equal(m.params[f"weight_ih_l0{suffix}"], _blocks(W, order))
            np.testing.assert_array_equal(m.params[f"weight_hh_l0{suffix}"], _blocks(R, order))
            if op == "GRU":
                (wz, wr, wh), (rz, rr, rh) = np.split(wb, 3), np.split(rb, 3)
                want = np.concatenate([wr + rr, wz + rz, wh]).astype(np.float32)
                np.testing.assert_array_equal(m.params[f"bias_l0{suffix}"], want)
                np.testing.assert_array_equal(m.params[f"bias_hn_l0{suffix}"],
                                              rh.astype(np.float32))
            else:
                np.testing.assert_array_equal(m.params[f"bias_l0{suffix}"],
                                              _blocks(wb + rb, order).astype(np.float32))


def test_reverse_names():
    """A reverse-only node: one direction, unsuffixed parameter names."""
    node, arrays = random_case("GRU", {}, "reverse", False, False)
    m = from_onnx(make_model(node, arrays))
    assert m.reverse is True and not m.bidirectional
    assert sorted(m.params) == ["bias_hn_l0", "bias_l0", "weight_hh_l0", "weight_ih_l0"]
    assert m.linear_before_reset is False   # ONNX's default, 0


def test_constant_nodes_path_and_empty_inputs(tmp_path):
    """Weights from Constant nodes; a model read from a path (str and
    pathlib); optional inputs left out with empty names ("" for B)."""
    node, arrays = random_case("LSTM", {}, "forward", True, True)
    node.input[3] = ""                               # no B: zero biases
    model = make_model(node, arrays, constants={"W", "R"})
    assert not model.graph.initializer
    feeds = feeds_of(node, arrays)
    want = ort_run(model, feeds)
    path = tmp_path / "lstm.onnx"
    onnx.save(model, str(path))
    for source in (model, str(path), path):
        m = from_onnx(source)
        assert not np.any(m.params["bias_l0"])
        assert_outputs(run_fastln(m, "LSTM", feeds, 0), want)


def test_default_activations_and_zero_p():
    """Explicit default activations (any case), and an all-zero P, load."""
    node, arrays = random_case("LSTM", {}, "bidirectional", False, False)
    node.attribute.append(helper.make_attribute(
        "activations", ["Sigmoid", "Tanh", "Tanh", "sigmoid", "tanh", "TANH"]))
    node.input.extend(["", "", "", "P"])
    arrays["P"] = np.zeros((2, 3 * H), np.float32)
    model = make_model(node, arrays)
    feeds = feeds_of(node, arrays)
    assert_outputs(run_fastln(from_onnx(model), "LSTM", feeds, 0), ort_run(model, feeds))
    node, arrays = random_case("GRU", {"activations": ["Sigmoid", "Tanh"]}, "forward",
                               False, False)
    assert isinstance(from_onnx(make_model(node, arrays)), GRU)


def _two_nodes():
    """A graph with an RNN feeding a GRU (Squeeze between them)."""
    rnn, arrays = random_case("RNN", {}, "forward", False, False)
    gru, gru_arrays = random_case("GRU", {}, "forward", False, False, seed=1)
    arrays.update({f"g_{k}": v for k, v in gru_arrays.items()})
    arrays["axes"] = np.array([1], np.int64)
    del rnn.output[:]
    rnn.output.extend(["rnn_Y", ""])
    squeeze = helper.make_node("Squeeze", ["rnn_Y", "axes"], ["g_X"], name="squeeze")
    del gru.input[:]
    gru.input.extend(["g_X", "g_W", "g_R", "g_B"])
    # the GRU reads H features
    arrays["g_W"] = np.random.default_rng(5).normal(0, 0.3, (1, 3 * H, H)).astype(np.float32)
    inits = [numpy_helper.from_array(arrays[k], k) for k in ("W", "R", "B", "g_W", "g_R",
                                                              "g_B", "axes")]
    graph = helper.make_graph(
        [rnn, squeeze, gru], "two",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), arrays


def test_node_selection():
    model, arrays = _two_nodes()
    x = np.random.default_rng(6).standard_normal((T, B, I)).astype(np.float32)
    want = ort_run(model, {"X": x})["Y"]
    rnn = from_onnx(model, node="my_rnn")
    gru = from_onnx(model, node="my_gru")
    assert isinstance(rnn, RNN) and isinstance(gru, GRU)
    y_rnn, _ = rnn.forward(x)
    y, _ = gru.forward(y_rnn)
    np.testing.assert_allclose(y, want[:, 0], rtol=RTOL, atol=ATOL)


def _nested(weights_from_input=False):
    """A graph like an exported streaming model's (Silero VAD's, say): an If
    whose branches hold an LSTM each, named alike, their W, R and B computed
    from 2-D constants of the outer graph by Unsqueeze, and a Loop whose body
    holds an RNN."""
    rng = np.random.default_rng(11)

    def lstm_weights(prefix):
        return {f"{prefix}W": rng.normal(0, 0.3, (4 * H, I)).astype(np.float32),
                f"{prefix}R": rng.normal(0, 0.3, (4 * H, H)).astype(np.float32),
                f"{prefix}B": rng.normal(0, 0.3, (8 * H,)).astype(np.float32)}
    arrays = dict(lstm_weights("a_"), **lstm_weights("b_"))
    arrays["zero"] = np.array([0], np.int64)

    def branch(prefix):
        unsq = [helper.make_node("Unsqueeze", [f"{prefix}{w}", "zero"], [f"{prefix}{w}3"],
                                 name=f"unsqueeze_{w}") for w in "WRB"]
        lstm = helper.make_node("LSTM", ["X", f"{prefix}W3", f"{prefix}R3", f"{prefix}B3"],
                                [f"{prefix}Y"], name="lstm", hidden_size=H)
        return helper.make_graph(unsq + [lstm], f"branch_{prefix}", [],
                                 [helper.make_tensor_value_info(f"{prefix}Y", TensorProto.FLOAT,
                                                                None)])
    cond = helper.make_node("If", ["cond"], ["Y"], name="if",
                            then_branch=branch("a_"), else_branch=branch("b_"))
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, None),
              helper.make_tensor_value_info("cond", TensorProto.BOOL, [])]
    if weights_from_input:   # a_W is fed at run time: not a constant
        inputs.append(helper.make_tensor_value_info("a_W", TensorProto.FLOAT, None))
    inits = [numpy_helper.from_array(v, k) for k, v in arrays.items()
             if not (weights_from_input and k == "a_W")]
    graph = helper.make_graph([cond], "nested", inputs,
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), arrays


def test_nodes_inside_if_branches():
    """The LSTMs of an If's branches are found by their paths, their weights
    folded from constants through Unsqueeze, and each matches ONNX Runtime on
    the branch it runs."""
    model, _ = _nested()
    with pytest.raises(ValueError, match="2 LSTM, GRU and RNN nodes: 'if/else_branch/lstm' "
                                         "\\(LSTM\\), 'if/then_branch/lstm' \\(LSTM\\)"):
        from_onnx(model)
    with pytest.raises(ValueError, match="several nodes are named 'lstm'"):
        from_onnx(model, node="lstm")
    x = np.random.default_rng(12).standard_normal((T, B, I)).astype(np.float32)
    for path, flag in (("if/then_branch/lstm", True), ("if/else_branch/lstm", False)):
        m = from_onnx(model, node=path)
        assert isinstance(m, LSTM) and (m.input_size, m.hidden_size) == (I, H)
        want = ort_run(model, {"X": x, "cond": np.array(flag)})["Y"]
        y, _ = m.forward(x)
        np.testing.assert_allclose(y, want[:, 0], rtol=RTOL, atol=ATOL)
    with pytest.raises(ValueError, match="'if/then_branch/unsqueeze_W' is a Unsqueeze node"):
        from_onnx(model, node="if/then_branch/unsqueeze_W")


def test_weights_from_a_graph_input_are_refused():
    model, _ = _nested(weights_from_input=True)
    with pytest.raises(ValueError, match="input W \\('a_W3'\\) must come from initializers "
                                         "and Constant nodes alone: 'a_W' \\(through 'a_W3'\\) "
                                         "is a graph input"):
        from_onnx(model, node="if/then_branch/lstm")
    assert isinstance(from_onnx(model, node="if/else_branch/lstm"), LSTM)


def test_node_inside_a_loop_body():
    """A Loop body's RNN, the model's only recurrent node, is found without
    node=; its weights come from the outer graph's initializers."""
    rnn, arrays = random_case("RNN", {}, "forward", False, False)
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep"), rnn],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info(rnn.output[0], TensorProto.FLOAT, None)])
    loop = helper.make_node("Loop", ["trips", "", ], [rnn.output[0] + "_scan"], name="loop",
                            body=body)
    graph = helper.make_graph(
        [loop], "looped", [helper.make_tensor_value_info("X", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("trips", TensorProto.INT64, [])],
        [helper.make_tensor_value_info(rnn.output[0] + "_scan", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(arrays[k], k) for k in ("W", "R", "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    m = from_onnx(model)
    x = np.random.default_rng(13).standard_normal((T, B, I)).astype(np.float32)
    want = ort_run(model, {"X": x, "trips": np.array(1, np.int64)})[rnn.output[0] + "_scan"]
    y, _ = m.forward(x)
    np.testing.assert_allclose(y, want[0][:, 0], rtol=RTOL, atol=ATOL)


# ---- 5. errors -----------------------------------------------------------------

def _load(node, arrays):
    return from_onnx(make_model(node, arrays))


@pytest.mark.parametrize("attr, value, match", [
    ("clip", 3.0, "clip"),
    ("input_forget", 1, "input_forget"),
    ("activations", ["Sigmoid", "Relu", "Tanh"] * 2, "activations"),
    ("activation_alpha", [1.0], "activation_alpha"),
    ("activation_beta", [1.0], "activation_beta"),
])
def test_unsupported_attributes(attr, value, match):
    node, arrays = _lstm(**{attr: value})
    with pytest.raises(ValueError, match=match):
        _load(node, arrays)


def test_unsupported_layout_and_direction():
    node, arrays = random_case("GRU", {}, "forward", False, False, layout=2)
    with pytest.raises(ValueError, match="layout"):
        _load(node, arrays)
    node, arrays = random_case("GRU", {}, "forward", False, False)
    kept = [a for a in node.attribute if a.name != "direction"]
    del node.attribute[:]
    node.attribute.extend(kept + [helper.make_attribute("direction", "sideways")])
    with pytest.raises(ValueError, match="direction"):
        _load(node, arrays)


def test_activations_errors():
    node, arrays = random_case("RNN", {"activations": ["Tanh", "Relu"]}, "bidirectional",
                               False, False)
    kept = [a for a in node.attribute if a.name != "activations"]
    del node.attribute[:]
    node.attribute.extend(kept + [helper.make_attribute("activations", ["Tanh", "Relu"])])
    with pytest.raises(ValueError, match="activations.*same"):
        _load(node, arrays)
    node, arrays = random_case("RNN", {"activations": ["Sigmoid"]}, "forward", False, False)
    with pytest.raises(ValueError, match="activations"):
        _load(node, arrays)
    node, arrays = random_case("GRU", {"activations": ["Sigmoid"]}, "forward", False, False)
    with pytest.raises(ValueError, match="activations"):   # too few
        _load(node, arrays)


def test_peepholes():
    node, arrays = random_case("LSTM", {}, "forward", False, False)
    node.input.extend(["", "", "", "P"])
    arrays["P"] = np.zeros((1, 3 * H), np.float32)
    arrays["P"][0, 7] = 0.1
    with pytest.raises(ValueError, match="P.*peephole"):
        _load(node, arrays)


def test_weight_errors():
    node, arrays = random_case("LSTM", {}, "forward", False, False)
    model = make_model(node, arrays)
    kept = [t for t in model.graph.initializer if t.name != "R"]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    model.graph.input.append(helper.make_tensor_value_info("R", TensorProto.FLOAT, None))
    with pytest.raises(ValueError, match="input R"):   # a graph input, not a constant
        from_onnx(model)
    for dtype in (np.float16, np.int32):
        bad = dict(arrays, W=arrays["W"].astype(dtype), R=arrays["R"].astype(dtype),
                   B=arrays["B"].astype(dtype))
        with pytest.raises(TypeError, match="W"):
            _load(node, bad)
    with pytest.raises(TypeError, match="R"):
        _load(node, dict(arrays, R=arrays["R"].astype(np.float64)))
    with pytest.raises(ValueError, match="input R"):
        _load(node, dict(arrays, R=arrays["R"][:, :, :-1]))
    with pytest.raises(ValueError, match="input B"):
        _load(node, dict(arrays, B=arrays["B"][:, :-1]))
    with pytest.raises(ValueError, match="input W"):   # 2 directions for "forward"
        _load(node, dict(arrays, W=np.concatenate([arrays["W"]] * 2)))
    kept = [a for a in node.attribute if a.name != "hidden_size"]
    del node.attribute[:]
    node.attribute.extend(kept + [helper.make_attribute("hidden_size", H + 1)])
    with pytest.raises(ValueError, match="hidden_size"):
        _load(node, arrays)


def test_node_errors():
    relu = helper.make_node("Relu", ["X"], ["X2"], name="relu")
    graph = helper.make_graph([relu], "g", [helper.make_tensor_value_info(
        "X", TensorProto.FLOAT, None)], [helper.make_tensor_value_info(
            "X2", TensorProto.FLOAT, None)])
    with pytest.raises(ValueError, match="no LSTM, GRU or RNN node.*'relu'"):
        from_onnx(helper.make_model(graph))
    model, _ = _two_nodes()
    with pytest.raises(ValueError, match="'my_rnn' \\(RNN\\).*'my_gru' \\(GRU\\)"):
        from_onnx(model)
    with pytest.raises(ValueError, match="'nope'"):
        from_onnx(model, node="nope")
    with pytest.raises(ValueError, match="'squeeze'.*Squeeze"):
        from_onnx(model, node="squeeze")


def test_argument_types():
    node, arrays = random_case("RNN", {}, "forward", False, False)
    model = make_model(node, arrays)
    for bad in (None, 3, model.graph, model.SerializeToString()):
        with pytest.raises(TypeError, match="model"):
            from_onnx(bad)
    with pytest.raises(TypeError, match="node"):
        from_onnx(model, node=0)


def test_onnx_missing(monkeypatch):
    node, arrays = random_case("RNN", {}, "forward", False, False)
    model = make_model(node, arrays)
    monkeypatch.setitem(sys.modules, "onnx", None)   # import onnx raises ImportError
    with pytest.raises(ImportError, match=r"pip install \"fastln\[onnx\]\""):
        from_onnx(model)


# ---- 6. import, docstring --------------------------------------------------------

def test_import_does_not_load_onnx():
    code = ("import sys, fastln, fastln.rnn; "
            "assert 'onnx' not in sys.modules, 'onnx imported'; "
            "assert 'onnxruntime' not in sys.modules")
    root = pathlib.Path(fastln.rnn._onnx.__file__).resolve().parents[2]   # this fastln's
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(root))


def test_docstring_example():
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = [t for t in finder.find(fastln.rnn) if t.examples]
    assert any(t.name.endswith("from_onnx") for t in tests)
    for t in tests:
        runner.run(t)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0 and result.failed == 0
