"""LN-LSTM against a plain LSTM on scikit-learn's 8x8 digits read as a sequence.

Each 8x8 image (pixel values scaled to [0, 1]) is flattened, its 64 pixels are
put in a fixed random order (the same for every model and seed), and the
sequence is fed ``--pixels-per-step`` pixels at a time: 4 by default, so
T = 16 steps of 4 inputs. A linear readout on the last hidden state predicts
the digit. Both models get the same initial weights where they share them
(weight_ih, weight_hh), the same readout, the same batch order and the same
Adam (written in NumPy, examples/_common.py) for each seed and learning rate.

It prints the test accuracy after every epoch, a summary (accuracy by epoch,
mean ± std over seeds; epochs to pass 0.85; wall time) and writes a
learning-curve PNG (sequential_digits.png in the current directory unless
--out says otherwise): one panel per learning rate, mean and min-max band over
seeds for each model.

    python examples/sequential_digits.py                      # 3 seeds, lr 3e-3 and 1e-2
    python examples/sequential_digits.py --pixels-per-step 1 --lrs 3e-3   # a pitfall

At 1 pixel per step the LN over W_ih x_t of a scalar x_t keeps only its sign (and
a 0 pixel adds nothing): docs/examples.md explains it.

Needs scikit-learn, tqdm and matplotlib.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

MODELS = [("LN-LSTM", "LNLSTM"), ("LSTM", "LSTM")]   # (label, fastln.rnn class)
N_CLASSES = 10


def load_data(pixels_per_step, perm_seed=0, subset=None, test_size=0.25, split_seed=0,
              binarize=False):
    """(x_train, y_train, x_test, y_test): x time-major (T, N, pixels_per_step) float32,
    in [0, 1] (with binarize, 1 where a pixel is not 0)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if 64 % pixels_per_step:
        raise SystemExit(f"--pixels-per-step must divide 64, got {pixels_per_step}")
    images, labels = load_digits(return_X_y=True)
    pixels = (images / 16.0).astype(np.float32)
    if binarize:
        pixels = (pixels > 0).astype(np.float32)
    pixels = pixels[:, np.random.default_rng(perm_seed).permutation(64)]
    x_tr, x_te, y_tr, y_te = train_test_split(pixels, labels, test_size=test_size,
                                              random_state=split_seed, stratify=labels)
    if subset:
        x_tr, y_tr = x_tr[:subset], y_tr[:subset]
        n_test = max(subset // 3, 1)
        x_te, y_te = x_te[:n_test], y_te[:n_test]
    T = 64 // pixels_per_step

    def seq(x):
        return np.ascontiguousarray(x.reshape(len(x), T, pixels_per_step).transpose(1, 0, 2))

    return seq(x_tr), y_tr.astype(np.int64), seq(x_te), y_te.astype(np.int64)


def accuracy(model, head, x, y):
    out, _ = model.forward(x, cache=False)
    return float(np.mean(head(out[-1]).argmax(axis=1) == y))


def train_run(cls_name, data, seed, lr, args, bar):
    """Trains one model; returns the list of (train loss, test accuracy) per
    epoch and the optimizer."""
    x_tr, y_tr, x_te, y_te = data
    model = C.rnn_class(cls_name)(x_tr.shape[2], args.hidden, seed=seed)
    head = C.Linear(args.hidden, N_CLASSES, np.random.default_rng([seed, 1]))
    order_rng = np.random.default_rng([seed, 2])
    opt = C.Adam(C.joint(model, head, "params"), lr=lr, clip=args.clip)
    history = []
    for _ in range(args.epochs):
        losses = []
        for idx in C.minibatches(x_tr.shape[1], args.batch_size, order_rng):
            xb = np.ascontiguousarray(x_tr[:, idx])
            out, _ = model.forward(xb)
            loss, dlogits = C.softmax_cross_entropy(head(out[-1]), y_tr[idx])
            model.backward(C.last_step_grad(out, head.backward(dlogits)))
            opt.step(C.joint(model, head, "grads"))
            losses.append(loss)
            bar.update(1)
        history.append((float(np.mean(losses)), accuracy(model, head, x_te, y_te)))
    return history, opt


def epochs_to(accs, threshold):
    """The first epoch (1-based) whose accuracy is at least threshold, or None."""
    hits = np.nonzero(np.asarray(accs) >= threshold)[0]
    return int(hits[0]) + 1 if hits.size else None


def summarize(results, args, walls, labels=None):
    """Prints the summary table (markdown) of the models labels (default: those
    of MODELS) and returns its lines."""
    labels = labels or [label for label, _ in MODELS]
    lines = []
    E = args.epochs
    shown = sorted({1, 2, 3, 4, 5, 8, 10, 12, 15, E} & set(range(1, E + 1)))
    for lr in args.lrs:
        lines.append(f"\nlr = {lr:g}: test accuracy by epoch, mean ± std over "
                     f"{len(args.seeds)} seed(s)")
        lines.append("| model | " + " | ".join(f"ep {e}" for e in shown)
                     + f" | epochs to {args.threshold:g} | train time (s) |")
        lines.append("|---" * (len(shown) + 3) + "|")
        for label in labels:
            accs = np.array([[a for _, a in results[lr, label, s]] for s in args.seeds])
            cells = [C.fmt_ms(accs[:, e - 1]) for e in shown]
            reach = [epochs_to(a, args.threshold) for a in accs]
            reach = ", ".join(str(r) if r is not None else f">{E}" for r in reach)
            lines.append(f"| {label} | " + " | ".join(cells)
                         + f" | {reach} | {walls[lr, label]:.1f} |")
    for line in lines:
        C.say(line)
    return lines


def pixels_per_step(text):
    """A positive divisor of 64 (the pixels fed per time step)."""
    value = C.positive_int(text)
    if 64 % value:
        raise argparse.ArgumentTypeError(f"expected a divisor of 64, got {text!r}")
    return value


def make_parser(description=__doc__, png=True):
    """The command line's parser (every option shows its default in --help):
    its description is the first paragraph of description; --out, the PNG,
    only with png."""
    p = argparse.ArgumentParser(description=description.split("\n\n")[0],
                                formatter_class=C.HelpFormatter)
    p.add_argument("--epochs", type=C.positive_int, default=15,
                   help="passes over the training images")
    p.add_argument("--seeds", type=C.seed_list, default="3",
                   help="a count (3: seeds 0,1,2) or a comma-separated list of seeds")
    p.add_argument("--lrs", type=C.float_list, default="3e-3,1e-2",
                   help="comma-separated learning rates, each a run")
    p.add_argument("--hidden", type=C.positive_int, default=128,
                   help="hidden size H of the recurrent models")
    p.add_argument("--pixels-per-step", type=pixels_per_step, default=4,
                   help="pixels fed per time step, a divisor of 64; T = 64 / this")
    p.add_argument("--batch-size", type=C.positive_int, default=32,
                   help="images per training batch")
    p.add_argument("--clip", type=C.nonnegative_float, default=0.0,
                   help="global gradient-norm clipping, 0 for none")
    p.add_argument("--perm-seed", type=C.nonnegative_int, default=0,
                   help="seed of the fixed pixel order")
    p.add_argument("--threshold", type=C.fraction, default=0.85,
                   help="the test accuracy whose first epoch the summary reports")
    p.add_argument("--binarize", action="store_true",
                   help="feed 1 for every pixel that is not 0 (drops the intensities)")
    p.add_argument("--subset", type=C.positive_int, default=None,
                   help="train on this many images and test on a third as many (smoke "
                   "tests); None uses all")
    if png:
        p.add_argument("--out", default=argparse.SUPPRESS,
                       help="the PNG to write (default: sequential_digits.png in the current "
                       "directory, with _<n>px and _binary added to the name for another "
                       "--pixels-per-step and for --binarize)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    C.add_threads_arg(p)
    return p


def parse_args(argv):
    args = make_parser().parse_args(argv)
    if not hasattr(args, "out"):
        name = "sequential_digits"
        if args.pixels_per_step != 4:
            name += f"_{args.pixels_per_step}px"
        if args.binarize:
            name += "_binary"
        args.out = name + ".png"
    return args


def main(argv=None):
    """Runs the example with command-line arguments argv (a list; None for
    sys.argv); returns the results as a dict."""
    args = parse_args(argv)
    with C.thread_count(args.threads) as threads:
        return run(args, threads)


def run(args, threads):
    t_start = time.perf_counter()
    data = load_data(args.pixels_per_step, args.perm_seed, args.subset,
                     binarize=args.binarize)
    T, n_train, I = data[0].shape
    C.say(f"digits: {n_train} train / {data[2].shape[1]} test images, "
          f"{args.pixels_per_step} pixel(s) per step (T={T}){' binarized' * args.binarize}, "
          f"hidden {args.hidden}, "
          f"batch {args.batch_size}, {args.epochs} epochs, seeds {args.seeds}, "
          f"lrs {[f'{lr:g}' for lr in args.lrs]}, {threads} fastln thread(s)")
    batches = -(-n_train // args.batch_size)
    total = len(args.lrs) * len(args.seeds) * len(MODELS) * args.epochs * batches
    results, walls = {}, {}
    with C.progress(total, "training", not args.no_progress) as bar:
        for lr in args.lrs:
            for seed in args.seeds:
                for label, cls_name in MODELS:
                    bar.set_description(f"lr={lr:g} seed={seed} {label}")
                    with C.timer(walls, (lr, label)):
                        hist, opt = train_run(cls_name, data, seed, lr, args, bar)
                    results[lr, label, seed] = hist
                    for e, (loss, acc) in enumerate(hist, 1):
                        C.say(f"lr={lr:g} seed={seed} {label:<7} epoch {e:2d}  "
                              f"train loss {loss:.4f}  test acc {acc:.4f}")
                    if C.adam_note(opt):
                        C.say(C.adam_note(opt))
    summarize(results, args, walls)
    epochs = np.arange(1, args.epochs + 1)
    panels = [(f"lr = {lr:g}", "epoch",
               {label: (epochs, [[a for _, a in results[lr, label, s]] for s in args.seeds])
                for label, _ in MODELS})
              for lr in args.lrs]
    C.plot_curves(args.out, panels, "test accuracy",
                  f"8x8 digits as permuted pixel sequences, {args.pixels_per_step} px/step "
                  f"(T={T}), H={args.hidden}, Adam, {len(args.seeds)} seed(s): "
                  f"mean and min-max band",
                  hline=(args.threshold, f"{args.threshold:g}"), ylim=(0.0, 1.0))
    wall = time.perf_counter() - t_start
    C.say(f"wrote {args.out}")
    C.say(f"wall time: {wall:.1f} s")
    return {"results": results, "walls": walls, "wall": wall, "out": args.out}


if __name__ == "__main__":
    main()
