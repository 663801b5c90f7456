"""Recurrent forwards over a grid of sizes: fastln against PyTorch and ONNX Runtime, float32.

    python bench/rnn_grid.py [--quick] [--threads 2] [--cells lstm,gru] [--hidden 256,1024]
                             [--batch 1,8,32,256] [--steps 100] [--json PATH]

At each point (cell, H, B), T steps of I = 128 inputs, one layer, forward only:

- fastln: ``fastln.rnn.LSTM`` / ``GRU`` loaded from the torch module
  (``LSTM.from_torch``), ``forward(x, cache=False)``;
- torch: ``torch.nn.LSTM`` / ``GRU`` under ``torch.inference_mode()``;
- onnxruntime: one ONNX ``LSTM`` / ``GRU`` node (opset 14, ``linear_before_reset=1``
  for the GRU, as torch's) built with ``onnx.helper`` from the same weights, in a
  session of ``intra_op_num_threads = n``.

Before timing, each peer's y is checked against fastln's over the first 10 steps
(rtol = atol = 1e-4: float32 recurrences part slowly). Timing follows
bench/harness.py: the peers in turns in one process, 0.1 s apart (ONNX
Runtime's workers spin for long after a run), medians per call,
ratios of medians (fastln / peer: below 1, fastln is faster). A peer that is
not installed gives no column. The default grid (H in 128..2048, B in 1..256)
takes about half an hour on 2 cores; ``--quick`` times fewer samples.
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

INPUT = 128
HIDDEN = (128, 256, 512, 1024, 2048)
BATCH = (1, 8, 32, 256)
STEPS = 100
CELLS = ("lstm", "gru")
CHECK_STEPS = 10
TOL = 1e-4
PEERS = ("fastln", "torch", "onnxruntime")
# seconds between peers: ONNX Runtime's workers spin for longer than libgomp's
# after a run (a 12 ms gap left fastln's next call twice as slow on 2 cores)
ORT_SPIN_GAP = 0.1
# the ONNX node's gate blocks, as rows of torch's weight matrices: LSTM torch
# [i f g o] -> ONNX [i o f c]; GRU torch [r z n] -> ONNX [z r h]
ONNX_GATES = {"lstm": (0, 3, 1, 2), "gru": (1, 0, 2)}


def timing_kw(quick, work):
    """time_peers' settings for a point of ``work`` multiply-adds per call."""
    big = work > 2e10   # a call of seconds: three samples
    if quick:
        return dict(repeats=3, min_sample=1e-3, budget=0.3, min_repeats=1 if big else 2)
    return dict(repeats=3 if big else 9, min_sample=2e-3, budget=3.0, min_repeats=3)


def _onnx_session(cell, module, nthreads):
    """An ONNX Runtime session of one LSTM or GRU node with module's weights."""
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
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    return _selfcheck.ort_session_of(model, nthreads, spin=True)


def bench_point(cell, H, B, T, nthreads, quick=False, seed=0):
    """One grid point: {'cell', 'H', 'B', 'T', 'threads', peer: seconds or None,
    'mismatch': [peers whose y disagreed]}."""
    from fastln import rnn

    torch = _torch
    torch.manual_seed(seed)
    module = (torch.nn.LSTM if cell == "lstm" else torch.nn.GRU)(INPUT, H).eval()
    model = (rnn.LSTM if cell == "lstm" else rnn.GRU).from_torch(module)
    x = np.random.default_rng(seed).standard_normal((T, B, INPUT)).astype(np.float32)
    xt = torch.from_numpy(x)

    def torch_y(xt):
        with torch.inference_mode():
            return module(xt)[0]
    fns = {"fastln": lambda: model.forward(x, cache=False), "torch": lambda: torch_y(xt)}
    k = min(T, CHECK_STEPS)
    checks = {"torch": lambda: torch_y(xt[:k]).numpy()}
    if _onnx is not None and _ort is not None:
        sess = _onnx_session(cell, module, nthreads)
        fns["onnxruntime"] = lambda: sess.run(None, {"X": x})
        checks["onnxruntime"] = lambda: sess.run(None, {"X": x[:k]})[0][:, 0]
    want = model.forward(x[:k], cache=False)[0]
    mismatch = [p for p, y in checks.items() if not np.allclose(y(), want, rtol=TOL, atol=TOL)]
    G = 4 if cell == "lstm" else 3
    kw = dict(timing_kw(quick, T * B * G * H * (INPUT + H)),
              gap=ORT_SPIN_GAP if nthreads > 1 else 0.0,
              spinning=_selfcheck.SPINNING | {"onnxruntime"})
    times = _selfcheck.time_peers(fns, **kw)
    return dict({"cell": cell, "H": H, "B": B, "T": T, "threads": nthreads,
                 "mismatch": mismatch}, **{p: times.get(p) for p in PEERS})


def run(threads=2, cells=CELLS, hidden=HIDDEN, batch=BATCH, steps=STEPS, quick=False,
        progress=None):
    """The grid, as a JSON-friendly dict: {'info', 'threads', 'steps', 'rows'}."""
    if _torch is None:
        raise RuntimeError("bench/rnn_grid.py needs PyTorch (pip install torch): the "
                           "models are built from torch modules")
    info = harness.machine_info()
    rows = []
    saved = harness.peer_threads()
    t0 = time.perf_counter()
    try:
        harness.set_peer_threads(threads)   # first: torch may share fastln's libgomp
        with fastln.threads(threads):
            for cell in cells:
                for H in hidden:
                    for B in batch:
                        rows.append(bench_point(cell, H, B, steps, threads, quick))
                        if progress is not None:
                            progress(rows[-1])
    finally:
        harness.restore_peer_threads(saved)
    return {"info": info, "threads": threads, "steps": steps, "input": INPUT,
            "elapsed_s": time.perf_counter() - t0, "rows": rows}


def _ms(t):
    return "-" if t is None else f"{t * 1e3:.3g}"


def _ratio(a, b):
    return "-" if a is None or b is None else f"{a / b:.2f}"


def progress_line(r):
    return (f"  {r['cell']:4s} H={r['H']:<5d} B={r['B']:<4d} fastln {_ms(r['fastln'])} ms, "
            f"torch {_ms(r['torch'])} ms ({_ratio(r['fastln'], r['torch'])}x), "
            f"onnxruntime {_ms(r['onnxruntime'])} ms "
            f"({_ratio(r['fastln'], r['onnxruntime'])}x)"
            + (f"  MISMATCH: {', '.join(r['mismatch'])}" if r["mismatch"] else ""))


def format_table(result):
    """A markdown table: ms per forward and fastln's time over each peer's."""
    lines = [f"T = {result['steps']}, I = {result['input']}, {result['threads']} thread(s), "
             f"float32, ms per forward; ratios are fastln's time over the peer's.", "",
             "| cell | H | B | fastln | torch | ONNX Runtime | / torch | / ONNX Runtime |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['cell'].upper()} | {r['H']} | {r['B']} | {_ms(r['fastln'])} | "
                     f"{_ms(r['torch'])} | {_ms(r['onnxruntime'])} | "
                     f"{_ratio(r['fastln'], r['torch'])} | "
                     f"{_ratio(r['fastln'], r['onnxruntime'])} |"
                     + (f" mismatch: {', '.join(r['mismatch'])}" if r["mismatch"] else ""))
    return "\n".join(lines)


def _ints(s):
    return tuple(int(v) for v in s.split(","))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer samples per point")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cells", default=",".join(CELLS), help="lstm,gru")
    p.add_argument("--hidden", type=_ints, default=HIDDEN, help="H values, comma-separated")
    p.add_argument("--batch", type=_ints, default=BATCH, help="B values, comma-separated")
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    cells = tuple(args.cells.split(","))
    bad = set(cells) - set(CELLS)
    if bad:
        p.error(f"--cells takes {', '.join(CELLS)}, got {', '.join(sorted(bad))}")
    print(f"{_selfcheck.cpu_model()}, fastln {fastln.get_isa()}, {args.threads} thread(s)",
          flush=True)
    result = run(args.threads, cells, args.hidden, args.batch, args.steps, args.quick,
                 progress=lambda r: print(progress_line(r), flush=True))
    print()
    print(format_table(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
