"""LN-RNN against a plain tanh RNN on the adding problem, then on longer sequences.

The adding problem (Hochreiter & Schmidhuber, 1997): every step carries two
inputs, a value drawn from U(0, 1) and a marker that is 1 at exactly two steps
(one in the first half of the sequence, one in the second) and 0 elsewhere; the
target is the sum of the two marked values. A linear readout on the last hidden
state predicts it, trained with mean squared error. Always answering 1.0 gives
an MSE of 1/6 = 0.167, the baseline to beat.

Both models (tanh; same seeds, initial weights, batches and Adam, written in
NumPy in examples/_common.py; gradient-norm clipping at 1; learning rate decayed
to 0 on a cosine) train on batches whose length T is drawn from
[--min-T, --max-T] (10..50 by default), then are evaluated on fixed test sets
at T = 50, 100 and 200: beyond the lengths seen in training. One set of weights
and LN gains serves every step, so the models run on any length.

    python examples/longer_sequences.py       # 3 seeds, lr 1e-3 and 3e-3, 8000 steps each

Prints the evaluation MSE during training and a table of MSE by length, and
writes a PNG, longer_sequences.png in the current directory unless --out says
otherwise (per learning rate: MSE at the longest training length during
training; MSE by length after it). Needs tqdm and matplotlib.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

MODELS = [("LN-RNN", "LNRNN"), ("RNN", "RNN")]   # (label, fastln.rnn class)
BASELINE = 1.0 / 6.0   # MSE of always predicting 1.0: Var(U1 + U2) = 2/12


def adding_batch(T, B, rng):
    """x (T, B, 2) float32: [value, marker]; target (B, 1) float32."""
    values = rng.uniform(0.0, 1.0, (T, B)).astype(np.float32)
    half = max(T // 2, 1)
    first = rng.integers(0, half, B)
    second = rng.integers(half, T, B) if T > 1 else first
    x = np.zeros((T, B, 2), np.float32)
    x[..., 0] = values
    cols = np.arange(B)
    x[first, cols, 1] = 1.0
    x[second, cols, 1] = 1.0
    target = values[first, cols] + values[second, cols] * (second != first)
    return x, target[:, None].astype(np.float32)


def eval_sets(lengths, size, seed=12345):
    """Fixed test sets, one per length (the same for every model and seed)."""
    return {T: adding_batch(T, size, np.random.default_rng([seed, T])) for T in lengths}


def evaluate(model, head, sets):
    out = {}
    for T, (x, target) in sets.items():
        y, _ = model.forward(x, cache=False)
        out[T] = C.mse(head(y[-1]), target)[0]
    return out


def train_run(cls_name, seed, lr, args, sets, bar, label):
    """Trains one model; returns (curve: [(step, MSE at max_T)], final {T: MSE})."""
    model = C.rnn_class(cls_name)(2, args.hidden, seed=seed, nonlinearity="tanh")
    head = C.Linear(args.hidden, 1, np.random.default_rng([seed, 1]))
    data_rng = np.random.default_rng([seed, 2])
    opt = C.Adam(C.joint(model, head, "params"), lr=lr, clip=args.clip)
    curve_set = {args.max_T: sets[args.max_T]}
    curve, losses = [], []
    for step in range(1, args.steps + 1):
        if args.schedule == "cosine":
            opt.lr = lr * 0.5 * (1.0 + np.cos(np.pi * (step - 1) / args.steps))
        T = int(data_rng.integers(args.min_T, args.max_T + 1))
        x, target = adding_batch(T, args.batch_size, data_rng)
        y, _ = model.forward(x)
        loss, dpred = C.mse(head(y[-1]), target)
        model.backward(C.last_step_grad(y, head.backward(dpred)))
        opt.step(C.joint(model, head, "grads"))
        losses.append(loss)
        bar.update(1)
        if step % args.eval_every == 0 or step == args.steps:
            m = evaluate(model, head, curve_set)[args.max_T]
            curve.append((step, m))
            C.say(f"lr={lr:g} seed={seed} {label:<6} step {step:5d}  "
                  f"train mse {np.mean(losses):.4f}  "
                  f"eval mse T={args.max_T} {m:.4f}")
            losses = []
    if C.adam_note(opt):
        C.say(C.adam_note(opt))
    final = evaluate(model, head, sets)
    C.say(f"lr={lr:g} seed={seed} {label:<6} final mse "
          + "  ".join(f"T={T} {m:.4f}" for T, m in final.items()))
    return curve, final


def make_parser():
    """The command line's parser (every option shows its default in --help)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=C.HelpFormatter)
    p.add_argument("--steps", type=C.positive_int, default=8000, help="training batches")
    p.add_argument("--seeds", type=C.seed_list, default="3",
                   help="a count (3: seeds 0,1,2) or a comma-separated list of seeds")
    p.add_argument("--lrs", type=C.float_list, default="1e-3,3e-3",
                   help="comma-separated learning rates, each a run")
    p.add_argument("--schedule", choices=["cosine", "constant"], default="cosine",
                   help="learning rate over training: cosine decay to 0, or constant")
    p.add_argument("--hidden", type=C.positive_int, default=64,
                   help="hidden size H of both models")
    p.add_argument("--batch-size", type=C.positive_int, default=64,
                   help="sequences per training batch")
    p.add_argument("--min-T", type=C.positive_int, default=10,
                   help="shortest training length (2 or more)")
    p.add_argument("--max-T", type=C.positive_int, default=50,
                   help="longest training length (--min-T or more); also the length of "
                   "the evaluation during training")
    p.add_argument("--eval-T", type=C.int_list, default="50,100,200",
                   help="comma-separated evaluation lengths after training (2 or more)")
    p.add_argument("--eval-size", type=C.positive_int, default=1000,
                   help="sequences per evaluation length")
    p.add_argument("--eval-every", type=C.positive_int, default=250,
                   help="training steps between evaluations at --max-T")
    p.add_argument("--threshold", type=C.positive_float, default=0.05,
                   help="report the steps until the eval MSE falls below this")
    p.add_argument("--clip", type=C.nonnegative_float, default=1.0,
                   help="global gradient-norm clipping, 0 for none")
    p.add_argument("--out", default="longer_sequences.png",
                   help="the PNG to write (a relative path is from the current directory)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    C.add_threads_arg(p)
    return p


def parse_args(argv):
    p = make_parser()
    args = p.parse_args(argv)
    if not 2 <= args.min_T <= args.max_T:
        p.error(f"need 2 <= --min-T <= --max-T, got --min-T {args.min_T} and "
                f"--max-T {args.max_T}")
    if min(args.eval_T) < 2:
        p.error(f"--eval-T lengths must be at least 2, got {args.eval_T}")
    return args


def main(argv=None):
    """Runs the example with command-line arguments argv (a list; None for
    sys.argv); returns the results as a dict."""
    args = parse_args(argv)
    with C.thread_count(args.threads) as threads:
        return run(args, threads)


def run(args, threads):
    t_start = time.perf_counter()
    lengths = sorted(set(args.eval_T) | {args.max_T})
    sets = eval_sets(lengths, args.eval_size)
    baseline = {T: C.mse(np.ones_like(t), t)[0] for T, (_, t) in sets.items()}
    C.say(f"adding problem: train T in [{args.min_T}, {args.max_T}], {args.steps} steps of "
          f"batch {args.batch_size}, hidden {args.hidden}, lrs {[f'{lr:g}' for lr in args.lrs]} "
          f"({args.schedule}), clip {args.clip:g}, seeds {args.seeds}; eval T {lengths} "
          f"({args.eval_size} sequences each); {threads} fastln thread(s)")
    curves, finals, walls = {}, {}, {}
    total = len(args.lrs) * len(args.seeds) * len(MODELS) * args.steps
    with C.progress(total, "training", not args.no_progress) as bar:
        for lr in args.lrs:
            for seed in args.seeds:
                for label, cls_name in MODELS:
                    bar.set_description(f"lr={lr:g} seed={seed} {label}")
                    with C.timer(walls, (lr, label)):
                        curves[lr, label, seed], finals[lr, label, seed] = train_run(
                            cls_name, seed, lr, args, sets, bar, label)

    for lr in args.lrs:
        C.say(f"\nlr = {lr:g}: MSE by sequence length after training (mean ± std over "
              f"{len(args.seeds)} seed(s); trained on T <= {args.max_T}); steps until the "
              f"eval MSE at T={args.max_T} first fell below {args.threshold:g} (per seed)")
        C.say("| model | " + " | ".join(f"T={T}" for T in lengths)
              + f" | steps to {args.threshold:g} | train time (s) |")
        C.say("|---" * (len(lengths) + 3) + "|")
        C.say("| predict 1.0 | " + " | ".join(f"{baseline[T]:.3f}" for T in lengths)
              + " | | |")
        for label, _ in MODELS:
            reach = []
            for s in args.seeds:
                hit = [step for step, m in curves[lr, label, s] if m < args.threshold]
                reach.append(str(hit[0]) if hit else f">{args.steps}")
            C.say(f"| {label} | "
                  + " | ".join(C.fmt_ms([finals[lr, label, s][T] for s in args.seeds], 4)
                               for T in lengths)
                  + f" | {', '.join(reach)} | {walls[lr, label]:.1f} |")

    steps = [s for s, _ in curves[args.lrs[0], MODELS[0][0], args.seeds[0]]]
    panels = []
    for lr in args.lrs:
        panels.append([
            (f"lr {lr:g}: eval MSE at T={args.max_T} during training", "training step",
             {label: (steps, [[m for _, m in curves[lr, label, s]] for s in args.seeds])
              for label, _ in MODELS}),
            (f"lr {lr:g}: MSE by length after training", "sequence length T",
             {label: (lengths, [[finals[lr, label, s][T] for T in lengths]
                                for s in args.seeds])
              for label, _ in MODELS}),
        ])
    C.plot_curves(args.out, panels, "MSE (log scale)",
                  f"adding problem, tanh, H={args.hidden}, trained on T in [{args.min_T}, "
                  f"{args.max_T}], Adam ({args.schedule}), {len(args.seeds)} seed(s): "
                  f"mean and min-max band", logy=True,
                  hline=(BASELINE, "predict 1.0"))
    wall = time.perf_counter() - t_start
    C.say(f"wrote {args.out}")
    C.say(f"wall time: {wall:.1f} s")
    return {"curves": curves, "finals": finals, "baseline": baseline, "walls": walls,
            "wall": wall, "out": args.out}


if __name__ == "__main__":
    main()
