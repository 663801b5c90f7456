"""A small asyncio client of the served model's WebSocket protocols, x and
y as NumPy arrays: :class:`StreamClient`, one stream per connection
(fastln.serve.protocol), and :class:`MuxClient`, many streams on one
connection (fastln.serve.mux).

    async with await StreamClient.connect("ws://127.0.0.1:8001", "mic-7", new=True) as s:
        y = await s.step(x)                  # x: (I,) float32; y: (H,) of the hello's y_dtype
        s.send(x1); s.send(x2)               # several steps in flight ...
        y1, y2 = await s.recv(), await s.recv()   # ... answered in order

    async with await MuxClient.connect("ws://127.0.0.1:8001") as m:
        await m.open(["mic-1", "mic-2", "mic-3"], new=True)
        y = await m.step(["mic-1", "mic-3"], x)   # x: (2, I); y: (2, H), row i of stream i

A close from the server (a bad frame, a restart, a move) fails the waiting
and later calls with :class:`Closed`, which holds the code and the message.
Leaving the ``async with`` block closes with 1000, which ends the stream (or
every stream attached) on the server; ``close`` takes another code, e.g.
1001 to keep them.
"""
import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque

import numpy as np

from .._dtypes import bfloat16 as _bf16
from . import needs_extra

with needs_extra(__name__):
    from picows import WSListener, WSMsgType, ws_connect

    from .mux import PATH, encode, frame_bytes


class Closed(ConnectionError):
    """The connection closed: ``code`` (None when it dropped without a close
    frame) and ``message``, the server's reason."""

    def __init__(self, code, message):
        super().__init__(f"closed with {code}: {message}" if code else f"dropped: {message}")
        self.code, self.message = code, message


class _Listener(WSListener):
    def __init__(self, client):
        super().__init__()
        self.client = client

    def on_ws_frame(self, transport, frame):
        c = self.client
        if frame.msg_type == WSMsgType.BINARY:
            c._arrived(frame.get_payload_as_bytes())
        elif frame.msg_type == WSMsgType.TEXT:
            c._hello(json.loads(frame.get_payload_as_utf8_text()))
        elif frame.msg_type == WSMsgType.CLOSE:
            code = frame.get_close_code()
            c._end(Closed(int(code), (frame.get_close_message() or b"").decode("utf-8",
                                                                                 "replace")))
            transport.send_close(code)
            transport.disconnect()

    def on_ws_disconnected(self, transport):
        self.client._end(Closed(None, "the connection ended without a close frame"))


class _Client:
    """What both clients' connections share: the raw frame, the close, and
    ``async with``."""

    def __init__(self):
        self.hello = None
        self.closed = None         # the Closed that ended the connection
        self._transport = None

    def send_frame(self, payload, text=False):
        """Sends one frame of raw bytes (or text), outside the protocol's
        rules: for trying the server's checks. Its answer, if any, is not
        awaited."""
        self._transport.send(WSMsgType.TEXT if text else WSMsgType.BINARY, payload)

    async def close(self, code=1000, message=""):
        """Closes the connection; code 1000 ends the streams it holds on the
        server, another (1001) keeps them for a reconnect."""
        if self.closed is None:
            self._transport.send_close(code, message.encode())
            await asyncio.wait_for(self._transport.wait_disconnected(), 10)

    def abort(self):
        """Drops the connection without a close frame, as a client that
        vanishes does: the server keeps the streams for a reconnect. The
        waiting and later calls raise :class:`Closed`, and leaving the
        ``async with`` block sends nothing."""
        self._end(Closed(None, "aborted by the client"))
        self._transport.underlying_transport.abort()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    def _end(self, closed):
        """The connection ended: the waiting futures, and the hello's if it
        has not come, fail with closed (the first Closed, if there were several)."""
        if self.closed is None:
            self.closed = closed
        for f in self._unanswered():
            if not f.done():
                f.set_exception(self.closed)
                f.exception()      # marked as seen: recv() raises it, if it is ever called
        if not self._ready.done():
            self._ready.set_exception(self.closed)


class StreamClient(_Client):
    """One stream of a fastln-serve server; build it with :meth:`connect`."""

    def __init__(self):
        super().__init__()
        self._inflight = deque()   # futures of the replies not yet arrived, oldest first
        self._unread = deque()     # futures of the replies recv() has not returned
        self._ready = None         # the future of the hello

    @classmethod
    async def connect(cls, url, stream_id, new=False, dtype="float32", timeout=10.0,
                      token=None):
        """Connects to ``url`` (``ws://host:port``) for stream ``stream_id`` and
        waits for the hello; raises Closed if the server refuses. A new
        stream (``new=True``) gets its resume token in the hello
        (:attr:`token`); a reconnect presents it as ``token``."""
        self = cls()
        self._ready = asyncio.get_running_loop().create_future()
        query = f"?dtype={dtype}" + ("&new=1" if new else "") + (
            f"&token={token}" if token is not None else "")
        self._transport, _ = await ws_connect(lambda: _Listener(self),
                                              f"{url}/ws/{stream_id}{query}")
        await asyncio.wait_for(self._ready, timeout)
        h = self.hello
        self.t, self.token = h["t"], h["token"]
        self.x_dtype = np.dtype(np.float32) if h["x_dtype"] == "float32" else _bf16()
        self.y_dtype = _dtype(h["y_dtype"])
        return self

    def send(self, x):
        """Sends one step's x, shape (input_size,); its reply comes from recv()."""
        if self.closed is not None:
            raise self.closed
        x = np.ascontiguousarray(x, self.x_dtype)
        self._transport.send(WSMsgType.BINARY, x.view(np.uint8).data)
        f = asyncio.get_running_loop().create_future()
        self._inflight.append(f)
        self._unread.append(f)

    @property
    def pending(self):
        """How many steps sent have not been returned by recv() yet."""
        return len(self._unread)

    async def recv(self):
        """y of the oldest step sent and not yet received."""
        if not self._unread:
            raise RuntimeError("no step is waiting for its reply")
        return await self._unread.popleft()

    async def step(self, x):
        """One step: sends x and returns its y."""
        self.send(x)
        return await self.recv()

    def _hello(self, hello):
        self.hello = hello
        if not self._ready.done():
            self._ready.set_result(None)

    def _arrived(self, payload):
        self.t += 1
        if self._inflight:
            f = self._inflight.popleft()
            if not f.done():       # a recv() that timed out or was cancelled drops its y
                f.set_result(np.frombuffer(payload, self.y_dtype))

    def _unanswered(self):
        """Pops the futures of the replies not yet arrived, oldest first."""
        while self._inflight:
            yield self._inflight.popleft()


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


class _MuxListener(_Listener):
    def on_ws_frame(self, transport, frame):
        if frame.msg_type == WSMsgType.TEXT:
            self.client._text(json.loads(frame.get_payload_as_utf8_text()))
        else:
            super().on_ws_frame(transport, frame)


class MuxClient(_Client):
    """Many streams of a fastln-serve server on one WebSocket (the protocol
    of fastln.serve.mux); build it with :meth:`connect`.

    :meth:`open` attaches streams, :meth:`send` sends one step of several of
    them in one frame (more frames when they pass the server's --max-frame)
    and :meth:`recv` returns their y rows, in the order sent. :attr:`streams`
    maps each attached stream's id to its :class:`MuxStream` (index, t,
    token), and :attr:`tokens` every resume token the client has seen:
    after a restart, reconnect and :meth:`open` the streams again (with
    those tokens) to resume each at its t. A stream that the server gives away (an export, a
    delete) leaves :attr:`streams` for :attr:`gone`, with the server's
    notice, and its index is freed; the frames sent naming it after that
    raise :class:`FrameRefused` from recv()."""

    def __init__(self):
        super().__init__()
        self.streams = {}           # id -> MuxStream, the streams attached
        self.gone = {}              # id -> the server's notice, for streams it gave away
        self.tokens = {}            # id -> resume token, of every stream opened here
        self._ready = None          # the future of the hello
        self._answers = deque()     # (future, streams or None), per frame sent, oldest first
        self._unread = deque()      # per send(): the futures of its frames

    @classmethod
    async def connect(cls, url, dtype="float32", timeout=10.0):
        """Connects to ``url`` (``ws://host:port``) and waits for the hello;
        raises Closed if the server refuses."""
        self = cls()
        self._ready = asyncio.get_running_loop().create_future()
        self._transport, _ = await ws_connect(lambda: _MuxListener(self),
                                              f"{url}{PATH}?dtype={dtype}")
        await asyncio.wait_for(self._ready, timeout)
        h = self.hello
        self.x_dtype = np.dtype(np.float32) if h["x_dtype"] == "float32" else _dtype(
            h["x_dtype"])
        self.y_dtype = _dtype(h["y_dtype"])
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
        known = {**self.tokens, **(tokens or {})}
        specs = [{"stream": sid, "new": True} if new else
                 {"stream": sid, "token": known.get(sid)} for sid in stream_ids]
        entries = (await self._control({"open": specs}))["opened"]
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
        answer = await self._control({verb: indices})
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
            self._transport.send(WSMsgType.BINARY, encode([s.index for s in part],
                                                          x[a:a + r].view(np.uint8)))
            futs.append(loop.create_future())
            self._answers.append((futs[-1], part))
        self._unread.append(futs)

    @property
    def pending(self):
        """How many send() calls recv() has not returned yet."""
        return len(self._unread)

    async def recv(self):
        """y of the oldest send() not yet received: (n, hidden_size), row i
        that of its stream_ids[i]. Raises FrameRefused when the server
        refused it (none of its steps ran; with several frames, some may
        have)."""
        if not self._unread:
            raise RuntimeError("no step is waiting for its reply")
        futs = self._unread.popleft()
        ys = [await f for f in futs]
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
        if self.closed is not None:
            raise self.closed
        fut = asyncio.get_running_loop().create_future()
        self._answers.append((fut, None))
        self._transport.send(WSMsgType.TEXT, json.dumps(message).encode())
        return await fut

    def _hello(self, hello):
        self.hello = hello
        if not self._ready.done():
            self._ready.set_result(None)

    def _text(self, message):
        if self.hello is None:
            self._hello(message)
        elif "gone" in message:
            for e in message["gone"]:
                if self.streams.get(e["stream"]) is not None:
                    del self.streams[e["stream"]]
                self.gone[e["stream"]] = e
            # frees the indices: the server answers the close, which no one awaits
            self._answers.append((asyncio.get_running_loop().create_future(), None))
            self._transport.send(WSMsgType.TEXT, json.dumps(
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


def run(main):
    """Runs the coroutine main on uvloop's event loop, or asyncio's without uvloop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def request(method, url, body=None, timeout=30.0, admin_token=None):
    """(status, JSON reply) of one HTTP request; body is JSON-ready values,
    or bytes sent as they are; admin_token goes in an ``Authorization:
    Bearer`` header."""
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if admin_token is not None:
        headers["Authorization"] = f"Bearer {admin_token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:        # not JSON: a proxy's page, or a server's crash
            return e.code, {"error": text.decode("utf-8", "replace")}


class MoveError(RuntimeError):
    """A move that failed: ``stage`` "export" (the source did not give the
    stream up) or "import" (the target refused it), and the HTTP ``status``
    of that request."""

    def __init__(self, message, stage, status):
        super().__init__(message)
        self.stage, self.status = stage, status


def move_stream(stream_id, source, target, admin_token=None):
    """Moves a stream from the server at HTTP address source to the one at
    target (``http://host:port`` each): export, then put, with the servers'
    admin token. Its client's WebSocket on source closes with 4410; it
    reconnects to target with the same resume token and resumes. If target
    refuses it, the stream goes back to source and :class:`MoveError` says
    why. Returns the stream's step count."""
    status, exported = request("POST", f"{source}/streams/{stream_id}/export",
                               admin_token=admin_token)
    if status != 200:
        raise MoveError(f"{source} did not export {stream_id!r}: {status} {exported}",
                        "export", status)
    status, reply = request("PUT", f"{target}/streams/{stream_id}/state", exported,
                            admin_token=admin_token)
    if status != 201:
        back, _ = request("PUT", f"{source}/streams/{stream_id}/state", exported,
                          admin_token=admin_token)
        raise MoveError(f"{target} refused {stream_id!r}: {status} {reply}; "
                        f"{'returned to' if back == 201 else 'and could not return it to'} "
                        f"{source}", "import", status)
    return reply["t"]


class Server:
    """A fastln-serve process that :func:`run_server` started: its URLs and process."""

    def __init__(self, proc, log, http, ws):
        self.proc, self.log, self.http, self.ws = proc, log, http, ws

    def health(self):
        """The server's GET /health, as a dict."""
        with urllib.request.urlopen(self.http + "/health", timeout=10) as r:
            return json.loads(r.read())

    def output(self):
        """What the server printed so far."""
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")

    def stop(self, timeout=30.0):
        """SIGTERM, then waits for the exit (kills it past timeout); returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@contextlib.contextmanager
def run_server(*args, timeout=60.0):
    """Runs ``python -m fastln.serve *args`` (free ports unless args name them) until the
    block ends, then stops it; yields a :class:`Server` once it serves. The
    server imports the fastln that this process imported. A server that
    exits or does not serve within timeout raises RuntimeError with the end
    of its output."""
    import fastln

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (
        os.path.dirname(os.path.dirname(os.path.abspath(fastln.__file__))),
        env.get("PYTHONPATH"))))
    args = [str(a) for a in args]
    for flag in ("--port", "--ws-port"):
        if flag not in args:
            args += [flag, "0"]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([sys.executable, "-m", "fastln.serve", *args], stdout=log,
                                stderr=subprocess.STDOUT, env=env)
        server = Server(proc, log, None, None)
        try:
            deadline = time.monotonic() + timeout
            while True:
                m = re.search(r"on (http://\S+) and (ws://[^/\s]+)", server.output())
                if m:
                    server.http, server.ws = m.groups()
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"fastln-serve {' '.join(args)} did not start:\n"
                                       f"{server.output()[-3000:]}")
                time.sleep(0.05)
            yield server
        finally:
            server.stop()


def _dtype(name):
    return _bf16() if name == "bfloat16" else np.dtype(name)
