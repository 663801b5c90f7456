"""The fused residual norms and channels-first LayerNorm against their peers, float32.

    python bench/fused.py [--quick] [--threads 2] [--cases add_rms,...] [--json PATH]

Cases (--cases names):

- add_rms:     fastln.add_rms_norm(x, r, w) forward at (4096, 4096) and
               (16384, 1024), against ONNX Runtime's com.microsoft
               SkipSimplifiedLayerNormalization (one node, outputs ``output`` and
               ``input_skip_bias_sum``) and the PyTorch composite
               ``s = x + r; y = F.rms_norm(s, (H,), w)``;
- add_ln:      fastln.add_layer_norm(x, r, w, b, input_bias=bi) forward at the
               same shapes, against ORT SkipLayerNormalization (with its bias
               input) and ``s = (x + r).add_(bi); y = F.layer_norm(s, ...)``;
- add_ln_bwd:  fastln.add_layer_norm_backward(dy, s, mean, rstd, w, ds=ds,
               input_bias_grad=True) at (16384, 1024), against PyTorch autograd
               of the composite (x, r, bi, w, b requiring grad;
               ``s = x + r + bi``; ``y = F.layer_norm(s, ...)``): the graph is
               built once, and each timed call is
               ``torch.autograd.grad([y, s], [x, r, bi, w, b], [dy, ds],
               retain_graph=True)``;
- add_rms_bwd: the same for add_rms_norm_backward and F.rms_norm;
- cf_ln:       fastln.layer_norm(x, w, b, axis=1) on NCHW (32, 96, 56, 56),
               against fastln's channels-last layer_norm on the same values as
               (32, 56, 56, 96), torch's channels-last F.layer_norm, and torch's
               ``F.layer_norm(x.permute(0, 2, 3, 1), ...).permute(0, 3, 1, 2)
               .contiguous()`` on NCHW;
- cf_rms:      the same for rms_norm;
- cf_ln_bwd:   fastln.layer_norm_backward(dy, x, mean, rstd, w, axis=1) against
               fastln's channels-last backward and torch autograd of
               channels-last F.layer_norm (x, w, b requiring grad).

Timing follows bench/harness.py: medians per call, every peer timed in turns
in one process on the same thread count (two by default), ratios of medians.
torch.set_num_threads(n) is called before fastln's thread count is set (torch
may share fastln's libgomp); torch forwards run under torch.inference_mode().
ONNX Runtime runs with intra_op_num_threads = n and its workers told not to
spin (as in bench/harness.py); its time is the faster of ``session.run`` with
NumPy feeds and ``run_with_iobinding`` with the inputs bound once (ORT
allocating the outputs); "ort out=" binds preallocated output buffers too, and
is compared with fastln's ``out=``.

The copy ceiling is fastln._lib._parallel_copy of an x-sized array (the faster
of a plain and a non-temporal-store copy, as bench/run.py), timed in the same
turns. A call's fraction of it counts the N*H-sized arrays the call reads and
writes (vectors of H and per-row statistics are ignored): add_rms_norm and
add_layer_norm read x and r and write y and s (4 arrays); their backward reads
dy, s and ds and writes dsum (4); channels-first forward reads x and writes y
(2), backward reads x and dy and writes dx (3). Fraction = (bytes / t_out=) /
(2 * x.nbytes / t_copy), with fastln's ``out=`` time.

Before timing, every peer's outputs are checked against fastln's (float32,
rtol = atol = 1e-4 in float64; gradients of the weights and biases, sums over
all rows, normwise): a disagreement raises AssertionError. A peer that is not
installed, or fails to set up, is a "-" column with a note.
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # the repository root, for an in-place build

import numpy as np  # noqa: E402

import fastln  # noqa: E402
from bench import harness  # noqa: E402
from fastln import _lib, _selfcheck  # noqa: E402

torch = harness.torch           # None when torch is not installed

LN_EPS = 1e-5
RMS_EPS = 1e-6

# --cases name -> (family, op, title)
CASES = {
    "add_rms": ("fused_fwd", "add_rms_norm", "add_rms_norm fwd"),
    "add_ln": ("fused_fwd", "add_layer_norm", "add_layer_norm fwd, input_bias"),
    "add_ln_bwd": ("fused_bwd", "add_layer_norm", "add_layer_norm bwd, input_bias"),
    "add_rms_bwd": ("fused_bwd", "add_rms_norm", "add_rms_norm bwd, input_bias"),
    "cf_ln": ("cf_fwd", "layer_norm", "layer_norm axis=1 fwd"),
    "cf_rms": ("cf_fwd", "rms_norm", "rms_norm axis=1 fwd"),
    "cf_ln_bwd": ("cf_bwd", "layer_norm", "layer_norm axis=1 bwd"),
}
# (rows, H) for the fused cases, (N, C, H, W) for the channels-first ones
SHAPES = {
    "add_rms": [(4096, 4096), (16384, 1024)],
    "add_ln": [(4096, 4096), (16384, 1024)],
    "add_ln_bwd": [(16384, 1024)],
    "add_rms_bwd": [(16384, 1024)],
    "cf_ln": [(32, 96, 56, 56)],
    "cf_rms": [(32, 96, 56, 56)],
    "cf_ln_bwd": [(32, 96, 56, 56)],
}
# what a call's bytes count, per family (arrays of x's size)
BYTES_COUNTED = {
    "fused_fwd": (4, "x, r in; y, s out"),
    "fused_bwd": (4, "dy, s, ds in; dsum out"),
    "cf_fwd": (2, "x in; y out"),
    "cf_bwd": (3, "x, dy in; dx out"),
}
REDUCTIONS = ("dweight", "dbias", "dinput_bias")

GROUPS = {"fastln": "fastln", "copy": "fastln", "torch": "torch", "ort": "onnxruntime"}


def timing_kw(quick):
    """_selfcheck.time_peers' sampling settings (as bench/run.py's for these sizes)."""
    if quick:
        return dict(repeats=5, budget=0.1, min_sample=1e-3, min_repeats=2)
    return dict(repeats=11, budget=1.0, min_sample=2e-3, min_repeats=3)


# ---- checks -------------------------------------------------------------------

def _max_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("inf")
    return float(np.max(np.abs(a - b), initial=0.0))


def _check(row, peer, got, want, names):
    """Assert that a peer's outputs ``got`` match ``want`` (fastln's), in the order
    of ``names``; record the largest difference in the row."""
    worst = 0.0
    for nm, g, w in zip(names, got, want, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        if not _selfcheck.close(g, w, reduction=nm in REDUCTIONS):
            raise AssertionError(
                f"{row['title']} {tuple(row['shape'])}: {peer} {nm} disagrees with fastln's: "
                f"max|diff| = {_max_err(g, w):.3g} (rtol = atol = {_selfcheck.RTOL:g}"
                f"{', normwise' if nm in REDUCTIONS else ''}); not timing it")
        worst = max(worst, _max_err(g, w))
    row["max_diff"][peer] = worst


def _np(t):
    return t.detach().numpy()


# ---- ONNX Runtime -------------------------------------------------------------

_ORT_CACHE = {}


def ort_skip_session(op, H, nthreads):
    """A session of one com.microsoft Skip(Simplified)LayerNormalization node over
    (N, H) float32 inputs X and R, gain W (and B, and input bias BI for the
    LayerNorm); outputs Y and S (``output`` and ``input_skip_bias_sum``)."""
    key = (op, H, nthreads)
    if key not in _ORT_CACHE:
        from onnx import TensorProto, helper
        if op == "add_rms_norm":
            node_op, names, eps = "SkipSimplifiedLayerNormalization", ["X", "R", "W"], RMS_EPS
        else:
            node_op, names, eps = "SkipLayerNormalization", ["X", "R", "W", "B", "BI"], LN_EPS
        node = helper.make_node(node_op, names, ["Y", "", "", "S"], domain="com.microsoft",
                                epsilon=eps)

        def info(name, shape):
            return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
        graph = helper.make_graph(
            [node], "skip_norm",
            [info("X", ["N", H]), info("R", ["N", H])] + [info(n, [H]) for n in names[2:]],
            [info("Y", ["N", H]), info("S", ["N", H])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)])
        _ORT_CACHE[key] = _selfcheck.ort_session_of(model, nthreads)
    return _ORT_CACHE[key]


def _ort_peers(op, feeds, nthreads):
    """{name: fn} of the three ORT calls, and a function returning (y, s) of each."""
    sess = ort_skip_session(op, feeds["X"].shape[1], nthreads)
    io = sess.io_binding()
    for k, v in feeds.items():
        io.bind_cpu_input(k, v)
    io.bind_output("Y")
    io.bind_output("S")
    x = feeds["X"]
    y_out, s_out = np.empty_like(x), np.empty_like(x)
    io_out = sess.io_binding()
    for k, v in feeds.items():
        io_out.bind_cpu_input(k, v)
    for name, buf in (("Y", y_out), ("S", s_out)):
        io_out.bind_output(name, "cpu", 0, np.float32, buf.shape, buf.ctypes.data)

    def ort_run():
        return sess.run(None, feeds)

    def ort_iobinding():
        sess.run_with_iobinding(io)
        return io

    def ort_out():
        sess.run_with_iobinding(io_out)
        return y_out, s_out
    fns = {"ort_run": ort_run, "ort_iobinding": ort_iobinding, "ort_out": ort_out}
    conv = {"ort_run": list, "ort_iobinding": lambda b: b.copy_outputs_to_cpu(),
            "ort_out": list}
    return fns, conv


# ---- one case -----------------------------------------------------------------

def _row(key, shape, n, x):
    family, op, title = CASES[key]
    streams, counted = BYTES_COUNTED[family]
    return {"case": key, "family": family, "op": op, "title": title, "shape": list(shape),
            "threads": n, "bytes": streams * x.nbytes, "bytes_counted": counted,
            "times": {}, "ratios": {}, "copy_frac": None, "max_diff": {}, "notes": []}


def _copies(x):
    dst = np.empty_like(x)
    return {"copy": lambda: _lib._parallel_copy(dst, x),
            "copy_nt": lambda: _lib._parallel_copy(dst, x, nt=True)}


def _setup(row, peer, make):
    """make() -> a peer's setup; a peer that fails to set up is a note, not an error."""
    try:
        return make()
    except Exception as e:
        row["notes"].append(f"{peer} not timed: {type(e).__name__}: {e}")
        return None


def _fused_fwd(key, shape, n, rng):
    op = CASES[key][1]
    N, H = shape
    x = rng.standard_normal((N, H), dtype=np.float32)
    r = rng.standard_normal((N, H), dtype=np.float32)
    w = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
    b = (0.1 * rng.standard_normal(H)).astype(np.float32)
    bi = (0.1 * rng.standard_normal(H)).astype(np.float32)
    row = _row(key, shape, n, x)
    y_out, s_out = np.empty_like(x), np.empty_like(x)
    if op == "add_rms_norm":
        fns = {"fastln": lambda: fastln.add_rms_norm(x, r, w),
               "fastln_out": lambda: fastln.add_rms_norm(x, r, w, out=(y_out, s_out))}
        feeds = {"X": x, "R": r, "W": w}
    else:
        fns = {"fastln": lambda: fastln.add_layer_norm(x, r, w, b, input_bias=bi),
               "fastln_out": lambda: fastln.add_layer_norm(x, r, w, b, input_bias=bi,
                                                           out=(y_out, s_out))}
        feeds = {"X": x, "R": r, "W": w, "B": b, "BI": bi}
    want = list(fns["fastln"]())
    _check(row, "fastln_out", list(fns["fastln_out"]()), want, ("y", "s"))
    fns.update(_copies(x))
    if harness.ort is not None and harness.onnx is not None:
        made = _setup(row, "onnxruntime", lambda: _ort_peers(op, feeds, n))
        if made is not None:
            ort_fns, conv = made
            for name, fn in ort_fns.items():
                _check(row, name, conv[name](fn()), want, ("y", "s"))
            fns.update(ort_fns)
    else:
        row["notes"].append("onnxruntime (or onnx) is not installed")
    if torch is not None:
        F = torch.nn.functional
        xt, rt, wt, bt, bit = (torch.from_numpy(a) for a in (x, r, w, b, bi))

        if op == "add_rms_norm":
            def torch_fwd():
                with torch.inference_mode():
                    s = xt + rt
                    return F.rms_norm(s, (H,), wt, RMS_EPS), s
        else:
            def torch_fwd():
                with torch.inference_mode():
                    s = (xt + rt).add_(bit)
                    return F.layer_norm(s, (H,), wt, bt, LN_EPS), s
        _check(row, "torch", [_np(t) for t in torch_fwd()], want, ("y", "s"))
        fns["torch"] = torch_fwd
    else:
        row["notes"].append("torch is not installed")
    return row, fns


def _fused_bwd(key, shape, n, rng):
    op = CASES[key][1]
    N, H = shape
    x = rng.standard_normal((N, H), dtype=np.float32)
    r = rng.standard_normal((N, H), dtype=np.float32)
    w = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
    b = (0.1 * rng.standard_normal(H)).astype(np.float32)
    bi = (0.1 * rng.standard_normal(H)).astype(np.float32)
    dy = rng.standard_normal((N, H), dtype=np.float32)
    ds = rng.standard_normal((N, H), dtype=np.float32)
    row = _row(key, shape, n, x)
    d_out = np.empty_like(x)
    if op == "add_layer_norm":
        _, s, mean, rstd = fastln.add_layer_norm(x, r, w, b, input_bias=bi, return_stats=True)

        def fastln_bwd(out=None):
            return fastln.add_layer_norm_backward(dy, s, mean, rstd, w, ds=ds,
                                                  input_bias_grad=True, out=out)
        names = ("dx", "dweight", "dbias", "dinput_bias")
    else:
        _, s, rstd = fastln.add_rms_norm(x, r, w, input_bias=bi, return_stats=True)

        def fastln_bwd(out=None):
            return fastln.add_rms_norm_backward(dy, s, rstd, w, ds=ds, input_bias_grad=True,
                                                out=out)
        names = ("dx", "dweight", "dinput_bias")
    fns = {"fastln": fastln_bwd, "fastln_out": lambda: fastln_bwd(out=d_out)}
    want = list(fns["fastln"]())
    _check(row, "fastln_out", list(fns["fastln_out"]()), want, names)
    fns.update(_copies(x))
    if torch is not None:
        F = torch.nn.functional
        xt, rt, bit, wt, bt = (torch.from_numpy(a.copy()).requires_grad_(True)
                               for a in (x, r, bi, w, b))
        st = xt + rt + bit
        if op == "add_layer_norm":
            yt = F.layer_norm(st, (H,), wt, bt, LN_EPS)
            inputs = [xt, rt, wt, bt, bit]
        else:
            yt = F.rms_norm(st, (H,), wt, RMS_EPS)
            inputs = [xt, rt, wt, bit]
        grads = [torch.from_numpy(dy), torch.from_numpy(ds)]

        def torch_bwd():
            return torch.autograd.grad([yt, st], inputs, grads, retain_graph=True)
        got = [_np(t) for t in torch_bwd()]
        # x and the residual get the same gradient, dsum
        _check(row, "torch", [got[0]] + got[2:], want, names)
        _check(row, "torch dresidual", [got[1]], want[:1], names[:1])
        fns["torch"] = torch_bwd
    else:
        row["notes"].append("torch is not installed")
    return row, fns


def _cf(key, shape, n, rng):
    family, op, _ = CASES[key]
    Nb, C, Hs, Ws = shape
    x = rng.standard_normal(shape, dtype=np.float32)
    x_cl = np.ascontiguousarray(x.transpose(0, 2, 3, 1))      # the same values, channels last
    w = (1 + 0.1 * rng.standard_normal(C)).astype(np.float32)
    b = (0.1 * rng.standard_normal(C)).astype(np.float32)
    row = _row(key, shape, n, x)
    row["shape_cl"] = list(x_cl.shape)
    cf_out, cl_out = np.empty_like(x), np.empty_like(x_cl)

    def to_cl(a):
        return np.ascontiguousarray(np.moveaxis(a, 1, -1))
    if family == "cf_fwd":
        if op == "layer_norm":
            def ln(a, axis=-1, out=None):
                return fastln.layer_norm(a, w, b, axis=axis, eps=LN_EPS, out=out)
        else:
            def ln(a, axis=-1, out=None):
                return fastln.rms_norm(a, w, axis=axis, eps=RMS_EPS, out=out)
        fns = {"fastln_cf": lambda: ln(x, axis=1), "fastln_cf_out": lambda: ln(x, 1, cf_out),
               "fastln_cl": lambda: ln(x_cl), "fastln_cl_out": lambda: ln(x_cl, out=cl_out)}
        want_cl = fns["fastln_cl"]()
        want_cf = fns["fastln_cf"]()
        _check(row, "fastln_cl", [want_cl], [to_cl(want_cf)], ("y",))
        _check(row, "fastln_cf_out", [fns["fastln_cf_out"]()], [want_cf], ("y",))
        _check(row, "fastln_cl_out", [fns["fastln_cl_out"]()], [want_cl], ("y",))
        names = ("y",)
    else:
        dy = rng.standard_normal(shape, dtype=np.float32)
        dy_cl = to_cl(dy)
        _, mean, rstd = fastln.layer_norm(x, w, b, axis=1, eps=LN_EPS, return_stats=True)
        _, mean_cl, rstd_cl = fastln.layer_norm(x_cl, w, b, eps=LN_EPS, return_stats=True)
        fns = {
            "fastln_cf": lambda: fastln.layer_norm_backward(dy, x, mean, rstd, w, axis=1),
            "fastln_cf_out": lambda: fastln.layer_norm_backward(dy, x, mean, rstd, w, axis=1,
                                                                out=cf_out),
            "fastln_cl": lambda: fastln.layer_norm_backward(dy_cl, x_cl, mean_cl, rstd_cl, w),
            "fastln_cl_out": lambda: fastln.layer_norm_backward(dy_cl, x_cl, mean_cl, rstd_cl,
                                                                w, out=cl_out)}
        names = ("dx", "dweight", "dbias")
        want_cl = list(fns["fastln_cl"]())
        want_cf = list(fns["fastln_cf"]())
        _check(row, "fastln_cl", want_cl, [to_cl(want_cf[0])] + want_cf[1:], names)
        _check(row, "fastln_cf_out", list(fns["fastln_cf_out"]()), want_cf, names)
        _check(row, "fastln_cl_out", list(fns["fastln_cl_out"]()), want_cl, names)
    fns.update(_copies(x))
    if torch is None:
        row["notes"].append("torch is not installed")
        return row, fns
    F = torch.nn.functional
    xt, xt_cl, wt, bt = (torch.from_numpy(a) for a in (x, x_cl, w, b))
    if family == "cf_fwd":
        if op == "layer_norm":
            def norm(t):
                return F.layer_norm(t, (C,), wt, bt, LN_EPS)
        else:
            def norm(t):
                return F.rms_norm(t, (C,), wt, RMS_EPS)

        def torch_cl():
            with torch.inference_mode():
                return norm(xt_cl)

        def torch_permute():
            with torch.inference_mode():
                return norm(xt.permute(0, 2, 3, 1)).permute(0, 3, 1, 2).contiguous()
        _check(row, "torch_cl", [_np(torch_cl())], [want_cl], names)
        _check(row, "torch_permute", [_np(torch_permute())], [want_cf], names)
        fns.update(torch_cl=torch_cl, torch_permute=torch_permute)
    else:
        xg, wg, bg = (torch.from_numpy(a.copy()).requires_grad_(True) for a in (x_cl, w, b))
        yg = F.layer_norm(xg, (C,), wg, bg, LN_EPS)
        dyt = torch.from_numpy(dy_cl)

        def torch_cl():
            return torch.autograd.grad(yg, [xg, wg, bg], dyt, retain_graph=True)
        _check(row, "torch_cl", [_np(t) for t in torch_cl()], want_cl, names)
        fns["torch_cl"] = torch_cl
    return row, fns


def _ratio(t, a, b):
    return t[a] / t[b] if t.get(a) is not None and t.get(b) is not None else None


def _finish(row, tm):
    """Derived times, the ratios (peer / fastln) and the copy fraction."""
    t = row["times"]
    t.update(tm)
    t["copy_best"] = min(t["copy"], t["copy_nt"])
    runs = [t[k] for k in ("ort_run", "ort_iobinding") if t.get(k) is not None]
    if runs:
        t["ort"] = min(runs)
    ra = row["ratios"]
    if row["family"] == "fused_fwd":
        ra["ort/fastln"] = _ratio(t, "ort", "fastln")
        ra["ort_out/fastln_out"] = _ratio(t, "ort_out", "fastln_out")
        ra["torch/fastln"] = _ratio(t, "torch", "fastln")
        out = t["fastln_out"]
    elif row["family"] == "fused_bwd":
        ra["torch/fastln"] = _ratio(t, "torch", "fastln")
        out = t["fastln_out"]
    else:
        ra["fastln_cf/fastln_cl"] = _ratio(t, "fastln_cf_out", "fastln_cl_out")
        ra["fastln_cf/fastln_cl_alloc"] = _ratio(t, "fastln_cf", "fastln_cl")
        ra["torch_cl/fastln_cf"] = _ratio(t, "torch_cl", "fastln_cf")
        if row["family"] == "cf_fwd":
            ra["torch_permute/fastln_cf"] = _ratio(t, "torch_permute", "fastln_cf")
        out = t["fastln_cf_out"]
    copy_bytes = 2 * row["bytes"] // BYTES_COUNTED[row["family"]][0]
    row["copy_frac"] = (row["bytes"] / out) / (copy_bytes / t["copy_best"])


BENCH = {"fused_fwd": _fused_fwd, "fused_bwd": _fused_bwd, "cf_fwd": _cf, "cf_bwd": _cf}


def bench_case(key, shape, n, kw, seed=0):
    """One case at one shape on the current thread setting (n threads): the row."""
    row, fns = BENCH[CASES[key][0]](key, shape, n, np.random.default_rng(seed))
    for k in ("copy", "copy_nt"):   # the copies' warm-up: every other callable ran in the checks
        fns[k]()
    groups = {k: GROUPS[k.split("_")[0]] for k in fns}
    gap = _selfcheck.SPIN_GAP if n > 1 else 0.0
    tm = _selfcheck.time_peers(fns, gap=gap, groups=groups, warmup=0,
                               spinning=_selfcheck.SPINNING, **kw)
    _finish(row, tm)
    return row


def run(threads=(2,), quick=False, cases=None, shapes=None, timing=None, progress=None):
    """Time the ``cases`` (--cases names; default all) at each thread count.

    ``shapes`` ({case: [shape, ...]}) replaces SHAPES for the cases it names;
    ``timing`` replaces timing_kw(quick); ``progress(row)`` is called after each
    row. Returns a JSON-friendly dict: {'info', 'quick', 'elapsed_s', 'threads',
    'cases', 'rows'}; each row has 'case', 'title', 'shape', 'threads', 'bytes',
    'bytes_counted', 'times' (median s/call), 'ratios', 'copy_frac', 'max_diff'
    (each peer's largest difference from fastln's outputs), 'notes'."""
    cases = list(CASES) if cases is None else list(cases)
    for c in cases:
        if c not in CASES:
            raise ValueError(f"cases: unknown case {c!r} (choose from {', '.join(CASES)})")
    shapes = {c: list((shapes or {}).get(c, SHAPES[c])) for c in cases}
    kw = timing or timing_kw(quick)
    info = harness.machine_info()
    rows = []
    saved = harness.peer_threads()
    t0 = time.perf_counter()
    try:
        with _selfcheck.OtherLoad() as load:
            for n in threads:
                harness.set_peer_threads(n)      # first: torch may share fastln's libgomp
                with fastln.threads(n):
                    for c in cases:
                        for shape in shapes[c]:
                            rows.append(bench_case(c, shape, n, kw))
                            if progress is not None:
                                progress(rows[-1])
    finally:
        harness.restore_peer_threads(saved)
    info["cpu_other_load"] = load.fraction
    return {"info": info, "quick": quick, "elapsed_s": time.perf_counter() - t0,
            "threads": list(threads), "cases": shapes, "rows": rows}


# ---- formatting ---------------------------------------------------------------

def _ms(t):
    if t is None:
        return "-"
    ms = t * 1e3
    return f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}" if ms >= 0.1 else f"{ms:.4f}"


def _x(r):
    return "-" if r is None else f"{r:.2f}x"


def _pct(f):
    return "-" if f is None else f"{100 * f:.0f}%"


def _size(nbytes):
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << k:
            return f"{nbytes / (1 << k):.0f} {unit}"
    return f"{nbytes} B"


def _shape(row):
    return "(" + ", ".join(map(str, row["shape"])) + ")"


def _bytes(row):
    return f"{_size(row['bytes'])}: {row['bytes_counted']}"


# per family: (heading, [(column, cell of a row)])
TABLES = {
    "fused_fwd": ("Fused residual norms, forward", [
        ("fastln ms", lambda r: _ms(r["times"].get("fastln"))),
        ("out= ms", lambda r: _ms(r["times"].get("fastln_out"))),
        ("ort ms", lambda r: _ms(r["times"].get("ort"))),
        ("ort out= ms", lambda r: _ms(r["times"].get("ort_out"))),
        ("torch ms", lambda r: _ms(r["times"].get("torch"))),
        ("copy ms", lambda r: _ms(r["times"].get("copy_best"))),
        ("ort/fastln", lambda r: _x(r["ratios"].get("ort/fastln"))),
        ("ort out=/out=", lambda r: _x(r["ratios"].get("ort_out/fastln_out"))),
        ("torch/fastln", lambda r: _x(r["ratios"].get("torch/fastln"))),
        ("fwd/copy", lambda r: _pct(r["copy_frac"]))]),
    "fused_bwd": ("Fused residual norms, backward", [
        ("fastln ms", lambda r: _ms(r["times"].get("fastln"))),
        ("out= ms", lambda r: _ms(r["times"].get("fastln_out"))),
        ("torch autograd ms", lambda r: _ms(r["times"].get("torch"))),
        ("copy ms", lambda r: _ms(r["times"].get("copy_best"))),
        ("torch/fastln", lambda r: _x(r["ratios"].get("torch/fastln"))),
        ("bwd/copy", lambda r: _pct(r["copy_frac"]))]),
    "cf": ("Channels-first (axis=1) against channels-last", [
        ("fastln cf ms", lambda r: _ms(r["times"].get("fastln_cf"))),
        ("cf out= ms", lambda r: _ms(r["times"].get("fastln_cf_out"))),
        ("fastln cl ms", lambda r: _ms(r["times"].get("fastln_cl"))),
        ("cl out= ms", lambda r: _ms(r["times"].get("fastln_cl_out"))),
        ("torch cl ms", lambda r: _ms(r["times"].get("torch_cl"))),
        ("torch permute ms", lambda r: _ms(r["times"].get("torch_permute"))),
        ("copy ms", lambda r: _ms(r["times"].get("copy_best"))),
        ("cf/cl (out=)", lambda r: _x(r["ratios"].get("fastln_cf/fastln_cl"))),
        ("torch cl/cf", lambda r: _x(r["ratios"].get("torch_cl/fastln_cf"))),
        ("torch permute/cf", lambda r: _x(r["ratios"].get("torch_permute/fastln_cf"))),
        ("cf/copy", lambda r: _pct(r["copy_frac"]))]),
}


def _table_of(family):
    return "cf" if family.startswith("cf") else family


def format_table(result, markdown=False):
    """The rows of run() as tables, per thread count and family (text or markdown)."""
    lines = []
    for n in result["threads"]:
        title = f"{n} thread{'s' if n > 1 else ''}"
        lines += [f"### {title}", ""] if markdown else [title + ":"]
        sub = [r for r in result["rows"] if r["threads"] == n]
        for fam, (heading, cols) in TABLES.items():
            rs = [r for r in sub if _table_of(r["family"]) == fam]
            if not rs:
                continue
            lines += [f"#### {heading}" if markdown else f"{heading}:", ""]
            heads = ["case", "shape", "bytes counted"] + [h for h, _ in cols]
            cells = [[r["title"], _shape(r), _bytes(r)] + [f(r) for _, f in cols] for r in rs]
            lines += harness.table_lines(heads, cells, markdown)
            lines.append("")
        notes = sorted({f"{r['title']}: {m}" for r in sub for m in r["notes"]})
        lines += [f"note: {m}" for m in notes]
        if notes:
            lines.append("")
    return "\n".join(lines).rstrip("\n")


def results_md(result):
    """The '## Fused residual norms and channels-first LayerNorm' section of bench/RESULTS.md."""
    load = result["info"].get("cpu_other_load")
    out = [
        "## Fused residual norms and channels-first LayerNorm",
        "",
        "`bench/fused.py`, float32. Times are medians in ms per call, the peers timed in turns "
        "on the same number of threads; \"P/fastln\" is fastln's speedup over P (t_P / t_fastln). "
        "Forward peers: ONNX Runtime's com.microsoft SkipSimplifiedLayerNormalization / "
        "SkipLayerNormalization (one node; the faster of `run` and `run_with_iobinding`, "
        "\"ort out=\" with preallocated outputs, compared with fastln's `out=`) and the PyTorch "
        "composite (x + r, then F.rms_norm / F.layer_norm, under inference_mode). Backward: "
        "PyTorch autograd of the composite, the graph built outside the timed call "
        "(`torch.autograd.grad(..., retain_graph=True)`), for dx, dresidual, dweight(, dbias) "
        "and dinput_bias. Channels-first: fastln's axis=1 call on NCHW against its "
        "channels-last call on the same values (\"cf/cl\": the ratio of their `out=` times; "
        "about 1 means the layout costs nothing), torch's channels-last F.layer_norm / "
        "F.rms_norm (backward: autograd of it) and torch's permute + norm + permute + "
        "contiguous on NCHW. \"/copy\" is fastln's `out=` throughput as a fraction of a "
        "parallel copy of x on the same threads, counting the arrays of x's size the call "
        "reads and writes (\"bytes counted\"). Every peer's outputs match fastln's "
        "(rtol = atol = 1e-4) before it is timed. "
        f"Run took {result['elapsed_s']:.0f} s"
        + harness.load_phrase(load) + ".",
        "",
        format_table(result, markdown=True),
    ]
    return "\n".join(out)


def progress_line(row):
    parts = [f"{k} {v:.2f}x" for k, v in row["ratios"].items() if v is not None]
    return (f"  {row['title']} {_shape(row)} t={row['threads']}: "
            + ", ".join(parts + [f"copy {_pct(row['copy_frac'])}"]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer samples (under a minute)")
    ap.add_argument("--threads", default="2", help="comma-separated thread counts (default 2)")
    ap.add_argument("--cases", default=",".join(CASES),
                    help=f"comma-separated subset of {','.join(CASES)} (default: all)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = ap.parse_args(argv)
    if args.json is not None:
        _selfcheck.check_output_path(ap, "--json", args.json)
    nthreads = harness.parse_threads(ap, args.threads)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    if bad or not cases:
        ap.error(f"--cases: choose from {', '.join(CASES)} (got {args.cases!r})")
    missing = [p for p, m in (("torch", torch), ("onnxruntime", harness.ort),
                              ("onnx", harness.onnx)) if m is None]
    if missing:
        print(f"not installed: {', '.join(missing)} (their columns are '-')", flush=True)
    harness.warn_if_busy()
    print(f"fastln {fastln.__version__}, fused and channels-first benchmark, threads "
          f"{nthreads}{' (quick)' if args.quick else ''} ...", flush=True)
    result = run(threads=nthreads, quick=args.quick, cases=cases,
                 progress=lambda r: print(progress_line(r), flush=True))
    print()
    print(format_table(result, markdown=True))
    harness.report_and_save(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
