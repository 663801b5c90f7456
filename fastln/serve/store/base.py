"""What every checkpoint store offers: :class:`Store`, whose methods the
directory and the Redis store implement; :class:`ServerInfo`, the server a
store works for; and the errors, :class:`StoreError` (the store failed) and
:class:`Held` (another live server owns the stream)."""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import numpy as np

from .record import Record


class StoreError(OSError):
    """The store failed: a timeout, a refused connection, a full disk, an
    unreadable checkpoint. Its message says which; the exception it comes
    from is its ``__cause__``. The server keeps serving from memory and
    tries again at its next checkpoint."""


class Held(Exception):
    """Another live server owns the stream that :meth:`Store.take` asked for.

    Parameters
    ----------
    owner : str
        The owner's server id.
    retry_after : float
        Seconds until the owner's lease expires, unless it renews it.
    """

    def __init__(self, owner: str, retry_after: float):
        super().__init__(f"server {owner!r} holds the stream; its lease ends in "
                         f"{retry_after:.2f} s unless renewed")
        self.owner, self.retry_after = owner, retry_after


class ServerInfo(NamedTuple):
    """The server a store works for.

    Attributes
    ----------
    id : str
        The server's id, unique among the servers that share a store.
    ws : str or None
        The WebSocket address it advertises, ``"host:port"``: another server
        probes it to tell a dead owner from a live one.
    lease : float
        Seconds its ownership of streams lasts without a :meth:`Store.renew`.
    """

    id: str
    ws: Optional[str]
    lease: float


class Store:
    """Where a server's checkpoints live. Every method may raise
    :class:`StoreError`; none blocks the event loop.

    Parameters
    ----------
    fingerprint : str
        The served model's fingerprint: a store keeps the checkpoints of
        different models apart.
    dtypes : sequence of numpy dtypes
        The dtype of each of a stream's state arrays.
    shape : sequence of int
        The shape of every state array, ``(num_layers, 1, H)``.

    Attributes
    ----------
    shared : bool
        Whether servers share the store, so that any of them may take a
        stream over (Redis), or one server has it alone (a directory).
    """

    shared = False

    def __init__(self, fingerprint: str, dtypes: Sequence, shape: Sequence[int]):
        if not isinstance(fingerprint, str):
            raise TypeError(f"fingerprint must be a str, got {type(fingerprint).__name__}")
        if not fingerprint:
            raise ValueError("fingerprint must be a non-empty str, got ''")
        if isinstance(dtypes, (str, np.dtype)) or not isinstance(dtypes, Sequence) \
                or not dtypes:
            raise TypeError(f"dtypes must be a non-empty sequence of dtypes, got {dtypes!r}")
        if not isinstance(shape, Sequence) or not all(
                isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 0
                for n in shape):
            raise TypeError(f"shape must be a sequence of non-negative ints, got {shape!r}")
        self.fingerprint = fingerprint
        self.dtypes = [np.dtype(d) for d in dtypes]
        self.shape = tuple(int(n) for n in shape)

    async def start(self, server: ServerInfo) -> None:
        """Starts working for ``server``. A directory store locks its
        directory (a second live server on it is a StoreError); the Redis
        store connects on first use, so that it starts while Redis is down."""
        raise NotImplementedError

    async def load_all(self) -> list[Record]:
        """Every stream of the store, for a start after a crash: those of a
        directory; none of Redis, whose streams are taken one by one."""
        raise NotImplementedError

    async def write(self, records: list[Record], removed: list[str],
                    full: bool = False) -> list[str]:
        """Makes ``records`` durable and forgets the streams ``removed``.

        Parameters
        ----------
        records : list of Record
            The streams' checkpoints.
        removed : list of str
            Ids of streams that left the server.
        full : bool
            True where ``records`` holds every stream of the server: a
            directory store writes a file that stands alone and deletes the
            older ones (Redis holds one record per stream already).

        Returns
        -------
        list of str
            The ids the store refused: streams another server owns now.
        """
        raise NotImplementedError

    async def release(self, ids: list[str]) -> None:
        """Gives up this server's ownership of the streams ``ids`` (a move
        to another server, a restart), so that another takes them at once."""
        raise NotImplementedError

    async def take(self, stream: str, wait: float) -> Optional[Record]:
        """Makes this server the owner of ``stream`` and returns its record.

        It takes the stream at once where it has no owner, this server owns
        it, or its owner's lease has expired or its owner's WebSocket address
        refuses connections (the process is dead). Otherwise it waits up to
        ``wait`` seconds for the lease to expire, then raises
        :class:`Held`. None where the store holds no such stream.
        """
        raise NotImplementedError

    async def renew(self) -> bool:
        """Renews this server's lease, creating it on the first call (a
        StoreError where a live lease of this server id exists: another
        server has the id). False where it had expired, so that another
        server may have taken streams: :meth:`owned` tells which are still
        this server's; the lease is made again. A server renews before its
        first write: a stream whose owner has no lease is taken at once."""
        raise NotImplementedError

    async def owned(self, ids: list[str]) -> list[str]:
        """The streams of ``ids`` that no other server owns: this server's,
        and those with no owner (a store that lost its data: the next write
        makes them this server's again)."""
        raise NotImplementedError

    async def close(self) -> None:
        """Ends the store's work for the server: frees its lock, or deletes
        its lease (so that its streams are taken at once) and closes its
        connections."""
        raise NotImplementedError
