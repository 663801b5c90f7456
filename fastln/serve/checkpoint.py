"""Checkpoints of the served streams, so that a server that dies (``kill -9``,
the OOM killer, a lost machine) loses none of them.

A :class:`Checkpointer` writes the state and step count of every stream that
stepped since its last checkpoint to a store (fastln.serve.store: a directory,
or Redis) every ``interval`` seconds, and after ``steps`` steps of the server
when that is given. It runs on the event loop beside the connections: the
snapshot of the states is one copy out of the table between two batches
(``StreamTable.snapshot``), and the store's work does not block the loop.

What a checkpoint promises:

- **It never passes the replies.** A stream's checkpoint holds its state
  after t steps, and is written only once the server has sent the replies
  of those t steps: the write waits for a step that has run and whose reply
  is not out yet (a batch's answer waiting on the loop), for up to
  REPLY_WAIT seconds, after which that stream waits for the next
  checkpoint. A client therefore has every reply up to a checkpoint it is
  told of, and resends the steps after it (fastln.serve.client's replay).
- **Clients hear of it.** When a write completes, each connection that
  holds a written stream is told its durable step (``{"durable": ...}``, see
  fastln.serve.ws), and the hello and the multiplexed ``opened`` entries
  carry it.
- **One owner.** With a shared store (Redis), every server holds a lease that
  it renews every ``lease / 4`` seconds, and each stream has an owner in the
  store; writes are fenced by it. A server asked for a stream it does not
  hold takes it over from the store (:meth:`Checkpointer.fetch`: once per id,
  however many reconnects race), which succeeds once the owner's lease has
  expired, or at once when the owner's address refuses connections (its
  process is dead). A server whose lease lapsed (a paused process) takes no
  step until it has renewed it and dropped the streams that others took
  meanwhile (Service.submit refuses with 1013 until then).
- **Store outages cost no step.** A write that fails is counted
  (``fastln_serve_checkpoints_total{result="failed"}``), told in
  ``/health/ready``'s body, and retried at the next interval with every
  stream that stepped since the last write that succeeded; the streams go on
  from memory. While the store does not answer, no other server can take a
  stream over, so the owner keeps serving its streams.
"""
import asyncio
import math
import secrets
import time

import numpy as np

from .errors import CONFLICT, GONE, TRY_LATER, Refused
from .store import Held, Record, ServerInfo, StoreError

FULL_EVERY = 64   # a directory's every 64th checkpoint holds every stream: its older files go
REPLY_WAIT = 0.2  # seconds a checkpoint waits for the replies of the steps its states hold
TAKE_WAIT = 2.0   # seconds a takeover waits for a live owner's lease before it answers 4409


class Checkpointer:
    """Writes the service's streams to store, and takes streams over from it.

    Parameters
    ----------
    service : fastln.serve.service.Service
        The streams, their table and their connections.
    store : fastln.serve.store.Store
        Where the checkpoints go: a directory, or Redis (shared).
    interval : float
        Seconds between two checkpoints.
    steps : int, optional
        Also checkpoint once the server has answered this many steps since
        the last checkpoint.
    lease : float
        Seconds a server's lease lasts in a shared store; it renews it every
        lease / 4 seconds.
    ws : str, optional
        This server's WebSocket address, ``HOST:PORT``, as the store records
        it with the lease: another server probes it to tell a dead owner.
    """

    def __init__(self, service, store, interval=1.0, steps=None, lease=5.0, ws=None):
        self.service, self.store = service, store
        self.interval, self.steps, self.lease = interval, steps, lease
        self.info = ServerInfo(secrets.token_hex(8), ws, lease)
        self.removed = set()      # ids ended here since the last write: the store forgets them
        self.fetching = {}        # id -> the task that takes it over
        self.rewrite = False      # the store may have lost the streams: write them all again
        self.lease_until = math.inf if not store.shared else -math.inf
        self.count = {"ok": 0, "failed": 0}
        self.written = 0          # stream checkpoints written
        self.takeovers = 0
        self.rewinds = 0          # reconnects that lost replies, rewound to a checkpoint
        self.error = None         # the last write's error, None once one succeeds
        self.failing_since = None
        self.last_ok = None       # time.monotonic() of the last write that succeeded
        self.seconds = 0.0        # time spent in writes that succeeded
        self.since_full = 0
        self.tasks = []

    # ---- start and stop ------------------------------------------------------

    async def start(self):
        """Starts the store (a directory's lock), loads a directory's streams,
        and starts the checkpoints and the lease; returns the streams loaded."""
        await self.store.start(self.info)
        records = await self.store.load_all()
        for rec in records:
            self.service.add(rec.stream, rec.state, rec.t, token_hash=rec.token_hash,
                             saved=rec.t).owned = True
        if self.store.shared:
            await self.renew()
        loop = asyncio.get_running_loop()
        self.tasks = [loop.create_task(self.run())]
        if self.store.shared:
            self.tasks.append(loop.create_task(self.keep_lease()))
        return len(records)

    async def stop(self):
        """After the service drained: one last checkpoint of every stream, then
        (shared store) gives them up, so that other servers take them at once."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        try:
            await self.checkpoint(full=True)
            if self.store.shared:
                await self.store.release(list(self.service.streams))
        except StoreError as e:
            self._failed(e)
        await self.store.close()

    # ---- checkpoints ---------------------------------------------------------

    async def run(self):
        """Checkpoints every interval seconds, or after `steps` steps."""
        svc = self.service
        last, last_steps = time.monotonic(), svc.steps
        tick = min(self.interval, 0.05) if self.steps else self.interval
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            if now - last < self.interval and not (
                    self.steps and svc.steps - last_steps >= self.steps):
                continue
            last, last_steps = now, svc.steps
            try:
                await self.checkpoint(full=self.since_full + 1 >= FULL_EVERY)
            except StoreError as e:
                self._failed(e)

    async def checkpoint(self, full=False):
        """One checkpoint: the streams that stepped since their last one (every
        stream when full, or when the store may have lost them), and the ids
        ended since the last write. StoreError when the write fails; the
        streams are then written at the next one."""
        svc = self.service
        everything = full or self.rewrite
        streams = [s for s in svc.streams.values()
                   if not s.leaving and (everything or s.saved != s.t)]
        steps, state = svc.table.snapshot([s.id for s in streams])
        parts = svc._parts(state)
        taken = [(s, s.base + int(n)) for s, n in zip(streams, steps.tolist())]
        # a step that has run and whose reply is not out yet (its batch's
        # answer waits on the loop) is answered within a pass or two: the
        # write waits for it, so that a checkpoint never passes the replies
        deadline = time.monotonic() + REPLY_WAIT
        while any(s.t < t for s, t in taken) and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        records, written = [], []
        for i, (s, t) in enumerate(taken):
            if s.t < t or s.leaving or svc.streams.get(s.id) is not s:
                continue           # its reply is late, or it left: the next checkpoint's
            records.append(Record(s.id, t, s.token_hash, [p[:, i:i + 1] for p in parts]))
            written.append(s)
        full = full and len(records) == len(streams)
        removed, self.removed = list(self.removed), set()
        rewrite, self.rewrite = self.rewrite, False
        started = time.monotonic()
        try:
            refused = set(await self.store.write(records, removed, full))
        except BaseException:
            self.removed.update(removed)
            self.rewrite = self.rewrite or rewrite
            raise
        self.seconds += time.monotonic() - started
        self.count["ok"] += 1
        self.error = self.failing_since = None
        self.last_ok = time.monotonic()
        self.since_full = 0 if full else self.since_full + 1
        self.written += len(written) - len(refused)
        told = {}
        for s, rec in zip(written, records):
            t = rec.t
            if s.id in refused:
                if s.owned and svc.streams.get(s.id) is s:
                    self.lose(s)
                continue
            s.owned = True
            if t > s.t:
                continue           # rewound since the snapshot: its client replays up to t
            if s.saved is None or t > s.saved:
                s.saved = t
                if s.conn is not None:
                    told.setdefault(s.conn.conn, []).append((s.conn.index, t))
                    if s.conn.greeted:   # copies: views would keep the whole snapshot alive
                        s.snap = (t, [np.copy(a) for a in rec.state])
        for conn, pairs in told.items():
            conn.durable(pairs)

    def _failed(self, e):
        self.count["failed"] += 1
        self.error = str(e)
        if self.failing_since is None:
            self.failing_since = time.monotonic()

    def forget(self, stream):
        """stream leaves this server: ended (the store forgets it at the next
        write), or moved to another server (``stream.moved``: the store is
        the other server's to write)."""
        if not stream.moved and stream.saved is not None:
            self.removed.add(stream.id)

    def added(self, stream_id):
        """A stream opened or imported under stream_id: an earlier stream of
        that id that ended here is not forgotten over the new one."""
        self.removed.discard(stream_id)

    def lose(self, stream):
        """stream was taken over by another server: its connection is told
        (4410), and this server forgets it (the store is the other's now)."""
        svc = self.service
        stream.leaving = stream.moved = True
        if stream.conn is not None:
            stream.conn.close(GONE, f"stream {stream.id!r} was taken over by another server")
        if not stream.inflight:
            svc.remove(stream)
        else:
            stream.ends = True     # removed once its steps are answered

    async def release(self, stream_id):
        """A shared store forgets this server as stream_id's owner (a move);
        a store that does not answer is counted, and the import's write
        settles the owner."""
        if self.store.shared:
            try:
                await self.store.release([stream_id])
            except StoreError as e:
                self._failed(e)

    def rewind(self, stream, received):
        """A reconnect to stream whose client received `received` replies:
        when some are lost (received < stream.t: they went to a connection
        that died) and the stream's snap (its last checkpoint told to a
        greeted connection) is at or before received, the stream goes back
        to it, state and t, and its client replays the steps after it bit
        for bit. Otherwise nothing changes: received at or past t (a server
        that restored an older checkpoint) needs no rewind, and a snap past
        received cannot serve (the client raises ReplayError). Called once
        none of the stream's steps is in flight."""
        snap = stream.snap
        if (received >= stream.t or snap is None or snap[0] > received or stream.inflight
                or stream.leaving):
            return
        t, state = snap
        self.service.restore(stream, state, t)
        # the durable step the client is told: it keeps its steps from here on
        # (the store may hold a later checkpoint, of the same steps replayed)
        stream.saved = t
        self.rewinds += 1

    # ---- takeover ------------------------------------------------------------

    async def fetch(self, stream_id):
        """Takes stream_id over from a shared store when this server does not
        hold it, once however many callers wait: nothing when the store
        holds no such stream (the caller's claim then answers 4404).
        Refused with 4409 while another live server holds it (after
        waiting up to TAKE_WAIT seconds for its lease to end), 1013 while
        the store does not answer."""
        svc = self.service
        if not self.store.shared or stream_id in svc.streams:
            return
        task = self.fetching.get(stream_id)
        if task is None:
            task = self.fetching[stream_id] = asyncio.get_running_loop().create_task(
                self._take(stream_id))
            task.add_done_callback(lambda _: self.fetching.pop(stream_id, None))
        await asyncio.shield(task)

    async def _take(self, stream_id):
        try:
            rec = await self.store.take(stream_id, min(self.lease, TAKE_WAIT))
        except Held as e:
            raise Refused(CONFLICT, 409, f"another server holds stream {stream_id!r}: "
                                         f"retry ({e})", "conflict") from None
        except StoreError as e:
            raise Refused(TRY_LATER, 503, f"the checkpoint store does not answer, so stream "
                                          f"{stream_id!r} cannot be taken over: retry ({e})",
                          "store_down") from None
        svc = self.service
        if rec is None or stream_id in svc.streams:
            return
        svc.add(stream_id, rec.state, rec.t, token_hash=rec.token_hash,
                saved=rec.t).owned = True
        self.takeovers += 1

    # ---- the lease -------------------------------------------------------------

    def lapsed(self):
        """Whether this server's lease may have expired without its knowing
        (a paused process): then it takes no step until renew() answers."""
        return time.monotonic() > self.lease_until

    async def keep_lease(self):
        while True:
            await asyncio.sleep(self.lease / 4)
            await self.renew()

    async def renew(self):
        """Renews the lease. When it had expired, the streams that another
        server took meanwhile are dropped here, and the rest are written
        again at the next checkpoint (the store may have lost them). While
        the store does not answer, no server can take a stream over, so
        this one serves on."""
        started = time.monotonic()
        try:
            kept = await self.store.renew()
            if not kept:
                svc = self.service
                mine = set(await self.store.owned(list(svc.streams)))
                for s in [s for s in svc.streams.values() if s.id not in mine]:
                    self.lose(s)
                self.rewrite = True
        except StoreError as e:
            self._failed(e)
            self.lease_until = math.inf
            return
        self.lease_until = started + self.lease

    # ---- the probes and the metrics ----------------------------------------------

    def health(self):
        """The store's part of /health/ready's (and /health's) body."""
        age = None if self.last_ok is None else round(time.monotonic() - self.last_ok, 3)
        out = {"ok": self.error is None, "last_checkpoint_age_s": age,
               "checkpoints": dict(self.count), "streams_written": self.written,
               "write_seconds": round(self.seconds, 6)}
        if self.error is not None:
            out["error"] = self.error
            out["failing_for_s"] = round(time.monotonic() - self.failing_since, 3)
        return out
