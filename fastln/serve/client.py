"""A small asyncio client of the served model's WebSocket protocol
(fastln.serve.protocol): one stream per connection, x and y as NumPy rows.

    async with await StreamClient.connect("ws://127.0.0.1:8001", "mic-7", new=True) as s:
        y = await s.step(x)                  # x: (I,) float32; y: (H,) of the hello's y_dtype
        s.send(x1); s.send(x2)               # several steps in flight ...
        y1, y2 = await s.recv(), await s.recv()   # ... answered in order

A close from the server (a bad frame, a restart, a move) fails the waiting
and later calls with :class:`Closed`, which holds the code and the message.
Leaving the ``async with`` block closes with 1000, which ends the stream on
the server; :meth:`StreamClient.close` takes another code, e.g. 1001 to keep it.
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
from picows import WSListener, WSMsgType, ws_connect


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


class StreamClient:
    """One stream of a fastln-serve server; build it with :meth:`connect`."""

    def __init__(self):
        self.hello = None
        self.closed = None         # the Closed that ended the connection
        self._transport = None
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

    def send_frame(self, payload, text=False):
        """Sends one frame of raw bytes (or text), outside the protocol's
        rules: for trying the server's checks."""
        self._transport.send(WSMsgType.TEXT if text else WSMsgType.BINARY, payload)

    def abort(self):
        """Drops the connection without a close frame, as a client that vanishes does."""
        self._transport.underlying_transport.abort()

    async def recv(self):
        """y of the oldest step sent and not yet received."""
        if not self._unread:
            raise RuntimeError("no step is waiting for its reply")
        return await self._unread.popleft()

    async def step(self, x):
        """One step: sends x and returns its y."""
        self.send(x)
        return await self.recv()

    async def close(self, code=1000, message=""):
        """Closes the connection; code 1000 ends the stream on the server."""
        if self.closed is None:
            self._transport.send_close(code, message.encode())
            await asyncio.wait_for(self._transport.wait_disconnected(), 10)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    def _hello(self, hello):
        self.hello = hello
        if not self._ready.done():
            self._ready.set_result(None)

    def _arrived(self, payload):
        self.t += 1
        if self._inflight:
            self._inflight.popleft().set_result(np.frombuffer(payload, self.y_dtype))

    def _end(self, closed):
        if self.closed is None:
            self.closed = closed
        while self._inflight:
            f = self._inflight.popleft()
            if not f.done():
                f.set_exception(self.closed)
                f.exception()      # marked as seen: recv() raises it, if it is ever called
        if not self._ready.done():
            self._ready.set_exception(self.closed)


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


def move_stream(stream_id, source, target, admin_token=None):
    """Moves a stream from the server at HTTP address source to the one at
    target (``http://host:port`` each): export, then put, with the servers'
    admin token. Its client's WebSocket on source closes with 4410; it
    reconnects to target with the same resume token and resumes. If target
    refuses it, the stream goes back to source and RuntimeError says why.
    Returns the stream's step count."""
    status, exported = request("POST", f"{source}/streams/{stream_id}/export",
                               admin_token=admin_token)
    if status != 200:
        raise RuntimeError(f"{source} did not export {stream_id!r}: {status} {exported}")
    status, reply = request("PUT", f"{target}/streams/{stream_id}/state", exported,
                            admin_token=admin_token)
    if status != 201:
        back, _ = request("PUT", f"{source}/streams/{stream_id}/state", exported,
                          admin_token=admin_token)
        raise RuntimeError(f"{target} refused {stream_id!r}: {status} {reply}; "
                           f"{'returned to' if back == 201 else 'and could not return it to'} "
                           f"{source}")
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


def _bf16():
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def _dtype(name):
    return _bf16() if name == "bfloat16" else np.dtype(name)
