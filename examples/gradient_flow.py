"""Gradient flow and hidden-state dynamics of the plain and layer-normalized RNNs.

Ba, Kiros & Hinton write that LayerNorm "is very effective at stabilizing the
hidden state dynamics in recurrent networks" and "can, to some extent, solve
the vanishing and exploding gradient problem". This example measures both
claims for RNN, LN-RNN, LSTM, LN-LSTM, GRU and LN-GRU (fastln.rnn, float64,
one layer, tanh), on two kinds of input: "gaussian", x ~ N(0, 1) with
--features features, and "adding", the inputs of the adding problem of
longer_sequences.py (a value in [0, 1] and a marker).

1. Gradient flow at initialization. The loss is a fixed random linear readout
   of the last output, so dy is nonzero only at t = T-1; ||dL/dx_t|| (from
   backward's dx) is recorded for every t, with W_hh of the default init
   multiplied by each scale s of --scales. The backward runs in chunks whose
   incoming state gradient is renormalized (the scale kept as a logarithm), so
   gradients far beyond float64's range are still measured. The growth rate
   per step is minus the slope of log ||dL/dx_t|| against t over the --fit
   steps farthest from the loss (t < --fit): positive means the gradient grows
   toward the past (explodes), negative that it vanishes.
2. The same after a short training on the adding problem (float32, Adam,
   gradient-norm clipping; then copied to float64 for the measurement).
3. The hidden state's norm ||h_t|| and its spread (std across the units of a
   sequence, std across the sequences of a batch) over t, at init with s = 1.
4. The largest Lyapunov exponent of the forward map: two runs from the same x,
   h0 perturbed by --delta, the average log growth of their distance per step
   (renormalized every --renorm steps), over --lyap-T steps after a burn-in.
   It is compared with the gradient's growth rate along the same sequences,
   and for the LN-LSTM with variants that test why its gradient grows: the
   scale and orthogonality of W_hh, a forget-gate bias, the gain of the
   LayerNorm of h W_hh^T (ln_hh_weight) and a larger LayerNorm eps. For these
   it also records the hh LayerNorm's 1/std and the spectral norm of the
   Jacobian of LN(h W_hh^T) with respect to h along the runs.

    python examples/gradient_flow.py --out examples/figures   # 3 seeds, a few minutes
    python examples/gradient_flow.py --quick                  # tiny sizes, seconds

Prints markdown tables and writes two PNGs into --out (the current directory
by default): gradient_flow.png (log10 ||dL/dx_t|| against t, a panel per
model and kind of input, a line per scale and one for the trained model) and
gradient_flow_dynamics.png (||h_t|| and its spreads, the distance between
perturbed runs, the LN-LSTM's Jacobian gain, and Lyapunov exponents against
gradient growth rates). Runs on one fastln thread unless --threads says
otherwise (the batches are small). Needs tqdm and matplotlib.
"""
import argparse
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import longer_sequences as LS  # noqa: E402

import _common as C  # noqa: E402

MODELS = [("RNN", "RNN"), ("LN-RNN", "LNRNN"), ("LSTM", "LSTM"), ("LN-LSTM", "LNLSTM"),
          ("GRU", "GRU"), ("LN-GRU", "LNGRU")]   # (label, fastln.rnn class)
KINDS = ("gaussian", "adding")   # the inputs of the measurements (see inputs())

# LN-LSTM variants of part 4: (name, keyword arguments of make_model)
VARIANTS = [
    ("default", {}),
    ("W_hh x 0.25", {"scale": 0.25}),
    ("W_hh x 4", {"scale": 4.0}),
    ("orthogonal W_hh", {"orthogonal": True}),
    ("forget bias 1", {"forget_bias": 1.0}),
    ("ln_hh gain 0.8", {"hh_gain": 0.8}),
    ("ln_hh gain 0.5", {"hh_gain": 0.5}),
    ("ln_hh gain 0.1", {"hh_gain": 0.1}),
    ("ln_hh gain 0.7, forget bias 1", {"hh_gain": 0.7, "forget_bias": 1.0}),
    ("eps 1e-2", {"eps": 1e-2}),
    ("eps 1e-1", {"eps": 1e-1}),
    ("eps 1e-2, W_hh x 0.25", {"eps": 1e-2, "scale": 0.25}),
]

# the variants whose Jacobian gain along t is plotted
GAIN_PLOT = ("default", "orthogonal W_hh", "ln_hh gain 0.8", "ln_hh gain 0.5", "ln_hh gain 0.1",
             "eps 1e-1")

# settings of the full run and of --quick (tiny sizes for a smoke test)
FULL = {"T": 200, "hidden": 64, "batch": 16, "seeds": [0, 1, 2], "scales": [0.5, 1.0, 2.0, 4.0],
        "fit": 100, "chunk": 25, "lyap_T": 600, "burn": 100, "renorm": 10,
        "train_steps": 1000, "train_T": 50, "train_batch": 64, "eval_size": 1000}
QUICK = {"T": 20, "hidden": 8, "batch": 4, "seeds": [0], "scales": [1.0, 2.0],
         "fit": 10, "chunk": 5, "lyap_T": 60, "burn": 15, "renorm": 5,
         "train_steps": 10, "train_T": 10, "train_batch": 8, "eval_size": 32}


# ---------------------------------------------------------------- models

def make_model(cls_name, features, hidden, seed, dtype=np.float64, scale=1.0,
               orthogonal=False, forget_bias=0.0, hh_gain=1.0, eps=None):
    """A fastln.rnn model with the default init (seeded), then W_hh multiplied by
    scale; orthogonal replaces each H x H gate block of W_hh by an orthogonal
    matrix (before the scale); forget_bias sets an LSTM's forget-gate bias;
    hh_gain sets the gains of the LayerNorms of h W_hh^T (ln_hh, ln_hn); eps
    is the LayerNorm eps of an LN model."""
    kwargs = {} if eps is None or not cls_name.startswith("LN") else {"eps": eps}
    model = C.rnn_class(cls_name)(features, hidden, dtype=dtype, seed=seed, **kwargs)
    p = model.params
    W = p["weight_hh_l0"]
    if orthogonal:
        rng = np.random.default_rng([seed, 3])
        for b in range(W.shape[0] // hidden):
            q, r = np.linalg.qr(rng.standard_normal((hidden, hidden)))
            W[b * hidden:(b + 1) * hidden] = q * np.sign(np.diag(r))
    W *= scale
    if forget_bias:
        if cls_name not in ("LSTM", "LNLSTM"):
            raise ValueError(f"forget_bias needs an LSTM, got {cls_name}")
        p["bias_l0"][hidden:2 * hidden] = forget_bias   # gate order i, f, g, o
    if hh_gain != 1.0:
        keys = [k for k in ("ln_hh_weight_l0", "ln_hn_weight_l0") if k in p]
        if not keys:
            raise ValueError(f"hh_gain needs an LSTM or GRU with LayerNorm, got {cls_name}")
        for k in keys:
            p[k][:] = hh_gain
    return model


def has_cell(model):
    """Whether the model's state is (h, c): LSTM and LN-LSTM."""
    return isinstance(model, (C.rnn_class("LSTM"), C.rnn_class("LNLSTM")))


def parts(state):
    """The state's arrays: (h,) or (h, c)."""
    return state if isinstance(state, tuple) else (state,)


def pack(model, arrays):
    """The arrays (h,) or (h, c) in the form of the model's state."""
    return tuple(arrays) if has_cell(model) else arrays[0]


def state_norm(state):
    """Per-sequence L2 norm of the whole state (h and c), shape (B,)."""
    return np.sqrt(sum((a[0] ** 2).sum(axis=-1) for a in parts(state)))


# ---------------------------------------------------------------- measurements

def grad_logs(model, x, readout, chunk):
    """ln ||dL/dx_t|| for each step and sequence, (T, B), where L = sum over the
    batch of readout . y[T-1]. The backward runs chunk by chunk from the end,
    the state gradient passed between chunks scaled to norm 1 per sequence and
    its scale added to the logarithms, so nothing under- or overflows."""
    T, B = x.shape[:2]
    starts = list(range(0, T, chunk))
    states, state = [], None
    for s in starts:
        states.append(state)
        _, state = model.forward(x[s:s + chunk], state, cache=False)
    logs = np.empty((T, B))
    log_scale = np.zeros(B)
    dstate = None
    for s, state in zip(reversed(starts), reversed(states)):
        y, _ = model.forward(x[s:s + chunk], state)
        dy = np.zeros_like(y)
        if s == starts[-1]:
            dy[-1] = readout
        dx, dstate = model.backward(dy, dstate)
        with np.errstate(divide="ignore"):
            logs[s:s + chunk] = np.log(np.linalg.norm(dx, axis=2)) + log_scale
        norm = state_norm(dstate)
        norm = np.where(norm > 0, norm, 1.0)
        log_scale += np.log(norm)
        dstate = pack(model, [a / norm[None, :, None] for a in parts(dstate)])
    return logs


def growth_rate(curve, lo, hi):
    """Minus the least-squares slope of curve[t] (a log norm) against t over
    lo <= t < hi: the growth per step toward the past; NaN without 2 finite points."""
    t = np.arange(lo, hi)
    v = curve[lo:hi]
    ok = np.isfinite(v)
    if ok.sum() < 2:
        return float("nan")
    return -float(np.polyfit(t[ok], v[ok], 1)[0])


def lyapunov(model, x, delta, renorm, burn, rng):
    """The largest Lyapunov exponent of the forward map per step (mean over
    the batch): h0 = 0 against h0 perturbed by delta in a random direction;
    the distance of the full states is measured and reset to delta every
    renorm steps; the chunks that start before step burn are left out."""
    T, B = x.shape[:2]
    H = model.hidden_size
    u = rng.standard_normal((1, B, H))
    u *= delta / np.linalg.norm(u, axis=2, keepdims=True)
    sa = pack(model, [np.zeros((1, B, H)) for _ in range(2 if has_cell(model) else 1)])
    sb = pack(model, [a + (u if i == 0 else 0.0) for i, a in enumerate(parts(sa))])
    total, steps = np.zeros(B), 0
    for s in range(0, T, renorm):
        _, sa = model.forward(x[s:s + renorm], sa, cache=False)
        _, sb = model.forward(x[s:s + renorm], sb, cache=False)
        diff = [b - a for a, b in zip(parts(sa), parts(sb))]
        d = np.sqrt(sum((v[0] ** 2).sum(axis=-1) for v in diff))
        d = np.maximum(d, 1e-300)
        if s >= burn:
            total += np.log(d / delta)
            steps += min(renorm, T - s)
        sb = pack(model, [a + v * (delta / d)[None, :, None] for a, v in zip(parts(sa), diff)])
    return float(np.mean(total / max(steps, 1)))


def divergence(model, x, delta, rng):
    """(y, log10 of the mean over sequences of ||h_t - h'_t||) for two runs over
    x, h0 = 0 and h0 perturbed by delta (no renormalization)."""
    T, B = x.shape[:2]
    H = model.hidden_size
    u = rng.standard_normal((1, B, H))
    u *= delta / np.linalg.norm(u, axis=2, keepdims=True)
    y, _ = model.forward(x, cache=False)
    h0 = (u, None) if has_cell(model) else u
    y2, _ = model.forward(x, h0, cache=False)
    d = np.linalg.norm(y2 - y, axis=2).mean(axis=1)
    with np.errstate(divide="ignore"):
        return y, np.log10(d)


def hh_layer_norm_gain(model, y, steps, sequences=2):
    """For an LN-LSTM along its outputs y (T, B, H): at the given steps t >= 1
    the LayerNorm of a = h_{t-1} W_hh^T, its 1/std and the spectral norm of
    d LN(a) / d h_{t-1} = diag(g) / std * (I - 11^T/n - a_hat a_hat^T / n) W_hh,
    the median over the first `sequences` sequences. Returns (rstd, gain), one per step."""
    W = model.params["weight_hh_l0"]
    g = model.params["ln_hh_weight_l0"]
    n = W.shape[0]
    rstd = np.empty((len(steps), sequences))
    gain = np.empty((len(steps), sequences))
    W_centered = W - W.mean(axis=0)
    for i, t in enumerate(steps):
        for b in range(sequences):
            a = W @ y[t - 1, b]
            r = 1.0 / np.sqrt(a.var() + model.eps)
            ahat = (a - a.mean()) * r
            J = (g[:, None] * r) * (W_centered - np.outer(ahat, ahat @ W) / n)
            rstd[i, b] = r
            gain[i, b] = np.linalg.norm(J, 2)
    return np.median(rstd, axis=1), np.median(gain, axis=1)


def hidden_stats(y):
    """||h_t|| (mean over sequences), std across units (mean over sequences)
    and std across sequences (mean over units), each (T,)."""
    return (np.linalg.norm(y, axis=2).mean(axis=1), y.std(axis=2).mean(axis=1),
            y.std(axis=1).mean(axis=1))


def inputs(kind, T, args, rng):
    """x (T, --batch, I) float64: "gaussian" draws x ~ N(0, 1) with I = --features;
    "adding" takes the adding problem's inputs (I = 2)."""
    if kind == "gaussian":
        return rng.standard_normal((T, args.batch, args.features))
    return LS.adding_batch(T, args.batch, rng)[0].astype(np.float64)


def measure(model, seed, args, kind, extras=False):
    """The measurements of one model at one seed on inputs of one kind: the
    ln ||dL/dx_t|| curve (T,) from h0 = 0, its growth rate, the Lyapunov
    exponent and the gradient's growth rate along the long sequences; with
    extras also the long forward's outputs "y" and the divergence "div" of two
    runs (see divergence())."""
    H = model.hidden_size
    readout = np.random.default_rng([seed, 4]).standard_normal(H) / np.sqrt(H)
    x = inputs(kind, args.T, args, np.random.default_rng([seed, 5]))
    curve = grad_logs(model, x, readout, args.chunk).mean(axis=1)
    xl = inputs(kind, args.lyap_T, args, np.random.default_rng([seed, 6]))
    lam = lyapunov(model, xl, args.delta, args.renorm, args.burn,
                   np.random.default_rng([seed, 7]))
    long_curve = grad_logs(model, xl, readout, args.chunk).mean(axis=1)
    out = {"curve": curve, "rate": growth_rate(curve, 0, args.fit), "lyap": lam,
           "rate_long": growth_rate(long_curve, args.burn, args.lyap_T - args.burn)}
    if extras:
        out["y"], out["div"] = divergence(model, xl, args.delta,
                                          np.random.default_rng([seed, 7]))
    return out


# ---------------------------------------------------------------- training

def train(cls_name, seed, args, bar):
    """Trains a float32 model on the adding problem at T = --train-T (Adam,
    cosine learning rate, clipping); returns the float64 copy, the eval MSE and
    the largest gradient norm seen."""
    model = make_model(cls_name, 2, args.hidden, seed, dtype=np.float32)
    head = C.Linear(args.hidden, 1, np.random.default_rng([seed, 1]))
    data_rng = np.random.default_rng([seed, 2])
    opt = C.Adam(C.joint(model, head, "params"), lr=args.lr, clip=args.clip)
    for step in range(1, args.train_steps + 1):
        opt.lr = args.lr * 0.5 * (1.0 + np.cos(np.pi * (step - 1) / args.train_steps))
        x, target = LS.adding_batch(args.train_T, args.train_batch, data_rng)
        y, _ = model.forward(x)
        _, dpred = C.mse(head(y[-1]), target)
        model.backward(C.last_step_grad(y, head.backward(dpred)))
        opt.step(C.joint(model, head, "grads"))
        bar.update(1)
    sets = LS.eval_sets([args.train_T], args.eval_size)
    mse = LS.evaluate(model, head, sets)[args.train_T]
    out = make_model(cls_name, 2, args.hidden, seed)
    out.load_state_dict(model.state_dict())
    return out, mse, opt.max_norm


# ---------------------------------------------------------------- output

def fmt_ln(v):
    """exp(v) as text, for a natural logarithm v of any size ('2.4e+09', '3e-512')."""
    if not np.isfinite(v):
        return "0" if v < 0 else "inf"
    l10 = v / math.log(10.0)
    if -300 < l10 < 300:
        return f"{math.exp(v):.2g}"
    e = math.floor(l10)
    return f"{10 ** (l10 - e):.2g}e{e:+d}"


def fmt_rate(v):
    return "nan" if not np.isfinite(v) else f"{v:+.4f}"


def t_points(T):
    """The steps of the tables: T-1, T-50, T-100 and 0 (those inside [0, T))."""
    pts = [T - 1, T - 50, T - 100, 0]
    return [t for i, t in enumerate(pts) if 0 <= t and t not in pts[:i]]


def _axes(nrows, ncols, width, height):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False)
    return plt, fig, axes


def _save(plt, fig, path, title):
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_gradients(path, res, args):
    """log10 ||dL/dx_t|| against t: a row per kind of input, a panel per model,
    a line per scale (median over seeds, min-max band) and the trained model."""
    plt, fig, axes = _axes(len(KINDS), len(MODELS), 3.9 * len(MODELS), 8.6)
    t = np.arange(args.T)
    ln10 = math.log(10.0)
    for row, kind in zip(axes, KINDS):
        for ax, (label, _) in zip(row, MODELS):
            for i, s in enumerate(args.scales):
                runs = np.array([res["runs"][kind, label, s, seed]["curve"]
                                 for seed in args.seeds]) / ln10
                ax.plot(t, np.median(runs, axis=0), color=f"C{i}", label=f"init, W_hh x {s:g}")
                if len(args.seeds) > 1:
                    ax.fill_between(t, runs.min(axis=0), runs.max(axis=0), color=f"C{i}",
                                    alpha=0.2, linewidth=0)
            if kind == "adding":
                runs = np.array([res["trained"][label, seed]["curve"] for seed in args.seeds])
                ax.plot(t, np.median(runs, axis=0) / ln10, color="black", linestyle="--",
                        label=f"trained ({args.train_steps} steps)")
            ax.set_title(f"{label}, {kind} inputs", fontsize=10)
            ax.set_xlabel("t (the loss reads y at t = T-1)")
            ax.set_ylabel("log10 ||dL/dx_t||")
            ax.grid(True, alpha=0.3)
            ax.legend(loc="best", fontsize=7)
    _save(plt, fig, path,
          f"gradient reaching input step t: H={args.hidden}, T={args.T}, float64; "
          f"gaussian: x ~ N(0, 1), I={args.features}; adding: the adding problem's inputs, "
          f"I=2; median over {len(args.seeds)} seed(s) (band: min-max)")


def plot_dynamics(path, res, args):
    """The hidden state's norm and spreads, the divergence of perturbed runs,
    the LN-LSTM's Jacobian gain and the Lyapunov exponents against the
    gradients' growth rates."""
    plt, fig, axes = _axes(2, 3, 16, 9)
    t = np.arange(args.lyap_T)
    styles = {"gaussian": "-", "adding": ":"}
    titles = ["||h_t|| at init (W_hh x 1)", "std of h_t across units",
              "std of h_t across the batch"]
    for j, (ax, title) in enumerate(zip(axes[0], titles)):
        for kind in KINDS:
            for i, (label, _) in enumerate(MODELS):
                ax.plot(t, res["dynamics"][kind, label][j], color=f"C{i}",
                        linestyle=styles[kind], label=f"{label}, {kind}")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("t")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    axes[0][0].legend(loc="best", fontsize=6, ncol=2)
    ax = axes[1][0]
    for kind in KINDS:
        for i, (label, _) in enumerate(MODELS):
            ax.plot(t, res["divergence"][kind, label], color=f"C{i}", linestyle=styles[kind],
                    label=f"{label}, {kind}")
    ax.set_title(f"two runs, h0 apart by {args.delta:g}: log10 ||h_t - h'_t|| "
                 "(its floor: float64 rounding)", fontsize=10)
    ax.set_xlabel("t")
    ax.grid(True, alpha=0.3)
    ax = axes[1][1]
    for i, (name, (steps, gain)) in enumerate(res["gain_curves"].items()):
        ax.plot(steps, gain, color=f"C{i}", label=name)
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    ax.set_title("LN-LSTM, gaussian inputs: spectral norm of d LN(h W_hh^T) / dh", fontsize=10)
    ax.set_xlabel("t")
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=7)
    ax = axes[1][2]
    points = []
    for kind, marker in zip(KINDS, ("o", "s")):
        for i, (label, _) in enumerate(MODELS):
            pts = np.array([(res["table"][kind, label, s]["lyap"],
                             res["table"][kind, label, s]["rate_long"]) for s in args.scales])
            points.append(pts)
            ax.scatter(pts[:, 0], pts[:, 1], s=18, marker=marker, facecolors="none",
                       edgecolors=f"C{i}", label=label if kind == KINDS[0] else None)
        pts = np.array([(v["lyap"], v["rate_long"]) for (k, _), v in res["variants"].items()
                        if k == kind])
        points.append(pts)
        ax.scatter(pts[:, 0], pts[:, 1], color="black", marker="x" if kind == "gaussian" else "+",
                   s=24, label=f"LN-LSTM variants ({kind})")
    pts = np.concatenate(points)
    pts = pts[np.isfinite(pts).all(axis=1)]
    lo, hi = (pts.min(), pts.max()) if len(pts) else (-1.0, 1.0)
    ax.plot([lo, hi], [lo, hi], color="gray", linestyle="--", linewidth=1, label="y = x")
    ax.axhline(0, color="gray", linewidth=0.5)
    ax.axvline(0, color="gray", linewidth=0.5)
    ax.set_title("Lyapunov exponent vs gradient growth rate, per step\n(each model and s; "
                 "circles: gaussian inputs, squares: adding)", fontsize=10)
    ax.set_xlabel("largest Lyapunov exponent of the forward map")
    ax.set_ylabel("growth of ||dL/dx_t|| toward the past")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=7, ncol=2)
    _save(plt, fig, path,
          f"hidden-state dynamics at init: H={args.hidden}, {args.lyap_T} steps, float64; "
          f"solid: x ~ N(0, 1), I={args.features}; dotted: adding-problem inputs; median over "
          f"{len(args.seeds)} seed(s)")


# ---------------------------------------------------------------- command line

def sized(key):
    """The help text's note on a size left at None."""
    def text(v):
        return ",".join(f"{x:g}" for x in v) if isinstance(v, list) else v
    return f"; None: {text(FULL[key])}, with --quick {text(QUICK[key])}"


def make_parser():
    """The command line's parser (every option shows its default in --help; the
    sizes left at None take the full run's values, or --quick's)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=C.HelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes for a smoke test (options given explicitly still apply)")
    p.add_argument("--T", type=C.positive_int, default=None,
                   help="length of the gradient measurement" + sized("T"))
    p.add_argument("--hidden", type=C.positive_int, default=None,
                   help="hidden size H" + sized("hidden"))
    p.add_argument("--features", type=C.positive_int, default=None,
                   help="input features I of the gaussian inputs; None: --hidden")
    p.add_argument("--batch", type=C.positive_int, default=None,
                   help="sequences per measurement" + sized("batch"))
    p.add_argument("--seeds", type=C.seed_list, default=None,
                   help="a count (3: seeds 0,1,2) or a comma-separated list of seeds"
                   + sized("seeds"))
    p.add_argument("--scales", type=C.float_list, default=None,
                   help="comma-separated factors s applied to W_hh of the default init"
                   + sized("scales"))
    p.add_argument("--fit", type=C.positive_int, default=None,
                   help="the growth rate is fitted over t < fit, the steps farthest from "
                   "the loss" + sized("fit"))
    p.add_argument("--chunk", type=C.positive_int, default=None,
                   help="steps per backward chunk between renormalizations" + sized("chunk"))
    p.add_argument("--lyap-T", type=C.positive_int, default=None,
                   help="length of the Lyapunov runs and of the long gradient measurement"
                   + sized("lyap_T"))
    p.add_argument("--burn", type=C.positive_int, default=None,
                   help="steps left out at each end of the Lyapunov runs" + sized("burn"))
    p.add_argument("--renorm", type=C.positive_int, default=None,
                   help="steps between renormalizations of the perturbation"
                   + sized("renorm"))
    p.add_argument("--delta", type=C.positive_float, default=1e-8,
                   help="size of the perturbation of h0")
    p.add_argument("--train-steps", type=C.positive_int, default=None,
                   help="training batches per model and seed" + sized("train_steps"))
    p.add_argument("--train-T", type=C.positive_int, default=None,
                   help="length of the training sequences, 2 or more" + sized("train_T"))
    p.add_argument("--train-batch", type=C.positive_int, default=None,
                   help="sequences per training batch" + sized("train_batch"))
    p.add_argument("--eval-size", type=C.positive_int, default=None,
                   help="sequences in the evaluation after training" + sized("eval_size"))
    p.add_argument("--lr", type=C.positive_float, default=3e-3,
                   help="Adam's learning rate (cosine decay to 0)")
    p.add_argument("--clip", type=C.nonnegative_float, default=1.0,
                   help="global gradient-norm clipping in training, 0 for none")
    p.add_argument("--out", default=".",
                   help="folder for gradient_flow.png and gradient_flow_dynamics.png")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    # one thread by default: the batches here are small, and one thread is fastest
    p.add_argument("--threads", type=C.positive_int, default=1,
                   help="fastln's thread count for the run")
    return p


def parse_args(argv):
    p = make_parser()
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.features is None:
        args.features = args.hidden
    if args.T < 2:
        p.error(f"--T must be at least 2, got {args.T}")
    if args.fit < 2 or args.fit > args.T:
        p.error(f"--fit must lie in [2, --T], got {args.fit} with --T {args.T}")
    if args.lyap_T <= 2 * args.burn + 1:
        p.error(f"--lyap-T must exceed 2 * --burn + 1, got --lyap-T {args.lyap_T} and "
                f"--burn {args.burn}")
    if args.train_T < 2:
        p.error(f"--train-T must be at least 2, got {args.train_T}")
    return args


def main(argv=None):
    """Runs the example with command-line arguments argv (a list; None for
    sys.argv); returns the results as a dict."""
    args = parse_args(argv)
    with C.thread_count(args.threads) as threads:
        return run(args, threads)


def median(values):
    a = np.asarray(values, dtype=np.float64)
    return float(np.median(a)) if a.size else float("nan")


def summarize(runs, args):
    """Median over seeds of the curve at the table's steps and of the rates."""
    curves = np.array([r["curve"] for r in runs])
    return {"at": {t: float(np.median(curves[:, t])) for t in t_points(args.T)},
            "rate": median([r["rate"] for r in runs]),
            "lyap": median([r["lyap"] for r in runs]),
            "rate_long": median([r["rate_long"] for r in runs])}


def run(args, threads):
    t_start = time.perf_counter()
    pts = t_points(args.T)
    C.say(f"gradient flow: H={args.hidden}, T={args.T} (fit t < {args.fit}), batch "
          f"{args.batch}, scales {args.scales}, seeds {args.seeds}, gaussian inputs of "
          f"{args.features} features and adding-problem inputs; Lyapunov over {args.lyap_T} "
          f"steps (burn {args.burn}, renorm {args.renorm}); training {args.train_steps} steps "
          f"at T={args.train_T}, batch {args.train_batch}, lr {args.lr:g}, clip {args.clip:g}; "
          f"{threads} fastln thread(s)")
    n_seeds = len(args.seeds)
    total = n_seeds * (len(KINDS) * (len(MODELS) * len(args.scales) + len(VARIANTS))
                       + len(MODELS) * (args.train_steps + 1))
    features = {"gaussian": args.features, "adding": 2}
    runs, trained, mses, max_norms, walls = {}, {}, {}, {}, {}
    table, dynamics, divergences = {}, {}, {}
    variants, gain_curves = {}, {}
    gain_steps = list(range(1, args.lyap_T, max(1, args.lyap_T // 100)))
    with C.progress(total, "measuring", not args.no_progress) as bar:
        # parts 1, 3 and 4: every model and scale at init
        for kind in KINDS:
            for label, cls_name in MODELS:
                bar.set_description(f"{label} at init, {kind} inputs")
                with C.timer(walls, "init"):
                    base = []
                    for s in args.scales + ([] if 1.0 in args.scales else [None]):
                        for seed in args.seeds:
                            model = make_model(cls_name, features[kind], args.hidden, seed,
                                               scale=s or 1.0)
                            r = measure(model, seed, args, kind, extras=s in (1.0, None))
                            if s in (1.0, None):   # the dynamics of part 3
                                base.append((hidden_stats(r.pop("y")), r.pop("div")))
                            if s is not None:
                                runs[kind, label, s, seed] = r
                                bar.update(1)
                        if s is not None:
                            table[kind, label, s] = summarize(
                                [runs[kind, label, s, seed] for seed in args.seeds], args)
                    dynamics[kind, label] = [np.median([st[j] for st, _ in base], axis=0)
                                             for j in range(3)]
                    divergences[kind, label] = np.median([d for _, d in base], axis=0)
        # part 2: after training, measured on the adding problem's inputs
        for label, cls_name in MODELS:
            bar.set_description(f"training {label}")
            for seed in args.seeds:
                with C.timer(walls, "training"):
                    model, mses[label, seed], max_norms[label, seed] = train(
                        cls_name, seed, args, bar)
                with C.timer(walls, "trained"):
                    trained[label, seed] = measure(model, seed, args, "adding")
                bar.update(1)
        # part 4: LN-LSTM variants
        for kind in KINDS:
            bar.set_description(f"LN-LSTM variants, {kind} inputs")
            with C.timer(walls, "variants"):
                for name, kwargs in VARIANTS:
                    vr, rstds, gains, hnorm = [], [], [], []
                    for seed in args.seeds:
                        model = make_model("LNLSTM", features[kind], args.hidden, seed, **kwargs)
                        r = measure(model, seed, args, kind, extras=True)
                        y = r.pop("y")
                        del r["div"]
                        rstd, gain = hh_layer_norm_gain(model, y, gain_steps)
                        vr.append(r)
                        rstds.append(rstd)
                        gains.append(gain)
                        hnorm.append(np.linalg.norm(y, axis=2).mean())
                        bar.update(1)
                        if kind == "gaussian" and seed == args.seeds[0] and name in GAIN_PLOT:
                            gain_curves[name] = (gain_steps, gain)
                    variants[kind, name] = {**summarize(vr, args),
                                            "rstd": float(np.median(np.concatenate(rstds))),
                                            "gain": float(np.median(np.concatenate(gains))),
                                            "h_norm": median(hnorm)}

    trained_table = {label: {**summarize([trained[label, seed] for seed in args.seeds], args),
                             "mse": median([mses[label, seed] for seed in args.seeds]),
                             "max_norm": median([max_norms[label, seed]
                                                 for seed in args.seeds])}
                     for label, _ in MODELS}
    results = {"table": table, "runs": runs, "trained": trained, "trained_table": trained_table,
               "variants": variants, "gain_curves": gain_curves, "dynamics": dynamics,
               "divergence": divergences, "mse": mses, "max_norm": max_norms, "t_points": pts}
    print_tables(results, args)
    png = os.path.join(args.out, "gradient_flow.png")
    png_dyn = os.path.join(args.out, "gradient_flow_dynamics.png")
    plot_gradients(png, results, args)
    plot_dynamics(png_dyn, results, args)
    wall = time.perf_counter() - t_start
    C.say(f"wrote {png} and {png_dyn}")
    C.say(f"wall time: {wall:.1f} s")
    results.update({"walls": walls, "wall": wall, "figures": [png, png_dyn]})
    return results


def print_tables(res, args):
    """The results as markdown tables."""
    pts = res["t_points"]
    head = " | ".join(f"t={t}" for t in pts)
    n = len(args.seeds)
    for kind in KINDS:
        what = (f"x ~ N(0, 1), I={args.features}" if kind == "gaussian"
                else "the adding problem's inputs")
        C.say(f"\n{kind} inputs ({what}): ||dL/dx_t|| at init, median over {n} seed(s) of "
              f"the geometric mean over {args.batch} sequences (T={args.T}, the loss at "
              f"t={args.T - 1}); rate: the gradient's growth per step toward the past, fitted "
              f"over t < {args.fit}; Lyapunov: the largest exponent of the forward map, and "
              f"rate (long): the gradient's growth rate, both along {args.lyap_T}-step runs "
              f"(t in [{args.burn}, {args.lyap_T - args.burn}))")
        C.say(f"| model | W_hh x | {head} | rate | Lyapunov | rate (long) |")
        C.say("|---" * (len(pts) + 5) + "|")
        for label, _ in MODELS:
            for s in args.scales:
                r = res["table"][kind, label, s]
                C.say(f"| {label} | {s:g} | " + " | ".join(fmt_ln(r["at"][t]) for t in pts)
                      + f" | {fmt_rate(r['rate'])} | {fmt_rate(r['lyap'])} | "
                      f"{fmt_rate(r['rate_long'])} |")

    C.say(f"\nafter {args.train_steps} training steps on the adding problem at T={args.train_T} "
          f"(float32, batch {args.train_batch}, lr {args.lr:g} cosine, clip {args.clip:g}), "
          f"measured in float64 on the adding problem's inputs as above; eval MSE at "
          f"T={args.train_T} (predicting 1.0: {LS.BASELINE:.3f}); max grad norm: the largest "
          f"global gradient norm in training, before clipping; medians over {n} seed(s)")
    C.say(f"| model | eval MSE | max grad norm | {head} | rate | Lyapunov | rate (long) |")
    C.say("|---" * (len(pts) + 6) + "|")
    for label, _ in MODELS:
        r = res["trained_table"][label]
        C.say(f"| {label} | {r['mse']:.4f} | {r['max_norm']:.3g} | "
              + " | ".join(fmt_ln(r["at"][t]) for t in pts)
              + f" | {fmt_rate(r['rate'])} | {fmt_rate(r['lyap'])} | "
              f"{fmt_rate(r['rate_long'])} |")

    mid, last = args.lyap_T // 2, args.lyap_T - 1
    C.say(f"\nthe hidden state at init (W_hh x 1): ||h_t||, std across units, std across "
          f"{args.batch} sequences, each at t = 0 / {mid} / {last}")
    C.say("| model | inputs | ||h_t|| | std across units | std across batch |")
    C.say("|---|---|---|---|---|")
    for label, _ in MODELS:
        for kind in KINDS:
            C.say(f"| {label} | {kind} | " + " | ".join(
                " / ".join(f"{v[t]:.3g}" for t in (0, mid, last))
                for v in res["dynamics"][kind, label]) + " |")

    C.say("\nLN-LSTM variants (W_hh x 1, ln_hh gain 1, eps 1e-5, forget bias 0 unless named), "
          "per kind of input: the Lyapunov exponent, the gradient's growth rate over the "
          f"long runs and over t < {args.fit} at T={args.T}; the hh LayerNorm's 1/std and the "
          "spectral norm of d LN(h W_hh^T)/dh (medians along the long runs) and the mean "
          "||h_t||, on gaussian inputs")
    C.say("| variant | Lyapunov (gaussian) | rate long | rate | Lyapunov (adding) | rate long "
          "| rate | rstd hh | ||dLN/dh|| | ||h|| |")
    C.say("|---" * 10 + "|")
    for name, _ in VARIANTS:
        g, a = res["variants"]["gaussian", name], res["variants"]["adding", name]
        C.say(f"| {name} | " + " | ".join(fmt_rate(r[k]) for r in (g, a)
                                          for k in ("lyap", "rate_long", "rate"))
              + f" | {g['rstd']:.3g} | {g['gain']:.3g} | {g['h_norm']:.3g} |")


if __name__ == "__main__":
    main()
