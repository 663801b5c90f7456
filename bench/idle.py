"""OpenMP waiting policies: CPU per call at a steady rate, and latency back to back.

    python bench/idle.py [--policies fastln,passive,libgomp] [--rounds 3] [--seconds 3]
                         [--busy N] [--threads N] [--json PATH]

A service that runs a small forward at a steady rate (LSTM(64, 512), T = 16,
B = 8, 40 calls a second) leaves OpenMP's worker threads idle between calls:
how they wait (spin, or sleep in the kernel) decides how much CPU the
process burns and how fast a call starts. OpenMP reads its waiting policy
from the environment once, when the runtime loads, so each measurement runs
in a child process of its own, started with one policy's environment:

- ``fastln``: none of the variables set (fastln's default: a short bounded
  spin, see docs/performance.md);
- ``passive``: ``OMP_WAIT_POLICY=passive`` (workers sleep at once);
- ``active``: ``OMP_WAIT_POLICY=active`` (workers spin for minutes);
- ``libgomp``: ``GOMP_SPINCOUNT=300000``, libgomp's own default spin where
  neither variable is set (what a process without fastln's default gets);
- ``spin=N``: ``GOMP_SPINCOUNT=N``.

Each child measures, after a warm-up:

- ``rate``: the small forward at 40 Hz (a call every 25 ms; a late call
  starts at once) for ``--seconds``: the calls made, the process's CPU
  seconds per call (every thread's, as ``time.process_time``) and the median
  and 90th-percentile wall time of a call;
- ``b2b``: the same forward back to back, median wall time per call;
- ``large``: LNLSTM(256, 1024), B = 32, T = 100 back to back, median wall
  time per call.

The children run in turns (every policy once per round, ``--rounds``
rounds) and the table shows each figure's median over the rounds, and its
ratio to the first policy's. ``--busy N`` starts N processes that keep a
core busy each (``yes > /dev/null``) for the whole run: a neighbour such as
a compiler.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

RATE_HZ = 40
SMALL = dict(cls="LSTM", I=64, H=512, T=16, B=8)
LARGE = dict(cls="LNLSTM", I=256, H=1024, T=100, B=32)
WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
POLICIES = {"fastln": {}, "passive": {"OMP_WAIT_POLICY": "passive"},
            "active": {"OMP_WAIT_POLICY": "active"}, "libgomp": {"GOMP_SPINCOUNT": "300000"}}
# the figures of a child, their column heads, and a format for their values
FIGURES = [("rate_calls", "calls in the window", "{:.0f}"),
           ("rate_cpu_ms", "CPU ms per call at 40 Hz", "{:.2f}"),
           ("rate_ms", "call ms at 40 Hz (median)", "{:.2f}"),
           ("rate_p90_ms", "call ms at 40 Hz (p90)", "{:.2f}"),
           ("b2b_ms", "small back to back ms", "{:.3f}"),
           ("large_ms", "large back to back ms", "{:.1f}")]


def policy_env(name):
    """The environment variables of a policy name (see the module's docstring)."""
    if name in POLICIES:
        return POLICIES[name]
    if name.startswith("spin=") and name[5:].isdigit():
        return {"GOMP_SPINCOUNT": name[5:]}
    raise ValueError(f"unknown policy {name!r}: one of {', '.join(POLICIES)} or spin=N")


def _model(cls, I, H, T, B):
    import numpy as np

    from fastln import rnn
    model = getattr(rnn, cls)(I, H, seed=0)
    x = np.random.default_rng(0).standard_normal((T, B, I), dtype=np.float32)
    return lambda: model.forward(x, cache=False)


def _median_ms(fn, seconds):
    """Median wall time of fn in ms over calls back to back for about ``seconds``."""
    times, end = [], time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        times.append(t1 - t0)
        if t1 >= end:
            return 1e3 * statistics.median(times)


def child(seconds, threads):
    """One child's figures (a dict), measured under the environment it inherited."""
    import fastln
    if threads:
        fastln.set_num_threads(threads)
    small, large = _model(**SMALL), _model(**LARGE)
    for _ in range(20):
        small()
    large()
    period, walls = 1.0 / RATE_HZ, []
    cpu0, start = time.process_time(), time.perf_counter()
    due = start
    while due < start + seconds:
        now = time.perf_counter()
        if due > now:
            time.sleep(due - now)
        t0 = time.perf_counter()
        small()
        t1 = time.perf_counter()
        walls.append(t1 - t0)
        due = max(due + period, t1)
    cpu = time.process_time() - cpu0
    walls.sort()
    return {"rate_calls": len(walls), "rate_cpu_ms": 1e3 * cpu / len(walls),
            "rate_ms": 1e3 * statistics.median(walls),
            "rate_p90_ms": 1e3 * walls[int(0.9 * (len(walls) - 1))],
            "b2b_ms": _median_ms(small, seconds / 3), "large_ms": _median_ms(large, seconds / 2),
            "threads": fastln.get_num_threads(), "wait_policy": _wait_policy(fastln)}


def _wait_policy(fastln):
    """fastln's report of its OpenMP waiting policy, where this fastln has one."""
    info = getattr(fastln, "get_wait_policy", None)
    return info() if callable(info) else None


def run_child(name, seconds, threads):
    """The figures of a child process run under policy ``name``'s environment."""
    env = {k: v for k, v in os.environ.items() if k not in WAIT_VARS}
    env.update(policy_env(name))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                          "--seconds", str(seconds), "--threads", str(threads or 0)],
                         env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"bench/idle.py: the {name} process failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(policies, results):
    """Markdown table: a row per policy, the medians over the rounds, and / the first's."""
    med = {p: {k: statistics.median(r[k] for r in results[p]) for k, _, _ in FIGURES}
           for p in policies}
    heads = ["policy"] + [h for _, h, _ in FIGURES]
    lines = ["| " + " | ".join(heads) + " |", "|---" + "|---:" * len(FIGURES) + "|"]
    base = med[policies[0]]
    for p in policies:
        cells = [f"{fmt.format(med[p][k])}" + (f" ({med[p][k] / base[k]:.2f}x)"
                                                if p != policies[0] and base[k] else "")
                 for k, _, fmt in FIGURES]
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines), med


def _count(least):
    """An argparse type: an int of at least ``least``."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an int") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} is below {least}")
        return value
    return parse


def _seconds(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not above 0")
    return value


def _policies(text):
    names = text.split(",")
    if len(set(names)) < len(names):
        raise argparse.ArgumentTypeError(f"a policy named twice in {text!r}")
    for name in names:
        try:
            policy_env(name)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return names


def make_parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--policies", type=_policies, default="fastln,passive,libgomp",
                    help="comma-separated: fastln, passive, active, libgomp, spin=N")
    ap.add_argument("--rounds", type=_count(1), default=3, help="turns of every policy")
    ap.add_argument("--seconds", type=_seconds, default=3.0,
                    help="the 40 Hz window of a child")
    ap.add_argument("--busy", type=_count(0), default=0,
                    help="neighbour processes busy on a core each")
    ap.add_argument("--threads", type=_count(0), default=0,
                    help="fastln's threads (0: its default)")
    ap.add_argument("--json", default=None, help="also write every child's figures here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return ap


def main(argv=None):
    ap = make_parser()
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.seconds, args.threads)))
        return
    policies = args.policies
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from fastln import _selfcheck
    if args.json:
        _selfcheck.check_output_path(ap, "--json", args.json)
    busy_before = _selfcheck.cpu_busy()
    neighbours = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL)
                  for _ in range(args.busy)]
    results = {p: [] for p in policies}
    try:
        for r in range(args.rounds):
            for p in policies:
                results[p].append(run_child(p, args.seconds, args.threads))
                print(f"  round {r + 1} {p}: " + ", ".join(
                    f"{k} {fmt.format(results[p][-1][k])}" for k, _, fmt in FIGURES),
                    flush=True)
    finally:
        for n in neighbours:
            n.kill()
            n.wait()
    text, med = table(policies, results)
    first = results[policies[0]][0]
    print(f"\nCPU: {_selfcheck.cpu_model()}; {os.cpu_count()} CPUs, fastln threads "
          f"{first['threads']}; neighbours busy: {args.busy}; other load before the run: "
          f"{'?' if busy_before is None else f'{100 * busy_before:.0f}%'}")
    print(f"small: {SMALL['cls']}({SMALL['I']}, {SMALL['H']}), T = {SMALL['T']}, "
          f"B = {SMALL['B']}; large: {LARGE['cls']}({LARGE['I']}, {LARGE['H']}), "
          f"T = {LARGE['T']}, B = {LARGE['B']}; medians of {args.rounds} rounds\n")
    print(text)
    print("\nfastln.get_wait_policy() in each policy's children: " + "; ".join(
        f"{p}: {results[p][0]['wait_policy']}" for p in policies))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"busy": args.busy, "cpu": _selfcheck.cpu_model(),
                       "busy_before": busy_before, "results": results, "medians": med}, f,
                      indent=1)


if __name__ == "__main__":
    main()
