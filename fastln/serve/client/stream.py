"""StreamClient: one stream of a fastln-serve server on one WebSocket (the
protocol of fastln.serve.ws.stream), x and y as NumPy arrays."""
import asyncio
from collections import deque

import numpy as np

from ..extra import needs_extra

with needs_extra(__name__):
    from .wire import BINARY, Client, dtype_of, stream_url


class StreamClient(Client):
    """One stream of a fastln-serve server; build it with :meth:`connect`."""

    def __init__(self):
        super().__init__()
        self._inflight = deque()   # futures of the replies not yet arrived, oldest first

    @classmethod
    async def connect(cls, url, stream_id, new=False, dtype="float32", timeout=10.0,
                      token=None):
        """Connects to ``url`` (``ws://host:port``) for stream ``stream_id`` and
        waits for the hello; raises Closed if the server refuses. A new
        stream (``new=True``) gets its resume token in the hello
        (:attr:`token`); a reconnect presents it as ``token``."""
        self = cls()
        h = await self._peer.connect(stream_url(url, stream_id, new, token, dtype), timeout)
        self.t, self.token = h["t"], h["token"]
        self.x_dtype, self.y_dtype = dtype_of(h["x_dtype"]), dtype_of(h["y_dtype"])
        return self

    def send(self, x):
        """Sends one step's x, shape (input_size,); its reply comes from recv()."""
        if self.closed is not None:
            raise self.closed
        x = np.ascontiguousarray(x, self.x_dtype)
        self._peer.transport.send(BINARY, x.view(np.uint8).data)
        f = asyncio.get_running_loop().create_future()
        self._inflight.append(f)
        self._unread.append(f)

    async def recv(self):
        """y of the oldest step sent and not yet received."""
        return await self._oldest_unread()

    async def step(self, x):
        """One step: sends x and returns its y."""
        self.send(x)
        return await self.recv()

    def _arrived(self, payload):
        self.t += 1
        if self._inflight:
            f = self._inflight.popleft()
            if not f.done():       # a recv() that timed out or was cancelled drops its y
                f.set_result(np.frombuffer(payload, self.y_dtype))

    def _text(self, message):
        """A text frame after the hello: the protocol sends none."""

    def _unanswered(self):
        """Pops the futures of the replies not yet arrived, oldest first."""
        while self._inflight:
            yield self._inflight.popleft()
