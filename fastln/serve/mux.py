"""The multiplexed WebSocket protocol of the served model: many streams on
one connection, the steps of several streams in one frame.

On --ws-port: ``ws://HOST:WS_PORT/mux[?dtype=bfloat16]``. The server's first
frame is a text frame of JSON::

    {"mux": 1, "input_size": I, "hidden_size": H, "x_dtype": "float32",
     "y_dtype": "float32", "max_streams": S, "max_frame": bytes}

**Attaching streams.** The client's text frames are JSON control messages:

- ``{"open": [{"stream": ID, "new": true}, {"stream": ID, "token": T}, ...]}``
  opens new streams, or attaches existing ones with their resume tokens (a
  reconnect, after a restart or a move). The answer holds one entry per
  stream, in order: ``{"stream": ID, "index": k, "t": steps run, "token": T}``,
  or a refusal ``{"stream": ID, "code": c, "error": why}`` with the close code
  the per-stream protocol (fastln.serve.protocol) would use: 4401 no token,
  4403 a wrong one, 4404 no such stream, 4409 it exists (new) or another
  connection holds it, 1008 a bad id, 1012 the server restarts, 1013 the
  table is full or the connection holds --max-streams-per-connection::

      {"opened": [entry, ...]}

  k is the stream's index on this connection: the lowest one free, 0 first.
  A stream whose steps from an earlier connection still run is answered
  once they are, so that its t is final.
- ``{"close": [k, ...]}`` ends those streams (removed once their steps are
  answered); ``{"detach": [k, ...]}`` lets them go and keeps them on the
  server, for this connection or another to open again with their tokens.
  Each is answered with ``{"closed": [...]}`` or ``{"detached": [...]}``,
  entries ``{"index": k, "stream": ID, "t": steps run}``. The index is free
  from then on.

**Steps.** Each binary frame of the client holds one step of each of n
streams (1 <= n), all little-endian::

    n          uint32
    indices    n x uint32: the streams' indices, each at most once
    padding    4 zero bytes when n is even, so that x starts at a multiple of 8
    x          n rows of I values of x_dtype (float32, the default; bfloat16
               with ?dtype=bfloat16 on a bfloat16 model; float64 on a float64
               model), row i the step of stream indices[i]

The answer is one binary frame of n rows of H values of y_dtype, row i that
of indices[i], and nothing else: the client knows which frame it answers,
because every frame of the client, binary or text, gets exactly one answer,
in the order the frames came. A binary frame that names a stream that left
(below) is answered with a text frame, and none of its steps runs::

    {"refused": {"index": k, "stream": ID, "code": 4410, "error": why}}

The server runs a frame's steps as one block of its StreamBatcher
(``submit_block``): NumPy views of the frame's bytes, one table step
shared with the other connections' frames, one reply write. A stream's
results are bit for bit those of the stream run alone; its steps run in the
order they came, over all frames and connections. At most
--max-queue-per-stream frames of a connection wait for their answers; a
frame must fit --max-frame bytes (the hello gives both limits), so a
client with more streams sends several frames.

**Leaving.** A stream exported (a move) or deleted while attached is told
with a text frame, in order among the answers::

    {"gone": [{"index": k, "stream": ID, "t": steps run, "code": 4410, "error": why}]}

The other streams of the connection go on. A frame that names k after that
is refused (above) until the client closes k (``{"close": [k]}``), which
frees the index. On a restart (SIGTERM) the server answers every step it
took and closes the connection with 1012; the client reconnects, opens each
stream with its token and resumes from each stream's t. A close from the
client with code 1000 ends every stream attached; any other end of the
connection keeps them for a reconnect, until --idle-timeout.

The server closes the connection with a code and a message for a bad frame
(the serving guide's table of refusals gives the reason each counts under in
fastln_serve_rejections_total)::

    1002  a frame against RFC 6455 (picows closes)
    1003  a fragmented frame
    1007  a frame shorter than its header, n of 0, a length that is not the
          header's plus n rows of x, an index twice in one frame, x not finite
    1008  an index no stream holds on this connection, a control message
          that is not JSON of the forms above, or an index in close or
          detach that is not attached
    1009  a frame over --max-frame bytes (picows closes)
    1011  a step failed
    1013  --max-queue-per-stream frames wait, the batcher is full, or
          --max-connections are open

The steps the server took before the close are answered to the stream
(counted in its t), as in the per-stream protocol; the streams stay for a
reconnect.
"""
import asyncio
import json
import math
import operator
import time
from collections import deque

import numpy as np

from fastln.rnn import OverloadedError, UnknownStreamError

from . import needs_extra
from .errors import (
    CONFLICT,
    GONE,
    INTERNAL,
    INVALID,
    POLICY,
    RESTART,
    STREAM_ID,
    TRY_LATER,
    UNSUPPORTED,
    Refused,
    check_stream_id,
)

with needs_extra(__name__):
    from picows import WSCloseCode, WSListener, WSMsgType

    from .protocol import count_picows_close, send_close

PATH = "/mux"                # the path of the multiplexed protocol on --ws-port
MAX_STREAMS = 1024           # --max-streams-per-connection's default
BINARY, TEXT = WSMsgType.BINARY, WSMsgType.TEXT
_leaving = operator.attrgetter("leaving")
_FREE, _ATTACHED, _GONE = 0, 1, 2   # what an index holds


def header_bytes(n):
    """Bytes of a frame's header for n steps: n and the n indices, uint32
    each, padded to a multiple of 8."""
    return (4 * (n + 1) + 7) // 8 * 8


def frame_bytes(n, x_bytes):
    """Bytes of a frame of n steps whose x rows are x_bytes each."""
    return header_bytes(n) + n * x_bytes


def encode(indices, x):
    """One frame: the indices (n) and x (n rows) as the protocol's bytes."""
    indices = np.asarray(indices, "<u4")
    n = len(indices)
    head = np.zeros(header_bytes(n) // 4, "<u4")
    head[0] = n
    head[1:n + 1] = indices
    return head.tobytes() + np.ascontiguousarray(x).tobytes()


class Attachment:
    """What a stream's ``conn`` holds while a multiplexed connection has it:
    the Service closes it (an export, a delete, a restart) as it closes a
    per-stream Connection."""

    __slots__ = ("conn", "index")
    hello_due = False             # a per-stream Connection's hello waits on no step here

    def __init__(self, conn, index):
        self.conn, self.index = conn, index

    def close(self, code, message, reason=None):
        """A 4410 (the stream leaves) lets go of this stream alone; any
        other code closes the whole connection."""
        if code == GONE:
            self.conn.gone(self, message)
        else:
            self.conn.close(code, message, reason)


class _Frame:
    """A binary frame's steps in flight, and its place among the answers:
    the batcher calls it with the block's y (or an error)."""

    __slots__ = ("conn", "streams", "data")
    kind = BINARY

    def __init__(self, conn, streams):
        self.conn, self.streams, self.data = conn, streams, None

    def __call__(self, y, error):
        self.conn.answered(self, y, error)


class _Text:
    """An answer of the server's own: ready (data) at once, or made by
    make() once the answers before it are sent and the streams it waits for
    (waits of them) have no step in flight."""

    __slots__ = ("data", "make", "waits", "kind")

    def __init__(self, data=None, make=None, waits=0, kind=TEXT):
        self.data, self.make, self.waits, self.kind = data, make, waits, kind


class Connection(WSListener):
    """One multiplexed connection and the streams attached to it (see the
    module's docstring)."""

    def __init__(self, service, x_dtype=np.float32, refusal=None):
        super().__init__()
        self.service = service
        self.x_dtype = np.dtype(x_dtype)
        self.size = service.model.input_size
        self.x_bytes = self.size * self.x_dtype.itemsize
        self.dot_checks = self.x_dtype.name in ("float32", "float64")
        self.refusal = refusal
        self.transport = None
        self.closed = False
        self.loose = False      # a stream left while its steps ran: answers settle it
        self.answers = deque()  # _Frame and _Text, in the order of the client's frames
        self.frames = 0         # binary frames in flight
        # per index: the Stream, its id, what the index holds
        self.streams = np.full(16, None, object)
        self.ids = np.full(16, None, object)
        self.state = np.zeros(16, np.uint8)
        self.attached = 0

    # ---- the connection ------------------------------------------------------

    def on_ws_connected(self, transport):
        self.transport = transport
        svc = self.service
        svc.connections += 1       # until on_ws_disconnected
        if self.refusal is not None:
            self.close(self.refusal.code, self.refusal.message, self.refusal.reason)
        elif svc.connections > svc.max_connections:
            self.close(TRY_LATER, f"the server holds {svc.max_connections} connections, its "
                                  f"--max-connections", "too_many_connections")
        else:
            transport.send(TEXT, json.dumps({
                "mux": 1, "input_size": self.size, "hidden_size": svc.model.hidden_size,
                "x_dtype": self.x_dtype.name, "y_dtype": svc.y_dtype_name,
                "max_streams": svc.max_streams_per_connection,
                "max_frame": svc.max_frame}).encode())

    def on_ws_frame(self, transport, frame):
        kind = frame.msg_type
        if transport.is_close_frame_sent:   # closed: only the client's answering close matters
            self.picows_closed()
            if kind == WSMsgType.CLOSE:
                transport.disconnect()
        elif kind == BINARY and frame.fin:
            self.step(frame.get_payload_as_bytes())
        elif kind == WSMsgType.CLOSE:
            self.client_closed(frame.get_close_code())
        elif kind == TEXT and frame.fin:
            self.control(frame.get_payload_as_bytes())
        elif kind in (BINARY, TEXT, WSMsgType.CONTINUATION):
            self.close(UNSUPPORTED, "a frame must come whole, not in fragments")

    def picows_closed(self):
        """After a close of picows's own (protocol.count_picows_close), the
        first time: counts it, and the streams wait for a reconnect."""
        if not self.closed:
            self.closed = True
            count_picows_close(self.service, self.transport)
            self.release()

    def on_ws_disconnected(self, transport):
        if transport.is_close_frame_sent:
            self.picows_closed()
        self.closed = True
        self.service.connections -= 1
        self.release()

    def client_closed(self, code):
        """The client's close: code 1000 ends every stream attached (each once
        its steps are answered); any other keeps them."""
        if code == WSCloseCode.OK:
            for k in np.flatnonzero(self.state == _ATTACHED).tolist():
                self.end(self.streams[k])
        self.closed = True
        self.transport.send_close(WSCloseCode.OK)
        self.transport.disconnect()

    def close(self, code, message, reason=None):
        """Closes the connection with code and message; its streams stay. A
        refusal (a code of errors.REASONS, or a reason given) counts in the
        service's rejections."""
        if self.closed:
            return
        self.closed = True
        send_close(self.service, self.transport, code, message, reason)
        self.release()             # a reconnect need not wait for that answer

    def end(self, stream):
        """Ends stream, once its steps are answered (unless it is leaving the
        server already: an export or a delete removes it)."""
        if stream.leaving:
            return
        stream.leaving = stream.ends = True
        if not stream.inflight:
            self.service.remove(stream)

    def release(self):
        """Lets go of every stream attached, which waits for its next connection."""
        now = time.monotonic()
        for k in np.flatnonzero(self.state != _FREE).tolist():
            self.detach_index(k, now)
        self.answers.clear()

    # ---- steps -------------------------------------------------------------

    def step(self, payload):
        """One binary frame: checks it, and submits its steps as one block."""
        size = len(payload)
        n = int.from_bytes(payload[:4], "little") if size >= 4 else 0
        head = header_bytes(n)
        if size < 8 or n < 1 or size != head + n * self.x_bytes:
            self.close(INVALID, self.bad_length(size, n))
            return
        svc = self.service
        idx = np.frombuffer(payload, "<u4", n, 4)
        if int(idx.max()) >= len(self.state) or not (self.state[idx] == _ATTACHED).all():
            self.unattached(idx)
            return
        streams = self.streams[idx].tolist()
        if any(map(_leaving, streams)) or svc.draining:
            self.refuse(idx)
            return
        if self.frames >= svc.batcher.max_queue_per_stream:
            self.close(TRY_LATER, f"{self.frames} frames of this connection wait, the limit "
                                  f"(--max-queue-per-stream)", "queue_full")
            return
        x = np.frombuffer(payload, self.x_dtype, n * self.size, head)
        # x.x is finite when every value is (and none is huge): one dot product
        if not (self.dot_checks and math.isfinite(x.dot(x))) and not np.isfinite(x).all():
            bad = int(np.argmin(np.isfinite(x)))
            self.close(INVALID, f"x of index {idx[bad // self.size]} (row {bad // self.size}) "
                                f"is not finite at [{bad % self.size}]")
            return
        if svc.echo:
            svc.steps += n
            self.queue(_Text(bytes(n * svc.y_bytes), kind=BINARY))
            return
        rec = _Frame(self, streams)
        try:
            svc.batcher.submit_block(self.ids[idx].tolist(), x.reshape(n, self.size), rec)
        except ValueError:
            if len(set(idx.tolist())) == n:
                raise
            repeated = int(np.argmax(np.bincount(idx)))
            self.close(INVALID, f"index {repeated} appears twice in one frame")
            return
        except OverloadedError as e:
            self.close(TRY_LATER, str(e), "queue_full")
            return
        except UnknownStreamError as e:   # closed under the connection: not expected
            self.close(INTERNAL, str(e))
            return
        for s in streams:
            s.inflight += 1
        svc.inflight += n
        self.frames += 1
        self.answers.append(rec)

    def bad_length(self, size, n):
        if size < 8:
            return f"a frame holds at least 8 bytes (n and an index), got {size}"
        if n < 1:
            return "a frame holds at least one step: n is 0"
        want = frame_bytes(n, self.x_bytes)
        return (f"a frame of n = {n} steps is {want} bytes ({header_bytes(n)} of header and "
                f"{n} x rows of {self.size} {self.x_dtype.name} values), got {size}")

    def unattached(self, idx):
        """Closes for an index no stream holds; refuses the frame for one that left."""
        state = self.state
        for k in idx.tolist():
            if k >= len(state) or state[k] == _FREE:
                self.close(POLICY, f"index {k} holds no stream on this connection")
                return
        self.refuse(idx)

    def refuse(self, idx):
        """Answers a frame that names a stream that left (or any frame, while
        the server restarts) with a refusal: none of its steps runs."""
        entry = {"code": RESTART, "error": "the server restarts: reconnect and resume"}
        for k in idx.tolist():
            stream = self.streams[k]
            if self.state[k] == _GONE or stream.leaving:
                entry = {"index": k, "stream": stream.id, "code": GONE,
                         "error": f"stream {stream.id!r} left this server"}
                break
        self.service.refused("gone" if entry["code"] == GONE else "draining")
        self.queue(_Text(json.dumps({"refused": entry}).encode()))

    def answered(self, rec, y, error):
        """The batcher's answer to a frame: counts its steps, and sends its
        rows when every earlier answer is out."""
        svc = self.service
        streams = rec.streams
        n = len(streams)
        svc.inflight -= n
        if error is None:
            for s in streams:
                s.inflight -= 1
                s.t += 1
            svc.steps += n
        else:
            for s in streams:
                s.inflight -= 1
        if self.loose:
            self.settle(streams)
        self.frames -= 1
        if self.closed:
            return
        if error is not None:
            self.close(INTERNAL, f"the step failed: {error}")
            return
        rec.data = y.view(svc.y_view)
        answers = self.answers
        if answers[0] is rec:      # the usual case: nothing before it waits
            answers.popleft()
            self.transport.send(BINARY, rec.data)
            if answers:
                self.flush()
        else:
            self.flush()

    def settle(self, streams):
        """After an answer: the streams that left this connection while the
        step ran go on (a per-stream hello that waited, an end)."""
        svc, now = self.service, time.monotonic()
        for s in streams:
            s.seen = now
            if s.inflight:
                continue
            if s.conn is not None and s.conn.hello_due:
                s.conn.hello()
            elif s.ends and svc.streams.get(s.id) is s:
                svc.remove(s)

    # ---- the answers, in order ---------------------------------------------

    def queue(self, rec, kind=TEXT):
        """Adds an answer (ready, or waiting to be made) and sends what is ready."""
        if kind is BINARY:
            rec.kind = BINARY
        self.answers.append(rec)
        self.flush()

    def flush(self):
        """Sends the answers from the oldest on, up to one not ready."""
        answers, transport = self.answers, self.transport
        while answers and not self.closed:
            rec = answers[0]
            if rec.data is None:
                if rec.kind is BINARY or rec.waits:
                    return
                rec.data = rec.make()
            answers.popleft()
            transport.send(rec.kind, rec.data)

    # ---- control messages --------------------------------------------------

    def control(self, payload):
        """A text frame: open, close or detach (see the module's docstring)."""
        try:
            message = json.loads(payload)
        except (ValueError, RecursionError):   # UnicodeDecodeError is a ValueError
            self.close(POLICY, "a text frame must be JSON: {\"open\": [...]}, {\"close\": "
                               "[...]} or {\"detach\": [...]}")
            return
        if not (isinstance(message, dict) and len(message) == 1
                and next(iter(message)) in ("open", "close", "detach")
                and isinstance(next(iter(message.values())), list)):
            got = (sorted(message)[:3] if isinstance(message, dict)
                   else type(message).__name__)
            self.close(POLICY, f"a control message is {{\"open\" | \"close\" | \"detach\": "
                               f"[...]}}, got {got}")
            return
        (verb, items), = message.items()
        if verb == "open":
            self.open(items)
        else:
            self.let_go(items, ends=verb == "close")

    def open(self, items):
        """Opens or attaches the streams of an open message; answers once
        their steps of earlier connections are answered."""
        entries, opened = [], []
        for spec in items:
            try:
                stream = self.claim(spec)
            except Refused as e:
                self.service.refused(e.reason)
                sid = spec.get("stream") if isinstance(spec, dict) else None
                # an id that is not one goes back as null: the answer holds clean Unicode
                entries.append({"stream": sid if isinstance(sid, str) and STREAM_ID.fullmatch(sid)
                                else None, "code": e.code, "error": e.message})
                continue
            entries.append({"stream": stream.id, "index": self.attach(stream),
                            "token": stream.token})
            opened.append((entries[-1], stream))
        busy = [stream for _, stream in opened if stream.inflight]

        def make():
            for entry, stream in opened:
                entry["t"] = stream.t
            return json.dumps({"opened": entries}).encode()
        rec = _Text(make=make, waits=len(busy))
        if busy:
            asyncio.get_running_loop().create_task(self.await_quiet(rec, busy))
        self.queue(rec)

    async def await_quiet(self, rec, busy):
        """Makes rec ready once the streams' steps of earlier connections are answered."""
        for stream in busy:
            await self.service.quiet(stream)
        rec.waits = 0
        self.flush()

    def claim(self, spec):
        """The stream an open entry names: opened new, or claimed with its token."""
        svc = self.service
        if not isinstance(spec, dict) or "stream" not in spec:
            raise Refused(POLICY, 422, 'an open entry is {"stream": ID, "new": true} or '
                                       '{"stream": ID, "token": T}')
        sid = check_stream_id(spec["stream"])
        new, token = spec.get("new", False), spec.get("token")
        if type(new) is not bool or not (token is None or isinstance(token, str)):
            raise Refused(POLICY, 422, "new must be true or false, and token a string")
        if self.attached >= self.service.max_streams_per_connection:
            raise Refused(TRY_LATER, 503, f"this connection holds {self.attached} streams, "
                                          f"the server's --max-streams-per-connection",
                          "too_many_streams")
        stream = svc.add(sid) if new else svc.claim(sid, token)
        if stream.conn is not None:
            raise Refused(CONFLICT, 409, f"another connection holds stream {stream.id!r}")
        return stream

    def attach(self, stream):
        """Gives stream the lowest free index, and returns it."""
        free = np.flatnonzero(self.state == _FREE)
        if not len(free):
            grow = len(self.state)
            self.streams = np.concatenate([self.streams, np.full(grow, None, object)])
            self.ids = np.concatenate([self.ids, np.full(grow, None, object)])
            self.state = np.concatenate([self.state, np.zeros(grow, np.uint8)])
            free = [grow]
        k = int(free[0])
        self.streams[k], self.ids[k], self.state[k] = stream, stream.id, _ATTACHED
        self.attached += 1
        stream.conn = Attachment(self, k)
        return k

    def let_go(self, items, ends):
        """close (ends=True) or detach: the indices given, answered once the
        steps before are."""
        state = self.state
        for k in items:
            if type(k) is not int or not 0 <= k < len(state) or state[k] == _FREE:
                self.close(POLICY, f"{'close' if ends else 'detach'} takes the indices of "
                                   f"streams attached here, got {k!r}")
                return
        if len(set(items)) != len(items):
            self.close(POLICY, "an index appears twice")
            return
        now = time.monotonic()
        streams = self.streams[items].tolist()
        for k, stream in zip(items, streams):
            if ends and state[k] == _ATTACHED:
                self.end(stream)
            self.detach_index(k, now)

        def make():
            return json.dumps({"closed" if ends else "detached": [
                {"index": k, "stream": s.id, "t": s.t} for k, s in zip(items, streams)]}).encode()
        self.queue(_Text(make=make))

    def detach_index(self, k, now):
        """Frees index k; its stream (if it still holds it) waits for another connection."""
        stream = self.streams[k]
        if self.state[k] == _ATTACHED:
            self.attached -= 1
            if isinstance(stream.conn, Attachment) and stream.conn.conn is self:
                stream.conn = None
                stream.seen = now
            if stream.inflight:
                self.loose = True
        self.streams[k] = self.ids[k] = None
        self.state[k] = _FREE

    def gone(self, attachment, message):
        """The service takes a stream away (an export or a delete, its steps
        answered): the client is told, and frames that name its index are
        refused until the client closes it."""
        k = attachment.index
        stream = self.streams[k]
        if self.state[k] != _ATTACHED or stream.conn is not attachment:
            return
        stream.conn = None
        stream.seen = time.monotonic()
        self.state[k] = _GONE
        self.attached -= 1
        if self.closed:
            return
        self.queue(_Text(json.dumps({"gone": [{
            "index": k, "stream": stream.id, "t": stream.t, "code": GONE,
            "error": message}]}).encode()))


def connect(service, query):
    """The listener of a /mux request, given its parsed query string."""
    dtype = query.get("dtype", [next(iter(service.x_dtypes))])[-1]
    refusal = None
    if dtype not in service.x_dtypes:
        refusal = Refused(POLICY, 422, f"dtype must be one of {', '.join(service.x_dtypes)}, "
                                       f"got {dtype[:20]!r}")
    return Connection(service, service.x_dtypes.get(dtype, np.float32), refusal)
