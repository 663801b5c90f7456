"""What LNLSTM's variants cost against the paper's cell, in one process.

    python bench/lstm_variants.py [--hidden 256,1024] [--batch 1,32] [--steps 100]
                                  [--threads 2] [--repeat 9] [--json PATH]

For each H and B, times forward(x, cache=False) over T steps (input size
H) and one step() of a stream batch, float32, for the paper's cell and for
the variants that published implementations use (their options in
VARIANTS), all with the same weight matrices. The variants and the paper cell
are timed in turns (fastln._selfcheck.time_peers), and the table gives each
one's median and its ratio to the paper cell's.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fastln  # noqa: E402
from fastln import _selfcheck  # noqa: E402
from fastln.rnn import LNLSTM  # noqa: E402

# name -> LNLSTM options; the first is the baseline of the ratios
VARIANTS = {
    "paper (pair, raw)": {},
    "torchaudio (sum, normalized)": dict(gate_norm="sum", carry="normalized", gate_bias=False),
    "fastrnns/NeMo (pair, normalized)": dict(carry="normalized", gate_bias=False),
    "TF1 (per_gate, normalized)": dict(gate_norm="per_gate", carry="normalized",
                                       gate_bias=False),
}


def cases(H, B, T):
    """name -> (forward fn, step fn) of each variant on the same weights."""
    x = np.random.default_rng(1).standard_normal((T, B, H)).astype(np.float32)
    paper = LNLSTM(H, H, seed=0)
    out = {}
    for name, kw in VARIANTS.items():
        m = LNLSTM(H, H, seed=0, **kw)
        for key in ("weight_ih_l0", "weight_hh_l0"):
            m.params[key] = paper.params[key]
        state = [None]

        def step(m=m, state=state):
            y, state[0] = m.step(x[0], state[0], state_out=state[0])

        out[name] = (lambda m=m: m.forward(x, cache=False), step)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", default="256,1024")
    ap.add_argument("--batch", default="1,32")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    fastln.set_num_threads(args.threads)
    rows = []
    base = next(iter(VARIANTS))
    print(f"fastln {fastln.__version__}, {args.threads} threads, T = {args.steps}, float32; "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"{'H':>5} {'B':>4}  {'variant':34} {'forward ms':>10} {'ratio':>6} "
          f"{'step us':>9} {'ratio':>6}")
    for H in map(int, args.hidden.split(",")):
        for B in map(int, args.batch.split(",")):
            fns = cases(H, B, args.steps)
            fwd = _selfcheck.time_peers({n: f for n, (f, _) in fns.items()},
                                        repeats=args.repeat)
            stp = _selfcheck.time_peers({n: s for n, (_, s) in fns.items()},
                                        repeats=args.repeat)
            for name in fns:
                row = dict(H=H, B=B, variant=name, forward_s=fwd[name], step_s=stp[name],
                           forward_ratio=fwd[name] / fwd[base], step_ratio=stp[name] / stp[base])
                rows.append(row)
                print(f"{H:5d} {B:4d}  {name:34} {fwd[name] * 1e3:10.2f} "
                      f"{row['forward_ratio']:6.3f} {stp[name] * 1e6:9.1f} "
                      f"{row['step_ratio']:6.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "steps": args.steps, "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
