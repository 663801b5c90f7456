"""The load generator's clients: streams of a fastln-serve server on the
client's :class:`~fastln.serve.client.wire.Peer`, one per connection
(:class:`Stream`) or many on one multiplexed connection (:class:`MuxConn`).
Each answers a reply in its callback, with no future per step: it checks
the reply bit for bit against the stream run alone, counts its latency,
and in a closed loop sends the next frame.
"""
import asyncio
import time

import numpy as np

from ..errors import RESTART
from ..extra import needs_extra
from ..frames import encode
from ..model import reference_run, stream_inputs

with needs_extra(__name__):
    from picows import WSError

    from ..client.wire import BINARY, Peer, mux_url, open_message, stream_url


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
        self.restarting = False   # closes with 1012, and drops, are expected

    def fail(self, kind, message):
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.messages) < 10:
            self.messages.append(message)

    def finished(self):
        self.pending -= 1
        if self.pending <= 0 and not self.done.done():
            self.done.set_result(None)


class Stream(Peer):
    """One client stream over one WebSocket. ``sent_at[t]`` is when step t was
    sent (closed loop) or was due (open loop); a reply's latency counts from it.
    Replies come in order, so the next reply is step ``received``."""

    width = 1       # the streams a frame steps
    quiet = False   # set while a failed reconnect closes: its end is no error

    def __init__(self, run, sid, refs, index, steps, inflight=0, echo=False):
        super().__init__()
        self.xb, self.yb = refs.get(index, steps)
        if echo:   # the echo server answers zero bytes of y's size
            self.yb = bytes(len(self.yb))
        self.run, self.sid, self.steps = run, sid, steps
        self.nx, self.ny, self.inflight = refs.x_bytes, refs.y_bytes, inflight
        self.sent = self.received = 0
        self.high = 0               # replies received before a crash: those below replay
        self.first_reply = None     # when the first reply after a reconnect came
        self.sent_at = [0.0] * steps
        self.lat = []
        self.token = None
        self.is_done = False

    async def open(self, ws, new, timeout):
        """Connects to the server at ws (ws://host:port) and returns the
        hello's JSON, or None when that failed (an error). A reconnect
        presents the resume token of the first hello."""
        try:
            return await self.attach(ws, new, timeout)
        except (OSError, WSError, asyncio.TimeoutError) as e:   # Closed is an OSError
            self.end("errors", f"{self.sid}: connect: {type(e).__name__} {e}")
            return None

    async def attach(self, ws, new, timeout):
        """open() without the error count: the hello, or the exception."""
        hello = await self.connect(stream_url(ws, self.sid, new, None if new else self.token),
                                   timeout)
        self.token = hello.get("token")
        return hello

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

    def on_binary(self, payload):
        now = time.perf_counter()
        t = self.received
        if t >= self.steps:
            self.end("errors", f"{self.sid}: a reply past step {self.steps}")
            return
        ny = self.ny
        if payload != self.yb[t * ny:(t + 1) * ny]:
            self.differs(t, payload)
        if self.first_reply is None:
            self.first_reply = now
        if t >= self.high:          # a replayed step's reply is checked, not counted again
            self.lat.append(now - self.sent_at[t])
        self.received = t = t + 1
        if t == self.steps:
            self.end()
        elif self.inflight:
            self.pump()

    def resume(self, t):
        """After a reconnect whose hello restores step t: the steps from t on
        go again, their replies checked against the stream run alone; False
        (the stream is lost) when t is past the replies received."""
        if t is None or t > self.received:
            self.end("lost", f"{self.sid}: resumed at step {t}, {self.received} replies "
                             f"received")
            return False
        self.high = max(self.high, self.received)
        self.sent = self.received = t
        self.first_reply = None
        if t >= self.steps:
            self.end()
        return True

    def on_close(self, closed):
        """An error, unless the stream is done, or the server restarts as
        the run expects (a close with 1012, or a drop)."""
        if self.quiet:
            return
        if not (self.is_done or self.run.restarting and closed.code in (RESTART, None)):
            self.end("errors", f"{self.sid}: {closed} at step {self.received}")

    def differs(self, t, payload):
        """Counts the mismatch of the reply of step t."""
        self.run.fail("mismatches", f"{self.sid} step {t}: the reply differs from the stream "
                                    f"run alone")


class MuxConn(Stream):
    """The streams of a run with the given indices on one multiplexed
    connection (fastln.serve.ws.mux). Each frame holds one step of each of
    them, so the connection runs as one stream of wide frames: xb holds every
    frame's bytes (header and x rows), yb every reply's, and a reply counts
    width steps."""

    def __init__(self, run, tag, refs, indices, steps, inflight=0, echo=False):
        Peer.__init__(self)
        indices = list(indices)
        width = len(indices)
        self.run, self.steps, self.inflight, self.width = run, steps, inflight, width
        self.indices = indices
        self.sids = [f"s{i}-{tag}" for i in indices]
        self.sid = f"mux{indices[0]}-{tag}"
        pairs = [refs.get(i, steps) for i in indices]

        def rows(data, size):   # (steps, width, size) of each stream's bytes
            return np.stack([np.frombuffer(d, np.uint8, steps * size).reshape(steps, size)
                             for d in data], axis=1)
        xs = rows([xb for xb, _ in pairs], refs.x_bytes)
        self.xb = b"".join(encode(np.arange(width), xs[t]) for t in range(steps))
        self.nx = len(self.xb) // steps
        self.row = refs.y_bytes
        self.ny = width * refs.y_bytes
        self.yb = bytes(steps * self.ny) if echo else rows([yb for _, yb in pairs],
                                                           refs.y_bytes).tobytes()
        self.sent = self.received = self.high = 0
        self.sent_at = [0.0] * steps
        self.lat = []
        self.first_reply = None
        self.opened = None
        self.tokens = {}
        self.is_done = False

    async def open(self, ws, new, timeout):
        """Connects, and opens the streams (new, or with their tokens);
        returns {"t": their step count}, or None when that failed or the
        streams' counts differ."""
        try:
            entries = await self.attach(ws, new, timeout)
        except (OSError, WSError, asyncio.TimeoutError) as e:
            self.end("errors", f"{self.sid}: connect: {type(e).__name__} {e}")
            return None
        if [e.get("index") for e in entries] != list(range(self.width)):
            refused = next((e for e in entries if "index" not in e), entries[0])
            self.end("errors", f"{self.sid}: open: {refused}")
            return None
        self.tokens = {e["stream"]: e["token"] for e in entries}
        ts = {e["t"] for e in entries}
        return {"t": ts.pop() if len(ts) == 1 else None}

    async def attach(self, ws, new, timeout):
        """Connects and sends the open message: its entries, or the exception."""
        await self.connect(mux_url(ws), timeout)
        self.opened = asyncio.get_running_loop().create_future()
        self.send_frame(open_message(self.sids, new, self.tokens), text=True)
        return await asyncio.wait_for(self.opened, timeout)

    def on_text(self, message):
        if self.opened is not None and not self.opened.done() and "opened" in message:
            self.opened.set_result(message["opened"])
        elif "durable" in message:
            pass        # a checkpoint: the run replays from what the server restores
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
