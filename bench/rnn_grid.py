"""Recurrent forwards over a grid of sizes: fastln against PyTorch, ONNX Runtime and OpenVINO.

    python bench/rnn_grid.py [--quick] [--threads 2] [--cells lstm,gru,rnn]
                             [--hidden 256,1024] [--batch 1,8,32,256] [--steps 100]
                             [--bf16 | --no-bf16] [--int8 | --no-int8] [--json PATH]

At each point (cell, H, B), T steps of I = 128 inputs, one layer, forward only:

- fastln: ``fastln.rnn.LSTM`` / ``GRU`` / ``RNN`` loaded from the torch module
  (``from_torch``), ``forward(x, cache=False)``;
- torch: ``torch.nn.LSTM`` / ``GRU`` / ``RNN`` under ``torch.inference_mode()``;
- onnxruntime: one ONNX ``LSTM`` / ``GRU`` / ``RNN`` node (opset 14,
  ``linear_before_reset=1`` for the GRU, as torch's) built with ``onnx.helper``
  from the same weights, in a session of ``intra_op_num_threads = n``;
- openvino: the same ONNX model compiled for OpenVINO's CPU plugin with
  ``INFERENCE_NUM_THREADS = n`` and ``INFERENCE_PRECISION_HINT = f32``.

With ``--bf16`` (the default where fastln's bfloat16 products run on AVX512-BF16
or AMX, as ``fastln.rnn._engine.bf16_products()`` says), two more columns:
fastln's bfloat16 model (``model.to(ml_dtypes.bfloat16)``) and OpenVINO with its
``bf16`` precision hint; each is compared with the other.

With ``--int8`` (the default where ONNX Runtime is installed), three more
columns for the LSTM (the ``lstm`` cell; "-" for the others), each quantized
from the same float32 weights:

- fastln int8: ``fastln.rnn.quantize(model)`` (int8 weights with a scale per
  row, x and h quantized per row at run time, int32 sums; the kernel is
  ``fastln.rnn.int8_products()``, recorded in ``info``),
  ``forward(x, cache=False)``;
- ORT int8: the ONNX model above through
  ``onnxruntime.quantization.quantize_dynamic(..., op_types_to_quantize=["LSTM"])``
  (a ``DynamicQuantizeLSTM`` node, int8 weights with a scale per matrix), in a
  session like the float32 one;
- torch int8: ``torch.ao.quantization.quantize_dynamic`` of the ``nn.LSTM``
  (``torch.qint8``, a scale per matrix) under ``torch.inference_mode()``;
  "-" (None in the JSON) where torch has no quantized engine.

The table gives their ms and two ratios: fastln int8 over ORT int8, and fastln
int8 over fastln float32. Each int8 y is compared with fastln's float32 y over
the whole sequence: more than 0.1 apart is a mismatch, and each column's
max |diff| goes to the row's ``int8_max_abs_error`` (the int8 accuracy of the
three on the same weights and inputs).

Before timing, each peer's y is checked against fastln's over the first 10 steps
(float32: rtol = atol = 1e-4, as float32 recurrences part slowly; bfloat16:
atol = 0.05 against fastln's float32; int8 as above). Timing follows
bench/harness.py: the peers in turns in one process, 0.1 s apart (ONNX
Runtime's workers spin for long after a run), medians per call, ratios of
medians (fastln / peer: below 1, fastln is faster). A peer that is not
installed gives no column. The default grid (3 cells, H in 128..2048, B in
1..256) takes about half an hour on 2 cores without the int8 columns, which
add three peers to each LSTM point; ``--quick`` times fewer samples.
"""
import argparse
import json
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

import fastln  # noqa: E402
from bench import harness  # noqa: E402
from fastln import _selfcheck  # noqa: E402
from fastln.rnn import _engine as fastln_engine  # noqa: E402

_ov = _selfcheck.import_optional("openvino")

INPUT = 128
HIDDEN = (128, 256, 512, 1024, 2048)
BATCH = (1, 8, 32, 256)
STEPS = 100
CELLS = ("lstm", "gru", "rnn")
GATES = {"lstm": 4, "gru": 3, "rnn": 1}
CHECK_STEPS = 10
TOL = 1e-4
BF16_TOL = 0.05
# int8 y against float32 y over all steps: above the int8 error of the three
# peers, far below a wrong kernel's (docs/performance.md has the evidence)
INT8_TOL = 0.1
PEERS = ("fastln", "torch", "onnxruntime", "openvino")
BF16_PEERS = ("fastln_bf16", "openvino_bf16")
INT8_PEERS = ("fastln_int8", "onnxruntime_int8", "torch_int8")
INT8_CELLS = ("lstm",)
# seconds between peers: ONNX Runtime's workers spin for longer than libgomp's
# after a run (a 12 ms gap left fastln's next call twice as slow on 2 cores)
ORT_SPIN_GAP = 0.1
# the ONNX node's gate blocks, as rows of torch's weight matrices: LSTM torch
# [i f g o] -> ONNX [i o f c]; GRU torch [r z n] -> ONNX [z r h]; RNN one block
ONNX_GATES = {"lstm": (0, 3, 1, 2), "gru": (1, 0, 2), "rnn": (0,)}


def timing_kw(quick, work):
    """time_peers' settings for a point of ``work`` multiply-adds per call."""
    big = work > 2e10   # a call of seconds: three samples
    if quick:
        return dict(repeats=3, min_sample=1e-3, budget=0.3, min_repeats=1 if big else 2)
    return dict(repeats=3 if big else 9, min_sample=2e-3, budget=3.0, min_repeats=3)


def _onnx_model(cell, module):
    """An ONNX model of one LSTM, GRU or RNN node with module's weights."""
    from onnx import TensorProto, helper, numpy_helper

    H = module.hidden_size
    order = ONNX_GATES[cell]

    def gates(a):   # torch's gate blocks (rows) in ONNX's order, with a direction axis
        a = a.detach().numpy()
        return np.concatenate([a[k * H:(k + 1) * H] for k in order])[None]
    w = {"W": gates(module.weight_ih_l0), "R": gates(module.weight_hh_l0),
         "B": np.concatenate([gates(module.bias_ih_l0), gates(module.bias_hh_l0)], axis=1)}
    extra = {"linear_before_reset": 1} if cell == "gru" else {}
    node = helper.make_node(cell.upper(), ["X", "W", "R", "B"], ["Y"], hidden_size=H, **extra)
    graph = helper.make_graph(
        [node], cell, [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["T", "B", INPUT])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["T", 1, "B", H])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


def _openvino_run(model, nthreads, precision):
    """A function x -> y of the ONNX model compiled by OpenVINO for the CPU, at
    nthreads threads and the given inference precision ("f32" or "bf16")."""
    core = _ov.Core()
    compiled = core.compile_model(core.read_model(model.SerializeToString(), b""), "CPU",
                                  {"INFERENCE_NUM_THREADS": nthreads,
                                   "INFERENCE_PRECISION_HINT": precision,
                                   "PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    return lambda x: request.infer({0: x}, share_inputs=True)[0]


def _torch_int8(module):
    """A function x (a tensor) -> y of torch's dynamic int8 copy of the
    nn.LSTM ``module``, or None where torch cannot quantize it (no quantized
    engine, or the quantization API gone)."""
    torch = _selfcheck.torch
    engines = getattr(getattr(torch.backends, "quantized", None), "supported_engines", [])
    if not [e for e in engines if e != "none"] or torch.backends.quantized.engine == "none":
        return None

    class Holder(torch.nn.Module):
        """quantize_dynamic swaps a module's children, not the module it is given."""

        def __init__(self, lstm):
            super().__init__()
            self.lstm = lstm

        def forward(self, x):
            return self.lstm(x)[0]

    def run(xt):
        with torch.inference_mode():
            return q(xt)
    try:
        with warnings.catch_warnings():   # torch.ao.quantization warns that it is deprecated
            warnings.simplefilter("ignore")
            q = torch.ao.quantization.quantize_dynamic(Holder(module), {torch.nn.LSTM},
                                                       dtype=torch.qint8)
            run(torch.zeros((1, 1, module.input_size)))
    except (AttributeError, ImportError, RuntimeError):
        return None
    return run


def _max_abs_error(y, want):
    """max |y - want| as a float; None where the shapes differ."""
    y = np.asarray(y)
    return None if y.shape != want.shape else float(np.abs(y - want).max())


def bench_point(cell, H, B, T, nthreads, quick=False, seed=0, bf16=False, int8=False):
    """One grid point: {'cell', 'H', 'B', 'T', 'threads', peer: seconds or None,
    'mismatch': [peers whose y disagreed], 'int8_max_abs_error': {int8 peer:
    max |y - fastln's float32 y| over all T steps, or None}}; the bfloat16
    peers with ``bf16``, the int8 ones with ``int8`` for an LSTM."""
    from fastln import rnn

    torch = _selfcheck.torch
    torch.manual_seed(seed)
    module = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn": torch.nn.RNN}[cell](
        INPUT, H).eval()
    model = {"lstm": rnn.LSTM, "gru": rnn.GRU, "rnn": rnn.RNN}[cell].from_torch(module)
    x = np.random.default_rng(seed).standard_normal((T, B, INPUT)).astype(np.float32)
    xt = torch.from_numpy(x)
    k = min(T, CHECK_STEPS)

    def torch_y(xt):
        with torch.inference_mode():
            return module(xt)[0]
    fns = {"fastln": lambda: model.forward(x, cache=False), "torch": lambda: torch_y(xt)}
    checks = {"torch": (lambda: torch_y(xt[:k]).numpy(), TOL)}
    onnx_model = _onnx_model(cell, module) if _selfcheck.onnx is not None else None
    if onnx_model is not None and _selfcheck.ort is not None:
        sess = _selfcheck.ort_session_of(onnx_model, nthreads, spin=True)
        fns["onnxruntime"] = lambda: sess.run(None, {"X": x})
        checks["onnxruntime"] = (lambda: sess.run(None, {"X": x[:k]})[0][:, 0], TOL)
    if onnx_model is not None and _ov is not None:
        ov32 = _openvino_run(onnx_model, nthreads, "f32")
        fns["openvino"] = lambda: ov32(x)
        checks["openvino"] = (lambda: ov32(x[:k])[:, 0], TOL)
    if bf16:
        model16 = model.to(harness.ml_dtypes.bfloat16)
        fns["fastln_bf16"] = lambda: model16.forward(x, cache=False)
        checks["fastln_bf16"] = (lambda: model16.forward(x[:k], cache=False)[0], BF16_TOL)
        if onnx_model is not None and _ov is not None:
            ov16 = _openvino_run(onnx_model, nthreads, "bf16")
            fns["openvino_bf16"] = lambda: ov16(x)
            checks["openvino_bf16"] = (lambda: ov16(x[:k])[:, 0], BF16_TOL)
    int8_ys = {}   # int8 peer -> a function giving its y over all of x
    if int8 and cell in INT8_CELLS:
        q = rnn.quantize(model)
        fns["fastln_int8"] = lambda: q.forward(x, cache=False)
        int8_ys["fastln_int8"] = lambda: q.forward(x, cache=False)[0]
        if onnx_model is not None and _selfcheck.ort_quant is not None:
            sess8 = _selfcheck.ort_session_of(_selfcheck.ort_int8_model(onnx_model), nthreads,
                                              spin=True)
            fns["onnxruntime_int8"] = lambda: sess8.run(None, {"X": x})
            int8_ys["onnxruntime_int8"] = lambda: sess8.run(None, {"X": x})[0][:, 0]
        torch8 = _torch_int8(module)
        if torch8 is not None:
            fns["torch_int8"] = lambda: torch8(xt)
            int8_ys["torch_int8"] = lambda: torch8(xt).numpy()
    want = model.forward(x[:k], cache=False)[0]
    mismatch = [p for p, (y, tol) in checks.items()
                if not np.allclose(y(), want, rtol=tol, atol=tol)]
    errors = dict.fromkeys(INT8_PEERS)
    if int8_ys:
        want_all = model.forward(x, cache=False)[0]
        errors.update({p: _max_abs_error(y(), want_all) for p, y in int8_ys.items()})
        mismatch += [p for p in int8_ys if errors[p] is None or not errors[p] < INT8_TOL]
    kw = dict(timing_kw(quick, T * B * GATES[cell] * H * (INPUT + H)),
              gap=ORT_SPIN_GAP if nthreads > 1 else 0.0,
              spinning=_selfcheck.SPINNING | {"onnxruntime", "openvino", "openvino_bf16"}
              | set(INT8_PEERS))
    times = _selfcheck.time_peers(fns, **kw)
    return dict({"cell": cell, "H": H, "B": B, "T": T, "threads": nthreads,
                 "mismatch": mismatch, "int8_max_abs_error": errors},
                **{p: times.get(p) for p in PEERS + BF16_PEERS + INT8_PEERS})


def run(threads=2, cells=CELLS, hidden=HIDDEN, batch=BATCH, steps=STEPS, quick=False,
        progress=None, bf16=None, int8=None):
    """The grid, as a JSON-friendly dict: {'info', 'threads', 'steps', 'bf16',
    'int8', 'rows'}; ``bf16`` None: the bfloat16 columns where fastln's bfloat16
    products run on bfloat16 dot products; ``int8`` None: the int8 columns
    where ONNX Runtime is installed."""
    if _selfcheck.torch is None:
        raise RuntimeError("bench/rnn_grid.py needs PyTorch (pip install torch): the "
                           "models are built from torch modules")
    if bf16 is None:
        bf16 = fastln_engine.bf16_products() != "float32" and harness.ml_dtypes is not None
    elif bf16 and harness.ml_dtypes is None:
        raise RuntimeError("the bfloat16 columns need ml_dtypes (pip install ml_dtypes)")
    if int8 is None:
        int8 = _selfcheck.ort is not None
    info = harness.machine_info()
    info["openvino"] = _ov.get_version() if _ov is not None else None
    # the kernels that fastln's bfloat16 and int8 models run on here
    info["bf16_products"] = fastln_engine.bf16_products()
    info["int8_products"] = fastln.rnn.int8_products()
    rows = []
    saved = harness.peer_threads()
    t0 = time.perf_counter()
    try:
        harness.set_peer_threads(threads)   # first: torch may share fastln's libgomp
        with fastln.threads(threads):
            for cell in cells:
                for H in hidden:
                    for B in batch:
                        rows.append(bench_point(cell, H, B, steps, threads, quick, bf16=bf16,
                                                int8=int8))
                        if progress is not None:
                            progress(rows[-1])
    finally:
        harness.restore_peer_threads(saved)
    return {"info": info, "threads": threads, "steps": steps, "input": INPUT, "bf16": bf16,
            "int8": int8, "elapsed_s": time.perf_counter() - t0, "rows": rows}


def _ms(t):
    return "-" if t is None else f"{t * 1e3:.3g}"


def _ratio(a, b):
    return "-" if a is None or b is None else f"{a / b:.2f}"


NAMES = {"torch": "torch", "onnxruntime": "ONNX Runtime", "openvino": "OpenVINO",
         "fastln_bf16": "fastln bf16", "openvino_bf16": "OpenVINO bf16",
         "fastln_int8": "fastln int8", "onnxruntime_int8": "ORT int8", "torch_int8": "torch int8"}
# the int8 columns of the table: (heading, peer's time) and (heading, numerator, denominator)
INT8_TIMES = (("fastln int8 ms", "fastln_int8"), ("ORT int8 ms", "onnxruntime_int8"),
              ("torch int8 ms", "torch_int8"))
INT8_RATIOS = (("fastln int8 / ORT int8", "fastln_int8", "onnxruntime_int8"),
               ("fastln int8 / fastln f32", "fastln_int8", "fastln"))


def _own(p):
    """The fastln column a peer's time is compared with: the same precision's."""
    return "fastln_bf16" if p in BF16_PEERS else "fastln_int8" if p in INT8_PEERS else "fastln"


def _err(r, p):
    """", err E" for an int8 peer: its max |diff| from fastln's float32 y."""
    e = (r.get("int8_max_abs_error") or {}).get(p)
    return "" if p not in INT8_PEERS else f", err {'-' if e is None else f'{e:.2g}'}"


def progress_line(r):
    peers = [p for p in PEERS[1:] + BF16_PEERS[1:] + INT8_PEERS[1:] if r.get(p) is not None]
    return (f"  {r['cell']:4s} H={r['H']:<5d} B={r['B']:<4d} fastln {_ms(r['fastln'])} ms"
            + (f", fastln int8 {_ms(r['fastln_int8'])} ms ({_err(r, 'fastln_int8')[2:]})"
               if r.get("fastln_int8") else "")
            + "".join(f", {NAMES[p]} {_ms(r[p])} ms ({_ratio(r[_own(p)], r[p])}x{_err(r, p)})"
                      for p in peers)
            + (f", fastln bf16 {_ms(r['fastln_bf16'])} ms" if r.get("fastln_bf16") else "")
            + (f"  MISMATCH: {', '.join(r['mismatch'])}" if r["mismatch"] else ""))


def format_table(result):
    """A markdown table: ms per forward and fastln's time over each peer's
    (the bfloat16 columns: fastln's bfloat16 time over OpenVINO's), then,
    with the int8 columns, the int8 times and their ratios."""
    cols = [p for p in PEERS + (BF16_PEERS if result.get("bf16") else ())]
    vs = [p for p in cols if p not in ("fastln", "fastln_bf16")]
    int8_times = INT8_TIMES if result.get("int8") else ()
    int8_ratios = INT8_RATIOS if result.get("int8") else ()
    lines = [f"T = {result['steps']}, I = {result['input']}, {result['threads']} thread(s), "
             f"ms per forward; ratios are fastln's time over the peer's (float32 over "
             f"float32, bfloat16 over bfloat16"
             + (", int8 over int8; and fastln int8 over fastln float32)." if int8_times
                else ")."), "",
             "| cell | H | B | " + " | ".join(NAMES.get(p, p) for p in cols) + " | "
             + " | ".join(f"/ {NAMES[p]}" for p in vs) + " |"
             + "".join(f" {h} |" for h, *_ in int8_times + int8_ratios),
             "|---|---|---|" + "---|" * (len(cols) + len(vs) + len(int8_times)
                                         + len(int8_ratios))]
    for r in result["rows"]:
        lines.append(
            f"| {r['cell'].upper()} | {r['H']} | {r['B']} | "
            + " | ".join(_ms(r.get(p)) for p in cols) + " | "
            + " | ".join(_ratio(r.get("fastln_bf16" if p in BF16_PEERS else "fastln"),
                                r.get(p)) for p in vs) + " |"
            + "".join(f" {_ms(r.get(p))} |" for _, p in int8_times)
            + "".join(f" {_ratio(r.get(a), r.get(b))} |" for _, a, b in int8_ratios)
            + (f" mismatch: {', '.join(r['mismatch'])}" if r["mismatch"] else ""))
    return "\n".join(lines)


def _ints(s):
    return tuple(int(v) for v in s.split(","))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer samples per point")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cells", default=",".join(CELLS), help="lstm,gru,rnn")
    p.add_argument("--hidden", type=_ints, default=HIDDEN, help="H values, comma-separated")
    p.add_argument("--batch", type=_ints, default=BATCH, help="B values, comma-separated")
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                   help="the bfloat16 columns (default: where fastln's bfloat16 "
                        "products run on bfloat16 dot products)")
    p.add_argument("--int8", action=argparse.BooleanOptionalAction, default=None,
                   help="the int8 LSTM columns: fastln, ONNX Runtime and torch dynamic "
                        "int8 (default: where ONNX Runtime is installed)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    cells = tuple(args.cells.split(","))
    bad = set(cells) - set(CELLS)
    if bad:
        p.error(f"--cells takes {', '.join(CELLS)}, got {', '.join(sorted(bad))}")
    print(f"{_selfcheck.cpu_model()}, fastln {fastln.get_isa()}, {args.threads} thread(s)",
          flush=True)
    result = run(args.threads, cells, args.hidden, args.batch, args.steps, args.quick,
                 progress=lambda r: print(progress_line(r), flush=True), bf16=args.bf16,
                 int8=args.int8)
    print()
    print(format_table(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
