"""The client's end of a WebSocket to a fastln-serve server, either
protocol: :class:`Peer`, on which StreamClient, MuxClient and the load
generator's clients (fastln.serve.loadtest) are built; :class:`Client`,
what StreamClient and MuxClient share (reconnecting included);
:class:`Closed` and :class:`ReplayError`; and the URLs and the open message
that the protocols take.
"""
import asyncio
import json
import math
from collections import deque

import numpy as np

from ..._dtypes import bfloat16
from ..errors import CONFLICT, GONE, INTERNAL, NOT_FOUND, RESTART, TRY_LATER
from ..extra import needs_extra
from ..frames import MUX_PATH, STREAM_PATH

with needs_extra(__name__):
    from picows import WSError, WSListener, WSMsgType, ws_connect

BINARY, TEXT, CLOSE = WSMsgType.BINARY, WSMsgType.TEXT, WSMsgType.CLOSE

# the ends of a connection after which a client with resume > 0 reconnects: a
# drop (None, 1006), a peer gone away (1001), a failed step, a restart, a move
RESUMED = frozenset({None, 1001, 1006, INTERNAL, RESTART, GONE})
# what it retries while reconnecting: those, and the refusals of a server that
# is busy (1013), does not hold the stream yet (4404) or whose owner is alive (4409)
RETRIED = RESUMED | {TRY_LATER, NOT_FOUND, CONFLICT}
FIRST_DELAY, MAX_DELAY = 0.05, 1.0   # seconds between attempts: doubled from the first
WINDOW = 16   # replayed frames in flight at most (under --max-queue-per-stream, 64 by default)


class Closed(ConnectionError):
    """The connection closed: ``code`` (None when it dropped without a close
    frame) and ``message``, the server's reason."""

    def __init__(self, code, message):
        super().__init__(f"closed with {code}: {message}" if code else f"dropped: {message}")
        self.code, self.message = code, message


class ReplayError(Exception):
    """A reconnect that cannot resume stream ``stream`` bit for bit: the
    server restored it at a step older than the client's oldest kept step
    (more than ``replay`` steps after its last durable one) or newer than the
    replies the client received, or a replayed reply differs from the one
    received before, or its steps ran out of order. ``message`` says which."""

    def __init__(self, stream, message):
        super().__init__(f"stream {stream!r}: {message}")
        self.stream, self.message = stream, message


def replayed_differs(stream, step, t, ys, got):
    """The ReplayError of a replayed reply got of step (below t, the replies
    received) that differs from the one received (ys: the y of the last
    len(ys) steps received); None when it is the same, bit for bit."""
    if got == ys[step - t + len(ys)]:
        return None
    return ReplayError(stream, f"the replayed reply of step {step} differs from the one "
                               f"received")


def check_replay(stream, t0, t, sent, xs, ys):
    """Raises ReplayError unless a stream restored at step t0 can be replayed:
    t replies received, sent steps sent, xs the x of the last len(xs) steps
    sent and ys the y of the last len(ys) steps received. The x of steps
    t0 .. sent-1 are resent; the replies of steps t0 .. t-1 are checked
    against ys."""
    if t0 > t:
        raise ReplayError(stream, f"the server restored step {t0}, past the {t} replies "
                                  f"received: the replies of steps {t} to {t0 - 1} are lost")
    oldest = max(sent - len(xs), t - len(ys) if t0 < t else 0)
    if t0 < oldest:
        raise ReplayError(stream, f"the server restored step {t0}, older than the oldest step "
                                  f"kept, {oldest} (replay= keeps {xs.maxlen} steps after the "
                                  f"last durable one)")


def trim(xs, ys, sent, t, durable):
    """Forgets the x and y of the steps before durable: xs holds the x of
    the steps up to sent, ys the y of those up to t."""
    for _ in range(min(len(xs), durable - sent + len(xs))):
        xs.popleft()
    for _ in range(min(len(ys), durable - t + len(ys))):
        ys.popleft()


def stream_url(url, stream_id, new=False, token=None, dtype=None, received=None):
    """The URL of stream stream_id at the server url (``ws://host:port``) in
    the protocol of a connection per stream: ``new=1`` opens it, ``token=``
    reconnects to it, ``dtype=`` names x's dtype (None: the server's
    default), ``received=`` tells a reconnect's replies received."""
    query = ([f"dtype={dtype}"] if dtype is not None else []) + (["new=1"] if new else []) + (
        [f"token={token}"] if token is not None else []) + (
        [f"received={received}"] if received is not None else [])
    return f"{url}{STREAM_PATH}{stream_id}" + ("?" + "&".join(query) if query else "")


def mux_url(url, dtype=None):
    """The URL of the multiplexed protocol at the server url."""
    return f"{url}{MUX_PATH}" + (f"?dtype={dtype}" if dtype is not None else "")


def open_entries(stream_ids, new=False, tokens=None):
    """The entries of an open message (the multiplexed protocol's) for
    stream_ids: new streams, or existing ones with their resume tokens
    ({id: token})."""
    tokens = tokens or {}
    return [{"stream": sid, "new": True} if new else {"stream": sid, "token": tokens.get(sid)}
            for sid in stream_ids]


def open_message(stream_ids, new=False, tokens=None):
    """The multiplexed protocol's control message that attaches stream_ids:
    new streams, or existing ones with their resume tokens ({id: token})."""
    return json.dumps({"open": open_entries(stream_ids, new, tokens)}).encode()


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
    ``async with``; and the reconnect.

    With ``resume`` > 0, a connection that ends without the client ending
    it (an end of :data:`RESUMED`) starts a task that connects again to the
    same URL, with a delay of 50 ms doubled up to 1 s between attempts,
    until one succeeds or ``resume`` seconds pass; the subclass's
    ``_attempt`` makes one attempt (and starts the replay), ``_dropped``
    keeps what a reconnect needs of the connection that ended. While it
    runs, :attr:`closed` is None and the calls wait; when it gives up, they
    raise the last :class:`Closed`."""

    def __init__(self):
        self.resume, self.replay = 0.0, 4096   # connect() sets them (_reconnects)
        self._keep = False         # keeps the steps after the last durable one, for a replay
        self._peer = _Forward(self)
        self._unread = deque()     # per send(): what recv() returns, oldest first
        self._closed = None        # what ended the client: no reconnect follows
        self._live = False         # send() writes its frames at once (not while reconnecting)
        self._slow = False         # replies take the path that checks and fills replayed ones
        self._ending = False       # close() or abort() was called
        self._task = None          # the reconnect, while it runs
        self._deadline = None      # the loop's time when the reconnect gives up

    def _reconnects(self, resume, replay):
        """Sets connect()'s resume and replay (see the class), checked."""
        if isinstance(resume, bool) or not isinstance(resume, (int, float)) or not (
                math.isfinite(resume) and resume >= 0):
            raise ValueError(f"resume must be a number of seconds >= 0, got {resume!r}")
        if isinstance(replay, bool) or not isinstance(replay, int) or replay < 0:
            raise ValueError(f"replay must be an int >= 0 (steps kept per stream), got {replay!r}")
        self.resume, self.replay, self._keep = float(resume), replay, resume > 0

    async def _connect(self, url, timeout):
        """The first connection: returns the hello."""
        hello = await self._peer.connect(url, timeout)
        self._live = True
        return hello

    @property
    def hello(self):
        """The server's hello (of the last connection), as JSON."""
        return self._peer.hello

    @property
    def closed(self):
        """What ended the client: a :class:`Closed` (or a
        :class:`ReplayError`), or None while it is up or reconnecting."""
        return self._closed

    @property
    def reconnecting(self):
        """Whether a reconnect is under way (the connection is down, or its
        replay has not been sent yet)."""
        return self._closed is None and not self._live

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
        server, another (1001) keeps them for a reconnect. Amid a reconnect,
        it stops it (the server's streams stay), and the waiting calls raise
        :class:`Closed`."""
        self._ending = True
        if self._closed is None and not self._peer.connected:
            self._fail(Closed(code, message or "closed by the client amid a reconnect"))
        await self._peer.close(code, message)

    def abort(self):
        """Drops the connection without a close frame, as a client that
        vanishes does: the server keeps the streams for a reconnect. The
        waiting and later calls raise :class:`Closed`, and leaving the
        ``async with`` block sends nothing."""
        self._ending = True
        self._peer.abort()
        self._fail(Closed(None, "aborted by the client"))

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    def _end(self, closed):
        """The connection ended: a reconnect starts (resume > 0, an end of
        RESUMED that the client did not make), or the waiting futures fail
        with closed."""
        if self._closed is not None:
            return
        self._live = False
        if self._keep and not self._ending and closed.code in RESUMED:
            self._dropped(closed)
            self._recover_soon()
        else:
            self._fail(closed)

    def _recover_soon(self):
        """Starts the reconnect task, unless it runs. The deadline is resume
        seconds after the first end since the client was last live (its last
        replay complete), so that a server that drops every reconnect does
        not keep the calls waiting for ever."""
        loop = asyncio.get_running_loop()
        if not self._slow or self._deadline is None:
            self._deadline = loop.time() + self.resume
        self._live, self._slow = False, True
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._recover())

    async def _recover(self):
        """Makes attempts until one succeeds, a :class:`ReplayError` or a
        refusal not of RETRIED, or the deadline; then the waiting calls
        fail with what ended it."""
        loop = asyncio.get_running_loop()
        delay = 0.0
        while True:
            if delay:
                await asyncio.sleep(max(0.0, min(delay, self._deadline - loop.time())))
            try:
                await self._attempt()
                return
            except ReplayError as e:
                self._fail(e)
                return
            except Closed as e:
                if e.code not in RETRIED:
                    self._fail(e)
                    return
                last = e
            except (OSError, asyncio.TimeoutError, WSError) as e:
                last = Closed(None, f"{type(e).__name__}: {e}")
            except Exception as e:     # a hello not of the protocol: the calls must not wait
                self._fail(Closed(None, f"reconnecting failed: {type(e).__name__}: {e}"))
                return
            if loop.time() >= self._deadline:
                self._fail(Closed(last.code, f"{last.message} (reconnecting gave up after "
                                             f"{self.resume:g} s)"))
                return
            delay = min(max(2 * delay, FIRST_DELAY), MAX_DELAY)

    async def _connect_again(self, url):
        """One attempt's connection, made the client's: returns the hello."""
        peer = _Forward(self)
        left = self._deadline - asyncio.get_running_loop().time()
        try:
            hello = await peer.connect(url, max(0.5, min(self.timeout, left)))
        except BaseException:
            peer.abort()           # a handshake or a hello that timed out leaves nothing open
            raise
        self._peer = peer
        return hello

    def _fail(self, exc):
        """The client ends with exc: no reconnect follows, the waiting futures
        fail with it, and a connection still up closes with 1001 (the
        server keeps the streams)."""
        if self._closed is not None:
            return
        self._closed = exc
        self._live = False
        task = self._task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        for f in self._unanswered():
            if not f.done():
                f.set_exception(exc)
                f.exception()      # marked as seen: recv() raises it, if it is ever called
        peer = self._peer
        if peer.connected:
            reason = str(exc).encode()[:123].decode("utf-8", "ignore").encode()
            peer.transport.send_close(1001, reason)

    def _dropped(self, closed):
        """The connection ended and a reconnect follows: keeps what it needs."""


class _Forward(Peer):
    """The Peer of a StreamClient or a MuxClient: hands its frames on to it,
    and the end of its connection while it is the client's (not that of a
    reconnect's attempt that failed)."""

    def __init__(self, client):
        super().__init__()
        self.client = client

    def on_binary(self, payload):
        self.client._arrived(payload)

    def on_text(self, message):
        self.client._text(message)

    def on_close(self, closed):
        if self.client._peer is self:
            self.client._end(closed)
