"""The checkpointer of the served model (fastln.serve.checkpoint), in one
process, over a store in memory that keeps the stores' contract
(fastln.serve.store.Store): what a checkpoint holds, when clients hear of
it, what a failed write keeps, and takeover between two services that share
the store.

1. A checkpoint holds each stream's state after exactly the steps it says,
   bitwise the table's; only streams that stepped since their last one are
   written again; a step that ran and whose reply is not out yet is left to
   the next checkpoint; each connection hears its streams' durable steps.
2. A failed write keeps every stream and every removal for the next one,
   and the health body says so; the streams go on.
3. Takeover: a second service takes a stream over once the first one's lease
   is gone, at the checkpoint's step and state, once however many callers
   race; the token is checked against its hash; the first service, whose
   write is then refused, lets the stream go (4410); a lapsed lease stops
   steps until it is renewed.
4. Rewinds: a reconnect whose client received fewer replies than the
   stream's t goes back to the stream's last checkpoint told to a greeted
   connection (a copy of its state, not a view of the snapshot), and the
   steps after it run again bitwise; a checkpoint written while the stream
   has no connection, or one not yet greeted, keeps the older one; no
   rewind without such a checkpoint at or before the replies received, for
   received at or past t, or without a store; a write under way during a
   rewind tells nothing past the rewound t.

The same, with real processes, Redis, nginx and ``kill -9``:
tests/test_serve_crash.py.
"""
import asyncio
import hashlib
import math
import time

import numpy as np
import pytest

from fastln.rnn import LNLSTM

from _util import require

for _name in ("picows", "starlette", "uvicorn"):
    require(_name)

from fastln.serve.checkpoint import Checkpointer  # noqa: E402
from fastln.serve.errors import CONFLICT, GONE, TRY_LATER, Refused  # noqa: E402
from fastln.serve.service import Attachment, Service  # noqa: E402
from fastln.serve.store import Held, Store, StoreError  # noqa: E402

I, H = 5, 16


class MemoryStore(Store):
    """The stores' contract in memory. Servers that share one pass the same
    `shared` dict; `fail` makes every call raise StoreError; `dead` names
    owners whose process is gone."""

    def __init__(self, service, shared=None):
        super().__init__(service.fingerprint, service.state_dtypes,
                         service.state_shape)
        self.shared = shared is not None
        self.db = shared if shared is not None else {"s": {}, "o": {}, "lease": {}}
        self.fail = False
        self.takes = 0
        self.gate = None    # an asyncio.Event that write() waits for, when set

    def _check(self):
        if self.fail:
            raise StoreError("the store is down")

    async def start(self, server):
        self.me = server

    async def load_all(self):
        self._check()
        return [] if self.shared else list(self.db["s"].values())

    async def write(self, records, removed, full=False):
        self._check()
        await asyncio.sleep(0)
        if self.gate is not None:
            await self.gate.wait()
        refused = []
        for rec in records:
            owner = self.db["o"].get(rec.stream)
            if self.shared and owner not in (None, self.me.id):
                refused.append(rec.stream)
                continue
            self.db["s"][rec.stream] = rec
            self.db["o"][rec.stream] = self.me.id
        for sid in removed:
            if self.db["o"].get(sid) in (None, self.me.id):
                self.db["s"].pop(sid, None)
                self.db["o"].pop(sid, None)
        return refused

    async def release(self, ids):
        self._check()
        for sid in ids:
            if self.db["o"].get(sid) == self.me.id:
                del self.db["o"][sid]

    async def take(self, stream, wait):
        self._check()
        self.takes += 1
        await asyncio.sleep(0.01)
        rec = self.db["s"].get(stream)
        if rec is None:
            return None
        owner = self.db["o"].get(stream)
        if owner not in (None, self.me.id) and self.db["lease"].get(owner, 0) > time.monotonic():
            raise Held(owner, 1.0)
        self.db["o"][stream] = self.me.id
        return rec

    async def renew(self):
        self._check()
        kept = self.db["lease"].get(self.me.id, math.inf) > time.monotonic()
        self.db["lease"][self.me.id] = time.monotonic() + self.me.lease
        return kept

    async def owned(self, ids):
        self._check()
        return [sid for sid in ids if self.db["o"].get(sid) in (None, self.me.id)]

    async def close(self):
        pass


class Conn:
    """A connection as the service sees one: what it is told."""

    def __init__(self):
        self.told, self.closes = [], []

    def durable(self, pairs):
        self.told.append(pairs)

    def close(self, code, message):
        self.closes.append(code)

    def gone(self, attachment, message):
        self.closes.append(GONE)


def model():
    return LNLSTM(I, H, 2, seed=3)


async def step(svc, streams, x):
    """One step of each of streams through the service, answered."""
    done = asyncio.get_running_loop().create_future()

    def answer(y, error):
        svc.finish(streams, error)
        done.set_result(y)
    svc.submit(streams, x, answer, [s.id for s in streams])
    return await done


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def parts(state):
    return state if isinstance(state, tuple) else (state,)


def test_a_checkpoint_holds_what_it_says_and_tells_the_connections():
    async def main():
        svc = Service(model(), capacity=8)
        store = MemoryStore(svc)
        ck = svc.checkpointer = Checkpointer(svc, store, interval=3600)
        await ck.start()
        a, b, c = svc.add("a"), svc.add("b"), svc.add("c")
        conn = Conn()
        a.conn, b.conn = Attachment(conn, 0), Attachment(conn, 1)
        rng = np.random.default_rng(0)
        for k in range(3):
            await step(svc, [a, b] if k else [a], rng.standard_normal((2 if k else 1, I),
                                                                      np.float32))
        await ck.checkpoint()
        assert {s: r.t for s, r in store.db["s"].items()} == {"a": 3, "b": 2, "c": 0}
        for sid in "abc":
            rec, want = store.db["s"][sid], parts(svc.table.export_state(sid))
            assert rec.token_hash == hashlib.sha256(svc.streams[sid].token.encode()).digest()
            assert all(np.array_equal(p, q) for p, q in zip(rec.state, want))
        assert conn.told == [[(0, 3), (1, 2)]] and (a.saved, c.saved) == (3, 0)
        # only a stream that stepped is written again
        await step(svc, [b], rng.standard_normal((1, I), np.float32))
        store.db["s"].clear()
        await ck.checkpoint()
        assert list(store.db["s"]) == ["b"] and conn.told[-1] == [(1, 3)]
        # a step that ran and whose reply is not out yet waits for the next checkpoint
        svc.table.step(["a"], rng.standard_normal((1, I), np.float32))
        await ck.checkpoint()
        assert "a" not in store.db["s"]
        a.t += 1       # its reply goes out
        await ck.checkpoint()
        assert store.db["s"]["a"].t == 4 and a.saved == 4
        # an ended stream is forgotten at the next write; a moved one is left to its new owner
        svc.remove(c)
        b.moved = True
        svc.remove(b)
        await ck.checkpoint()
        assert sorted(store.db["s"]) == ["a", "b"]
        assert ck.health()["ok"] and ck.count == {"ok": 5, "failed": 0}
    run(main())


def test_a_failed_write_keeps_everything_for_the_next():
    async def main():
        svc = Service(model(), capacity=8)
        store = MemoryStore(svc)
        ck = svc.checkpointer = Checkpointer(svc, store, interval=3600)
        await ck.start()
        a, b = svc.add("a"), svc.add("b")
        await ck.checkpoint()
        svc.remove(b)
        await step(svc, [a], np.ones((1, I), np.float32))
        store.fail = True
        with pytest.raises(StoreError):
            await ck.checkpoint()
        ck._failed(StoreError("the store is down"))
        health = ck.health()
        assert not health["ok"] and "down" in health["error"] and health["failing_for_s"] >= 0
        await step(svc, [a], np.ones((1, I), np.float32))     # the streams go on
        store.fail = False
        await ck.checkpoint()
        assert store.db["s"]["a"].t == 2 and "b" not in store.db["s"] and ck.health()["ok"]
        assert a.saved == 2
    run(main())


def test_restart_from_a_directory_like_store_continues_bitwise():
    async def main():
        m = model()
        first = Service(m, capacity=8)
        store = MemoryStore(first)
        ck = first.checkpointer = Checkpointer(first, store, interval=3600)
        await ck.start()
        a = first.add("a")
        xs = np.random.default_rng(1).standard_normal((6, 1, I)).astype(np.float32)
        ys = [await step(first, [a], x) for x in xs[:3]]
        await ck.checkpoint()
        second = Service(m, capacity=8)     # the same store, after the first one died
        ck2 = second.checkpointer = Checkpointer(second, store, interval=3600)
        assert await ck2.start() == 1
        b = second.streams["a"]
        assert (b.t, b.saved, b.token) == (3, 3, None) and b.token_is(a.token)
        ys += [await step(second, [b], x) for x in xs[3:]]
        solo, state = [], None
        for x in xs:
            y, state = m.step(x, state)
            solo.append(y)
        assert all(np.array_equal(p, q) for p, q in zip(ys, solo))
    run(main())


def test_takeover_between_two_services():
    async def main():
        m, db = model(), {"s": {}, "o": {}, "lease": {}}
        one, two = Service(m, capacity=8), Service(m, capacity=8)
        s1, s2 = MemoryStore(one, db), MemoryStore(two, db)
        ck1 = one.checkpointer = Checkpointer(one, s1, interval=3600, lease=30)
        ck2 = two.checkpointer = Checkpointer(two, s2, interval=3600, lease=30)
        await ck1.start()
        await ck2.start()
        a = one.add("a")
        conn = Conn()
        a.conn = Attachment(conn)
        await step(one, [a], np.ones((1, I), np.float32))
        await ck1.checkpoint()
        with pytest.raises(Refused) as e:        # the owner's lease is alive
            await ck2.fetch("a")
        assert e.value.code == CONFLICT and "a" not in two.streams
        db["lease"][ck1.info.id] = 0             # the owner is gone
        await asyncio.gather(*(ck2.fetch("a") for _ in range(5)))
        assert s2.takes == 2 and ck2.takeovers == 1   # one refused, one that took it
        b = two.streams["a"]
        assert (b.t, b.saved) == (1, 1) and not b.token_is("wrong") and b.token is None
        assert two.claim("a", a.token) is b and b.token == a.token
        assert all(np.array_equal(p, q) for p, q in zip(parts(one.table.export_state("a")),
                                                         parts(two.table.export_state("a"))))
        await ck2.fetch("nope")                   # no such stream: the claim answers 4404
        assert "nope" not in two.streams
        # the first service's next write is refused: it lets the stream go
        await step(one, [a], np.ones((1, I), np.float32))
        await ck1.checkpoint()
        assert conn.closes == [GONE] and "a" not in one.streams and "a" in db["s"]
        assert db["s"]["a"].t == 1 and db["o"]["a"] == ck2.info.id
        # a lapsed lease stops the steps until it is renewed; streams taken meanwhile go
        c = two.add("c")
        await ck2.checkpoint()
        ck2.lease_until = time.monotonic() - 1
        with pytest.raises(Refused) as e:
            await step(two, [c], np.ones((1, I), np.float32))
        assert e.value.code == TRY_LATER and e.value.reason == "lease_lapsed"
        db["lease"][ck2.info.id] = 0
        db["o"]["c"] = "someone else"
        await ck2.renew()
        assert not ck2.lapsed() and "c" not in two.streams and "a" in two.streams
        await step(two, [b], np.ones((1, I), np.float32))
        # a store that does not answer: takeover is refused with 1013, steps go on
        s2.fail = True
        with pytest.raises(Refused) as e:
            await ck2.fetch("zzz")
        assert e.value.code == TRY_LATER and e.value.reason == "store_down"
        await ck2.renew()
        assert not ck2.lapsed()
        await step(two, [b], np.ones((1, I), np.float32))
    run(main())


def test_a_reconnect_that_lost_replies_rewinds_to_the_last_checkpoint():
    async def main():
        m = model()
        svc = Service(m, capacity=8)
        store = MemoryStore(svc)
        ck = svc.checkpointer = Checkpointer(svc, store, interval=3600)
        await ck.start()
        xs = np.random.default_rng(2).standard_normal((9, 1, I)).astype(np.float32)
        want, state = [], None
        for x in xs:
            y, state = m.step(x, state)
            want.append(y)

        def connect(received=None):
            att = a.conn = Attachment(Conn())
            svc.greet(a, att, received)
            return att
        a = svc.add("a")
        att = Attachment(Conn())
        a.conn = att
        for x in xs[:2]:
            await step(svc, [a], x)
        await ck.checkpoint()            # told, but the connection has not greeted it yet
        assert a.saved == 2 and a.snap is None and att.conn.told == [[(0, 2)]]
        svc.greet(a, att)
        for x in xs[2:4]:
            await step(svc, [a], x)
        await ck.checkpoint()
        t, snap = a.snap
        assert t == 4 and all(p.base is None for p in snap)    # copies, not views
        assert all(np.array_equal(p, q) for p, q in zip(snap, parts(svc.table.export_state("a"))))
        for x in xs[4:6]:                 # replies that the client does not receive
            await step(svc, [a], x)
        a.conn = None                     # its connection died
        await ck.checkpoint()
        assert (a.saved, a.snap[0]) == (6, 4)   # no connection: the snap stays
        for received in (6, 9, 3):        # nothing lost, a restore past it, no snap at or before
            connect(received)
            assert (a.t, a.saved, ck.rewinds) == (6, 6, 0)
        svc.greet(a, Attachment(Conn()), 0)     # a connection that no longer holds it
        assert (a.t, ck.rewinds) == (6, 0)
        connect(5)
        assert (a.t, a.base, a.saved, ck.rewinds) == (4, 4, 4, 1)
        got = [await step(svc, [a], x) for x in xs[4:]]
        assert all(np.array_equal(p, q) for p, q in zip(got, want[4:]))
        await ck.checkpoint()
        assert a.t == a.saved == a.snap[0] == 9 and store.db["s"]["a"].t == 9
        # a write under way while the stream rewinds tells nothing past the rewound t
        connect(9)
        await step(svc, [a], xs[0])
        store.gate = asyncio.Event()
        task = asyncio.ensure_future(ck.checkpoint())
        await asyncio.sleep(0.01)
        att = connect(9)
        assert (a.t, ck.rewinds) == (9, 2)
        store.gate.set()
        await task
        assert a.saved == a.snap[0] == 9 and att.conn.told == [] and store.db["s"]["a"].t == 10
        # a service without a store keeps no snap and ignores received
        plain = Service(m, capacity=2)
        b = plain.add("b")
        b.conn = Attachment(Conn())
        await step(plain, [b], xs[0])
        plain.greet(b, b.conn, 0)
        assert (b.t, b.snap) == (1, None)
    run(main())
