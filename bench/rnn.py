"""The LN-RNN benchmark: fastln.rnn.LNLSTM against PyTorch, float32, and
bfloat16 inference.

    python bench/rnn.py [--quick] [--threads 1,2] [--bf16-only | --no-bf16] [--json PATH]

Cases:

- LNLSTM, T=100, B=32, I=128, H=256, one layer: forward (cache=True and
  cache=False) and forward+backward, against
  * a PyTorch eager LN-LSTM of exactly the same equations (docs/design.md, "Recurrent networks"),
    written as a typical user would: a torch.nn.Module with a Python loop over
    time, F.layer_norm for the three LNs, and the input projection and its LN
    done for all steps at once (they do not depend on h);
  * torch.nn.LSTM(128, 256), which has no LN at all (oneDNN/MKL underneath).
  Forward-only peers run under torch.no_grad(); forward+backward is
  loss = (y * dy).sum(); loss.backward() with x requiring grad (fastln's
  backward returns dx too), grads reset to None each call.
- Streaming, T=1000, B=1, I=64, H=128: forward (fastln cache=False, torch
  no_grad) and the per-call time of fastln's m.step(x_t, state) on B=1 (the
  eager peer's one-step cell is shown for context).
- The other models at T=100, B=32, I=128, H=256, forward (cache=False,
  no_grad) and forward+backward: GRU and LNGRU against torch.nn.GRU, RNN and
  LNRNN against torch.nn.RNN, bidirectional LSTM and LNLSTM against
  torch.nn.LSTM(bidirectional=True). The plain models are loaded from the
  torch module (from_torch) and their y checked against it over the first
  10 steps.
- bfloat16 inference (``--bf16-only`` runs only this section, ``--no-bf16``
  skips it), once, on the largest thread count of --threads: a model's
  ``.to(ml_dtypes.bfloat16)`` copy (bfloat16 weight matrices, float32
  state) against the same model in float32, with writable weights (the
  default: packed on every call) and with every params array read-only
  (packed once and kept), and against torch bfloat16 and float32 modules.
  * forward(x, cache=False), T=100, I=128, H=256, B = 1, 32, 256: LNLSTM
    (peer: torch.nn.LSTM, which has no LN), LSTM, GRU and RNN (tanh), the
    plain ones loaded from the torch module; the bfloat16 model and torch's
    bfloat16 module (``module.to(torch.bfloat16)``, no_grad) get bfloat16 x;
  * accuracy, T=100, B=32, standard-normal x, default init: LNLSTM and LSTM,
    max|y_bf16 - y_f32| over all steps and over the first 10, the one-step
    error (one bfloat16 step against one float32 step from the float32
    model's state at each t, the max over t), and the all-steps difference
    of a float32 model whose weights are rounded to bfloat16 (the LN-LSTM is
    chaotic under the default init: its all-steps difference measures the
    model's sensitivity to weight rounding, not the kernels); torch's
    bfloat16 nn.LSTM against its float32 one, for comparison;
  * step() latency, LNLSTM, B=1, I=H=128: bfloat16 (x bfloat16 or float32),
    float32 writable and read-only weights, timed in turns.
  The products' path (AMX, AVX512-BF16 or float32 kernels on widened
  weights; FASTLN_NO_AMX=1 in the environment turns AMX off) is printed.

The plain cells against ONNX Runtime and OpenVINO (float32 and bfloat16) over
a grid of H and B are bench/rnn_grid.py's.

Timing follows bench/harness.py: medians per call, the
peers timed in turns in one process on the same thread count, ratios of
medians. torch.set_num_threads(n) is called before fastln's thread count is
set (torch may share fastln's libgomp). Before timing, the eager peer is
loaded with fastln's weights (LN gains/biases and the gate bias perturbed
away from their init so they matter) and fastln's y must match it, else
AssertionError: float32 over the first 10 steps at rtol = atol = 1e-4 (the
recurrence amplifies float32 rounding, ~1.07x a step with these weights, so
two correct float32 implementations differ by ~2e-4 at step 100), and a
float64 copy over all steps at 1e-6. In float64, fastln's gradients (and dx),
cache=False output and step() are checked too; disagreements are printed.

If fastln.rnn cannot be imported, only the torch peers are timed.
"""
import argparse
import copy
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # the repository root, for an in-place build

import numpy as np  # noqa: E402

import fastln  # noqa: E402
from bench import harness  # noqa: E402
from fastln import _selfcheck  # noqa: E402
from fastln.rnn import _engine as fastln_engine  # noqa: E402
from fastln.rnn._formats import frozen as _frozen  # noqa: E402

torch = harness.torch           # None when torch is not installed

try:
    from fastln import rnn as fastln_rnn  # noqa: E402
    from fastln.rnn import LNLSTM  # noqa: E402
    RNN_IMPORT_ERROR = None
except Exception as e:          # not landed yet, or broken
    LNLSTM = fastln_rnn = None
    RNN_IMPORT_ERROR = f"{type(e).__name__}: {e}"

EPS = 1e-5
LSTM_CASE = dict(T=100, B=32, I=128, H=256)
STREAM_CASE = dict(T=1000, B=1, I=64, H=128)
RTOL = ATOL = 1e-4              # float32 y agreement, first CHECK_STEPS steps (see _check_lstm)
CHECK_STEPS = 10
RTOL64 = 1e-6                   # float64: y, states, step(), gradients (normwise), all steps
STEP_CHECK_STEPS = 50

# the other models: (name, fastln class, from_torch?, torch class, bidirectional)
MODELS = [("GRU", "GRU", True, "GRU", False), ("LNGRU", "LNGRU", False, "GRU", False),
          ("RNN", "RNN", True, "RNN", False), ("LNRNN", "LNRNN", False, "RNN", False),
          ("LSTM bidir", "LSTM", True, "LSTM", True),
          ("LNLSTM bidir", "LNLSTM", False, "LSTM", True)]


# ---- the PyTorch eager LN-LSTM peer -------------------------------------------

if torch is not None:
    import torch.nn.functional as F

    class EagerLNLSTM(torch.nn.Module):
        """One-layer LN-LSTM of docs/design.md, gate order i,f,g,o:

            gates = LN(x W_ih^T; ln_ih) + LN(h W_hh^T; ln_hh) + bias   (LNs over all 4H)
            c_t = f*c + i*g ;  h_t = o*tanh(LN(c_t; ln_c))
        """

        def __init__(self, input_size, hidden_size, eps=EPS):
            super().__init__()
            H = hidden_size
            self.input_size, self.hidden_size, self.eps = input_size, H, eps
            k = 1.0 / math.sqrt(H)
            P = torch.nn.Parameter
            self.weight_ih = P(torch.empty(4 * H, input_size).uniform_(-k, k))
            self.weight_hh = P(torch.empty(4 * H, H).uniform_(-k, k))
            self.bias = P(torch.zeros(4 * H))
            self.ln_ih_weight = P(torch.ones(4 * H))
            self.ln_ih_bias = P(torch.zeros(4 * H))
            self.ln_hh_weight = P(torch.ones(4 * H))
            self.ln_hh_bias = P(torch.zeros(4 * H))
            self.ln_c_weight = P(torch.ones(H))
            self.ln_c_bias = P(torch.zeros(H))

        def _cell(self, gx_t, h, c):
            """One step given gx_t = LN(x_t W_ih^T; ln_ih) + bias."""
            H = self.hidden_size
            gates = gx_t + F.layer_norm(F.linear(h, self.weight_hh), (4 * H,),
                                        self.ln_hh_weight, self.ln_hh_bias, self.eps)
            i, f, g, o = gates.chunk(4, 1)
            i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
            c = f * c + i * g
            h = o * torch.tanh(F.layer_norm(c, (H,), self.ln_c_weight, self.ln_c_bias,
                                            self.eps))
            return h, c

        def _input_gates(self, x):
            return F.layer_norm(F.linear(x, self.weight_ih), (4 * self.hidden_size,),
                                self.ln_ih_weight, self.ln_ih_bias, self.eps) + self.bias

        def forward(self, x, state=None):
            """x (T,B,I) -> y (T,B,H), (h_T, c_T) each (B,H)."""
            T, B, _ = x.shape
            if state is None:
                h = x.new_zeros(B, self.hidden_size)
                c = x.new_zeros(B, self.hidden_size)
            else:
                h, c = state
            gx = self._input_gates(x)      # all steps at once: it does not depend on h
            ys = []
            # unbind, not gx[t]: the backward of T selects would zero-fill T copies of gx
            for gx_t in gx.unbind(0):
                h, c = self._cell(gx_t, h, c)
                ys.append(h)
            return torch.stack(ys), (h, c)

        def step(self, x_t, state):
            """One time step: x_t (B,I) -> h (B,H), (h, c)."""
            h, c = self._cell(self._input_gates(x_t), *state)
            return h, (h, c)

        def load_fastln(self, params):
            """Copy a fastln LNLSTM's layer-0 params (weight_ih_l0, ..., ln_c_bias_l0)."""
            with torch.no_grad():
                for name, p in self.named_parameters():
                    p.copy_(torch.from_numpy(np.ascontiguousarray(params[name + "_l0"])))
else:
    EagerLNLSTM = None


# ---- checks -------------------------------------------------------------------

def _max_err(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)),
                        initial=0.0))


def _perturbed_fastln(I, H, seed):
    """A float32 fastln LNLSTM whose LN gains/biases and gate bias are moved off their
    init (so that they matter in the checks), and a float64 one with the same params."""
    m = LNLSTM(I, H, num_layers=1, dtype=np.float32, seed=seed)
    rng = np.random.default_rng(seed + 1)
    d = {k: np.array(v, copy=True) for k, v in m.state_dict().items()}
    for k, v in d.items():
        if k.startswith("ln_") or k.startswith("bias"):
            base = 1.0 if "_weight_" in k else 0.0
            d[k] = (base + 0.1 * rng.standard_normal(v.shape)).astype(np.float32)
    m.load_state_dict(d)
    m64 = LNLSTM(I, H, num_layers=1, dtype=np.float64, seed=seed)
    m64.load_state_dict({k: v.astype(np.float64) for k, v in d.items()})
    return m, m64


def _eager_like(m, dtype):
    e = EagerLNLSTM(m.params["weight_ih_l0"].shape[1], m.params["weight_hh_l0"].shape[1])
    e = e.to(dtype)
    e.load_fastln(m.params)
    return e


def _check_lstm(m, m64, x, dy, checks, label):
    """Checks fastln against the eager peer loaded with the same weights.

    With random weights the LN-LSTM recurrence amplifies rounding differences
    (about 1.07x per step here: two correct float32 implementations drift apart
    to ~2e-4 by step 100 and fully by step 1000), so:
    - float32 (the model timed): y of the first CHECK_STEPS steps must match at
      rtol = atol = 1e-4 (AssertionError otherwise); the whole-sequence max|diff|
      is recorded in the returned dict;
    - float64, same params: y over the whole sequence must match at 1e-6
      (AssertionError otherwise); h_n/c_n, dx and every gradient (normwise),
      forward(cache=False) and step() are compared there and any disagreement is
      appended to ``checks``.
    """
    out = {}
    ns = min(CHECK_STEPS, x.shape[0])
    e32 = _eager_like(m, torch.float32)
    with torch.no_grad():
        ye = e32(torch.from_numpy(x[:ns]))[0].numpy()
    y, _ = m.forward(np.ascontiguousarray(x[:ns]), cache=False)
    if not np.allclose(y, ye, rtol=RTOL, atol=ATOL):
        raise AssertionError(f"{label}: float32 fastln LNLSTM y (first {ns} steps) disagrees "
                             f"with the eager LN-LSTM peer: max|diff| = {_max_err(y, ye):.3g} "
                             f"(rtol=atol={RTOL:g}); not timing it")
    with torch.no_grad():
        ye = e32(torch.from_numpy(x))[0].numpy()
    out["f32_y_maxdiff_full"] = _max_err(m.forward(x, cache=False)[0], ye)

    x64 = x.astype(np.float64)
    dy64 = dy.astype(np.float64)
    e64 = _eager_like(m64, torch.float64)
    xt = torch.from_numpy(x64).requires_grad_(True)
    y_e, (h_e, c_e) = e64(xt)
    (y_e * torch.from_numpy(dy64)).sum().backward()
    y_e = y_e.detach().numpy()
    y, (h_n, c_n) = m64.forward(x64, cache=True)
    err = _max_err(y, y_e)
    out["f64_y_maxdiff"] = err
    if not np.allclose(y, y_e, rtol=RTOL64, atol=RTOL64):
        raise AssertionError(f"{label}: float64 fastln LNLSTM y disagrees with the eager LN-LSTM "
                             f"peer: max|diff| = {err:.3g} (rtol=atol={RTOL64:g}); not timing it")
    for nm, a, b in (("h_n", h_n[0], h_e.detach().numpy()), ("c_n", c_n[0], c_e.detach().numpy())):
        if not np.allclose(a, b, rtol=RTOL64, atol=RTOL64):
            checks.append(f"{label} float64 {nm}: max|diff|={_max_err(a, b):.3g}")
    dx, _ = m64.backward(dy64)
    got = dict(m64.grads)
    got["dx"] = dx
    want = {n + "_l0": p.grad.numpy() for n, p in e64.named_parameters()}
    want["dx"] = xt.grad.numpy()
    worst = 0.0
    for k, b in want.items():
        if k not in got:
            checks.append(f"{label} float64 grad {k}: missing from fastln's grads")
            continue
        g = np.asarray(got[k])
        if g.shape != b.shape:
            checks.append(f"{label} float64 grad {k}: shape {g.shape}, want {b.shape}")
            continue
        rel = float(_max_err(g, b) / max(np.max(np.abs(b), initial=0.0), 1e-30))
        worst = max(worst, rel)
        if rel > RTOL64:
            checks.append(f"{label} float64 grad {k}: max|diff|={_max_err(g, b):.3g} "
                          f"(max|ref|={np.max(np.abs(b)):.3g})")
    out["f64_grad_maxreldiff"] = worst
    y0, _ = m64.forward(x64, cache=False)
    if not np.allclose(y0, y, rtol=RTOL64, atol=RTOL64):
        checks.append(f"{label} float64 forward(cache=False) y differs from cache=True: "
                      f"max|diff|={_max_err(y0, y):.3g}")
    state = None
    for t in range(min(STEP_CHECK_STEPS, x.shape[0])):
        h, state = m64.step(x64[t], state)
        if not np.allclose(h, y[t], rtol=RTOL64, atol=RTOL64):
            checks.append(f"{label} float64 step() at t={t} differs from forward's y: "
                          f"max|diff|={_max_err(h, y[t]):.3g}")
            break
    return out


# ---- one thread count ---------------------------------------------------------

_RUN_START = [time.perf_counter()]   # run() sets it: progress lines count from there


def _progress(what):
    """A progress line on stderr, flushed: what runs next, and the seconds since run() began."""
    print(f"  LN-RNN [{time.perf_counter() - _RUN_START[0]:.0f} s] {what}", file=sys.stderr,
          flush=True)


def _bench_threads(n, kw, seed=0):
    """All cases on the current thread setting (n threads). Returns a dict of
    median seconds per call ('times'), 'ratios', 'checks' (disagreements)."""
    res = {"threads": n, "fastln": LNLSTM is not None, "times": {}, "checks": [],
           "check_info": {}}
    tm = res["times"]
    checks = res["checks"]
    gap = _selfcheck.SPIN_GAP if n > 1 else 0.0
    have_torch = torch is not None
    if not have_torch:
        checks.append("torch is not installed: no peers")

    # ---- LNLSTM T=100, B=32, I=128, H=256
    T, B, I, H = (LSTM_CASE[k] for k in "TBIH")
    _progress(f"{n} thread(s): LNLSTM T={T} B={B} I={I} H={H}, forward and forward+backward")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, B, I), dtype=np.float32)
    dy = rng.standard_normal((T, B, H), dtype=np.float32)
    fns = {}
    if have_torch:
        torch.manual_seed(seed)
        eager = EagerLNLSTM(I, H)
        lstm = torch.nn.LSTM(I, H)
        xt = torch.from_numpy(x)
        xg = torch.from_numpy(x.copy()).requires_grad_(True)
        dyt = torch.from_numpy(dy)
    if LNLSTM is not None:
        m, m64 = _perturbed_fastln(I, H, seed)
        if have_torch:
            res["check_info"]["lstm"] = _check_lstm(m, m64, x, dy, checks, "LNLSTM(T=100,B=32)")
        fns["fastln_fwd"] = lambda: m.forward(x, cache=True)
        fns["fastln_fwd_nocache"] = lambda: m.forward(x, cache=False)

        def fastln_fwdbwd():
            m.forward(x, cache=True)
            return m.backward(dy)
        fns["fastln_fwdbwd"] = fastln_fwdbwd
    if have_torch:
        def eager_fwd():
            with torch.no_grad():
                return eager(xt)

        def lstm_fwd():
            with torch.no_grad():
                return lstm(xt)

        def fwdbwd(mod):
            params = list(mod.parameters())

            def f():
                for p in params:
                    p.grad = None
                xg.grad = None
                y, _ = mod(xg)
                (y * dyt).sum().backward()
            return f
        fns["eager_fwd"] = eager_fwd
        fns["eager_fwdbwd"] = fwdbwd(eager)
        fns["lstm_fwd"] = lstm_fwd
        fns["lstm_fwdbwd"] = fwdbwd(lstm)
    groups = {k: ("fastln" if k.startswith("fastln") else "torch") for k in fns}
    # forward-only and forward+backward timed as two sets of peers in turns
    for part in ("fwd", "fwdbwd"):
        sub = {k: f for k, f in fns.items() if (k.endswith("_fwdbwd") == (part == "fwdbwd"))}
        if sub:
            tm.update(_selfcheck.time_peers(sub, gap=gap, groups=groups, **kw))

    # ---- streaming T=1000, B=1, I=64, H=128
    T, B, I, H = (STREAM_CASE[k] for k in "TBIH")
    _progress(f"{n} thread(s): stream T={T} B={B} I={I} H={H}, forward and step()")
    rng = np.random.default_rng(seed + 2)
    x = rng.standard_normal((T, B, I), dtype=np.float32)
    fns = {}
    steps = {}
    if have_torch:
        torch.manual_seed(seed + 2)
        eager = EagerLNLSTM(I, H)
        lstm = torch.nn.LSTM(I, H)
        xt = torch.from_numpy(x)
    if LNLSTM is not None:
        ms, ms64 = _perturbed_fastln(I, H, seed + 2)
        if have_torch:
            dys = rng.standard_normal((T, B, H), dtype=np.float32)
            res["check_info"]["stream"] = _check_lstm(ms, ms64, x, dys, checks,
                                                      "stream LNLSTM(T=1000,B=1)")
        fns["fastln_stream"] = lambda: ms.forward(x, cache=False)
        x0 = np.ascontiguousarray(x[0])
        sstate = [ms.step(x0, None)[1]]

        def fastln_step():
            h, sstate[0] = ms.step(x0, sstate[0])
            return h
        steps["fastln_step"] = fastln_step
    if have_torch:
        def eager_stream():
            with torch.no_grad():
                return eager(xt)

        def lstm_stream():
            with torch.no_grad():
                return lstm(xt)
        fns["eager_stream"] = eager_stream
        fns["lstm_stream"] = lstm_stream
        x0t = xt[0]
        with torch.no_grad():
            estate = [(torch.zeros(B, H), torch.zeros(B, H))]

        def eager_step():
            with torch.no_grad():
                h, estate[0] = eager.step(x0t, estate[0])
            return h
        steps["eager_step"] = eager_step
    groups = {k: ("fastln" if k.startswith("fastln") else "torch") for k in list(fns) + list(steps)}
    if fns:
        tm.update(_selfcheck.time_peers(fns, gap=gap, groups=groups, **kw))
    if steps:
        tm.update(_selfcheck.time_peers(steps, gap=gap, groups=groups, **kw))

    res["ratios"] = _ratios(tm)
    if fastln_rnn is not None and have_torch:
        res["models"] = _bench_models(checks, gap, kw, seed)
    return res


def _bench_models(checks, gap, kw, seed):
    """MODELS at LSTM_CASE: {name: {part: (fastln s, torch s)}}."""
    T, B, I, H = (LSTM_CASE[k] for k in "TBIH")
    rng = np.random.default_rng(seed + 3)
    x = rng.standard_normal((T, B, I), dtype=np.float32)
    xt = torch.from_numpy(x)
    xg = torch.from_numpy(x.copy()).requires_grad_(True)
    out = {}
    for name, cls, load, tcls, bidir in MODELS:
        _progress(f"{fastln.get_num_threads()} thread(s): {name} T={T} B={B} I={I} H={H}")
        torch.manual_seed(seed)
        peer = getattr(torch.nn, tcls)(I, H, bidirectional=bidir)
        model_cls = getattr(fastln_rnn, cls)
        m = (model_cls.from_torch(peer) if load
             else model_cls(I, H, bidirectional=bidir, seed=seed))
        dy = rng.standard_normal((T, B, H * (2 if bidir else 1)), dtype=np.float32)
        dyt = torch.from_numpy(dy)
        if load:
            with torch.no_grad():
                want = peer(xt)[0].numpy()[:CHECK_STEPS]
            got = m.forward(x, cache=False)[0][:CHECK_STEPS]
            if not np.allclose(got, want, rtol=RTOL, atol=ATOL) and not bidir:
                checks.append(f"{name}: y differs from torch's, max|diff| "
                              f"{_max_err(got, want):.1e}")

        def fastln_fwd(m=m):
            return m.forward(x, cache=False)

        def fastln_fwdbwd(m=m, dy=dy):
            m.forward(x)
            return m.backward(dy)

        def torch_fwd(peer=peer):
            with torch.no_grad():
                return peer(xt)

        params = list(peer.parameters())

        def torch_fwdbwd(peer=peer, params=params, dyt=dyt):
            for p in params:
                p.grad = None
            xg.grad = None
            y, _ = peer(xg)
            (y * dyt).sum().backward()
        groups = {"fastln_fwd": "fastln", "fastln_fwdbwd": "fastln", "torch_fwd": "torch",
                  "torch_fwdbwd": "torch"}
        t = {}
        t.update(_selfcheck.time_peers({"fastln_fwd": fastln_fwd, "torch_fwd": torch_fwd},
                                       gap=gap, groups=groups, **kw))
        t.update(_selfcheck.time_peers({"fastln_fwdbwd": fastln_fwdbwd,
                                        "torch_fwdbwd": torch_fwdbwd},
                                       gap=gap, groups=groups, **kw))
        out[name] = {part: (t[f"fastln_{part}"], t[f"torch_{part}"])
                     for part in ("fwd", "fwdbwd")}
    return out


# ---- bfloat16 inference ---------------------------------------------------------

BF16_CASE = dict(T=100, I=128, H=256)
BF16_BATCHES = (1, 32, 256)
# (fastln class, torch peer class); the plain models are loaded from the peer
BF16_MODELS = (("LNLSTM", "LSTM"), ("LSTM", "LSTM"), ("GRU", "GRU"), ("RNN", "RNN"))
BF16_ACC_CASE = dict(T=100, B=32, I=128, H=256)
BF16_ACC_MODELS = ("LNLSTM", "LSTM")
BF16_STEP_CASE = dict(B=1, I=128, H=128)
# a bfloat16 model's y over the first CHECK_STEPS steps further than this from
# float32's is reported: rounding to bfloat16 moves y by a few of its ulps per
# step (the LN-LSTM amplifies that over steps); a wrong kernel moves it by O(1)
BF16_FLAG_DIFF = 0.25
BF16_FWD = ("fastln_bf16", "fastln_f32", "fastln_f32_ro", "torch_bf16", "torch_f32")
BF16_STEPS = ("bf16", "bf16_xf32", "f32", "f32_ro")


def _bf16():
    """ml_dtypes.bfloat16, or None where ml_dtypes is missing."""
    mod = harness.ml_dtypes
    return None if mod is None else mod.bfloat16


def bf16_path():
    """The path of a bfloat16 model's products, as the engine chooses it: "AMX",
    "AVX512-BF16" (VDPBF16PS) or "float32 kernels" (on widened weights)."""
    path = fastln_engine.bf16_products()
    return "float32 kernels" if path == "float32" else path


def _readonly(m):
    """A float32 copy of model m whose params arrays nothing can write
    (C-ordered, over bytes objects): the engine packs its weight matrices
    once and keeps them."""
    r = m.to(np.float32)
    for key, a in r.params.items():
        r.params[key] = _frozen(a)
    return r


def _bf16_models(name, tcls, I, H, seed):
    """(float32 fastln model, its torch peer or None): LNLSTM from its default
    init, the plain models loaded from the peer."""
    peer = None
    if torch is not None:
        torch.manual_seed(seed)
        peer = getattr(torch.nn, tcls)(I, H)
    cls = getattr(fastln_rnn, name)
    if peer is not None and name != "LNLSTM":
        return cls.from_torch(peer), peer
    return cls(I, H, seed=seed), peer


def _torch_bf16(peer):
    """A bfloat16 copy of a torch module (``.to`` converts in place)."""
    return copy.deepcopy(peer).to(torch.bfloat16)


def _bf16_forward(checks, gap, kw, seed, batches):
    """forward(x, cache=False) of BF16_MODELS at each B: a list of rows."""
    bf = _bf16()
    T, I, H = (BF16_CASE[k] for k in "TIH")
    ns = min(CHECK_STEPS, T)
    rows = []
    for B in batches:
        _progress(f"bfloat16 forward, B={B}: {', '.join(name for name, _ in BF16_MODELS)}")
        rng = np.random.default_rng(seed + 10 + B)
        x = rng.standard_normal((T, B, I), dtype=np.float32)
        xb = x.astype(bf)
        for name, tcls in BF16_MODELS:
            m, peer = _bf16_models(name, tcls, I, H, seed)
            mro, mb = _readonly(m), m.to(bf)
            fns = {"fastln_bf16": lambda mb=mb, xb=xb: mb.forward(xb, cache=False),
                   "fastln_f32": lambda m=m, x=x: m.forward(x, cache=False),
                   "fastln_f32_ro": lambda mro=mro, x=x: mro.forward(x, cache=False)}
            row = {"model": name, "peer": None if peer is None else f"nn.{tcls}", "B": B, "T": T,
                   "maxdiff": {}}
            label = f"bf16 {name} B={B}"
            y32 = m.forward(x, cache=False)[0]
            yro = mro.forward(x, cache=False)[0]
            if not np.array_equal(y32, yro):
                checks.append(f"{label}: float32 y with read-only weights differs from writable "
                              f"ones: max|diff|={_max_err(y32, yro):.3g}")
            yb = mb.forward(xb, cache=False)[0]
            d = row["maxdiff"]["bf16_vs_f32_first10"] = _max_err(yb[:ns], y32[:ns])
            d_all = row["maxdiff"]["bf16_vs_f32_all"] = _max_err(yb, y32)
            if not d <= BF16_FLAG_DIFF:
                checks.append(f"{label}: bfloat16 y (first {ns} steps) differs from float32's "
                              f"by {d:.3g} (> {BF16_FLAG_DIFF:g}); all steps {d_all:.3g}")
            if peer is not None:
                pb = _torch_bf16(peer)
                xt = torch.from_numpy(x)
                xtb = xt.to(torch.bfloat16)
                with torch.no_grad():
                    yt = peer(xt)[0].numpy()
                    ytb = pb(xtb)[0].float().numpy()
                if name != "LNLSTM":        # same weights: fastln and torch compute the same
                    d = row["maxdiff"]["f32_vs_torch_f32_first10"] = _max_err(y32[:ns], yt[:ns])
                    if not np.allclose(y32[:ns], yt[:ns], rtol=RTOL, atol=ATOL):
                        checks.append(f"{label}: float32 y (first {ns} steps) differs from "
                                      f"nn.{tcls}'s: max|diff|={d:.3g}")
                    row["maxdiff"]["bf16_vs_torch_bf16_first10"] = _max_err(yb[:ns], ytb[:ns])
                    row["maxdiff"]["torch_bf16_vs_f32_first10"] = _max_err(ytb[:ns], yt[:ns])

                def torch_bf16(pb=pb, xtb=xtb):
                    with torch.no_grad():
                        return pb(xtb)

                def torch_f32(peer=peer, xt=xt):
                    with torch.no_grad():
                        return peer(xt)
                fns["torch_bf16"], fns["torch_f32"] = torch_bf16, torch_f32
            groups = {k: k.split("_")[0] for k in fns}
            t = _selfcheck.time_peers(fns, gap=gap, groups=groups, **kw)
            row["times"] = {k: t.get(k) for k in BF16_FWD}
            row["ratios"] = _bf16_ratios(row["times"])
            rows.append(row)
    return rows


def _bf16_ratios(t):
    def div(a, b):
        return t[a] / t[b] if t.get(a) is not None and t.get(b) is not None else None
    return {"bf16_over_f32": div("fastln_bf16", "fastln_f32"),
            "bf16_over_f32_ro": div("fastln_bf16", "fastln_f32_ro"),
            "bf16_over_torch_bf16": div("fastln_bf16", "torch_bf16"),
            "f32_over_torch_f32": div("fastln_f32", "torch_f32")}


def _bf16_accuracy(seed):
    """max|y_bf16 - y_f32| of BF16_ACC_MODELS at BF16_ACC_CASE (see the docstring)."""
    bf = _bf16()
    T, B, I, H = (BF16_ACC_CASE[k] for k in "TBIH")
    ns = min(CHECK_STEPS, T)
    x = np.random.default_rng(seed + 20).standard_normal((T, B, I), dtype=np.float32)
    out = {}
    lstm = None
    for name in BF16_ACC_MODELS:
        m, peer = _bf16_models(name, "LSTM", I, H, seed)
        if name == "LSTM":
            lstm = peer
        mb = m.to(bf)
        mr = mb.to(np.float32)                # float32, weights rounded to bfloat16
        y32 = m.forward(x, cache=False)[0]
        yb = mb.forward(x, cache=False)[0]
        yr = mr.forward(x, cache=False)[0]
        one, state = 0.0, None
        for t in range(T):                    # from the float32 model's state at each t
            hb, _ = mb.step(x[t], state)
            h32, state = m.step(x[t], state)
            one = max(one, _max_err(hb, h32))
        out[f"fastln {name}"] = {"all": _max_err(yb, y32), "first10": _max_err(yb[:ns], y32[:ns]),
                                 "one_step": one, "rounded_weights_all": _max_err(yr, y32),
                                 "rounded_weights_first10": _max_err(yr[:ns], y32[:ns])}
    if lstm is not None:
        pb = _torch_bf16(lstm)
        xt = torch.from_numpy(x)
        with torch.no_grad():
            y32 = lstm(xt)[0].numpy()
            yb = pb(xt.to(torch.bfloat16))[0].float().numpy()
            one, state = 0.0, (torch.zeros(1, B, H), torch.zeros(1, B, H))
            for t in range(T):                # its state goes in as bfloat16
                hb = pb(xt[t:t + 1].to(torch.bfloat16),
                        tuple(s.to(torch.bfloat16) for s in state))[0]
                h32, state = lstm(xt[t:t + 1], state)
                one = max(one, _max_err(hb.float().numpy(), h32.numpy()))
        out["torch nn.LSTM"] = {"all": _max_err(yb, y32), "first10": _max_err(yb[:ns], y32[:ns]),
                                "one_step": one}
    return out


def _bf16_step(gap, kw, seed):
    """Median seconds per step() call of an LNLSTM at BF16_STEP_CASE, timed in turns."""
    bf = _bf16()
    B, I, H = (BF16_STEP_CASE[k] for k in "BIH")
    m = LNLSTM(I, H, seed=seed)
    x0 = np.random.default_rng(seed + 30).standard_normal((B, I), dtype=np.float32)

    def stepper(model, x_t):
        state = [model.step(x_t, None)[1]]

        def step():
            h, state[0] = model.step(x_t, state[0])
            return h
        return step
    mb = m.to(bf)
    fns = {"bf16": stepper(mb, x0.astype(bf)), "bf16_xf32": stepper(mb, x0),
           "f32": stepper(m, x0), "f32_ro": stepper(_readonly(m), x0)}
    return _selfcheck.time_peers(fns, gap=gap, groups=dict.fromkeys(fns, "fastln"), **kw)


def bench_bf16(n, kw, seed=0, batches=BF16_BATCHES):
    """The bfloat16 inference cases on the current thread setting (n threads).
    Returns a JSON-friendly dict: 'threads', 'path', the cases, 'fwd' (rows with
    'times' in median s/call, 'ratios', 'maxdiff'), 'accuracy', 'step' (median
    s/call), 'checks' (disagreements), or 'skipped' (why) without ml_dtypes or
    fastln.rnn."""
    res = {"threads": n, "path": None, "fastln_no_amx": os.environ.get("FASTLN_NO_AMX"),
           "case": BF16_CASE, "batches": list(batches), "accuracy_case": BF16_ACC_CASE,
           "step_case": BF16_STEP_CASE, "checks": [], "skipped": None}
    if fastln_rnn is None:
        res["skipped"] = f"fastln.rnn cannot be imported ({RNN_IMPORT_ERROR})"
        return res
    if _bf16() is None:
        res["skipped"] = "bfloat16 needs ml_dtypes"
        return res
    res["path"] = bf16_path()
    if torch is None:
        res["checks"].append("torch is not installed: no peers")
    gap = _selfcheck.SPIN_GAP if n > 1 else 0.0
    res["fwd"] = _bf16_forward(res["checks"], gap, kw, seed, batches)
    _progress("bfloat16 accuracy")
    res["accuracy"] = _bf16_accuracy(seed)
    _progress("bfloat16 step() latency")
    res["step"] = _bf16_step(gap, kw, seed)
    return res


def _ratios(tm):
    def div(a, b):
        return tm[a] / tm[b] if tm.get(a) is not None and tm.get(b) is not None else None
    r = {
        "fwd_eager_over_fastln": div("eager_fwd", "fastln_fwd"),
        "fwd_fastln_over_lstm": div("fastln_fwd", "lstm_fwd"),
        "fwd_nocache_eager_over_fastln": div("eager_fwd", "fastln_fwd_nocache"),
        "fwd_nocache_fastln_over_lstm": div("fastln_fwd_nocache", "lstm_fwd"),
        "fwdbwd_eager_over_fastln": div("eager_fwdbwd", "fastln_fwdbwd"),
        "fwdbwd_fastln_over_lstm": div("fastln_fwdbwd", "lstm_fwdbwd"),
        "stream_eager_over_fastln": div("eager_stream", "fastln_stream"),
        "stream_fastln_over_lstm": div("fastln_stream", "lstm_stream"),
        "step_us": tm["fastln_step"] * 1e6 if tm.get("fastln_step") is not None else None,
    }
    return r


def run(threads=(1, 2), quick=False, float32=True, bf16=True):
    """Time every case at each thread count (``float32``: the float32 cases) and
    the bfloat16 inference cases (``bf16``) at the largest. Returns a
    JSON-friendly dict: {'info', 'quick', 'fastln_rnn' (import error or None),
    'cases', 'results': [{'threads', 'fastln', 'times' (median
    s/call), 'ratios', 'checks'}], 'bf16': bench_bf16's dict or None}."""
    kw = (dict(repeats=5, budget=0.5, min_sample=1e-3, min_repeats=3) if quick
          else dict(repeats=15, budget=2.0, min_sample=2e-3, min_repeats=5))
    info = harness.machine_info()
    results = []
    bf = None
    t0 = _RUN_START[0] = time.perf_counter()
    saved = harness.peer_threads()   # restored after: the limit outlives the run otherwise
    try:
        with _selfcheck.OtherLoad() as load:
            for n in (threads if float32 else ()):
                harness.set_peer_threads(n)      # first: torch may share fastln's libgomp
                with fastln.threads(n):
                    results.append(_bench_threads(n, kw))
            if bf16:
                n = max(threads)
                harness.set_peer_threads(n)
                with fastln.threads(n):
                    bf = bench_bf16(n, kw)
    finally:
        harness.restore_peer_threads(saved)
    info["cpu_other_load"] = load.fraction
    return {"info": info, "quick": quick, "elapsed_s": time.perf_counter() - t0,
            "fastln_rnn": RNN_IMPORT_ERROR, "cases": {"lstm": LSTM_CASE, "stream": STREAM_CASE},
            "results": results,
            "bf16": bf}


# ---- formatting ---------------------------------------------------------------

def _ms(t):
    return "-" if t is None else f"{t * 1e3:.2f}"


def _us(t):
    return "-" if t is None else f"{t * 1e6:.1f}"


def format_table(result, markdown=False):
    """The results of run() as one table per thread count (plain text or markdown)."""
    heads = ["case", "fastln", "eager LN-LSTM", "nn.LSTM", "eager/fastln", "fastln/nn.LSTM"]
    lines = []
    if result.get("fastln_rnn"):
        lines.append(f"fastln.rnn not available ({result['fastln_rnn']}): torch peers only.")
        lines.append("")
    for res in result["results"]:
        t, r = res["times"], res["ratios"]
        n = res["threads"]
        rows = [
            ["LSTM T=100 B=32 I=128 H=256 fwd, ms", _ms(t.get("fastln_fwd")),
             _ms(t.get("eager_fwd")), _ms(t.get("lstm_fwd")),
             _times_ratio(r["fwd_eager_over_fastln"]),
             _times_ratio(r["fwd_fastln_over_lstm"])],
            ["same, fastln cache=False, ms", _ms(t.get("fastln_fwd_nocache")),
             _ms(t.get("eager_fwd")), _ms(t.get("lstm_fwd")),
             _times_ratio(r["fwd_nocache_eager_over_fastln"]),
             _times_ratio(r["fwd_nocache_fastln_over_lstm"])],
            ["LSTM T=100 B=32 I=128 H=256 fwd+bwd, ms", _ms(t.get("fastln_fwdbwd")),
             _ms(t.get("eager_fwdbwd")), _ms(t.get("lstm_fwdbwd")),
             _times_ratio(r["fwdbwd_eager_over_fastln"]),
             _times_ratio(r["fwdbwd_fastln_over_lstm"])],
            ["stream T=1000 B=1 I=64 H=128 fwd, ms", _ms(t.get("fastln_stream")),
             _ms(t.get("eager_stream")), _ms(t.get("lstm_stream")),
             _times_ratio(r["stream_eager_over_fastln"]),
             _times_ratio(r["stream_fastln_over_lstm"])],
            ["stream step() B=1, µs/call", _us(t.get("fastln_step")),
             _us(t.get("eager_step")), "-",
             "step " + ("-" if r["step_us"] is None else f"{r['step_us']:.1f} µs"), ""],
        ]
        title = f"{n} thread{'s' if n > 1 else ''}"
        if markdown:
            lines.append(f"### {title}")
            lines.append("")
        else:
            lines.append(title + ":")
        lines.extend(harness.table_lines(heads, rows, markdown))
        for case, ci in res.get("check_info", {}).items():
            lines.append("")
            lines.append(f"checked ({case}): float64 y max|diff| {ci['f64_y_maxdiff']:.1e}, "
                         f"gradients max rel. diff {ci['f64_grad_maxreldiff']:.1e}; float32 y "
                         f"first {CHECK_STEPS} steps ok, whole sequence max|diff| "
                         f"{ci['f32_y_maxdiff_full']:.1e} (rounding drift)")
        if res.get("models"):
            lines.append("")
            lines.extend(harness.table_lines(*_models_table(res["models"]), markdown))
        if res["checks"]:
            lines.append("")
            lines.extend(f"!! CHECK: {c}" for c in res["checks"])
        lines.append("")
    if result.get("bf16"):
        lines.extend(format_bf16(result["bf16"], markdown))
    return "\n".join(lines).rstrip("\n")


def _diff(v):
    return "-" if v is None else f"{v:.1e}"


def _times_ratio(r):
    return "-" if r is None else f"{r:.2f}x"


def format_bf16(res, markdown=False):
    """The lines of bench_bf16's tables: forward times, accuracy, step() latency."""
    n = res["threads"]
    title = f"bfloat16 inference, {n} thread{'s' if n > 1 else ''}"
    if res.get("skipped"):
        return [f"{title}: skipped ({res['skipped']})"]
    no_amx = res.get("fastln_no_amx")
    path = res["path"] + (f" (FASTLN_NO_AMX={no_amx})" if no_amx else "")
    T, I, H = (res["case"][k] for k in "TIH")
    lines = [f"### {title}" if markdown else f"{title}:", ""]
    lines.append(f"forward(x, cache=False), T={T} I={I} H={H}, ms per call; the bfloat16 "
                 f"products run on: {path}. \"ro\": read-only float32 weights (packed once); "
                 "ratios are of times (< 1: bfloat16 is faster).")
    lines.append("")
    heads = ["model", "B", "peer", "fastln bf16", "f32", "f32 ro", "torch bf16", "torch f32",
             "bf16/f32", "bf16/f32 ro", "bf16/torch bf16"]
    rows = []
    for r in res["fwd"]:
        t, q = r["times"], r["ratios"]
        rows.append([r["model"], str(r["B"]), r["peer"] or "-"]
                    + [_ms(t.get(k)) for k in BF16_FWD]
                    + [_times_ratio(q[k]) for k in ("bf16_over_f32", "bf16_over_f32_ro",
                                                    "bf16_over_torch_bf16")])
    lines.extend(harness.table_lines(heads, rows, markdown))
    lines.append("")
    c = res["accuracy_case"]
    lines.append(f"accuracy, T={c['T']} B={c['B']} I={c['I']} H={c['H']}, standard-normal x, "
                 "default init: max|y_bf16 - y_f32| over all steps, over the first "
                 f"{CHECK_STEPS}, and of one step from the float32 model's state (max over t); "
                 "\"rounded\": a float32 model with the weights rounded to bfloat16.")
    lines.append("")
    heads = ["model", "all steps", f"first {CHECK_STEPS}", "one step", "rounded, all steps",
             f"rounded, first {CHECK_STEPS}"]
    rows = [[name, _diff(a["all"]), _diff(a["first10"]), _diff(a["one_step"]),
             _diff(a.get("rounded_weights_all")), _diff(a.get("rounded_weights_first10"))]
            for name, a in res["accuracy"].items()]
    lines.extend(harness.table_lines(heads, rows, markdown))
    lines.append("")
    c, s = res["step_case"], res["step"]
    lines.append("step() latency, µs per call (the state carried from call to call):")
    lines.append("")
    heads = ["case", "bf16 (x bf16)", "bf16 (x f32)", "f32", "f32 ro", "bf16/f32", "bf16/f32 ro"]
    row = [f"LNLSTM B={c['B']} I={c['I']} H={c['H']}"] + [_us(s.get(k)) for k in BF16_STEPS] + [
        _times_ratio(s["bf16"] / s["f32"]), _times_ratio(s["bf16"] / s["f32_ro"])]
    lines.extend(harness.table_lines(heads, [row], markdown))
    if res["checks"]:
        lines.append("")
        lines.extend(f"!! CHECK: {c}" for c in res["checks"])
    lines.append("")
    return lines


def _models_table(models):
    """(heads, rows) of the other models: times in ms and fastln/torch ratios."""
    heads = ["model, T=100 B=32 I=128 H=256", "peer", "fwd fastln", "fwd peer",
             "fwd fastln/peer", "fwd+bwd fastln", "fwd+bwd peer", "fwd+bwd fastln/peer"]
    rows = []
    for name, _, _, tcls, bidir in MODELS:
        if name not in models:
            continue
        row = [name, f"nn.{tcls}" + ("(bidirectional)" if bidir else "")]
        for part in ("fwd", "fwdbwd"):
            a, b = models[name][part]
            row += [_ms(a), _ms(b), f"{a / b:.2f}x"]
        rows.append(row)
    return heads, rows


def results_md(result):
    """The '## LN-RNN' section for bench/RESULTS.md."""
    load = result["info"].get("cpu_other_load")
    out = [
        "## LN-RNN",
        "",
        "`bench/rnn.py` (the LN-LSTM cases), float32, one layer. Times are medians per call, the "
        "peers timed in turns on the same number of threads. \"eager LN-LSTM\" is a PyTorch "
        "nn.Module of docs/design.md's equations with a Python loop over time "
        "(F.layer_norm; input projection and its LN for all steps at once); nn.LSTM has no LN "
        "(oneDNN). Forward-only torch runs under no_grad; fwd+bwd is (y*dy).sum().backward() "
        "with dx. \"eager/fastln\" is fastln's speedup, \"fastln/nn.LSTM\" its time relative to "
        "nn.LSTM."
        + (" The bfloat16 tables time a model's `.to(ml_dtypes.bfloat16)` copy (inference "
           "only: bfloat16 weight matrices, float32 state) against the same model in float32 "
           "and torch's modules in bfloat16 and float32 (no_grad)." if result.get("bf16")
           else "")
        + f" Run took {result['elapsed_s']:.0f} s"
        + harness.load_phrase(load) + ".",
        "",
        format_table(result, markdown=True),
    ]
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer samples")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--bf16-only", action="store_true",
                      help="only the bfloat16 inference cases")
    only.add_argument("--no-bf16", action="store_true", help="skip the bfloat16 inference cases")
    args = ap.parse_args(argv)
    nthreads = harness.parse_threads(ap, args.threads)
    if args.json is not None:
        _selfcheck.check_output_path(ap, "--json", args.json)
    if RNN_IMPORT_ERROR is not None:
        print(f"fastln.rnn cannot be imported ({RNN_IMPORT_ERROR}); timing the torch peers only",
              flush=True)
    if torch is None:
        print("torch is not installed: no peers to time", flush=True)
    harness.warn_if_busy()
    part = " (bfloat16 only)" if args.bf16_only else ""
    print(f"fastln {fastln.__version__}, LN-RNN benchmark{part}, threads {nthreads}"
          f"{' (quick)' if args.quick else ''} ...", flush=True)
    result = run(threads=nthreads, quick=args.quick, float32=not args.bf16_only,
                 bf16=not args.no_bf16)
    print()
    print(format_table(result))
    harness.report_and_save(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
