"""Reconnect and replay of fastln.serve.client's StreamClient and MuxClient
(resume=, replay=), against a fake server in this process: picows, both
protocols, a toy model (s' = tanh(W x + U s), y = s', float32) that
checkpoints every stream on command (its hello's and opened entries'
``durable``, and the ``{"durable": ...}`` text frames), and that is killed:
every connection dropped, every stream back at its last checkpoint (one
without a checkpoint is lost), the port closed for a while, and refusals
(4404, 4409) first if asked.

1. Per stream: a kill with steps in flight: every recv() gets its step's y
   exactly once, bit for bit that of a straight run; a restore older than
   the replies received replays them (checked, not returned again); a
   replayed reply that differs, and a restore older than the steps kept,
   raise ReplayError from the waiting and later calls; a stream killed
   before its first checkpoint (4404) is opened new and replayed from 0;
   4409 twice, then the reconnect succeeds; a second kill during the replay
   (both clients) is replayed again; when resume runs out the waiting and
   later calls raise Closed; resume=0 raises Closed at once.
2. Multiplexed: streams at different durable steps, sends spanning several
   frames (a small max_frame, the open messages in chunks), a kill with
   frames in flight, sends queued while the server is down: every send()
   answered once, bit for bit; a stream the server gives away (gone) is
   reattached on the same connection and the frames refused meanwhile are
   replayed; one that does not come back, or whose token is refused, leaves
   for gone (FrameRefused), the others going on; a stream's steps that ran
   out of order (a refused frame, a later one that ran) raise ReplayError.
"""
import asyncio
import json
import secrets
from urllib.parse import parse_qs

import numpy as np
import pytest

from _util import require

require("picows")

from picows import WSListener, WSMsgType, ws_create_server  # noqa: E402

from fastln.serve.client import (  # noqa: E402
    Closed,
    FrameRefused,
    MuxClient,
    ReplayError,
    StreamClient,
    mux,
)
from fastln.serve.frames import frame_bytes, header_bytes  # noqa: E402

I, H = 6, 8
_rng = np.random.default_rng(7)
W = _rng.standard_normal((H, I)) * 0.5
U = _rng.standard_normal((H, H)) * 0.5
BINARY, TEXT, CLOSE = WSMsgType.BINARY, WSMsgType.TEXT, WSMsgType.CLOSE


def model_step(s, x):
    """The toy model's step: the new state, which is also y (float32)."""
    return np.tanh(W @ x.astype(np.float64) + U @ s.astype(np.float64)).astype(np.float32)


def inputs(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, I)).astype(np.float32)


def straight(xs):
    """y of each step of a stream run alone, as bytes."""
    s, ys = np.zeros(H, np.float32), []
    for x in xs:
        s = model_step(s, x)
        ys.append(s.tobytes())
    return ys


def run(coro, timeout=30):
    async def main():
        try:
            return await asyncio.wait_for(coro, timeout)
        finally:
            while Fake.running:
                Fake.running.pop().server.close()
    return asyncio.run(main())


async def until(cond, timeout=5.0):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.002)


class Stream:
    def __init__(self, sid):
        self.id, self.token, self.t = sid, secrets.token_urlsafe(24), 0
        self.s, self.ckpt, self.conn = np.zeros(H, np.float32), None, None

    def step(self, x):
        self.s = model_step(self.s, np.array(x))
        self.t += 1
        return self.s.tobytes()


class Fake:
    """The fake server (see the module's docstring). ``answers``: how many
    more binary frames it answers (None: all); the others are dropped
    unanswered, in flight when it dies. ``refuse``: close codes that the
    next connections (per stream) or open entries (multiplexed) get
    instead."""

    running = []   # the fakes started, which run() stops

    def __init__(self, max_frame=1 << 16):
        self.streams, self.conns, self.refuse, self.refused = {}, set(), [], 0
        self.answers, self.max_frame, self.server, self.port = None, max_frame, None, 0

    async def start(self):
        self.server = await ws_create_server(self.factory, "127.0.0.1", self.port,
                                             max_frame_size=self.max_frame)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"ws://127.0.0.1:{self.port}"
        Fake.running.append(self)
        return self

    def factory(self, request):
        path, _, query = request.path.decode().partition("?")
        q = {k: v[-1] for k, v in parse_qs(query).items()}
        return MuxConn(self) if path == "/mux" else StreamConn(self, path[4:], q)

    def checkpoint(self, ids=None):
        """Every stream (or those of ids) durable at its t: told to its connection."""
        for st in self.streams.values():
            if ids is None or st.id in ids:
                st.ckpt = (st.t, st.s.copy())
        for conn in self.conns:
            conn.durable(ids)

    async def kill(self, down=0.0, answers=None):
        """Drops every connection without a close frame, restores each stream
        at its checkpoint (one without is lost), and takes no connection for
        down seconds; then answers that many binary frames (None: all)."""
        self.server.close()
        Fake.running.remove(self)
        for conn in list(self.conns):
            conn.dead = True
            conn.transport.disconnect()
        self.conns.clear()
        for sid, st in list(self.streams.items()):
            if st.ckpt is None:
                del self.streams[sid]
            else:
                st.t, st.s = st.ckpt[0], st.ckpt[1].copy()
                st.conn = None
        await asyncio.sleep(down)
        self.answers = answers
        await self.start()

    def claim(self, sid, new, token):
        """The stream an open names, or the close code that refuses it."""
        if self.refuse:
            return self.refuse.pop(0)
        st = self.streams.get(sid)
        if new:
            if st is not None:
                return 4409
            st = self.streams[sid] = Stream(sid)
        elif st is None:
            return 4404
        elif token != st.token:
            return 4403
        elif st.conn is not None:
            return 4409
        return st

    def hello_of(self, st):
        return {"t": st.t, "token": st.token, "durable": st.ckpt[0] if st.ckpt else None}


class Conn(WSListener):
    def __init__(self, fake):
        super().__init__()
        self.fake, self.dead, self.transport = fake, False, None

    def send_json(self, message):
        self.transport.send(TEXT, json.dumps(message).encode())

    def answering(self):
        """Whether the next binary frame is answered (see Fake)."""
        fake = self.fake
        if fake.answers is None:
            return True
        fake.answers -= 1
        return fake.answers >= 0

    def refuse(self, code):
        self.transport.send_close(code, b"refused")
        self.transport.disconnect()

    def on_ws_disconnected(self, transport):
        self.dead = True
        self.fake.conns.discard(self)
        self.release()

    def on_ws_frame(self, transport, frame):
        if self.dead:
            return
        if frame.msg_type is CLOSE:
            self.dead = True
            self.release(ends=frame.get_close_code() == 1000)
            transport.send_close(1000)
            transport.disconnect()
        elif frame.msg_type is TEXT:
            self.text(json.loads(frame.get_payload_as_bytes()))
        else:
            self.binary(frame.get_payload_as_bytes())


class StreamConn(Conn):
    def __init__(self, fake, sid, query):
        super().__init__(fake)
        self.sid, self.query, self.st = sid, query, None

    def on_ws_connected(self, transport):
        self.transport = transport
        got = self.fake.claim(self.sid, self.query.get("new") == "1", self.query.get("token"))
        if isinstance(got, int):
            self.refuse(got)
            return
        self.st, got.conn = got, self
        self.fake.conns.add(self)
        self.send_json({"stream": got.id, **self.fake.hello_of(got), "input_size": I,
                        "hidden_size": H, "x_dtype": "float32", "y_dtype": "float32"})

    def binary(self, payload):
        if self.answering():
            self.transport.send(BINARY, self.st.step(np.frombuffer(payload, np.float32)))

    def durable(self, ids):
        if ids is None or self.st.id in ids:
            self.send_json({"durable": self.st.ckpt[0]})

    def release(self, ends=False):
        st = self.st
        if st is not None and st.conn is self:
            st.conn = None
            if ends:
                del self.fake.streams[st.id]


class MuxConn(Conn):
    def __init__(self, fake):
        super().__init__(fake)
        self.slots = {}           # index -> [stream, gone?]

    def on_ws_connected(self, transport):
        self.transport = transport
        self.fake.conns.add(self)
        self.send_json({"mux": 1, "input_size": I, "hidden_size": H, "x_dtype": "float32",
                        "y_dtype": "float32", "max_streams": 1024,
                        "max_frame": self.fake.max_frame, "checkpoint": True})

    def text(self, message):
        (verb, items), = message.items()
        if verb == "open":
            entries = []
            for e in items:
                got = self.fake.claim(e["stream"], e.get("new", False), e.get("token"))
                if isinstance(got, int):
                    entries.append({"stream": e["stream"], "code": got, "error": "refused"})
                    continue
                k = min(set(range(len(self.slots) + 1)) - set(self.slots))
                self.slots[k], got.conn = [got, False], self
                entries.append({"stream": got.id, "index": k, **self.fake.hello_of(got)})
            self.send_json({"opened": entries})
        else:
            out = []
            for k in items:
                st, gone = self.slots.pop(k)
                out.append({"index": k, "stream": st.id, "t": st.t})
                if not gone and st.conn is self:
                    st.conn = None
                    if verb == "close":
                        del self.fake.streams[st.id]
            self.send_json({"closed" if verb == "close" else "detached": out})

    def binary(self, payload):
        n = int.from_bytes(payload[:4], "little")
        idx = np.frombuffer(payload, "<u4", n, 4).tolist()
        x = np.frombuffer(payload, np.float32, n * I, header_bytes(n)).reshape(n, I)
        rows = [self.slots[k] for k in idx]
        for k, (st, gone) in zip(idx, rows):
            if gone:
                self.fake.refused += 1
                self.send_json({"refused": {"index": k, "stream": st.id, "code": 4410,
                                            "error": "left"}})
                return
        if self.answering():
                self.transport.send(BINARY, b"".join(st.step(x[i])
                                                 for i, (st, _) in enumerate(rows)))

    def durable(self, ids):
        entries = [[k, st.ckpt[0]] for k, (st, gone) in self.slots.items()
                   if not gone and (ids is None or st.id in ids)]
        if entries:
            self.send_json({"durable": entries})

    def give_away(self, sid):
        """A move: tells the client with a gone notice; the stream stays on the fake."""
        k = next(k for k, (st, _) in self.slots.items() if st.id == sid)
        st = self.slots[k][0]
        self.slots[k][1], st.conn = True, None
        self.send_json({"gone": [{"index": k, "stream": sid, "t": st.t, "code": 4410,
                                  "error": "moved"}]})

    def release(self, ends=False):
        for st, gone in self.slots.values():
            if not gone and st.conn is self:
                st.conn = None
                if ends:
                    self.fake.streams.pop(st.id, None)


# ---- 1. one stream per connection ------------------------------------------


def test_a_kill_with_steps_in_flight_answers_each_step_once_bit_for_bit():
    xs = inputs(60)
    ys = straight(xs)

    async def main():
        fake = await Fake().start()
        async with await StreamClient.connect(fake.url, "a", new=True, resume=5) as c:
            for k in range(10):
                assert (await c.step(xs[k])).tobytes() == ys[k]
            fake.checkpoint()
            await until(lambda: c.durable == 10)
            assert len(c._xs) == len(c._ys) == 0      # the durable steps are let go
            fake.answers = 15
            for k in range(10, 50):
                c.send(xs[k])
            await until(lambda: fake.streams["a"].t == 25)
            await fake.kill(down=0.2)
            got = [await c.recv() for _ in range(40)]
            assert [y.tobytes() for y in got] == ys[10:50]
            assert c.t == 50 and c.pending == 0 and fake.streams["a"].t == 50
            assert c.closed is None and not c.reconnecting
            for k in range(50, 60):                     # it goes on as before
                assert (await c.step(xs[k])).tobytes() == ys[k]
    run(main())


def test_a_restore_older_than_the_replies_received_checks_them():
    xs = inputs(30, 1)
    ys = straight(xs)

    async def main():
        fake = await Fake().start()
        async with await StreamClient.connect(fake.url, "b", new=True, resume=5) as c:
            for k in range(5):
                await c.step(xs[k])
            fake.checkpoint()
            for k in range(5, 20):
                assert (await c.step(xs[k])).tobytes() == ys[k]
            await fake.kill()
            c.send(xs[20])
            c.send(xs[21])                                  # two sent while it reconnects
            assert [(await c.recv()).tobytes() for _ in range(2)] == ys[20:22]
            assert c.t == 22 and c.pending == 0 and fake.streams["b"].t == 22
            old = c.token
            for k in range(22, 30):
                assert (await c.step(xs[k])).tobytes() == ys[k]
            assert c.token == old
    run(main())


def test_a_kill_during_the_replay_replays_again():
    xs = inputs(40, 8)
    ys = straight(xs)
    ids = ["r0", "r1", "r2"]

    async def main():
        fake = await Fake(max_frame=frame_bytes(2, 4 * I)).start()
        c = await StreamClient.connect(fake.url, "r", new=True, resume=5)
        m = await MuxClient.connect(fake.url, resume=5)
        await m.open(ids, new=True)
        for k in range(30):
            c.send(xs[k])
            m.send(ids, np.stack([xs[k]] * 3))
            if k == 4:
                assert [(await c.recv()).tobytes() for _ in range(5)] == ys[:5]
                assert [(await m.recv()).tobytes() for _ in range(5)] == [y * 3 for y in ys[:5]]
                fake.checkpoint()
        assert [(await c.recv()).tobytes() for _ in range(20)] == ys[5:25]
        assert [(await m.recv()).tobytes() for _ in range(20)] == [y * 3 for y in ys[5:25]]
        await fake.kill(answers=12)          # the replay stops after 12 frames ...
        await until(lambda: fake.answers < 0)
        await fake.kill()                    # ... and the server dies again
        assert [(await c.recv()).tobytes() for _ in range(5)] == ys[25:30]
        assert [(await m.recv()).tobytes() for _ in range(5)] == [y * 3 for y in ys[25:30]]
        assert c.t == 30 and all(s.t == 30 for s in m.streams.values())
        await c.close()
        await m.close()
    run(main())


def test_a_replayed_reply_that_differs_raises_replay_error():
    xs = inputs(20, 2)

    async def main():
        fake = await Fake().start()
        c = await StreamClient.connect(fake.url, "c", new=True, resume=5)
        for k in range(4):
            await c.step(xs[k])
        fake.checkpoint()
        for k in range(4, 12):
            await c.step(xs[k])
        fake.streams["c"].ckpt[1][0] += 1e-3          # the checkpoint is not the state it was
        await fake.kill()
        c.send(xs[12])
        with pytest.raises(ReplayError, match="replayed reply of step 4 differs") as e:
            await c.recv()
        assert e.value.stream == "c" and isinstance(c.closed, ReplayError)
        with pytest.raises(ReplayError):
            c.send(xs[13])
    run(main())


def test_a_restore_older_than_the_kept_steps_raises_replay_error():
    xs = inputs(20, 3)

    async def main():
        fake = await Fake().start()
        c = await StreamClient.connect(fake.url, "d", new=True, resume=5, replay=4)
        for k in range(2):
            await c.step(xs[k])
        fake.checkpoint()
        for k in range(2, 12):
            await c.step(xs[k])
        assert len(c._xs) == 4
        await fake.kill()
        c.send(xs[12])
        with pytest.raises(ReplayError, match="restored step 2, older than the oldest step kept"):
            await c.recv()
    run(main())


def test_a_stream_lost_before_its_first_checkpoint_is_opened_new_and_replayed():
    xs = inputs(30, 4)
    ys = straight(xs)

    async def main():
        fake = await Fake().start()
        async with await StreamClient.connect(fake.url, "e", new=True, resume=5) as c:
            old = c.token
            for k in range(8):
                await c.step(xs[k])
            fake.answers = 4
            for k in range(8, 20):
                c.send(xs[k])
            await until(lambda: fake.streams["e"].t == 12)
            await fake.kill()                          # no checkpoint: the stream is lost
            assert "e" not in fake.streams
            assert [(await c.recv()).tobytes() for _ in range(12)] == ys[8:20]
            assert c.token != old and c.token == fake.streams["e"].token and c.t == 20
            for k in range(20, 30):
                assert (await c.step(xs[k])).tobytes() == ys[k]
    run(main())


def test_refusals_are_retried_until_the_reconnect_succeeds():
    xs = inputs(12, 5)
    ys = straight(xs)

    async def main():
        fake = await Fake().start()
        async with await StreamClient.connect(fake.url, "f", new=True, resume=5) as c:
            for k in range(6):
                await c.step(xs[k])
            fake.checkpoint()
            fake.refuse = [4409, 4409]
            await fake.kill(down=0.3)
            assert [(await c.step(x)).tobytes() for x in xs[6:]] == ys[6:]
            assert fake.refuse == []
    run(main())


def test_when_resume_runs_out_the_calls_raise_closed():
    xs = inputs(4, 6)

    async def main():
        fake = await Fake().start()
        c = await StreamClient.connect(fake.url, "g", new=True, resume=0.4)
        await c.step(xs[0])
        fake.checkpoint()
        c.send(xs[1])
        loop = asyncio.get_running_loop()
        start = loop.time()
        fake.refuse = [4409] * 1000                    # up, but never gives the stream back
        await fake.kill()
        with pytest.raises(Closed, match="reconnecting gave up after 0.4 s") as e:
            await c.recv()
        assert e.value.code == 4409 and 0.3 < loop.time() - start < 2.0
        with pytest.raises(Closed):
            c.send(xs[2])
    run(main())


def test_without_resume_a_drop_raises_closed_at_once():
    async def main():
        fake = await Fake().start()
        c = await StreamClient.connect(fake.url, "h", new=True)
        m = await MuxClient.connect(fake.url)
        await m.open(["h2"], new=True)
        await c.step(inputs(1)[0])
        fake.checkpoint()
        c.send(inputs(1)[0])
        m.send(["h2"], inputs(1))
        fake.answers = 0
        await fake.kill()
        for call in (c.recv(), m.recv()):
            with pytest.raises(Closed) as e:
                await call
            assert e.value.code is None
        assert c.closed is not None and m.closed is not None and not c.reconnecting
        with pytest.raises(ValueError, match="resume must be"):
            await StreamClient.connect(fake.url, "i", new=True, resume=-1)
        with pytest.raises(ValueError, match="replay must be"):
            await MuxClient.connect(fake.url, resume=1, replay=1.5)
    run(main())


# ---- 2. many streams on one connection -------------------------------------


def test_mux_streams_at_different_durable_steps_replay_a_kill():
    ids = [f"m{i}" for i in range(7)]
    xs = {sid: inputs(40, 10 + i) for i, sid in enumerate(ids)}
    ys = {sid: straight(v) for sid, v in xs.items()}

    async def main():
        fake = await Fake(max_frame=frame_bytes(3, 4 * I)).start()   # 3 rows a frame
        async with await MuxClient.connect(fake.url, resume=5) as m:
            assert m.rows_per_frame == 3
            await m.open(ids, new=True)
            step = dict.fromkeys(ids, 0)
            sent = []

            def send(names):
                m.send(names, np.stack([xs[s][step[s]] for s in names]))
                sent.append([(s, step[s]) for s in names])
                for s in names:
                    step[s] += 1

            async def check(n):
                for _ in range(n):
                    y = await m.recv()
                    want = sent.pop(0)
                    assert [r.tobytes() for r in y] == [ys[s][k] for s, k in want]

            for r in range(6):
                send(ids if r % 2 == 0 else ids[::2])
            await check(6)
            fake.checkpoint(ids[:2])                          # m0, m1 durable at their t
            for _ in range(4):
                send(ids[1:])
            await check(4)
            fake.checkpoint(ids[2:5])                         # m2..m4 later; m5, m6 never
            await until(lambda: m.streams["m4"].durable == step["m4"])
            assert m.streams["m0"].durable == 6 and m.streams["m6"].durable is None
            fake.answers = 9
            for r in range(8):                                # 3 frames or 2 each
                send(ids if r % 3 else ids[2:])
            await until(lambda: fake.answers < 0)
            await fake.kill(down=0.3)
            assert "m6" not in fake.streams                   # lost: opened new again
            for _ in range(3):                                # sent while it is down
                send(ids[::-1])
            assert m.reconnecting
            await check(len(sent))
            assert not m.reconnecting and m.closed is None
            for s in ids:
                assert m.streams[s].t == step[s] == fake.streams[s].t
            send(ids)
            await check(1)
    run(main())


def test_mux_a_stream_given_away_is_reattached_and_its_refused_frames_replayed():
    ids = ["g", "a", "b", "c", "d"]
    xs = {sid: inputs(20, 20 + i) for i, sid in enumerate(ids)}
    ys = {sid: straight(v) for sid, v in xs.items()}

    async def main():
        fake = await Fake(max_frame=frame_bytes(3, 4 * I)).start()
        async with await MuxClient.connect(fake.url, resume=5) as m:
            await m.open(ids, new=True)
            for k in range(3):
                await m.step(ids, np.stack([xs[s][k] for s in ids]))
            conn = next(iter(fake.conns))
            for k in range(3, 10):                     # frames (g, a, b) and (c, d) in flight
                m.send(ids, np.stack([xs[s][k] for s in ids]))
            conn.give_away("g")
            got = [await m.recv() for _ in range(7)]
            for k, y in zip(range(3, 10), got):
                assert [r.tobytes() for r in y] == [ys[s][k] for s in ids]
            assert m.streams["g"].index is not None and not m.gone and fake.refused >= 7
            for k in range(10, 12):
                y = await m.step(ids, np.stack([xs[s][k] for s in ids]))
                assert [r.tobytes() for r in y] == [ys[s][k] for s in ids]
    run(main())


def test_mux_a_stream_given_away_for_good_leaves_for_gone(monkeypatch):
    monkeypatch.setattr(mux, "GONE_RETRY", 0.3)
    xs = inputs(8, 50)

    async def main():
        fake = await Fake().start()
        async with await MuxClient.connect(fake.url, resume=5) as m:
            await m.open(["g", "n"], new=True)
            next(iter(fake.conns)).give_away("g")
            del fake.streams["g"]                      # it lives on another server now
            m.send(["g", "n"], xs[:2])
            with pytest.raises(FrameRefused) as e:
                await m.recv()
            assert e.value.stream == "g" and e.value.code == 4404
            assert list(m.gone) == ["g"] and list(m.streams) == ["n"]
            y = await m.step(["n"], xs[2:3])           # n's step of the refused frame ran
            assert y.tobytes() == straight([xs[1], xs[2]])[1]
    run(main())


def test_mux_steps_that_ran_out_of_order_raise_replay_error():
    xs = inputs(10, 30)

    async def main():
        fake = await Fake().start()
        m = await MuxClient.connect(fake.url, resume=5)
        await m.open(["g", "n"], new=True)
        conn = next(iter(fake.conns))
        conn.give_away("g")
        m.send(["g", "n"], xs[:2])                     # refused: n's step 0 did not run
        m.send(["n"], xs[2:3])                         # ... and its next step runs
        with pytest.raises(ReplayError, match="ran before it") as e:
            await m.recv()
        assert e.value.stream == "n"
        with pytest.raises(ReplayError):
            await m.recv()
    run(main())


def test_mux_a_stream_that_stays_refused_leaves_for_gone():
    xs = inputs(6, 40)

    async def main():
        fake = await Fake().start()
        async with await MuxClient.connect(fake.url, resume=0.3) as m:
            await m.open(["p", "q"], new=True)
            await m.step(["p", "q"], xs[:2])
            fake.checkpoint()
            fake.refuse = [4403]                       # p's token is refused
            await fake.kill()
            m.send(["p", "q"], xs[2:4])
            with pytest.raises(FrameRefused) as e:
                await m.recv()
            assert e.value.stream == "p" and e.value.code == 4403
            assert "p" in m.gone and list(m.streams) == ["q"]
            y = await m.step(["q"], xs[4:5])
            assert y.tobytes() == straight([xs[1], xs[3], xs[4]])[2]
    run(main())
