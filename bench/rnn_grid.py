"""Recurrent forwards over a grid of sizes: fastln against PyTorch, ONNX Runtime and OpenVINO.

    python bench/rnn_grid.py [--quick] [--threads 2] [--cells lstm,gru,rnn]
                             [--hidden 256,1024] [--batch 1,8,32,256] [--steps 100]
                             [--bf16 | --no-bf16] [--json PATH]

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

Before timing, each peer's y is checked against fastln's over the first 10 steps
(float32: rtol = atol = 1e-4, as float32 recurrences part slowly; bfloat16:
atol = 0.05 against fastln's float32). Timing follows bench/harness.py: the
peers in turns in one process, 0.1 s apart (ONNX Runtime's workers spin for
long after a run), medians per call, ratios of medians (fastln / peer: below 1,
fastln is faster). A peer that is not installed gives no column. The default
grid (3 cells, H in 128..2048, B in 1..256) takes about half an hour on 2
cores; ``--quick`` times fewer samples.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

import fastln  # noqa: E402
from bench import harness  # noqa: E402
from fastln import _selfcheck  # noqa: E402
from fastln._selfcheck import _onnx, _ort, _torch  # noqa: E402
from fastln.rnn import _engine as fastln_engine  # noqa: E402

_ov = _selfcheck._import("openvino")
_ml_dtypes = harness._ml_dtypes

INPUT = 128
HIDDEN = (128, 256, 512, 1024, 2048)
BATCH = (1, 8, 32, 256)
STEPS = 100
CELLS = ("lstm", "gru", "rnn")
GATES = {"lstm": 4, "gru": 3, "rnn": 1}
CHECK_STEPS = 10
TOL = 1e-4
BF16_TOL = 0.05
PEERS = ("fastln", "torch", "onnxruntime", "openvino")
BF16_PEERS = ("fastln_bf16", "openvino_bf16")
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


def bench_point(cell, H, B, T, nthreads, quick=False, seed=0, bf16=False):
    """One grid point: {'cell', 'H', 'B', 'T', 'threads', peer: seconds or None,
    'mismatch': [peers whose y disagreed]}; the bfloat16 peers with ``bf16``."""
    from fastln import rnn

    torch = _torch
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
    onnx_model = _onnx_model(cell, module) if _onnx is not None else None
    if onnx_model is not None and _ort is not None:
        sess = _selfcheck.ort_session_of(onnx_model, nthreads, spin=True)
        fns["onnxruntime"] = lambda: sess.run(None, {"X": x})
        checks["onnxruntime"] = (lambda: sess.run(None, {"X": x[:k]})[0][:, 0], TOL)
    if onnx_model is not None and _ov is not None:
        ov32 = _openvino_run(onnx_model, nthreads, "f32")
        fns["openvino"] = lambda: ov32(x)
        checks["openvino"] = (lambda: ov32(x[:k])[:, 0], TOL)
    if bf16:
        model16 = model.to(_ml_dtypes.bfloat16)
        fns["fastln_bf16"] = lambda: model16.forward(x, cache=False)
        checks["fastln_bf16"] = (lambda: model16.forward(x[:k], cache=False)[0], BF16_TOL)
        if onnx_model is not None and _ov is not None:
            ov16 = _openvino_run(onnx_model, nthreads, "bf16")
            fns["openvino_bf16"] = lambda: ov16(x)
            checks["openvino_bf16"] = (lambda: ov16(x[:k])[:, 0], BF16_TOL)
    want = model.forward(x[:k], cache=False)[0]
    mismatch = [p for p, (y, tol) in checks.items()
                if not np.allclose(y(), want, rtol=tol, atol=tol)]
    kw = dict(timing_kw(quick, T * B * GATES[cell] * H * (INPUT + H)),
              gap=ORT_SPIN_GAP if nthreads > 1 else 0.0,
              spinning=_selfcheck.SPINNING | {"onnxruntime", "openvino", "openvino_bf16"})
    times = _selfcheck.time_peers(fns, **kw)
    return dict({"cell": cell, "H": H, "B": B, "T": T, "threads": nthreads,
                 "mismatch": mismatch}, **{p: times.get(p) for p in PEERS + BF16_PEERS})


def run(threads=2, cells=CELLS, hidden=HIDDEN, batch=BATCH, steps=STEPS, quick=False,
        progress=None, bf16=None):
    """The grid, as a JSON-friendly dict: {'info', 'threads', 'steps', 'bf16', 'rows'};
    ``bf16`` None: the bfloat16 columns where fastln's bfloat16 products run on
    bfloat16 dot products."""
    if _torch is None:
        raise RuntimeError("bench/rnn_grid.py needs PyTorch (pip install torch): the "
                           "models are built from torch modules")
    if bf16 is None:
        bf16 = fastln_engine.bf16_products() != "float32" and _ml_dtypes is not None
    elif bf16 and _ml_dtypes is None:
        raise RuntimeError("the bfloat16 columns need ml_dtypes (pip install ml_dtypes)")
    info = harness.machine_info()
    info["openvino"] = _ov.get_version() if _ov is not None else None
    rows = []
    saved = harness.peer_threads()
    t0 = time.perf_counter()
    try:
        harness.set_peer_threads(threads)   # first: torch may share fastln's libgomp
        with fastln.threads(threads):
            for cell in cells:
                for H in hidden:
                    for B in batch:
                        rows.append(bench_point(cell, H, B, steps, threads, quick, bf16=bf16))
                        if progress is not None:
                            progress(rows[-1])
    finally:
        harness.restore_peer_threads(saved)
    return {"info": info, "threads": threads, "steps": steps, "input": INPUT, "bf16": bf16,
            "elapsed_s": time.perf_counter() - t0, "rows": rows}


def _ms(t):
    return "-" if t is None else f"{t * 1e3:.3g}"


def _ratio(a, b):
    return "-" if a is None or b is None else f"{a / b:.2f}"


NAMES = {"torch": "torch", "onnxruntime": "ONNX Runtime", "openvino": "OpenVINO",
         "fastln_bf16": "fastln bf16", "openvino_bf16": "OpenVINO bf16"}


def progress_line(r):
    peers = [p for p in PEERS[1:] + BF16_PEERS[1:] if r.get(p) is not None]
    own = {p: "fastln_bf16" if p in BF16_PEERS else "fastln" for p in peers}
    return (f"  {r['cell']:4s} H={r['H']:<5d} B={r['B']:<4d} fastln {_ms(r['fastln'])} ms"
            + "".join(f", {NAMES[p]} {_ms(r[p])} ms ({_ratio(r[own[p]], r[p])}x)"
                      for p in peers)
            + (f", fastln bf16 {_ms(r['fastln_bf16'])} ms" if r.get("fastln_bf16") else "")
            + (f"  MISMATCH: {', '.join(r['mismatch'])}" if r["mismatch"] else ""))


def format_table(result):
    """A markdown table: ms per forward and fastln's time over each peer's
    (the bfloat16 columns: fastln's bfloat16 time over OpenVINO's)."""
    cols = [p for p in PEERS + (BF16_PEERS if result.get("bf16") else ())]
    vs = [p for p in cols if p not in ("fastln", "fastln_bf16")]
    lines = [f"T = {result['steps']}, I = {result['input']}, {result['threads']} thread(s), "
             f"ms per forward; ratios are fastln's time over the peer's (float32 over "
             f"float32, bfloat16 over bfloat16).", "",
             "| cell | H | B | " + " | ".join(NAMES.get(p, p) for p in cols) + " | "
             + " | ".join(f"/ {NAMES[p]}" for p in vs) + " |",
             "|---|---|---|" + "---|" * (len(cols) + len(vs))]
    for r in result["rows"]:
        lines.append(
            f"| {r['cell'].upper()} | {r['H']} | {r['B']} | "
            + " | ".join(_ms(r.get(p)) for p in cols) + " | "
            + " | ".join(_ratio(r.get("fastln_bf16" if p in BF16_PEERS else "fastln"),
                                r.get(p)) for p in vs) + " |"
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
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    cells = tuple(args.cells.split(","))
    bad = set(cells) - set(CELLS)
    if bad:
        p.error(f"--cells takes {', '.join(CELLS)}, got {', '.join(sorted(bad))}")
    print(f"{_selfcheck.cpu_model()}, fastln {fastln.get_isa()}, {args.threads} thread(s)",
          flush=True)
    result = run(args.threads, cells, args.hidden, args.batch, args.steps, args.quick,
                 progress=lambda r: print(progress_line(r), flush=True), bf16=args.bf16)
    print()
    print(format_table(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
