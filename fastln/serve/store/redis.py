"""The Redis store, :class:`RedisStore`: checkpoints that every server
behind a proxy shares, so that any of them takes over the streams of one
that died.

Its keys live under ``fastln:<fingerprint[:16]>:``, so that two models
never share one: ``s:<id>`` holds a stream's record (its
:func:`~fastln.serve.store.record.encode` bytes), ``o:<id>`` the id of the
server that owns the stream, and ``lease:<server id>`` a server's advertised
WebSocket address, expiring unless the server renews it
(:meth:`RedisStore.renew`). A stream belongs to one server at a time:

- a write is fenced, in one Lua script: a record is written (and a removed
  stream deleted) only where the stream has no owner, which it then gets,
  or its owner is this server; the others are refused, so that a server
  that lost a stream (a paused process whose lease expired) never
  overwrites the checkpoints of its new owner;
- a take is one Lua script too: it makes this server the owner where the
  stream has none, this server owns it, or the owner's lease has expired.
  While the owner's lease lives, the owner's WebSocket address is probed
  with a TCP connect: a refused connection means the owner process is dead
  (kill -9 leaves no listener but its lease lives on), and the stream is
  taken at once; otherwise the take waits for the lease to expire.

The scripts run with EVALSHA, loaded again where Redis answers NOSCRIPT (a
restarted Redis), as redis-py's Script objects do. Big writes go in chunks
of :data:`CHUNK` records, so that Redis never runs one script long. The
client is ``redis.asyncio``'s, with short timeouts and no retries, so that
an outage fails within a second instead of holding a checkpoint; every
Redis error or timeout is a :class:`~fastln.serve.store.base.StoreError`.
The scripts read a lease key that they are not given, which a Redis
cluster refuses: the store needs one Redis server (or a primary).
"""
from __future__ import annotations

import asyncio
import urllib.parse

from ..extra import needs_extra
from .base import Held, Store, StoreError
from .record import decode, encode

with needs_extra(__name__):
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.exceptions import RedisError

TIMEOUT = 0.75          # seconds a command waits on Redis's answer
CONNECT_TIMEOUT = 0.5   # seconds a connection to Redis may take
PROBE_TIMEOUT = 0.3     # seconds take's TCP probe of an owner may take
POLL = 0.1              # seconds between take's tries while an owner's lease lives
CHUNK = 512             # records (or removed ids) a script writes at most

# KEYS: s:<id> and o:<id> of each stream; ARGV: this server's id, the number n of
# streams to write, then their records. The first n streams are written, the
# others deleted, each only where it has no owner or this server owns it; a
# stream written without an owner gets this server. A record older than the one
# stored (its t, the i64 at bytes 6-13) is not written: a write that timed out
# in a paused Redis runs when Redis resumes, after the later ones maybe.
# Returns the 1-based positions of the streams another server owns.
_WRITE = """
local me, n = ARGV[1], tonumber(ARGV[2])
local refused = {}
for i = 1, #KEYS / 2 do
  local owner = redis.call('GET', KEYS[2 * i])
  if owner and owner ~= me then
    refused[#refused + 1] = i
  elseif i <= n then
    local stored = redis.call('GETRANGE', KEYS[2 * i - 1], 6, 13)
    if #stored < 8 or struct.unpack('<i8', stored) <= struct.unpack('<i8', ARGV[2 + i], 7) then
      redis.call('SET', KEYS[2 * i - 1], ARGV[2 + i])
    end
    if not owner then redis.call('SET', KEYS[2 * i], me) end
  else
    redis.call('DEL', KEYS[2 * i - 1], KEYS[2 * i])
  end
end
return refused
"""

# KEYS: s:<id>, o:<id>; ARGV: this server's id, the lease keys' prefix, the id of
# an owner known to be dead ('' for none). Returns {0} where there is no record;
# {2, owner, its ws address, its lease's milliseconds left} where another server
# owns the stream and its lease lives (and it is not the dead one); else makes
# this server the owner and returns {1, record}.
_TAKE = """
local record = redis.call('GET', KEYS[1])
if not record then return {0} end
local me = ARGV[1]
local owner = redis.call('GET', KEYS[2])
if owner and owner ~= me and owner ~= ARGV[3] then
  local lease = ARGV[2] .. owner
  local ws = redis.call('GET', lease)
  if ws then return {2, owner, ws, redis.call('PTTL', lease)} end
end
if owner ~= me then redis.call('SET', KEYS[2], me) end
return {1, record}
"""

# KEYS: o:<id> of each stream; ARGV: this server's id. Deletes those it owns.
_RELEASE = """
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then redis.call('DEL', KEYS[i]) end
end
return 0
"""


class RedisStore(Store):
    """Checkpoints in Redis, shared by the servers of one model (see the
    module).

    Parameters
    ----------
    url : str
        ``redis://host:port/db``, ``rediss://...`` or ``unix:///path``.
    fingerprint : str
        The model's fingerprint; its first 16 characters name the keys'
        namespace.
    dtypes : sequence of numpy dtypes
        The dtypes of a stream's state arrays.
    shape : sequence of int
        The shape of each state array.
    """

    shared = True

    def __init__(self, url: str, fingerprint: str, dtypes, shape):
        super().__init__(fingerprint, dtypes, shape)
        self.url = url
        self.prefix = f"fastln:{fingerprint[:16]}:"
        self.server = None
        self._redis = None
        self._leased = False   # whether renew made the lease

    def __repr__(self):   # no password: the errors that show it reach logs and /health
        parts = urllib.parse.urlsplit(self.url)
        if parts.password is not None:
            parts = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@"))
        return f"RedisStore({parts.geturl()!r}, keys {self.prefix!r})"

    async def start(self, server):
        if self._redis is not None:
            raise RuntimeError(f"{self!r} is started already")
        if not isinstance(server.id, str) or not server.id:
            raise ValueError(f"server.id must be a non-empty str, got {server.id!r}")
        if not server.lease > 0:
            raise ValueError(f"server.lease must be positive seconds, got {server.lease!r}")
        self.server = server
        # from_url connects on the first command, so that a start succeeds while
        # Redis is down; no retries: a failed command fails at once
        self._redis = aioredis.Redis.from_url(
            self.url, socket_timeout=TIMEOUT, socket_connect_timeout=CONNECT_TIMEOUT,
            retry=Retry(NoBackoff(), 0))
        self._write = self._redis.register_script(_WRITE)
        self._take = self._redis.register_script(_TAKE)
        self._release = self._redis.register_script(_RELEASE)

    async def load_all(self):
        return []

    async def write(self, records, removed, full=False):
        me = self._me()
        blobs = await asyncio.to_thread(lambda: [encode(r) for r in records]) if records else []
        items = [(r.stream, blob) for r, blob in zip(records, blobs)]
        items += [(sid, None) for sid in removed]
        refused = []
        for i in range(0, len(items), CHUNK):
            chunk = items[i:i + CHUNK]
            keys = [key for sid, _ in chunk for key in (self._key("s", sid), self._key("o", sid))]
            written = [blob for _, blob in chunk if blob is not None]
            got = await self._call("a checkpoint write", self._write(
                keys=keys, args=[me, len(written), *written]))
            refused += [chunk[j - 1][0] for j in got]
        return refused

    async def release(self, ids):
        me = self._me()
        for i in range(0, len(ids), CHUNK):
            keys = [self._key("o", sid) for sid in ids[i:i + CHUNK]]
            await self._call("a release", self._release(keys=keys, args=[me]))

    async def take(self, stream, wait):
        me = self._me()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        keys = [self._key("s", stream), self._key("o", stream)]
        probed, dead = None, ""
        while True:
            got = await self._call(f"taking stream {stream!r}", self._take(
                keys=keys, args=[me, self._key("lease", ""), dead]))
            if got[0] == 0:
                return None
            if got[0] == 1:
                try:
                    return await asyncio.to_thread(decode, got[1], self.dtypes, self.shape)
                except ValueError as e:
                    raise StoreError(f"the checkpoint of stream {stream!r} in {self!r} is "
                                     f"unreadable: {e}") from e
            owner, ws, left_ms = got[1].decode(), got[2].decode(), int(got[3])
            if owner != probed:   # probed once per owner: a refusal means it is dead
                probed = owner
                if ws and await _refuses(ws):
                    dead = owner
                    continue
            left = deadline - loop.time()
            if left <= 0:
                raise Held(owner, max(left_ms, 0) / 1000)
            await asyncio.sleep(min(left, POLL, max(left_ms, 1) / 1000))

    async def renew(self):
        server = self._started()
        key, px = self._key("lease", server.id), max(1, round(server.lease * 1000))
        value = server.ws or ""
        if not self._leased:
            made = await self._call("making the lease", self._redis.set(key, value, px=px,
                                                                        nx=True))
            if not made:
                raise StoreError(f"the lease of server id {server.id!r} lives in {self!r}: "
                                 f"another live server has this id")
            self._leased = True
            return True
        if await self._call("renewing the lease", self._redis.set(key, value, px=px, xx=True)):
            return True
        # it expired: made again, so that the next renew holds; streams may be lost
        await self._call("making the lease", self._redis.set(key, value, px=px, nx=True))
        return False

    async def owned(self, ids):
        me = self._me().encode()
        mine = []
        for i in range(0, len(ids), CHUNK):
            chunk = ids[i:i + CHUNK]
            owners = await self._call("reading owners", self._redis.mget(
                [self._key("o", sid) for sid in chunk]))
            mine += [sid for sid, owner in zip(chunk, owners) if owner in (None, me)]
        return mine

    async def close(self):
        if self._redis is None:
            return
        try:
            if self._leased:   # a takeover of its streams need not wait for the lease
                await self._call("deleting the lease",
                                 self._redis.delete(self._key("lease", self.server.id)))
                self._leased = False
        finally:
            await self._redis.aclose()
            self._redis = None

    def _key(self, kind, name):
        return f"{self.prefix}{kind}:{name}"

    def _started(self):
        """The server this store works for; a RuntimeError before start."""
        if self._redis is None:
            raise RuntimeError(f"{self!r} is not started: call start() first")
        return self.server

    def _me(self):
        return self._started().id

    async def _call(self, what, command):
        """command's result; a StoreError where Redis fails or times out."""
        try:
            return await command
        except (RedisError, OSError) as e:
            raise StoreError(f"{what} failed in {self!r}: {type(e).__name__}: {e}") from e


async def _refuses(address):
    """Whether address (``host:port``) refuses a TCP connection: no process
    listens there. A connection, a timeout or another error is no proof."""
    host, _, port = address.rpartition(":")
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host.strip("[]"), int(port)), PROBE_TIMEOUT)
    except ConnectionRefusedError:
        return True
    except (OSError, asyncio.TimeoutError, ValueError):
        return False
    writer.close()
    return False
