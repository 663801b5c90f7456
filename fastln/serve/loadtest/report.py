"""The load generator's reports: a run's row as it finishes, the markdown
table and the ratios, RESULTS.md, and the latency plot."""
import os
import platform

import numpy as np

import fastln
from fastln import _selfcheck

from ..extra import needs_extra
from ..loop import NAME as LOOP

with needs_extra(__name__):
    import picows

RESULTS, FIGURE = "RESULTS.md", "serve_latency.png"   # written to --outdir


def summary(run, dtype, out, hz=None):
    """The row of a run's result out (drive's), printed with its notes as
    the run ends."""
    lat = out["lat_ms"]
    row = {"run": run, "dtype": dtype, "hz": hz, **out,
           "steps_per_s": out["steps"] / out["seconds"] if out["seconds"] else 0.0,
           "p50_ms": float(np.percentile(lat, 50)) if lat.size else float("nan"),
           "p99_ms": float(np.percentile(lat, 99)) if lat.size else float("nan")}
    print(table([row], header=False), flush=True)
    if out.get("connections"):
        print(f"    {out['streams']} streams on {out['connections']} multiplexed connections",
              flush=True)
    if out["client_us"] is not None:
        print(f"    client CPU {out['client_us']:.1f} µs/step", end="", flush=True)
        if out["lag_ms"] is not None:
            print(f"; frames went out {out['lag_ms'][0]:.2f} ms (p50), "
                  f"{out['lag_ms'][1]:.2f} ms (p99) after their scheduled time", end="")
        print(flush=True)
    if out.get("checkpoints"):
        ck = out["checkpoints"]
        print(f"    checkpoints: {ck['ok']} written ({ck['streams']} streams, "
              f"{ck['seconds']:.2f} s of writes), {ck['failed']} failed", flush=True)
    for message in out["messages"][:5]:
        print("   ", message, flush=True)
    return row


def table(rows, header=True):
    lines = []
    if header:
        lines += ["| run | dtype | streams | Hz | steps | steps/s | p50 ms | p99 ms | "
                  "server CPU µs/step | mean batch | errors | mismatches | lost |",
                  "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]

    def opt(v, fmt):
        return "-" if v is None else format(v, fmt)

    for r in rows:
        lines.append(f"| {r['run']} | {r['dtype']} | {r['streams']} | {opt(r['hz'], 'g')} | "
                     f"{r['steps']} | {r['steps_per_s']:.0f} | {opt(r['p50_ms'], '.2f')} | "
                     f"{opt(r['p99_ms'], '.2f')} | {opt(r['cpu_us'], '.1f')} | "
                     f"{opt(r['mean_batch'], '.1f')} | {r['errors']} | {r['mismatches']} | "
                     f"{r['lost']} |")
    return "\n".join(lines)


def ratios(rows):
    """Lines of closed-loop steps/s per dtype: the model's over echo's, and
    over the float32 model's."""
    lines, closed = [], {}
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        got = {r["run"]: r["steps_per_s"] for r in rows if r["dtype"] == dtype}
        if got.get("closed"):
            closed[dtype] = got["closed"]
        if got.get("closed") and got.get("echo"):
            lines.append(f"closed loop, {dtype} model / echo: {got['closed']:.0f} / "
                         f"{got['echo']:.0f} steps/s = {got['closed'] / got['echo']:.2f}")
    base = closed.get("float32")
    for dtype, value in closed.items():
        if base and dtype != "float32":
            lines.append(f"closed loop, {dtype} model / float32 model: {value:.0f} / "
                         f"{base:.0f} steps/s = {value / base:.2f}")
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        got = {r["run"]: r for r in rows if r["dtype"] == dtype}
        mux, engine = got.get("mux-closed"), got.get("engine")
        if mux and engine and engine["steps_per_s"]:
            lines.append(f"closed loop, {dtype}, multiplexed ({mux['connections']} connections) "
                         f"/ the engine in-process at B = {engine['streams']}: "
                         f"{mux['steps_per_s']:.0f} / {engine['steps_per_s']:.0f} steps/s = "
                         f"{mux['steps_per_s'] / engine['steps_per_s']:.2f}")
        if mux and got.get("closed") and got["closed"]["steps_per_s"]:
            per = got["closed"]["steps_per_s"]
            lines.append(f"closed loop, {dtype}, multiplexed / a connection per stream: "
                         f"{mux['steps_per_s']:.0f} / {per:.0f} steps/s = "
                         f"{mux['steps_per_s'] / per:.2f}")
    return lines


def largest_line(largest, args):
    """The sweep's answer per dtype (largest: {dtype: stream count or None})."""
    return (f"largest stream count at {args.sweep_hz:g} Hz with p99 < {args.p99_ms:g} ms: "
            + ", ".join(f"{n if n is not None else 'none of those tried'} ({dtype})"
                        for dtype, n in largest.items()))


def machine():
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"{_selfcheck.cpu_model()}, {cores} cores usable ({os.cpu_count()} online), fastln "
            f"{fastln.__version__} (ISA path {fastln.get_isa()}), Python "
            f"{platform.python_version()}, NumPy {np.__version__}, picows "
            f"{getattr(picows, '__version__', '?')}")


def write_results(path, rows, largest, args, command):
    text = [
        "# Served-model load test", "",
        "Written by `python -m fastln.serve.loadtest`; rerun it to update.", "",
        f"Command: `{command}`", "",
        f"Machine: {machine()}. The client (one asyncio process, "
        f"{LOOP}) and the server share these "
        f"cores.", "",
        f"Server: `fastln-serve --threads {args.threads} --max-queue-per-stream "
        f"{args.max_queue_per_stream}`, other settings at their defaults; a fresh server "
        f"for the model runs, for echo (`--echo`) and for each side of the restart "
        f"(`--state-file`).", "",
        f"Model: LN-LSTM, I={args.input}, H={args.hidden}, one layer, seed {args.seed}, "
        f"default initialization; int8: that model through `fastln.rnn.quantize`; x "
        f"frames float32, y frames in the model's dtype (float32 for int8).", "",
        f"closed: each stream sends its next frame when a reply comes ({args.inflight} "
        f"in flight); open and sweep: each stream sends at Hz on a fixed schedule with a "
        f"random phase, and latency counts from the scheduled send time; restart: SIGTERM "
        f"partway, a new server on the same state file, reconnect and resume. steps/s: "
        f"replies per second over all streams; p50, p99: from sending (or the scheduled "
        f"time) to the reply; server CPU µs/step: the server process's CPU time over the "
        f"steps it ran; mean batch: steps per batch of the server's StreamBatcher; "
        f"mismatches: replies not bit for bit equal to the stream run alone (B=1 steps) "
        f"in the client; lost: streams whose resumed t differs from the replies they got. "
        f"mux-closed and mux-open: the same streams on {args.connections} multiplexed "
        f"connections (a frame holds one step of each stream of its connection; mux-open: "
        f"each connection sends at Hz with a random phase); engine: StreamTable.step of "
        f"that many streams in the load generator's process, no server.",
        "", table(rows), "", *(line + "  " for line in ratios(rows)),
        *([largest_line(largest, args)] if "sweep" in args.runs else []), ""]
    with open(path, "w") as f:
        f.write("\n".join(text))


def plot(rows, path):
    """The sweep's p50 and p99 against streams, and the latency CDF of the other runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {"float32": "tab:blue", "bfloat16": "tab:orange", "int8": "tab:green"}
    ax, sweep = axes[0], [r for r in rows if r["run"] == "sweep"]
    for dtype, color in colors.items():
        sel = [r for r in sweep if r["dtype"] == dtype]
        for key, style in (("p50_ms", "--"), ("p99_ms", "-")):
            if sel:
                ax.plot([r["streams"] for r in sel], [r[key] for r in sel], style, marker="o",
                        color=color, label=f"{dtype} {key[:3]}")
    if sweep:
        ax.axhline(sweep[0]["limit_ms"], color="gray", lw=0.8,
                   label=f"{sweep[0]['limit_ms']:g} ms")
        ax.set_title(f"open loop at {sweep[0]['hz']:g} Hz per stream: latency")
        ax.set_yscale("log")
        ax.legend()
    ax.set_xlabel("streams")
    ax.set_ylabel("ms")
    ax = axes[1]
    for r in rows:
        if r["run"] in ("closed", "open", "echo", "mux-closed", "mux-open") and r["lat_ms"].size:
            lat = np.sort(r["lat_ms"])
            ax.plot(lat, np.arange(1, lat.size + 1) / lat.size,
                    color=colors.get(r["dtype"]), ls={"closed": "-", "open": "--",
                                                      "mux-closed": "-.", "mux-open": (0, (1, 1))
                                                      }.get(r["run"], ":"),
                    label=f"{r['run']} {r['dtype']}, {r['streams']} streams")
    if ax.lines:
        ax.set_xscale("log")
        ax.legend(fontsize=8)
    ax.set_xlabel("latency, ms")
    ax.set_ylabel("fraction of replies")
    ax.set_title("latency CDF")
    for ax, axis in ((axes[0], axes[0].yaxis), (axes[1], axes[1].xaxis)):
        if axis.get_scale() == "log":   # ticks at 1, 2, 5 times powers of 10, plainly written
            axis.set_major_locator(LogLocator(subs=(1, 2, 5)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
