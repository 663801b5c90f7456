"""The fastln.torch benchmark: fastln's recurrent engine as PyTorch modules,
trained and run for inference, against fastln's NumPy call on the same weights
and the LN-LSTM a PyTorch user writes.

    python bench/torch_modules.py [--quick] [--threads 2] [--hidden 256,512,1024]
                                  [--no-compile] [--train-only | --infer-only] [--json PATH]

Cases, one layer, float32 unless said:

- Training step, T=100, B=32, I=128, H in --hidden (default 256, 512, 1024;
  --quick: 256): forward and backward of loss = (y * g).sum(), g a fixed
  random tensor, x requiring grad, every grad reset to None before each call:
  * LNLSTM: ``fastln.torch.LNLSTM.from_rnn(m)`` (the module under test);
    ``m.forward(x, cache=True)`` + ``m.backward(g)`` of the fastln.rnn model m
    itself (the reference: the same engine from NumPy); a PyTorch LN-LSTM of
    exactly fastln's equations (docs/design.md, "Recurrent networks";
    bench/rnn.py's EagerLNLSTM: a Python loop over time, the input projection
    and its LN for all steps at once) in three forms: eager, the layer under
    ``torch.jit.script``, and the same layer with its cell (one time step)
    under ``torch.compile`` (compiled on its first call, with inductor's
    on-disk caches off: the compile time is reported apart and not timed);
    and ``torch.nn.LSTM``, which has no LayerNorm, for context.
  * LNGRU the same way: ``fastln.torch.LNGRU``, fastln.rnn's LNGRU, an LN-GRU
    layer of fastln's equations (EagerLNGRU below) eager, scripted and with its
    cell compiled, and ``torch.nn.GRU``.
  The fastln model's LN gains and biases (and the LSTM's gate bias) are moved
  off their init so that they matter, and every LN peer is loaded with its
  weights. Before timing, each peer's y must match the fastln.rnn model's over
  the first 10 steps at rtol = atol = 1e-4, else AssertionError (the
  recurrence amplifies float32 rounding: two correct implementations drift
  apart over 100 steps, see bench/rnn.py). Whether fastln.torch's y, dx and
  parameter gradients are bitwise the fastln.rnn model's is reported.
- Inference under ``torch.no_grad()``, T=100, I=128, H=256, B = 1, 8, 256:
  ``fastln.torch.LNLSTM.from_rnn(m)`` against ``m.forward(x, cache=False)`` in
  float32; in bfloat16 (the module's ``.to(torch.bfloat16)`` on bfloat16 x
  against the model's ``.to(ml_dtypes.bfloat16)`` on the same x; needs
  ml_dtypes: torch's ``.to`` rounds the LN gains and biases to bfloat16 as
  well, which the model's keeps in float32, so that model is loaded with the
  module's values first);
  and int8 (``fastln.torch.quantize(module)`` against
  ``fastln.rnn.quantize(m)``). The module's y must match the model's (first
  10 steps, rtol = atol = 1e-4; bfloat16 1e-2); whether it is bitwise the same
  is reported.

The table gives ms per call (medians), each time over the fastln.rnn
reference's, and the targets: training, fastln.torch / fastln.rnn <= 1.1 and
fastln.torch / the fastest of the eager, TorchScript and torch.compile LN
cells <= 0.45; inference, fastln.torch / fastln.rnn <= 1.1.

Timing follows bench/harness.py: every case's callables are timed in turns in
one process (each round times each once), medians per call, ratios of
medians; torch.set_num_threads(n) is called before fastln's thread count is
set (torch may share fastln's libgomp). If fastln.torch cannot be imported its
rows are empty and the rest is timed. A peer that cannot be set up (no C++
compiler for torch.compile, say) is an empty row with a note.
"""
import argparse
import os
import sys
import time
import warnings
from typing import Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # the repository root, for an in-place build

import numpy as np  # noqa: E402

import fastln  # noqa: E402
from bench import harness  # noqa: E402
from bench import rnn as bench_rnn  # noqa: E402
from fastln import _selfcheck  # noqa: E402
from fastln import rnn as fastln_rnn  # noqa: E402

torch = harness.torch           # None when torch is not installed

try:
    from fastln import torch as fastln_torch  # noqa: E402
    TORCH_MODULES_ERROR = None
except Exception as e:          # torch missing, or fastln.torch not built or broken
    fastln_torch = None
    TORCH_MODULES_ERROR = f"{type(e).__name__}: {e}"

EPS = bench_rnn.EPS
TRAIN_CASE = dict(T=100, B=32, I=128)
TRAIN_HIDDEN = (256, 512, 1024)
QUICK_HIDDEN = (256,)
INFER_CASE = dict(T=100, I=128, H=256)
INFER_BATCHES = (1, 8, 256)
CELLS = ("LNLSTM", "LNGRU")
INFER_DTYPES = ("float32", "bfloat16", "int8")
CHECK_STEPS = bench_rnn.CHECK_STEPS
TOL = {"float32": 1e-4, "int8": 1e-4, "bfloat16": 1e-2}   # rtol = atol, first CHECK_STEPS
# the targets the tables hold the ratios to: fastln.torch's time over the reference's at most this
TARGET_OVER_NUMPY = 1.1
TARGET_OVER_BEST_CELL = 0.45
TARGET_INFER = 1.1

# the training peers, in the table's order: key -> label ({cls}: nn.LSTM or nn.GRU)
PEERS = {"fastln.torch": "fastln.torch", "fastln.rnn": "fastln.rnn (NumPy)",
         "eager": "eager PyTorch", "script": "TorchScript", "compile": "torch.compile",
         "nn": "nn.{cls} (no LN)"}
LN_CELLS = ("eager", "script", "compile")   # the PyTorch LN layers the target compares with
# the thread pools a training step's callable runs on (see _selfcheck.time_peers: a
# pause follows a switch of pool): a fastln.torch step runs torch's elementwise ops
# and autograd besides fastln's engine; the rest of the torch peers run on torch's
GROUPS = {"fastln.rnn": "fastln", "fastln.torch": "fastln.torch"}


# ---- the PyTorch LN peers -----------------------------------------------------

if torch is not None:
    import torch.nn.functional as F
    from torch import Tensor

    class ScriptLNLSTM(bench_rnn.EagerLNLSTM):
        """bench/rnn.py's EagerLNLSTM with the state's type spelled out for
        torch.jit.script (its cell and input gates are the eager ones)."""

        def forward(self, x: Tensor,
                    state: Optional[Tuple[Tensor, Tensor]] = None
                    ) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
            T, B, _ = x.shape
            if state is None:
                h = x.new_zeros(B, self.hidden_size)
                c = x.new_zeros(B, self.hidden_size)
            else:
                h, c = state
            gx = self._input_gates(x)
            ys = []
            for gx_t in gx.unbind(0):
                h, c = self._cell(gx_t, h, c)
                ys.append(h)
            return torch.stack(ys), (h, c)

    class EagerLNGRU(torch.nn.Module):
        """One-layer LN-GRU of docs/design.md (tests/_rnn_torch.py's _step_gru),
        blocks z, r, n:

            zr = LN(x W_ih[:2H]^T; ln_ih) + LN(h W_hh[:2H]^T; ln_hh)   (LNs over 2H)
            n = tanh(LN(x W_ih[2H:]^T; ln_in) + sigmoid(r) * LN(h W_hh[2H:]^T; ln_hn))
            h_t = (1 - sigmoid(z)) * h + sigmoid(z) * n

        written like bench/rnn.py's EagerLNLSTM (the input projection and its
        LNs for all steps at once, a Python loop over time), and scriptable.
        """

        def __init__(self, input_size, hidden_size, eps=EPS):
            super().__init__()
            H = hidden_size
            self.input_size, self.hidden_size, self.eps = input_size, H, eps
            P = torch.nn.Parameter
            self.weight_ih = P(torch.zeros(3 * H, input_size))
            self.weight_hh = P(torch.zeros(3 * H, H))
            for name, n in (("ln_ih", 2 * H), ("ln_hh", 2 * H), ("ln_in", H), ("ln_hn", H)):
                setattr(self, name + "_weight", P(torch.ones(n)))
                setattr(self, name + "_bias", P(torch.zeros(n)))

        def _input_gates(self, x):
            H = self.hidden_size
            gx = F.linear(x, self.weight_ih)
            return torch.cat([
                F.layer_norm(gx[..., :2 * H], (2 * H,), self.ln_ih_weight, self.ln_ih_bias,
                             self.eps),
                F.layer_norm(gx[..., 2 * H:], (H,), self.ln_in_weight, self.ln_in_bias,
                             self.eps)], -1)

        def _cell(self, gx_t, h):
            """One step given gx_t = _input_gates(x)[t]."""
            H = self.hidden_size
            gh = F.linear(h, self.weight_hh)
            zr = gx_t[:, :2 * H] + F.layer_norm(gh[:, :2 * H], (2 * H,), self.ln_hh_weight,
                                                 self.ln_hh_bias, self.eps)
            z, r = torch.sigmoid(zr[:, :H]), torch.sigmoid(zr[:, H:])
            n = torch.tanh(gx_t[:, 2 * H:] + r * F.layer_norm(
                gh[:, 2 * H:], (H,), self.ln_hn_weight, self.ln_hn_bias, self.eps))
            return (1 - z) * h + z * n

        def forward(self, x: Tensor, h0: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
            """x (T,B,I) -> y (T,B,H), h_T (B,H)."""
            T, B, _ = x.shape
            h = x.new_zeros(B, self.hidden_size) if h0 is None else h0
            gx = self._input_gates(x)
            ys = []
            for gx_t in gx.unbind(0):
                h = self._cell(gx_t, h)
                ys.append(h)
            return torch.stack(ys), h

        load_fastln = bench_rnn.EagerLNLSTM.load_fastln

    LN_PEERS = {"LNLSTM": (bench_rnn.EagerLNLSTM, ScriptLNLSTM), "LNGRU": (EagerLNGRU, EagerLNGRU)}
    NN_PEERS = {"LNLSTM": torch.nn.LSTM, "LNGRU": torch.nn.GRU}


def _ln_peer(cell, form, m):
    """The PyTorch LN layer of ``cell`` in ``form`` (eager, script, compile) on
    fastln model m's weights. "compile" compiles the cell (one time step) on
    its first call."""
    eager_cls, script_cls = LN_PEERS[cell]
    I, H = m.params["weight_ih_l0"].shape[1], m.params["weight_hh_l0"].shape[1]
    mod = (script_cls if form == "script" else eager_cls)(I, H)
    mod.load_fastln(m.params)
    if form == "script":
        with warnings.catch_warnings():     # TorchScript is deprecated, and still used
            warnings.simplefilter("ignore", DeprecationWarning)
            return torch.jit.script(mod)
    if form == "compile":
        torch._dynamo.reset()      # each H compiles afresh, within dynamo's recompile limit
        mod._cell = torch.compile(mod._cell, dynamic=False)
    return mod


# ---- checks -------------------------------------------------------------------

def _perturbed(cls, I, H, seed):
    """A float32 fastln.rnn model whose LN gains and biases (and gate bias, where
    it has one) are moved off their init, so that they matter in the checks."""
    m = cls(I, H, dtype=np.float32, seed=seed)
    rng = np.random.default_rng(seed + 1)
    d = {}
    for k, v in m.state_dict().items():
        if k.startswith(("ln_", "bias")):
            base = 1.0 if "_weight_" in k else 0.0
            v = (base + 0.1 * rng.standard_normal(v.shape)).astype(np.float32)
        d[k] = np.array(v, copy=True)
    m.load_state_dict(d)
    return m


def _as_f32(a):
    """A NumPy float32 array of a tensor (any float dtype) or array."""
    if torch is not None and isinstance(a, torch.Tensor):
        return a.detach().float().numpy()
    return np.asarray(a, np.float32)


def _check_y(label, y, want, tol):
    """AssertionError unless y's first CHECK_STEPS steps are within tol of want's."""
    ns = min(CHECK_STEPS, len(want))
    y, want = _as_f32(y)[:ns], _as_f32(want)[:ns]
    if y.shape != want.shape or not np.allclose(y, want, rtol=tol, atol=tol):
        raise AssertionError(f"{label}: y (first {ns} steps) disagrees with fastln.rnn's: "
                             f"max|diff| = {bench_rnn._max_err(y, want):.3g} (rtol=atol={tol:g}); "
                             "not timing it")
    return bench_rnn._max_err(y, want)


def _bitwise(a, b):
    a, b = _as_f32(a), _as_f32(b)
    return a.shape == b.shape and bool(np.array_equal(a, b))


def _grads_bitwise(module, m, dx_t, dx):
    """(all bitwise?, names of the module's parameters that fastln.rnn's grads
    lack): dx and each parameter gradient of a fastln.torch module against the
    fastln.rnn model's after the same step."""
    same = _bitwise(dx_t, dx)
    unmatched = []
    for name, p in module.named_parameters():
        if name not in m.grads:
            unmatched.append(name)
        elif p.grad is None or not _bitwise(p.grad, m.grads[name]):
            same = False
    return same, unmatched


# ---- training -----------------------------------------------------------------

_RUN_START = [time.perf_counter()]   # run() sets it: progress lines count from there


def _progress(what):
    """A progress line on stderr, flushed: what runs next, and the seconds since run() began."""
    print(f"  torch modules [{time.perf_counter() - _RUN_START[0]:.0f} s] {what}",
          file=sys.stderr, flush=True)


def _train_step(mod, xg, gt):
    """One training step of torch module ``mod`` on xg: returns y."""
    params = list(mod.parameters())

    def step():
        for p in params:
            p.grad = None
        xg.grad = None
        y = mod(xg)[0]
        (y * gt).sum().backward()
        return y
    return step


def _bench_train(cell, H, kw, gap, compile_cells=True, case=TRAIN_CASE, seed=0):
    """One training case: a row with 'times' (median s/call, None for a peer not
    set up), 'ratios' (over fastln.rnn's), 'compile_s', 'maxdiff' (first
    CHECK_STEPS steps against fastln.rnn's y), fastln.torch's 'bitwise' (y,
    grads) and 'notes'."""
    T, B, I = (case[k] for k in "TBI")
    row = {"cell": cell, "T": T, "B": B, "I": I, "H": H, "times": dict.fromkeys(PEERS),
           "compile_s": None, "maxdiff": {}, "bitwise": {}, "notes": []}
    rng = np.random.default_rng(seed + H)
    x = rng.standard_normal((T, B, I), dtype=np.float32)
    g = rng.standard_normal((T, B, H), dtype=np.float32)
    m = _perturbed(getattr(fastln_rnn, cell), I, H, seed)
    want, _ = m.forward(x, cache=True)
    dx, _ = m.backward(g)
    want, dx = want.copy(), dx.copy()

    def numpy_step():
        y, _ = m.forward(x, cache=True)
        m.backward(g)
        return y
    fns = {"fastln.rnn": numpy_step}
    xg = torch.from_numpy(x.copy()).requires_grad_(True)
    gt = torch.from_numpy(g)
    if fastln_torch is not None:
        mod = getattr(fastln_torch, cell).from_rnn(m)
        fns["fastln.torch"] = f = _train_step(mod, xg, gt)
        y = f()
        row["maxdiff"]["fastln.torch"] = _check_y(f"fastln.torch.{cell} H={H}", y, want,
                                                  TOL["float32"])
        row["bitwise"]["y"] = _bitwise(y, want)
        row["bitwise"]["grads"], unmatched = _grads_bitwise(mod, m, xg.grad, dx)
        if unmatched:
            row["notes"].append(f"fastln.torch.{cell} parameters without a fastln.rnn "
                                f"gradient of that name: {', '.join(unmatched)}")
    forms = [f for f in LN_CELLS if compile_cells or f != "compile"]
    torch.manual_seed(seed)
    peers = {form: (lambda form=form: _ln_peer(cell, form, m)) for form in forms}
    peers["nn"] = lambda: NN_PEERS[cell](I, H)
    for key, build in peers.items():
        label = f"{PEERS[key].format(cls=NN_PEERS[cell].__name__)} {cell} H={H}"
        try:
            f = _train_step(build(), xg, gt)
            t0 = time.perf_counter()
            if key == "compile":        # a cold compile: inductor's on-disk caches off
                with torch._inductor.config.patch(force_disable_caches=True):
                    y = f()
                row["compile_s"] = time.perf_counter() - t0
            else:
                y = f()
        except Exception as e:
            row["notes"].append(f"{label}: setup failed: {type(e).__name__}: {e}")
            continue
        if key != "nn":                 # nn.LSTM / nn.GRU compute other equations
            row["maxdiff"][key] = _check_y(label, y, want, TOL["float32"])
        fns[key] = f
    for f in fns.values():              # TorchScript optimizes its graph over the first runs
        f()
        f()
    groups = {k: GROUPS.get(k, "torch") for k in fns}
    row["times"].update(_selfcheck.time_peers(fns, gap=gap, groups=groups, **kw))
    row["ratios"] = _train_ratios(row["times"])
    return row


def _train_ratios(t):
    ref = t.get("fastln.rnn")
    ratios = {k: (v / ref if v is not None and ref else None) for k, v in t.items()}
    cells = {k: t[k] for k in LN_CELLS if t.get(k) is not None}
    best = min(cells, key=cells.get) if cells else None
    ratios["best_cell"] = best
    ratios["torch_over_best_cell"] = (t["fastln.torch"] / cells[best]
                                      if best and t.get("fastln.torch") is not None else None)
    return ratios


# ---- inference ------------------------------------------------------------------

def _infer_pair(dtype, m, x):
    """(fastln.torch callable or None, fastln.rnn callable) of one dtype: each
    returns y; fastln.torch's under torch.no_grad()."""
    mod, xt = None, torch.from_numpy(x)
    if fastln_torch is not None:
        mod = fastln_torch.LNLSTM.from_rnn(m)
        if dtype == "bfloat16":
            mod, xt = mod.to(torch.bfloat16), xt.to(torch.bfloat16)
        elif dtype == "int8":
            mod = fastln_torch.quantize(mod)
    ref, xr = m, x
    if dtype == "bfloat16":
        if mod is not None:
            # torch's .to(torch.bfloat16) rounds every parameter, the LN gains and
            # biases too, where model.to(ml_dtypes.bfloat16) rounds the weight matrices
            # only: the reference gets the module's values
            ref = type(m)(m.input_size, m.hidden_size, dtype=np.float32)
            ref.load_state_dict({name: p.detach().float().numpy()
                                 for name, p in mod.named_parameters()})
        bf = harness.ml_dtypes.bfloat16
        ref, xr = ref.to(bf), x.astype(bf)
    elif dtype == "int8":
        ref = fastln_rnn.quantize(m)

    def numpy_fwd():
        return ref.forward(xr, cache=False)[0]

    def torch_fwd():
        with torch.no_grad():
            return mod(xt)[0]
    return (None if mod is None else torch_fwd), numpy_fwd


def _bench_infer(B, kw, gap, case=INFER_CASE, seed=0):
    """The inference rows at batch B, one a dtype: 'times' (median s/call of
    'fastln.torch' and 'fastln.rnn'), 'ratio', 'maxdiff', 'bitwise', or
    'skipped' (why)."""
    T, I, H = (case[k] for k in "TIH")
    rng = np.random.default_rng(seed + 100 + B)
    x = rng.standard_normal((T, B, I), dtype=np.float32)
    m = _perturbed(fastln_rnn.LNLSTM, I, H, seed)
    rows = []
    for dtype in INFER_DTYPES:
        row = {"cell": "LNLSTM", "dtype": dtype, "T": T, "B": B, "I": I, "H": H,
               "times": {"fastln.torch": None, "fastln.rnn": None}, "ratio": None,
               "maxdiff": None, "bitwise": None, "skipped": None}
        rows.append(row)
        if dtype == "bfloat16" and harness.ml_dtypes is None:
            row["skipped"] = "bfloat16 needs ml_dtypes"
            continue
        torch_fwd, numpy_fwd = _infer_pair(dtype, m, x)
        fns = {"fastln.rnn": numpy_fwd}
        if torch_fwd is not None:
            want, y = numpy_fwd(), torch_fwd()
            row["maxdiff"] = _check_y(f"fastln.torch.LNLSTM {dtype} B={B}", y, want, TOL[dtype])
            row["bitwise"] = _bitwise(y, want)
            fns["fastln.torch"] = torch_fwd
        groups = dict.fromkeys(fns, "fastln")   # under no_grad, the module runs the engine only
        row["times"].update(_selfcheck.time_peers(fns, gap=gap, groups=groups, **kw))
        t = row["times"]
        if t["fastln.torch"] is not None:
            row["ratio"] = t["fastln.torch"] / t["fastln.rnn"]
    return rows


# ---- the run --------------------------------------------------------------------

def timing_kw(quick):
    return (dict(repeats=5, budget=0.5, min_sample=1e-3, min_repeats=3) if quick
            else dict(repeats=15, budget=2.0, min_sample=2e-3, min_repeats=5))


def run(threads=(2,), quick=False, hidden=None, compile_cells=True, cells=CELLS,
        train_case=TRAIN_CASE, infer_case=INFER_CASE, batches=INFER_BATCHES, timing=None):
    """Every case at each thread count. Returns a JSON-friendly dict: 'info',
    'quick', 'elapsed_s', 'fastln_torch' (its import error or None), 'cases',
    'results': [{'threads', 'train': rows, 'infer': rows}]."""
    if torch is None:
        raise RuntimeError("the fastln.torch benchmark needs torch")
    hidden = tuple(hidden or (QUICK_HIDDEN if quick else TRAIN_HIDDEN))
    kw = timing or timing_kw(quick)
    info = harness.machine_info()
    results = []
    t0 = _RUN_START[0] = time.perf_counter()
    saved = harness.peer_threads()   # restored after: the limit outlives the run otherwise
    try:
        with _selfcheck.OtherLoad() as load:
            for n in threads:
                harness.set_peer_threads(n)      # first: torch may share fastln's libgomp
                gap = _selfcheck.SPIN_GAP if n > 1 else 0.0
                res = {"threads": n, "train": [], "infer": []}
                with fastln.threads(n):
                    for cell in cells:
                        for H in hidden:
                            _progress(f"{n} thread(s): training {cell} H={H}")
                            res["train"].append(_bench_train(cell, H, kw, gap, compile_cells,
                                                             train_case))
                    for B in batches:
                        _progress(f"{n} thread(s): inference B={B}")
                        res["infer"].extend(_bench_infer(B, kw, gap, infer_case))
                results.append(res)
    finally:
        harness.restore_peer_threads(saved)
    info["cpu_other_load"] = load.fraction
    return {"info": info, "quick": quick, "elapsed_s": time.perf_counter() - t0,
            "fastln_torch": TORCH_MODULES_ERROR,
            "cases": {"train": dict(train_case, H=list(hidden)), "infer": infer_case,
                      "batches": list(batches)},
            "results": results}


# ---- formatting -------------------------------------------------------------------

def _ms(t):
    return "-" if t is None else f"{t * 1e3:.2f}"


def _x(r):
    return "-" if r is None else f"{r:.2f}x"


def _met(r, target):
    return "-" if r is None else ("yes" if r <= target else "NO")


def _yes(b):
    return "-" if b is None else ("yes" if b else "NO")


def train_rows(rows):
    """The cells of the training table: case, ms, over fastln.rnn, target, met."""
    cells = []
    for r in rows:
        t, q = r["times"], r["ratios"]
        case = f"{r['cell']} H={r['H']}"
        for key, label in PEERS.items():
            label = label.format(cls=NN_PEERS[r["cell"]].__name__)
            if key == "compile" and r["compile_s"] is not None:
                label += f" (compiled in {r['compile_s']:.0f} s)"
            target = key == "fastln.torch"
            cells.append([f"{case} {label}", _ms(t[key]), _x(q[key]),
                          f"<= {TARGET_OVER_NUMPY:.2f}x" if target else "",
                          _met(q[key], TARGET_OVER_NUMPY) if target else ""])
        best = q["best_cell"]
        cells.append([f"{case} fastln.torch / best LN cell"
                      + (f" ({PEERS[best]})" if best else ""), "",
                      _x(q["torch_over_best_cell"]), f"<= {TARGET_OVER_BEST_CELL:.2f}x",
                      _met(q["torch_over_best_cell"], TARGET_OVER_BEST_CELL)])
    return ["case", "ms", "/ fastln.rnn", "target", "met"], cells


def infer_rows(rows):
    """The cells of the inference table."""
    cells = []
    for r in rows:
        case = f"{r['cell']} {r['dtype']} B={r['B']}"
        if r["skipped"]:
            cells.append([case, "-", "-", f"skipped: {r['skipped']}", "", "", ""])
            continue
        t = r["times"]
        cells.append([case, _ms(t["fastln.torch"]), _ms(t["fastln.rnn"]), _x(r["ratio"]),
                      f"<= {TARGET_INFER:.2f}x", _met(r["ratio"], TARGET_INFER),
                      _yes(r["bitwise"])])
    return ["case", "fastln.torch ms", "fastln.rnn ms", "ratio", "target", "met",
            "same bits"], cells


def format_table(result, markdown=False):
    """The results of run(): a training and an inference table per thread count."""
    lines = []
    if result.get("fastln_torch"):
        lines += [f"fastln.torch cannot be imported ({result['fastln_torch']}): "
                  "its rows are empty.", ""]
    c, ci = result["cases"]["train"], result["cases"]["infer"]
    for res in result["results"]:
        n = res["threads"]
        title = f"{n} thread{'s' if n > 1 else ''}"
        lines += [f"### {title}" if markdown else f"{title}:", ""]
        if res["train"]:
            lines += [f"training step (forward + backward of (y * g).sum(), dx too), "
                      f"T={c['T']} B={c['B']} I={c['I']}, ms per call:", ""]
            lines += harness.table_lines(*train_rows(res["train"]), markdown)
            lines += _train_notes(res["train"])
            lines.append("")
        if res["infer"]:
            lines += [f"inference (torch.no_grad()), T={ci['T']} I={ci['I']} H={ci['H']}, "
                      "ms per call:", ""]
            lines += harness.table_lines(*infer_rows(res["infer"]), markdown)
            lines.append("")
    return "\n".join(lines).rstrip("\n")


def _train_notes(rows):
    """The lines under the training table: fastln.torch's bitwise agreement, the
    LN peers' differences, and what could not be set up."""
    notes = []
    for r in rows:
        b = r["bitwise"]
        if b:
            notes.append(f"{r['cell']} H={r['H']}: fastln.torch bitwise the same as "
                         f"fastln.rnn: y {_yes(b['y'])}, dx and gradients "
                         f"{_yes(b['grads'])}; LN peers' y first {CHECK_STEPS} steps max|diff| "
                         + ", ".join(f"{k} {v:.1e}" for k, v in r["maxdiff"].items()))
        notes += [f"!! {note}" for note in r["notes"]]
    return [""] + notes if notes else []


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="H=256 only, fewer samples")
    ap.add_argument("--threads", default="2", help="comma-separated thread counts (default 2)")
    ap.add_argument("--hidden", help="comma-separated hidden sizes of the training cases "
                    "(default 256,512,1024; --quick: 256)")
    ap.add_argument("--no-compile", action="store_true",
                    help="leave out the torch.compile peers (each compiles for 7-20 s)")
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--train-only", action="store_true", help="only the training cases")
    only.add_argument("--infer-only", action="store_true", help="only the inference cases")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = ap.parse_args(argv)
    nthreads = harness.parse_threads(ap, args.threads)
    hidden = None
    if args.hidden is not None:
        hidden = harness.parse_counts(ap, args.hidden, "--hidden")
    if args.json is not None:
        _selfcheck.check_output_path(ap, "--json", args.json)
    if torch is None:
        print("torch is not installed: the fastln.torch benchmark has nothing to run",
              file=sys.stderr)
        return 1
    if TORCH_MODULES_ERROR is not None:
        print(f"fastln.torch cannot be imported ({TORCH_MODULES_ERROR}); timing the rest",
              flush=True)
    harness.warn_if_busy()
    print(f"fastln {fastln.__version__}, torch {torch.__version__}, fastln.torch benchmark, "
          f"threads {nthreads}{' (quick)' if args.quick else ''} ...", flush=True)
    result = run(threads=nthreads, quick=args.quick, hidden=hidden,
                 compile_cells=not args.no_compile, cells=() if args.infer_only else CELLS,
                 batches=() if args.train_only else INFER_BATCHES)
    print()
    print(format_table(result))
    harness.report_and_save(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
