"""int8 accuracy on a trained model: the LN-LSTM of examples/sequential_digits.py,
trained as the example trains it (its load_data, train_run and accuracy), then
quantized with fastln.rnn.quantize; the readout on top stays float32.

The settings are the example's defaults (4 pixels per step, T = 16, H = 128,
batch 32, Adam at lr 3e-3, all 1797 images: 1347 train, 450 test) but for 8
epochs instead of 15 and one seed, on one thread: a few seconds on two cores.
One thread also keeps the training's float32 rounding, and so the trained
weights, independent of the machine's core count.

Needs scikit-learn and tqdm (the examples' extra): skipped when one is
missing, unless the CI variable is set, where that is a failure.
"""
import os
import sys

import numpy as np

import fastln.rnn

from _util import require

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))

import sequential_digits as D  # noqa: E402

import _common as C  # noqa: E402

EPOCHS = 8
SEED = 0
LR = 3e-3
MIN_FLOAT_ACCURACY = 0.8     # the float model has learned the task
MAX_INT8_DROP = 0.005        # int8 loses at most half a point of test accuracy (2 of 450 images)


def _trained(data, args):
    """The float32 LN-LSTM and its readout as train_run leaves them, and the test
    accuracy train_run measured after the last epoch. train_run returns its
    optimizer, whose ``params`` are the model's and the readout's own arrays
    ("rnn.<key>", "head.<key>"): the two are rebuilt from them."""
    with C.thread_count(1), C.progress(0, "training", False) as bar:
        history, opt = D.train_run("LNLSTM", data, SEED, LR, args, bar)
    model = C.rnn_class("LNLSTM")(data[0].shape[2], args.hidden)
    model.load_state_dict({k[len("rnn."):]: v for k, v in opt.params.items()
                           if k.startswith("rnn.")})
    head = C.Linear(args.hidden, D.N_CLASSES, np.random.default_rng(0))
    head.params = {k[len("head."):]: v for k, v in opt.params.items() if k.startswith("head.")}
    return model, head, history[-1][1]


def test_int8_lnlstm_keeps_digits_accuracy():
    require("sklearn")
    require("tqdm")
    args = D.parse_args(["--epochs", str(EPOCHS), "--no-progress"])
    data = D.load_data(args.pixels_per_step, args.perm_seed, args.subset,
                       binarize=args.binarize)
    x_te, y_te = data[2], data[3]
    model, head, trained_acc = _trained(data, args)
    q = fastln.rnn.quantize(model)
    assert q.params["weight_hh_l0"].dtype == np.int8 and type(q) is type(model)
    with C.thread_count(1):
        acc32 = D.accuracy(model, head, x_te, y_te)
        acc8 = D.accuracy(q, head, x_te, y_te)
    msg = (f"test accuracy over {len(y_te)} images: float32 {acc32:.4f}, int8 {acc8:.4f} "
           f"(drop {acc32 - acc8:+.4f}; int8 kernel {fastln.rnn.int8_products()})")
    print(msg)
    # the rebuilt model is the one train_run scored
    assert acc32 == trained_acc, msg + f"; train_run's last epoch: {trained_acc:.4f}"
    assert acc32 >= MIN_FLOAT_ACCURACY, msg
    assert acc8 >= acc32 - MAX_INT8_DROP, msg
