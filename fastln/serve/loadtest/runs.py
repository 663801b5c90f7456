"""The load generator's runs of one model dtype: its model, the single-stream
references, the servers, and each run the command line asks for, in order."""
import contextlib
import os
import time

import numpy as np

from fastln.rnn import LNLSTM, quantize

from ..extra import needs_extra
from ..frames import frame_bytes
from ..loop import run
from ..model import bfloat16, load_model, save_model

with needs_extra(__name__):
    from ..client import run_server
    from .clients import References
    from .crash import drive_crash, drive_outage, programs
    from .drive import drive, drive_restart, engine_rate, split
    from .procs import RedisServer
    from .report import summary, table

ENGINE_BATCH = 256   # the engine row's batch: streams stepped together in-process
MUX_CRASH = 4        # mux-crash's steps per stream, in --crash-steps


def make_model(args, dtype):
    """The load test's LN-LSTM in dtype: float32, bfloat16 (model.to), or int8
    (fastln.rnn.quantize of the float32 model)."""
    model = LNLSTM(args.input, args.hidden, seed=args.seed)
    if dtype == "bfloat16":
        model = model.to(bfloat16())
    elif dtype == "int8":
        model = quantize(model)
    return model


def engine_row(args, dtype, model):
    """The engine alone in this process (engine_rate), as a row of the table."""
    batch = min(ENGINE_BATCH, args.streams)
    rate = engine_rate(model, batch, 0.25 if args.quick else 1.0)
    row = {"run": "engine", "dtype": dtype, "hz": None, "streams": batch, "connections": None,
           "steps": 0, "steps_per_s": rate, "p50_ms": None, "p99_ms": None, "cpu_us": None,
           "mean_batch": float(batch), "errors": 0, "mismatches": 0, "lost": 0,
           "lat_ms": np.zeros(0)}
    print(table([row], header=False), flush=True)
    return row


def run_dtype(args, dtype, workdir):
    """The --runs of one model dtype; returns the table's rows and the sweep's
    answer (None when no count passed, or no sweep ran)."""
    runs = set(args.runs)
    path = os.path.join(workdir, f"lnlstm_{dtype}.npz")
    save_model(path, make_model(args, dtype))
    # the references come from the file the server loads, as the server's model does
    refs = References(load_model(path), args.seed)
    open_steps = max(1, round(args.hz * args.seconds))
    sweep_steps = max(1, round(args.sweep_hz * args.sweep_seconds))
    started = time.monotonic()
    # each stream's steps in the runs asked for, computed before they start (the
    # sweep's as it goes)
    need = [args.steps] if runs & {"echo", "closed", "mux-closed"} else []
    need += [open_steps] if runs & {"open", "mux-open"} else []
    steps, restart = max(need, default=0), "restart" in runs
    crash = runs & {"crash", "mux-crash", "outage"}
    for i in range(max(args.streams if need else 0, args.restart_streams if restart else 0,
                       args.crash_streams if crash else 0)):
        refs.get(i, max(steps, args.restart_steps if restart and i < args.restart_streams
                        else 0, crash_steps(args, runs) if crash and i < args.crash_streams
                        else 0))
    print(f"{dtype}: single-stream references in {time.monotonic() - started:.1f} s",
          flush=True)
    # a multiplexed frame of the widest connection fits --max-frame
    widest = max(w for _, w in split(args.streams, args.connections))
    common = ["--threads", args.threads, "--max-queue-per-stream", args.max_queue_per_stream,
              "--max-frame", max(1 << 16, frame_bytes(widest, refs.x_bytes))]
    capacity = 2 * (args.streams + max(args.sweep_streams)) + 64
    rows, largest = [], None
    kw = dict(seed=args.seed, time_limit=args.time_limit, timeout=args.timeout)
    # echo first, closed next: the two whose ratio the results give, close in time
    if "echo" in runs:
        with run_server("--model", path, "--echo", "--capacity", capacity, *common) as server:
            rows.append(summary("echo", dtype, run(drive(
                server, refs, "echo", args.streams, args.steps, "closed",
                inflight=args.inflight, echo=True, **kw))))
    tag = "" if args.checkpoint == "none" else "+" + args.checkpoint
    with contextlib.ExitStack() as stack:
        if runs & {"closed", "open", "sweep", "mux-closed", "mux-open"}:
            server = stack.enter_context(run_server(
                "--model", path, "--capacity", capacity, *common,
                *checkpoint_args(args, stack, os.path.join(workdir, f"ckpt-{dtype}"))))
        if "closed" in runs:
            rows.append(summary("closed" + tag, dtype, run(drive(
                server, refs, "closed", args.streams, args.steps, "closed",
                inflight=args.inflight, **kw))))
        if "mux-closed" in runs:
            rows.append(engine_row(args, dtype, refs.model))
            rows.append(summary("mux-closed" + tag, dtype, run(drive(
                server, refs, "mux", args.streams, args.steps, "closed",
                inflight=args.inflight, connections=args.connections, **kw))))
        if "open" in runs:
            rows.append(summary("open" + tag, dtype, run(drive(
                server, refs, "open", args.streams, open_steps, "open", hz=args.hz, **kw)),
                hz=args.hz))
        if "mux-open" in runs:
            rows.append(summary("mux-open" + tag, dtype, run(drive(
                server, refs, "mux-open", args.streams, open_steps, "open", hz=args.hz,
                connections=args.connections, **kw)), hz=args.hz))
        for n in args.sweep_streams if "sweep" in runs else ():
            started = time.monotonic()
            for i in range(n):
                refs.get(i, sweep_steps)
            if time.monotonic() - started > 1:
                print(f"    (references of {n} streams: {time.monotonic() - started:.1f} s)",
                      flush=True)
            row = summary("sweep" + tag, dtype, run(drive(
                server, refs, f"w{n}", n, sweep_steps, "open", hz=args.sweep_hz, **kw)),
                hz=args.sweep_hz)
            rows.append(dict(row, limit_ms=args.p99_ms))
            if row["p99_ms"] >= args.p99_ms or row["errors"] or not row["steps"]:
                break
            largest = n
    if "restart" in runs:
        rows.append(summary("restart", dtype, run(drive_restart(
            path, ["--capacity", capacity, *common], refs, args.restart_streams,
            args.restart_steps, args.inflight, os.path.join(workdir, f"{dtype}.state"),
            time_limit=args.time_limit, timeout=args.timeout))))
    cluster = ["--capacity", capacity, *common]
    limits = dict(time_limit=args.time_limit, timeout=args.timeout,
                  interval=args.checkpoint_interval)
    for name in ("crash", "mux-crash"):
        if name in runs:
            rows.append(summary(name, dtype, run(drive_crash(
                path, cluster, refs, args.crash_streams, crash_steps(args, {name}),
                args.inflight, args.nginx_conf, None if name == "crash" else args.connections,
                lease=args.lease, **limits))))
    if "outage" in runs:
        rows.append(summary("outage", dtype, run(drive_outage(
            path, cluster, refs, args.crash_streams, args.hz, args.nginx_conf, args.outage,
            connections=args.connections, seed=args.seed, **limits)), hz=args.hz))
    return rows, largest


def crash_steps(args, runs):
    """Steps per stream of the cluster runs: --crash-steps, and MUX_CRASH times
    that for mux-crash, whose steps go several times faster (the kill must
    come while the streams step)."""
    return args.crash_steps * (MUX_CRASH if "mux-crash" in runs else 1)


def checkpoint_args(args, stack, folder):
    """The server's options for --checkpoint: none, a directory, or a
    redis-server started for the runs (stopped when stack closes)."""
    if args.checkpoint == "none":
        return []
    interval = ["--checkpoint-interval", args.checkpoint_interval]
    if args.checkpoint == "dir":
        return ["--checkpoint-dir", folder, *interval]
    redis = RedisServer(programs()[1]).start()
    stack.callback(redis.close)
    return ["--checkpoint-store", redis.url, *interval]


def run_all(args, workdir):
    """The --runs of every dtype of --dtypes; returns the table's rows and
    {dtype: the sweep's answer}."""
    rows, largest = [], {}
    for dtype in args.dtypes:
        got, largest[dtype] = run_dtype(args, dtype, workdir)
        rows += got
    return rows, largest
