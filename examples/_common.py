"""Shared pieces of the fastln.rnn training examples (sequential_digits.py,
longer_sequences.py): Adam written in NumPy, a linear readout, softmax
cross-entropy and mean squared error with their gradients, minibatch order,
progress bars, summaries over seeds and the learning-curve plot.

Everything is float32 unless an array of another float type is passed in, and
deterministic given the seeds.
"""
import argparse
import contextlib
import math
import os
import sys
import time

import numpy as np

# ---------------------------------------------------------------- optimizer

class Adam:
    """Adam (Kingma & Ba, 2015) over a dict of arrays, updated in place.

    ``step(grads)`` takes a dict with the keys of ``params``. With ``clip`` > 0
    the gradients are first scaled so that their global L2 norm (computed in
    float64) is at most ``clip`` (as ``torch.nn.utils.clip_grad_norm_``). The
    moment estimates have the dtype of each parameter; the bias corrections are
    those of ``torch.optim.Adam``.

    ``max_norm`` is the largest gradient norm seen (before clipping). A gradient
    entry beyond about 1.8e19 overflows a float32 second moment to inf, after
    which that entry's updates are 0 for good (as in ``torch.optim.Adam``);
    ``inf_moments`` counts such entries.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, clip=0.0):
        self.params = params
        self.lr = float(lr)
        self.b1, self.b2 = (float(b) for b in betas)
        self.eps = float(eps)
        self.clip = float(clip)
        self.t = 0
        self.m = {k: np.zeros_like(p) for k, p in params.items()}
        self.v = {k: np.zeros_like(p) for k, p in params.items()}
        self.max_norm = 0.0
        self.inf_moments = 0

    def step(self, grads):
        """One update; returns the global gradient norm before clipping."""
        norm = float(np.sqrt(sum(float(np.vdot(g64, g64)) for g64 in
                                 (np.asarray(g, np.float64).ravel() for g in grads.values()))))
        self.max_norm = max(self.max_norm, norm)
        scale = 1.0
        if self.clip > 0 and norm > self.clip:
            scale = self.clip / (norm + 1e-6)
        self.t += 1
        c1 = 1.0 - self.b1 ** self.t
        c2 = 1.0 - self.b2 ** self.t
        step = self.lr / c1
        for k, p in self.params.items():
            g = grads[k] * scale if scale != 1.0 else grads[k]
            m, v = self.m[k], self.v[k]
            m *= self.b1
            m += (1.0 - self.b1) * g
            v *= self.b2
            with np.errstate(over="ignore"):   # counted below instead
                v += (1.0 - self.b2) * (g * g)
            p -= step * m / (np.sqrt(v / c2) + self.eps)
        if norm * scale > 1e15:   # only then can a float32 moment have overflowed
            self.inf_moments = sum(int(np.isinf(v).sum()) for v in self.v.values())
        return norm


def joint(model, head, attr):
    """The ``params`` (or ``grads``) of an RNN model and its readout as one dict
    ("rnn.<key>", "head.<key>") of the same arrays, for :class:`Adam`."""
    return {**{"rnn." + k: v for k, v in getattr(model, attr).items()},
            **{"head." + k: v for k, v in getattr(head, attr).items()}}


def adam_note(opt):
    """A warning line when Adam's second moment overflowed, else None."""
    if not opt.inf_moments:
        return None
    return (f"  warning: the gradient norm reached {opt.max_norm:.3g}; {opt.inf_moments} "
            f"entries of Adam's float32 second moment overflowed to inf, and those "
            f"parameters stopped moving (--clip avoids this)")


# ---------------------------------------------------------------- readout and losses

class Linear:
    """``y = x W^T + b`` with W (out, in), b (out,), initialized as
    ``torch.nn.Linear``: U(-1/sqrt(in), 1/sqrt(in)). ``backward(dy)`` returns dx
    and fills ``grads`` (the keys of ``params``: "weight", "bias")."""

    def __init__(self, in_features, out_features, rng, dtype=np.float32):
        bound = 1.0 / np.sqrt(in_features)
        self.params = {
            "weight": rng.uniform(-bound, bound, (out_features, in_features)).astype(dtype),
            "bias": rng.uniform(-bound, bound, out_features).astype(dtype),
        }
        self.grads = {k: np.zeros_like(p) for k, p in self.params.items()}
        self._x = None

    def forward(self, x):
        self._x = x
        return x @ self.params["weight"].T + self.params["bias"]

    __call__ = forward

    def backward(self, dy):
        x, self._x = self._x, None
        self.grads["weight"] = dy.T @ x
        self.grads["bias"] = dy.sum(axis=0)
        return dy @ self.params["weight"]


def softmax_cross_entropy(logits, labels):
    """Mean cross-entropy of integer ``labels`` (B,) under ``softmax(logits)``
    (B, C): returns (loss, dloss/dlogits)."""
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    B = len(labels)
    loss = -float(logp[np.arange(B), labels].mean())
    d = np.exp(logp)
    d[np.arange(B), labels] -= 1.0
    return loss, (d / B).astype(logits.dtype)


def mse(pred, target):
    """Mean squared error and its gradient with respect to ``pred``."""
    diff = pred - target
    return float(np.mean(diff * diff)), (2.0 / diff.size) * diff


def minibatches(n, batch_size, rng):
    """Index arrays covering a fresh permutation of range(n); the last batch may be short."""
    order = rng.permutation(n)
    return [order[i:i + batch_size] for i in range(0, n, batch_size)]


def last_step_grad(y, dh):
    """dy for a model output y (T, B, H) whose loss reads only y[-1] (gradient dh)."""
    dy = np.zeros_like(y)
    dy[-1] = dh
    return dy


# ---------------------------------------------------------------- models

def rnn_class(name):
    """A fastln.rnn model class by name, with a clear message if it is missing."""
    import fastln.rnn
    cls = getattr(fastln.rnn, name, None)
    if cls is None:
        raise SystemExit(f"fastln.rnn has no {name}: this example needs a fastln with "
                         f"plain and layer-normalized cells")
    return cls


# ---------------------------------------------------------------- command line, output

class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help keeps the description's line breaks and shows every option's default."""


def _number(text, convert, what, low, strict):
    """text as convert(text), at least low (above low where strict), else an argparse error."""
    bound = f"above {low}" if strict else f"{low} or more"
    try:
        value = convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what} {bound}, got {text!r}") from None
    if not math.isfinite(value) or not (value > low if strict else value >= low):
        raise argparse.ArgumentTypeError(f"expected {what} {bound}, got {text!r}")
    return value


def positive_int(text):
    return _number(text, int, "an integer", 0, strict=True)


def nonnegative_int(text):
    return _number(text, int, "an integer", 0, strict=False)


def positive_float(text):
    return _number(text, float, "a number", 0.0, strict=True)


def nonnegative_float(text):
    return _number(text, float, "a number", 0.0, strict=False)


def fraction(text):
    """A number in (0, 1] (an accuracy threshold)."""
    value = positive_float(text)
    if value > 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    return value


def _list(text, item, what):
    values = [item(s.strip()) for s in text.split(",") if s.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}")
    return values


def float_list(text):
    """Comma-separated positive numbers (learning rates)."""
    return _list(text, positive_float, "positive numbers")


def int_list(text):
    """Comma-separated positive integers (lengths)."""
    return _list(text, positive_int, "positive integers")


def seed_list(text):
    """"3" means seeds 0, 1, 2; "4,7" means seeds 4 and 7 (seeds are 0 or more)."""
    if "," not in text:
        return list(range(positive_int(text.strip())))
    return _list(text, nonnegative_int, "seeds (integers 0 or more)")


def add_threads_arg(parser):
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="fastln's thread count; None keeps fastln's own (the CPU count)")


@contextlib.contextmanager
def thread_count(n):
    """Runs the block with fastln's thread count set to n (unchanged if None);
    yields the count in use and restores the previous one afterwards."""
    import fastln
    before = fastln.get_num_threads()
    if n is not None:
        fastln.set_num_threads(n)
    try:
        yield fastln.get_num_threads()
    finally:
        fastln.set_num_threads(before)


def progress(total, desc, enabled):
    """A tqdm bar (to stderr), or a do-nothing stand-in when disabled."""
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, disable=not enabled, leave=False,
                dynamic_ncols=True, file=sys.stderr)


def say(line):
    """Print a line without breaking a tqdm bar."""
    from tqdm import tqdm
    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()


@contextlib.contextmanager
def timer(store, key):
    """Adds the wall time of the block to store[key]."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        store[key] = store.get(key, 0.0) + time.perf_counter() - t0


def mean_spread(values):
    """(mean, std, min, max) over axis 0 (seeds)."""
    a = np.asarray(values, dtype=np.float64)
    return a.mean(axis=0), a.std(axis=0), a.min(axis=0), a.max(axis=0)


def fmt_ms(values, digits=3):
    """'mean ± std' of a list of numbers (just the number for one)."""
    a = np.asarray(values, dtype=np.float64)
    if a.size == 1:
        return f"{a[0]:.{digits}f}"
    return f"{a.mean():.{digits}f} ± {a.std():.{digits}f}"


def plot_curves(path, panels, ylabel, suptitle, logy=False, hline=None, ylim=None):
    """Draws ``panels``, a row (or a list of rows) of (title, xlabel, {label: (x,
    runs)}), runs a (seeds, len(x)) array: each label's mean over seeds with a
    min-max band. A ``hline`` (y, label) is drawn dashed on every panel. Writes a PNG."""
    import textwrap

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = panels if isinstance(panels[0], list) else [panels]
    nr, nc = len(rows), max(len(r) for r in rows)
    fig, axes = plt.subplots(nr, nc, figsize=(5.0 * nc, 0.3 + 3.9 * nr), squeeze=False,
                             sharey=True)
    for r, row in enumerate(rows):
        for ax, (title, xlabel, curves) in zip(axes[r], row):
            for i, (label, (x, runs)) in enumerate(curves.items()):
                mean, _, lo, hi = mean_spread(runs)
                color = f"C{i}"
                ax.plot(x, mean, color=color, marker="o", markersize=3, label=label)
                if len(runs) > 1:
                    ax.fill_between(x, lo, hi, color=color, alpha=0.2, linewidth=0)
            if hline is not None:
                ax.axhline(hline[0], color="gray", linestyle="--", linewidth=1, label=hline[1])
            ax.set_title(title, fontsize=10)
            ax.set_xlabel(xlabel)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if logy:
                ax.set_yscale("log")
            if ylim is not None:
                ax.set_ylim(*ylim)
            ax.grid(True, alpha=0.3)
            ax.legend(loc="best", fontsize=8)
        axes[r][0].set_ylabel(ylabel)
        for ax in axes[r][len(row):]:
            ax.set_visible(False)
    fig.suptitle("\n".join(textwrap.wrap(suptitle, 45 * nc + 20)), fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
