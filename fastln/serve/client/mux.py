"""MuxClient: many streams of a fastln-serve server on one WebSocket (the
multiplexed protocol of fastln.serve.ws.mux), x and y as NumPy arrays.

With ``resume`` > 0 it reconnects after a drop or a restart, reattaches the
streams that the server gives away (a ``gone`` notice), and replays the steps
the server lost (see :class:`MuxClient`). Each stream keeps the x of its
steps sent and the y of those received after its last durable step (the
``durable`` of its ``opened`` entry, then the server's ``{"durable":
[[index, t], ...]}`` text frames), at most ``replay`` of each. A replay sends
rounds: round r holds the rows of the streams whose restored step t0 + r is
below the steps they sent, in frames of at most ``rows_per_frame`` rows, at
most :data:`~fastln.serve.client.wire.WINDOW` frames ahead of their answers.
A replayed row either checks a kept y bit for bit or fills its row of the
original send()'s result; a send() is answered once all its rows are in.
"""
import asyncio
import json
from collections import deque

import numpy as np

from ..errors import NOT_FOUND
from ..extra import needs_extra
from ..frames import encode, frame_bytes

with needs_extra(__name__):
    from .wire import (
        BINARY,
        FIRST_DELAY,
        MAX_DELAY,
        RETRIED,
        TEXT,
        WINDOW,
        Client,
        Closed,
        ReplayError,
        check_replay,
        dtype_of,
        mux_url,
        open_entries,
        replayed_differs,
        trim,
    )

# seconds that a stream the server gave away (a gone notice) is retried on the
# same connection, at most resume: it comes back where a move failed (the
# stream returns to its source) or a shared store lets this server take it
GONE_RETRY = 2.0
COMPACT = (",", ":")   # json.dumps's separators of an open message


class FrameRefused(Exception):
    """A multiplexed frame the server refused, none of whose steps ran: a
    stream of it left the server (``code`` 4410, ``stream`` its id), or the
    server restarts (1012). With ``resume`` > 0: a stream that could not be
    reattached within ``resume`` seconds (``code`` its last refusal)."""

    def __init__(self, code, message, stream=None):
        super().__init__(f"refused with {code}: {message}")
        self.code, self.message, self.stream = code, message, stream


class MuxStream:
    """A stream attached to a :class:`MuxClient`: its id, its index on the
    connection (None while it is being reattached), its step count t (steps
    answered), its resume token, and its last durable step (None: none yet,
    or a server without checkpoints)."""

    __slots__ = ("id", "index", "t", "token", "durable", "new", "_sent", "_xs", "_ys",
                 "_targets", "_resend", "_hole", "_moved")

    def __init__(self, stream_id, index, t, token, durable=None, new=False, replay=None):
        self.id, self.index, self.t, self.token = stream_id, index, t, token
        self.durable, self.new = durable, new
        self._sent = t             # steps sent
        # with resume > 0: the x of the last steps sent, the y of the last ones received
        self._xs = deque(maxlen=replay) if replay is not None else None
        self._ys = deque(maxlen=replay) if replay is not None else None
        self._targets = deque()    # in a reconnect: (_Rows, row) of steps t .. sent-1
        self._resend = t           # in a replay: the next step to resend
        self._hole = None          # the step of its first row the server refused
        self._moved = False        # the server gave it away (gone): never reopened new


class _Rows:
    """The y rows that a frame sent before a reconnect, or a send() made
    during one, waits for: filled one by one by replayed answers, then its
    future's result."""

    __slots__ = ("fut", "y", "left")

    def __init__(self, fut, n, size, dtype):
        self.fut, self.y, self.left = fut, np.empty((n, size), dtype), n

    def fill(self, i, row):
        self.y[i] = np.frombuffer(row, self.y.dtype)
        self.left -= 1
        if not self.left and not self.fut.done():
            self.fut.set_result(self.y)

    def fail(self, exc):
        if not self.fut.done():
            self.fut.set_exception(exc)
            self.fut.exception()   # marked as seen: recv() raises it, if it is ever called


class MuxClient(Client):
    """Many streams of a fastln-serve server on one WebSocket (the protocol
    of fastln.serve.ws.mux); build it with :meth:`connect`.

    :meth:`open` attaches streams, :meth:`send` sends one step of several of
    them in one frame (more frames when they pass the server's --max-frame)
    and :meth:`recv` returns their y rows, in the order sent. :attr:`streams`
    maps each attached stream's id to its :class:`MuxStream` (index, t,
    token, durable), and :attr:`tokens` every resume token the client has
    seen: after a restart, reconnect and :meth:`open` the streams again (with
    those tokens) to resume each at its t. A stream that the server gives
    away (an export, a delete) leaves :attr:`streams` for :attr:`gone`, with
    the server's notice, and its index is freed; the frames sent naming it
    after that raise :class:`FrameRefused` from recv().

    **Reconnecting** (``resume`` > 0): when the connection ends without the
    client ending it (a drop, 1001, 1006, 1011, 1012), the client connects
    again to the same URL, retrying drops and 1013 for up to ``resume``
    seconds, and opens every attached stream with its token (one open
    message, in chunks that fit --max-frame). Each ``opened`` entry's t is
    the step the server restored; refusals 1012, 1013, 4404 and 4409 are
    retried until ``resume`` seconds pass, and a stream this client opened
    new that has no durable step yet, refused with 4404, is opened new again
    and replayed from step 0. A stream the server gives away (a ``gone``
    notice) is opened again with its token after 50 ms, on the same
    connection, retried the same way for :data:`GONE_RETRY` seconds (the
    send() calls of every stream wait meanwhile); the frames refused
    meanwhile are replayed. A stream that stays refused leaves
    :attr:`streams` for :attr:`gone` (its entry), and the send() calls that
    hold its rows raise :class:`FrameRefused`. Then the replay (see the module's docstring):
    every send() is answered once, bit for bit, with each stream's steps in
    the order sent. send() calls made meanwhile wait, and go after the
    replay; :meth:`open`, :meth:`close_streams` and :meth:`detach` wait for
    the reconnect, and the control calls under way when the connection
    ended raise :class:`Closed`. A restore that a stream cannot replay
    (older than its oldest kept step, or newer than the replies received),
    a replayed reply that differs, and a stream whose steps ran out of order
    (a frame refused for a move while a later frame of the same stream ran)
    raise :class:`ReplayError` from the waiting and later calls of the whole
    client. When ``resume`` seconds pass without a connection, they raise
    :class:`Closed`.

    Each stream keeps at most ``replay`` steps: ``replay * (I + H) *
    itemsize`` bytes and about 100 bytes of Python objects a step."""

    def __init__(self):
        super().__init__()
        self.streams = {}           # id -> MuxStream, the streams attached
        self.gone = {}              # id -> the server's notice, for streams it gave away
        self.tokens = {}            # id -> resume token, of every stream opened here
        self._answers = deque()     # (future, streams or None), per frame sent, oldest first
        self._by_index = {}         # index -> MuxStream, for the durable notices
        self._later = []            # (_Rows, streams) of send() calls during a reconnect
        self._round = deque()       # in a replay: the streams of the round being sent
        self._replaying = 0         # replayed frames not yet answered
        self._pumping = False       # a replay is being sent
        self._replayed = None       # the future of the replay: every row answered
        self._emptied = None        # the future of no answer awaited
        self._ready = None          # the future of the end of a reconnect

    @classmethod
    async def connect(cls, url, dtype="float32", timeout=10.0, resume=0.0, replay=4096):
        """Connects to ``url`` (``ws://host:port``) and waits for the hello;
        raises Closed if the server refuses. ``resume``: the seconds to keep
        reconnecting after a drop (0: none, the calls raise Closed);
        ``replay``: the steps kept per stream for a replay."""
        self = cls()
        self._reconnects(resume, replay)
        self.url, self.dtype, self.timeout = url, dtype, timeout
        self._greet(await self._connect(mux_url(url, dtype), timeout))
        return self

    def _greet(self, h):
        """Takes the sizes, dtypes and limits of the hello h."""
        self.x_dtype, self.y_dtype = dtype_of(h["x_dtype"]), dtype_of(h["y_dtype"])
        self.input_size, self.hidden_size = h["input_size"], h["hidden_size"]
        self._x_bytes = x_bytes = self.input_size * self.x_dtype.itemsize
        self._y_bytes = self.hidden_size * self.y_dtype.itemsize
        self._max_frame = h["max_frame"]
        # the most rows a frame of --max-frame bytes holds
        self.rows_per_frame = next((n for n in range(h["max_frame"] // x_bytes, 0, -1)
                                    if frame_bytes(n, x_bytes) <= h["max_frame"]), 1)

    async def open(self, stream_ids, new=False, tokens=None):
        """Attaches streams: new ones (``new=True``), or existing ones with
        their resume tokens (``tokens``: {id: token}; default
        :attr:`tokens`). Returns the server's entries, one per stream:
        ``{"stream", "index", "t", "token", "durable"}``, or ``{"stream",
        "code", "error"}`` for one refused."""
        await self._up()
        entries = await self._open(open_entries(stream_ids, new,
                                                {**self.tokens, **(tokens or {})}))
        for e in entries:
            if "index" in e:
                s = MuxStream(e["stream"], e["index"], e["t"], e["token"], e.get("durable"),
                              new, self.replay if self._keep else None)
                self.streams[s.id] = s
                self._attach(s, e)
        return entries

    def _attach(self, s, e):
        """s is attached as the opened entry e says."""
        s.index, s.token, s.durable = e["index"], e["token"], e.get("durable")
        self.tokens[s.id] = s.token
        self._by_index[s.index] = s

    async def _open(self, entries):
        """Sends open messages of entries (as many as --max-frame needs, in
        JSON without spaces), and returns the server's entries."""
        chunks, chunk, size = [], [], 16
        for e in entries:
            n = len(json.dumps(e, separators=COMPACT)) + 2
            if chunk and size + n > self._max_frame:
                chunks.append(chunk)
                chunk, size = [], 16
            chunk.append(e)
            size += n
        chunks.append(chunk)
        futs = [self._ask(json.dumps({"open": c}, separators=COMPACT).encode())
                for c in chunks]
        return [e for f in futs for e in (await f)["opened"]]

    async def close_streams(self, stream_ids):
        """Ends the streams on the server; returns their final step counts {id: t}."""
        return await self._let_go("close", stream_ids)

    async def detach(self, stream_ids):
        """Lets go of the streams, which the server keeps for another
        connection; returns their step counts {id: t}."""
        return await self._let_go("detach", stream_ids)

    async def _let_go(self, verb, stream_ids):
        await self._up()
        indices = [self._stream(sid).index for sid in stream_ids]
        for sid, k in zip(stream_ids, indices):
            del self.streams[sid]
            self._by_index.pop(k, None)
        answer = await self._ask(json.dumps({verb: indices}).encode())
        return {e["stream"]: e["t"] for e in answer["closed" if verb == "close" else "detached"]}

    def send(self, stream_ids, x):
        """Sends one step of each stream of stream_ids (each at most once):
        x, shape (len(stream_ids), input_size), row i stream_ids[i]'s; the
        reply comes from recv()."""
        if self._closed is not None:
            raise self._closed
        streams = [self._stream(sid) for sid in stream_ids]
        x = np.ascontiguousarray(x, self.x_dtype)
        if x.shape != (len(streams), self.input_size):
            raise ValueError(f"x must have shape (len(stream_ids), input_size) = "
                             f"{(len(streams), self.input_size)}, got {x.shape}")
        if self._keep:
            xb, w = x.tobytes(), self._x_bytes
            for i, s in enumerate(streams):
                s._xs.append(xb[i * w:(i + 1) * w])
                s._sent += 1
            if not self._live:
                self._send_later(streams)
                return
        futs, loop, r = [], asyncio.get_running_loop(), self.rows_per_frame
        for a in range(0, len(streams), r):
            part = streams[a:a + r]
            self._peer.transport.send(BINARY, encode([s.index for s in part],
                                                     x[a:a + r].view(np.uint8)))
            futs.append(loop.create_future())
            self._answers.append((futs[-1], part))
        self._unread.append(futs)

    def _send_later(self, streams):
        """A send() during a reconnect: its rows go with the replay."""
        rows = _Rows(asyncio.get_running_loop().create_future(), len(streams),
                     self.hidden_size, self.y_dtype)
        self._unread.append([rows.fut])
        if self._pumping:
            for i, s in enumerate(streams):
                s._targets.append((rows, i))
            self._pump()
        else:   # the frames sent before may still be refused: their rows go first
            self._later.append((rows, streams))

    async def recv(self):
        """y of the oldest send() not yet received: (n, hidden_size), row i
        that of its stream_ids[i]. Raises FrameRefused when the server
        refused it (none of its steps ran; with several frames, some may
        have)."""
        ys = [await f for f in self._oldest_unread()]
        return ys[0] if len(ys) == 1 else np.concatenate(ys)

    async def step(self, stream_ids, x):
        """One step of each of the streams: sends x and returns their y."""
        self.send(stream_ids, x)
        return await self.recv()

    def _stream(self, stream_id):
        s = self.streams.get(stream_id)
        if s is None:
            raise ValueError(f"stream {stream_id!r} is not attached to this connection")
        return s

    async def _up(self):
        """Waits for the end of a reconnect under way; raises what ended the client."""
        while not self._live:
            if self._closed is not None:
                raise self._closed
            if self._ready is None or self._ready.done():
                self._ready = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._ready)

    def _ask(self, message):
        """Sends a control message (JSON bytes); returns the future of its answer."""
        if self._closed is not None:
            raise self._closed
        fut = asyncio.get_running_loop().create_future()
        self._answers.append((fut, None))
        self._peer.transport.send(TEXT, message)
        return fut

    def _text(self, message):
        if "durable" in message:
            for k, t in message["durable"]:
                s = self._by_index.get(k)
                if s is not None:
                    s.durable = t
                    if self._keep:
                        trim(s._xs, s._ys, s._sent, s.t, t)
        elif "gone" in message:
            self._gone(message["gone"])
        elif self._answers:
            fut, streams = self._answers.popleft()
            if "refused" in message:
                r = message["refused"]
                self._refused(fut, streams, FrameRefused(r["code"], r["error"], r.get("stream")))
            elif not fut.done():
                fut.set_result(message)
            self._popped()

    def _gone(self, entries):
        """Streams the server gave away: with resume > 0 they are reattached
        (the frames naming them are refused meanwhile); without, they leave
        for :attr:`gone`. Either way their indices are freed."""
        for e in entries:
            s = self._by_index.pop(e["index"], None)
            if not self._keep:
                self.streams.pop(e["stream"], None)
                self.gone[e["stream"]] = e
            elif s is not None:
                s.index, s._moved = None, True
        # frees the indices: the server answers the close, which no one awaits
        self._ask(json.dumps({"close": [e["index"] for e in entries]}).encode())
        if self._keep:
            self._recover_soon()

    def _refused(self, fut, streams, exc):
        """A frame the server refused (none of its rows ran): with resume >
        0 its rows are sent again after the reconnect (the stream of a gone
        notice reattached), and no later step of their streams may run
        before them."""
        if not self._keep:
            if not fut.done():
                fut.set_exception(exc)
            return
        if fut is None:            # a replayed frame: its rows stay in their streams' targets
            self._replaying -= 1
            for s, step in streams:
                if s._hole is None:
                    s._hole = step
        else:
            rows = _Rows(fut, len(streams), self.hidden_size, self.y_dtype)
            for i, s in enumerate(streams):
                if s._hole is None:
                    s._hole = s.t + len(s._targets)
                s._targets.append((rows, i))
        self._recover_soon()
        self._pump()

    def _arrived(self, payload):
        if self._slow:
            self._arrived_slow(payload)
            return
        if not self._answers:
            return
        fut, streams = self._answers.popleft()
        self._answered(fut, streams, payload)

    def _answered(self, fut, streams, payload):
        """The answer of a frame that send() wrote."""
        if self._keep:
            w = self._y_bytes
            for i, s in enumerate(streams):
                s.t += 1
                s._ys.append(payload[i * w:(i + 1) * w])
        else:
            for s in streams:
                s.t += 1
        if not fut.done():         # a recv() that timed out or was cancelled drops its y
            fut.set_result(np.frombuffer(payload, self.y_dtype).reshape(len(streams), -1))

    def _arrived_slow(self, payload):
        """An answer during a reconnect: a replayed frame's rows check kept
        replies or fill their targets; a frame of send() must not hold a
        stream with a row refused before it."""
        if not self._answers:
            return
        fut, streams = self._answers[0]
        if fut is not None:
            for s in streams:
                if s._hole is not None:
                    self._fail(self._disorder(s))
                    return
        self._answers.popleft()
        if fut is None:
            self._replaying -= 1
            w = self._y_bytes
            for i, (s, step) in enumerate(streams):
                row = payload[i * w:(i + 1) * w]
                if s._hole is not None:
                    self._fail(self._disorder(s))
                    return
                if step < s.t:
                    differs = replayed_differs(s.id, step, s.t, s._ys, row)
                    if differs is not None:
                        self._fail(differs)
                        return
                else:
                    s.t += 1
                    s._ys.append(row)
                    rows, k = s._targets.popleft()
                    rows.fill(k, row)
            self._pump()
        else:
            self._answered(fut, streams, payload)
        self._popped()

    @staticmethod
    def _disorder(s):
        return ReplayError(s.id, f"step {s._hole} was refused (a stream it shared a frame "
                                 f"with moved) and a later step ran before it")

    def _popped(self):
        """An answer came: tells a reconnect that waits for none to be awaited."""
        if not self._answers and self._emptied is not None and not self._emptied.done():
            self._emptied.set_result(None)

    # ---- the reconnect -----------------------------------------------------

    def _dropped(self, closed):
        """The frames not answered wait for the replay (their rows join their
        streams' targets, after those of earlier frames); the control calls
        fail with closed; the indices are gone."""
        self._pumping, self._replaying = False, 0
        self._round.clear()
        for fut, streams in self._answers:
            if fut is None:
                continue           # a replayed frame: its rows are in the targets still
            if streams is None:
                if not fut.done():
                    fut.set_exception(closed)
                    fut.exception()
                continue
            rows = _Rows(fut, len(streams), self.hidden_size, self.y_dtype)
            for i, s in enumerate(streams):
                s._targets.append((rows, i))
        self._answers.clear()
        for f in (self._replayed, self._emptied):
            if f is not None and not f.done():
                f.set_exception(closed)
                f.exception()
        for s in self.streams.values():
            s.index, s._hole = None, None
        self._by_index.clear()

    async def _attempt(self):
        """One reconnect: a new connection and every stream opened on it, or
        (the connection up) the streams the server gave away opened again;
        then the replay. Passes go on until every stream is attached and
        has no refused row."""
        loop = asyncio.get_running_loop()
        while True:
            if not self._peer.connected:
                self._greet(await self._connect_again(mux_url(self.url, self.dtype)))
                todo, deadline = list(self.streams.values()), self._deadline
            else:
                if loop.time() >= self._deadline:
                    raise Closed(None, "frames kept being refused")
                if self._answers:
                    self._emptied = loop.create_future()
                    await self._emptied
                await asyncio.sleep(FIRST_DELAY)   # a server taking a stream may not hold it yet
                todo = [s for s in self.streams.values() if s.index is None]
                deadline = min(self._deadline, loop.time() + GONE_RETRY)
            restored = await self._reattach(todo, deadline)
            self._replayed = asyncio.get_running_loop().create_future()
            self._start_replay(restored)
            await self._replayed
            if self._live:
                return

    async def _reattach(self, todo, deadline):
        """Opens the streams of todo with their tokens, retrying the
        refusals of RETRIED until the loop's time is deadline (at once and
        opened new: a stream that 4404 says its server lost before its first
        durable step, see the class); the others leave for :attr:`gone`.
        Returns {stream: the t its entry restored}."""
        loop, delay, restored, fresh = asyncio.get_running_loop(), FIRST_DELAY, {}, set()
        while todo:
            entries = await self._open(
                [{"stream": s.id, "new": True} if s in fresh else
                 {"stream": s.id, "token": s.token, "received": s.t} for s in todo])
            again, wait = [], False
            for s, e in zip(todo, entries):
                if "index" in e:
                    s.new = s.new or s in fresh
                    self._attach(s, e)
                    restored[s] = e["t"]
                elif (e["code"] == NOT_FOUND and s not in fresh and s.new and not s._moved
                      and s.durable is None and len(s._xs) == s._sent):
                    fresh.add(s)   # every step kept, from step 0
                    again.append(s)
                elif e["code"] in RETRIED and loop.time() < deadline:
                    fresh.discard(s)
                    again.append(s)
                    wait = True
                else:
                    self._lose(s, e)
            todo = again
            if wait:
                await asyncio.sleep(max(0.0, min(delay, deadline - loop.time())))
                delay = min(2 * delay, MAX_DELAY)
        return restored

    def _lose(self, s, entry):
        """s could not be attached again: it leaves for :attr:`gone`, and the
        send() calls that hold its rows raise FrameRefused."""
        del self.streams[s.id]
        self.gone[s.id] = entry
        exc = FrameRefused(entry["code"], entry["error"], s.id)
        for rows, _ in s._targets:
            rows.fail(exc)
        s._targets.clear()
        for rows, streams in self._later:
            if s in streams:
                rows.fail(exc)

    def _start_replay(self, restored):
        """Each attached stream resends from its restored step (its opened
        entry's t, or its first refused row, or t), checked first; the
        send() calls made meanwhile join the targets; the pump starts."""
        for s in self.streams.values():
            t0 = restored.get(s, s.t if s._hole is None else s._hole)
            check_replay(s.id, t0, s.t, s._sent, s._xs, s._ys)
            s._resend, s._hole = t0, None
        for rows, streams in self._later:
            for i, s in enumerate(streams):
                if self.streams.get(s.id) is s:
                    s._targets.append((rows, i))
        self._later.clear()
        self._round.clear()
        self._pumping = True
        self._pump()

    def _pump(self):
        """Sends the replay's frames, round by round, at most WINDOW ahead of
        their answers; once every row is answered, the replay is over: the
        client is live again when every stream is attached with no refused
        row, else the reconnect makes another pass."""
        if not self._pumping:
            return
        send, per, attached = self._peer.transport.send, self.rows_per_frame, self.streams.values()
        while self._replaying < WINDOW:
            if not self._round:
                self._round.extend(s for s in attached if s._resend < s._sent
                                   and s.index is not None and s._hole is None)
                if not self._round:
                    break
            rows, xs = [], []
            while self._round and len(rows) < per:
                s = self._round.popleft()
                if s.index is None or s._hole is not None or self.streams.get(s.id) is not s:
                    continue
                step, first = s._resend, s._sent - len(s._xs)
                if step < first:
                    self._fail(ReplayError(s.id, f"step {step} is no longer kept: more than "
                                                 f"replay={self.replay} steps were sent during "
                                                 f"the reconnect"))
                    return
                s._resend += 1
                rows.append((s, step))
                xs.append(s._xs[step - first])
            if rows:
                send(BINARY, encode([s.index for s, _ in rows],
                                    np.frombuffer(b"".join(xs), np.uint8)))
                self._answers.append((None, rows))
                self._replaying += 1
        if self._replaying or self._round:
            return
        self._pumping = False
        if all(s.index is not None and s._hole is None for s in attached):
            self._live, self._slow = True, False
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(None)
        if self._replayed is not None and not self._replayed.done():
            self._replayed.set_result(None)

    def _unanswered(self):
        """Pops the futures of the frames not yet answered, and of the rows
        and calls waiting for a reconnect."""
        for fut, _ in self._answers:
            if fut is not None:
                yield fut
        self._answers.clear()
        for s in self.streams.values():
            for rows, _ in s._targets:
                yield rows.fut
            s._targets.clear()
        for rows, _ in self._later:
            yield rows.fut
        self._later.clear()
        for f in (self._replayed, self._emptied, self._ready):
            if f is not None:
                yield f
