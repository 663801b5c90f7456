"""The LN-LSTM of sequential_digits.py on the 8x8 digits, trained from a plain PyTorch loop.

The model is an ``nn.Module`` holding a ``fastln.torch.LNLSTM`` and a
``torch.nn.Linear`` readout of its last output. It trains with
``torch.optim.Adam``, cross-entropy, a ``DataLoader`` and gradient-norm
clipping by ``torch.nn.utils.clip_grad_norm_`` (--clip, 0 for none), on the
data of sequential_digits.py (its ``load_data``: the same pixel order, split
and --pixels-per-step) with its defaults (hidden size, epochs, batch size,
learning rates, seeds).

Each run starts from the NumPy example's LN-LSTM run of the same seed:

- the same initial weights: the LN-LSTM is ``fastln.rnn.LNLSTM(..., seed=seed)``
  made a torch module by ``fastln.torch.LNLSTM.from_rnn``, and the readout
  takes the NumPy example's initial readout (its ``_common.Linear`` draw);
- the same batches in the same order: the DataLoader's batch sampler draws
  them as the NumPy example does (``_common.minibatches``, same generator);
- the same LN-LSTM forward and backward (fastln's engine: bitwise those of
  fastln.rnn on the same weights) and the same Adam: torch.optim.Adam's
  defaults are the NumPy Adam's (betas, eps added to the bias-corrected
  root of the second moment, bias corrections), and clip_grad_norm_ scales
  by clip / (norm + 1e-6) as it does.

What is not identical is float32 rounding outside the engine: the readout's
product, the cross-entropy and its gradient, the order of Adam's float32
operations, and the clipping norm (float32 sums in PyTorch, float64 in the
NumPy Adam). The two runs start equal and drift apart by these roundings,
which training amplifies: their accuracies compare as two runs of the same
experiment, not bit for bit. --numpy trains the NumPy example's LN-LSTM on
the same seeds and learning rates and prints both.

It prints the test accuracy after every epoch and a summary (accuracy by
epoch, mean ± std over seeds; epochs to reach --threshold; wall time).

    python examples/sequential_digits_torch.py                  # 3 seeds, lr 3e-3 and 1e-2
    python examples/sequential_digits_torch.py --seeds 1 --lrs 3e-3 --numpy

The LN-LSTM runs on fastln's threads (--threads), the readout, loss and
optimizer on torch's (--torch-threads); where the two share one OpenMP runtime
(torch's Linux wheels), torch's count also caps fastln's. The results do not
depend on fastln's thread count, but torch's readout and loss round
differently with torch's. On a machine busy with other work,
``--torch-threads 1`` (one thread for both) is much faster.

Needs torch, scikit-learn and tqdm.
"""
import contextlib
import os
import sys
import time

import numpy as np
import torch

import fastln.rnn
import fastln.torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sequential_digits as D  # noqa: E402

import _common as C  # noqa: E402

TORCH, NUMPY = "LN-LSTM (torch)", "LN-LSTM (NumPy)"   # the summary's labels


class DigitClassifier(torch.nn.Module):
    """An LN-LSTM over a batch of pixel sequences (B, T, pixels per step) and
    a linear readout of its output at the last step: the logits (B, 10)."""

    def __init__(self, lstm, n_classes):
        super().__init__()
        self.lstm = lstm
        self.head = torch.nn.Linear(lstm.hidden_size, n_classes)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.head(y[:, -1])


def make_model(input_size, hidden, seed):
    """The classifier with the initial weights of the NumPy example's LN-LSTM
    run of seed: fastln.rnn's seeded LN-LSTM and the readout drawn as
    sequential_digits.train_run draws it."""
    rnn = fastln.rnn.LNLSTM(input_size, hidden, batch_first=True, seed=seed)
    model = DigitClassifier(fastln.torch.LNLSTM.from_rnn(rnn), D.N_CLASSES)
    head = C.Linear(hidden, D.N_CLASSES, np.random.default_rng([seed, 1]))
    with torch.no_grad():
        for name, value in head.params.items():
            getattr(model.head, name).copy_(torch.from_numpy(value))
    return model


class SeededBatches(torch.utils.data.Sampler):
    """A DataLoader's batch sampler giving the NumPy example's batches of
    seed: each epoch, the index batches of a fresh permutation of range(n)
    (_common.minibatches), from the same generator."""

    def __init__(self, n, batch_size, seed):
        self.n, self.batch_size = n, batch_size
        self.rng = np.random.default_rng([seed, 2])

    def __iter__(self):
        return iter([b.tolist() for b in C.minibatches(self.n, self.batch_size, self.rng)])

    def __len__(self):
        return -(-self.n // self.batch_size)


def batch_first(x):
    """load_data's time-major (T, N, I) array as a (N, T, I) tensor."""
    return torch.from_numpy(np.ascontiguousarray(x.transpose(1, 0, 2)))


def accuracy(model, x, y):
    """The fraction of the images x (N, T, I) that model classifies as y."""
    model.eval()
    with torch.no_grad():
        return float((model(x).argmax(dim=1) == y).double().mean())


def train_run(data, seed, lr, args, bar):
    """Trains one model from the NumPy example's start for seed; returns the
    list of (train loss, test accuracy) per epoch and the model."""
    x_tr, y_tr, x_te, y_te = data
    model = make_model(x_tr.shape[2], args.hidden, seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x_tr, y_tr),
        batch_sampler=SeededBatches(len(y_tr), args.batch_size, seed))
    history = []
    for _ in range(args.epochs):
        model.train()
        losses = []
        for xb, yb in loader:
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            if args.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            losses.append(loss.item())
            bar.update(1)
        history.append((float(np.mean(losses)), accuracy(model, x_te, y_te)))
    return history, model


def make_parser():
    """The command line's parser: sequential_digits.py's (but --out), --numpy
    and --torch-threads."""
    p = D.make_parser(__doc__, png=False)
    p.add_argument("--numpy", action="store_true",
                   help="also train the NumPy example's LN-LSTM on the same seeds and "
                   "learning rates, and print both")
    p.add_argument("--torch-threads", type=C.positive_int, default=None,
                   help="torch's thread count (the readout, loss and optimizer); None keeps "
                   "torch's own")
    return p


def parse_args(argv):
    return make_parser().parse_args(argv)


def main(argv=None):
    """Runs the example with command-line arguments argv (a list; None for
    sys.argv); returns the results as a dict."""
    args = parse_args(argv)
    # where torch and fastln share one OpenMP runtime, torch's count is also
    # fastln's default, and caps a count of fastln's that is larger
    with torch_threads(args.torch_threads), C.thread_count(args.threads) as threads:
        return run(args, threads)


@contextlib.contextmanager
def torch_threads(n):
    """Runs the block with torch's thread count set to n (unchanged if None),
    and restores the previous one afterwards."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run(args, threads):
    t_start = time.perf_counter()
    data = D.load_data(args.pixels_per_step, args.perm_seed, args.subset,
                       binarize=args.binarize)
    tensors = (batch_first(data[0]), torch.from_numpy(data[1]),
               batch_first(data[2]), torch.from_numpy(data[3]))
    T, n_train, _ = data[0].shape
    C.say(f"digits: {n_train} train / {data[2].shape[1]} test images, "
          f"{args.pixels_per_step} pixel(s) per step (T={T}){' binarized' * args.binarize}, "
          f"hidden {args.hidden}, batch {args.batch_size}, {args.epochs} epochs, "
          f"seeds {args.seeds}, lrs {[f'{lr:g}' for lr in args.lrs]}, clip {args.clip:g}, "
          f"{threads} fastln thread(s), {torch.get_num_threads()} torch thread(s)")
    labels = [TORCH, NUMPY] if args.numpy else [TORCH]
    batches = -(-n_train // args.batch_size)
    total = len(args.lrs) * len(args.seeds) * len(labels) * args.epochs * batches
    results, walls = {}, {}
    with C.progress(total, "training", not args.no_progress) as bar:
        for lr in args.lrs:
            for seed in args.seeds:
                for label in labels:
                    bar.set_description(f"lr={lr:g} seed={seed} {label}")
                    with C.timer(walls, (lr, label)):
                        if label == TORCH:
                            hist, _ = train_run(tensors, seed, lr, args, bar)
                        else:
                            hist, _ = D.train_run("LNLSTM", data, seed, lr, args, bar)
                    results[lr, label, seed] = hist
                    for e, (loss, acc) in enumerate(hist, 1):
                        C.say(f"lr={lr:g} seed={seed} {label} epoch {e:2d}  "
                              f"train loss {loss:.4f}  test acc {acc:.4f}")
    D.summarize(results, args, walls, labels)
    wall = time.perf_counter() - t_start
    C.say(f"wall time: {wall:.1f} s")
    return {"results": results, "walls": walls, "wall": wall}


if __name__ == "__main__":
    main()
