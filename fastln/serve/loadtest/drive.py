"""The load generator's drivers: one run of streams against a server, in a
closed loop (the next frame when a reply comes) or an open one (frames on
a fixed schedule), on connections of one stream or multiplexed ones; the
restart run; and the engine alone, for comparison.
"""
import asyncio
import contextlib
import signal
import time

import numpy as np

from fastln.rnn import StreamTable

from ..extra import needs_extra
from ..model import input_dtype

with needs_extra(__name__):
    from ..client import run_server
    from .clients import MuxConn, Run, Stream

CONNECT_BATCH = 64   # connections opened concurrently


def split(streams, connections):
    """(first, width) of each connection: streams split as evenly as can be."""
    n = max(1, min(connections, streams))
    widths = [streams // n + (k < streams % n) for k in range(n)]
    return [(sum(widths[:k]), w) for k, w in enumerate(widths)]


def engine_rate(model, batch, seconds):
    """Steps per second of StreamTable.step over batch streams in this process
    (random x; the best of a few passes of about seconds / 4 each)."""
    table = StreamTable(model, batch)
    ids = [table.open() for _ in range(batch)]
    x = np.random.default_rng(0).standard_normal((batch, model.input_size), np.float32)
    x = x.astype(input_dtype(model))
    for _ in range(3):
        table.step(ids, x)
    best = 0.0
    for _ in range(4):
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / 4:
            table.step(ids, x)
            n += 1
        best = max(best, n * batch / (time.perf_counter() - start))
    return best


async def connect_all(streams, ws, new, timeout):
    """Connects the streams, CONNECT_BATCH at a time; returns their hellos (None: failed)."""
    hellos = []
    for i in range(0, len(streams), CONNECT_BATCH):
        hellos += await asyncio.gather(*(s.open(ws, new, timeout)
                                         for s in streams[i:i + CONNECT_BATCH]))
    return hellos


async def wait_done(run, streams, seconds):
    """Waits until every stream is done, for seconds at most; the rest count as errors."""
    try:
        await asyncio.wait_for(asyncio.shield(run.done), seconds)
    except asyncio.TimeoutError:
        for s in streams:
            if not s.is_done:
                s.end("errors", f"{s.sid}: {s.received} of {s.steps} replies at the time limit")


async def close_all(streams):
    """Closes the streams' connections with 1000 (which ends them on the server)."""
    await asyncio.gather(*(s.close() for s in streams), return_exceptions=True)


def send_open_loop(streams, hz, rng, start):
    """Sends the streams' frames on a fixed schedule: stream i's step k is due at
    start + phase_i + k / hz, with phase_i uniform in one period. One callback
    sends every frame due, in the order of the due times, whether or not earlier
    replies came, and sleeps until the next is due (1 ms at least: a frame goes
    out up to a timer tick late, and its latency counts from its due time).
    Returns a list that holds, once the schedule is done, the seconds each frame
    went out after its due time."""
    period = 1.0 / hz
    phases = rng.random(len(streams)) * period
    order = np.argsort(phases)
    ordered, ph = [streams[j] for j in order], phases[order].tolist()
    n, steps, lags = len(streams), streams[0].steps, []
    loop = asyncio.get_running_loop()
    cursor = [0, 0]   # the round k and the position j of the next frame due

    def tick():
        now = time.perf_counter()
        k, j = cursor
        base = start + k * period
        while k < steps:
            due = base + ph[j]
            if due > now:
                break
            s = ordered[j]
            if s.connected and not s.is_done:
                nx = s.nx
                s.sent_at[k] = due
                s.send_frame(s.xb[k * nx:(k + 1) * nx])
                s.sent = k + 1
            lags.append(now - due)
            j += 1
            if j == n:
                j, k = 0, k + 1
                base = start + k * period
        cursor[:] = k, j
        if k < steps:   # at least 1 ms: uvloop runs a shorter timer at once, which spins
            loop.call_later(max(0.001, due - time.perf_counter()), tick)

    loop.call_at(loop.time() + max(0.0, start - time.perf_counter()), tick)
    return lags


async def drive(server, refs, runtag, streams, steps, mode, hz=0.0, inflight=1, echo=False,
                seed=0, time_limit=60.0, timeout=10.0, connections=None):
    """One run of ``streams`` streams of ``steps`` steps against ``server``:
    mode "closed" (``inflight`` frames outstanding) or "open" (``hz`` per stream),
    a connection per stream, or the streams on ``connections`` multiplexed ones.
    Returns the result's dict (see summary)."""
    inflight = inflight if mode == "closed" else 0
    if connections:
        parts = split(streams, connections)
        run = Run(len(parts))
        clients = [MuxConn(run, runtag, refs, range(first, first + width), steps, inflight,
                           echo) for first, width in parts]
    else:
        run = Run(streams)
        clients = [Stream(run, f"s{i}-{runtag}", refs, i, steps, inflight, echo)
                   for i in range(streams)]
    await connect_all(clients, server.ws, True, timeout)
    before = server.health()
    start, cpu = time.perf_counter(), time.process_time()
    lags = []
    if mode == "closed":
        for s in clients:
            if s.connected and not s.is_done:
                s.pump()
    else:
        start += 0.05
        lags = send_open_loop(clients, hz, np.random.default_rng([seed, streams]), start)
        time_limit += steps / hz
    await wait_done(run, clients, time_limit)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    after = server.health()
    await close_all(clients)
    out = result(run, clients, seconds, before, after, lags)
    out["client_us"] = cpu / out["steps"] * 1e6 if out["steps"] else None
    if "store" in after:          # a server that checkpoints: what it wrote meanwhile
        b, a = before["store"], after["store"]
        out["checkpoints"] = {"ok": a["checkpoints"]["ok"] - b["checkpoints"]["ok"],
                              "failed": a["checkpoints"]["failed"] - b["checkpoints"]["failed"],
                              "streams": a["streams_written"] - b["streams_written"],
                              "seconds": a["write_seconds"] - b["write_seconds"]}
    return out


def result(run, clients, seconds, before=None, after=None, lags=()):
    lat = np.concatenate([np.repeat(s.lat, s.width) for s in clients]) * 1e3 if clients else []
    out = {"streams": sum(s.width for s in clients),
           "connections": len(clients) if clients and isinstance(clients[0], MuxConn) else None,
           "steps": int(sum(s.received * s.width for s in clients)),
           "seconds": seconds, "lat_ms": np.asarray(lat, np.float64),
           "errors": run.errors, "mismatches": run.mismatches, "lost": run.lost,
           "messages": run.messages, "cpu_us": None, "mean_batch": None, "client_us": None,
           "lag_ms": np.percentile(lags, [50, 99]) * 1e3 if len(lags) else None}
    if before and after:
        steps = after["steps"] - before["steps"]
        if steps:
            out["cpu_us"] = (after["cpu_seconds"] - before["cpu_seconds"]) / steps * 1e6
        b0, b1 = before.get("batcher") or {}, after.get("batcher") or {}
        if b1.get("batches", 0) - b0.get("batches", 0):
            out["mean_batch"] = ((b1["steps"] - b0.get("steps", 0))
                                 / (b1["batches"] - b0.get("batches", 0)))
    return out


async def drive_restart(model_path, server_args, refs, streams, steps, inflight, state,
                        fraction=0.4, time_limit=60.0, timeout=10.0):
    """The restart run: closed-loop streams against a server with a state file;
    once ``fraction`` of the steps have replies, SIGTERM, a new server on the same
    file, and every stream reconnects (without new=1) and continues from the hello's t."""
    loop = asyncio.get_running_loop()
    args = ("--model", model_path, "--state-file", state, *server_args)
    run = Run(streams)
    clients = [Stream(run, f"s{i}-restart", refs, i, steps, inflight) for i in range(streams)]
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(run_server(*args))
        await connect_all(clients, server.ws, True, timeout)
        for s in clients:
            if s.connected:
                s.pump()
        deadline = time.monotonic() + time_limit
        while (sum(s.received for s in clients) < fraction * streams * steps
               and not run.done.done() and time.monotonic() < deadline):
            await asyncio.sleep(0.01)
        run.restarting = True
        server.proc.send_signal(signal.SIGTERM)
        while server.proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if server.proc.poll() != 0:
            run.fail("errors", f"the server's exit status after SIGTERM: {server.proc.poll()}")
        while any(s.connected for s in clients) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        server = await loop.run_in_executor(None, stack.enter_context, run_server(*args))
        run.restarting = False
        down = [s for s in clients if not s.is_done or s.closed is not None]
        hellos = await connect_all(down, server.ws, False, timeout)
        midway = sum(0 < s.received < s.steps for s in down)
        for s, hello in zip(down, hellos):
            if hello is None or hello.get("t") != s.received:
                run.fail("lost", f"{s.sid}: resumed with {hello and hello.get('t')} steps "
                                 f"run, {s.received} replies received")
                if hello is None:
                    continue
                s.received = min(hello["t"], s.steps)
            s.sent = s.received
            if s.received >= s.steps:
                s.end()
            elif s.connected:
                s.pump()
        await wait_done(run, clients, max(1.0, deadline - time.monotonic()))
        seconds = time.perf_counter() - start
        await close_all(clients)
    print(f"    restart: {midway} of {streams} streams resumed partway", flush=True)
    return result(run, clients, seconds)
