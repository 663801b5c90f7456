"""Benchmark machinery of bench/run.py and bench/rnn.py.

It builds on fastln._selfcheck (the timing of ``python -m fastln``, the
machine's description and the float32 LayerNorm peers): timings are medians,
peers are measured in turns within one process (each sampling round times
every peer once), and results are quoted as ratios of medians. The bandwidth
ceiling is fastln's own parallel copy of the same bytes on the same threads,
measured in the same run.

Peers are optional: one that is not installed (or fails to set up) gives a
``None`` column, never an error. Before timing, every peer's output is checked
against fastln's; a disagreement is recorded in the row (``mismatch``) and
printed loudly by :func:`format_table`.

Cases: float32 LayerNorm forward and backward (:func:`bench_shape`'s default),
RMSNorm and add + LayerNorm forward (float32), and LayerNorm forward on
float16 / bfloat16 storage. Peers: NumPy, PyTorch (CPU), ONNX Runtime (one
LayerNormalization node, float32 LayerNorm only) and JAX (jax.jit of a jnp
LayerNorm; its backward is jax.vjp of it). JAX is imported only when asked for
(``peers``); the DEFAULT_PEERS are the ones ``python -m fastln`` times.
"""
import argparse
import contextlib
import importlib.util
import json
import os
import sys

import numpy as np

import fastln
from fastln import _lib, _selfcheck
from fastln._selfcheck import (
    ATOL,
    EPS,
    RTOL,
    SPIN_GAP,
    SPINNING,
    close,
    import_optional,
    numpy_layer_norm,
    numpy_layer_norm_backward,
    onnx,
    ort,
    ort_session,
    time_peers,
    torch,
)

RMS_EPS = 1e-6              # RMSNorm (fastln.rms_norm's default)
# (rtol, atol) of the output checks, both sides compared in float64. A 16-bit
# result computed in float32 and rounded once is within an ulp of another:
# at most 2**-7 relative for bfloat16, 2**-10 for float16.
TOL = {"float32": (RTOL, ATOL), "float16": (2e-3, 1e-3), "bfloat16": (1e-2, 1e-2)}

FWD_PEERS = ("numpy", "fastln", "torch", "onnxruntime", "jax")
BWD_PEERS = ("numpy", "fastln", "torch", "jax")
PEERS = ("numpy", "torch", "onnxruntime", "jax")        # besides fastln
DEFAULT_PEERS = ("numpy", "torch", "onnxruntime")       # python -m fastln's; bench/run.py adds jax
OPS = ("layer_norm", "rms_norm", "add_layer_norm")
DTYPES = ("float32", "float16", "bfloat16")
# arrays of N*H elements one forward call reads or writes (besides w, b, stats)
STREAMS = {"layer_norm": 2, "rms_norm": 2, "add_layer_norm": 4}


# ---- peers ------------------------------------------------------------------

def numpy_rms_norm(x, w, eps=RMS_EPS):
    """Plain float32 NumPy RMSNorm over the last axis."""
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + np.float32(eps)) * w


def numpy_add_layer_norm(x, r, w, b, eps=EPS):
    """x + r, then NumPy LayerNorm -> (y, s)."""
    s = x + r
    return numpy_layer_norm(s, w, b, eps), s


ml_dtypes = import_optional("ml_dtypes")


def _dist_version(name):
    """An installed distribution's version, without importing it (None if absent)."""
    try:
        from importlib import metadata
        return metadata.version(name)
    except Exception:
        return None


def have_peer(name):
    """Whether peer ``name`` is installed (JAX is looked up without importing it)."""
    if name in ("numpy", "fastln"):
        return True
    if name == "torch":
        return torch is not None
    if name == "onnxruntime":
        return ort is not None and onnx is not None
    if name == "jax":
        return importlib.util.find_spec("jax") is not None
    return False


def peer_versions():
    """{name: version or None} for the peers and the platform."""
    import platform
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "fastln": fastln.__version__,
        "torch": getattr(torch, "__version__", None),
        "onnxruntime": getattr(ort, "__version__", None),
        "onnx": getattr(onnx, "__version__", None),
        "jax": _dist_version("jax") if have_peer("jax") else None,
        "jaxlib": _dist_version("jaxlib") if have_peer("jax") else None,
        "ml_dtypes": getattr(ml_dtypes, "__version__", None),
    }


def machine_info():
    """A dict describing the machine, the versions and fastln's configuration."""
    return _selfcheck.machine_info(peer_versions())


def set_peer_threads(n):
    """Make the peers use n threads (fastln's own count is set by the caller).

    torch's count is set at once. JAX's CPU backend sizes its thread pool once,
    when it is created: the count is recorded here and the backend re-created
    (see :func:`jax_threads`) the next time the JAX peer is used.
    """
    if torch is not None:
        torch.set_num_threads(n)
    _JAX["want"] = n


def peer_threads():
    """The peers' current thread settings, for :func:`restore_peer_threads`."""
    return {"torch": torch.get_num_threads() if torch is not None else None,
            "jax": _JAX["want"]}


def restore_peer_threads(saved):
    if torch is not None and saved.get("torch"):
        torch.set_num_threads(saved["torch"])
    _JAX["want"] = saved.get("jax")


# ---- JAX ----------------------------------------------------------------------
# jax is imported only when its peer is first used (importing it is slow, and
# python -m fastln does not time it). Its CPU client (XLA) sizes its
# intra-op thread pool once, at creation, from the CPUs the creating thread may
# run on (sched_getaffinity); XLA_FLAGS such as --xla_cpu_multi_thread_eigen=false
# do not cap it (with jaxlib 0.10.2, several XLA threads still run).
# So for n threads the backend is (re)created (jax.extend.backend.clear_backends)
# while this thread's affinity is narrowed to n CPUs; the affinity is then
# restored, for this thread and for the threads the client started (so its pool
# has n workers that may run on any CPU). Where that is impossible (no
# sched_setaffinity, no clear_backends) JAX keeps the pool it has, and
# "jax_threads" in the rows says what it was, with "jax_threads_exact" False.

_JAX = {"mod": None, "tried": False, "want": None, "threads": None, "exact": False,
        "fns": None}


def _jax_module():
    if not _JAX["tried"]:
        _JAX["tried"] = True
        if have_peer("jax"):
            os.environ.setdefault("JAX_PLATFORMS", "cpu")   # do not probe for accelerators
            jax = import_optional("jax")
            if jax is not None and import_optional("jax.numpy") is not None:
                _JAX["mod"] = jax
    return _JAX["mod"]


def _tasks():
    try:
        return set(os.listdir("/proc/self/task"))
    except OSError:
        return set()


def jax_threads():
    """(threads, exact) of JAX's current CPU backend, creating or re-creating it
    for the thread count of the last :func:`set_peer_threads` (None, None where
    JAX is missing). ``exact`` is False when the count could not be chosen: then
    it is the number of CPUs the backend was created on (JAX's default)."""
    jax = _jax_module()
    if jax is None:
        return None, None
    want = _JAX["want"]
    if _JAX["threads"] is not None and (want is None or want == _JAX["threads"]):
        return _JAX["threads"], _JAX["exact"]
    can_pin = hasattr(os, "sched_setaffinity") and os.path.isdir("/proc/self/task")
    try:
        from jax.extend import backend as jb
    except ImportError:
        jb = None
    if _JAX["threads"] is not None:            # a backend exists: replace it, if possible
        if jb is None or not can_pin:
            return _JAX["threads"], _JAX["exact"]
        jb.clear_backends()
        jax.clear_caches()
    cpus = sorted(os.sched_getaffinity(0)) if can_pin else None
    if want is None or not can_pin:
        jax.devices("cpu")
        _JAX["threads"], _JAX["exact"] = (len(cpus) if cpus else os.cpu_count()), False
        return _JAX["threads"], _JAX["exact"]
    use = cpus[:want]
    before = _tasks()
    os.sched_setaffinity(0, use)
    try:
        jax.devices("cpu")
    finally:
        os.sched_setaffinity(0, cpus)
        for tid in _tasks() - before:
            try:
                os.sched_setaffinity(int(tid), cpus)
            except (OSError, ValueError):
                pass
    _JAX["threads"], _JAX["exact"] = len(use), len(use) == want
    return _JAX["threads"], _JAX["exact"]


def _jax_fns(jax):
    """The jitted JAX peers (float32 math; 16-bit inputs are widened inside)."""
    if _JAX["fns"] is None:
        jnp = jax.numpy

        def ln(x, w, b):
            xf = x.astype(jnp.float32)
            mean = jnp.mean(xf, axis=-1, keepdims=True)
            xc = xf - mean
            var = jnp.mean(xc * xc, axis=-1, keepdims=True)
            return (xc * jax.lax.rsqrt(var + EPS) * w + b).astype(x.dtype)

        def rms(x, w):
            xf = x.astype(jnp.float32)
            ms = jnp.mean(xf * xf, axis=-1, keepdims=True)
            return (xf * jax.lax.rsqrt(ms + RMS_EPS) * w).astype(x.dtype)

        def add_ln(x, r, w, b):
            s = x + r
            return ln(s, w, b), s

        def ln_bwd(dy, x, w, b):
            return jax.vjp(ln, x, w, b)[1](dy)

        _JAX["fns"] = {"layer_norm": jax.jit(ln), "rms_norm": jax.jit(rms),
                       "add_layer_norm": jax.jit(add_ln), "layer_norm_bwd": jax.jit(ln_bwd)}
    return _JAX["fns"]


# ---- checks -----------------------------------------------------------------

def _max_err(a, b):
    a = np.asarray(a).astype(np.float64)
    b = np.asarray(b).astype(np.float64)
    if a.shape != b.shape:
        return float("inf")
    return float(np.max(np.abs(a - b), initial=0.0))


def check_outputs(row, peer, direction, got, want, names, dtype="float32"):
    """Compare a peer's outputs ``got`` with fastln's ``want`` (sequences, in the
    order of ``names``) at the tolerance of ``dtype`` (TOL; both sides widened to
    float64). Each disagreement is appended to ``row["mismatch"]`` as
    "peer direction name: detail". Returns True when all agree."""
    rtol, atol = TOL[dtype]
    got, want = list(got), list(want)
    ok = True
    if len(got) != len(want):
        row["mismatch"].append(f"{peer} {direction}: {len(got)} outputs, expected {len(want)}")
        ok = False
    for nm, g, r in zip(names, got, want):
        if not close(g, r, reduction=nm in ("dweight", "dbias"), rtol=rtol, atol=atol):
            row["mismatch"].append(f"{peer} {direction} {nm}: max|diff|={_max_err(g, r):.3g}")
            ok = False
    return ok


# ---- the peers' callables for one case ------------------------------------------

def _np_dtype(dtype):
    if dtype == "bfloat16":
        if ml_dtypes is None:
            raise RuntimeError("bfloat16 needs ml_dtypes")
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def _to_torch(a):
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _from_torch(t):
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _numpy_peer(c):
    """(fwd callable, outputs -> list of arrays) of the NumPy peer, or None."""
    op, dtype = c["op"], c["dtype"]
    x, w, b = c["x"], c["w"], c["b"]
    if op == "layer_norm" and dtype == "float32":
        return (lambda: numpy_layer_norm(x, w, b)), (lambda y: [y])
    if op == "layer_norm" and dtype == "float16":   # computed via float32, like most users would
        return (lambda: numpy_layer_norm(x.astype(np.float32), w, b).astype(np.float16),
                lambda y: [y])
    if op == "rms_norm":
        return (lambda: numpy_rms_norm(x, w)), (lambda y: [y])
    if op == "add_layer_norm":
        r = c["r"]
        return (lambda: numpy_add_layer_norm(x, r, w, b)), list
    return None


def _torch_peer(c):
    F = torch.nn.functional
    op, H = c["op"], c["H"]
    xt, wt, bt = _to_torch(c["x"]), _to_torch(c["w"]), _to_torch(c["b"])
    if op == "layer_norm":      # float32, or float16/bfloat16 x with float32 weight and bias
        return (lambda: F.layer_norm(xt, (H,), wt, bt, EPS)), (lambda y: [_from_torch(y)])
    if op == "rms_norm":
        return (lambda: F.rms_norm(xt, (H,), wt, RMS_EPS)), (lambda y: [_from_torch(y)])
    if op == "add_layer_norm":
        rt = _to_torch(c["r"])

        def add_ln():
            s = xt + rt
            return F.layer_norm(s, (H,), wt, bt, EPS), s
        return add_ln, (lambda ys: [_from_torch(t) for t in ys])
    return None


def _torch_bwd(c):
    H = c["H"]
    xt, wt, bt, dyt = (torch.from_numpy(c[k]) for k in ("x", "w", "b", "dy"))
    _, tmean, trstd = torch.ops.aten.native_layer_norm(xt, [H], wt, bt, EPS)
    mask = [True, True, True]

    def torch_bwd():
        return torch.ops.aten.native_layer_norm_backward(dyt, xt, [H], tmean, trstd, wt, bt, mask)
    return torch_bwd, (lambda ts: [t.numpy() for t in ts])


def _ort_peer(c, nthreads):
    if c["op"] != "layer_norm" or c["dtype"] != "float32":
        return None
    sess = ort_session(c["H"], nthreads)
    feeds = {"X": c["x"], "Scale": c["w"], "B": c["b"]}
    return (lambda: sess.run(None, feeds)), (lambda ys: [ys[0]])


def _jax_peer(c, backward=False):
    jax = _jax_module()
    fns = _jax_fns(jax)
    dev = jax.devices("cpu")[0]
    put = lambda a: jax.device_put(a, dev)     # noqa: E731 -- once, outside the timed call
    x, w, b = put(c["x"]), put(c["w"]), put(c["b"])
    conv = lambda ys: [np.asarray(y) for y in (ys if isinstance(ys, (tuple, list)) else [ys])]  # noqa: E731
    if backward:
        f = fns["layer_norm_bwd"]
        dy = put(c["dy"])
        return (lambda: jax.block_until_ready(f(dy, x, w, b))), conv
    op = c["op"]
    f = fns[op]
    if op == "layer_norm":
        return (lambda: f(x, w, b).block_until_ready()), conv
    if op == "rms_norm":
        return (lambda: f(x, w).block_until_ready()), conv
    r = put(c["r"])
    return (lambda: jax.block_until_ready(f(x, r, w, b))), conv


# ---- one shape --------------------------------------------------------------

def _make_case(op, dtype, N, H, backward, seed):
    """Inputs of one case; 16-bit weight and bias are float32 holding 16-bit values."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, H), dtype=np.float32) * 2 + 0.5
    w = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
    b = (0.1 * rng.standard_normal(H)).astype(np.float32)
    c = {"op": op, "dtype": dtype, "N": N, "H": H, "x32": x, "w": w, "b": b}
    if dtype != "float32":
        dt = _np_dtype(dtype)
        c["x"] = x.astype(dt)
        c["x32"] = c["x"].astype(np.float32)
        c["w"] = w.astype(dt).astype(np.float32)
        c["b"] = b.astype(dt).astype(np.float32)
    else:
        c["x"] = x
    if op == "add_layer_norm":
        c["r"] = rng.standard_normal((N, H), dtype=np.float32)
    if backward:
        c["dy"] = rng.standard_normal((N, H), dtype=np.float32)
    return c


def bench_shape(N, H, *, op="layer_norm", dtype="float32", repeats=15, min_sample=2e-3,
                budget=None, min_repeats=3, peers=None, backward=True, gap=None, seed=0):
    """Timings of fastln and every available peer at one shape of one case.

    ``op`` is "layer_norm" (forward, and backward unless ``backward`` is False;
    float32, float16 or bfloat16 ``dtype``), "rms_norm" or "add_layer_norm"
    (float32, forward only). 16-bit cases are forward only and also time
    fastln's float32 forward on the same values. ``peers`` (default
    DEFAULT_PEERS) names the peers to try besides fastln; a missing or
    inapplicable one is a None column.

    Returns a dict (one row) with per-call median times in seconds
    (``fwd_<peer>``, ``bwd_<peer>``, None for a missing peer), fastln's
    speedups over each peer (``fwd_speedup_<peer>`` = t_peer / t_fastln),
    the ``out=`` times, the copy time and the fractions of the copy ceiling,
    the bytes one call moves (``fwd_bytes``, ``bwd_bytes``), for 16-bit
    cases ``elems_vs_f32`` (fastln's 16-bit over float32 elements/s, out=),
    ``jax_threads``, and ``mismatch``: a list of "peer direction: detail" strings.
    """
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}")
    if dtype not in DTYPES or (dtype != "float32" and op != "layer_norm"):
        raise ValueError(f"dtype {dtype!r}: float32 for every op, float16/bfloat16 for layer_norm")
    backward = bool(backward) and op == "layer_norm" and dtype == "float32"
    peers = set(DEFAULT_PEERS if peers is None else peers)
    nthreads = fastln.get_num_threads()
    c = _make_case(op, dtype, N, H, backward, seed)
    x, w, b = c["x"], c["w"], c["b"]
    streams = STREAMS[op]
    row = {"op": op, "dtype": dtype, "N": N, "H": H, "threads": nthreads,
           "isa": fastln.get_isa(), "nbytes": x.nbytes, "itemsize": x.itemsize,
           "fwd_bytes": streams * x.nbytes, "bwd_bytes": 3 * x.nbytes if backward else None,
           "jax_threads": None, "jax_threads_exact": None, "mismatch": []}

    def check(peer, direction, got, want):
        names = (("dx", "dweight", "dbias") if direction == "bwd"
                 else ("y", "s") if op == "add_layer_norm" else ("y",))
        check_outputs(row, peer, direction, got, want, names, dtype)

    # fastln is the yardstick the peers are checked against
    fwd = {}
    bwd = {}
    y_out = np.empty_like(x)
    if op == "layer_norm":
        y_ref, mean, rstd = fastln.layer_norm(x, w, b, eps=EPS, return_stats=True)
        ref = [y_ref]
        fwd["fastln"] = lambda: fastln.layer_norm(x, w, b, eps=EPS)
        fwd["fastln_out"] = lambda: fastln.layer_norm(x, w, b, eps=EPS, out=y_out)
        got_out = lambda: [fwd["fastln_out"]()]   # noqa: E731
    elif op == "rms_norm":
        ref = [fastln.rms_norm(x, w, eps=RMS_EPS)]
        fwd["fastln"] = lambda: fastln.rms_norm(x, w, eps=RMS_EPS)
        fwd["fastln_out"] = lambda: fastln.rms_norm(x, w, eps=RMS_EPS, out=y_out)
        got_out = lambda: [fwd["fastln_out"]()]   # noqa: E731
    else:
        r = c["r"]
        s_out = np.empty_like(x)
        ref = list(fastln.add_layer_norm(x, r, w, b, eps=EPS))
        fwd["fastln"] = lambda: fastln.add_layer_norm(x, r, w, b, eps=EPS)
        fwd["fastln_out"] = lambda: fastln.add_layer_norm(x, r, w, b, eps=EPS, out=(y_out, s_out))
        got_out = lambda: list(fwd["fastln_out"]())   # noqa: E731
    fwd["copy"] = lambda: _lib._parallel_copy(y_out, x)
    fwd["copy_nt"] = lambda: _lib._parallel_copy(y_out, x, nt=True)
    check("fastln", "fwd", got_out(), ref)     # out= path agrees with the allocating one
    if dtype != "float32":
        x32 = c["x32"]
        y32_out = np.empty_like(x32)
        fwd["fastln_f32"] = lambda: fastln.layer_norm(x32, w, b, eps=EPS)
        fwd["fastln_f32_out"] = lambda: fastln.layer_norm(x32, w, b, eps=EPS, out=y32_out)
    if backward:
        dy = c["dy"]
        dx_out = np.empty_like(x)
        dref = fastln.layer_norm_backward(dy, x, mean, rstd, w)
        bwd["fastln"] = lambda: fastln.layer_norm_backward(dy, x, mean, rstd, w)
        bwd["fastln_out"] = lambda: fastln.layer_norm_backward(dy, x, mean, rstd, w, out=dx_out)

    def add(peer, table, direction, setup, want):
        """Set up a peer; check its output; add it to ``table``. A broken peer is
        reported in the row, not fatal."""
        try:
            made = setup()
            if made is None:
                return
            fn, conv = made
            check(peer, direction, conv(fn()), want)
            table[peer] = fn
        except Exception as e:
            row["mismatch"].append(f"{peer} {direction} setup failed: {type(e).__name__}: {e}")

    if "numpy" in peers:
        add("numpy", fwd, "fwd", lambda: _numpy_peer(c), ref)
        if backward:
            add("numpy", bwd, "bwd",
                lambda: ((lambda: numpy_layer_norm_backward(dy, x, mean, rstd, w)), list), dref)
    # torch tensors from torch.from_numpy need no grad, so no autograd graph is built
    if "torch" in peers and have_peer("torch"):
        torch.set_num_threads(nthreads)
        add("torch", fwd, "fwd", lambda: _torch_peer(c), ref)
        if backward:
            add("torch", bwd, "bwd", lambda: _torch_bwd(c), dref)
    if "onnxruntime" in peers and have_peer("onnxruntime"):
        add("onnxruntime", fwd, "fwd", lambda: _ort_peer(c, nthreads), ref)
    if "jax" in peers and have_peer("jax") and _jax_module() is not None:
        row["jax_threads"], row["jax_threads_exact"] = jax_threads()
        add("jax", fwd, "fwd", lambda: _jax_peer(c), ref)
        if backward:
            add("jax", bwd, "bwd", lambda: _jax_peer(c, backward=True), dref)

    if gap is None:     # spinning pools only matter when something runs in parallel
        gap = SPIN_GAP if nthreads > 1 else 0.0
    groups = {"fastln_out": "fastln", "copy": "fastln", "copy_nt": "fastln",
              "fastln_f32": "fastln", "fastln_f32_out": "fastln"}
    # Every peer ran once in its check; fastln's own callables run once here. That
    # is their warm-up (JAX compiled, ORT allocated), so time_peers adds none: for
    # the largest shapes a call of a slow peer takes a second.
    for f in [f for k, f in fwd.items() if k.startswith(("fastln", "copy"))] + [
            f for k, f in bwd.items() if k.startswith("fastln")]:
        f()
    # NumPy runs on one thread and ONNX Runtime's workers are told not to spin:
    # no pause is needed after their samples
    kw = dict(budget=budget, min_repeats=min_repeats, gap=gap, groups=groups, warmup=0,
              spinning=SPINNING)
    tf = time_peers(fwd, repeats, min_sample, **kw)
    tb = time_peers(bwd, repeats, min_sample, **kw) if backward else {}

    for p in FWD_PEERS:
        row[f"fwd_{p}"] = tf.get(p)
    for p in BWD_PEERS:
        row[f"bwd_{p}"] = tb.get(p)
    for p in FWD_PEERS:
        t = row[f"fwd_{p}"]
        row[f"fwd_speedup_{p}"] = t / tf["fastln"] if t is not None and p != "fastln" else None
    for p in BWD_PEERS:
        t = row[f"bwd_{p}"]
        row[f"bwd_speedup_{p}"] = (t / tb["fastln"]
                                   if t is not None and p != "fastln" and backward else None)
    row["fwd_fastln_out"] = tf["fastln_out"]
    row["bwd_fastln_out"] = tb.get("fastln_out")
    # the ceiling: the faster of memcpy and a copy with non-temporal stores
    row["copy"] = min(tf["copy"], tf["copy_nt"])
    # The copy reads nbytes and writes nbytes. Forward with out= moves ``streams``
    # arrays of nbytes (LayerNorm, RMSNorm: read x, write y; add_layer_norm: read x
    # and r, write y and s), so its fraction of the copy's bandwidth is
    # (streams * nbytes / t_fwd_out) / (2 * nbytes / t_copy).
    row["fwd_copy_frac"] = streams / 2 * row["copy"] / tf["fastln_out"]
    # Backward with out= moves 3*nbytes (read x, read dy, write dx; dweight/dbias and
    # mean/rstd are O(H + N) and ignored): 1.5 * t_copy / t_bwd_out.
    row["bwd_copy_frac"] = 1.5 * row["copy"] / tb["fastln_out"] if backward else None
    row["copy_GBps"] = 2 * x.nbytes / row["copy"] / 1e9
    # 16-bit: fastln's elements/s relative to its own float32 forward on the same
    # values, timed in the same turns (same element count, so a ratio of times)
    row["fwd_fastln_f32"] = tf.get("fastln_f32")
    row["fwd_fastln_f32_out"] = tf.get("fastln_f32_out")
    row["elems_vs_f32"] = (tf["fastln_f32_out"] / tf["fastln_out"]
                           if "fastln_f32_out" in tf else None)
    row["elems_vs_f32_alloc"] = (tf["fastln_f32"] / tf["fastln"]
                                 if "fastln_f32" in tf else None)
    return row


def _case(s):
    """(N, H) or (N, H, op, dtype) -> (N, H, op, dtype)."""
    if len(s) == 2:
        return s[0], s[1], "layer_norm", "float32"
    return tuple(s)


def run_grid(shapes, *, threads=None, progress=None, **kw):
    """bench_shape for each case in ``shapes`` -- (N, H) for float32 LayerNorm, or
    (N, H, op, dtype) -- on each thread count in ``threads`` (None: the current
    setting). ``progress(row)`` is called after each row. The peers' thread
    counts are restored afterwards."""
    rows = []
    saved = peer_threads()
    try:
        for n in (threads or [None]):
            if n is not None:
                set_peer_threads(n)   # first: torch may share fastln's libgomp (see bench/run.py)
            with fastln.threads(n) if n is not None else contextlib.nullcontext():
                for s in shapes:
                    N, H, op, dtype = _case(s)
                    row = bench_shape(N, H, op=op, dtype=dtype, **kw)
                    rows.append(row)
                    if progress is not None:
                        progress(row)
    finally:
        if threads:
            restore_peer_threads(saved)
    return rows


# ---- a run's reports -------------------------------------------------------

def warn_if_busy():
    """Prints a warning when other processes keep more than a fifth of the CPUs busy."""
    busy = _selfcheck.cpu_busy()
    if busy is not None and busy > 0.2:
        print(f"warning: other processes keep {100 * busy:.0f}% of the CPUs busy; "
              "timings will be noisy", flush=True)


def load_phrase(load):
    """"; other processes used N% of the CPUs meanwhile", marked unreliable past
    10%, or "" when the load is unknown: for the results' markdown."""
    if load is None:
        return ""
    return (f"; other processes used {100 * load:.0f}% of the CPUs meanwhile"
            + (" (timings unreliable)" if load > 0.1 else ""))


def report_and_save(result, json_path):
    """Prints the load of a script's run (result["info"]["cpu_other_load"] over
    result["elapsed_s"]) and writes result to json_path, if one is given."""
    load = result["info"].get("cpu_other_load")
    if load is not None:
        print(f"\nother processes used {100 * load:.0f}% of the CPUs during the run "
              f"({result['elapsed_s']:.0f} s)" + ("; timings unreliable, rerun when the "
                                                  "machine is quiet" if load > 0.1 else ""))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        print(f"wrote {json_path}")


# ---- formatting -------------------------------------------------------------

def _us(t):
    return "-" if t is None else (f"{t * 1e6:.1f}" if t < 1e-3 else f"{t * 1e6:.0f}")


def _x(r):
    return "-" if r is None else f"{r:.2f}x"


def _pct(f):
    return "-" if f is None else f"{100 * f:.0f}%"


SHORT = {"numpy": "numpy", "fastln": "fastln", "torch": "torch", "onnxruntime": "ort",
         "jax": "jax"}
DTYPE_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def case_label(row):
    """"layer_norm", "rms_norm", "add_layer_norm", "layer_norm bfloat16", ..."""
    op = row.get("op", "layer_norm")
    dtype = row.get("dtype", "float32")
    return op if dtype == "float32" else f"{op} {dtype}"


def progress_line(row):
    """A one-line summary of a finished row, for progress output."""
    parts = [f"fastln fwd {_us(row['fwd_fastln'])} us"]
    for p in PEERS:
        if row.get(f"fwd_speedup_{p}") is not None:
            parts.append(f"{_x(row[f'fwd_speedup_{p}'])} vs {p}")
    if row.get("bwd_fastln") is not None:
        parts.append(f"bwd {_us(row['bwd_fastln'])} us")
        for p in PEERS:
            if row.get(f"bwd_speedup_{p}") is not None:
                parts.append(f"{_x(row[f'bwd_speedup_{p}'])} vs {p}")
    parts.append(f"fwd/copy {_pct(row['fwd_copy_frac'])}")
    if row.get("elems_vs_f32") is not None:
        parts.append(f"{DTYPE_SHORT[row['dtype']]}/f32 elem/s {_x(row['elems_vs_f32'])}")
    label = "" if case_label(row) == "layer_norm" else f"{case_label(row)} "
    s = f"  {label}({row['N']}, {row['H']}) t={row['threads']}: " + ", ".join(parts)
    if row["mismatch"]:
        s += "   !! MISMATCH: " + "; ".join(row["mismatch"])
    return s


def _columns(rows, parts=("fwd", "bwd"), detail=False):
    have = lambda key: any(r.get(key) is not None for r in rows)   # noqa: E731
    cols = [("shape", lambda r: f"({r['N']}, {r['H']})")]
    if len({case_label(r) for r in rows}) > 1:
        cols.insert(0, ("case", case_label))
    if len({r["threads"] for r in rows}) > 1:
        cols.append(("thr", lambda r: str(r["threads"])))
    pre = (lambda part: f"{part} ") if len(parts) > 1 else (lambda part: "")
    for part, names in (("fwd", FWD_PEERS), ("bwd", BWD_PEERS)):
        if part not in parts:
            continue
        ps = [p for p in names if have(f"{part}_{p}")]
        for p in ps:
            cols.append((f"{pre(part)}{SHORT[p]} us", lambda r, k=f"{part}_{p}": _us(r.get(k))))
            if p == "fastln" and detail and have(f"{part}_fastln_out"):
                cols.append(("out= us", lambda r, k=f"{part}_fastln_out": _us(r.get(k))))
        if part == "fwd" and detail and have("fwd_fastln_f32_out"):
            cols.append(("f32 out= us", lambda r: _us(r.get("fwd_fastln_f32_out"))))
        if detail:
            cols.append(("copy us", lambda r: _us(r.get("copy"))))
        for p in ps:
            if p != "fastln":
                cols.append((f"vs {SHORT[p]}",
                             lambda r, k=f"{part}_speedup_{p}": _x(r.get(k))))
        if have(f"{part}_copy_frac"):
            cols.append((f"{part}/copy", lambda r, k=f"{part}_copy_frac": _pct(r.get(k))))
        if part == "fwd" and have("elems_vs_f32"):
            names16 = sorted({DTYPE_SHORT[r["dtype"]] for r in rows
                              if r.get("elems_vs_f32") is not None})
            cols.append((f"{names16[0] if len(names16) == 1 else '16-bit'}/f32 elem/s",
                         lambda r: _x(r.get("elems_vs_f32"))))
    return cols


def table_lines(heads, cells, markdown=False):
    """A table as lines: Markdown, or aligned text (first column left, the rest right)."""
    if markdown:
        return (["| " + " | ".join(heads) + " |",
                 "|" + "|".join(["---"] + ["---:"] * (len(heads) - 1)) + "|"]
                + ["| " + " | ".join(c) + " |" for c in cells])
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]

    def fmt(vals):
        return "  ".join(v.ljust(wd) if i == 0 else v.rjust(wd)
                         for i, (v, wd) in enumerate(zip(vals, widths)))
    return [fmt(heads), "  ".join("-" * wd for wd in widths)] + [fmt(c) for c in cells]


def parse_counts(ap, text, flag):
    """A comma-separated list of positive integers (the option flag's), or
    argparse's error."""
    try:
        counts = [int(t) for t in text.split(",")]
        if any(t < 1 for t in counts):
            raise ValueError
    except ValueError:
        ap.error(f"{flag} must be a comma-separated list of positive integers")
    return counts


def parse_threads(ap, text):
    """A comma-separated list of positive thread counts, or argparse's error."""
    return parse_counts(ap, text, "--threads")


def format_table(rows, markdown=False, parts=("fwd", "bwd"), detail=False):
    """A plain-text (or markdown) table of rows from bench_shape, then any mismatches.

    Times are medians in microseconds per call; "vs P" is fastln's speedup over
    peer P (t_P / t_fastln, > 1 means fastln is faster); fwd/copy and bwd/copy
    are fastln's out= throughput as a fraction of the parallel-copy bandwidth;
    "bf16/f32 elem/s" (16-bit rows) is fastln's 16-bit forward elements/s over
    its float32 forward's on the same values (both out=).
    ``detail`` adds the times of fastln with a preallocated ``out=`` (and, for
    16-bit rows, of its float32 forward with out=) and of the copy.
    With several ``parts`` their columns follow one another in one table.
    """
    cols = _columns(rows, parts, detail)
    cells = [[f(r) for _, f in cols] for r in rows]
    heads = [h for h, _ in cols]
    lines = table_lines(heads, cells, markdown)
    bad = [(r, m) for r in rows for m in r["mismatch"] if m.split()[1] in tuple(parts)]
    if bad:
        lines.append("")
        lines.append("!! MISMATCH: a peer's output disagrees with fastln's (its time is still "
                     "shown), or a peer failed to run:")
        for r, m in bad:
            label = "" if case_label(r) == "layer_norm" else f"{case_label(r)} "
            lines.append(f"!!   {label}({r['N']}, {r['H']}) t={r['threads']}: {m}")
    return "\n".join(lines)


def main(argv=None):
    """The module has no command line of its own: --help says so and names the
    scripts that use it; a run without arguments prints a usage line that says
    so (exit status 2), and any argument is argparse's error (exit status 2)."""
    ap = argparse.ArgumentParser(
        prog="bench/harness.py",
        description="bench/harness.py is a library module, the benchmark machinery of "
                    "bench/run.py, bench/rnn.py and bench/fused.py; by itself it runs "
                    "nothing. Run `python bench/run.py --help` (or bench/rnn.py, "
                    "bench/fused.py) instead.")
    ap.parse_args(argv)
    print(f"usage: {ap.prog} is a library module, not a script: run python bench/run.py "
          f"(or bench/rnn.py, bench/fused.py); --help for each", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
