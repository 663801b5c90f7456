"""The client's end of a WebSocket to a fastln-serve server, either
protocol: :class:`Peer`, on which StreamClient, MuxClient and the load
generator's clients (fastln.serve.loadtest) are built; :class:`Closed`; and
the URLs and the open message that the protocols take.
"""
import asyncio
import json
from collections import deque

import numpy as np

from ..._dtypes import bfloat16
from ..extra import needs_extra
from ..frames import MUX_PATH, STREAM_PATH

with needs_extra(__name__):
    from picows import WSListener, WSMsgType, ws_connect

BINARY, TEXT, CLOSE = WSMsgType.BINARY, WSMsgType.TEXT, WSMsgType.CLOSE


class Closed(ConnectionError):
    """The connection closed: ``code`` (None when it dropped without a close
    frame) and ``message``, the server's reason."""

    def __init__(self, code, message):
        super().__init__(f"closed with {code}: {message}" if code else f"dropped: {message}")
        self.code, self.message = code, message


def stream_url(url, stream_id, new=False, token=None, dtype=None):
    """The URL of stream stream_id at the server url (``ws://host:port``) in
    the protocol of a connection per stream: ``new=1`` opens it, ``token=``
    reconnects to it, ``dtype=`` names x's dtype (None: the server's
    default)."""
    query = ([f"dtype={dtype}"] if dtype is not None else []) + (["new=1"] if new else []) + (
        [f"token={token}"] if token is not None else [])
    return f"{url}{STREAM_PATH}{stream_id}" + ("?" + "&".join(query) if query else "")


def mux_url(url, dtype=None):
    """The URL of the multiplexed protocol at the server url."""
    return f"{url}{MUX_PATH}" + (f"?dtype={dtype}" if dtype is not None else "")


def open_message(stream_ids, new=False, tokens=None):
    """The multiplexed protocol's control message that attaches stream_ids:
    new streams, or existing ones with their resume tokens ({id: token})."""
    tokens = tokens or {}
    return json.dumps({"open": [{"stream": sid, "new": True} if new else
                                {"stream": sid, "token": tokens.get(sid)}
                                for sid in stream_ids]}).encode()


def dtype_of(name):
    """The NumPy dtype a hello names (bfloat16: ml_dtypes')."""
    return bfloat16() if name == "bfloat16" else np.dtype(name)


class Peer(WSListener):
    """The client's end of one WebSocket to a fastln-serve server, either
    protocol. :meth:`connect` opens it and returns the server's hello (its
    first frame, a text frame of JSON); after it each binary frame goes to
    :meth:`on_binary` as bytes, each text frame to :meth:`on_text` as
    JSON, and the end of the connection, once, to :meth:`on_close` with the
    :class:`Closed` that says why. A close frame of the server is answered.
    A Peer may connect again once its connection has ended.

    A subclass answers the frames in these methods, as they come: the load
    generator does, with no future per step."""

    def __init__(self):
        super().__init__()
        self.transport = None      # picows's, of the connection (the last one, once it ended)
        self.hello = None          # the server's hello, as JSON
        self.closed = None         # the Closed that ended the connection
        self._greeted = None       # the future of the hello

    async def connect(self, url, timeout=10.0):
        """Opens the WebSocket at url and returns the server's hello; raises
        Closed when the server closes first (a refusal), and
        asyncio.TimeoutError when the handshake or the hello takes longer
        than timeout seconds."""
        self.transport = self.hello = self.closed = None
        self._greeted = asyncio.get_running_loop().create_future()
        await asyncio.wait_for(ws_connect(lambda: self, url,
                                          websocket_handshake_timeout=timeout), timeout)
        return await asyncio.wait_for(asyncio.shield(self._greeted), timeout)

    @property
    def connected(self):
        """Whether the connection is up: opened, and not ended."""
        return self.transport is not None and self.closed is None

    def send_frame(self, payload, text=False):
        """Sends one frame of bytes (or text); its answer comes to
        on_binary or on_text."""
        self.transport.send(TEXT if text else BINARY, payload)

    async def close(self, code=1000, message=""):
        """Closes the connection and waits for its end; code 1000 ends the
        streams it holds on the server, another (1001) keeps them for a
        reconnect."""
        transport = self.transport
        if self.closed is None and transport is not None:
            transport.send_close(code, message.encode())
            await asyncio.wait_for(transport.wait_disconnected(), 10)

    def abort(self):
        """Drops the connection without a close frame, as a client that
        vanishes does: the server keeps the streams for a reconnect."""
        transport = self.transport
        self._end(Closed(None, "aborted by the client"))
        if transport is not None:
            transport.underlying_transport.abort()

    def on_binary(self, payload):
        """A binary frame of the server's (bytes)."""

    def on_text(self, message):
        """A text frame of the server's after the hello, as JSON."""

    def on_close(self, closed):
        """The connection ended: closed says why."""

    def on_ws_connected(self, transport):
        self.transport = transport

    def on_ws_frame(self, transport, frame):
        kind = frame.msg_type
        if kind is BINARY:
            self.on_binary(frame.get_payload_as_bytes())
        elif kind is TEXT:
            message = json.loads(frame.get_payload_as_utf8_text())
            if self.hello is not None:
                self.on_text(message)
                return
            self.hello = message
            if not self._greeted.done():
                self._greeted.set_result(message)
        elif kind is CLOSE:
            code = frame.get_close_code()
            self._end(Closed(int(code), (frame.get_close_message() or b"").decode(
                "utf-8", "replace")))
            transport.send_close(code)
            transport.disconnect()

    def on_ws_disconnected(self, transport):
        self._end(Closed(None, "the connection ended without a close frame"))

    def _end(self, closed):
        """The first end of the connection: fails the hello's future if the
        hello has not come, and tells on_close."""
        if self.closed is not None:
            return
        self.closed = closed
        if self._greeted is not None and not self._greeted.done():
            self._greeted.set_exception(closed)
            self._greeted.exception()   # marked as seen: connect() may have timed out
        self.on_close(closed)


class Client:
    """What StreamClient and MuxClient share: their :class:`Peer`, whose
    frames and end come to their ``_arrived``, ``_text`` and ``_end``; the
    replies that recv() has not returned; the raw frame, the close, and
    ``async with``."""

    def __init__(self):
        self._peer = _Forward(self)
        self._unread = deque()     # per send(): what recv() returns, oldest first

    @property
    def hello(self):
        """The server's hello, as JSON."""
        return self._peer.hello

    @property
    def closed(self):
        """The :class:`Closed` that ended the connection, or None while it is up."""
        return self._peer.closed

    @property
    def pending(self):
        """How many send() calls recv() has not returned yet."""
        return len(self._unread)

    def _oldest_unread(self):
        """What recv() returns next (a future, or a list of them), taken off."""
        if not self._unread:
            raise RuntimeError("no step is waiting for its reply")
        return self._unread.popleft()

    def send_frame(self, payload, text=False):
        """Sends one frame of raw bytes (or text), outside the protocol's
        rules: for trying the server's checks. Its answer, if any, is not
        awaited."""
        self._peer.send_frame(payload, text)

    async def close(self, code=1000, message=""):
        """Closes the connection; code 1000 ends the streams it holds on the
        server, another (1001) keeps them for a reconnect."""
        await self._peer.close(code, message)

    def abort(self):
        """Drops the connection without a close frame, as a client that
        vanishes does: the server keeps the streams for a reconnect. The
        waiting and later calls raise :class:`Closed`, and leaving the
        ``async with`` block sends nothing."""
        self._peer.abort()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    def _end(self, closed):
        """The connection ended: the waiting futures fail with closed."""
        for f in self._unanswered():
            if not f.done():
                f.set_exception(closed)
                f.exception()      # marked as seen: recv() raises it, if it is ever called


class _Forward(Peer):
    """The Peer of a StreamClient or a MuxClient: hands its frames on to it."""

    def __init__(self, client):
        super().__init__()
        self.client = client

    def on_binary(self, payload):
        self.client._arrived(payload)

    def on_text(self, message):
        self.client._text(message)

    def on_close(self, closed):
        self.client._end(closed)
