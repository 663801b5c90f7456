"""The LSTMP benchmark: fastln.rnn.LSTM(proj_size=P) against
torch.nn.LSTM(proj_size=P) and ONNX Runtime, forward over a sequence and
one streaming step.

    python bench/lstmp.py [--quick] [--threads 2] [--batch 1,8,32] [--input 512]
                          [--hidden 1024] [--proj 256] [--steps 100] [--no-export]
                          [--json PATH]

The case is one layer of the encoder of icefall's LSTM transducer
(egs/librispeech/ASR/lstm_transducer_stateless*/lstm.py, ``RNNEncoderLayer``:
``ScaledLSTM(input_size=d_model, hidden_size=rnn_hidden_size,
proj_size=d_model)``, d_model = 512 and rnn_hidden_size = 1024 by default):
I = 512, H = 1024, and P = 256 unless --proj says otherwise (icefall's own
default projects to P = d_model = 512), at B = 1, 8, 32, float32 input:

- forward: y over T = 100 steps from a zero state (fastln's
  ``forward(x, cache=False)``; the others under ``torch.inference_mode()``
  or in an ONNX Runtime session);
- step: one step of B streams with the state carried from call to call
  (fastln's ``step()`` writing the state in place; ``torch.nn.LSTM`` at
  T = 1 given its state; an ONNX Runtime session of one step fed its state
  back), each sample at least 20 ms of calls (see STEP_MIN_SAMPLE).

Rows: fastln float32 (``LSTM.from_torch`` of the torch module, so that every
peer has the same weights), the same with its weight matrices over bytes
objects (``np.frombuffer``: memory nothing can write, which the engine packs
for its kernels once and keeps, see docs/guide/recurrent.md, "Weights,
threads and guarantees"), fastln int8 (``fastln.rnn.quantize``), fastln
bfloat16 (``.to(ml_dtypes.bfloat16)``: AVX512-BF16 dot products where the
CPU has them, widened to float32 elsewhere), torch.nn.LSTM(proj_size=P) in
float32 and bfloat16, and ONNX Runtime.

ONNX Runtime and the exporters. ONNX's LSTM operator has no projection, and
neither of torch's exporters writes a model of nn.LSTM(proj_size) that runs:
the TorchScript exporter (``dynamo=False``) refuses it ("Unsupported: ONNX
export of operator LSTM, LSTMs with projections"); the dynamo exporter
(torch.onnx.export's default, which needs onnxscript) maps ``aten::lstm``
to one ONNX LSTM node of hidden_size P that leaves W_hr out (onnxscript
0.7.2), and ONNX Runtime refuses to run that model ("Input initial_c must
have shape {1,B,P}"). :func:`probe_exporters` tries both on a tiny module
and the run reports what each did. Two ONNX models that do run are timed:

- "ORT, Scan graph": a graph written here with onnx.helper, the projected
  cell (torch's equations, gates i, f, g, o) in the body of a Scan over
  time, after one MatMul of the input projection over all steps; its step
  is the cell alone;
- "ORT, unrolled export": ``torch.export.export`` of the module (batch
  dynamic), ``run_decompositions()`` (torch's decomposition of aten::lstm,
  which handles the projection, unrolled over the T steps), then
  ``torch.onnx.export``; it needs onnxscript, takes a minute or more to
  export at T = 100, and is left out under --quick and --no-export.

Each peer's y (forward over the first 10 steps, and 10 steps of its step
function from a zero state) must match torch float32's: rtol = atol = 1e-4
in float32, 5e-2 for int8 and bfloat16; else AssertionError before timing.

Ratios and their targets, per batch, forward and step: fastln float32 (as
from_torch gives it, and packed once) / torch float32 <= 0.9; the same over
ONNX Runtime (the faster ORT row) <= 1.0; fastln int8 / fastln float32
packed once <= 0.5 (int8 and bfloat16 weights are packed once too; fastln
bfloat16 / fastln float32 packed once is shown without a target). Timing
follows bench/torch_modules.py: ``fastln._selfcheck.time_peers`` times the
callables in turns, medians per call; every peer runs on the same thread count (``fastln.threads``,
``torch.set_num_threads``, ORT's intra_op_num_threads). A fastln build
without proj_size leaves fastln's rows empty with a note, and times the rest.
"""
import argparse
import contextlib
import copy
import io
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # the repository root, for an in-place build

import numpy as np  # noqa: E402

import fastln  # noqa: E402
from bench import harness  # noqa: E402
from fastln import _selfcheck  # noqa: E402
from fastln import rnn as fastln_rnn  # noqa: E402
from fastln.rnn._formats import frozen  # noqa: E402

torch = harness.torch           # None when torch is not installed
ort = harness.ort
try:
    from onnx import TensorProto, helper, numpy_helper
except ImportError:
    helper = None

CASE = dict(I=512, H=1024, P=256, T=100)
BATCHES = (1, 8, 32)
CHECK_STEPS = 10
# a step's sample is at least this many seconds of calls: the first call after
# the other peers ran reads the weights from memory (theirs evicted them from the
# cache), and a stream that steps one model over and over pays that once
STEP_MIN_SAMPLE = 0.02
TOL = {"float32": 1e-4, "int8": 5e-2, "bfloat16": 5e-2}   # rtol = atol, against torch float32
ORT_OPSET = 18
NO_ONNXSCRIPT = "needs onnxscript, which is not installed"

# peer key -> (label, dtype, thread pool for time_peers' groups)
PEERS = {
    "fastln": ("fastln float32", "float32", "fastln"),
    "fastln_once": ("fastln float32, packed once", "float32", "fastln"),
    "fastln_int8": ("fastln int8", "int8", "fastln"),
    "fastln_bf16": ("fastln bfloat16", "bfloat16", "fastln"),
    "torch": ("torch float32", "float32", "torch"),
    "torch_bf16": ("torch bfloat16", "bfloat16", "torch"),
    "ort_scan": ("ORT, Scan graph", "float32", "ort"),
    "ort_export": ("ORT, unrolled export", "float32", "ort"),
}
ORT_PEERS = ("ort_scan", "ort_export")
# ratio name -> (numerator, denominators (the fastest present), at most this or None)
RATIOS = {
    "fastln f32 / torch f32": ("fastln", ("torch",), 0.9),
    "fastln f32 packed once / torch f32": ("fastln_once", ("torch",), 0.9),
    "fastln f32 / ORT": ("fastln", ORT_PEERS, 1.0),
    "fastln f32 packed once / ORT": ("fastln_once", ORT_PEERS, 1.0),
    "fastln int8 / fastln f32 packed once": ("fastln_int8", ("fastln_once",), 0.5),
    "fastln bf16 / fastln f32 packed once": ("fastln_bf16", ("fastln_once",), None),
}


def fastln_lstmp_error():
    """None when this fastln loads nn.LSTM(proj_size), else why not."""
    if torch is None:
        return "torch is not installed"
    try:
        fastln_rnn.LSTM.from_torch(torch.nn.LSTM(2, 3, proj_size=1))
    except (TypeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def have_onnxscript():
    try:
        import onnxscript  # noqa: F401
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def _quiet():
    """The exporters' warnings and progress lines off: Python's warnings, and
    what is written to file descriptors 1 and 2 (the TorchScript exporter
    prints its graph from C++)."""
    saved = [os.dup(fd) for fd in (1, 2)]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        with open(os.devnull, "w") as null, warnings.catch_warnings(), \
                contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            for fd in (1, 2):
                os.dup2(null.fileno(), fd)
            yield
    finally:
        for fd, dup in zip((1, 2), saved):
            os.dup2(dup, fd)
            os.close(dup)


# ---- ONNX Runtime ----------------------------------------------------------------

def _cell_nodes(gates_x, h, c):
    """The nodes of one projected LSTM step, torch's gate order i, f, g, o, on
    states of shape (1, B, n): gates = gates_x + h R^T; c_new = f*c + i*g;
    h_new = (o * tanh(c_new)) W_hr^T. R^T and W_hr^T are the outer graph's
    initializers "RT" and "WhrT"."""
    mk = helper.make_node
    return [
        mk("MatMul", [h, "RT"], ["hR"]),
        mk("Add", [gates_x, "hR"], ["gates"]),
        mk("Split", ["gates"], ["gi", "gf", "gg", "go"], axis=-1, num_outputs=4),
        mk("Sigmoid", ["gi"], ["i"]), mk("Sigmoid", ["gf"], ["f"]),
        mk("Tanh", ["gg"], ["g"]), mk("Sigmoid", ["go"], ["o"]),
        mk("Mul", ["f", c], ["fc"]), mk("Mul", ["i", "g"], ["ig"]),
        mk("Add", ["fc", "ig"], ["c_new"]),
        mk("Tanh", ["c_new"], ["tc"]), mk("Mul", ["o", "tc"], ["m"]),
        mk("MatMul", ["m", "WhrT"], ["h_new"]),
    ]


def _initializers(module):
    """The outer graph's initializers: W_ih^T, R^T = W_hh^T, W_hr^T and the
    summed bias, float32, from the torch module, and the axes [0]."""
    sd = {k: v.detach().float().numpy() for k, v in module.state_dict().items()}
    arrays = (("WiT", sd["weight_ih_l0"].T), ("RT", sd["weight_hh_l0"].T),
              ("WhrT", sd["weight_hr_l0"].T), ("b", sd["bias_ih_l0"] + sd["bias_hh_l0"]))
    return ([numpy_helper.from_array(np.ascontiguousarray(a, np.float32), name)
             for name, a in arrays] + [numpy_helper.from_array(np.zeros(1, np.int64), "axis0")])


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def ort_scan_models(module):
    """(forward model, step model) of the one-layer projected LSTM ``module``
    as ONNX graphs written here, both with inputs x (T, B, I), h0 (1, B, P),
    c0 (1, B, H) and outputs y (T, B, P), h, c (T = 1 for the step model):
    the input projection one MatMul over all steps, then the cell in the body
    of a Scan over T (the step model: the cell alone)."""
    I, H, P = module.input_size, module.hidden_size, module.proj_size
    mk = helper.make_node
    inputs = [_vi("x", ["T", "B", I]), _vi("h0", [1, "B", P]), _vi("c0", [1, "B", H])]
    outputs = [_vi("y", ["T", "B", P]), _vi("h", [1, "B", P]), _vi("c", [1, "B", H])]
    project = [mk("MatMul", ["x", "WiT"], ["xW"]), mk("Add", ["xW", "b"], ["gx"])]
    body = helper.make_graph(
        _cell_nodes("gx_t", "h_t", "c_t") + [mk("Squeeze", ["h_new", "axis0"], ["y_t"])],
        "cell", [_vi("h_t", [1, "B", P]), _vi("c_t", [1, "B", H]), _vi("gx_t", ["B", 4 * H])],
        [_vi("h_new", [1, "B", P]), _vi("c_new", [1, "B", H]), _vi("y_t", ["B", P])])
    fwd = helper.make_graph(
        project + [mk("Scan", ["h0", "c0", "gx"], ["h", "c", "y"], body=body,
                      num_scan_inputs=1)],
        "lstmp", inputs, outputs, _initializers(module))
    step = helper.make_graph(
        project + _cell_nodes("gx", "h0", "c0")
        + [mk("Identity", ["h_new"], ["y"]), mk("Identity", ["h_new"], ["h"]),
           mk("Identity", ["c_new"], ["c"])],
        "lstmp_step", inputs, outputs, _initializers(module))
    opset = [helper.make_opsetid("", ORT_OPSET)]
    return (helper.make_model(fwd, opset_imports=opset),
            helper.make_model(step, opset_imports=opset))


def export_unrolled(module, T):
    """The ONNX model (an onnx ModelProto) that torch.onnx.export writes of
    ``module`` at sequence length T, batch dynamic, after torch's
    decomposition of aten::lstm: inputs x (T, B, I), h0 (1, B, P), c0
    (1, B, H); outputs y, h, c. Needs onnxscript."""
    from torch.export import Dim
    I, H, P = module.input_size, module.hidden_size, module.proj_size
    args = (torch.zeros(T, 2, I), (torch.zeros(1, 2, P), torch.zeros(1, 2, H)))
    b = Dim("batch")
    with _quiet():
        ep = torch.export.export(module, args, dynamic_shapes=({1: b}, ({1: b}, {1: b})))
        return torch.onnx.export(ep.run_decompositions(), dynamo=True,
                                 verbose=False).model_proto


def probe_exporters(I=8, H=16, P=4, T=5, B=2):
    """What each torch.onnx exporter does with a tiny nn.LSTM(proj_size):
    {"torchscript": text, "dynamo": text}, the text "writes a model that ONNX
    Runtime runs and that agrees with torch" or says what went wrong."""
    module = torch.nn.LSTM(I, H, proj_size=P).eval()
    x, h0, c0 = torch.randn(T, B, I), torch.zeros(1, B, P), torch.zeros(1, B, H)
    with torch.inference_mode():
        want = module(x, (h0, c0))[0].numpy()
    out = {}
    for name, dynamo in (("torchscript", False), ("dynamo", True)):
        if dynamo and not have_onnxscript():
            out[name] = NO_ONNXSCRIPT
            continue
        f = io.BytesIO()
        try:
            with _quiet():
                prog = torch.onnx.export(module, (x, (h0, c0)), None if dynamo else f,
                                         dynamo=dynamo)
            data = prog.model_proto.SerializeToString() if dynamo else f.getvalue()
        except Exception as e:
            out[name] = f"export fails: {type(e).__name__}: {_first_line(e)}"
            continue
        try:
            sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
            feeds = dict(zip((i.name for i in sess.get_inputs()),
                             (x.numpy(), h0.numpy(), c0.numpy())))
            y = sess.run(None, feeds)[0]
        except Exception as e:
            out[name] = f"ONNX Runtime refuses the model: {_first_line(e)}"
            continue
        err = harness._max_err(y, want) if y.shape == want.shape else None
        out[name] = ("writes a model that ONNX Runtime runs and that agrees with torch"
                     if err is not None and err < 1e-5 else
                     f"writes a model whose y disagrees with torch's (max|diff| {err})")
    return out


def _first_line(e):
    """The gist of an exception's text: ONNX Runtime's status message, or
    the first sentence, at most 200 characters."""
    text = str(e).strip()
    if "Status Message: " in text:
        text = text.split("Status Message: ", 1)[1]
    elif ". " in text:
        text = text.split(". ", 1)[0]
    return text.splitlines()[0][:200] if text else type(e).__name__


# ---- the peers --------------------------------------------------------------------

def _fastln_models(module):
    """{peer key: fastln model} of the torch module: float32 as from_torch
    gives it and with its weights over bytes, int8, and bfloat16 with ml_dtypes."""
    m = fastln_rnn.LSTM.from_torch(module)
    once = fastln_rnn.LSTM.from_torch(module)
    for key, a in once.params.items():      # over bytes: the engine packs them once and keeps
        once.params[key] = frozen(a)
    models = {"fastln": m, "fastln_once": once, "fastln_int8": fastln_rnn.quantize(m)}
    if harness.ml_dtypes is not None:
        models["fastln_bf16"] = m.to(harness.ml_dtypes.bfloat16)
    return models


def _fastln_fns(m, x):
    """(forward fn, step fn, step-from-zero fn) of fastln model m on x (T, B, I)."""
    state = [None]

    def step(x_t=x[0]):
        state[0] = m.step(x_t, state[0], state_out=state[0])[1]

    def steps(n):
        st, ys = None, []
        for t in range(n):
            y, st = m.step(x[t], st)
            ys.append(np.asarray(y, np.float32))
        return np.stack(ys)
    return lambda: m.forward(x, cache=False)[0], step, steps


def _torch_fns(module, x, dtype):
    """The same three functions of a torch nn.LSTM, in dtype (torch's name)."""
    P, H = module.proj_size, module.hidden_size
    dt = getattr(torch, dtype)
    mod = module if dtype == "float32" else copy.deepcopy(module).to(dt)
    xt = torch.from_numpy(x).to(dt)
    B = x.shape[1]
    zero = (torch.zeros(1, B, P, dtype=dt), torch.zeros(1, B, H, dtype=dt))
    state = [zero]

    def fwd():
        with torch.inference_mode():
            return mod(xt, zero)[0]

    def step():
        with torch.inference_mode():
            state[0] = mod(xt[:1], state[0])[1]

    def steps(n):
        with torch.inference_mode():
            st, ys = zero, []
            for t in range(n):
                y, st = mod(xt[t:t + 1], st)
                ys.append(y[0])
            return torch.stack(ys)
    return fwd, step, steps


def _ort_fns(fwd_model, step_model, x, threads):
    """The three functions of an ONNX Runtime forward model and step model,
    each with inputs x, h0 (1, B, P), c0 (1, B, H) and outputs y, h, c."""
    B = x.shape[1]
    fsess = _selfcheck.ort_session_of(fwd_model, threads, spin=True)
    ssess = _selfcheck.ort_session_of(step_model, threads, spin=True)
    shapes = [i.shape for i in fsess.get_inputs()[1:]]
    zero = [np.zeros((1, B, s[2]), np.float32) for s in shapes]
    fin = [i.name for i in fsess.get_inputs()]
    sin = [i.name for i in ssess.get_inputs()]
    state = list(zero)

    def fwd():
        return fsess.run(None, dict(zip(fin, [x] + zero)))[0]

    def step():
        state[:] = ssess.run(None, dict(zip(sin, [x[:1]] + state)))[1:]

    def steps(n):
        st, ys = list(zero), []
        for t in range(n):
            y, *st = ssess.run(None, dict(zip(sin, [x[t:t + 1]] + st)))
            ys.append(y[0])
        return np.stack(ys)
    return fwd, step, steps


# ---- checks and timing ------------------------------------------------------------

def _check(label, y, want, tol):
    """max|y - want| over the first CHECK_STEPS steps; AssertionError past tol."""
    ns = min(CHECK_STEPS, len(want))
    y = (y.detach().float().numpy() if torch is not None and isinstance(y, torch.Tensor)
         else np.asarray(y, np.float32))[:ns]
    want = want[:ns]
    if y.shape != want.shape or not np.allclose(y, want, rtol=tol, atol=tol):
        raise AssertionError(f"{label}: y (first {ns} steps) disagrees with torch float32's: "
                             f"max|diff| = {harness._max_err(y, want):.3g} (rtol=atol={tol:g}); "
                             "not timing it")
    return harness._max_err(y, want)


def _peers(module, x, threads, models):
    """{peer key: (forward fn, step fn, steps fn)} of every peer set up, and
    notes on those that are not. models: "fastln" (fastln's models, or the
    reason there are none), "ort_export" (ONNX models, or a reason)."""
    fns, notes = {}, []
    if isinstance(models["fastln"], str):
        notes.append(f"fastln: no LSTMP ({models['fastln']})")
    else:
        fns.update({k: _fastln_fns(m, x) for k, m in models["fastln"].items()})
    fns["torch"] = _torch_fns(module, x, "float32")
    try:
        fns["torch_bf16"] = _torch_fns(module, x, "bfloat16")
        fns["torch_bf16"][2](1)
    except Exception as e:      # an old torch without bfloat16 LSTMs on the CPU
        fns.pop("torch_bf16")
        notes.append(f"torch bfloat16: {type(e).__name__}: {_first_line(e)}")
    for key in ORT_PEERS:
        if isinstance(models[key], str):
            notes.append(f"{PEERS[key][0]}: {models[key]}")
        else:
            fns[key] = _ort_fns(*models[key], x, threads)
    return fns, notes


def _bench_batch(module, B, models, kw, gap, threads, case, seed=0):
    """One batch: a row with 'B', 'times' {'forward', 'step'}: {peer: median
    s/call}, 'maxdiff' {peer: {'forward', 'step'}}, 'ratios' {name: {'forward',
    'step'}} and 'notes'."""
    T, I = case["T"], case["I"]
    x = np.random.default_rng(seed + B).standard_normal((T, B, I), dtype=np.float32)
    fns, notes = _peers(module, x, threads, models)
    with torch.inference_mode():
        want = fns["torch"][0]().numpy()
    maxdiff, ns = {}, min(CHECK_STEPS, T)
    for key, (fwd, _, steps) in fns.items():
        label, dtype, _ = PEERS[key]
        maxdiff[key] = {"forward": _check(f"{label} forward B={B}", fwd(), want, TOL[dtype]),
                        "step": _check(f"{label} step() B={B}", steps(ns), want,
                                       TOL[dtype])}
    groups = {k: PEERS[k][2] for k in fns}
    times = {}
    for i, part in enumerate(("forward", "step")):
        _progress(f"{threads} thread(s), B={B}: {part}")
        part_kw = kw if part == "forward" else dict(
            kw, min_sample=max(kw["min_sample"], STEP_MIN_SAMPLE))
        times[part] = dict.fromkeys(PEERS)
        times[part].update(_selfcheck.time_peers({k: f[i] for k, f in fns.items()}, gap=gap,
                                                 groups=groups, **part_kw))
    return {"B": B, "times": times, "maxdiff": maxdiff, "ratios": _ratios(times),
            "notes": notes}


def _ratios(times):
    out = {}
    for name, (num, dens, _) in RATIOS.items():
        out[name] = {}
        for part, t in times.items():
            den = min((t[d] for d in dens if t.get(d) is not None), default=None)
            out[name][part] = t[num] / den if t.get(num) is not None and den else None
    return out


_RUN_START = [time.perf_counter()]


def _progress(what):
    print(f"  lstmp [{time.perf_counter() - _RUN_START[0]:.0f} s] {what}", file=sys.stderr,
          flush=True)


def timing_kw(quick):
    return (dict(repeats=5, budget=0.5, min_sample=1e-3, min_repeats=3) if quick
            else dict(repeats=15, budget=2.0, min_sample=2e-3, min_repeats=5))


def _ort_export_models(module, T, export):
    """(forward, step) models of the unrolled export, or why there are none."""
    if ort is None or helper is None:
        return "needs onnx and onnxruntime"
    if not export:
        return "left out (--quick or --no-export)"
    if not have_onnxscript():
        return NO_ONNXSCRIPT
    _progress(f"exporting the unrolled model at T={T} and T=1")
    return export_unrolled(module, T), export_unrolled(module, 1)


def run(threads=2, quick=False, batches=BATCHES, case=CASE, export=True, probe=True,
        timing=None, seed=0):
    """Every batch at the thread count. Returns a JSON-friendly dict: 'info',
    'quick', 'elapsed_s', 'case', 'threads', 'exporters' (probe_exporters()'s,
    or None), 'fastln' (why fastln has no LSTMP, or None), 'rows'."""
    if torch is None:
        raise RuntimeError("the LSTMP benchmark needs torch")
    kw = timing or timing_kw(quick)
    t0 = _RUN_START[0] = time.perf_counter()
    torch.manual_seed(seed)
    module = torch.nn.LSTM(case["I"], case["H"], proj_size=case["P"]).eval()
    why = fastln_lstmp_error()
    models = {"fastln": why or _fastln_models(module),
              "ort_scan": ("needs onnx and onnxruntime" if ort is None or helper is None
                           else ort_scan_models(module)),
              "ort_export": _ort_export_models(module, case["T"], export and not quick)}
    exporters = None
    if probe and ort is not None:
        _progress("trying torch.onnx.export on a tiny nn.LSTM(proj_size)")
        exporters = probe_exporters()
    info = harness.machine_info()
    rows = []
    saved = harness.peer_threads()
    try:
        with _selfcheck.OtherLoad() as load, warnings.catch_warnings():
            # torch says once that its CPU LSTMP runs its own kernels, not oneDNN's
            warnings.filterwarnings("ignore", "LSTM with projections is not supported")
            harness.set_peer_threads(threads)     # first: torch may share fastln's libgomp
            gap = _selfcheck.SPIN_GAP if threads > 1 else 0.0
            with fastln.threads(threads):
                for B in batches:
                    rows.append(_bench_batch(module, B, models, kw, gap, threads, case, seed))
    finally:
        harness.restore_peer_threads(saved)
    info["cpu_other_load"] = load.fraction
    return {"info": info, "quick": quick, "elapsed_s": time.perf_counter() - t0,
            "case": dict(case), "threads": threads, "exporters": exporters, "fastln": why,
            "rows": rows}


# ---- formatting -------------------------------------------------------------------

def _ms(t):
    return "-" if t is None else f"{t * 1e3:.3f}"


def _us(t):
    return "-" if t is None else f"{t * 1e6:.0f}"


def _x(r):
    return "-" if r is None else f"{r:.2f}x"


def time_rows(rows):
    """The cells of the times table: case, forward ms, step us, max|diff|."""
    cells = []
    for r in rows:
        for key, (label, _, _) in PEERS.items():
            t = {part: r["times"][part][key] for part in ("forward", "step")}
            d = r["maxdiff"].get(key)
            cells.append([f"B={r['B']} {label}", _ms(t["forward"]), _us(t["step"]),
                          "-" if d is None else f"{max(d.values()):.1e}"])
    return ["case", "forward ms", "step us", "max|diff| vs torch f32"], cells


def ratio_rows(rows):
    """The cells of the ratios table: ratio, target, one column per batch and
    part, met (every present ratio within the target)."""
    cells = []
    for name, (_, _, target) in RATIOS.items():
        vals = [r["ratios"][name][part] for r in rows for part in ("forward", "step")]
        got = [v for v in vals if v is not None]
        met = "" if target is None else (
            "-" if not got else ("yes" if all(v <= target for v in got) else "NO"))
        cells.append([name, "" if target is None else f"<= {target:.2f}x"]
                     + [_x(v) for v in vals] + [met])
    heads = (["ratio", "target"]
             + [f"B={r['B']} {p}" for r in rows for p in ("fwd", "step")] + ["met"])
    return heads, cells


def format_table(result, markdown=False):
    c = result["case"]
    lines = [f"LSTMP, one layer, I={c['I']} H={c['H']} P={c['P']}, forward over T={c['T']} "
             f"and one step(), float32 input, {result['threads']} thread(s):", ""]
    if result["fastln"]:
        lines += [f"fastln has no LSTMP here ({result['fastln']}): its rows are empty.", ""]
    lines += harness.table_lines(*time_rows(result["rows"]), markdown)
    lines += [""] + harness.table_lines(*ratio_rows(result["rows"]), markdown)
    notes = sorted({n for r in result["rows"] for n in r["notes"]})
    if result["exporters"]:
        notes += [f"torch.onnx.export ({k}) of nn.LSTM(proj_size): {v}"
                  for k, v in result["exporters"].items()]
    if notes:
        lines += [""] + [f"note: {n}" for n in notes]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="fewer samples, and no unrolled export")
    ap.add_argument("--threads", type=int, default=2, help="threads of every peer (default 2)")
    ap.add_argument("--batch", default=",".join(map(str, BATCHES)),
                    help="comma-separated batch sizes (default 1,8,32)")
    for flag, key in (("--input", "I"), ("--hidden", "H"), ("--proj", "P"), ("--steps", "T")):
        ap.add_argument(flag, type=int, default=CASE[key], help=f"default {CASE[key]}")
    ap.add_argument("--no-export", action="store_true",
                    help="leave out the unrolled export (it takes a minute or more)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = ap.parse_args(argv)
    batches = harness.parse_counts(ap, args.batch, "--batch")
    case = {"I": args.input, "H": args.hidden, "P": args.proj, "T": args.steps}
    if args.threads < 1 or min(case.values()) < 1 or case["P"] >= case["H"]:
        ap.error("--threads, --input, --hidden, --proj and --steps must be positive, "
                 "and --proj below --hidden")
    if args.json is not None:
        _selfcheck.check_output_path(ap, "--json", args.json)
    if torch is None:
        print("torch is not installed: the LSTMP benchmark has nothing to run", file=sys.stderr)
        return 1
    harness.warn_if_busy()
    print(f"fastln {fastln.__version__}, torch {torch.__version__}, LSTMP benchmark, "
          f"{args.threads} thread(s){' (quick)' if args.quick else ''} ...", flush=True)
    result = run(threads=args.threads, quick=args.quick, batches=batches, case=case,
                 export=not args.no_export)
    print()
    print(format_table(result))
    harness.report_and_save(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
