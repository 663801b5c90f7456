"""The WebSocket protocol of the served model: one connection per stream.

On --ws-port: ``ws://HOST:WS_PORT/ws/STREAM_ID[?new=1][&token=T][&dtype=bfloat16]``
(and, on a reconnect, ``&received=N``: the replies the client received).
STREAM_ID is 1 to 64 characters of letters, digits, '_', '.' and '-', chosen by
the client (so that a proxy can route by it). ``new=1`` opens the stream with a
zero state; without it the stream must exist (a reconnect, after a restart or
a move) and the client must present the stream's resume token, ``token=``.
The server's first frame is a text frame of JSON::

    {"stream": id, "t": steps run, "token": the resume token, "durable": t or null,
     "input_size": I, "hidden_size": H, "x_dtype": "float32", "y_dtype": "float32"}

The token is 32 URL-safe characters (192 random bits) made when the stream
opens; it stays the stream's through restarts and moves. Keep it secret: it
is all a reconnect needs besides the id.

``durable`` is the step of the stream's latest checkpoint (fastln.serve.checkpoint;
null before the first one, and on a server without --checkpoint-dir or
--checkpoint-store). A reconnect's ``received=N`` (0 to 2**63 - 1; 1008
otherwise, and with new=1) lets a server that ran more steps than N, whose
replies went to a dead connection, rewind the stream to its latest
checkpoint at or before N, so that the hello's t is one the client can
replay from. As later checkpoints complete, the server sends text
frames ``{"durable": t}`` between the replies: a server that dies restores
the stream at its latest checkpoint, so a client keeps the x of the steps
after it, to send again (fastln.serve.client's replay). A reconnect to a
server that does not hold the stream, with --checkpoint-store, takes it over
from the store; while another live server holds it the reconnect is closed
with 4409, to retry.

Then each binary frame of the client holds one step's x: I little-endian
values of x_dtype (``dtype=``: float32, the default, or bfloat16 for a bfloat16
model; float64 for a float64 model). The server answers each with one binary
frame of y: H values of y_dtype, the model's dtype (bfloat16 as its 16-bit
patterns; float32 for an int8 model of fastln.rnn.quantize, whose x, y and
state are float32), in the order the frames came. A client may send several
frames before their replies come, up to --max-queue-per-stream waiting. A
close from the client with code 1000 ends the stream; any other end of the
connection keeps it for a reconnect, until --idle-timeout. A peer that answers
no ping for 2 x --ping seconds is disconnected.

The server closes a connection with a code and a message that says why (the
serving guide's table of refusals gives the reason each counts under in
fastln_serve_rejections_total)::

    1002  a frame against RFC 6455 (picows closes)
    1003  a text frame after the hello, or x in fragments
    1007  x of the wrong length, or not finite
    1008  a bad stream id or query
    1009  a frame over --max-frame bytes (picows closes)
    1012  the server restarts: reconnect without new=1 and resume at t
    1013  the table is full, too many frames of the stream wait, --max-connections
          are open, the checkpoint store does not answer a takeover, or the
          server's lease lapsed (it was paused)
    4401  a reconnect without token=
    4403  a token that is not the stream's
    4404  no such stream
    4409  the stream exists (new=1), or another connection or live server holds it
    4410  the stream was exported, or another server took it over

GET /health, /health/live and /health/ready on the WebSocket port answer as
the HTTP ones do (fastln.serve.http), and GET
/owner/STREAM_ID with this server's addresses (``--advertise``): asked
through a proxy that routes by the stream id, it names the stream's owner.
"""
import json
import math
import time

import numpy as np

from ..errors import CONFLICT, GONE, INTERNAL, INVALID, UNSUPPORTED, Refused
from ..extra import needs_extra
from ..service import Attachment

with needs_extra(__name__):
    from .connection import BINARY, TEXT
    from .connection import Connection as Base


class Connection(Base):
    """One WebSocket connection and the stream it holds (see the module's docstring)."""

    fragments = "x must come in one frame, not fragments"

    def __init__(self, service, stream_id, new=False, x_dtype=np.float32, refusal=None,
                 token=None, received=None):
        super().__init__(service, x_dtype, refusal)
        self.stream_id, self.new, self.token = stream_id, new, token
        self.received = received   # a reconnect's replies received, when its client says
        self.stream = self.held = None
        self.greeted = False
        self.streams = ()          # (stream,): what Service.submit and finish take
        self.answer = self._answer

    def opened(self):
        ck = self.service.checkpointer
        if self.new or ck is None or not ck.store.shared or self.stream_id in self.service.streams:
            self.attach()
            return

        async def take_over():   # a stream this server does not hold: from the store
            try:
                await ck.fetch(self.stream_id)
            except Refused as e:
                self.close(e.code, e.message, e.reason)
                return
            if not self.closed:
                self.attach()
        self.service.spawn(take_over())

    def attach(self):
        """Opens or claims the stream, and greets the client once the steps
        of the stream's earlier connection are answered."""
        svc = self.service
        try:
            if self.new:
                stream = svc.add(self.stream_id)
            else:
                stream = svc.claim(self.stream_id, self.token)
            if stream.conn is not None:
                raise Refused(CONFLICT, 409, f"another connection holds stream {stream.id!r}")
        except Refused as e:
            self.close(e.code, e.message, e.reason)
            return
        self.stream, self.streams = stream, (stream,)
        stream.conn = self.held = Attachment(self)
        # steps of an earlier connection may still run: t is final once they are answered
        svc.when_quiet(self.streams, self.hello)

    def hello(self):
        """The server's first frame (see the module's docstring), unless closed
        since; a reconnect that lost replies may rewind the stream first
        (Service.greet)."""
        if self.closed:
            return
        svc = self.service
        svc.greet(self.stream, self.held, self.received)
        self.greeted = True
        self.transport.send(TEXT, json.dumps({
            "stream": self.stream.id, "t": self.stream.t, "token": self.stream.token,
            "durable": self.stream.durable, "input_size": svc.model.input_size,
            "hidden_size": svc.model.hidden_size, "x_dtype": self.x_dtype.name,
            "y_dtype": svc.y_dtype_name}).encode())

    def durable(self, pairs):
        """A checkpoint holds the stream at step t ((index, t) pairs, one
        here): tells the client, once the hello is out."""
        if self.greeted and not self.closed:
            self.transport.send(TEXT, b'{"durable": %d}' % pairs[-1][1])

    def on_ws_frame(self, transport, frame):
        if frame.msg_type != BINARY or not frame.fin or transport.is_close_frame_sent:
            self.on_other_frame(transport, frame)
            return
        stream = self.stream
        if stream is None or self.closed or stream.leaving:
            return
        payload = frame.get_payload_as_bytes()
        if len(payload) != self.x_bytes:
            n, size = len(payload), self.size
            other = {2 * size: "bfloat16", 4 * size: "float32"}.get(n)
            hint = (f": the size of {other} x, which needs ?dtype={other}"
                    if other in self.service.x_dtypes else "")
            self.close(INVALID, f"x must be {self.x_bytes} bytes ({size} "
                                f"{self.x_dtype.name} values), got {n}{hint}")
            return
        svc = self.service
        if svc.echo:
            svc.steps += 1
            transport.send(BINARY, svc.zeros)
            return
        x = np.frombuffer(payload, self.x_dtype)
        if not (self.dot_checks and math.isfinite(x.dot(x))) and not np.isfinite(x).all():
            self.close(INVALID, f"x[{int(np.argmin(np.isfinite(x)))}] is not finite")
            return
        try:
            svc.submit(self.streams, x, self.answer)
        except Refused as e:
            self.close(e.code, e.message, e.reason)

    def _answer(self, y, error):
        svc = self.service
        svc.finish(self.streams, error)
        if not self.closed:
            if error is None:
                self.transport.send(BINARY, y.view(svc.y_view))
            else:
                self.close(INTERNAL, f"the step failed: {error}")

    def text(self, frame):
        self.close(UNSUPPORTED, "frames after the hello must be binary (x)")

    def end_streams(self):
        stream = self.stream
        if stream is not None and stream.conn is self.held:
            self.service.end(stream)

    def gone(self, attachment, message):
        """The service takes the stream away (an export, a delete): closes with 4410."""
        self.close(GONE, message)

    def release(self):
        """Lets go of the stream, which waits for its next connection."""
        stream = self.stream
        if stream is not None and stream.conn is self.held:
            stream.conn = None
            stream.seen = time.monotonic()
