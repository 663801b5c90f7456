"""Per-token latency of the RNN-T predictor of torchaudio's emformer_rnnt_base
(examples/emformer_predictor.py): fastln's step against torchaudio's module
in eager PyTorch and against ONNX Runtime on the exported predictor.

    python bench/predictor.py [--quick] [--threads 2] [--batch 1,8] [--json PATH]

The predictor (embedding 4097 x 512, LayerNorm, three LN-LSTM layers of 512,
Linear 512 -> 1024, LayerNorm; 8.9 M parameters, 36 MB in float32) is
torchaudio's ``emformer_rnnt_base(4097).predictor`` in eval mode, from
torchaudio's models/rnnt.py of the pinned wheel (tests/_upstream.py: it needs
pip and the network the first time, and pytest), its LayerNorms' gains and
biases moved off 1 and 0. Each peer steps B streams by one token each from the
state of a few earlier tokens:

- fastln: the example's ``Predictor.step`` (the LSTM layers in fastln's
  engine, the Linear in NumPy, a row at a time), the state updated in place;
  and the same with its LSTM layers in bfloat16 (``.to(ml_dtypes.bfloat16)``,
  where ml_dtypes is installed) and int8 (``fastln.rnn.quantize``), whose
  differences from torchaudio's step are reported, not checked;
- torchaudio: the module's forward over one token with the state, as
  torchaudio's decoders call it, under ``torch.inference_mode()``;
- ONNX Runtime: the module's one-token step (tokens, h, c) -> (y, h, c),
  exported by ``torch.onnx.export`` (the TorchScript exporter, opset 17, B
  dynamic), on the CPU with ``intra_op_num_threads`` = the thread count.

Before timing, fastln's and ONNX Runtime's outputs and new states must agree
with torchaudio's within rtol = atol = 1e-4, else AssertionError. The threads:
torch.set_num_threads(n) first (torch may share fastln's libgomp), then
fastln's; NumPy's product runs on one OpenBLAS thread (OPENBLAS_NUM_THREADS=1,
as the example sets it: two threads of OpenBLAS beside fastln's contend for
the cores).

Timing follows bench/harness.py: the peers are timed in turns in one process
(each round times each once), medians per call, ratios of medians. The
targets, at B = 1: fastln's float32 step at most 0.3x torchaudio's time and
at most 1.0x ONNX Runtime's. ONNX Runtime's rows are empty, with a note
above the table, where it is missing or the export fails.
"""
import argparse
import copy
import io
import os
import sys
import time
import warnings

if __name__ == "__main__":   # before NumPy loads OpenBLAS: see the example's
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)                           # the repository root, for an in-place build
sys.path.insert(0, os.path.join(ROOT, "examples"))

import emformer_predictor as EP  # noqa: E402
import numpy as np  # noqa: E402

import fastln  # noqa: E402
from bench import harness  # noqa: E402
from fastln import _selfcheck  # noqa: E402
from fastln import rnn as fastln_rnn  # noqa: E402

torch = harness.torch             # None when torch is not installed
ort = _selfcheck.ort              # None when onnxruntime (or onnx) is not installed

BATCHES = (1, 8)
WARM_TOKENS = 5                   # tokens stepped before the timed step, for a state that matters
TOL = 1e-4                        # rtol = atol of the checks against torchaudio's step
PEERS = {"fastln": "fastln float32", "fastln bfloat16": "fastln, LSTM bfloat16",
         "fastln int8": "fastln, LSTM int8", "torchaudio": "torchaudio (eager)",
         "onnxruntime": "ONNX Runtime"}
# the targets, at B = 1: fastln's (float32) time over the peer's at most this
TARGETS = {"torchaudio": 0.3, "onnxruntime": 1.0}


def load_module(seed=0):
    """torchaudio's emformer_rnnt_base(4097).predictor in eval mode, from the
    pinned wheel's models/rnnt.py, its LayerNorms' gains and biases moved off
    1 and 0 so that they matter."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import _upstream

    torch.manual_seed(seed)
    module = _upstream.torchaudio_rnnt().emformer_rnnt_base(EP.NUM_SYMBOLS).predictor.eval()
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return module


if torch is not None:
    class OneToken(torch.nn.Module):
        """torchaudio's predictor over one token per stream, its state as two
        tensors, for the export: (tokens (B,), h, c (layers, B, H)) -> (y (B, D), h, c)."""

        def __init__(self, predictor):
            super().__init__()
            self.predictor = predictor

        def forward(self, tokens, h, c):
            state = [[h[k], c[k]] for k in range(h.shape[0])]
            y, _, state = self.predictor(tokens[:, None], torch.ones_like(tokens), state)
            return y[:, 0], torch.stack([s[0] for s in state]), torch.stack([s[1] for s in state])


def export_onnx(module):
    """The ONNX model (an onnx.ModelProto) of module's one-token step, B dynamic."""
    import onnx

    step = OneToken(module).eval()
    layers, H = len(module.lstm_layers), module.lstm_layers[0].hidden_dim
    args = (torch.zeros(1, dtype=torch.int64), torch.zeros(layers, 1, H), torch.zeros(layers, 1, H))
    names = {"tokens": {0: "B"}, "h": {1: "B"}, "c": {1: "B"},
             "y": {0: "B"}, "h_out": {1: "B"}, "c_out": {1: "B"}}
    f = io.BytesIO()
    with warnings.catch_warnings():      # the TorchScript exporter is deprecated, and still works
        warnings.simplefilter("ignore")
        torch.onnx.export(step, args, f, dynamo=False, opset_version=17,
                          input_names=["tokens", "h", "c"], output_names=["y", "h_out", "c_out"],
                          dynamic_axes=names)
    module.eval()                        # export restores the wrapper's train mode: undone
    return onnx.load_from_string(f.getvalue())


def _max_diff(got, want):
    """The largest |difference| between the arrays of got and want (None where
    a shape differs)."""
    got = [np.asarray(g, np.float32) for g in got]
    if any(g.shape != w.shape for g, w in zip(got, want)):
        return None
    return max(float(np.abs(g - w).max()) for g, w in zip(got, want))


def _check(label, got, want):
    """got's largest |difference| from want; AssertionError unless every array
    of got is within TOL of want's."""
    err = _max_diff(got, want)
    if err is None or not all(np.allclose(g, w, rtol=TOL, atol=TOL) for g, w in zip(got, want)):
        raise AssertionError(f"{label}: its output or state disagrees with torchaudio's step: "
                             f"max|diff| = {err} (rtol=atol={TOL:g}); not timing it")
    return err


def fastln_models(predictor):
    """{peer: Predictor}: the float32 predictor, and copies with its LSTM
    layers in bfloat16 (where ml_dtypes is installed) and int8."""
    models = {"fastln": predictor, "fastln int8": copy.copy(predictor)}
    models["fastln int8"].lstm = fastln_rnn.quantize(predictor.lstm)
    if harness.ml_dtypes is not None:
        models["fastln bfloat16"] = copy.copy(predictor)
        models["fastln bfloat16"].lstm = predictor.lstm.to(harness.ml_dtypes.bfloat16)
    return models


def _bench_batch(B, module, models, onnx_model, nthreads, kw, gap, seed=0):
    """One batch size: a row with 'times' (median s per step, None for a peer
    not set up) and 'maxdiff' (its largest |difference| from torchaudio's
    step, output and state) of each peer."""
    row = {"B": B, "times": dict.fromkeys(PEERS), "maxdiff": dict.fromkeys(PEERS)}
    rng = np.random.default_rng(seed + B)
    tokens = rng.integers(0, EP.BLANK, (B, WARM_TOKENS + 1))
    tokens[:, 0] = EP.BLANK
    warm, token = tokens[:, :WARM_TOKENS], tokens[:, WARM_TOKENS]
    token_t, lengths = torch.from_numpy(token[:, None]), torch.ones(B)
    with torch.inference_mode():
        _, _, state_t = module(torch.from_numpy(warm), torch.full((B,), WARM_TOKENS))
        y_t, _, new_t = module(token_t, lengths, state_t)
    want = [y_t[:, 0].numpy()] + [np.stack([s[i].numpy() for s in new_t]) for i in (0, 1)]
    start = [np.stack([s[i].numpy() for s in state_t]) for i in (0, 1)]

    def torch_step():
        with torch.inference_mode():
            return module(token_t, lengths, state_t)
    fns = {"torchaudio": torch_step}
    row["maxdiff"]["torchaudio"] = 0.0
    for peer, predictor in models.items():
        state = tuple(s.copy() for s in start)
        got = [predictor.step(token, state), *state]
        lossy = peer != "fastln"            # bfloat16, int8: reported, not checked
        row["maxdiff"][peer] = _max_diff(got, want) if lossy else _check(f"{peer} B={B}", got,
                                                                          want)
        fns[peer] = lambda predictor=predictor, state=state: predictor.step(token, state)
    if onnx_model is not None:
        session = _selfcheck.ort_session_of(onnx_model, nthreads)
        feed = {"tokens": token, "h": start[0], "c": start[1]}
        row["maxdiff"]["onnxruntime"] = _check(f"ONNX Runtime B={B}", session.run(None, feed),
                                               want)
        fns["onnxruntime"] = lambda: session.run(None, feed)
    row["times"].update(_selfcheck.time_peers(fns, gap=gap, **kw))
    return row


def timing_kw(quick):
    return (dict(repeats=5, budget=0.5, min_sample=2e-3, min_repeats=3) if quick
            else dict(repeats=21, budget=3.0, min_sample=5e-3, min_repeats=7))


def run(threads=(2,), quick=False, batches=BATCHES, timing=None, module=None):
    """Every batch size at each thread count. Returns a JSON-friendly dict:
    'info', 'quick', 'elapsed_s', 'onnx' (why ONNX Runtime is not timed, or
    None), 'results': [{'threads', 'rows'}]."""
    if torch is None:
        raise RuntimeError("the predictor benchmark needs torch")
    kw = timing or timing_kw(quick)
    info = harness.machine_info()
    t0 = time.perf_counter()
    module = module if module is not None else load_module()
    models = fastln_models(EP.Predictor.from_torch(module))
    onnx_model, onnx_note = None, None
    if ort is None:
        onnx_note = "onnxruntime is not installed"
    else:
        try:
            onnx_model = export_onnx(module)
        except Exception as e:
            onnx_note = f"the ONNX export failed: {type(e).__name__}: {e}"
    results = []
    saved = harness.peer_threads()   # restored after: the limit outlives the run otherwise
    try:
        with _selfcheck.OtherLoad() as load:
            for n in threads:
                harness.set_peer_threads(n)      # first: torch may share fastln's libgomp
                gap = _selfcheck.SPIN_GAP if n > 1 else 0.0
                with fastln.threads(n):
                    rows = [_bench_batch(B, module, models, onnx_model, n, kw, gap)
                            for B in batches]
                results.append({"threads": n, "rows": rows})
    finally:
        harness.restore_peer_threads(saved)
    info["cpu_other_load"] = load.fraction
    return {"info": info, "quick": quick, "elapsed_s": time.perf_counter() - t0,
            "onnx": onnx_note, "results": results}


# ---- formatting -------------------------------------------------------------------

def _ms(t):
    return "-" if t is None else f"{t * 1e3:.3f}"


def _x(a, b):
    return "-" if a is None or b is None else f"{a / b:.2f}x"


def table_rows(rows):
    """The cells of one thread count's table: a row per batch size and peer,
    its ms, its time over each target peer's and its max|diff| from torchaudio."""
    heads = ["B", "case", "ms"] + [f"/ {PEERS[p]}" for p in TARGETS] + ["max|diff|"]
    cells = []
    for r in rows:
        t = r["times"]
        for peer, label in PEERS.items():
            diff = r["maxdiff"][peer]
            cells.append([str(r["B"]), label, _ms(t[peer])] + [_x(t[peer], t[p]) for p in TARGETS]
                         + ["-" if diff is None else f"{diff:.1e}"])
    return heads, cells


def targets(rows):
    """{peer: (fastln float32's time over the peer's at B = 1, met)}, or {}
    without a B = 1 row; a ratio is None where the peer was not timed."""
    for r in rows:
        if r["B"] == 1:
            t = r["times"]
            ratios = {p: (t["fastln"] / t[p] if t[p] is not None else None) for p in TARGETS}
            return {p: (q, q is not None and q <= TARGETS[p]) for p, q in ratios.items()}
    return {}


def format_table(result, markdown=False):
    lines = []
    if result.get("onnx"):
        lines += [f"ONNX Runtime is not timed: {result['onnx']}", ""]
    for res in result["results"]:
        n = res["threads"]
        title = f"{n} thread{'s' if n > 1 else ''}"
        lines += [f"### {title}" if markdown else f"{title}:", "",
                  "one token per stream, ms per step (median); max|diff|: from torchaudio's "
                  "step, output and state:", ""]
        lines += harness.table_lines(*table_rows(res["rows"]), markdown)
        met = targets(res["rows"])
        if met:
            lines += ["", "targets at B = 1, fastln float32: " + "; ".join(
                f"<= {TARGETS[p]:.1f}x {PEERS[p]}: "
                + ("-" if q is None else f"{q:.2f}x, {'met' if ok else 'NOT met'}")
                for p, (q, ok) in met.items())]
        lines.append("")
    return "\n".join(lines).rstrip("\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer samples")
    ap.add_argument("--threads", default="2", help="comma-separated thread counts (default 2)")
    ap.add_argument("--batch", default=",".join(map(str, BATCHES)),
                    help="comma-separated batch sizes (default 1,8)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = ap.parse_args(argv)
    nthreads = harness.parse_threads(ap, args.threads)
    batches = harness.parse_counts(ap, args.batch, "--batch")
    if args.json is not None:
        _selfcheck.check_output_path(ap, "--json", args.json)
    if torch is None:
        print("torch is not installed: the predictor benchmark has nothing to run",
              file=sys.stderr)
        return 1
    try:
        module = load_module()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:   # tests/_upstream.py's pytest.skip where the wheel cannot be had
        print(f"torchaudio's predictor cannot be had ({type(e).__name__}: {e}): nothing to "
              "compare with", file=sys.stderr)
        return 1
    harness.warn_if_busy()
    print(f"fastln {fastln.__version__}, torch {torch.__version__}, onnxruntime "
          f"{getattr(ort, '__version__', None)}, RNN-T predictor benchmark, threads {nthreads}"
          f"{' (quick)' if args.quick else ''} ...", flush=True)
    result = run(threads=nthreads, quick=args.quick, batches=batches, module=module)
    print()
    print(format_table(result))
    harness.report_and_save(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
