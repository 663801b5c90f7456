"""Load test of the served-model example: the real server (server.py, in a
subprocess on 127.0.0.1) driven by S concurrent client streams of N steps each,
with batching off and on, for a float32 and a bfloat16 LN-LSTM (I=128, H=256,
default initialization, seed 0).

    python examples/serve/loadtest.py                   # 1, 8, 64, 256 streams x 200 steps
    python examples/serve/loadtest.py --quick           # 1 and 8 streams x 20 steps
    python examples/serve/loadtest.py --sessions 1 64 --steps 50 --dtypes float32 --batching on

Every stream sends standard normal inputs from its own seeded generator, and
every reply is compared bit for bit with the same stream run alone in this
process (B=1 steps over the same inputs): a "mismatch" is a reply whose y or
step index differs. Each configuration stops at --time-limit seconds and each
request at --request-timeout seconds; the server is always shut down. The
client is one asyncio process (httpx, a connection per stream), on the same
machine as the server, so the two share its cores; the server's fastln runs
--threads threads (default 1: on a machine with few cores, a second OpenMP
thread competes with the client and the event loop, and a step that waits at a
barrier for a thread the OS has paused takes milliseconds instead of
microseconds).

Prints a markdown table and writes it to examples/serve/RESULTS.md, and the
latency plot to examples/figures/serve_latency.png (--no-write: neither). A
--quick run only prints: its 20-step numbers are a smoke test, and the files
keep the full run's.
"""
import argparse
import asyncio
import contextlib
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import numpy as np

import fastln
from fastln.rnn import LNLSTM

if __package__:
    from .model import HelpFormatter, bfloat16, load_model, reference_run, save_model, stream_inputs
else:   # run as a script: this directory is sys.path[0]
    from model import HelpFormatter, bfloat16, load_model, reference_run, save_model, stream_inputs

try:
    import sniffio  # noqa: F401
except ImportError:
    # httpcore imports sniffio on every request and runs on asyncio without it;
    # Python does not cache a failed import, so each request would search
    # sys.path again. None in sys.modules makes that import fail at once.
    sys.modules["sniffio"] = None

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "server.py")
RESULTS = os.path.join(HERE, "RESULTS.md")
FIGURE = os.path.join(os.path.dirname(HERE), "figures", "serve_latency.png")


# ---------------------------------------------------------------- the server

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def package_parent():
    """The directory holding the fastln this process imported (source tree or site-packages)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(fastln.__file__)))


@contextlib.contextmanager
def start_server(*args, timeout=60.0):
    """Runs ``server.py *args`` on a free port of 127.0.0.1 until the block ends;
    yields its base URL once /health answers. The server's output goes to a
    temporary file whose end a startup failure reports."""
    port = free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent(), env.get("PYTHONPATH"))
                                        if p)
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen([sys.executable, SERVER, *map(str, args), "--port", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    why = "exited" if proc.poll() is not None else f"is not up after {timeout} s"
                    raise RuntimeError(f"the server {why}; its output:\n{log.read()[-3000:]}")
                try:
                    if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# ---------------------------------------------------------------- the clients

def same_bits(y, want):
    """y (a list of floats from JSON) holds exactly the values of want (any float dtype)."""
    got = np.asarray(y, np.float64)
    want = np.asarray(want).astype(np.float64)
    return got.shape == want.shape and bool(np.all(got.view(np.uint64) == want.view(np.uint64)))


async def run_stream(client, xs, want, deadline, out):
    """One client stream: creates it, steps it over xs (checking each reply
    against want, the single-stream run) until done or past deadline, deletes it.
    Adds to out's counters and latencies; stops at its first failed request."""
    r = await client.post("/streams")
    if r.status_code != 201:
        out["errors"] += 1
        out["messages"].append(f"POST /streams: {r.status_code} {r.text[:200]}")
        return
    stream = r.json()["stream"]
    try:
        for t, (x, w) in enumerate(zip(xs.tolist(), want)):
            if time.monotonic() > deadline:
                out["cut"] = True
                break
            start = time.perf_counter()
            try:
                r = await client.post(f"/streams/{stream}/step", json={"x": x})
            except httpx.HTTPError as e:
                out["errors"] += 1
                out["messages"].append(f"step {t}: {type(e).__name__} {e}")
                break
            out["latency"].append(time.perf_counter() - start)
            if r.status_code != 200:
                out["errors"] += 1
                out["messages"].append(f"step {t}: {r.status_code} {r.text[:200]}")
                break
            reply = r.json()
            if reply["t"] != t or not same_bits(reply["y"], w):
                out["mismatches"] += 1
                if len(out["messages"]) < 10:
                    out["messages"].append(f"stream {stream} step {t}: reply differs from "
                                           f"the single-stream run (t={reply['t']})")
            out["steps"] += 1
    finally:
        with contextlib.suppress(httpx.HTTPError):
            await client.delete(f"/streams/{stream}")


async def drive(url, inputs, wants, time_limit=120.0, request_timeout=30.0):
    """Runs len(inputs) concurrent streams against the server at url: stream i
    sends inputs[i] (steps, I) and expects wants[i] (steps, H). Returns a dict:
    steps, errors, mismatches, messages, latency (seconds per step), seconds,
    cut (the time limit ended it) and the server's batches and steps meanwhile."""
    out = {"steps": 0, "errors": 0, "mismatches": 0, "messages": [], "latency": [],
           "cut": False}
    # one client of one connection per stream: a stream sends one request at
    # a time, and httpx's pool scans all its connections on every request
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(httpx.AsyncClient(
            base_url=url, limits=limits, timeout=httpx.Timeout(request_timeout)))
            for _ in inputs]
        before = (await clients[0].get("/health")).json()
        start = time.monotonic()
        runs = [run_stream(client, xs, want, start + time_limit, out)
                for client, xs, want in zip(clients, inputs, wants)]
        try:
            await asyncio.wait_for(asyncio.gather(*runs), time_limit + 2 * request_timeout)
        except asyncio.TimeoutError:
            out["cut"] = True
            out["errors"] += 1
            out["messages"].append("the streams did not finish in time")
        out["seconds"] = time.monotonic() - start
        after = (await clients[0].get("/health")).json()
    out["batches"] = after["batches"] - before["batches"]
    out["server_steps"] = after["steps"] - before["steps"]
    out["largest_batch"] = after["largest_batch"]
    return out


# ---------------------------------------------------------------- the runs

def summary(dtype, batching, streams, out):
    lat = np.asarray(out["latency"]) * 1e3
    return {"dtype": dtype, "batching": batching, "streams": streams, "steps": out["steps"],
            "steps_per_s": out["steps"] / out["seconds"] if out["seconds"] else 0.0,
            "p50_ms": float(np.percentile(lat, 50)) if lat.size else float("nan"),
            "p99_ms": float(np.percentile(lat, 99)) if lat.size else float("nan"),
            "mean_batch": out["server_steps"] / out["batches"] if out["batches"] else 0.0,
            "errors": out["errors"], "mismatches": out["mismatches"], "cut": out["cut"]}


def model_rate(model, batch, repeat=20):
    """Steps per second of model.step alone, in process, on a batch of that many streams
    (the median of repeat calls)."""
    x = np.zeros((batch, model.input_size), np.float32)
    y, state = model.step(x)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        y, state = model.step(x, state)
        times.append(time.perf_counter() - start)
    return batch / float(np.median(times))


def run_all(args, workdir):
    """Runs every configuration; returns the table's rows and, per dtype, the
    in-process step rates at B=1 and B=max_batch."""
    rows, rates = [], {}
    top = max(args.sessions)
    for dtype in args.dtypes:
        model = LNLSTM(args.input, args.hidden, seed=args.seed)
        if dtype == "bfloat16":
            model = model.to(bfloat16())
        path = os.path.join(workdir, f"lnlstm_{dtype}.npz")
        save_model(path, model)
        model = load_model(path)
        inputs = [stream_inputs(args.seed, i, args.steps, args.input) for i in range(top)]
        started = time.monotonic()
        wants = [reference_run(model, xs) for xs in inputs]
        rates[dtype] = (model_rate(model, 1), model_rate(model, args.max_batch))
        print(f"{dtype}: single-stream reference of {top} streams x {args.steps} steps "
              f"in {time.monotonic() - started:.1f} s; model.step alone: "
              f"{rates[dtype][0]:.0f} steps/s at B=1, {rates[dtype][1]:.0f} at "
              f"B={args.max_batch}", flush=True)
        for batching in args.batching:
            with start_server("--model", path, "--batching", batching,
                              "--max-batch", args.max_batch, "--window-ms", args.window_ms,
                              "--max-streams", max(1024, top), "--threads", args.threads) as url:
                warm = asyncio.run(drive(url, [inputs[0][:5]], [wants[0][:5]]))
                if warm["errors"] or warm["mismatches"]:
                    print("warm-up:", warm["messages"], flush=True)
                for streams in args.sessions:
                    out = asyncio.run(drive(url, inputs[:streams], wants[:streams],
                                            args.time_limit, args.request_timeout))
                    rows.append(summary(dtype, batching, streams, out))
                    print(table(rows[-1:], header=len(rows) == 1), flush=True)
                    for message in out["messages"][:5]:
                        print("   ", message, flush=True)
    return rows, rates


def table(rows, header=True):
    lines = []
    if header:
        lines += ["| model | batching | streams | steps | steps/s | p50 ms | p99 ms | "
                  "mean batch | errors | mismatches |",
                  "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        cut = " (time limit)" if r["cut"] else ""
        lines.append(f"| {r['dtype']} | {r['batching']} | {r['streams']} | {r['steps']}{cut} | "
                     f"{r['steps_per_s']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                     f"{r['mean_batch']:.1f} | {r['errors']} | {r['mismatches']} |")
    return "\n".join(lines)


def machine():
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"{platform.machine()}, {cores} cores usable ({os.cpu_count()} online), "
            f"fastln {fastln.__version__}, fastln.get_num_threads() = "
            f"{fastln.get_num_threads()} in the server and the reference run, "
            f"ISA path {fastln.get_isa()}, Python {platform.python_version()}, "
            f"NumPy {np.__version__}")


def write_results(rows, rates, args, command):
    text = [
        "# Served-model load test", "",
        "Written by `examples/serve/loadtest.py`; rerun it to update.", "",
        f"Command: `{command}`", "",
        f"Machine: {machine()}. The client (one asyncio process) and the server share "
        f"these cores.", "",
        f"Model: LN-LSTM, I={args.input}, H={args.hidden}, one layer, seed {args.seed}; "
        f"{args.steps} steps per stream; batching on: --max-batch {args.max_batch}, "
        f"--window-ms {args.window_ms}.", "",
        "steps/s: replies per second over all streams; p50, p99: the latency of one step "
        "request as the client sees it; mean batch: requests per model step in the server; "
        "mismatches: replies not bit for bit equal to the stream run alone (B=1 steps) in "
        "the client's process.", "",
        "model.step alone, in process (steps per second, one call at a time): " + "; ".join(
            f"{dtype} {one:.0f} at B=1, {many:.0f} at B={args.max_batch}"
            for dtype, (one, many) in rates.items()) + ".", "",
        table(rows), ""]
    with open(RESULTS, "w") as f:
        f.write("\n".join(text))


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True)
    colors = {"float32": "tab:blue", "bfloat16": "tab:orange"}
    for ax, key, name in zip(axes, ("p50_ms", "p99_ms"), ("p50", "p99")):
        for dtype in colors:
            for batching, style in (("off", "--"), ("on", "-")):
                sel = [r for r in rows if r["dtype"] == dtype and r["batching"] == batching]
                if sel:
                    ax.plot([r["streams"] for r in sel], [r[key] for r in sel], style,
                            marker="o", color=colors[dtype],
                            label=f"{dtype}, batching {batching}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sorted({r["streams"] for r in rows}))
        ax.xaxis.set_major_formatter(plain)
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("concurrent streams")
        ax.set_title(f"{name} latency of one step request")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("ms")
    axes[0].legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def make_parser():
    """The command line's parser; every option shows its default in --help."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 64, 256],
                   help="concurrent streams of each run")
    p.add_argument("--steps", type=int, default=200, help="steps per stream")
    p.add_argument("--quick", action="store_true",
                   help="1 and 8 streams, 20 steps; prints only, writes no file")
    p.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16"],
                   default=["float32", "bfloat16"], help="the model's dtypes")
    p.add_argument("--batching", nargs="+", choices=["off", "on"], default=["off", "on"],
                   help="the server's --batching settings")
    p.add_argument("--input", type=int, default=128, help="the model's input_size I")
    p.add_argument("--hidden", type=int, default=256, help="the model's hidden_size H")
    p.add_argument("--seed", type=int, default=0, help="seeds the weights and the inputs")
    p.add_argument("--max-batch", type=int, default=256, help="the server's --max-batch")
    p.add_argument("--window-ms", type=float, default=2.0, help="the server's --window-ms")
    p.add_argument("--threads", type=int, default=1,
                   help="fastln threads of the server and of the reference run")
    p.add_argument("--time-limit", type=float, default=120.0, help="seconds per run at most")
    p.add_argument("--request-timeout", type=float, default=30.0,
                   help="seconds per request at most")
    p.add_argument("--no-write", action="store_true", help="write neither RESULTS.md nor the PNG")
    return p


def main(argv=None):
    p = make_parser()
    args = p.parse_args(argv)
    if args.quick:
        args.sessions, args.steps = [1, 8], 20
    if min(args.sessions) < 1 or args.steps < 1 or args.threads < 1:
        p.error("--sessions, --steps and --threads must be at least 1")
    if min(args.input, args.hidden, args.max_batch) < 1:
        p.error("--input, --hidden and --max-batch must be at least 1")
    if not (args.window_ms >= 0 and args.time_limit > 0 and args.request_timeout > 0):
        p.error("--window-ms must be at least 0, --time-limit and --request-timeout above 0")
    fastln.set_num_threads(args.threads)
    command = "python examples/serve/loadtest.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory() as workdir:
        rows, rates = run_all(args, workdir)
    print()
    print(table(rows))
    if args.quick:
        print(f"\n--quick: nothing written ({os.path.relpath(RESULTS)} and "
              f"{os.path.relpath(FIGURE)} hold a full run's results)")
    elif not args.no_write:
        write_results(rows, rates, args, command.strip())
        plot(rows, FIGURE)
        print(f"\nwrote {RESULTS} and {FIGURE}")
    return 1 if any(r["errors"] or r["mismatches"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
