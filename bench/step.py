"""One recurrent step at B = 1, fastln against its peers.

    python bench/step.py [--input 64] [--hidden 128] [--threads 1] [--repeat 9] [--json PATH]

Times one step of an LN-LSTM (input size I, hidden size H) for one stream:
fastln's step() with the weights as a new model has them (writable, read in
place), with read-only weights over bytes objects (packed once and kept), and
in bfloat16; and the peers' nearest steps: an ONNX
Runtime session of one ONNX LSTM node at sequence length 1 (a plain LSTM:
ONNX has no layer-normalized one), torch.nn.LSTMCell and torch.nn.LSTM at
T = 1. Each case calls its step in a loop; the cases run in turns, `repeat`
rounds, and the table shows each one's median time per step and its ratio
to fastln's default step. A peer that is not installed is left out.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fastln  # noqa: E402
from fastln import _selfcheck  # noqa: E402
from fastln.rnn import LNLSTM  # noqa: E402
from fastln.rnn._formats import frozen as _frozen  # noqa: E402

try:
    import torch
except ImportError:  # a peer: left out when missing
    torch = None
try:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
except ImportError:
    ort = None


def fastln_cases(I, H):
    """name -> a step function of fastln's, with its state kept between calls."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, I)).astype(np.float32)
    cases = {}
    default = LNLSTM(I, H, seed=0)
    readonly = LNLSTM(I, H, seed=0)
    for key, a in readonly.params.items():   # immutable (over bytes): packed once and kept
        readonly.params[key] = _frozen(a)
    models = {"fastln step()": default, "fastln step(), read-only weights": readonly}
    try:
        import ml_dtypes
        models["fastln step(), bfloat16"] = default.to(ml_dtypes.bfloat16)
    except ImportError:
        pass
    for name, m in models.items():
        box = [m.step(x)[1]]

        def step(m=m, box=box):
            box[0] = m.step(x, box[0])[1]
        cases[name] = step
    return cases


def ort_case(I, H, threads):
    """An ONNX Runtime session of one LSTM node at T = 1, fed its state back."""
    rng = np.random.default_rng(1)
    W = rng.uniform(-0.1, 0.1, (1, 4 * H, I)).astype(np.float32)
    R = rng.uniform(-0.1, 0.1, (1, 4 * H, H)).astype(np.float32)
    B = np.zeros((1, 8 * H), np.float32)
    node = helper.make_node("LSTM", ["X", "W", "R", "B", "", "h0", "c0"], ["", "Yh", "Yc"],
                            hidden_size=H)
    graph = helper.make_graph(
        [node], "step",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 1, I]),
         helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, 1, H]),
         helper.make_tensor_value_info("c0", TensorProto.FLOAT, [1, 1, H])],
        [helper.make_tensor_value_info("Yh", TensorProto.FLOAT, [1, 1, H]),
         helper.make_tensor_value_info("Yc", TensorProto.FLOAT, [1, 1, H])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(R, "R"),
         numpy_helper.from_array(B, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    sess = _selfcheck.ort_session_of(model, threads, spin=True)
    x = rng.standard_normal((1, 1, I)).astype(np.float32)
    state = {"h0": np.zeros((1, 1, H), np.float32), "c0": np.zeros((1, 1, H), np.float32)}

    def step():
        h, c = sess.run(None, {"X": x, **state})
        state["h0"], state["c0"] = h, c
    return step


def torch_cases(I, H):
    cell, lstm = torch.nn.LSTMCell(I, H), torch.nn.LSTM(I, H)
    x = torch.randn(1, I)
    st = [(torch.zeros(1, H), torch.zeros(1, H))]
    st1 = [(torch.zeros(1, 1, H), torch.zeros(1, 1, H))]

    def cell_step():
        with torch.no_grad():
            st[0] = cell(x, st[0])

    def lstm_step():
        with torch.no_grad():
            st1[0] = lstm(x[None], st1[0])[1]
    return {"torch.nn.LSTMCell": cell_step, "torch.nn.LSTM, T = 1": lstm_step}


def run(I=64, H=128, threads=1, repeat=9, calls=2000):
    """Rows of {"case", "us", "ratio"}: median microseconds per step."""
    cases = fastln_cases(I, H)
    if ort is not None:
        cases["ONNX Runtime, LSTM node, T = 1"] = ort_case(I, H, threads)
    saved = torch.get_num_threads() if torch is not None else None
    if torch is not None:
        torch.set_num_threads(threads)
        cases.update(torch_cases(I, H))
    times = {name: [] for name in cases}
    try:
        _time(cases, times, threads, repeat, calls)
    finally:   # the caller's torch keeps its thread count
        if torch is not None:
            torch.set_num_threads(saved)
    base = float(np.median(times["fastln step()"]))
    return [{"case": name, "us": float(np.median(t)), "ratio": float(np.median(t)) / base}
            for name, t in times.items()]


def _time(cases, times, threads, repeat, calls):
    """times[name] += one median-able time per round, the cases in turns."""
    with fastln.threads(threads):
        for step in cases.values():   # warm up
            for _ in range(calls // 10):
                step()
        for _ in range(repeat):
            for name, step in cases.items():
                t0 = time.perf_counter()
                for _ in range(calls):
                    step()
                times[name].append((time.perf_counter() - t0) / calls * 1e6)


def make_parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--input", type=int, default=64, help="input size I")
    ap.add_argument("--hidden", type=int, default=128, help="hidden size H")
    ap.add_argument("--threads", type=int, default=1, help="threads of every case")
    ap.add_argument("--repeat", type=int, default=9, help="rounds of turns")
    ap.add_argument("--calls", type=int, default=2000, help="steps per case per round")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    return ap


def main(argv=None):
    ap = make_parser()
    args = ap.parse_args(argv)
    if args.json:
        _selfcheck.check_output_path(ap, "--json", args.json)
    rows = run(args.input, args.hidden, args.threads, args.repeat, args.calls)
    print(f"One LN-LSTM step at B = 1, I = {args.input}, H = {args.hidden}, "
          f"{args.threads} thread(s); CPU: {_selfcheck.cpu_model()}")
    print("| case | µs per step | / fastln step() |")
    print("|---|---:|---:|")
    for r in rows:
        print(f"| {r['case']} | {r['us']:.2f} | {r['ratio']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
