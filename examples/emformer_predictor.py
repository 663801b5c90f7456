"""The RNN-T predictor of torchaudio's Emformer model, stepped one token at a time with fastln.

torchaudio's ``emformer_rnnt_base`` (the model of its streaming LibriSpeech
pipeline, 4097 symbols: 4096 word pieces and the blank) has a predictor
(``_Predictor`` of torchaudio/models/rnnt.py) that reads the tokens emitted so
far:

    embedding (4097 x 512) -> LayerNorm -> 3 LN-LSTM layers (_CustomLSTM, H = 512,
    eps 1e-3) -> Linear (512 -> 1024) -> LayerNorm

A decoder steps it once for every token it emits. :class:`Predictor` runs the
same network with fastln: the embedding is a NumPy lookup, the LayerNorms
``fastln.layer_norm``, the three layers one ``fastln.rnn.LNLSTM`` (its options
``gate_norm="sum", carry="normalized", gate_bias=False`` are torchaudio's
cell) stepped with ``step()``, and the Linear a NumPy product.

The run feeds a few streams their tokens as a batched greedy decoder does: at
each decoding step, only the streams that emitted a token step, together (a
random choice stands in for the joiner's). It checks that every stream's
outputs are bitwise those of the stream run alone, and times a step.

    python examples/emformer_predictor.py                    # 4 streams, 20 tokens each
    python examples/emformer_predictor.py --streams 8 --tokens 50

With torchaudio installed (working with the installed torch), the weights are
those of ``torchaudio.models.emformer_rnnt_base(4097).predictor`` as torchaudio
initializes it (load a trained checkpoint into that module for trained
weights), and the run also compares fastln's outputs with the module's forward
and times the module's step. Without it, the weights are random, of the same
shapes, and fastln runs alone.
"""
import argparse
import os
import statistics
import time

if __name__ == "__main__":
    # NumPy's product (the Linear) on one OpenBLAS thread, set before NumPy
    # loads OpenBLAS: a row times a 2 MB matrix takes tens of microseconds on
    # one, and OpenBLAS's threads and fastln's would contend for the cores
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import fastln  # noqa: E402
from fastln.rnn import LNLSTM  # noqa: E402

NUM_SYMBOLS = 4097   # torchaudio's LibriSpeech pipeline: 4096 word pieces and the blank
BLANK = 4096         # every hypothesis starts from the blank
LSTM_EPS = 1e-3      # emformer_rnnt_base's lstm_layer_norm_epsilon
NORM_EPS = 1e-5      # the input and output LayerNorms' (torch.nn.LayerNorm's default)


def frozen(a):
    """a's values in memory that nothing can write (a bytes object): the engine
    packs such a weight matrix for its kernels once and keeps it, which at this
    size (4 MB a matrix) steps faster than reading a writable one in place."""
    return np.frombuffer(np.ascontiguousarray(a).tobytes(), a.dtype).reshape(a.shape)


class Predictor:
    """torchaudio's RNN-T predictor in fastln, one token per stream per step.

    ``weights`` is the predictor's state_dict, as NumPy arrays (float32).
    """

    def __init__(self, weights, lstm_eps=LSTM_EPS, eps=NORM_EPS):
        w = {k: np.asarray(v, np.float32) for k, v in weights.items()}
        self.embedding = w["embedding.weight"]
        # torchaudio's _CustomLSTM stack: gate_norm="sum", carry="normalized", no gate bias
        self.lstm = LNLSTM.from_torch({k: v for k, v in w.items()
                                       if k.startswith("lstm_layers.")}, eps=lstm_eps)
        for key in [k for k in self.lstm.params if k.startswith("weight_")]:   # packed once
            self.lstm.params[key] = frozen(self.lstm.params[key])
        self.linear_t = w["linear.weight"].T        # h @ linear_t is torch's linear(h)
        self.linear_bias = w["linear.bias"]
        self.input_norm = w["input_layer_norm.weight"], w["input_layer_norm.bias"]
        self.output_norm = w["output_layer_norm.weight"], w["output_layer_norm.bias"]
        self.eps = eps

    @classmethod
    def from_torch(cls, module):
        """The Predictor of a torchaudio ``_Predictor`` module (its weights and eps)."""
        weights = {k: v.detach().numpy() for k, v in module.state_dict().items()}
        return cls(weights, lstm_eps=module.lstm_layers[0].g_norm.eps,
                   eps=module.input_layer_norm.eps)

    def initial_state(self, batch):
        """The state of ``batch`` streams before their first token: (h, c),
        zeros of (layers, batch, H)."""
        shape = (self.lstm.num_layers, batch, self.lstm.hidden_size)
        return np.zeros(shape, np.float32), np.zeros(shape, np.float32)

    def step(self, tokens, state):
        """The outputs (B, 1024) for one token per stream (``tokens``, B ints);
        ``state`` (h, c) moves on by these tokens, in place."""
        x = self.embedding[tokens]                                    # (B, 512), a copy
        fastln.layer_norm(x, *self.input_norm, eps=self.eps, out=x)
        h, _ = self.lstm.step(x, state, state_out=state)              # the 3 LN-LSTM layers
        y = np.empty((len(tokens), self.linear_bias.size), np.float32)
        # a row at a time: NumPy's product of one row (BLAS's gemv) sums in
        # another order than of several (gemm), and each stream's output must
        # not depend on the batch it is in (fastln's steps do not)
        for h_row, y_row in zip(h, y):
            np.matmul(h_row, self.linear_t, out=y_row)
        y += self.linear_bias
        return fastln.layer_norm(y, *self.output_norm, eps=self.eps, out=y)


def random_weights(seed=0, num_symbols=NUM_SYMBOLS, embedding=512, hidden=512, output=1024,
                   layers=3):
    """Random weights of the predictor's shapes, under its state_dict's names:
    as torch initializes them, but the LayerNorms' gains and biases moved off
    1 and 0 so that they matter."""
    rng = np.random.default_rng(seed)
    shapes = {"embedding.weight": (num_symbols, embedding),
              "input_layer_norm.weight": (embedding,), "input_layer_norm.bias": (embedding,),
              "linear.weight": (output, hidden), "linear.bias": (output,),
              "output_layer_norm.weight": (output,), "output_layer_norm.bias": (output,)}
    for k in range(layers):
        shapes.update({f"lstm_layers.{k}.x2g.weight": (4 * hidden, embedding if k == 0 else hidden),
                       f"lstm_layers.{k}.p2g.weight": (4 * hidden, hidden),
                       f"lstm_layers.{k}.g_norm.weight": (4 * hidden,),
                       f"lstm_layers.{k}.g_norm.bias": (4 * hidden,),
                       f"lstm_layers.{k}.c_norm.weight": (hidden,),
                       f"lstm_layers.{k}.c_norm.bias": (hidden,)})
    weights = {}
    for name, shape in shapes.items():
        if "norm" in name:
            value = (name.endswith("weight")) + 0.1 * rng.standard_normal(shape)
        elif name == "embedding.weight":
            value = rng.standard_normal(shape)
        else:
            bound = 1 / np.sqrt(shapes[name.replace("bias", "weight")][-1])
            value = rng.uniform(-bound, bound, shape)
        weights[name] = value.astype(np.float32)
    return weights


def decode_like(predictor, tokens, seed=0):
    """Feeds each stream its tokens (B, U) as a batched greedy decoder does:
    at each decoding step the streams that emitted a token (a random half
    here, standing in for the joiner's choice) step together, their states
    gathered into one batch and scattered back. Returns the outputs (B, U, 1024)."""
    rng = np.random.default_rng(seed)
    B, U = tokens.shape
    h, c = predictor.initial_state(B)
    fed = np.zeros(B, int)                    # tokens each stream has had
    out = np.empty((B, U, predictor.linear_bias.size), np.float32)
    while (fed < U).any():
        emit = np.flatnonzero((fed < U) & (rng.random(B) < 0.5))
        state = h.take(emit, axis=1), c.take(emit, axis=1)   # the emitting streams' batch
        out[emit, fed[emit]] = predictor.step(tokens[emit, fed[emit]], state)
        h[:, emit], c[:, emit] = state
        fed[emit] += 1
    return out


def load_torchaudio():
    """torchaudio's models/rnnt.py, or the reason it cannot be imported."""
    try:
        from torchaudio.models import rnnt
    except Exception as e:   # not installed, or its extension built for another torch
        return None, f"{type(e).__name__}: {e}"
    return rnnt, None


def fastln_step(predictor, batch):
    """A function stepping ``batch`` streams of the Predictor by one token each."""
    state = predictor.initial_state(batch)
    return lambda tokens: predictor.step(tokens, state)


def torchaudio_step(module, batch):
    """A function stepping ``batch`` streams of torchaudio's predictor by one
    token each (its forward over one token, with the state of the last)."""
    import torch

    state, lengths = None, torch.ones(batch)

    def step(tokens):
        nonlocal state
        with torch.no_grad():
            y, _, state = module(torch.from_numpy(tokens[:, None]), lengths, state)
        return y
    return step


def per_token(step, tokens, repeats=50):
    """The median seconds of step(token) over ``repeats`` tokens (B ints each)."""
    times = []
    for t in range(repeats):
        t0 = time.perf_counter()
        step(tokens[:, t % tokens.shape[1]])
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None):
    """Runs the example; returns its results as a dict."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=4, help="streams decoded together (4)")
    ap.add_argument("--tokens", type=int, default=20, help="tokens per stream (20)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the tokens and the weights (0)")
    args = ap.parse_args(argv)
    if args.streams < 1 or args.tokens < 1:
        ap.error("--streams and --tokens must be at least 1")

    rnnt, why = load_torchaudio()
    if rnnt is not None:
        module = rnnt.emformer_rnnt_base(NUM_SYMBOLS).predictor.eval()
        predictor = Predictor.from_torch(module)
        print("weights: torchaudio's emformer_rnnt_base(4097).predictor, as initialized")
    else:
        module, predictor = None, Predictor(random_weights(args.seed))
        print(f"torchaudio cannot be imported ({why}): random weights, fastln alone")

    rng = np.random.default_rng(args.seed)
    tokens = rng.integers(0, BLANK, (args.streams, args.tokens))
    tokens[:, 0] = BLANK
    out = decode_like(predictor, tokens, args.seed)
    alone = []
    for stream in tokens:                               # each stream by itself, B = 1
        state = predictor.initial_state(1)
        alone.append([predictor.step(stream[u:u + 1], state)[0] for u in range(args.tokens)])
    bitwise = bool(np.array_equal(out, np.array(alone)))
    print(f"{args.streams} streams x {args.tokens} tokens, stepped as a greedy decoder steps "
          f"them: every stream bitwise the same as alone: {'yes' if bitwise else 'NO'}")
    result = {"outputs": out, "bitwise": bitwise, "max_diff": None, "ms": {}}

    if module is not None:
        import torch

        with torch.no_grad():
            want = module(torch.from_numpy(tokens), torch.full((args.streams,), args.tokens))[0]
        result["max_diff"] = float(np.abs(out - want.numpy()).max())
        print(f"max |fastln - torchaudio's forward|: {result['max_diff']:.1e}")

    for B in sorted({1, args.streams}):
        result["ms"]["fastln", B] = fastln_ms = 1e3 * per_token(
            fastln_step(predictor, B), tokens[:B])
        line = f"a step at B={B}: fastln {fastln_ms:.2f} ms"
        if module is not None:
            result["ms"]["torchaudio", B] = torch_ms = 1e3 * per_token(
                torchaudio_step(module, B), tokens[:B])
            line += f", torchaudio {torch_ms:.2f} ms (eager PyTorch)"
        print(line)
    return result


if __name__ == "__main__":
    main()
