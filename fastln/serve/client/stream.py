"""StreamClient: one stream of a fastln-serve server on one WebSocket (the
protocol of fastln.serve.ws.stream), x and y as NumPy arrays.

With ``resume`` > 0 it reconnects after a drop, a restart or a move (see
:class:`StreamClient`) and replays the steps the server lost: it keeps the
x of the steps sent, and the y of those received, after the stream's last
durable step (the hello's ``durable``, then each ``{"durable": t}`` text
frame of the server), at most ``replay`` of each. On a reconnect whose hello
restores step t0, it resends x of steps t0 .. sent-1 in order, at most
:data:`~fastln.serve.client.wire.WINDOW` frames ahead of their replies; the
replies of steps already received are compared bit for bit with the kept
ones and not returned again, the others answer the waiting recv() calls.
"""
import asyncio
from collections import deque

import numpy as np

from ..errors import GONE, NOT_FOUND
from ..extra import needs_extra

with needs_extra(__name__):
    from .wire import (
        BINARY,
        WINDOW,
        Client,
        Closed,
        ReplayError,
        check_replay,
        dtype_of,
        replayed_differs,
        stream_url,
        trim,
    )


class StreamClient(Client):
    """One stream of a fastln-serve server; build it with :meth:`connect`.

    :attr:`t` counts the replies received, :attr:`token` is the resume
    token, :attr:`durable` the last step the server has made durable (None:
    none yet, or a server without checkpoints).

    **Reconnecting** (``resume`` > 0): when the connection ends without the
    client ending it (a drop, 1001, 1006, 1011, 1012, 4410), the client
    connects again to the same URL with its token, retrying drops and the
    refusals 1013, 4404 and 4409 for up to ``resume`` seconds; meanwhile
    send() keeps its x and recv() waits. The hello's ``t`` is the step the
    server restored (its last checkpoint after a crash): the client resends
    the steps from there. A restore it cannot replay (older than its oldest
    kept step, or newer than the replies it received) and a replayed reply
    that differs from the one received raise :class:`ReplayError` from the
    waiting and later calls, and close the connection with 1001. A stream
    that this client opened new and that has no durable step yet, refused
    with 4404 (its server died before the first checkpoint), is opened new
    again (a new token) and replayed from step 0. Every recv() returns each
    step's y exactly once. When ``resume`` seconds pass without a
    reconnect, the waiting and later calls raise :class:`Closed`.

    The stream keeps at most ``replay`` steps: ``replay`` x (I values) and
    ``replay`` y (H values), ``replay * (I + H) * itemsize`` bytes and about
    100 bytes of Python objects a step. A stream that runs more steps than
    that between two durable ones cannot be replayed from before the last
    ``replay`` steps."""

    def __init__(self):
        super().__init__()
        self._inflight = deque()   # futures of the replies not yet arrived, oldest first
        # the x of the last steps sent and the y of the last ones received (resume > 0)
        self._xs, self._ys = deque(maxlen=self.replay), deque(maxlen=self.replay)
        self._resent = self._at = 0   # in a replay: the next step to resend, the next reply's
        self._moved = False        # the last connection ended with 4410

    @classmethod
    async def connect(cls, url, stream_id, new=False, dtype="float32", timeout=10.0,
                      token=None, resume=0.0, replay=4096):
        """Connects to ``url`` (``ws://host:port``) for stream ``stream_id`` and
        waits for the hello; raises Closed if the server refuses. A new
        stream (``new=True``) gets its resume token in the hello
        (:attr:`token`); a reconnect presents it as ``token``. ``resume``:
        the seconds to keep reconnecting after a drop (0: none, the calls
        raise Closed); ``replay``: the steps kept for a replay."""
        self = cls()
        self._reconnects(resume, replay)
        self._xs, self._ys = deque(maxlen=replay), deque(maxlen=replay)
        self.url, self.id, self.dtype, self.timeout = url, stream_id, dtype, timeout
        self.new = new             # opened new here: a 4404 before a durable step reopens it
        h = await self._connect(stream_url(url, stream_id, new, token, dtype), timeout)
        self.t, self.token, self.durable = h["t"], h["token"], h.get("durable")
        self.x_dtype, self.y_dtype = dtype_of(h["x_dtype"]), dtype_of(h["y_dtype"])
        return self

    def send(self, x):
        """Sends one step's x, shape (input_size,); its reply comes from recv()."""
        if self._closed is not None:
            raise self._closed
        x = np.ascontiguousarray(x, self.x_dtype).view(np.uint8).data
        if self._keep:
            x = x.tobytes()
            self._xs.append(x)
        f = asyncio.get_running_loop().create_future()
        self._inflight.append(f)
        self._unread.append(f)
        if self._live:
            self._peer.transport.send(BINARY, x)
        elif self._peer.connected:   # a replay is being sent: x goes after it
            self._pump()

    async def recv(self):
        """y of the oldest step sent and not yet received."""
        return await self._oldest_unread()

    async def step(self, x):
        """One step: sends x and returns its y."""
        self.send(x)
        return await self.recv()

    def _arrived(self, payload):
        if self._slow:
            self._replayed(payload)
            return
        self.t += 1
        if self._keep:
            self._ys.append(payload)
        if self._inflight:
            f = self._inflight.popleft()
            if not f.done():       # a recv() that timed out or was cancelled drops its y
                f.set_result(np.frombuffer(payload, self.y_dtype))

    def _replayed(self, payload):
        """A reply during a replay: one already received is checked, another
        answers its recv()."""
        step = self._at
        self._at += 1
        if step < self.t:
            differs = replayed_differs(self.id, step, self.t, self._ys, payload)
            if differs is not None:
                self._fail(differs)
                return
        else:
            self.t += 1
            self._ys.append(payload)
            if self._inflight:
                f = self._inflight.popleft()
                if not f.done():
                    f.set_result(np.frombuffer(payload, self.y_dtype))
        if not self._live:
            self._pump()
        elif self._at >= self.t:   # every step resent, and no reply left to check
            self._slow = False

    def _pump(self):
        """Resends the kept x from the next step to resend on, at most WINDOW
        frames ahead of the replies; once every step sent is resent, send()
        writes its frames again."""
        xs = self._xs
        sent = self.t + len(self._inflight)
        first, send = sent - len(xs), self._peer.transport.send
        while self._resent < sent and self._resent - self._at < WINDOW:
            if self._resent < first:
                self._fail(ReplayError(self.id, f"step {self._resent} is no longer kept: more "
                                                f"than replay={self.replay} steps were sent "
                                                f"during the reconnect"))
                return
            send(BINARY, xs[self._resent - first])
            self._resent += 1
        if self._resent == sent:
            self._live = True
            self._slow = self._at < self.t

    def _text(self, message):
        """A text frame after the hello: ``{"durable": t}``, the last step
        the server has made durable: the kept steps before it are let go."""
        durable = message.get("durable") if isinstance(message, dict) else None
        if isinstance(durable, int):
            self.durable = durable
            trim(self._xs, self._ys, self.t + len(self._inflight), self.t, durable)

    def _dropped(self, closed):
        self._moved = closed.code == GONE

    async def _attempt(self):
        """One reconnect: the stream with its token (or opened new again, see
        the class), restored at the hello's t, and the replay started."""
        try:
            h = await self._connect_again(stream_url(self.url, self.id, False, self.token,
                                                     self.dtype, self.t))
            new = False
        except Closed as e:
            if e.code != NOT_FOUND or not (self.new and self.durable is None and not self._moved
                                           and len(self._xs) == self.t + len(self._inflight)):
                raise              # (above: every step kept, from step 0)
            h = await self._connect_again(stream_url(self.url, self.id, True, None, self.dtype))
            new = True
        sent = self.t + len(self._inflight)
        t0, self.token, self.durable = h["t"], h["token"], h.get("durable")
        self.new = self.new or new
        if self.durable is not None:
            trim(self._xs, self._ys, sent, self.t, self.durable)
        check_replay(self.id, t0, self.t, sent, self._xs, self._ys)
        self._resent = self._at = t0
        self._pump()

    def _unanswered(self):
        """Pops the futures of the replies not yet arrived, oldest first."""
        while self._inflight:
            yield self._inflight.popleft()
