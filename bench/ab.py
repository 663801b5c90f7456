"""A/B of two builds of fastln: two checkouts, each built in place, timed in turns.

    python bench/ab.py OLD_CHECKOUT NEW_CHECKOUT [--rounds 3] [--cases FILE.json]

Each case runs ``--rounds`` times per checkout, alternating which goes first, each time
in a fresh process that imports that checkout's fastln (PYTHONPATH) and takes the median
of its calls (at least 5, for about a second). The table gives the medians over the
rounds and new / old: below 1, the new build is faster. Both builds run on the same
machine in the same minutes, which is what makes their ratio meaningful on a shared one.

A case is [model, dtype, H, B, T, mode]. A recurrent case has model LNLSTM, LSTM or GRU
(input size 128); dtype f32 or f64 on the best path of this CPU, f32gen on the generic
path, or bf16 / int8 (a float32 model converted with ``.to`` or ``quantize``); mode fwd
(forward, cache=False), train (forward with its cache, then backward) or step (T calls
of step()). A normalization case has model layer_norm, rms_norm or add_layer_norm on
(B, H) rows, T unused, mode fwd or bwd (the function's backward). The default cases
cover H 128-2048 and B 1-256: the engine in float64 and on the generic path, float32,
bfloat16 and int8 on the best path, and the norms in float32 and float64. The path is
chosen with FASTLN_ISA in each child, so any two versions of fastln compare.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np


def default_cases():
    cases = []
    for dt in ("f64", "f32gen"):
        for H in (128, 512, 2048):
            for B in (1, 8, 32, 256):
                cases.append(["LNLSTM", dt, H, B, 10 if H == 2048 else 30, "fwd"])
            for B in (8, 256):
                cases.append(["LNLSTM", dt, H, B, 4 if H == 2048 else 20, "train"])
        cases += [["GRU", dt, 512, 32, 30, "fwd"], ["LSTM", dt, 512, 1, 30, "step"],
                  ["LSTM", dt, 128, 1, 30, "step"]]
    cases += [["LNLSTM", "f32", H, B, 30, "fwd"] for H in (256, 1024) for B in (1, 32)]
    cases += [["LNLSTM", dt, 256, 1, 30, "step"] for dt in ("f32", "bf16", "int8")]
    cases += [["LNLSTM", dt, 512, 32, 30, "fwd"] for dt in ("bf16", "int8")]
    for fn in ("layer_norm", "rms_norm", "add_layer_norm"):
        for dt in ("f32", "f64"):
            for H in (128, 512, 2048):
                for B in (1, 32, 256):
                    cases.append([fn, dt, H, B, 1, "fwd"])
        for H in (128, 2048):
            for B in (1, 256):
                cases.append([fn, "f32", H, B, 1, "bwd"])
    return cases


def _norm_call(fastln, fn, dtype, H, B, mode):
    """A function of no arguments that runs one normalization case."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, H)).astype(dtype)
    w, b = np.ones(H, dtype), np.zeros(H, dtype)
    if fn == "rms_norm":
        if mode == "fwd":
            return lambda: fastln.rms_norm(x, w)
        _, rstd = fastln.rms_norm(x, w, return_stats=True)
        return lambda: fastln.rms_norm_backward(x, x, rstd, w)
    if fn == "add_layer_norm":
        r = rng.standard_normal((B, H)).astype(dtype)
        if mode == "fwd":
            return lambda: fastln.add_layer_norm(x, r, w, b)
        _, s, mean, rstd = fastln.add_layer_norm(x, r, w, b, return_stats=True)
        return lambda: fastln.add_layer_norm_backward(x, s, mean, rstd, w)
    if mode == "fwd":
        return lambda: fastln.layer_norm(x, w, b)
    _, mean, rstd = fastln.layer_norm(x, w, b, return_stats=True)
    return lambda: fastln.layer_norm_backward(x, x, mean, rstd, w)


def _model(name, dt, H):
    from fastln.rnn import GRU, LNLSTM, LSTM, quantize
    dtype = np.float64 if dt == "f64" else np.float32
    m = {"LNLSTM": LNLSTM, "LSTM": LSTM, "GRU": GRU}[name](128, H, seed=0, dtype=dtype)
    if dt == "bf16":
        import ml_dtypes
        m = m.to(ml_dtypes.bfloat16)
    elif dt == "int8":
        m = quantize(m)
    return m, dtype


def _call(m, x, mode):
    if mode == "fwd":
        m.forward(x, cache=False)
    elif mode == "train":
        y, _ = m.forward(x)
        m.backward(np.ones_like(y))
    else:
        state = None
        for x_t in x:
            _, state = m.step(x_t, state)


def time_cases(cases):
    """{case name: median seconds per call} in the fastln this process imports."""
    import fastln
    out = {}
    for name, dt, H, B, T, mode in cases:
        if name in ("layer_norm", "rms_norm", "add_layer_norm"):
            dtype = np.float64 if dt == "f64" else np.float32
            call = _norm_call(fastln, name, dtype, H, B, mode)
        else:
            m, dtype = _model(name, dt, H)
            x = np.random.default_rng(0).standard_normal((T, B, 128)).astype(dtype)
            def call(m=m, x=x, mode=mode):
                _call(m, x, mode)
        call()
        times, stop = [], time.perf_counter() + 1.0
        while len(times) < 5 or (time.perf_counter() < stop and len(times) < 2000):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        out["/".join(map(str, (name, dt, H, B, T, mode)))] = float(np.median(times))
    return out


def main():
    if sys.argv[1:2] == ["--one"]:   # a child: time the cases given, print JSON
        print(json.dumps(time_cases(json.loads(sys.argv[2]))))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cases", help="a JSON list of cases (default: the cases above)")
    a = p.parse_args()
    if a.cases:
        with open(a.cases) as f:
            cases = json.load(f)
    else:
        cases = default_cases()
    print(f"{'case':40s} {'old ms':>9s} {'new ms':>9s} {'new/old':>8s}", flush=True)
    for case in cases:
        got = {a.old: [], a.new: []}
        for r in range(a.rounds):
            for root in (a.old, a.new) if r % 2 == 0 else (a.new, a.old):
                env = dict(os.environ, PYTHONPATH=os.path.abspath(root))
                if case[1] == "f32gen":
                    env["FASTLN_ISA"] = "generic"
                child = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--one", json.dumps([case])],
                    env=env, cwd="/",
                    capture_output=True, text=True, check=True)
                got[root] += json.loads(child.stdout).values()
        old, new = (sorted(got[k])[len(got[k]) // 2] * 1e3 for k in (a.old, a.new))
        print(f"{'/'.join(map(str, case)):40s} {old:9.4f} {new:9.4f} {new / old:8.2f}",
              flush=True)


if __name__ == "__main__":
    main()
