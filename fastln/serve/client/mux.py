"""MuxClient: many streams of a fastln-serve server on one WebSocket (the
multiplexed protocol of fastln.serve.ws.mux), x and y as NumPy arrays."""
import asyncio
import json
from collections import deque

import numpy as np

from ..extra import needs_extra
from ..frames import encode, frame_bytes

with needs_extra(__name__):
    from .wire import BINARY, TEXT, Client, dtype_of, mux_url, open_message


class FrameRefused(Exception):
    """A multiplexed frame the server refused, none of whose steps ran: a
    stream of it left the server (``code`` 4410, ``stream`` its id), or the
    server restarts (1012)."""

    def __init__(self, code, message, stream=None):
        super().__init__(f"refused with {code}: {message}")
        self.code, self.message, self.stream = code, message, stream


class MuxStream:
    """A stream attached to a :class:`MuxClient`: its id, its index on the
    connection, its step count t (steps answered) and its resume token."""

    __slots__ = ("id", "index", "t", "token")

    def __init__(self, stream_id, index, t, token):
        self.id, self.index, self.t, self.token = stream_id, index, t, token


class MuxClient(Client):
    """Many streams of a fastln-serve server on one WebSocket (the protocol
    of fastln.serve.ws.mux); build it with :meth:`connect`.

    :meth:`open` attaches streams, :meth:`send` sends one step of several of
    them in one frame (more frames when they pass the server's --max-frame)
    and :meth:`recv` returns their y rows, in the order sent. :attr:`streams`
    maps each attached stream's id to its :class:`MuxStream` (index, t,
    token), and :attr:`tokens` every resume token the client has seen:
    after a restart, reconnect and :meth:`open` the streams again (with
    those tokens) to resume each at its t. A stream that the server gives
    away (an export, a delete) leaves :attr:`streams` for :attr:`gone`, with the server's
    notice, and its index is freed; the frames sent naming it after that
    raise :class:`FrameRefused` from recv()."""

    def __init__(self):
        super().__init__()
        self.streams = {}           # id -> MuxStream, the streams attached
        self.gone = {}              # id -> the server's notice, for streams it gave away
        self.tokens = {}            # id -> resume token, of every stream opened here
        self._answers = deque()     # (future, streams or None), per frame sent, oldest first

    @classmethod
    async def connect(cls, url, dtype="float32", timeout=10.0):
        """Connects to ``url`` (``ws://host:port``) and waits for the hello;
        raises Closed if the server refuses."""
        self = cls()
        h = await self._peer.connect(mux_url(url, dtype), timeout)
        self.x_dtype, self.y_dtype = dtype_of(h["x_dtype"]), dtype_of(h["y_dtype"])
        self.input_size, self.hidden_size = h["input_size"], h["hidden_size"]
        x_bytes = self.input_size * self.x_dtype.itemsize
        # the most rows a frame of --max-frame bytes holds
        self.rows_per_frame = next((n for n in range(h["max_frame"] // x_bytes, 0, -1)
                                    if frame_bytes(n, x_bytes) <= h["max_frame"]), 1)
        return self

    async def open(self, stream_ids, new=False, tokens=None):
        """Attaches streams: new ones (``new=True``), or existing ones with
        their resume tokens (``tokens``: {id: token}; default
        :attr:`tokens`). Returns the server's entries, one per stream:
        ``{"stream", "index", "t", "token"}``, or ``{"stream", "code",
        "error"}`` for one refused."""
        message = open_message(stream_ids, new, {**self.tokens, **(tokens or {})})
        entries = (await self._control(message))["opened"]
        for e in entries:
            if "index" in e:
                self.streams[e["stream"]] = MuxStream(e["stream"], e["index"], e["t"],
                                                      e["token"])
                self.tokens[e["stream"]] = e["token"]
        return entries

    async def close_streams(self, stream_ids):
        """Ends the streams on the server; returns their final step counts {id: t}."""
        return await self._let_go("close", stream_ids)

    async def detach(self, stream_ids):
        """Lets go of the streams, which the server keeps for another
        connection; returns their step counts {id: t}."""
        return await self._let_go("detach", stream_ids)

    async def _let_go(self, verb, stream_ids):
        indices = [self._stream(sid).index for sid in stream_ids]
        for sid in stream_ids:
            del self.streams[sid]
        answer = await self._control(json.dumps({verb: indices}).encode())
        return {e["stream"]: e["t"] for e in answer["closed" if verb == "close" else "detached"]}

    def send(self, stream_ids, x):
        """Sends one step of each stream of stream_ids (each at most once):
        x, shape (len(stream_ids), input_size), row i stream_ids[i]'s; the
        reply comes from recv()."""
        if self.closed is not None:
            raise self.closed
        streams = [self._stream(sid) for sid in stream_ids]
        x = np.ascontiguousarray(x, self.x_dtype)
        if x.shape != (len(streams), self.input_size):
            raise ValueError(f"x must have shape (len(stream_ids), input_size) = "
                             f"{(len(streams), self.input_size)}, got {x.shape}")
        futs, loop, r = [], asyncio.get_running_loop(), self.rows_per_frame
        for a in range(0, len(streams), r):
            part = streams[a:a + r]
            self._peer.transport.send(BINARY, encode([s.index for s in part],
                                                     x[a:a + r].view(np.uint8)))
            futs.append(loop.create_future())
            self._answers.append((futs[-1], part))
        self._unread.append(futs)

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

    async def _control(self, message):
        """Sends a control message (JSON bytes) and returns its answer."""
        if self.closed is not None:
            raise self.closed
        fut = asyncio.get_running_loop().create_future()
        self._answers.append((fut, None))
        self._peer.transport.send(TEXT, message)
        return await fut

    def _text(self, message):
        if "gone" in message:
            for e in message["gone"]:
                if self.streams.get(e["stream"]) is not None:
                    del self.streams[e["stream"]]
                self.gone[e["stream"]] = e
            # frees the indices: the server answers the close, which no one awaits
            self._answers.append((asyncio.get_running_loop().create_future(), None))
            self._peer.transport.send(TEXT, json.dumps(
                {"close": [e["index"] for e in message["gone"]]}).encode())
        elif self._answers:
            fut, streams = self._answers.popleft()
            if "refused" in message:
                r = message["refused"]
                fut.set_exception(FrameRefused(r["code"], r["error"], r.get("stream")))
            elif not fut.done():
                fut.set_result(message)

    def _arrived(self, payload):
        if not self._answers:
            return
        fut, streams = self._answers.popleft()
        for s in streams:
            s.t += 1
        if not fut.done():         # a recv() that timed out or was cancelled drops its y
            fut.set_result(np.frombuffer(payload, self.y_dtype).reshape(len(streams), -1))

    def _unanswered(self):
        """Pops the futures of the frames not yet answered, oldest first."""
        while self._answers:
            yield self._answers.popleft()[0]
