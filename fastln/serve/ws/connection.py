"""What a connection of either WebSocket protocol does alike: the frame
kinds, the connection count and its limit, a close with a code and a
message (counted as a refusal where it is one), a close of picows's own, the
client's close, and the end of the connection. ws.stream and ws.mux build
their connections on :class:`Connection`.
"""
import asyncio

import numpy as np

from ..errors import CLOSE_WAIT, REASONS, TRY_LATER, UNSUPPORTED
from ..extra import needs_extra

with needs_extra(__name__):
    from picows import WSCloseCode, WSListener, WSMsgType

BINARY, TEXT, CLOSE = WSMsgType.BINARY, WSMsgType.TEXT, WSMsgType.CLOSE


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


class Connection(WSListener):
    """One WebSocket connection of the service's (either protocol).

    A subclass takes its binary frames in ``on_ws_frame`` and hands every
    other frame to :meth:`on_other_frame`; it defines ``opened()`` (the
    connection is up and within the limits), ``text(frame)`` (a text frame),
    ``end_streams()`` (the client closed with 1000) and ``release()`` (let
    go of the streams it holds, which wait for a reconnect)."""

    fragments = "a frame must come whole, not in fragments"   # the close of a fragment

    def __init__(self, service, x_dtype=np.float32, refusal=None):
        super().__init__()
        self.service = service
        self.x_dtype = np.dtype(x_dtype)
        self.size = service.model.input_size
        self.x_bytes = self.size * self.x_dtype.itemsize
        # x.x is finite when every value is (and none is huge): one dot product,
        # cheaper than isfinite's array; the exact check decides otherwise
        self.dot_checks = self.x_dtype.name in ("float32", "float64")
        self.refusal = refusal     # a bad query, told once the connection is up
        self.transport = None
        self.closed = False

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
            self.opened()

    def on_other_frame(self, transport, frame):
        """A frame that is not a whole binary one, or any frame once the
        server has sent its close (then only the client's answering close
        matters)."""
        kind = frame.msg_type
        if transport.is_close_frame_sent:
            self.picows_closed()
            if kind == CLOSE:
                transport.disconnect()
        elif kind == CLOSE:
            self.client_closed(frame.get_close_code())
        elif kind == TEXT:
            self.text(frame)
        elif kind in (BINARY, WSMsgType.CONTINUATION):
            self.close(UNSUPPORTED, self.fragments)

    def client_closed(self, code):
        """The client's close: code 1000 ends the streams it holds (each once
        its steps are answered); any other keeps them for a reconnect."""
        if code == WSCloseCode.OK:
            self.end_streams()
        self.closed = True
        self.transport.send_close(WSCloseCode.OK)
        self.transport.disconnect()

    def close(self, code, message, reason=None):
        """Closes with code and message (see send_close); the streams stay."""
        if self.closed:
            return
        self.closed = True
        send_close(self.service, self.transport, code, message, reason)
        self.release()             # a reconnect need not wait for the client's answer

    def picows_closed(self):
        """After a close of picows's own, the first time: counts its refusal
        (a frame against RFC 6455: 1002, or 1007 for a close reason that is
        not UTF-8; over --max-frame: 1009), and the streams wait for a
        reconnect."""
        if not self.closed:
            self.closed = True
            reason = REASONS.get(int(self.transport.close_handshake.sent.code))
            if reason is not None:
                self.service.refused(reason)
            self.release()

    def on_ws_disconnected(self, transport):
        if transport.is_close_frame_sent:
            self.picows_closed()
        self.closed = True
        self.service.connections -= 1
        self.release()
