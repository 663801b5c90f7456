"""fastln.rnn.StreamTable: many streams of one model in one table.

- every stream's outputs are bitwise those of the stream run alone with the
  model's step(), in any batch, for every model class and dtype (float64
  and the generic path: to rounding), through export and import, after
  evictions of others;
- every model variant's streams against fastln.rnn_reference (float64, and
  float32 on the weights read in place), and models loaded from torch.nn
  LSTM, GRU and RNN against the torch modules;
- ids, capacity and errors; idle eviction with its callback;
- threads: open, step, close, export, import and eviction at once, with no
  slot shared by two streams nor freed twice, and a slot freed during a
  step that names it not reused before that step ends.
"""
import threading

import numpy as np
import pytest

from fastln.rnn import (
    GRU,
    LNGRU,
    LNLSTM,
    LNRNN,
    LSTM,
    RNN,
    StreamTable,
    TableFullError,
    UnknownStreamError,
)

from test_rnn import VARIANTS, VIDS, randomized, ref_forward

CLASSES = [LNLSTM, LNGRU, LNRNN, LSTM, GRU, RNN]


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


def _check(got, want, model):
    assert np.array_equal(_bits(got), _bits(want))


class Solo:
    """Each stream run alone with model.step: the reference."""

    def __init__(self, model):
        self.model, self.states = model, {}

    def step(self, sid, x):
        y, self.states[sid] = self.model.step(x[None], self.states.get(sid))
        return y[0]


def _model(cls, dtype):
    m = cls(6, 32, 2, seed=1)
    if dtype == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        return m.to(ml_dtypes.bfloat16)
    return m.to(dtype) if dtype != np.float32 else m


@pytest.mark.parametrize("dtype", [np.float32, np.float64, "bfloat16"])
@pytest.mark.parametrize("cls", CLASSES)
def test_every_stream_is_the_stream_alone(cls, dtype):
    rng = np.random.default_rng(0)
    m = _model(cls, dtype)
    table, solo = StreamTable(m, capacity=9), Solo(m)
    ids = [table.open() for _ in range(7)] + [table.open("named")]
    for _ in range(12):
        batch = list(rng.choice(ids, size=rng.integers(1, len(ids) + 1), replace=False))
        batch = [b if b == "named" else int(b) for b in batch]
        x = rng.standard_normal((len(batch), 6)).astype(m._dt)
        y = table.step(batch, x)
        assert y.dtype == m.dtype and y.shape == (len(batch), 32)
        for i, sid in enumerate(batch):
            _check(y[i], solo.step(sid, x[i]), m)


def test_every_isa_path(isa):
    rng = np.random.default_rng(1)
    m = LNLSTM(5, 32, seed=2)
    table, solo = StreamTable(m, 4), Solo(m)
    ids = [table.open() for _ in range(4)]
    for t in range(6):
        batch = ids[t % 2::2] if t % 3 else ids
        x = rng.standard_normal((len(batch), 5)).astype(np.float32)
        y = table.step(batch, x)
        for i, sid in enumerate(batch):
            _check(y[i], solo.step(sid, x[i]), m)


def test_export_import_continue_bitwise_in_another_table():
    rng = np.random.default_rng(2)
    m = LNLSTM(4, 32, seed=3)
    a, b, solo = StreamTable(m, 3), StreamTable(m, 5), Solo(m)
    sid = a.open("s")
    other = a.open()
    for t in range(8):
        x = rng.standard_normal((1, 4)).astype(np.float32)
        table = a if t < 4 else b
        if t == 4:   # move: out of a, through np.savez-friendly arrays, into b
            state = a.export_state("s")
            a.close("s")
            assert "s" not in a and len(a) == 1
            b.import_state(tuple(np.array(part) for part in state), "s")
        _check(table.step([sid], x)[0], solo.step("s", x[0]), m)
    a.step([other], np.zeros((1, 4), np.float32))
    h, c = b.export_state("s")
    assert h.shape == c.shape == (1, 1, 32)
    with pytest.raises(ValueError):
        b.import_state((h, c), "s")   # the id is open


@pytest.mark.parametrize("cls", CLASSES)
def test_snapshot_counts_steps_and_matches_export(cls):
    """snapshot gives each stream's steps since its admission and the state
    export_state gives, column by column; an import starts at 0 steps, and a
    failed step counts nothing."""
    rng = np.random.default_rng(5)
    m = cls(3, 8, 2, seed=2)
    table = StreamTable(m, 6)
    a, b = table.open("a"), table.open("b")
    for k in range(3):
        batch = [a] if k == 0 else [a, b]
        table.step(batch, rng.standard_normal((len(batch), 3)).astype(np.float32))
    c = table.import_state(table.export_state(a), "c")
    with pytest.raises(ValueError):
        table.step([b], np.ones((1, 4), np.float32))
    steps, state = table.snapshot(["b", "c", "a"])
    assert steps.dtype == np.int64 and steps.tolist() == [2, 0, 3]
    parts = state if isinstance(state, tuple) else (state,)
    for i, sid in enumerate(["b", "c", "a"]):
        one = table.export_state(sid)
        for p, q in zip(parts, one if isinstance(one, tuple) else (one,)):
            assert p.shape == (2, 3, 8) and not np.shares_memory(p, table._h)
            _check(p[:, i:i + 1], q, m)
    table.close(c)
    assert table.open("c") == "c" and table.snapshot([c])[0].tolist() == [0]   # a new stream
    assert table.snapshot([])[0].shape == (0,)
    with pytest.raises(UnknownStreamError):
        table.snapshot([a, "nope"])


def test_ids_capacity_and_errors():
    m = LNGRU(3, 8)
    table = StreamTable(m, 2)
    a = table.open()
    b = table.open()
    assert a != b and len(table) == 2 and table.ids() == [a, b]
    with pytest.raises(TableFullError, match="capacity"):
        table.open()
    table.close(a)
    with pytest.raises(UnknownStreamError, match="no open stream") as e:
        table.close(a)
    assert isinstance(e.value, KeyError)
    with pytest.raises(UnknownStreamError):
        table.step([a], np.ones((1, 3), np.float32))
    c = table.open()
    assert c not in (a, b)   # ids are never given twice
    with pytest.raises(ValueError, match="more than once"):
        table.step([b, b], np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="is open"):
        table.open(b)
    table.close(b)
    with pytest.raises(TypeError, match="hashable"):
        table.open(["not", "hashable"])
    with pytest.raises(ValueError, match="x must have shape"):
        table.step([c], np.ones((2, 3), np.float32))
    with pytest.raises(TypeError):
        table.step([c], np.ones((1, 3), np.float64))
    assert table.step([], np.ones((0, 3), np.float32)).shape == (0, 8)
    with pytest.raises(TypeError, match="model"):
        StreamTable(object(), 2)
    with pytest.raises(ValueError, match="bidirectional"):
        StreamTable(LNLSTM(3, 8, bidirectional=True), 2)
    for bad in (0, -1):
        with pytest.raises(ValueError, match="capacity"):
            StreamTable(m, bad)
    with pytest.raises(TypeError, match="capacity"):
        StreamTable(m, 2.0)
    with pytest.raises(ValueError, match="idle_timeout"):
        StreamTable(m, 2, idle_timeout=-1)
    with pytest.raises(TypeError, match="on_evict"):
        StreamTable(m, 2, on_evict=3)


def test_failed_step_changes_nothing():
    m = LNLSTM(3, 8, seed=1)
    table = StreamTable(m, 2)
    s = table.open()
    table.step([s], np.ones((1, 3), np.float32))
    before = table.export_state(s)
    with pytest.raises(ValueError):
        table.step([s], np.ones((1, 4), np.float32))
    after = table.export_state(s)
    assert all(np.array_equal(p, q) for p, q in zip(before, after))


def test_out_and_model_changes():
    rng = np.random.default_rng(4)
    m = LNRNN(3, 16, seed=1)
    table, solo = StreamTable(m, 2), Solo(m)
    s = table.open()
    out = np.empty((1, 16), np.float32)
    x = rng.standard_normal((1, 3)).astype(np.float32)
    assert table.step([s], x, out=out) is out
    solo.step(s, x[0])
    m.params["weight_hh_l0"] *= 0.5   # applies from the next step on
    x = rng.standard_normal((1, 3)).astype(np.float32)
    _check(table.step([s], x)[0], solo.step(s, x[0]), m)
    with pytest.raises(TypeError, match="out"):
        table.step([s], x, out=np.empty((1, 16)))


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_idle_eviction_tells_the_callback_and_keeps_the_state():
    rng = np.random.default_rng(5)
    m = LNLSTM(3, 8, seed=2)
    clock, told = Clock(), {}
    table = StreamTable(m, 3, idle_timeout=10, on_evict=lambda sid, st: told.update({sid: st}),
                        clock=clock)
    solo = Solo(m)
    a, b = table.open("a"), table.open("b")
    for _ in range(3):
        x = rng.standard_normal((2, 3)).astype(np.float32)
        table.step([a, b], x)
        solo.step("a", x[0]), solo.step("b", x[1])
        clock.now += 4
    x = rng.standard_normal((1, 3)).astype(np.float32)
    table.step([b], x)   # a is idle since t = 8, b active at 12
    solo.step("b", x[0])
    clock.now = 18.5
    assert table.evict_idle() == ["a"] and table.evicted == 1
    assert set(told) == {"a"} and "a" not in table and "b" in table
    with pytest.raises(UnknownStreamError):
        table.step(["a"], x)
    table.import_state(told["a"], "a")   # nothing lost: it continues bitwise
    _check(table.step(["a"], x)[0], solo.step("a", x[0]), m)
    clock.now = 100   # open() sweeps too
    table.open("c")
    assert set(told) == {"a", "b"} and table.ids() == ["c"]


@pytest.mark.parametrize("sweep_from", ["evict_idle", "open", "step"])
def test_an_on_evict_that_raises_still_hands_over_every_state(sweep_from):
    """on_evict raises for the first of three idle streams (and for the
    third): it is still called for each of them, with its state, and the
    first error propagates from whichever call swept."""
    m = LNGRU(3, 8, seed=4)
    clock, told = Clock(), {}

    def on_evict(sid, st):
        told[sid] = st
        if sid in ("a", "c"):
            raise RuntimeError(f"cannot keep {sid}")
    table = StreamTable(m, 5, idle_timeout=10, on_evict=on_evict, clock=clock)
    x = np.random.default_rng(4).standard_normal((4, 3)).astype(np.float32)
    table.step([table.open(k) for k in "abcd"], x)
    want = {k: table.export_state(k) for k in "abc"}
    clock.now = 5
    table.step(["d"], x[:1])
    clock.now = 12        # a, b and c idle for 12 s, d for 7 s
    with pytest.raises(RuntimeError, match="cannot keep a") as err:
        if sweep_from == "evict_idle":
            table.evict_idle()
        elif sweep_from == "open":
            table.open("e")
        else:
            table.step(["d"], x[:1])
    assert sorted(told) == ["a", "b", "c"]
    for k in "abc":
        assert told[k].tobytes() == want[k].tobytes()
    assert "d" in table and not any(k in table for k in "abc") and table.evicted == 3
    if hasattr(err.value, "__notes__"):
        assert any("cannot keep c" in n for n in err.value.__notes__)


@pytest.mark.parametrize("since_sweep", [0.0, 0.11, 0.9])
def test_a_full_table_evicts_idle_streams_before_it_refuses(since_sweep):
    """open() and import_state() on a full table evict the streams idle past
    idle_timeout, however recent the last sweep, and refuse only when none
    is."""
    m = LNLSTM(3, 4, seed=1)
    clock, told = Clock(), []
    table = StreamTable(m, 2, idle_timeout=1.0, on_evict=lambda sid, st: told.append(sid),
                        clock=clock)
    table.open("a")
    clock.now = 0.5
    table.open("b")
    clock.now = 1.01 - since_sweep
    table.evict_idle()                       # the last sweep: nothing idle yet
    clock.now = 1.01                         # a idle for 1.01 s, b for 0.51 s
    assert table.open("c") == "c"
    assert told == ["a"] and table.ids() == ["b", "c"]
    with pytest.raises(TableFullError):
        table.import_state(table.export_state("b"), "d")   # b and c are not idle
    clock.now = 1.6
    assert table.import_state(table.export_state("c"), "d") == "d"   # b is
    assert told == ["a", "b"] and table.ids() == ["c", "d"]


def test_a_slot_freed_during_a_step_waits_for_it():
    """close() of a stream while a step that names it runs frees its slot
    after that step: a stream opened meanwhile gets another slot, and the
    step's results for it do not land in the new stream."""
    m = LNLSTM(3, 8, seed=3)
    table = StreamTable(m, 2)
    a = table.open()
    started, release = threading.Event(), threading.Event()
    real = m._table_step

    def slow(*args):
        started.set()
        release.wait(10)
        return real(*args)

    m._table_step = slow
    worker = threading.Thread(target=table.step, args=([a], np.ones((1, 3), np.float32)))
    worker.start()
    assert started.wait(10)
    table.close(a)
    b = table.open()          # the other slot
    with pytest.raises(TableFullError):
        table.open()          # a's slot is still the step's
    release.set()
    worker.join(10)
    m._table_step = real
    zero = table.export_state(b)
    assert not any(np.any(part) for part in zero)   # untouched by the step
    table.open()              # now a's slot is free


def test_threads_open_step_close_evict_at_once():
    """Eight threads open, step, export, close and evict streams of one
    table at once; each thread checks its own streams against solo runs.
    At the end every slot is free exactly once."""
    m = LNGRU(4, 16, seed=4)
    clock = Clock()
    table = StreamTable(m, 24, idle_timeout=1e9, clock=clock)
    errors = []
    lock = threading.Lock()

    def worker(k):
        try:
            rng = np.random.default_rng(k)
            solo = Solo(m)
            mine = []
            for _ in range(60):
                op = rng.integers(0, 10)
                if op < 2 or not mine:
                    try:
                        mine.append(table.open())
                    except TableFullError:
                        pass
                elif op == 2:
                    sid = mine.pop(rng.integers(len(mine)))
                    table.close(sid)
                elif op == 3:
                    sid = mine[rng.integers(len(mine))]
                    state = table.export_state(sid)
                    table.close(sid)
                    mine.remove(sid)
                    new = table.import_state(state)
                    solo.states[new] = solo.states.pop(sid, None)
                    mine.append(new)
                elif op == 4:
                    table.evict_idle()   # nothing is idle that long
                else:
                    batch = list(rng.permutation(mine)[:rng.integers(1, len(mine) + 1)])
                    x = rng.standard_normal((len(batch), 4)).astype(np.float32)
                    y = table.step(batch, x)
                    for i, sid in enumerate(batch):
                        _check(y[i], solo.step(sid, x[i]), m)
            for sid in mine:
                table.close(sid)
        except Exception as e:   # reported below
            with lock:
                errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(table) == 0
    assert sorted(table._free) == list(range(24))   # every slot free, once
    assert not table._busy and not table._release


# ---- against the float64 reference and PyTorch ----

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("variant", VARIANTS, ids=VIDS)
def test_streams_against_the_float64_reference(variant, dtype):
    """Streams of different lengths, stepped through one table in changing
    batches, each against fastln.rnn_reference's forward over its own inputs
    (H = 32: the float32 weights are read in place, the GRU's split blocks too)."""
    rng = np.random.default_rng(7)
    m = randomized(rng, variant, 5, 32, 2, dtype)
    table = StreamTable(m, 6)
    lengths = [6, 3, 5, 1, 4]
    xs = [rng.standard_normal((n, 1, 5)).astype(dtype) for n in lengths]
    ids = [table.open() for _ in lengths]
    ys = [[] for _ in lengths]
    for t in range(max(lengths)):
        live = [k for k, n in enumerate(lengths) if t < n][::-1 if t % 2 else 1]
        y = table.step([ids[k] for k in live], np.concatenate([xs[k][t] for k in live]))
        for i, k in enumerate(live):
            ys[k].append(y[i])
    tol = 1e-12 if dtype == np.float64 else 2e-4
    for k in range(len(lengths)):
        want = ref_forward(m, variant, xs[k].astype(np.float64))[0][:, 0]
        np.testing.assert_allclose(np.array(ys[k], np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_streams_against_pytorch(torch, kind):
    """A model loaded from torch.nn.LSTM, GRU or RNN (two layers), its streams
    stepped through a table, against the torch module over each stream."""
    torch.manual_seed(0)
    mod = getattr(torch.nn, kind)(5, 32, num_layers=2)
    m = {"LSTM": LSTM, "GRU": GRU, "RNN": RNN}[kind].from_torch(mod)
    rng = np.random.default_rng(8)
    table = StreamTable(m, 4)
    xs = [rng.standard_normal((n, 1, 5)).astype(np.float32) for n in (4, 2, 3)]
    ids = [table.open() for _ in xs]
    ys = [[] for _ in xs]
    for t in range(4):
        live = [k for k, x in enumerate(xs) if t < len(x)]
        y = table.step([ids[k] for k in live], np.concatenate([xs[k][t] for k in live]))
        for i, k in enumerate(live):
            ys[k].append(y[i])
    with torch.no_grad():
        for k, x in enumerate(xs):
            want = mod(torch.from_numpy(x))[0][:, 0].numpy()
            np.testing.assert_allclose(np.array(ys[k]), want, rtol=1e-5, atol=1e-5)
