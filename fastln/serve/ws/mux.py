"""The multiplexed WebSocket protocol of the served model: many streams on
one connection, the steps of several streams in one frame.

On --ws-port: ``ws://HOST:WS_PORT/mux[?dtype=bfloat16]``. The server's first
frame is a text frame of JSON::

    {"mux": 1, "input_size": I, "hidden_size": H, "x_dtype": "float32",
     "y_dtype": "float32", "max_streams": S, "max_frame": bytes, "checkpoint": true}

(``checkpoint``: whether the server checkpoints its streams, below.)

**Attaching streams.** The client's text frames are JSON control messages:

- ``{"open": [{"stream": ID, "new": true}, {"stream": ID, "token": T}, ...]}``
  opens new streams, or attaches existing ones with their resume tokens (a
  reconnect, after a restart or a move). The answer holds one entry per
  stream (a reconnect's entry may add ``"received": N``, the replies its
  client received, as the per-stream protocol's ``received=``), in order:
  ``{"stream": ID, "index": k, "t": steps run, "token": T,
  "durable": t or null}``,
  or a refusal ``{"stream": ID, "code": c, "error": why}`` with the close code
  the per-stream protocol (fastln.serve.ws.stream) would use: 4401 no token,
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

**Checkpoints.** On a server with --checkpoint-dir or --checkpoint-store,
``durable`` is the step of a stream's latest checkpoint (null before the
first), and as later checkpoints complete the server sends, at once and
outside the order of the answers (it answers no frame of the client's)::

    {"durable": [[k, t], ...]}

A server that dies restores each stream at its latest checkpoint, so a
client keeps the x of each stream's steps after it, to send again
(fastln.serve.client's replay). With --checkpoint-store, an open of a stream
the server does not hold takes it over from the store; while another live
server holds it the entry is refused with 4409, to retry.

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

from ..errors import (
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
from ..extra import needs_extra
from ..frames import frame_bytes, header_bytes
from ..service import Attachment, check_received

with needs_extra(__name__):
    from .connection import BINARY, TEXT
    from .connection import Connection as Base

MAX_STREAMS = 1024           # --max-streams-per-connection's default
_leaving = operator.attrgetter("leaving")
_FREE, _ATTACHED, _GONE = 0, 1, 2   # what an index holds


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
    make() once the answers before it are sent and it no longer waits (for
    the steps of the streams it answers for to be answered)."""

    __slots__ = ("data", "make", "waits", "kind")

    def __init__(self, data=None, make=None, waits=False, kind=TEXT):
        self.data, self.make, self.waits, self.kind = data, make, waits, kind


class Connection(Base):
    """One multiplexed connection and the streams attached to it (see the
    module's docstring)."""

    def __init__(self, service, x_dtype=np.float32, refusal=None):
        super().__init__(service, x_dtype, refusal)
        self.loose = False      # a stream left while its steps ran: answers settle it
        self.answers = deque()  # _Frame and _Text, in the order of the client's frames
        self.frames = 0         # binary frames in flight
        # per index: the Stream, its id, what the index holds
        self.streams = np.full(16, None, object)
        self.ids = np.full(16, None, object)
        self.state = np.zeros(16, np.uint8)
        self.attached = 0

    # ---- the connection ------------------------------------------------------

    def opened(self):
        svc = self.service
        self.transport.send(TEXT, json.dumps({
            "mux": 1, "input_size": self.size, "hidden_size": svc.model.hidden_size,
            "x_dtype": self.x_dtype.name, "y_dtype": svc.y_dtype_name,
            "max_streams": svc.max_streams_per_connection,
            "max_frame": svc.max_frame, "checkpoint": svc.checkpointer is not None}).encode())

    def durable(self, pairs):
        """Checkpoints hold streams of this connection: (index, t) pairs, told
        to the client at once, out of the order of the answers."""
        if not self.closed:
            self.transport.send(TEXT, json.dumps({"durable": pairs}).encode())

    def on_ws_frame(self, transport, frame):
        if frame.msg_type != BINARY or not frame.fin or transport.is_close_frame_sent:
            self.on_other_frame(transport, frame)
        else:
            self.step(frame.get_payload_as_bytes())

    def text(self, frame):
        if frame.fin:
            self.control(frame.get_payload_as_bytes())
        else:
            self.close(UNSUPPORTED, self.fragments)

    def end_streams(self):
        """Ends every stream attached (Service.end)."""
        for k in np.flatnonzero(self.state == _ATTACHED).tolist():
            self.service.end(self.streams[k])

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
            svc.submit(streams, x.reshape(n, self.size), rec, self.ids[idx].tolist())
        except ValueError:
            if len(set(idx.tolist())) == n:
                raise
            repeated = int(np.argmax(np.bincount(idx)))
            self.close(INVALID, f"index {repeated} appears twice in one frame")
            return
        except Refused as e:
            self.close(e.code, e.message, e.reason)
            return
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
        svc.finish(rec.streams, error, self.loose)
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
        their steps of earlier connections are answered. With a shared
        checkpoint store, the streams this server does not hold are taken
        over from it first (each entry that fails is refused)."""
        svc = self.service
        ck = svc.checkpointer
        wanted = [] if ck is None or not ck.store.shared else [
            spec["stream"] for spec in items
            if isinstance(spec, dict) and not spec.get("new") and isinstance(
                spec.get("stream"), str) and spec["stream"] not in svc.streams]
        rec = _Text(waits=True)
        self.queue(rec)
        if not wanted:
            self.attach_all(items, rec)
            return

        async def take_over():
            failed = {}
            for sid, result in zip(wanted, await asyncio.gather(
                    *map(ck.fetch, wanted), return_exceptions=True)):
                if isinstance(result, Refused):
                    failed[sid] = result
                elif isinstance(result, BaseException):
                    raise result
            if not self.closed:
                self.attach_all(items, rec, failed)
        svc.spawn(take_over())

    def attach_all(self, items, rec, failed=None):
        """Claims the streams of an open message (failed: {id: Refused} of
        those whose takeover failed), and answers with rec."""
        entries, opened = [], []
        for spec in items:
            try:
                if failed and isinstance(spec, dict) and spec.get("stream") in failed:
                    raise failed[spec["stream"]]
                stream, received = self.claim(spec)
            except Refused as e:
                self.service.refused(e.reason)
                sid = spec.get("stream") if isinstance(spec, dict) else None
                # an id that is not one goes back as null: the answer holds clean Unicode
                entries.append({"stream": sid if isinstance(sid, str) and STREAM_ID.fullmatch(sid)
                                else None, "code": e.code, "error": e.message})
                continue
            entries.append({"stream": stream.id, "index": self.attach(stream),
                            "token": stream.token})
            opened.append((entries[-1], stream, stream.conn, received))

        def make():
            for entry, stream, _, _ in opened:
                entry["t"], entry["durable"] = stream.t, stream.durable
            return json.dumps({"opened": entries}).encode()

        def greet():   # a reconnect that lost replies may rewind its stream (Service.greet)
            for _, stream, attachment, received in opened:
                self.service.greet(stream, attachment, received)
            self.ready(rec)
        rec.make = make
        self.service.when_quiet([stream for _, stream, _, _ in opened], greet)

    def ready(self, rec):
        """rec waits no longer: sends it, if every answer before it is out."""
        rec.waits = False
        self.flush()

    def claim(self, spec):
        """The stream an open entry names, opened new or claimed with its
        token, and the entry's received (None without one)."""
        svc = self.service
        if not isinstance(spec, dict) or "stream" not in spec:
            raise Refused(POLICY, 422, 'an open entry is {"stream": ID, "new": true} or '
                                       '{"stream": ID, "token": T[, "received": N]}')
        sid = check_stream_id(spec["stream"])
        new, token = spec.get("new", False), spec.get("token")
        if type(new) is not bool or not (token is None or isinstance(token, str)):
            raise Refused(POLICY, 422, "new must be true or false, and token a string")
        received = spec.get("received")
        if received is not None:
            received = check_received(received, new)
        if self.attached >= self.service.max_streams_per_connection:
            raise Refused(TRY_LATER, 503, f"this connection holds {self.attached} streams, "
                                          f"the server's --max-streams-per-connection",
                          "too_many_streams")
        stream = svc.add(sid) if new else svc.claim(sid, token)
        if stream.conn is not None:
            raise Refused(CONFLICT, 409, f"another connection holds stream {stream.id!r}")
        return stream, received

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
                self.service.end(stream)
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
            if stream.conn is not None and stream.conn.conn is self:
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

