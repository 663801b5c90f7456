"""fastln.rnn.StreamBatcher: batches of single steps over a StreamTable.

Every result equals, bit for bit, the stream run alone through model.step;
batches hold at most one step per stream, at most max_batch steps, and run
oldest first; max_delay, run_when_all_waiting, the queue bounds, unknown,
closed and evicted streams, cancellation, aclose and the metrics behave as
documented. No test asserts a duration: the timing-dependent ones assert
orders and counts only.
"""
import asyncio
import random
import threading
import time

import numpy as np
import pytest

from fastln import rnn
from fastln.rnn import (
    LNLSTM,
    OverloadedError,
    StreamBatcher,
    StreamTable,
    UnknownStreamError,
)
from fastln.rnn._batcher.stats import TIME_BUCKETS, Histogram

I, H = 5, 7


@pytest.fixture(autouse=True, params=[0.0, 0.002], ids=["no_delay", "delay"])
def default_delay(request, monkeypatch):
    """Every test runs twice: with the batcher's default max_delay of 0, and
    with a 2 ms delay wherever a test does not set max_delay itself (a delay
    changes when batches form, never what they compute)."""
    monkeypatch.setitem(StreamBatcher.__init__.__kwdefaults__, "max_delay", request.param)
    return request.param


class RecordingTable(StreamTable):
    """A StreamTable that records the ids of every step (and can hold each
    step on an event, or close streams as the step starts)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.calls = []
        self.gate = None          # a threading.Event each step waits on
        self.entered = threading.Event()
        self.close_at = {}        # {call index: ids to close as that step starts}

    def step(self, ids, x, out=None):
        ids = list(ids)
        self.calls.append(ids)
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        for sid in self.close_at.pop(len(self.calls) - 1, []):
            self.close(sid)
        return super().step(ids, x, out)


def alone(model, xs):
    """The outputs of one stream's inputs xs (T, I) run alone with model.step."""
    state, ys = None, []
    for x in xs:
        y, state = model.step(x[None], state)
        ys.append(y[0])
    return ys


def inputs(n, T, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal((n, T, I)).astype(dtype)


async def run_streams(batcher, ids, xs, jitter=None):
    """Each stream steps through its inputs, one await at a time; returns
    each stream's list of outputs."""
    async def client(k, sid):
        out = []
        for x in xs[k]:
            if jitter is not None and jitter.random() < 0.3:
                await asyncio.sleep(0 if jitter.random() < 0.5 else 1e-4)
            out.append((await batcher.step(sid, x)).copy())
        return out
    return await asyncio.gather(*(client(k, sid) for k, sid in enumerate(ids)))


def check_calls(calls, max_batch):
    for ids in calls:
        assert len(ids) == len(set(ids)), ids      # at most one step per stream
        assert 1 <= len(ids) <= max_batch


# ---- results --------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_results_are_those_of_each_stream_alone(dtype):
    model = LNLSTM(I, H, num_layers=2, seed=0)
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
        model = model.to("bfloat16")
    n, T = 12, 9
    xs = inputs(n, T)
    if dtype == "bfloat16":
        xs = xs.astype(model.dtype)
    table = RecordingTable(model, 16)
    ids = [table.open() for _ in range(n)]

    async def main():
        async with StreamBatcher(table, max_batch=5) as b:
            return await run_streams(b, ids, xs, random.Random(1))
    got = asyncio.run(main())
    for k in range(n):
        want = alone(model, xs[k])
        assert len(got[k]) == T
        for t in range(T):
            assert got[k][t].dtype == model.dtype
            assert got[k][t].tobytes() == want[t].tobytes(), (k, t)
    check_calls(table.calls, 5)
    assert max(map(len, table.calls)) > 1      # steps were batched


def test_a_bfloat16_model_takes_float32_rows_too():
    pytest.importorskip("ml_dtypes")
    model = LNLSTM(I, H, seed=0).to("bfloat16")
    xs = inputs(3, 4)
    table = StreamTable(model, 4)
    ids = [table.open() for _ in range(3)]
    mixed = [xs[0], xs[1].astype(model.dtype), xs[2]]

    async def main():
        async with StreamBatcher(table) as b:
            return await run_streams(b, ids, mixed)
    got = asyncio.run(main())
    for k in range(3):
        want = alone(model, mixed[k])
        assert [g.tobytes() for g in got[k]] == [w.tobytes() for w in want]


@pytest.mark.parametrize("cls", ["LNLSTM", "LNGRU", "LNRNN", "LSTM", "GRU", "RNN"])
def test_every_model(cls):
    model = getattr(rnn, cls)(I, H, num_layers=2, seed=0)
    xs = inputs(4, 5, seed=2)
    table = StreamTable(model, 4)
    ids = [table.open() for _ in range(4)]

    async def main():
        async with StreamBatcher(table) as b:
            return await run_streams(b, ids, xs)
    got = asyncio.run(main())
    for k in range(4):
        assert [g.tobytes() for g in got[k]] == [w.tobytes() for w in alone(model, xs[k])]


def test_many_streams_many_steps():
    model = LNLSTM(I, H, seed=3)
    n, T = 256, 12
    xs = inputs(n, T, seed=3)
    table = RecordingTable(model, n)
    ids = [table.open() for _ in range(n)]

    async def main():
        async with StreamBatcher(table) as b:
            out = await run_streams(b, ids, xs, random.Random(3))
            return out, b.metrics()
    got, m = asyncio.run(main())
    check_calls(table.calls, n)
    assert m["steps"] == n * T and m["batches"] == len(table.calls)
    assert m["batch_max"] > 1 and m["failed"] == 0
    # the batch gives each stream's rows as a whole: spot-check against B = 1
    for k in (0, 17, 255):
        assert [g.tobytes() for g in got[k]] == [w.tobytes() for w in alone(model, xs[k])]
    # every stream ran T steps, in order: its rows match a B = n run of all
    state, batch = None, []
    for t in range(T):
        y, state = model.step(np.ascontiguousarray(xs[:, t]), state)
        batch.append(y)
    for k in range(n):
        for t in range(T):
            assert got[k][t].tobytes() == batch[t][k].tobytes()


def test_order_within_a_stream_under_concurrent_submissions():
    """Steps of one stream submitted at once (not awaited one by one) run in
    their arrival order, one per batch."""
    model = LNLSTM(I, H, seed=4)
    xs = inputs(6, 4, seed=4)
    table = RecordingTable(model, 8)
    ids = [table.open() for _ in range(6)]

    async def main():
        async with StreamBatcher(table, max_queue_per_stream=4) as b:
            futs = [[asyncio.ensure_future(b.step(sid, x)) for x in xs[k]]
                    for k, sid in enumerate(ids)]
            return [[(await f).copy() for f in fs] for fs in futs]
    got = asyncio.run(main())
    for k in range(6):
        assert [g.tobytes() for g in got[k]] == [w.tobytes() for w in alone(model, xs[k])]
    check_calls(table.calls, 8)
    assert len(table.calls) >= 4


# ---- batch formation -------------------------------------------------------

def test_max_batch_and_oldest_first():
    table = RecordingTable(LNLSTM(I, H, seed=0), 8)
    ids = [table.open() for _ in range(6)]
    x = np.ones(I, np.float32)
    table.gate = threading.Event()

    async def main():
        async with StreamBatcher(table, max_batch=2) as b:
            first = asyncio.ensure_future(b.step(ids[5], x))
            while not table.entered.is_set():     # the first batch runs and holds
                await asyncio.sleep(0.001)
            # while it runs: ids[0] twice, then 1, 2, 3, 4
            rest = [asyncio.ensure_future(b.step(ids[0], x))]
            await asyncio.sleep(0)
            rest.append(asyncio.ensure_future(b.step(ids[0], x)))
            for sid in ids[1:5]:
                await asyncio.sleep(0)
                rest.append(asyncio.ensure_future(b.step(sid, x)))
            await asyncio.sleep(0)
            table.gate.set()
            await asyncio.gather(first, *rest)
    asyncio.run(main())
    a, b1, b2, b3, b4, b5 = ids
    # ids[0]'s second step arrived before ids[2..4]'s: it runs in the second batch after
    # the first one, the others by arrival
    assert table.calls == [[b5], [a, b1], [a, b2], [b3, b4]]


def test_max_delay_waits_for_more_steps():
    table = RecordingTable(LNLSTM(I, H, seed=0), 4)
    ids = [table.open() for _ in range(3)]
    x = np.ones(I, np.float32)

    async def main():
        async with StreamBatcher(table, max_delay=30.0, max_batch=2) as b:
            f0 = asyncio.ensure_future(b.step(ids[0], x))
            for _ in range(20):                   # the worker waits: nothing runs
                await asyncio.sleep(0)
            assert table.calls == []
            f1 = asyncio.ensure_future(b.step(ids[1], x))   # max_batch reached: it runs
            await asyncio.gather(f0, f1)
    asyncio.run(main())
    assert table.calls == [[ids[0], ids[1]]]


def test_max_delay_runs_a_partial_batch_at_the_deadline():
    table = RecordingTable(LNLSTM(I, H, seed=0), 4)
    ids = [table.open() for _ in range(3)]
    x = np.ones(I, np.float32)

    async def main():
        async with StreamBatcher(table, max_delay=0.02) as b:
            await b.step(ids[0], x)               # returns once the delay has passed
            y1, y2 = await asyncio.gather(b.step(ids[1], x), b.step(ids[2], x))
            return b.metrics()
    m = asyncio.run(main())
    assert table.calls == [[ids[0]], [ids[1], ids[2]]]
    assert m["batch_sizes"] == {1: 1, 2: 1}


@pytest.mark.parametrize("all_waiting", [True, False])
def test_run_when_all_waiting(all_waiting):
    table = RecordingTable(LNLSTM(I, H, seed=0), 8)
    ids = [table.open() for _ in range(3)]
    x = np.ones(I, np.float32)

    async def main():
        async with StreamBatcher(table, max_delay=30.0,
                                 run_when_all_waiting=all_waiting) as b:
            futs = [asyncio.ensure_future(b.step(sid, x)) for sid in ids]
            for _ in range(20):
                await asyncio.sleep(0)
            ran = list(table.calls)
            if not all_waiting:                     # still waiting for the delay
                for f in futs:
                    f.cancel()
            await asyncio.gather(*futs, return_exceptions=True)
            return ran
    ran = asyncio.run(main())
    assert ran == ([ids] if all_waiting else [])


def test_continuous_batching_fills_the_next_batch_while_one_runs():
    table = RecordingTable(LNLSTM(I, H, seed=0), 8)
    ids = [table.open() for _ in range(5)]
    x = np.ones(I, np.float32)
    table.gate = threading.Event()

    async def main():
        async with StreamBatcher(table) as b:
            first = asyncio.ensure_future(b.step(ids[0], x))
            while not table.entered.is_set():
                await asyncio.sleep(0.001)
            rest = [asyncio.ensure_future(b.step(sid, x)) for sid in ids]
            await asyncio.sleep(0)
            table.gate.set()
            await asyncio.gather(first, *rest)
    asyncio.run(main())
    assert table.calls == [[ids[0]], ids]


# ---- limits and errors -----------------------------------------------------

def test_queue_bounds_raise_overloaded():
    table = RecordingTable(LNLSTM(I, H, seed=0), 8)
    ids = [table.open() for _ in range(4)]
    x = np.ones(I, np.float32)
    table.gate = threading.Event()

    async def main():
        async with StreamBatcher(table, max_queue_per_stream=2, max_pending=5) as b:
            first = asyncio.ensure_future(b.step(ids[3], x))
            while not table.entered.is_set():
                await asyncio.sleep(0.001)
            ok = [asyncio.ensure_future(b.step(ids[0], x)) for _ in range(2)]
            await asyncio.sleep(0)
            with pytest.raises(OverloadedError, match="limit"):
                await b.step(ids[0], x)             # a third waiting step of one stream
            ok += [asyncio.ensure_future(b.step(ids[1], x)) for _ in range(2)]
            ok.append(asyncio.ensure_future(b.step(ids[2], x)))
            await asyncio.sleep(0)
            with pytest.raises(OverloadedError, match="max_pending"):
                await b.step(ids[2], x)             # a sixth waiting step over all
            m = b.metrics()
            table.gate.set()
            await asyncio.gather(first, *ok)
            return m, b.metrics()
    waiting, done = asyncio.run(main())
    assert issubclass(OverloadedError, RuntimeError)
    assert waiting["rejected"] == 2 and waiting["pending"] == 5
    assert done["rejected"] == 2 and done["pending"] == 0 and done["steps"] == 6


def test_unknown_stream_and_bad_x():
    table = StreamTable(LNLSTM(I, H, seed=0), 4)
    sid = table.open()

    async def main():
        async with StreamBatcher(table) as b:
            with pytest.raises(UnknownStreamError, match="nope"):
                await b.step("nope", np.ones(I, np.float32))
            with pytest.raises(ValueError, match="shape"):
                await b.step(sid, np.ones(I + 1, np.float32))
            with pytest.raises(TypeError, match="dtype"):
                await b.step(sid, np.ones(I, np.float64))
            y = await b.step(sid, [0.5] * I)        # a list converts
            return y, b.metrics()
    y, m = asyncio.run(main())
    assert y.shape == (H,) and m["steps"] == 1 and m["pending"] == 0
    with pytest.raises(TypeError):
        StreamBatcher(object())
    with pytest.raises(ValueError):
        StreamBatcher(table, max_delay=-1)
    with pytest.raises(ValueError):
        StreamBatcher(table, max_batch=0)
    with pytest.raises(TypeError, match="run_when_all_waiting"):
        StreamBatcher(table, run_when_all_waiting=1)


def test_stream_closed_while_waiting():
    table = RecordingTable(LNLSTM(I, H, seed=0), 8)
    ids = [table.open() for _ in range(4)]
    x = np.ones(I, np.float32)
    table.gate = threading.Event()

    async def main():
        async with StreamBatcher(table) as b:
            first = asyncio.ensure_future(b.step(ids[3], x))
            while not table.entered.is_set():
                await asyncio.sleep(0.001)
            futs = [asyncio.ensure_future(b.step(sid, x)) for sid in ids[:3]]
            await asyncio.sleep(0)
            table.close(ids[1])                     # before its batch forms
            table.close_at[1] = [ids[2]]            # as its batch runs
            table.gate.set()
            await first
            res = await asyncio.gather(*futs, return_exceptions=True)
            return res, b.metrics()
    res, m = asyncio.run(main())
    assert isinstance(res[0], np.ndarray)
    assert isinstance(res[1], UnknownStreamError) and isinstance(res[2], UnknownStreamError)
    assert table.calls[1] == [ids[0], ids[2]] and table.calls[2] == [ids[0]]
    assert m["failed"] == 2 and m["steps"] == 2


def test_eviction_while_waiting():
    now = [0.0]
    evicted = []
    table = RecordingTable(LNLSTM(I, H, seed=0), 8, idle_timeout=10.0,
                           on_evict=lambda sid, st: evicted.append(sid), clock=lambda: now[0])
    a, b_ = table.open(), table.open()             # both at 0
    x = np.ones(I, np.float32)

    async def main():
        async with StreamBatcher(table) as b:
            now[0] = 5.0
            await b.step(a, x)                      # a's last step: 5
            table.entered.clear()
            table.gate = threading.Event()
            first = asyncio.ensure_future(b.step(a, x))
            while not table.entered.is_set():
                await asyncio.sleep(0.001)
            futs = [asyncio.ensure_future(b.step(s, x)) for s in (a, b_)]
            await asyncio.sleep(0)
            # at 10.5 the held step's idle sweep evicts b (idle since 0), not a
            now[0] = 10.5
            table.gate.set()
            await first
            res = await asyncio.gather(*futs, return_exceptions=True)
            return res, b.metrics()
    res, m = asyncio.run(main())
    assert evicted == [b_]
    assert isinstance(res[0], np.ndarray) and isinstance(res[1], UnknownStreamError)
    assert m["evicted_streams"] == 1 and m["active_streams"] == 1 and m["failed"] == 1


def test_cancellation():
    model = LNLSTM(I, H, seed=5)
    table = RecordingTable(model, 8)
    ids = [table.open() for _ in range(3)]
    xs = inputs(3, 3, seed=5)
    table.gate = threading.Event()

    async def main():
        async with StreamBatcher(table) as b:
            running = asyncio.ensure_future(b.step(ids[0], xs[0, 0]))
            while not table.entered.is_set():
                await asyncio.sleep(0.001)
            waiting = asyncio.ensure_future(b.step(ids[1], xs[1, 0]))
            other = asyncio.ensure_future(b.step(ids[2], xs[2, 0]))
            await asyncio.sleep(0)
            running.cancel()                         # in the running batch: result dropped
            waiting.cancel()                         # not started: removed
            await asyncio.sleep(0)
            m = b.metrics()
            table.gate.set()
            y2 = await other
            with pytest.raises(asyncio.CancelledError):
                await running
            # the batcher still works, and the states are as expected
            y0 = await b.step(ids[0], xs[0, 1])
            y1 = await b.step(ids[1], xs[1, 1])
            return m, y0, y1, y2, b.metrics()
    m, y0, y1, y2, m2 = asyncio.run(main())
    assert m["cancelled"] == 1 and m["pending"] == 1
    assert table.calls[1] == [ids[2]]
    assert y2.tobytes() == alone(model, xs[2, :1])[0].tobytes()
    # ids[0] advanced through its cancelled step; ids[1] did not
    assert y0.tobytes() == alone(model, xs[0, :2])[1].tobytes()
    assert y1.tobytes() == alone(model, xs[1, 1:2])[0].tobytes()
    assert m2["cancelled"] == 1 and m2["pending"] == 0


def test_aclose_with_waiting_steps():
    table = RecordingTable(LNLSTM(I, H, seed=0), 4)
    ids = [table.open() for _ in range(2)]
    x = np.ones(I, np.float32)
    table.gate = threading.Event()

    async def main():
        b = StreamBatcher(table)
        running = asyncio.ensure_future(b.step(ids[0], x))
        while not table.entered.is_set():
            await asyncio.sleep(0.001)
        waiting = asyncio.ensure_future(b.step(ids[1], x))
        await asyncio.sleep(0)
        closing = asyncio.ensure_future(b.aclose())
        await asyncio.sleep(0.01)
        table.gate.set()
        await closing
        res = await asyncio.gather(running, waiting, return_exceptions=True)
        with pytest.raises(RuntimeError, match="batcher closed"):
            await b.step(ids[0], x)
        await b.aclose()                            # twice is harmless
        return res, b.metrics()
    res, m = asyncio.run(main())
    assert isinstance(res[0], np.ndarray)            # the running batch finished
    assert isinstance(res[1], RuntimeError) and "batcher closed" in str(res[1])
    assert table.calls == [[ids[0]]] and m["pending"] == 0


def test_closing_an_unused_batcher_and_an_executor_of_ones_own():
    import concurrent.futures
    table = StreamTable(LNLSTM(I, H, seed=0), 2)
    sid = table.open()
    asyncio.run(StreamBatcher(table).aclose())
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        async def main():
            async with StreamBatcher(table, executor=ex) as b:
                return await b.step(sid, np.ones(I, np.float32))
        assert asyncio.run(main()).shape == (H,)
        assert ex.submit(lambda: 1).result() == 1     # left running


def test_metrics():
    table = StreamTable(LNLSTM(I, H, seed=0), 8)
    ids = [table.open() for _ in range(4)]
    xs = inputs(4, 3)

    async def main():
        async with StreamBatcher(table) as b:
            before = b.metrics()
            await run_streams(b, ids, xs)
            return before, b.metrics()
    before, m = asyncio.run(main())
    empty = {"le": list(TIME_BUCKETS), "counts": [0] * (len(TIME_BUCKETS) + 1), "sum": 0.0}
    assert before == {"batches": 0, "steps": 0, "batch_mean": 0.0, "batch_max": 0,
                      "batch_sizes": {}, "queue_delay_p50": None, "queue_delay_p99": None,
                      "queue_delay_histogram": empty, "latency_histogram": empty,
                      "pending": 0, "rejected": 0, "failed": 0, "cancelled": 0,
                      "active_streams": 4, "evicted_streams": 0}
    assert m["steps"] == 12 and sum(m["batch_sizes"].values()) == m["batches"]
    assert sum(s * c for s, c in m["batch_sizes"].items()) == 12
    assert m["batch_mean"] == 12 / m["batches"] and m["batch_max"] == max(m["batch_sizes"])
    assert 0 <= m["queue_delay_p50"] <= m["queue_delay_p99"]
    delay, latency = m["queue_delay_histogram"], m["latency_histogram"]
    assert sum(delay["counts"]) == sum(latency["counts"]) == 12
    assert 0 <= delay["sum"] <= latency["sum"]
    # a step's latency is at least its delay: the cumulative counts never run ahead
    assert all(a >= b for a, b in zip(np.cumsum(delay["counts"]), np.cumsum(latency["counts"])))


def test_histogram_buckets_hold_their_upper_bound():
    h = Histogram()
    h.add(np.array([0.0, TIME_BUCKETS[0], np.nextafter(TIME_BUCKETS[0], 1), TIME_BUCKETS[-1],
                    TIME_BUCKETS[-1] * 2]))
    counts = h.as_dict()["counts"]
    assert counts[0] == 2 and counts[1] == 1 and counts[-2] == 1 and counts[-1] == 1
    assert sum(counts) == 5


def test_a_failing_batch_fails_its_steps_only():
    """An error of the table step other than an unknown stream goes to every
    step of that batch; the batcher goes on."""
    class Failing(RecordingTable):
        def step(self, ids, x, out=None):
            if len(self.calls) == 0:
                self.calls.append(list(ids))
                raise MemoryError("no room")
            return super().step(ids, x, out)
    table = Failing(LNLSTM(I, H, seed=0), 4)
    ids = [table.open() for _ in range(2)]
    x = np.ones(I, np.float32)

    async def main():
        async with StreamBatcher(table) as b:
            first = await asyncio.gather(*(b.step(s, x) for s in ids), return_exceptions=True)
            second = await asyncio.gather(*(b.step(s, x) for s in ids))
            return first, second, b.metrics()
    first, second, m = asyncio.run(main())
    assert all(isinstance(r, MemoryError) for r in first)
    assert all(r.shape == (H,) for r in second)
    assert m["failed"] == 2 and m["steps"] == 2


# ---- submit ---------------------------------------------------------------

def test_submit_answers_in_callbacks_in_order():
    """submit() queues without awaiting; the futures' callbacks run in each
    stream's submission order, results bitwise those of each stream alone,
    and an overload raises at the call."""
    model = LNLSTM(I, H, seed=11)
    table = StreamTable(model, 8)
    ids = [table.open() for _ in range(3)]
    xs = inputs(3, 4, seed=11)

    async def main():
        async with StreamBatcher(table, max_queue_per_stream=4) as b:
            got = {sid: [] for sid in ids}
            futs = []
            for t in range(4):
                for k, sid in enumerate(ids):
                    f = b.submit(sid, xs[k, t])
                    f.add_done_callback(lambda f, sid=sid: got[sid].append(f.result().copy()))
                    futs.append(f)
            with pytest.raises(OverloadedError, match="max_queue_per_stream"):
                b.submit(ids[0], xs[0, 0])
            await asyncio.gather(*futs)
            await asyncio.sleep(0)                   # the last callbacks run
            return got, b.metrics()
    got, m = asyncio.run(main())
    for k, sid in enumerate(ids):
        want = alone(model, xs[k])
        assert [y.tobytes() for y in got[sid]] == [y.tobytes() for y in want]
    assert m["steps"] == 12 and m["rejected"] == 1 and m["pending"] == 0


def test_submit_cancelled_before_its_batch_is_skipped():
    model = LNLSTM(I, H, seed=12)
    table = RecordingTable(model, 8)
    a, b_ = table.open(), table.open()
    xs = inputs(2, 2, seed=12)
    table.gate = threading.Event()

    async def main():
        async with StreamBatcher(table) as b:
            first = b.submit(a, xs[0, 0])            # runs, held at the gate
            while not table.entered.is_set():
                await asyncio.sleep(0.001)
            dropped = b.submit(b_, xs[1, 0])         # waits, then is cancelled
            kept = b.submit(a, xs[0, 1])
            dropped.cancel()
            table.gate.set()
            y0, y1 = await first, await kept
            y_b = await b.step(b_, xs[1, 1])
            return y0, y1, y_b, b.metrics()
    y0, y1, y_b, m = asyncio.run(main())
    assert table.calls[1] == [a]                     # the cancelled step is not in the batch
    assert [y0.tobytes(), y1.tobytes()] == [y.tobytes() for y in alone(model, xs[0])]
    assert y_b.tobytes() == alone(model, xs[1, 1:])[0].tobytes()   # b_ did not advance
    assert m["cancelled"] == 1 and m["pending"] == 0


def test_submit_errors():
    table = StreamTable(LNLSTM(I, H, seed=0), 2)
    sid = table.open()
    b = StreamBatcher(table)
    with pytest.raises(RuntimeError, match="no running event loop"):
        b.submit(sid, np.ones(I, np.float32))
    assert b.metrics()["pending"] == 0 and not b._queues.waiting

    async def main():
        with pytest.raises(UnknownStreamError):
            b.submit("nope", np.ones(I, np.float32))
        with pytest.raises(ValueError, match="shape"):
            b.submit(sid, np.ones(I + 1, np.float32))
        await b.aclose()
        with pytest.raises(RuntimeError, match="closed"):
            b.submit(sid, np.ones(I, np.float32))
    asyncio.run(main())


def test_submit_with_callbacks():
    """Callbacks run in each stream's submission order with results bitwise
    those of each stream alone; a stream closed while its step waits, and a
    close of the batcher, reach the callback as errors; a callback that
    raises is reported to the loop and the batcher goes on."""
    model = LNLSTM(I, H, seed=13)
    table = RecordingTable(model, 8)
    ids = [table.open() for _ in range(3)]
    xs = inputs(3, 3, seed=13)
    table.gate = threading.Event()

    async def main():
        loop = asyncio.get_running_loop()
        reported = []
        loop.set_exception_handler(lambda loop, context: reported.append(context))
        got = {sid: [] for sid in ids}

        def answer(sid):
            return lambda y, error: got[sid].append(
                y.copy() if error is None else type(error).__name__)

        async with StreamBatcher(table) as b:
            assert b.submit(ids[0], xs[0, 0], answer(ids[0])) is None   # runs, held
            while not table.entered.is_set():
                await asyncio.sleep(0.001)
            for t in range(1, 3):
                b.submit(ids[0], xs[0, t], answer(ids[0]))
            for t in range(3):
                b.submit(ids[1], xs[1, t], answer(ids[1]))
            b.submit(ids[2], xs[2, 0], answer(ids[2]))
            b.submit(ids[2], xs[2, 1], lambda y, error: 1 / 0)
            table.close(ids[2])                      # its waiting steps fail
            table.gate.set()
            while len(got[ids[0]]) < 3 or len(got[ids[1]]) < 3:
                await asyncio.sleep(0.001)
            table.gate = threading.Event()           # the next batch is held ...
            table.entered.clear()
            b.submit(ids[1], xs[1, 0], answer(ids[1]))
            while not table.entered.is_set():
                await asyncio.sleep(0.001)
            b.submit(ids[0], xs[0, 0], answer(ids[0]))   # ... and this one waits
            closing = asyncio.ensure_future(b.aclose())
            await asyncio.sleep(0.01)
            table.gate.set()
            await closing
        return got, reported
    got, reported = asyncio.run(main())
    for k in range(2):
        want = [y.tobytes() for y in alone(model, xs[k])]
        assert [y.tobytes() for y in got[ids[k]][:3]] == want
    assert got[ids[2]] == ["UnknownStreamError"]
    assert got[ids[0]][3] == "RuntimeError"          # waiting when the batcher closed
    assert len(got[ids[1]]) == 4                     # ran in the held batch
    assert [type(c["exception"]) for c in reported] == [ZeroDivisionError]
    assert reported[0]["message"] == "a StreamBatcher.submit callback raised"


# ---- a batching delay, a busy event loop -----------------------------------

def _loops():
    """The event loops a server runs on: asyncio's, and uvloop's where installed."""
    loops = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        import uvloop
    except ImportError:
        pass
    else:
        loops.append(pytest.param(uvloop.new_event_loop, id="uvloop"))
    return loops


LOOPS = _loops()


@pytest.mark.parametrize("new_loop", LOOPS)
@pytest.mark.parametrize("yields", range(6))
def test_a_step_submitted_as_the_delay_runs_out(new_loop, yields):
    """The loop is blocked past the oldest step's deadline, then runs a few
    callbacks (the batcher's timer among them), then a step arrives: it is
    queued once and answered, whichever callbacks ran before it."""
    model = LNLSTM(I, H, seed=21)
    table = RecordingTable(model, 4)
    a, b_ = table.open(), table.open()
    xs = inputs(2, 1, seed=21)

    async def main():
        async with StreamBatcher(table, max_delay=0.01, max_batch=2) as b:
            fa = b.submit(a, xs[0, 0])
            for _ in range(4):
                await asyncio.sleep(0)          # the worker sleeps on the deadline
            time.sleep(0.02)                    # the loop is busy past it
            for _ in range(yields):
                await asyncio.sleep(0)
            fb = b.submit(b_, xs[1, 0])         # must not raise
            return await fa, await fb, b.metrics()
    loop = new_loop()
    try:
        ya, yb, m = loop.run_until_complete(main())
    finally:
        loop.close()
    assert ya.tobytes() == alone(model, xs[0])[0].tobytes()
    assert yb.tobytes() == alone(model, xs[1])[0].tobytes()
    assert m["steps"] == 2 and m["failed"] == 0 and m["pending"] == 0
    assert sorted(map(len, table.calls)) in ([2], [1, 1])


@pytest.mark.parametrize("new_loop", LOOPS)
@pytest.mark.parametrize("max_delay", [1e-4, 1e-3, 5e-3])
def test_random_load_on_a_busy_loop_with_a_delay(new_loop, max_delay):
    """Steps of 16 streams submitted at random moments, in callbacks and as
    futures, while the event loop is blocked now and then for about the
    delay: no submit raises, every step is answered once, in order, bitwise
    as the stream alone."""
    model = LNLSTM(I, H, seed=22)
    n, T = 16, 25
    xs = inputs(n, T, seed=22)
    table = RecordingTable(model, n)
    ids = [table.open() for _ in range(n)]
    rng = random.Random(22)

    async def main():
        got = {sid: [] for sid in ids}
        async with StreamBatcher(table, max_delay=max_delay, max_batch=4,
                                 max_queue_per_stream=T, max_pending=n * T) as b:
            futs = []
            order = [k for k in range(n) for _ in range(T)]
            rng.shuffle(order)
            sent = [0] * n
            for k in order:
                sid, t = ids[k], sent[k]
                sent[k] += 1
                if rng.random() < 0.5:
                    b.submit(sid, xs[k, t], lambda y, e, sid=sid: got[sid].append(
                        y.copy() if e is None else e))
                else:
                    futs.append((sid, t, b.submit(sid, xs[k, t])))
                r = rng.random()
                if r < 0.1:
                    time.sleep(max_delay * rng.uniform(0.5, 2))
                elif r < 0.4:
                    await asyncio.sleep(0)
                elif r < 0.5:
                    await asyncio.sleep(max_delay * rng.random())
            for sid, t, f in futs:
                got[sid].append((t, (await f).copy()))
            while sum(map(len, got.values())) < n * T:
                await asyncio.sleep(0.001)
            return got, b.metrics()
    loop = new_loop()
    try:
        got, m = loop.run_until_complete(main())
    finally:
        loop.close()
    assert m["steps"] == n * T and m["failed"] == 0 and m["pending"] == 0
    check_calls(table.calls, 4)
    for k, sid in enumerate(ids):
        # futures' results carry their index; callbacks arrive in order
        by_future = dict(g for g in got[sid] if isinstance(g, tuple))
        in_order = iter(g for g in got[sid] if not isinstance(g, tuple))
        want = alone(model, xs[k])
        for t in range(T):
            y = by_future[t] if t in by_future else next(in_order)
            assert isinstance(y, np.ndarray), y
            assert y.tobytes() == want[t].tobytes(), (k, t)


def test_cancelled_submit_futures_leave_the_queues():
    """Futures of submit() cancelled while they wait neither count against
    max_queue_per_stream or max_pending nor show in the metrics."""
    model = LNLSTM(I, H, seed=23)
    table = RecordingTable(model, 8)
    a, c, d = table.open(), table.open(), table.open()
    xs = inputs(3, 4, seed=23)
    table.gate = threading.Event()

    async def main():
        async with StreamBatcher(table, max_queue_per_stream=2, max_pending=3) as b:
            first = b.submit(d, xs[2, 0])              # runs, held at the gate
            while not table.entered.is_set():
                await asyncio.sleep(0.001)
            gone = [b.submit(a, xs[0, 0]), b.submit(a, xs[0, 1])]
            for f in gone:
                f.cancel()
            m = b.metrics()
            kept = [b.submit(a, xs[0, 0]), b.submit(a, xs[0, 1])]   # the per-stream limit
            late = b.submit(c, xs[1, 0])
            late.cancel()
            kept.append(b.submit(c, xs[1, 0]))                      # the limit over all
            with pytest.raises(OverloadedError, match="max_pending"):
                b.submit(c, xs[1, 1])
            table.gate.set()
            ys = [await f for f in kept]
            await first
            return m, ys, b.metrics()
    m, ys, done = asyncio.run(main())
    assert m["pending"] == 0 and m["cancelled"] == 2
    want_a = alone(model, xs[0])
    assert [y.tobytes() for y in ys[:2]] == [w.tobytes() for w in want_a[:2]]
    assert ys[2].tobytes() == alone(model, xs[1])[0].tobytes()
    assert done["cancelled"] == 3 and done["pending"] == 0 and done["steps"] == 4
    assert done["rejected"] == 1


# ---- blocks: submit_block ---------------------------------------------------

class XRecordingTable(RecordingTable):
    """A RecordingTable that keeps the x array of every step too."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.xs = []

    def step(self, ids, x, out=None):
        self.xs.append(x)
        return super().step(ids, x, out)


def block_of(xs, ks, t):
    """The block of streams ks at step t: (len(ks), I), C-contiguous."""
    return np.ascontiguousarray(xs[ks, t])


def test_blocks_match_each_stream_alone_and_keep_order_with_single_steps():
    """Blocks that share streams, and single steps of the same streams in
    between, run in submission order per stream, one step per stream per
    batch, with results bitwise those of each stream alone."""
    model = LNLSTM(I, H, seed=30)
    table = RecordingTable(model, 8)
    ids = [table.open() for _ in range(5)]
    xs = inputs(5, 6, seed=30)
    table.gate = threading.Event()

    async def main():
        got = {sid: [] for sid in ids}
        order = []

        def answer_block(ks):
            def answer(y, error):
                assert error is None
                order.append(tuple(ks))
                for row, k in zip(y, ks):
                    got[ids[k]].append(row.copy())
            return answer

        def answer_one(k):
            return lambda y, error: got[ids[k]].append(y.copy())

        async with StreamBatcher(table) as b:
            b.submit(ids[4], xs[4, 0], answer_one(4))      # runs, held at the gate
            while not table.entered.is_set():
                await asyncio.sleep(0.001)
            t = [0, 0, 0, 0, 1]                            # each stream's next step

            def block(ks):
                b.submit_block([ids[k] for k in ks], block_of(xs, ks, [t[k] for k in ks]),
                               answer_block(ks))
                for k in ks:
                    t[k] += 1

            def one(k):
                b.submit(ids[k], xs[k, t[k]], answer_one(k))
                t[k] += 1
            block([0, 1, 2])
            one(1)
            block([1, 3])
            block([2, 4])
            one(0)
            block([0, 1, 2, 3, 4])
            one(3)
            table.gate.set()
            while any(len(got[sid]) < t[k] for k, sid in enumerate(ids)):
                await asyncio.sleep(0.001)
            return got, order, t, b.metrics()
    got, order, t, m = asyncio.run(main())
    check_calls(table.calls, 8)
    for k, sid in enumerate(ids):
        assert [y.tobytes() for y in got[sid]] == [
            w.tobytes() for w in alone(model, xs[k, :t[k]])], k
    # (1, 3) waits for stream 1's single step, which waits for (0, 1, 2):
    # (2, 4), with no older step of its streams left, runs before it
    assert order == [(0, 1, 2), (2, 4), (1, 3), (0, 1, 2, 3, 4)]
    assert m["steps"] == sum(t) and m["failed"] == m["cancelled"] == m["pending"] == 0
    assert sum(m["latency_histogram"]["counts"]) == sum(t)


def test_a_lone_block_is_the_batch_as_it_is_and_a_big_one_runs_alone():
    """A block that is the whole batch reaches the table as the caller's own
    array; one of more than max_batch steps runs as a batch of its own; the
    blocks around it keep to max_batch."""
    model = LNLSTM(I, H, seed=31)
    table = XRecordingTable(model, 8)
    ids = [table.open() for _ in range(6)]
    xs = inputs(6, 3, seed=31)
    table.gate = threading.Event()

    async def main():
        async with StreamBatcher(table, max_batch=3) as b:
            x0 = block_of(xs, [0, 1], 0)
            first = b.submit_block(ids[:2], x0)
            while not table.entered.is_set():
                await asyncio.sleep(0.001)
            big = b.submit_block(ids[:5], block_of(xs, [0, 1, 2, 3, 4], 1))
            small = b.submit_block([ids[5]], block_of(xs, [5], 0))
            table.gate.set()
            return x0, [await first, await big, await small], b.metrics()
    x0, ys, m = asyncio.run(main())
    assert table.xs[0] is x0
    assert table.calls[1] == ids[:5]
    assert len(table.calls) == 3 and m["batch_max"] == 5
    assert ys[2].tobytes() == alone(model, xs[5, :1])[0].tobytes()
    for k in range(2):
        want = alone(model, xs[k, :2])
        assert [ys[0][k].tobytes(), ys[1][k].tobytes()] == [w.tobytes() for w in want]


def test_a_bfloat16_model_takes_bfloat16_and_float32_blocks():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    model = LNLSTM(I, H, seed=32).to(ml_dtypes.bfloat16)
    table = StreamTable(model, 4)
    a, c = table.open(), table.open()
    xs = inputs(2, 2, seed=32).astype(ml_dtypes.bfloat16)

    async def main():
        async with StreamBatcher(table) as b:
            f1 = b.submit_block([a, c], block_of(xs, [0, 1], 0))
            f2 = b.submit_block([a, c], block_of(xs, [0, 1], 1).astype(np.float32))
            return await f1, await f2
    y1, y2 = asyncio.run(main())
    for k in range(2):
        want = alone(model, xs[k].astype(np.float32))
        assert [y1[k].tobytes(), y2[k].tobytes()] == [w.tobytes() for w in want]


def test_submit_block_errors():
    table = StreamTable(LNLSTM(I, H, seed=0), 8)
    a, c = table.open(), table.open()
    x2 = np.ones((2, I), np.float32)

    async def main():
        async with StreamBatcher(table, max_pending=3) as b:
            with pytest.raises(ValueError, match="at least one"):
                b.submit_block([], np.ones((0, I), np.float32))
            with pytest.raises(ValueError, match="more than once"):
                b.submit_block([a, a], x2)
            with pytest.raises(UnknownStreamError, match="'nope'"):
                b.submit_block([a, "nope"], x2)
            with pytest.raises(ValueError, match=r"\(len\(ids\), input_size\)"):
                b.submit_block([a, c], np.ones((3, I), np.float32))
            with pytest.raises(TypeError, match="dtype int64"):
                b.submit_block([a, c], np.ones((2, I), np.int64))
            ys = await b.submit_block([a, c], [[0.5] * I] * 2)      # a list converts
            fut = b.submit_block([a, c], x2)
            with pytest.raises(OverloadedError, match="max_pending"):
                b.submit_block([a, c], x2)
            await fut
            m = b.metrics()
        with pytest.raises(RuntimeError, match="closed"):
            b.submit_block([a], x2[:1])
        return ys, m
    ys, m = asyncio.run(main())
    assert ys.shape == (2, H) and m["rejected"] == 1 and m["steps"] == 4


def test_blocks_closed_cancelled_or_left_waiting():
    """A block whose stream closes while it waits fails whole (none of its
    steps runs); a cancelled block leaves the queue; blocks waiting when the
    batcher closes get RuntimeError; a callback that raises is reported."""
    model = LNLSTM(I, H, seed=33)
    table = RecordingTable(model, 8)
    ids = [table.open() for _ in range(4)]
    xs = inputs(4, 2, seed=33)
    table.gate = threading.Event()

    async def main():
        loop = asyncio.get_running_loop()
        reported = []
        loop.set_exception_handler(lambda loop, context: reported.append(context))
        got = []
        async with StreamBatcher(table) as b:
            first = b.submit_block([ids[3]], block_of(xs, [3], 0))    # runs, held
            while not table.entered.is_set():
                await asyncio.sleep(0.001)
            b.submit_block(ids[:2], block_of(xs, [0, 1], 0),
                           lambda y, error: got.append(type(error).__name__))
            gone = b.submit_block([ids[2]], block_of(xs, [2], 0))
            gone.cancel()
            b.submit_block([ids[2]], block_of(xs, [2], 0), lambda y, error: 1 / 0)
            table.close(ids[1])
            table.gate.set()
            await first
            while len(table.calls) < 2 or not reported:
                await asyncio.sleep(0.001)
            table.gate = threading.Event()
            table.entered.clear()
            held = b.submit_block([ids[0]], block_of(xs, [0], 0))
            while not table.entered.is_set():
                await asyncio.sleep(0.001)
            b.submit_block([ids[0]], block_of(xs, [0], 1),
                           lambda y, error: got.append(type(error).__name__))
            closing = asyncio.ensure_future(b.aclose())
            await asyncio.sleep(0.01)
            table.gate.set()
            await closing
            y0 = await held
        return got, reported, y0, b.metrics()
    got, reported, y0, m = asyncio.run(main())
    assert got == ["UnknownStreamError", "RuntimeError"]
    assert table.calls[1] == [ids[2]] and len(table.calls) == 3   # ids[0] ran once, alone
    assert y0.tobytes() == alone(model, xs[0, :1])[0].tobytes()
    assert [type(c["exception"]) for c in reported] == [ZeroDivisionError]
    assert reported[0]["message"] == "a StreamBatcher.submit_block callback raised"
    assert m["cancelled"] == 1 and m["failed"] == 3 and m["pending"] == 0


def test_a_stream_closed_while_its_block_runs_fails_the_block():
    model = LNLSTM(I, H, seed=34)
    table = RecordingTable(model, 8)
    a, c, d = table.open(), table.open(), table.open()
    xs = inputs(3, 1, seed=34)
    table.close_at = {0: [c]}

    async def main():
        async with StreamBatcher(table) as b:
            b.submit(d, xs[2, 0])                       # in the same batch, after the block
            blk = b.submit_block([a, c], block_of(xs, [0, 1], 0))
            solo = b.submit(d, xs[2, 0])
            with pytest.raises(UnknownStreamError):
                await blk
            return await solo, b.metrics()
    y, m = asyncio.run(main())
    assert m["failed"] == 2


@pytest.mark.parametrize("seed", range(3))
def test_random_blocks_and_single_steps(seed):
    """Random blocks and single steps of 12 streams from several tasks, with
    a small max_batch: every stream's results in order and bitwise its own,
    no batch past max_batch (no block is larger), no stream twice in one."""
    model = LNLSTM(I, H, seed=35)
    n, T, max_batch = 12, 10, 5
    table = RecordingTable(model, n)
    ids = [table.open() for _ in range(n)]
    xs = inputs(n, T, seed=35 + seed)
    rng = random.Random(seed)

    async def main():
        got = {k: [] for k in range(n)}
        nxt = [0] * n
        async with StreamBatcher(table, max_batch=max_batch, max_queue_per_stream=T,
                                 max_pending=n * T) as b:
            pending = []
            while min(nxt) < T:
                free = [k for k in range(n) if nxt[k] < T]
                ks = rng.sample(free, min(len(free), rng.randint(1, max_batch)))
                if len(ks) == 1 and rng.random() < 0.5:
                    k = ks[0]
                    pending.append(((k,), b.submit(ids[k], xs[k, nxt[k]])))
                else:
                    x = np.stack([xs[k, nxt[k]] for k in ks])
                    pending.append((tuple(ks), b.submit_block([ids[k] for k in ks], x)))
                for k in ks:
                    nxt[k] += 1
                if rng.random() < 0.3:
                    await asyncio.sleep(0 if rng.random() < 0.5 else 1e-4)
            for ks, f in pending:
                y = await f
                for i, k in enumerate(ks):
                    got[k].append((y if y.ndim == 1 else y[i]).copy())
        return got
    got = asyncio.run(main())
    check_calls(table.calls, max_batch)
    for k in range(n):
        assert [y.tobytes() for y in got[k]] == [w.tobytes() for w in alone(model, xs[k])], k
