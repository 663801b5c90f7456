"""Clients of the served model. A small asyncio client of each WebSocket
protocol, x and y as NumPy arrays: :class:`StreamClient`, one stream per
connection (fastln.serve.ws.stream), and :class:`MuxClient`, many streams on
one connection (fastln.serve.ws.mux)::

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

With ``resume=`` seconds (``connect(..., resume=30)``), a drop, a restart or
a move does not end the client: it reconnects to the same URL and resends
each stream's steps from the step the server resumes it at (after a crash,
its last checkpoint), out of the ``replay`` steps it keeps per stream, so
that every recv() returns each step's y once, bit for bit. A resume that it
cannot replay so raises :class:`ReplayError`::

    s = await StreamClient.connect(url, "mic-7", new=True, resume=30)

Besides: :func:`request` and :func:`move_stream` over HTTP, :func:`run_server`
(a server in a subprocess), and :func:`run` (the event loop).

The modules: ``wire`` (the end of a WebSocket that both clients and the
load generator build on, what the clients share, their reconnect included,
and the protocols' URLs), ``stream`` and ``mux`` (the two clients),
``admin`` (HTTP), ``testing`` (run_server). They import
picows, and of fastln.serve the errors, frames, loop and extra modules:
nothing of the server, which run_server starts as a command.
"""
from ..extra import needs_extra
from ..loop import run
from .admin import MoveError, move_stream, request
from .testing import Server, run_server

with needs_extra(__name__):
    from .mux import FrameRefused, MuxClient, MuxStream
    from .stream import StreamClient
    from .wire import Closed, ReplayError

__all__ = ["Closed", "FrameRefused", "MoveError", "MuxClient", "MuxStream", "ReplayError",
           "Server", "StreamClient", "move_stream", "request", "run", "run_server"]
