"""The WebSocket protocol of the served model: one connection per stream.

On --ws-port: ``ws://HOST:WS_PORT/ws/STREAM_ID[?new=1][&token=T][&dtype=bfloat16]``.
STREAM_ID is 1 to 64 characters of letters, digits, '_', '.' and '-', chosen by
the client (so that a proxy can route by it). ``new=1`` opens the stream with a
zero state; without it the stream must exist (a reconnect, after a restart or
a move) and the client must present the stream's resume token, ``token=``.
The server's first frame is a text frame of JSON::

    {"stream": id, "t": steps run, "token": the resume token, "input_size": I,
     "hidden_size": H, "x_dtype": "float32", "y_dtype": "float32"}

The token is 32 URL-safe characters (192 random bits) made when the stream
opens; it stays the stream's through restarts and moves. Keep it secret: it
is all a reconnect needs besides the id.

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
    1013  the table is full, too many frames of the stream wait, or --max-connections
          are open
    4401  a reconnect without token=
    4403  a token that is not the stream's
    4404  no such stream
    4409  the stream exists (new=1), or another connection holds it
    4410  the stream was exported

GET /health, /health/live and /health/ready on the WebSocket port answer as
the HTTP ones do (fastln.serve.admin), and GET
/owner/STREAM_ID with this server's addresses (``--advertise``): asked
through a proxy that routes by the stream id, it names the stream's owner.
"""
import asyncio
import json
import math
import time
from urllib.parse import parse_qs

import numpy as np

from . import needs_extra
from .errors import (
    CLOSE_WAIT,
    CONFLICT,
    INTERNAL,
    INVALID,
    POLICY,
    REASONS,
    TRY_LATER,
    UNSUPPORTED,
    Refused,
    check_stream_id,
)

with needs_extra(__name__):
    from picows import (
        WSCloseCode,
        WSListener,
        WSMsgType,
        WSUpgradeResponse,
        WSUpgradeResponseWithListener,
    )


def send_close(service, transport, code, message, reason=None):
    """Sends a close frame of code and message (its first 123 bytes, all a
    close frame holds), and counts a refusal (a code of errors.REASONS, or a
    reason given) in the service's rejections. The TCP connection closes when
    the client answers (RFC 6455, 7.1.1), or after CLOSE_WAIT: closing it at
    once would reset it if the client is still sending, and the reset can
    discard the close frame before the client reads it."""
    if reason is not None or code in REASONS:
        service.refused(reason or REASONS[code])
    data = message.encode("utf-8", "backslashreplace")[:123]
    transport.send_close(code, data.decode("utf-8", "ignore").encode())
    asyncio.get_running_loop().call_later(CLOSE_WAIT, transport.disconnect)


def count_picows_close(service, transport):
    """Counts the refusal of a close that picows sent itself, before any of
    ours: a frame against RFC 6455 (1002; 1007 for a close reason that is
    not UTF-8) or over --max-frame (1009)."""
    reason = REASONS.get(int(transport.close_handshake.sent.code))
    if reason is not None:
        service.refused(reason)


class Connection(WSListener):
    """One WebSocket connection and the stream it holds (see the module's docstring)."""

    def __init__(self, service, stream_id, new=False, x_dtype=np.float32, refusal=None,
                 token=None):
        super().__init__()
        self.service, self.stream_id, self.new, self.token = service, stream_id, new, token
        self.x_dtype = np.dtype(x_dtype)
        self.x_bytes = service.model.input_size * self.x_dtype.itemsize
        self.dot_checks = self.x_dtype.name in ("float32", "float64")
        self.refusal = refusal     # a bad query, told once the connection is up
        self.transport = self.stream = None
        self.closed = False
        self.hello_due = False
        self.answer = self._answer

    def on_ws_connected(self, transport):
        self.transport = transport
        svc = self.service
        svc.connections += 1       # until on_ws_disconnected
        try:
            if self.refusal is not None:
                raise self.refusal
            if svc.connections > svc.max_connections:
                raise Refused(TRY_LATER, 503, f"the server holds {svc.max_connections} "
                                              f"connections, its --max-connections",
                              "too_many_connections")
            if self.new:
                stream = svc.add(self.stream_id)
            else:
                stream = svc.claim(self.stream_id, self.token)
            if stream.conn is not None:
                raise Refused(CONFLICT, 409, f"another connection holds stream {stream.id!r}")
        except Refused as e:
            self.close(e.code, e.message, e.reason)
            return
        stream.conn, self.stream = self, stream
        if stream.inflight:        # steps of an earlier connection still run: t is not final
            self.hello_due = True
        else:
            self.hello()

    def hello(self):
        svc = self.service
        self.hello_due = False
        self.transport.send(WSMsgType.TEXT, json.dumps({
            "stream": self.stream.id, "t": self.stream.t, "token": self.stream.token,
            "input_size": svc.model.input_size, "hidden_size": svc.model.hidden_size,
            "x_dtype": self.x_dtype.name, "y_dtype": svc.y_dtype_name}).encode())

    def on_ws_frame(self, transport, frame):
        kind = frame.msg_type
        if kind != WSMsgType.BINARY or not frame.fin or transport.is_close_frame_sent:
            if transport.is_close_frame_sent:   # closed: only the client's answering close matters
                self.picows_closed()
                if kind == WSMsgType.CLOSE:
                    transport.disconnect()
            elif kind == WSMsgType.CLOSE:
                self.client_closed(frame.get_close_code())
            elif kind == WSMsgType.TEXT:
                self.close(UNSUPPORTED, "frames after the hello must be binary (x)")
            elif kind in (WSMsgType.BINARY, WSMsgType.CONTINUATION):
                self.close(UNSUPPORTED, "x must come in one frame, not fragments")
            return
        stream = self.stream
        if stream is None or self.closed or stream.leaving:
            return
        payload = frame.get_payload_as_bytes()
        if len(payload) != self.x_bytes:
            n, size = len(payload), self.service.model.input_size
            other = {2 * size: "bfloat16", 4 * size: "float32"}.get(n)
            hint = (f": the size of {other} x, which needs ?dtype={other}"
                    if other in self.service.x_dtypes else "")
            self.close(INVALID, f"x must be {self.x_bytes} bytes ({self.service.model.input_size} "
                                f"{self.x_dtype.name} values), got {n}{hint}")
            return
        svc = self.service
        if svc.echo:
            svc.steps += 1
            transport.send(WSMsgType.BINARY, svc.zeros)
            return
        x = np.frombuffer(payload, self.x_dtype)
        # x.x is finite when every value is (and none is huge): one dot product,
        # cheaper than isfinite's array; the exact check decides otherwise
        if not (self.dot_checks and math.isfinite(x.dot(x))) and not np.isfinite(x).all():
            self.close(INVALID, f"x[{int(np.argmin(np.isfinite(x)))}] is not finite")
            return
        try:
            svc.submit(stream, x, self.answer)
        except Refused as e:
            self.close(e.code, e.message, e.reason)

    def _answer(self, y, error):
        svc, stream = self.service, self.stream
        svc.finish(stream, error)
        if not self.closed:
            if error is None:
                self.transport.send(WSMsgType.BINARY, y.view(svc.y_view))
            else:
                self.close(INTERNAL, f"the step failed: {error}")
        if not stream.inflight:
            if stream.conn is not None and stream.conn.hello_due:
                stream.conn.hello()
            elif stream.ends and svc.streams.get(stream.id) is stream:
                svc.remove(stream)         # ended by its client while steps ran

    def client_closed(self, code):
        """The client's close: code 1000 ends the stream (once its steps are answered)."""
        stream = self.stream
        if code == WSCloseCode.OK and stream is not None and stream.conn is self:
            stream.leaving = stream.ends = True
            if not stream.inflight:
                self.service.remove(stream)
        self.closed = True
        self.transport.send_close(WSCloseCode.OK)
        self.transport.disconnect()

    def close(self, code, message, reason=None):
        """Closes with code and message (see send_close)."""
        if self.closed:
            return
        self.closed = True
        send_close(self.service, self.transport, code, message, reason)
        self.detach()              # a reconnect need not wait for that answer

    def picows_closed(self):
        """After a close of picows's own (count_picows_close), the first
        time: counts it, and the stream waits for a reconnect."""
        if not self.closed:
            self.closed = True
            count_picows_close(self.service, self.transport)
            self.detach()

    def on_ws_disconnected(self, transport):
        if transport.is_close_frame_sent:
            self.picows_closed()
        self.closed = True
        self.service.connections -= 1
        self.detach()

    def detach(self):
        """Lets go of the stream, which waits for its next connection."""
        stream = self.stream
        if stream is not None and stream.conn is self:
            stream.conn = None
            stream.seen = time.monotonic()


def health(service, ports):
    return 200, service.health(*ports)


def live(service, ports):
    """Liveness: the event loop answers."""
    return 200, {"live": True}


def ready(service, ports):
    """Readiness (Service.readiness): 503 while the server drains or its table is full."""
    ok, why = service.readiness()
    return (200, {"ready": True}) if ok else (503, {"ready": False, "why": why})


# the health paths, on both ports: (status, JSON reply) of (service, ports)
PROBES = {"/health": health, "/health/live": live, "/health/ready": ready}


def ws_factory(service, ports, address):
    """picows's listener factory: routes /ws/ID to a Connection, and answers
    the health probes (PROBES) and GET /owner/ID (this server's addresses: through a proxy
    that routes by the stream id, those of the server that owns ID), and /mux to a
    multiplexed connection (fastln.serve.mux)."""
    from . import mux

    def factory(request):
        path, _, query = request.path.decode("latin-1").partition("?")
        if path == mux.PATH:
            return mux.connect(service, parse_qs(query))
        if path in PROBES:
            status, reply = PROBES[path](service, ports)
            body, headers = json.dumps(reply).encode(), {"Content-Type": "application/json"}
            if status == 200:
                response = WSUpgradeResponse.create_ok_response(body, headers)
            else:
                response = WSUpgradeResponse.create_error_response(status, body, headers)
            return WSUpgradeResponseWithListener(response, None)
        if path.startswith("/owner/"):
            body = json.dumps({"http": f"http://{address}:{ports[1]}",
                               "ws": f"ws://{address}:{ports[0]}"}).encode()
            return WSUpgradeResponseWithListener(WSUpgradeResponse.create_ok_response(
                body, {"Content-Type": "application/json"}), None)
        if not path.startswith("/ws/"):
            service.refused("bad_request")
            return None            # 404
        # parse_qs decodes %-escapes that are not UTF-8 as U+FFFD: every value is a clean str
        stream_id, q = path[4:], parse_qs(query)
        refusal = None
        try:
            check_stream_id(stream_id)
        except Refused as e:
            refusal = e
        dtype = q.get("dtype", [next(iter(service.x_dtypes))])[-1]
        if dtype not in service.x_dtypes:
            refusal = Refused(POLICY, 422, f"dtype must be one of {', '.join(service.x_dtypes)}, "
                                           f"got {dtype[:20]!r}")
        new = q.get("new", ["0"])[-1]
        if new not in ("0", "1"):
            refusal = Refused(POLICY, 422, f"new must be 0 or 1, got {new[:20]!r}")
        token = q.get("token", [None])[-1]
        return Connection(service, stream_id, new == "1",
                          service.x_dtypes.get(dtype, np.float32), refusal, token)
    return factory
