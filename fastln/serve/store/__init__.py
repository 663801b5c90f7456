"""Where a server's checkpoints of its streams live, so that the streams
outlive the server's process: each stream's state, step count and token
hash, one :class:`Record` each.

- :mod:`~fastln.serve.store.record`: a record and its bytes;
- :mod:`~fastln.serve.store.base`: :class:`Store`, the methods every store
  has, :class:`ServerInfo`, and the errors;
- :mod:`~fastln.serve.store.directory`: :class:`DirStore`, a directory, for
  one server;
- :mod:`~fastln.serve.store.redis`: ``RedisStore``, Redis, shared by the
  servers behind a proxy (it needs the ``redis`` package of the serve
  extra, which it imports only where a Redis URL is given).

:func:`open_store` makes the one that its argument names.
"""
from __future__ import annotations

import os
import urllib.parse

from .base import Held, ServerInfo, Store, StoreError
from .directory import DirStore
from .record import Record, decode, encode

__all__ = ["DirStore", "Held", "Record", "ServerInfo", "Store", "StoreError", "decode",
           "encode", "open_store"]

REDIS_SCHEMES = ("redis", "rediss", "unix")


def open_store(url_or_dir, fingerprint: str, *, dtypes, shape) -> Store:
    """The store that ``url_or_dir`` names, not yet started.

    Parameters
    ----------
    url_or_dir : str or os.PathLike
        ``redis://host:port/db`` (``rediss://`` for TLS, ``unix:///path``
        for a Unix socket, ``?db=N`` selecting the database) names a
        :class:`~fastln.serve.store.redis.RedisStore`; anything without
        ``://`` is a directory, a :class:`DirStore`.
    fingerprint : str
        The served model's fingerprint: checkpoints of different models are
        kept apart.
    dtypes : sequence of numpy dtypes
        The dtype of each of a stream's state arrays.
    shape : sequence of int
        The shape of every state array, ``(num_layers, 1, H)``.

    Returns
    -------
    Store

    Raises
    ------
    ValueError
        A URL of another scheme, or a Redis URL without a host, with a bad
        port or with a database that is not a number.
    """
    if isinstance(url_or_dir, os.PathLike):
        url_or_dir = os.fspath(url_or_dir)
    if not isinstance(url_or_dir, str) or not url_or_dir:
        raise TypeError(f"url_or_dir must be a Redis URL or a directory, got {url_or_dir!r}")
    if "://" not in url_or_dir:
        return DirStore(url_or_dir, fingerprint, dtypes, shape)
    _check_redis_url(url_or_dir)
    # the redis package is imported only where a Redis URL is given
    from .redis import RedisStore

    return RedisStore(url_or_dir, fingerprint, dtypes, shape)


def _check_redis_url(url):
    """A ValueError naming what is wrong with the Redis URL url."""
    def bad(why):
        return ValueError(f"url_or_dir {url!r} is not a Redis URL: {why} "
                          f"(redis://host:port/db, rediss://..., unix:///path)")

    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in REDIS_SCHEMES:
        raise bad(f"its scheme is {parts.scheme!r}")
    if parts.scheme == "unix":
        if not parts.path:
            raise bad("it names no socket path")
    else:
        if not parts.hostname:
            raise bad("it names no host")
        try:
            port = parts.port
        except ValueError:
            port = 0
        if port == 0:
            raise bad("its port is not a number in 1-65535")
        db = parts.path.lstrip("/")
        if db and not db.isdigit():
            raise bad(f"its database {db!r} is not a number")
    db = urllib.parse.parse_qs(parts.query).get("db", ["0"])[-1]
    if not db.isdigit():
        raise bad(f"its database {db!r} is not a number")
