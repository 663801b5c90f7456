"""Load test of the served model: fastln-serve in a subprocess on 127.0.0.1,
driven over its WebSocket protocols (a connection per stream, or many streams
on each of --connections multiplexed connections; binary frames) by this
process, for an LN-LSTM (I=128, H=256, default initialization, seed 0)
in each of --dtypes: float32, bfloat16 and int8 (the float32 model through
fastln.rnn.quantize: int8 weights with float32 row scales; its x and y frames
are float32), all three by default.

    python -m fastln.serve.loadtest                     # every run below, every dtype
    python -m fastln.serve.loadtest --quick             # a few streams, every run once
    python -m fastln.serve.loadtest --dtypes float32 --streams 64 --no-write
    python -m fastln.serve.loadtest --dtypes float32,int8 --runs closed --no-write

The runs, per dtype (--runs picks some of them; all by default):

- echo: --streams closed-loop streams (below) against ``fastln-serve --echo``
  (the same frames, no model): the transport's own ceiling.
- closed: --streams streams of --steps steps; each sends its next frame as soon
  as a reply comes (--inflight frames outstanding per stream).
- open: --streams streams sending at --hz on a fixed schedule, each with a
  random phase, whether or not the last reply came; latency counts from the
  scheduled send time, so a slow reply hides no later delay.
- sweep: open loop at --sweep-hz over --sweep-streams, stopping after the
  first count whose p99 reaches --p99-ms.
- restart: --restart-streams closed-loop streams; partway, the server gets
  SIGTERM and exits, a new one starts on the same --state-file, and the clients
  reconnect without new=1 and continue from the hello's t.
- mux-closed: the closed loop's streams on --connections multiplexed
  connections (fastln.serve.mux, the streams split evenly among them): each
  frame holds one step of every stream of its connection, and the next goes
  when a reply comes (--inflight frames outstanding per connection). Before
  it, the engine alone in this process: ``StreamTable.step`` of 256 streams
  (B = 256, or --streams if fewer) for about a second, the "engine" row.
- mux-open: the open loop's streams on --connections multiplexed
  connections, each connection sending one frame of all its streams at --hz
  with a random phase (its streams keep one schedule, as a client that
  gathers them does).

Every reply is compared bit for bit with the same stream run alone in this
process (fastln.serve.model's reference_run: B=1 steps over stream_inputs), echo's with
zero bytes. A "mismatch" is a reply that differs; an "error" an unexpected
close, a failed connection or a stream unfinished at the time limit; "lost" a
stream that could not resume after the restart, or whose hello's t differs
from the replies it got. The exit code is 1 if any run has one.

A multiplexed run's latencies count once per step (a frame's latency for each
of its steps), its mismatches per row.

The client is one asyncio process (uvloop when importable, picows listeners)
on the machine of the server: the two share its cores. Prints a markdown table
and the closed loop's ratios (each dtype's steps/s over echo's, and over the
float32 model's), and writes them to RESULTS.md, and the latency plot to
serve_latency.png, in --outdir (the current folder by default; --no-write:
neither). A --quick run, or one of only some --runs, writes them only to an
--outdir given: its numbers are a smoke test or a part, and the files in the
current folder keep a full run's.
"""
import argparse
import asyncio
import contextlib
import json
import os
import platform
import resource
import signal
import sys
import tempfile
import time

import numpy as np

import fastln
from fastln import _selfcheck
from fastln.rnn import LNLSTM, StreamTable, quantize

from . import needs_extra
from .model import (
    HelpFormatter,
    bfloat16,
    input_dtype,
    load_model,
    reference_run,
    save_model,
    stream_inputs,
)

try:
    import uvloop
except ImportError:   # plain asyncio
    uvloop = None  # type: ignore[assignment]

with needs_extra(__name__):
    import picows
    from picows import WSError, WSListener, WSMsgType, ws_connect

    from .client import run, run_server
    from .mux import PATH as MUX_PATH
    from .mux import frame_bytes, header_bytes

RESULTS, FIGURE = "RESULTS.md", "serve_latency.png"   # written to --outdir
BINARY, TEXT, CLOSE = WSMsgType.BINARY, WSMsgType.TEXT, WSMsgType.CLOSE
RESTART_CODE = 1012
CONNECT_BATCH = 64   # connections opened concurrently
DTYPES = ("float32", "bfloat16", "int8")
RUNS = ("echo", "closed", "open", "sweep", "restart", "mux-closed", "mux-open")
ENGINE_BATCH = 256   # the engine row's batch: streams stepped together in-process


# ---------------------------------------------------------------- the clients

class References:
    """Per stream index: its x frames and the y of its run alone, as one bytes
    object each (step t at [t * size, (t + 1) * size)), computed when first asked for."""

    def __init__(self, model, seed):
        self.model, self.seed, self.cache = model, seed, {}
        self.x_bytes = 4 * model.input_size   # float32 x frames
        self.y_bytes = model.hidden_size * reference_run(
            model, np.zeros((1, model.input_size), np.float32)).dtype.itemsize

    def get(self, index, steps):
        have = self.cache.get(index)
        if have is None or have[0] < steps:
            xs = stream_inputs(self.seed, index, steps, self.model.input_size)
            have = (steps, xs.tobytes(), reference_run(self.model, xs).tobytes())
            self.cache[index] = have
        return have[1], have[2]


class Run:
    """The counters that the streams of one run share."""

    def __init__(self, streams):
        self.errors = self.mismatches = self.lost = 0
        self.messages = []
        self.pending = streams
        self.done = asyncio.get_running_loop().create_future()
        self.restarting = False   # closes with 1012 are expected

    def fail(self, kind, message):
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.messages) < 10:
            self.messages.append(message)

    def finished(self):
        self.pending -= 1
        if self.pending <= 0 and not self.done.done():
            self.done.set_result(None)


class Stream(WSListener):
    """One client stream over one WebSocket. ``sent_at[t]`` is when step t was
    sent (closed loop) or was due (open loop); a reply's latency counts from it.
    Replies come in order, so the next reply is step ``received``."""

    width = 1   # the streams a frame steps
    def __init__(self, run, sid, refs, index, steps, inflight=0, echo=False):
        super().__init__()
        self.xb, self.yb = refs.get(index, steps)
        if echo:   # the echo server answers zero bytes of y's size
            self.yb = bytes(len(self.yb))
        self.run, self.sid, self.steps = run, sid, steps
        self.nx, self.ny, self.inflight = refs.x_bytes, refs.y_bytes, inflight
        self.sent = self.received = 0
        self.sent_at = [0.0] * steps
        self.lat = []
        self.transport = self.hello = self.token = None
        self.is_done = False
        self.close_code = None

    async def connect(self, ws, new, timeout):
        """Opens the WebSocket to the server at ws (ws://host:port) and waits for
        the hello; returns its JSON or None. A reconnect presents the resume
        token of the first hello."""
        self.hello = asyncio.get_running_loop().create_future()
        self.close_code = None
        url = f"{ws}/ws/{self.sid}" + ("?new=1" if new else f"?token={self.token}")
        try:
            await asyncio.wait_for(ws_connect(lambda: self, url,
                                              websocket_handshake_timeout=timeout), timeout)
            return await asyncio.wait_for(self.hello, timeout)
        except (OSError, WSError, asyncio.TimeoutError) as e:
            self.end("errors", f"{self.sid}: connect: {type(e).__name__} {e}")
            return None

    def end(self, kind=None, message=""):
        """Marks the stream done, counting a failure of ``kind`` if given."""
        if kind:
            self.run.fail(kind, message)
        if not self.is_done:
            self.is_done = True
            self.run.finished()

    def pump(self):
        """Closed loop: sends frames until ``inflight`` wait for replies."""
        k, limit = self.sent, min(self.steps, self.received + self.inflight)
        tr, nx, xb, sent_at = self.transport, self.nx, self.xb, self.sent_at
        while k < limit:
            sent_at[k] = time.perf_counter()
            tr.send(BINARY, xb[k * nx:(k + 1) * nx])
            k += 1
        self.sent = k

    def on_ws_connected(self, transport):
        self.transport = transport

    def on_ws_frame(self, transport, frame):
        kind = frame.msg_type
        if kind is BINARY:
            now = time.perf_counter()
            t = self.received
            if t >= self.steps:
                self.end("errors", f"{self.sid}: a reply past step {self.steps}")
                return
            ny = self.ny
            payload = frame.get_payload_as_bytes()
            if payload != self.yb[t * ny:(t + 1) * ny]:
                self.differs(t, payload)
            self.lat.append(now - self.sent_at[t])
            self.received = t = t + 1
            if t == self.steps:
                self.end()
            elif self.inflight:
                self.pump()
        elif kind is TEXT:
            if not self.hello.done():
                hello = json.loads(frame.get_payload_as_utf8_text())
                self.token = hello.get("token")
                self.hello.set_result(hello)
        elif kind is CLOSE:
            code = frame.get_close_code()
            self.close_code = int(getattr(code, "value", code))
            transport.send_close(code)
            transport.disconnect()
            if not (self.is_done or self.close_code == RESTART_CODE and self.run.restarting):
                self.end("errors", f"{self.sid}: closed with {self.close_code} at step "
                                   f"{self.received}: {frame.get_close_message()[:200]!r}")

    def differs(self, t, payload):
        """Counts the mismatch of the reply of step t."""
        self.run.fail("mismatches", f"{self.sid} step {t}: the reply differs from the stream "
                                    f"run alone")

    def on_ws_disconnected(self, transport):
        if self.transport is transport:
            self.transport = None
        if self.hello is not None and not self.hello.done():
            self.hello.set_result(None)
        if not self.is_done and not self.run.restarting:
            self.end("errors", f"{self.sid}: disconnected at step {self.received} "
                               f"(close code {self.close_code})")

    def close(self):
        if self.transport is not None:
            self.transport.send_close(picows.WSCloseCode.OK)
            self.transport.disconnect()


class MuxConn(Stream):
    """The streams first .. first + width - 1 of a run on one multiplexed
    connection (fastln.serve.mux). Each frame holds one step of each of them,
    so the connection runs as one stream of wide frames: xb holds every
    frame's bytes (header and x rows), yb every reply's, and a reply counts
    width steps."""

    def __init__(self, run, tag, refs, first, width, steps, inflight=0, echo=False):
        WSListener.__init__(self)
        self.run, self.steps, self.inflight, self.width = run, steps, inflight, width
        self.sids = [f"s{i}-{tag}" for i in range(first, first + width)]
        self.sid = f"mux{first}-{tag}"
        pairs = [refs.get(i, steps) for i in range(first, first + width)]
        head = np.zeros(header_bytes(width) // 4, "<u4")
        head[0], head[1:width + 1] = width, np.arange(width)
        frames = np.empty((steps, 4 * len(head) + width * refs.x_bytes), np.uint8)
        frames[:, :4 * len(head)] = head.view(np.uint8)
        frames[:, 4 * len(head):] = np.stack(
            [np.frombuffer(xb, np.uint8, steps * refs.x_bytes).reshape(steps, -1)
             for xb, _ in pairs], axis=1).reshape(steps, -1)
        self.xb, self.nx = frames.tobytes(), frames.shape[1]
        self.row = refs.y_bytes
        self.ny = width * refs.y_bytes
        self.yb = bytes(steps * self.ny) if echo else np.stack(
            [np.frombuffer(yb, np.uint8, steps * refs.y_bytes).reshape(steps, -1)
             for _, yb in pairs], axis=1).tobytes()
        self.sent = self.received = 0
        self.sent_at = [0.0] * steps
        self.lat = []
        self.transport = self.hello = self.opened = None
        self.tokens = {}
        self.is_done = False
        self.close_code = None

    async def connect(self, ws, new, timeout):
        """Opens the connection, waits for the hello, and opens the streams
        (new, or with their tokens); returns {"t": their step count}, or
        None when that failed or the streams' counts differ."""
        loop = asyncio.get_running_loop()
        self.hello, self.opened, self.close_code = loop.create_future(), None, None
        try:
            await asyncio.wait_for(ws_connect(lambda: self, f"{ws}{MUX_PATH}",
                                              websocket_handshake_timeout=timeout), timeout)
            if await asyncio.wait_for(self.hello, timeout) is None:
                raise ConnectionError("no hello")
            self.opened = loop.create_future()
            self.transport.send(TEXT, json.dumps({"open": [
                {"stream": sid, "new": True} if new else {"stream": sid,
                                                          "token": self.tokens.get(sid)}
                for sid in self.sids]}).encode())
            entries = await asyncio.wait_for(self.opened, timeout)
        except (OSError, WSError, ConnectionError, asyncio.TimeoutError) as e:
            self.end("errors", f"{self.sid}: connect: {type(e).__name__} {e}")
            return None
        if [e.get("index") for e in entries] != list(range(self.width)):
            refused = next((e for e in entries if "index" not in e), entries[0])
            self.end("errors", f"{self.sid}: open: {refused}")
            return None
        self.tokens = {e["stream"]: e["token"] for e in entries}
        ts = {e["t"] for e in entries}
        return {"t": ts.pop() if len(ts) == 1 else None}

    def on_ws_frame(self, transport, frame):
        if frame.msg_type is not TEXT:
            super().on_ws_frame(transport, frame)
            return
        message = json.loads(frame.get_payload_as_utf8_text())
        if not self.hello.done():
            self.hello.set_result(message)
        elif self.opened is not None and not self.opened.done() and "opened" in message:
            self.opened.set_result(message["opened"])
        else:
            self.end("errors", f"{self.sid}: an unexpected text frame at step "
                               f"{self.received}: {str(message)[:200]}")

    def differs(self, t, payload):
        """Counts each row of the reply of step t that differs."""
        row, want = self.row, self.yb[t * self.ny:(t + 1) * self.ny]
        for i in range(self.width):
            if payload[i * row:(i + 1) * row] != want[i * row:(i + 1) * row]:
                self.run.fail("mismatches", f"{self.sids[i]} step {t}: the reply differs "
                                            f"from the stream run alone")


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
        hellos += await asyncio.gather(*(s.connect(ws, new, timeout)
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
    for s in streams:
        s.close()
    await asyncio.sleep(0.05)


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
            if s.transport is not None and not s.is_done:
                nx = s.nx
                s.sent_at[k] = due
                s.transport.send(BINARY, s.xb[k * nx:(k + 1) * nx])
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
        clients = [MuxConn(run, runtag, refs, first, width, steps, inflight, echo)
                   for first, width in parts]
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
            if s.transport is not None and not s.is_done:
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
            if s.transport is not None:
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
        while any(s.transport is not None for s in clients) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        server = await loop.run_in_executor(None, stack.enter_context, run_server(*args))
        run.restarting = False
        down = [s for s in clients if not s.is_done or s.close_code is not None]
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
            elif s.transport is not None:
                s.pump()
        await wait_done(run, clients, max(1.0, deadline - time.monotonic()))
        seconds = time.perf_counter() - start
        await close_all(clients)
    print(f"    restart: {midway} of {streams} streams resumed partway", flush=True)
    return result(run, clients, seconds)


# ---------------------------------------------------------------- the runs

def summary(run, dtype, out, hz=None):
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
    for message in out["messages"][:5]:
        print("   ", message, flush=True)
    return row


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


def make_model(args, dtype):
    """The load test's LN-LSTM in dtype: float32, bfloat16 (model.to), or int8
    (fastln.rnn.quantize of the float32 model)."""
    model = LNLSTM(args.input, args.hidden, seed=args.seed)
    if dtype == "bfloat16":
        model = model.to(bfloat16())
    elif dtype == "int8":
        model = quantize(model)
    return model


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
    for i in range(max(args.streams if need else 0, args.restart_streams if restart else 0)):
        refs.get(i, max(steps, args.restart_steps if restart and i < args.restart_streams
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
    with contextlib.ExitStack() as stack:
        if runs & {"closed", "open", "sweep", "mux-closed", "mux-open"}:
            server = stack.enter_context(run_server("--model", path, "--capacity", capacity,
                                                    *common))
        if "closed" in runs:
            rows.append(summary("closed", dtype, run(drive(
                server, refs, "closed", args.streams, args.steps, "closed",
                inflight=args.inflight, **kw))))
        if "mux-closed" in runs:
            rows.append(engine_row(args, dtype, refs.model))
            rows.append(summary("mux-closed", dtype, run(drive(
                server, refs, "mux", args.streams, args.steps, "closed",
                inflight=args.inflight, connections=args.connections, **kw))))
        if "open" in runs:
            rows.append(summary("open", dtype, run(drive(
                server, refs, "open", args.streams, open_steps, "open", hz=args.hz, **kw)),
                hz=args.hz))
        if "mux-open" in runs:
            rows.append(summary("mux-open", dtype, run(drive(
                server, refs, "mux-open", args.streams, open_steps, "open", hz=args.hz,
                connections=args.connections, **kw)), hz=args.hz))
        for n in args.sweep_streams if "sweep" in runs else ():
            started = time.monotonic()
            for i in range(n):
                refs.get(i, sweep_steps)
            if time.monotonic() - started > 1:
                print(f"    (references of {n} streams: {time.monotonic() - started:.1f} s)",
                      flush=True)
            row = summary("sweep", dtype, run(drive(
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
    return rows, largest


def run_all(args, workdir):
    """The --runs of every dtype of --dtypes; returns the table's rows and
    {dtype: the sweep's answer}."""
    rows, largest = [], {}
    for dtype in args.dtypes:
        got, largest[dtype] = run_dtype(args, dtype, workdir)
        rows += got
    return rows, largest


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
        f"{'uvloop' if uvloop else 'asyncio'}) and the server share these "
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


def names_of(what, choices):
    """argparse's type of a comma-separated list of some of choices."""
    def parse(text):
        names = [n.strip() for n in text.split(",") if n.strip()]
        bad = [n for n in names if n not in choices]
        if bad or not names:
            raise argparse.ArgumentTypeError(
                f"expected {what}s of {', '.join(choices)}, got {text!r}")
        return names
    return parse


def make_parser():
    """The command line's parser; every option shows its default in --help."""
    p = argparse.ArgumentParser(prog="python -m fastln.serve.loadtest",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="4 streams (on 2 multiplexed connections), 20 steps, every run once; "
                        "writes its files only to an --outdir given")
    p.add_argument("--dtypes", nargs="+", type=names_of("dtype", DTYPES), default=list(DTYPES),
                   metavar="DTYPE", help=f"the model's dtypes, of {', '.join(DTYPES)} "
                   f"(int8: the float32 model through fastln.rnn.quantize), separated by "
                   f"spaces or commas")
    p.add_argument("--runs", nargs="+", type=names_of("run", RUNS), default=list(RUNS),
                   metavar="RUN", help=f"the runs, of {', '.join(RUNS)}, separated by spaces "
                   f"or commas; only some of them: writes its files only to an --outdir "
                   f"given")
    p.add_argument("--streams", type=int, default=256, help="streams of closed, echo and open")
    p.add_argument("--steps", type=int, default=400, help="steps per stream of closed and echo")
    p.add_argument("--inflight", type=int, default=1,
                   help="frames outstanding per stream (per connection, multiplexed) in the "
                        "closed loops")
    p.add_argument("--connections", type=int, default=8,
                   help="multiplexed connections of mux-closed and mux-open, the streams "
                        "split evenly among them")
    p.add_argument("--hz", type=float, default=40.0, help="frames per second per open stream")
    p.add_argument("--seconds", type=float, default=10.0, help="length of the open-loop run")
    p.add_argument("--sweep-hz", type=float, default=50.0, help="frames per second per "
                   "stream in the sweep")
    p.add_argument("--sweep-streams", type=int, nargs="+",
                   default=[256, 320, 384, 448, 512, 576, 640, 704, 768, 1024, 1536, 2048],
                   help="stream counts of the sweep, tried in order")
    p.add_argument("--sweep-seconds", type=float, default=4.0, help="length of a sweep run")
    p.add_argument("--p99-ms", type=float, default=20.0,
                   help="the sweep stops after the first count whose p99 reaches this")
    p.add_argument("--restart-streams", type=int, default=64, help="streams of the restart run")
    p.add_argument("--restart-steps", type=int, default=400, help="steps per stream of the "
                   "restart run; the server restarts after 40%% of all")
    p.add_argument("--input", type=int, default=128, help="the model's input_size I")
    p.add_argument("--hidden", type=int, default=256, help="the model's hidden_size H")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds the weights, the inputs and the open-loop phases")
    p.add_argument("--threads", type=int, default=1,
                   help="fastln threads of the server and of the reference run")
    p.add_argument("--max-queue-per-stream", type=int, default=256,
                   help="the server's --max-queue-per-stream")
    p.add_argument("--time-limit", type=float, default=60.0,
                   help="seconds per run at most (after an open loop's schedule)")
    p.add_argument("--timeout", type=float, default=10.0,
                   help="seconds per connection and hello at most")
    p.add_argument("--outdir",
                   help=f"the folder to write {RESULTS} and {FIGURE} to; None: the current "
                        f"folder, for a full run only")
    p.add_argument("--no-write", action="store_true", help=f"write neither {RESULTS} nor {FIGURE}")
    return p


def main(argv=None):
    p = make_parser()
    args = p.parse_args(argv)
    # a value given of --dtypes or --runs is a list (of its commas); each name once, in order
    for name in ("dtypes", "runs"):
        values = getattr(args, name)
        setattr(args, name, list(dict.fromkeys(
            v for vs in values for v in (vs if isinstance(vs, list) else [vs]))))
    if args.quick:
        args.streams, args.steps, args.restart_streams, args.restart_steps = 4, 20, 4, 200
        args.seconds, args.sweep_seconds, args.sweep_streams = 0.5, 0.4, [4, 8]
        args.connections = 2
    counts = (args.streams, args.steps, args.inflight, args.restart_streams, args.restart_steps,
              args.threads, args.max_queue_per_stream, args.input, args.hidden,
              args.connections, *args.sweep_streams)
    if min(counts) < 1:
        p.error("--streams, --steps, --inflight, --restart-streams, --restart-steps, --threads, "
                "--max-queue-per-stream, --input, --hidden, --connections and --sweep-streams "
                "must be at least 1")
    if args.outdir is not None and args.no_write:
        p.error("--outdir names a folder to write to, and --no-write says to write nothing")
    if args.inflight > args.max_queue_per_stream:
        p.error(f"--inflight {args.inflight} is over --max-queue-per-stream "
                f"{args.max_queue_per_stream}: the server would close the streams")
    if not min(args.hz, args.seconds, args.sweep_hz, args.sweep_seconds, args.p99_ms,
               args.time_limit, args.timeout) > 0:
        p.error("--hz, --seconds, --sweep-hz, --sweep-seconds, --p99-ms, --time-limit and "
                "--timeout must be above 0")
    fastln.set_num_threads(args.threads)
    # a socket per stream on each side: the server inherits this process's limit
    need = 2 * max(args.streams, *args.sweep_streams) + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (
                need if hard == resource.RLIM_INFINITY else min(need, hard), hard))
    command = "python -m fastln.serve.loadtest " + " ".join(
        sys.argv[1:] if argv is None else argv)
    print(table([], header=True), flush=True)
    with tempfile.TemporaryDirectory() as workdir:
        try:
            rows, largest = run_all(args, workdir)
        except (RuntimeError, OSError) as e:   # a server that did not start, or died
            print(f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
            return 1
    print()
    print(table(rows))
    for line in ratios(rows):
        print(line)
    if "sweep" in args.runs:
        print(largest_line(largest, args))
    partial = args.quick or set(args.runs) != set(RUNS)
    if args.no_write:
        pass
    elif partial and args.outdir is None:
        print(f"\nnothing written: {'--quick' if args.quick else '--runs ' + ' '.join(args.runs)}"
              f" is a {'smoke test' if args.quick else 'part of a run'}, and {RESULTS} and "
              f"{FIGURE} in the current folder keep a full run's results; --outdir DIR "
              f"writes these to DIR")
    else:
        outdir = args.outdir or "."
        results, figure = (os.path.join(outdir, name) for name in (RESULTS, FIGURE))
        os.makedirs(outdir, exist_ok=True)
        write_results(results, rows, largest, args, command.strip())
        plot(rows, figure)
        print(f"\nwrote {results} and {figure}")
    return 1 if any(r["errors"] or r["mismatches"] or r["lost"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
