"""The compiled step of the recurrent models (step(), fastln.rnn._engine.Step):

- weights read where they are: a change to them by any route (in place,
  through a view's base, load_state_dict, assignment) applies from the next
  step, bitwise as a fresh model with the new weights; nothing stale is kept;
- the layouts the models keep (Fortran-ordered, 64-byte aligned float32 weight
  matrices) and what a transposed weight matrix does on every ISA path, for
  sizes the kernels read in place and sizes they do not, forward and backward;
- out= and state_out=, in place included, and their errors.
"""
import threading
import tracemalloc

import numpy as np
import pytest

import fastln
from fastln.rnn import GRU, LNGRU, LNLSTM, LNRNN, LSTM, RNN

CLASSES = [LNLSTM, LNGRU, LNRNN, LSTM, GRU, RNN]


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


def _fresh(m):
    """A new model of m's class, configuration and dtype, with m's parameters."""
    kw = {} if m._kind.endswith("plain") or not hasattr(m, "eps") else {"eps": m.eps}
    if hasattr(m, "nonlinearity"):
        kw["nonlinearity"] = m.nonlinearity
    if isinstance(m, GRU):
        kw["linear_before_reset"] = m.linear_before_reset
    new = type(m)(m.input_size, m.hidden_size, m.num_layers, dtype=np.float32, **kw)
    new = new.to(m.dtype) if m.dtype != np.float32 else new
    new.load_state_dict(m.state_dict())
    return new


def _same_step(m, x, state):
    """m.step and a fresh model's step agree bitwise (output and state)."""
    y, st = m.step(x, state)
    y2, st2 = _fresh(m).step(x, state)
    assert np.array_equal(_bits(y), _bits(y2))
    for a, b in zip(st if isinstance(st, tuple) else (st,),
                    st2 if isinstance(st2, tuple) else (st2,)):
        assert np.array_equal(_bits(a), _bits(b))
    return y, st


@pytest.mark.parametrize("cls", CLASSES)
def test_in_place_changes_apply_to_the_next_step(cls):
    rng = np.random.default_rng(0)
    m = cls(6, 32, 2, seed=1)
    x = rng.standard_normal((3, 6)).astype(np.float32)
    y, st = m.step(x)
    keys = sorted(m.params)
    for i, key in enumerate(keys):   # every parameter, in turn, three ways
        how = i % 3
        if how == 0:
            m.params[key] -= 0.01
        elif how == 1:
            m.params[key][:] = rng.uniform(-0.2, 0.2, m.params[key].shape)
        else:
            new = m.state_dict()
            new[key] = new[key] * 0.5
            m.load_state_dict(new)
        y2, st = _same_step(m, x, st)
        assert not np.array_equal(y, y2)
        y = y2


@pytest.mark.parametrize("cls", [LNLSTM, GRU])
def test_assigned_arrays_and_views_are_never_stale(cls):
    """A C-ordered writable array assigned to params, and a read-only view of
    a writable array, are read anew at each step: changing them (or the
    view's base) changes the next step."""
    rng = np.random.default_rng(2)
    m = cls(5, 16, seed=3)
    x = rng.standard_normal((2, 5)).astype(np.float32)
    _, st = m.step(x)
    base = np.ascontiguousarray(m.params["weight_hh_l0"])
    view = base.view()
    view.flags.writeable = False
    m.params["weight_hh_l0"] = view
    m.params["weight_ih_l0"] = np.ascontiguousarray(m.params["weight_ih_l0"])
    y1, st1 = _same_step(m, x, st)
    base *= 1.5   # through the base of a read-only view
    y2, _ = _same_step(m, x, st)
    assert not np.array_equal(y1, y2)
    m.params["weight_ih_l0"][0] += 1.0   # a C-ordered writable array, in place
    y3, _ = _same_step(m, x, st)
    assert not np.array_equal(y2, y3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cls", [LNLSTM, GRU])
@pytest.mark.parametrize("route", ["a view made before", "the owner made writable again"])
def test_read_only_weights_are_never_stale(cls, dtype, route):
    """A read-only C-ordered weight matrix can still change: through a
    writable view made before it became read-only, or after its owner's
    flag is set again and back. The next step and forward see the change:
    they equal a fresh model's with the same weights."""
    rng = np.random.default_rng(6)
    m, fresh = cls(5, 16, seed=3, dtype=dtype), cls(5, 16, seed=3, dtype=dtype)
    x = rng.standard_normal((2, 5)).astype(dtype)
    for key in ("weight_ih_l0", "weight_hh_l0"):
        a = np.ascontiguousarray(m.params[key])
        sibling = a.view()
        a.flags.writeable = False
        m.params[key] = a
    _, st = m.step(x)
    m.forward(x[None], cache=False)
    w = m.params["weight_hh_l0"]
    if route == "a view made before":
        sibling[::2] *= -1
    else:
        w.flags.writeable = True
        w[1::2] *= 0.5
        w.flags.writeable = False
    fresh.params["weight_hh_l0"][...] = w
    fresh.params["weight_ih_l0"][...] = m.params["weight_ih_l0"]
    assert np.array_equal(m.step(x, st)[0], fresh.step(x, st)[0])
    assert np.array_equal(m.forward(x[None], cache=False)[0],
                          fresh.forward(x[None], cache=False)[0])


def test_immutable_weights_are_packed_once_and_reused():
    """Weight matrices whose memory is a bytes object cannot change: their
    packing is kept."""
    m = LNLSTM(8, 32, seed=4)
    for key in ("weight_ih_l0", "weight_hh_l0"):
        a = m.params[key]
        m.params[key] = np.frombuffer(a.tobytes(), a.dtype).reshape(a.shape)
    x = np.ones((1, 8), np.float32)
    y, st = _same_step(m, x, None)
    packs = dict(m._packs)
    assert packs[(0, 0)][2] is not None
    m.step(x, st)
    assert m._packs[(0, 0)][2] is packs[(0, 0)][2]   # kept
    new = m.state_dict()
    new["weight_hh_l0"] = new["weight_hh_l0"] + 0.1
    m.load_state_dict(new)   # new arrays: new packing
    _same_step(m, x, st)


def test_bfloat16_weights_are_locked_and_replaced_not_changed():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    m = LNLSTM(8, 32, seed=5).to(ml_dtypes.bfloat16)
    w = m.params["weight_hh_l0"]
    with pytest.raises(ValueError):
        m.params["weight_hh_l0"] -= 1
    with pytest.raises(ValueError):
        w.flags.writeable = True   # a view of a read-only array
    owner = w
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    with pytest.raises(ValueError):
        owner.flags.writeable = True   # its memory is a bytes object
    x = np.ones((2, 8), np.float32)
    _, st = _same_step(m, x, None)
    new = m.state_dict()
    new["weight_ih_l0"] = (new["weight_ih_l0"].astype(np.float32) * 2).astype(ml_dtypes.bfloat16)
    m.load_state_dict(new)
    _same_step(m, x, st)


# ---- layouts ----

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_weight_matrices_layout(dtype):
    m = LNGRU(7, 24, 2, dtype=dtype, seed=0)
    for key, value in m.params.items():
        if key.startswith("weight"):
            assert value.ctypes.data % 64 == 0, key
            assert value.flags.f_contiguous, key
        else:
            assert value.flags.c_contiguous
    for key, value in m.state_dict().items():
        assert value.flags.c_contiguous and value.flags.owndata, key
    for key, value in m.to(np.float64 if dtype == np.float32 else np.float32).params.items():
        if key.startswith("weight"):
            assert value.ctypes.data % 64 == 0


@pytest.mark.parametrize("cls,H", [(LNLSTM, 8), (LNLSTM, 5), (LNGRU, 32), (LNGRU, 12),
                                   (LNRNN, 32), (LNRNN, 9), (GRU, 32), (GRU, 20), (LSTM, 6),
                                   (RNN, 64)])
@pytest.mark.parametrize("T,B", [(6, 3), (1, 4), (3, 1), (40, 8)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_transposed_weights_match_plain_ones_on_every_path(cls, H, T, B, dtype, isa):
    """F-ordered weights (where G, and H for ONNX's GRU, are multiples of the
    panel width, 32 floats or 16 doubles: read in place by a call of few
    rows, packed from their transposed layout by a longer one; copied
    elsewhere) give bitwise the results of C-ordered ones, forward, backward
    and step."""
    kw = {"linear_before_reset": False} if cls is GRU else {}
    rng = np.random.default_rng(H)
    f = cls(5, H, 2, seed=7, dtype=dtype, **kw)
    c = cls(5, H, 2, seed=7, dtype=dtype, **kw)
    for key in c.params:
        if key.startswith("weight"):
            c.params[key] = np.ascontiguousarray(c.params[key])
            f.params[key] = np.asfortranarray(f.params[key])
    assert f.params["weight_hh_l0"].flags.f_contiguous
    x = rng.standard_normal((T, B, 5)).astype(dtype)
    yf, sf = f.forward(x)
    yc, sc = c.forward(x)
    assert np.array_equal(_bits(yf), _bits(yc))
    dy = rng.standard_normal(yf.shape).astype(dtype)
    dxf, _ = f.backward(dy)
    dxc, _ = c.backward(dy)
    assert np.array_equal(_bits(dxf), _bits(dxc))
    for key in f.grads:
        assert np.array_equal(_bits(f.grads[key]), _bits(c.grads[key])), key
    assert np.array_equal(_bits(f.step(x[0])[0]), _bits(c.step(x[0])[0]))


# (H, T) on either side of the thresholds of src_c/rnn/pack.h's packs_transposed:
# W_hh of G x H = 0.2, 1.98, 2.17 and 8.7 million elements, against 2**19, 2**21
# and 2**23, and the steps against 16 and 48
@pytest.mark.parametrize("H,T", [(224, 32), (704, 15), (704, 16), (736, 47), (736, 48),
                                 (1472, 16)])
def test_large_weights_pack_by_size_batch_and_steps(H, T, isa):
    """F-ordered weights are packed or read in place by their size, the
    batch and the steps; either way a forward's outputs are bitwise those of
    C-ordered weights, and each row's those of the row alone, on every path."""
    f = LSTM(8, H, seed=3)
    c = LSTM(8, H, seed=3)
    for key in c.params:
        c.params[key] = np.ascontiguousarray(c.params[key])
    x = np.random.default_rng(H + T).standard_normal((T, 2, 8)).astype(np.float32)
    for B in (1, 2):
        with fastln.threads(2):
            yf, _ = f.forward(x[:, :B], cache=False)
            yc, _ = c.forward(x[:, :B], cache=False)
        assert np.array_equal(_bits(yf), _bits(yc)), B
    with fastln.threads(1):
        alone, _ = f.forward(x[:, 1:], cache=False)
    assert np.array_equal(_bits(alone[:, 0]), _bits(yf[:, 1]))


@pytest.mark.parametrize("cls", [LSTM, GRU, LNLSTM])
def test_a_long_batch_packs_and_its_rows_are_each_row_alone(cls, isa):
    """A forward of many steps over a batch packs the F-ordered weights; a
    single sequence, or the steps one at a time, read them in place: each
    row's outputs are bitwise the same, on any thread count and path."""
    def same(a, b):
        assert np.array_equal(_bits(a), _bits(b))
    m = cls(16, 64, seed=2)
    x = np.random.default_rng(2).standard_normal((40, 8, 16)).astype(np.float32)
    with fastln.threads(2):
        y, _ = m.forward(x, cache=False)
    for b in (0, 5):
        with fastln.threads(1):
            alone, _ = m.forward(x[:, b:b + 1], cache=False)
        same(alone[:, 0], y[:, b])
    st = None
    for t in range(40):
        h, st = m.step(x[t], st)
    same(h, y[-1])


def test_bidirectional_float32_with_transposed_weights():
    rng = np.random.default_rng(9)
    f = LNLSTM(4, 32, 2, bidirectional=True, seed=1)
    c = LNLSTM(4, 32, 2, bidirectional=True, seed=1)
    for key in c.params:
        if key.startswith("weight"):
            c.params[key] = np.ascontiguousarray(c.params[key])
    x = rng.standard_normal((5, 2, 4)).astype(np.float32)
    assert np.array_equal(_bits(f.forward(x)[0]), _bits(c.forward(x)[0]))
    dy = np.ones((5, 2, 64), np.float32)
    assert np.array_equal(_bits(f.backward(dy)[0]), _bits(c.backward(dy)[0]))


# ---- out= and state_out= ----

@pytest.mark.parametrize("cls", [LNLSTM, LNGRU])
def test_state_out_in_place_and_reused(cls):
    rng = np.random.default_rng(3)
    m = cls(4, 16, 2, seed=2)
    xs = rng.standard_normal((10, 3, 4)).astype(np.float32)
    y_ref, st = None, None
    refs = []
    for x in xs:
        y_ref, st = m.step(x, st)
        refs.append(y_ref)
    shape = (2, 3, 16)
    state = (np.zeros(shape, np.float32), np.zeros(shape, np.float32)) if cls is LNLSTM \
        else np.zeros(shape, np.float32)
    out = np.empty((3, 16), np.float32)
    for x, want in zip(xs, refs):
        y, new = m.step(x, state, out=out, state_out=state)
        assert y is out and new is state or (isinstance(new, tuple) and new[0] is state[0])
        assert np.array_equal(_bits(y), _bits(want))
    # state_out with state None starts from zeros, whatever it held
    junk = (np.full(shape, 7, np.float32), np.full(shape, 7, np.float32)) if cls is LNLSTM \
        else np.full(shape, 7, np.float32)
    y, _ = m.step(xs[0], None, state_out=junk)
    assert np.array_equal(_bits(y), _bits(refs[0]))


def test_step_output_errors_name_the_argument():
    m = LNLSTM(4, 8, seed=0)
    x = np.ones((2, 4), np.float32)
    good = (np.zeros((1, 2, 8), np.float32), np.zeros((1, 2, 8), np.float32))
    with pytest.raises(TypeError, match="out"):
        m.step(x, out=np.empty((2, 8), np.float64))
    with pytest.raises(ValueError, match="out"):
        m.step(x, out=np.empty((3, 8), np.float32))
    with pytest.raises(ValueError, match="out"):
        m.step(x, out=np.empty((8, 2), np.float32).T)
    with pytest.raises(TypeError, match="state_out"):
        m.step(x, good, state_out=good[0])
    ro = np.zeros((1, 2, 8), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="state_out"):
        m.step(x, good, state_out=(ro, good[1]))
    with pytest.raises(ValueError, match="bidirectional"):
        LNLSTM(4, 8, bidirectional=True).step(x)


def _parts(state):
    return state if isinstance(state, tuple) else (state,)


_BAD_OUTS = [
    ("shape", lambda m, B: np.empty((B + 1, m.hidden_size), m.dtype), ValueError),
    ("dtype", lambda m, B: np.empty((B, m.hidden_size), np.float16), TypeError),
    ("layout", lambda m, B: np.empty((m.hidden_size, B), m.dtype).T, ValueError),
    ("read-only", lambda m, B: np.frombuffer(bytes(B * m.hidden_size * m.dtype.itemsize),
                                             m.dtype).reshape(B, m.hidden_size), ValueError),
    ("type", lambda m, B: [[0.0] * m.hidden_size] * B, TypeError),
]


@pytest.mark.parametrize("bad", _BAD_OUTS, ids=[b[0] for b in _BAD_OUTS])
@pytest.mark.parametrize("given_state", [False, True], ids=["state None", "state given"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("cls", [LNLSTM, GRU])
def test_a_refused_out_writes_no_state(cls, dtype, given_state, bad):
    """A step whose out= is refused raises before it writes state_out, on
    the compiled path and the general one, in place or not."""
    m = cls(4, 8, 2, seed=0)
    if dtype == "bfloat16":
        m = m.to(pytest.importorskip("ml_dtypes").bfloat16)
    elif dtype == "float64":
        m = m.to(np.float64)
    sdt = np.float64 if dtype == "float64" else np.float32
    B = 3
    for x in (np.ones((B, 4), sdt), np.ones((B, 4), sdt).T.copy().T):   # compiled, general
        shape = (2, B, 8)
        state = tuple(np.full(shape, 0.25, sdt) for _ in range(1 + (cls is LNLSTM)))
        state_out = tuple(np.full(shape, 7, sdt) for _ in state)
        if cls is not LNLSTM:
            state, state_out = state[0], state_out[0]
        name, make, err = bad
        for target in (state_out, state):   # another array, and in place
            before = [a.copy() for a in _parts(target)]
            with pytest.raises(err, match="out"):
                m.step(x, state if given_state else None, out=make(m, B), state_out=target)
            for a, b in zip(_parts(target), before):
                assert np.array_equal(a, b)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("B", [1, 37])
def test_a_loop_with_out_and_state_out_allocates_nothing(dtype, B):
    """step(x, state, out=y, state_out=state) in a loop allocates no array
    after its first calls, in float32 and in bfloat16 (whose y is rounded
    from float32 values the step keeps), and its results are those of
    plain steps."""
    m = LNLSTM(16, 64, 2, seed=1)
    if dtype == "bfloat16":
        m = m.to(pytest.importorskip("ml_dtypes").bfloat16)
    xs = np.random.default_rng(1).standard_normal((40, B, 16)).astype(np.float32)
    want, st = [], None
    for x in xs:
        y, st = m.step(x, st)
        want.append(y)
    y = np.empty((B, 64), m.dtype)
    state = tuple(np.zeros((2, B, 64), np.float32) for _ in range(2))
    for x in xs[:3]:
        m.step(x, state, out=y, state_out=state)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        for x in xs[3:]:
            m.step(x, state, out=y, state_out=state)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert peak < 1024, peak      # Python's own objects of a call, no array of B x H
    assert np.array_equal(_bits(y), _bits(want[-1]))


def test_bfloat16_steps_from_many_threads_at_once():
    """Threads stepping one bfloat16 model at once, each its own stream and
    batch size, each get the results of the stream stepped alone."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    m = LNGRU(8, 32, 2, seed=4).to(ml_dtypes.bfloat16)
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((30, 1 + k % 5, 8)).astype(np.float32) for k in range(8)]
    want = []
    for x in xs:
        st, ys = None, []
        for x_t in x:
            y, st = m.step(x_t, st)
            ys.append(_bits(y).copy())
        want.append(ys)
    got = [None] * len(xs)

    def run(k):
        st, ys = None, []
        out = np.empty((xs[k].shape[1], 32), m.dtype)
        for x_t in xs[k]:
            _, st = m.step(x_t, st, out=out)
            ys.append(_bits(out).copy())
        got[k] = ys
    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for g, w in zip(got, want):
        assert all(np.array_equal(a, b) for a, b in zip(g, w))


@pytest.mark.parametrize("threads", [1, 2])
def test_step_matches_forward_and_threads(threads):
    rng = np.random.default_rng(11)
    m = LNLSTM(16, 64, 2, seed=3)
    x = rng.standard_normal((7, 5, 16)).astype(np.float32)
    with fastln.threads(threads):
        y, _ = m.forward(x, cache=False)
        st = None
        for t in range(7):
            h, st = m.step(x[t], st)
    assert np.array_equal(_bits(h), _bits(y[-1]))


def test_out_of_a_bfloat16_model_is_bfloat16():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    m = LNGRU(4, 16, seed=1).to(ml_dtypes.bfloat16)
    x = np.ones((2, 4), np.float32)
    want, st = m.step(x)
    out = np.empty((2, 16), ml_dtypes.bfloat16)
    state = np.zeros((1, 2, 16), np.float32)
    y, new = m.step(x, None, out=out, state_out=state)
    assert y is out and new is state
    assert np.array_equal(_bits(out), _bits(want)) and np.array_equal(state, st)
    y, _ = m.step(x, state, out=out, state_out=state)   # in place, again
    assert np.array_equal(_bits(y), _bits(m.step(x, st)[0]))
    with pytest.raises(TypeError, match="out"):
        m.step(x, out=np.empty((2, 16), np.float32))


def test_params_of_another_mapping_type_still_step_right():
    from collections import UserDict
    m = LNRNN(3, 8, seed=0)
    x = np.ones((1, 3), np.float32)
    want = m.step(x)[0]
    m.params = UserDict(m.params)
    assert np.array_equal(_bits(m.step(x)[0]), _bits(want))
    m.params["weight_ih_l0"] = m.params["weight_ih_l0"] * 2
    got = m.step(x)[0]
    assert not np.array_equal(got, want)
    assert np.array_equal(_bits(got), _bits(_fresh_plain(m).step(x)[0]))


def _fresh_plain(m):
    new = type(m)(m.input_size, m.hidden_size, m.num_layers, seed=0)
    new.load_state_dict(dict(m.params))
    return new


def test_one_model_steps_from_many_threads():
    """Eight threads step their own streams of one model at once (the first
    call of each compiles the step, concurrently); each stream is bitwise its
    serial run."""
    m = LNLSTM(5, 32, 2, seed=6)
    rng = np.random.default_rng(6)
    xs = rng.standard_normal((8, 20, 2, 5)).astype(np.float32)
    want = []
    for k in range(8):
        st = None
        for x in xs[k]:
            y, st = m.step(x, st)
        want.append(y)
    m._step = None   # compiled anew, by the threads
    got = [None] * 8

    def run(k):
        st = None
        for x in xs[k]:
            y, st = m.step(x, st)
        got[k] = y

    threads = [threading.Thread(target=run, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for k in range(8):
        assert np.array_equal(_bits(got[k]), _bits(want[k])), k
