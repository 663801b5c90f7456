"""Benchmark machinery shared by ``python -m fastln`` and ``bench/run.py``.

Everything here follows DESIGN.md section 6: timings are medians, peers are
measured in turns within one process (each sampling round times every peer
once), and results are quoted as ratios of medians. The bandwidth ceiling is
fastln's own parallel copy of the same bytes on the same threads, measured in
the same run.

Peers are optional: one that is not installed (or fails to set up) gives a
``None`` column, never an error. Before timing, every peer's output is checked
against fastln's; a disagreement is recorded in the row (``mismatch``) and
printed loudly by :func:`format_table`.
"""
import contextlib
import statistics
import time
import warnings

import numpy as np

import fastln
from fastln import _core

EPS = 1e-5
SPIN_GAP = 12e-3            # see time_peers: longer than libgomp's default spin
RTOL = ATOL = 1e-4          # float32 agreement between peers

FWD_PEERS = ("numpy", "fastln", "torch", "onnxruntime")
BWD_PEERS = ("numpy", "fastln", "torch")


# ---- timing -----------------------------------------------------------------

def _one_sample(fn, inner):
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


def _calibrate(fn, min_sample):
    """Calls per sample so that one sample takes >= min_sample seconds (1 for slow calls),
    and the seconds per call seen while calibrating."""
    inner = 1
    while True:
        t = _one_sample(fn, inner)
        if t * inner >= min_sample or inner >= 1 << 20:
            break
        inner = max(inner * 2, min(int(min_sample / max(t, 1e-9) * 1.2) + 1, inner * 100))
    return inner, t


def time_peers(fns, repeats=15, min_sample=2e-3, budget=None, min_repeats=3,
               warmup=1, gap=0.0, groups=None):
    """Median seconds per call of each callable in ``fns`` (name -> fn), in turns.

    Each fn is warmed up, then given an inner repeat count so that one sample
    takes >= ``min_sample`` seconds (one call for slow ones). Then, for each of
    ``repeats`` rounds, every fn is timed once (interleaved, so drifts in
    machine load hit all peers alike). ``budget`` (seconds, optional) caps the
    time spent on any one fn: a slow fn gets fewer samples, but at least
    ``min_repeats``.

    ``groups`` (name -> thread-pool name) and ``gap`` (seconds) deal with
    spinning thread pools: after a parallel region, libgomp's workers busy-wait
    for GOMP_SPINCOUNT spins (about 10 ms measured here) before they sleep, and
    on a machine with few cores they take a core from whatever runs next.
    Fastln and torch each have their own libgomp. So before a sample whose group
    differs from the previous sample's, sleep ``gap`` seconds, then make one
    untimed call (when the sample has several calls) to wake this fn's own pool.
    Returns {name: median seconds per call}.
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
        plan[name] = (fn, inner, n)
    samples = {name: [] for name in fns}
    last = None
    for r in range(max((p[2] for p in plan.values()), default=0)):
        for name, (fn, inner, n) in plan.items():
            if r >= n:
                continue
            group = groups.get(name, name)
            if gap and group != last:
                time.sleep(gap)
                if inner > 1:
                    fn()
            last = group
            samples[name].append(_one_sample(fn, inner))
    return {name: statistics.median(s) for name, s in samples.items()}


def timeit(fn, repeats=15, min_sample=2e-3, **kw):
    """Median seconds per call of one callable (see time_peers)."""
    return time_peers({"fn": fn}, repeats, min_sample, **kw)["fn"]


# ---- peers ------------------------------------------------------------------

def numpy_layer_norm(x, w, b, eps=EPS):
    """Plain float32 NumPy LayerNorm over the last axis."""
    mean = x.mean(axis=-1, keepdims=True)
    xc = x - mean
    var = (xc * xc).mean(axis=-1, keepdims=True)
    return xc / np.sqrt(var + np.float32(eps)) * w + b


def numpy_layer_norm_backward(dy, x, mean, rstd, w):
    """Plain float32 NumPy LayerNorm backward (standard formula) -> (dx, dw, db)."""
    mean = mean[..., None]
    rstd = rstd[..., None]
    xhat = (x - mean) * rstd
    g = dy * w
    dx = rstd * (g - g.mean(axis=-1, keepdims=True)
                 - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def _import(name):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return __import__(name)
    except Exception:
        return None


_torch = _import("torch")
_ort = _import("onnxruntime")
_onnx = _import("onnx") if _ort is not None else None


def peer_versions():
    """{name: version or None} for the peers and the platform."""
    import platform
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "fastln": fastln.__version__,
        "torch": getattr(_torch, "__version__", None),
        "onnxruntime": getattr(_ort, "__version__", None),
        "onnx": getattr(_onnx, "__version__", None),
    }


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def _proc_stat():
    """(total, busy) CPU seconds over all CPUs since boot, from /proc/stat."""
    import os
    with open("/proc/stat") as f:
        v = [int(t) for t in f.readline().split()[1:8]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = v[3] + v[4]
    return sum(v) / hz, (sum(v) - idle) / hz


def cpu_busy(seconds=0.25):
    """Fraction of all CPUs' time spent busy (by any process) over ``seconds``
    while this process sleeps: how much other work competes for the cores."""
    try:
        t0, b0 = _proc_stat()
        time.sleep(seconds)
        t1, b1 = _proc_stat()
    except (OSError, ValueError, IndexError):
        return None
    return None if t1 <= t0 else (b1 - b0) / (t1 - t0)


class OtherLoad:
    """Measures the share of all CPUs' time that other processes used while a
    block ran: (busy CPU time of the machine - this process's CPU time) / capacity.
    ``fraction`` is None where /proc/stat is unavailable."""

    def __enter__(self):
        import os
        try:
            self._t0, self._b0 = _proc_stat()
        except (OSError, ValueError, IndexError):
            self._t0 = None
        self._own0 = sum(os.times()[:2])
        self.fraction = None
        return self

    def __exit__(self, *exc):
        import os
        if self._t0 is not None:
            t1, b1 = _proc_stat()
            own = sum(os.times()[:2]) - self._own0
            if t1 > self._t0:
                self.fraction = max(0.0, (b1 - self._b0 - own) / (t1 - self._t0))
        return False


def machine_info():
    """A dict describing the machine, the versions and fastln's configuration."""
    import datetime
    import os
    info = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "isa": fastln.get_isa(),
        "supported_isas": fastln.supported_isas(),
        "openmp": fastln.has_openmp(),
        "threads": fastln.get_num_threads(),
        "versions": peer_versions(),
    }
    return info


def set_peer_threads(n):
    """Make the peers use n threads (fastln's own count is set by the caller)."""
    if _torch is not None:
        _torch.set_num_threads(n)


_ORT_CACHE: dict = {}
# ONNX Runtime's intra-op workers spin for tens of ms after each run by default,
# which starves whichever peer is timed next on a small machine: they are told
# not to spin (session.intra_op.allow_spinning = 0). This costs ORT a worker
# wake-up per parallel call, which matters for small shapes only.
ORT_SPIN = False


def _ort_session(H, nthreads, spin=ORT_SPIN):
    """An InferenceSession for one LayerNormalization node (opset 17, axis=-1)."""
    key = (H, nthreads, spin)
    if key in _ORT_CACHE:
        return _ORT_CACHE[key]
    from onnx import TensorProto, helper
    node = helper.make_node("LayerNormalization", ["X", "Scale", "B"], ["Y"],
                            axis=-1, epsilon=EPS)
    graph = helper.make_graph(
        [node], "ln",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", H]),
         helper.make_tensor_value_info("Scale", TensorProto.FLOAT, [H]),
         helper.make_tensor_value_info("B", TensorProto.FLOAT, [H])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", H])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = min(model.ir_version, 9)
    so = _ort.SessionOptions()
    so.intra_op_num_threads = nthreads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    if not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = _ort.InferenceSession(model.SerializeToString(), so,
                                 providers=["CPUExecutionProvider"])
    _ORT_CACHE[key] = sess
    return sess


def _close(a, b, reduction=False):
    """Elementwise np.allclose(rtol=atol=1e-4) for y and dx. dweight and dbias are sums
    over all N rows, and a float32 row-by-row sum (NumPy's axis-0 sum, torch) carries an
    absolute error that grows with N and the size of the sum, not of each element; they
    are compared normwise: max|a - b| <= atol + rtol * max|b|."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.shape != b.shape:
        return False
    if reduction:
        return bool(np.max(np.abs(a - b), initial=0.0)
                    <= ATOL + RTOL * np.max(np.abs(b), initial=0.0))
    return bool(np.allclose(a, b, rtol=RTOL, atol=ATOL))


def _max_err(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)),
                        initial=0.0))


def _add_torch(row, check, fwd, bwd, x, w, b, dy, y_ref, dref, nthreads):
    torch = _torch
    torch.set_num_threads(nthreads)
    F = torch.nn.functional
    H = x.shape[-1]
    xt, wt, bt, dyt = (torch.from_numpy(a) for a in (x, w, b, dy))
    check("torch", "fwd", [F.layer_norm(xt, (H,), wt, bt, EPS).numpy()], [y_ref])
    fwd["torch"] = lambda: F.layer_norm(xt, (H,), wt, bt, EPS)
    if bwd is not None:
        _, tmean, trstd = torch.ops.aten.native_layer_norm(xt, [H], wt, bt, EPS)
        mask = [True, True, True]

        def torch_bwd():
            return torch.ops.aten.native_layer_norm_backward(
                dyt, xt, [H], tmean, trstd, wt, bt, mask)
        check("torch", "bwd", [t.numpy() for t in torch_bwd()], dref)
        bwd["torch"] = torch_bwd


# ---- one shape --------------------------------------------------------------

def bench_shape(N, H, *, repeats=15, min_sample=2e-3, budget=None, min_repeats=3,
                peers=None, backward=True, gap=None, seed=0):
    """Forward (and backward) timings of every available peer at one float32 shape.

    Returns a dict (one row) with per-call median times in seconds
    (``fwd_<peer>``, ``bwd_<peer>``, None for a missing peer), fastln's
    speedups over each peer (``fwd_speedup_<peer>`` = t_peer / t_fastln),
    the ``out=`` times, the copy time and the fractions of the copy ceiling,
    and ``mismatch``: a list of "peer direction: detail" strings.
    """
    peers = set(peers or FWD_PEERS)
    nthreads = fastln.get_num_threads()
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, H), dtype=np.float32) * 2 + 0.5
    w = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
    b = (0.1 * rng.standard_normal(H)).astype(np.float32)
    dy = rng.standard_normal((N, H), dtype=np.float32)
    y_out = np.empty_like(x)
    dx_out = np.empty_like(x)
    nbytes = x.nbytes
    row = {"N": N, "H": H, "dtype": "float32", "threads": nthreads,
           "isa": fastln.get_isa(), "nbytes": nbytes, "mismatch": []}

    # fastln is the yardstick the peers are checked against
    y_ref, mean, rstd = fastln.layer_norm(x, w, b, eps=EPS, return_stats=True)
    dref = fastln.layer_norm_backward(dy, x, mean, rstd, w)

    fwd = {}
    bwd = {}

    def check(peer, direction, got, want):
        names = ("y",) if direction == "fwd" else ("dx", "dweight", "dbias")
        for nm, g, r in zip(names, got, want):
            if not _close(g, r, reduction=nm in ("dweight", "dbias")):
                row["mismatch"].append(f"{peer} {direction} {nm}: max|diff|={_max_err(g, r):.3g}")

    # -- numpy
    if "numpy" in peers:
        check("numpy", "fwd", [numpy_layer_norm(x, w, b)], [y_ref])
        fwd["numpy"] = lambda: numpy_layer_norm(x, w, b)
        if backward:
            check("numpy", "bwd", numpy_layer_norm_backward(dy, x, mean, rstd, w), dref)
            bwd["numpy"] = lambda: numpy_layer_norm_backward(dy, x, mean, rstd, w)

    # -- fastln (allocating, and into preallocated out=), and the copy ceiling
    fwd["fastln"] = lambda: fastln.layer_norm(x, w, b, eps=EPS)
    fwd["fastln_out"] = lambda: fastln.layer_norm(x, w, b, eps=EPS, out=y_out)
    fwd["copy"] = lambda: _core._parallel_copy(y_out, x)
    if backward:
        bwd["fastln"] = lambda: fastln.layer_norm_backward(dy, x, mean, rstd, w)
        bwd["fastln_out"] = lambda: fastln.layer_norm_backward(dy, x, mean, rstd, w, out=dx_out)
    fastln.layer_norm(x, w, b, eps=EPS, out=y_out)
    check("fastln", "fwd", [y_out], [y_ref])   # out= path agrees with the allocating one

    # -- torch (tensors from torch.from_numpy need no grad, so no autograd graph is built)
    if "torch" in peers and _torch is not None:
        try:
            _add_torch(row, check, fwd, bwd if backward else None, x, w, b, dy, y_ref, dref,
                       nthreads)
        except Exception as e:  # a broken peer is reported, not fatal
            row["mismatch"].append(f"torch fwd setup failed: {type(e).__name__}: {e}")

    # -- onnxruntime (forward only)
    if "onnxruntime" in peers and _ort is not None and _onnx is not None:
        try:
            sess = _ort_session(H, nthreads)
            feeds = {"X": x, "Scale": w, "B": b}
            check("onnxruntime", "fwd", [sess.run(None, feeds)[0]], [y_ref])
            fwd["onnxruntime"] = lambda: sess.run(None, feeds)
        except Exception as e:  # a broken peer is reported, not fatal
            row["mismatch"].append(f"onnxruntime fwd setup failed: {type(e).__name__}: {e}")

    if gap is None:     # spinning pools only matter when something runs in parallel
        gap = SPIN_GAP if nthreads > 1 else 0.0
    groups = {"fastln_out": "fastln", "copy": "fastln"}
    kw = dict(budget=budget, min_repeats=min_repeats, gap=gap, groups=groups)
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
    row["copy"] = tf["copy"]
    # Forward with out= moves the same bytes as the copy (read x once, write y once),
    # so its fraction of the copy ceiling is simply t_copy / t_fwd_out.
    row["fwd_copy_frac"] = tf["copy"] / tf["fastln_out"]
    # Backward with out= moves 3*nbytes (read x, read dy, write dx; dweight/dbias and
    # mean/rstd are O(H + N) and ignored). The ceiling bandwidth is the copy's,
    # 2*nbytes / t_copy, so the fraction is (3*nbytes / t_bwd_out) / (2*nbytes / t_copy)
    # = 1.5 * t_copy / t_bwd_out.
    row["bwd_copy_frac"] = 1.5 * tf["copy"] / tb["fastln_out"] if backward else None
    row["copy_GBps"] = 2 * nbytes / tf["copy"] / 1e9
    return row


def run_grid(shapes, *, threads=None, progress=None, **kw):
    """bench_shape for each (N, H) in shapes, on each thread count in ``threads``
    (None: the current setting). ``progress(row)`` is called after each row."""
    rows = []
    for n in (threads or [None]):
        if n is not None:
            set_peer_threads(n)   # first: torch may share fastln's libgomp (see bench/run.py)
        with fastln.threads(n) if n is not None else contextlib.nullcontext():
            for N, H in shapes:
                row = bench_shape(N, H, **kw)
                rows.append(row)
                if progress is not None:
                    progress(row)
    return rows


# ---- formatting -------------------------------------------------------------

def _us(t):
    return "-" if t is None else (f"{t * 1e6:.1f}" if t < 1e-3 else f"{t * 1e6:.0f}")


def _x(r):
    return "-" if r is None else f"{r:.2f}x"


def _pct(f):
    return "-" if f is None else f"{100 * f:.0f}%"


def progress_line(row):
    """A one-line summary of a finished row, for progress output."""
    parts = [f"fastln fwd {_us(row['fwd_fastln'])} us"]
    for p in ("numpy", "torch", "onnxruntime"):
        if row.get(f"fwd_speedup_{p}") is not None:
            parts.append(f"{_x(row[f'fwd_speedup_{p}'])} vs {p}")
    if row.get("bwd_fastln") is not None:
        parts.append(f"bwd {_us(row['bwd_fastln'])} us")
    parts.append(f"fwd/copy {_pct(row['fwd_copy_frac'])}")
    s = f"  ({row['N']}, {row['H']}) t={row['threads']}: " + ", ".join(parts)
    if row["mismatch"]:
        s += "   !! MISMATCH: " + "; ".join(row["mismatch"])
    return s


def _columns(rows, parts=("fwd", "bwd"), detail=False):
    have = lambda key: any(r.get(key) is not None for r in rows)
    cols = [("shape", lambda r: f"({r['N']}, {r['H']})")]
    if len({r["threads"] for r in rows}) > 1:
        cols.append(("thr", lambda r: str(r["threads"])))
    short = {"numpy": "numpy", "fastln": "fastln", "torch": "torch", "onnxruntime": "ort"}
    pre = (lambda part: f"{part} ") if len(parts) > 1 else (lambda part: "")
    for part, names in (("fwd", FWD_PEERS), ("bwd", BWD_PEERS)):
        if part not in parts:
            continue
        ps = [p for p in names if have(f"{part}_{p}")]
        for p in ps:
            cols.append((f"{pre(part)}{short[p]} us", lambda r, k=f"{part}_{p}": _us(r.get(k))))
            if p == "fastln" and detail and have(f"{part}_fastln_out"):
                cols.append(("out= us", lambda r, k=f"{part}_fastln_out": _us(r.get(k))))
        if detail:
            cols.append(("copy us", lambda r: _us(r.get("copy"))))
        for p in ps:
            if p != "fastln":
                cols.append((f"vs {short[p]}",
                             lambda r, k=f"{part}_speedup_{p}": _x(r.get(k))))
        if have(f"{part}_copy_frac"):
            cols.append((f"{part}/copy", lambda r, k=f"{part}_copy_frac": _pct(r.get(k))))
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


def parse_threads(ap, text):
    """A comma-separated list of positive thread counts, or argparse's error."""
    try:
        counts = [int(t) for t in text.split(",")]
        if any(t < 1 for t in counts):
            raise ValueError
    except ValueError:
        ap.error("--threads must be a comma-separated list of positive integers")
    return counts


def format_table(rows, markdown=False, parts=("fwd", "bwd"), detail=False):
    """A plain-text (or markdown) table of rows from bench_shape, then any mismatches.

    Times are medians in microseconds per call; "vs P" is fastln's speedup over
    peer P (t_P / t_fastln, > 1 means fastln is faster); fwd/copy and bwd/copy
    are fastln's out= throughput as a fraction of the parallel-copy bandwidth.
    ``detail`` adds the times of fastln with a preallocated ``out=`` and of the copy.
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
            lines.append(f"!!   ({r['N']}, {r['H']}) t={r['threads']}: {m}")
    return "\n".join(lines)
