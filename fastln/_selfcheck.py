"""Timing for ``python -m fastln``: medians of samples taken in turns, the
machine's description and load, a short table of float32 LayerNorm
(forward and backward) against NumPy, PyTorch and ONNX Runtime where installed,
and a row of the int8 LSTM (:func:`fastln.rnn.quantize`) against its float32
model and ONNX Runtime's dynamically quantized LSTM where installed.

The wider benchmark (more cases, JAX, RESULTS.md) is bench/run.py; its
machinery, bench/harness.py, builds on the timing, the machine description
and the peers here. Timings are medians; peers are timed in turns within one
process (each round times every peer once), and results are quoted as ratios
of medians. The bandwidth ceiling is fastln's own parallel copy of the same
bytes on the same threads.
"""
import contextlib
import importlib
import logging
import os
import platform
import statistics
import tempfile
import time
import warnings

import numpy as np

import fastln
from fastln import _lib

EPS = 1e-5
SPIN_GAP = 12e-3            # see time_peers: longer than libgomp's default spin
# peers whose worker threads may busy-wait after a call: JAX's pool, and fastln's
# and torch's OpenMP workers where their runtime spins long (loaded before
# fastln, or OMP_WAIT_POLICY=active; see fastln.get_wait_policy)
SPINNING = {"fastln", "torch", "jax"}
RTOL = ATOL = 1e-4          # float32 agreement between peers
# int8 LSTM y against the float32 model's y: above a correct int8 model's
# error, below that of wrong scales or products (docs/performance.md has the
# evidence)
INT8_TOL = 0.05
# fastln's int8 y against ONNX Runtime's int8 y on the same weights (a scale
# per matrix there, per row here): each is within INT8_TOL of the float32 y,
# so the two are within twice that of each other
INT8_PEER_TOL = 2 * INT8_TOL
# A single call slower than min_sample but faster than this is timed again while
# calibrating (its first call may be a cold one: a thread pool woken from sleep),
# and is preceded by an untimed call after each pause between peers.
WAKE_MAX = 0.05


def _one_sample(fn, inner):
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


def _calibrate(fn, min_sample):
    """Calls per sample so that one takes >= min_sample seconds; the seconds per call seen."""
    inner, retried = 1, False
    while True:
        t = _one_sample(fn, inner)
        if inner == 1 and not retried and min_sample <= t < WAKE_MAX:
            retried = True          # maybe a cold call: look again
            continue
        if t * inner >= min_sample or inner >= 1 << 20:
            return inner, t
        inner = max(inner * 2, min(int(min_sample / max(t, 1e-9) * 1.2) + 1, inner * 100))


def time_peers(fns, repeats=15, min_sample=2e-3, budget=None, min_repeats=3,
               warmup=1, gap=0.0, groups=None, spinning=None):
    """{name: median seconds per call} of the callables ``fns`` (name -> fn), timed in turns.

    Each fn is warmed up and given an inner repeat count so that a sample takes
    >= ``min_sample`` s; then each of ``repeats`` rounds times every fn once, so
    that drifts in the machine's load hit all alike. ``budget`` (s) caps the
    time of any one fn (at least ``min_repeats`` samples; a fn whose samples took
    3 * budget gets no more). Spinning thread pools: libgomp's workers busy-wait
    for a while after a parallel region and take a core from whatever runs next;
    so before a sample whose ``groups`` entry (a pool's name; default the fn's
    own) differs from the last one's, sleep ``gap`` s (only after a group in
    ``spinning``, when given), then make one untimed call to wake this fn's pool.
    """
    groups = groups or {}
    plan = {}
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
        inner, t = _calibrate(fn, min_sample)
        n = repeats
        if budget is not None:
            n = max(min_repeats, min(repeats, int(budget / max(t * inner, 1e-9))))
        plan[name] = (fn, inner, n, inner > 1 or t < WAKE_MAX)
    samples = {name: [] for name in fns}
    spent = dict.fromkeys(fns, 0.0)
    last = None
    for r in range(max((p[2] for p in plan.values()), default=0)):
        for name, (fn, inner, n, wake) in plan.items():
            if r >= n or (budget is not None and r >= min_repeats and spent[name] > 3 * budget):
                continue
            group = groups.get(name, name)
            if gap and group != last:
                if spinning is None or last is None or last in spinning:
                    time.sleep(gap)
                if wake:
                    fn()
            last = group
            t = _one_sample(fn, inner)
            spent[name] += t * inner
            samples[name].append(t)
    return {name: statistics.median(s) for name, s in samples.items()}


# ---- the machine --------------------------------------------------------------

def import_optional(name):
    """The module ``name``, or None where it cannot be imported (a peer that is
    not installed, or a broken install)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module(name)
    except Exception:
        return None


# the peers timed here (bench/harness.py's too), each None where it is missing
torch = import_optional("torch")
ort = import_optional("onnxruntime")
onnx = import_optional("onnx") if ort is not None else None
ort_quant = import_optional("onnxruntime.quantization") if onnx is not None else None


def versions():
    """{name: version or None} of Python, NumPy, fastln and the peers timed here."""
    return {"python": platform.python_version(), "numpy": np.__version__,
            "fastln": fastln.__version__, "torch": getattr(torch, "__version__", None),
            "onnxruntime": getattr(ort, "__version__", None),
            "onnx": getattr(onnx, "__version__", None)}


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(peer_versions=None):
    """The machine, the versions (``peer_versions``, default :func:`versions`), fastln's setup."""
    import datetime
    return {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "cpu": cpu_model(), "cores": os.cpu_count(), "isa": fastln.get_isa(),
            "supported_isas": fastln.supported_isas(), "openmp": fastln.has_openmp(),
            "threads": fastln.get_num_threads(), "wait_policy": fastln.get_wait_policy(),
            "versions": versions() if peer_versions is None else peer_versions}


def _proc_stat():
    """(total, busy) CPU seconds over all CPUs since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(t) for t in f.readline().split()[1:8]]
    hz = os.sysconf("SC_CLK_TCK")
    return sum(v) / hz, (sum(v) - v[3] - v[4]) / hz


def cpu_busy(seconds=0.25):
    """The share of all CPUs' time spent busy over ``seconds`` while this process sleeps
    (None where /proc/stat is missing): how much other work competes for the cores."""
    try:
        t0, b0 = _proc_stat()
        time.sleep(seconds)
        t1, b1 = _proc_stat()
    except (OSError, ValueError, IndexError):
        return None
    return None if t1 <= t0 else (b1 - b0) / (t1 - t0)


class OtherLoad:
    """``with OtherLoad() as load:``; then ``load.fraction`` is the share of all CPUs'
    time that other processes used while the block ran (None without /proc/stat)."""

    def __enter__(self):
        try:
            self._t0, self._b0 = _proc_stat()
        except (OSError, ValueError, IndexError):
            self._t0 = None
        self._own0 = sum(os.times()[:2])
        self.fraction = None
        return self

    def __exit__(self, *exc):
        if self._t0 is not None:
            t1, b1 = _proc_stat()
            own = sum(os.times()[:2]) - self._own0
            if t1 > self._t0:
                self.fraction = max(0.0, (b1 - self._b0 - own) / (t1 - self._t0))
        return False


# ---- float32 LayerNorm peers ------------------------------------------------

def numpy_layer_norm(x, w, b, eps=EPS):
    """Plain float32 NumPy LayerNorm over the last axis."""
    mean = x.mean(axis=-1, keepdims=True)
    xc = x - mean
    var = (xc * xc).mean(axis=-1, keepdims=True)
    return xc / np.sqrt(var + np.float32(eps)) * w + b


def numpy_layer_norm_backward(dy, x, mean, rstd, w):
    """Plain float32 NumPy LayerNorm backward (the standard formula) -> (dx, dw, db)."""
    xhat = (x - mean[..., None]) * rstd[..., None]
    g = dy * w
    dx = rstd[..., None] * (g - g.mean(axis=-1, keepdims=True)
                            - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


_ORT_CACHE: dict = {}


def ort_session(H, nthreads):
    """An ONNX Runtime session of one LayerNormalization node (opset 17, axis=-1).
    Its workers are told not to spin (they would starve the peer timed next)."""
    if (H, nthreads) not in _ORT_CACHE:
        from onnx import TensorProto, helper
        node = helper.make_node("LayerNormalization", ["X", "Scale", "B"], ["Y"], axis=-1,
                                epsilon=EPS)
        graph = helper.make_graph(
            [node], "ln", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", H]),
                           helper.make_tensor_value_info("Scale", TensorProto.FLOAT, [H]),
                           helper.make_tensor_value_info("B", TensorProto.FLOAT, [H])],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", H])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        _ORT_CACHE[(H, nthreads)] = ort_session_of(model, nthreads)
    return _ORT_CACHE[(H, nthreads)]


def ort_session_of(model, nthreads, spin=False):
    """An ONNX Runtime session of an onnx model on the CPU, nthreads intra-op
    threads, warnings off; its workers spin between runs only with ``spin``
    (spinning, they starve the peer timed next). The model's IR version is
    capped at 9, which every supported ONNX Runtime reads."""
    model.ir_version = min(model.ir_version, 9)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = nthreads, 1
    so.log_severity_level = 3
    if not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def close(a, b, reduction=False, rtol=RTOL, atol=ATOL):
    """np.allclose in float64; a sum over rows (``reduction``: dweight, dbias) normwise:
    max|a - b| <= atol + rtol * max|b|, as a float32 sum's error grows with the rows."""
    a, b = np.asarray(a).astype(np.float64), np.asarray(b).astype(np.float64)
    if a.shape != b.shape:
        return False
    if reduction:
        err = np.max(np.abs(a - b), initial=0.0)
        return bool(err <= atol + rtol * np.max(np.abs(b), initial=0.0))
    return bool(np.allclose(a, b, rtol=rtol, atol=atol))


def layer_norm_row(N, H, seed=0, **kw):
    """Median seconds per call of float32 LayerNorm on (N, H) forward (``fwd_<peer>``) and
    backward (``bwd_<peer>``) for fastln (allocating, and ``_out``: into a given array),
    NumPy, torch and ONNX Runtime (forward) where installed, and ``copy`` (the faster of
    fastln's parallel copies of x, with and without streaming stores); ``mismatch`` lists
    the peers whose output disagrees with fastln's. ``kw`` goes to :func:`time_peers`."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, H), dtype=np.float32) * 2 + 0.5
    dy = rng.standard_normal((N, H), dtype=np.float32)
    w = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
    b = (0.1 * rng.standard_normal(H)).astype(np.float32)
    y_out, dx_out = np.empty_like(x), np.empty_like(x)
    y, mean, rstd = fastln.layer_norm(x, w, b, eps=EPS, return_stats=True)
    grads = fastln.layer_norm_backward(dy, x, mean, rstd, w)
    fwd = {"fastln": lambda: fastln.layer_norm(x, w, b, eps=EPS),
           "fastln_out": lambda: fastln.layer_norm(x, w, b, eps=EPS, out=y_out),
           "copy": lambda: _lib._parallel_copy(y_out, x),
           "copy_nt": lambda: _lib._parallel_copy(y_out, x, nt=True),
           "numpy": lambda: numpy_layer_norm(x, w, b)}
    bwd = {"fastln": lambda: fastln.layer_norm_backward(dy, x, mean, rstd, w),
           "fastln_out": lambda: fastln.layer_norm_backward(dy, x, mean, rstd, w, out=dx_out),
           "numpy": lambda: numpy_layer_norm_backward(dy, x, mean, rstd, w)}
    nthreads = fastln.get_num_threads()
    torch_threads = torch.get_num_threads() if torch is not None else None
    try:
        if torch is not None:
            torch.set_num_threads(nthreads)
            F, aten = torch.nn.functional, torch.ops.aten
            xt, wt, bt, dyt = (torch.from_numpy(a) for a in (x, w, b, dy))
            _, tm, tr = aten.native_layer_norm(xt, [H], wt, bt, EPS)
            fwd["torch"] = lambda: F.layer_norm(xt, (H,), wt, bt, EPS).numpy()
            bwd["torch"] = lambda: [t.numpy() for t in aten.native_layer_norm_backward(
                dyt, xt, [H], tm, tr, wt, bt, [True, True, True])]
        if ort is not None and onnx is not None:
            sess = ort_session(H, nthreads)
            fwd["onnxruntime"] = lambda: sess.run(None, {"X": x, "Scale": w, "B": b})[0]
        mismatch = [f"{p} fwd" for p in ("numpy", "torch", "onnxruntime")
                    if p in fwd and not close(fwd[p](), y)]
        mismatch += [f"{p} bwd {nm}" for p in ("numpy", "torch") if p in bwd
                     for nm, g, r, red in zip(("dx", "dweight", "dbias"), bwd[p](), grads,
                                              (False, True, True)) if not close(g, r, red)]
        groups = {"fastln_out": "fastln", "copy": "fastln", "copy_nt": "fastln"}
        kw = dict(dict(gap=SPIN_GAP if nthreads > 1 else 0.0, spinning=SPINNING,
                       groups=groups), **kw)
        row = {"N": N, "H": H, "threads": nthreads, "mismatch": mismatch}
        for part, fns in (("fwd", fwd), ("bwd", bwd)):
            row.update({f"{part}_{p}": t for p, t in time_peers(fns, **kw).items()})
        # the faster copy: the ceiling
        row["copy"] = min(row.pop("fwd_copy"), row.pop("fwd_copy_nt"))
        return row
    finally:   # torch may share fastln's OpenMP runtime: its count goes back as it was
        if torch_threads is not None:
            torch.set_num_threads(torch_threads)


# ---- the int8 LSTM ------------------------------------------------------------

def int8_lstm(T, B, I, H, seed=0):
    """(float32 fastln.rnn.LSTM (I, H), its int8 copy from fastln.rnn.quantize,
    x (T, B, I) float32): seeded weights, and a bias in [-0.5, 0.5) (the
    default is 0) so that the bias's place in the gates is checked too."""
    from fastln import rnn
    rng = np.random.default_rng(seed)
    model = rnn.LSTM(I, H, seed=seed)
    model.params["bias_l0"][...] = rng.uniform(-0.5, 0.5, 4 * H)
    x = rng.standard_normal((T, B, I), dtype=np.float32)
    return model, rnn.quantize(model), x


def onnx_lstm(model):
    """An ONNX model (opset 14) of one LSTM node with the weights of a one-layer
    float32 fastln.rnn.LSTM: X (T, B, I) -> Y (T, 1, B, H). The gate blocks go
    from fastln's order (i, f, g, o) to ONNX's (i, o, f, c); the bias is Wb,
    and Rb is 0."""
    from onnx import TensorProto, helper, numpy_helper

    def gates(a):   # gate blocks (rows) in ONNX's order, with a direction axis
        parts = np.split(np.asarray(a, np.float32), 4)
        return np.concatenate([parts[k] for k in (0, 3, 1, 2)])[None]
    I, H = model.input_size, model.hidden_size
    bias = gates(model.params["bias_l0"])
    w = {"W": gates(model.params["weight_ih_l0"]), "R": gates(model.params["weight_hh_l0"]),
         "B": np.concatenate([bias, np.zeros_like(bias)], axis=1)}
    node = helper.make_node("LSTM", ["X", "W", "R", "B"], ["Y"], hidden_size=H)
    graph = helper.make_graph(
        [node], "lstm", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["T", "B", I])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["T", 1, "B", H])],
        [numpy_helper.from_array(v, k) for k, v in w.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


@contextlib.contextmanager
def _quiet():
    """Warnings and log records below ERROR off for a block: ONNX Runtime's
    quantizer warns through ``logging.warning``, which would also install a
    root handler where there is none (a NullHandler keeps it from doing so)."""
    root = logging.getLogger()
    null = logging.NullHandler()
    root.addHandler(null)
    was = root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(was)
        root.removeHandler(null)


def ort_int8_model(model):
    """An ONNX LSTM model quantized by ONNX Runtime's dynamic quantization
    (``quantize_dynamic(..., op_types_to_quantize=["LSTM"])``: a
    DynamicQuantizeLSTM node). The quantizer reads and writes files: the
    models pass through a temporary directory."""
    with tempfile.TemporaryDirectory() as tmp, _quiet():
        src, dst = os.path.join(tmp, "f32.onnx"), os.path.join(tmp, "int8.onnx")
        onnx.save(model, src)
        ort_quant.quantize_dynamic(src, dst, op_types_to_quantize=["LSTM"])
        return onnx.load(dst)


def int8_lstm_row(T, B, I, H, seed=0, **kw):
    """Median seconds per forward (``cache=False``) of the int8 LSTM of
    :func:`int8_lstm` (``fastln_int8``), of its float32 model (``fastln``) and,
    where installed, of ONNX Runtime's int8 LSTM of the same float32 weights
    (``onnxruntime_int8``); ``kernel``: fastln.rnn.int8_products(); ``error``:
    {peer: max |int8 y - float32 y|}; ``mismatch`` lists "onnxruntime int8" when
    its y and fastln's int8 y differ by more than INT8_PEER_TOL. ``kw`` goes to
    :func:`time_peers`."""
    from fastln import rnn
    model, q, x = int8_lstm(T, B, I, H, seed)
    y32, y8 = model.forward(x, cache=False)[0], q.forward(x, cache=False)[0]
    nthreads = fastln.get_num_threads()
    fns = {"fastln_int8": lambda: q.forward(x, cache=False),
           "fastln": lambda: model.forward(x, cache=False)}
    error = {"fastln_int8": float(np.abs(y8 - y32).max())}
    mismatch = []
    if ort_quant is not None:
        sess = ort_session_of(ort_int8_model(onnx_lstm(model)), nthreads)
        fns["onnxruntime_int8"] = lambda: sess.run(None, {"X": x})
        yo = sess.run(None, {"X": x})[0][:, 0]
        error["onnxruntime_int8"] = float(np.abs(yo - y32).max())
        if not np.abs(yo - y8).max() <= INT8_PEER_TOL:   # NaN included
            mismatch.append("onnxruntime int8")
    kw = dict(dict(gap=SPIN_GAP if nthreads > 1 else 0.0, spinning=SPINNING,
                   groups={"fastln_int8": "fastln"}), **kw)
    return dict({"T": T, "B": B, "I": I, "H": H, "threads": nthreads,
                 "kernel": rnn.int8_products(), "error": error, "mismatch": mismatch},
                **time_peers(fns, **kw))


def check_output_path(ap, flag, path):
    """argparse's error unless a file can be written at path (its folder exists
    and is writable, and path is not a folder): checked before a run, so that
    a long run does not end in an error on writing its results."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        ap.error(f"{flag} {path}: is a folder, expected a file path")
    if not os.path.isdir(folder):
        ap.error(f"{flag} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        ap.error(f"{flag} {path}: the folder {folder} is not writable")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        ap.error(f"{flag} {path}: the file is not writable")
