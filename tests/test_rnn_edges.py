"""fastln.rnn at its edges, as its docstrings promise them.

* B = 0: forward, backward and step give empty results (and zero parameter
  gradients), in every cell, direction and layout.
* step(): a stream of steps is bitwise one forward, in float32 and float64, on
  every instruction-set path.
* A wrong keyword names the public class; an h-only state passed as a tuple
  says to pass h.
* The initializer works in the model's dtype: the values are those of one
  float64 draw per matrix rounded once, the peak memory is the parameters and
  gradients plus a bounded block, and a model too large to allocate raises a
  MemoryError that states the memory it needs.
"""
import tracemalloc

import numpy as np
import pytest

import fastln
from fastln.rnn import GRU, LNGRU, LNLSTM, LNRNN, LSTM, RNN

from _util import F32, F64

CLASSES = [LNLSTM, LNGRU, LNRNN, LSTM, GRU, RNN]
IDS = [c.__name__ for c in CLASSES]


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_zero_sequences_give_empty_results(cls, dtype, bidirectional, batch_first):
    m = cls(3, 4, num_layers=2, dtype=dtype, seed=0, bidirectional=bidirectional,
            batch_first=batch_first)
    D = 2 if bidirectional else 1
    x = np.zeros((0, 5, 3) if batch_first else (5, 0, 3), dtype)
    for g in m.grads.values():
        g.fill(7.0)
    for lengths in (None, [], np.zeros(0, np.int64)):
        y, state = m.forward(x, lengths=lengths)
        assert y.shape == ((0, 5, D * 4) if batch_first else (5, 0, D * 4))
        assert y.dtype == dtype
        for s in (state if isinstance(state, tuple) else (state,)):
            assert s.shape == (2 * D, 0, 4) and s.dtype == dtype
        dx, dstate = m.backward(np.zeros_like(y))
        assert dx.shape == x.shape and dx.dtype == dtype
        assert all(not g.any() for g in m.grads.values())
        with pytest.raises(RuntimeError):
            m.backward(np.zeros_like(y))   # the cache was consumed
    y, _ = m.forward(x, cache=False)
    assert y.size == 0
    if not bidirectional:
        h, state = m.step(np.zeros((0, 3), dtype))
        assert h.shape == (0, 4) and h.dtype == dtype


def _steps(m, x):
    state, hs = None, []
    for x_t in x:
        h, state = m.step(x_t, state)
        hs.append(h)
    return np.array(hs), state


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_steps_against_one_forward_as_documented(cls, dtype, isa):
    rng = np.random.default_rng(5)
    m = cls(16, 64, num_layers=2, dtype=dtype, seed=1)
    x = rng.standard_normal((30, 5, 16)).astype(dtype)
    y, final = m.forward(x, cache=False)
    hs, state = _steps(m, x)
    assert np.array_equal(hs, y)
    for a, b in zip(state if isinstance(state, tuple) else (state,),
                    final if isinstance(final, tuple) else (final,)):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_a_wrong_keyword_names_the_public_class(cls):
    with pytest.raises(TypeError, match=rf"^{cls.__name__}\.__init__\(\) got an unexpected"):
        cls(8, 16, no_such_option=1)
    if cls not in (LNRNN, RNN):
        with pytest.raises(TypeError, match=rf"^{cls.__name__}\.__init__\(\)"):
            cls(8, 16, nonlinearity="relu")


@pytest.mark.parametrize("cls", [LNGRU, LNRNN, GRU, RNN], ids=["LNGRU", "LNRNN", "GRU", "RNN"])
def test_an_h_only_state_as_a_tuple_says_to_pass_h(cls):
    m = cls(8, 16, seed=0)
    h = np.zeros((1, 3, 16), F32)
    x = np.zeros((2, 3, 8), F32)
    for call in (lambda: m.forward(x, state=(h,)), lambda: m.step(x[0], (h,)),
                 lambda: m.forward(x, state=(h, h))):
        with pytest.raises(TypeError, match=r"state of \w+ is h itself.*\(1, 3, 16\).*pass h"):
            call()
    y, _ = m.forward(x, state=h)   # h itself works
    assert y.shape == (2, 3, 16)


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("cls", [LNLSTM, GRU], ids=["LNLSTM", "GRU"])
def test_init_draws_one_float64_stream_rounded_once(cls, dtype):
    # 300 rows of 2100 float64 draws exceed one 8 MiB block: blocks are tested
    m = cls(2100, 300, num_layers=2, dtype=dtype, seed=11, bidirectional=True)
    rng = np.random.default_rng(11)
    bound = 1.0 / np.sqrt(300)
    for key in m.params:   # the draws come in the order of params
        if key.startswith("weight_"):
            want = rng.uniform(-bound, bound, m.params[key].shape).astype(dtype)
            assert np.array_equal(m.params[key], want), key


def test_init_peak_memory_is_the_parameters_and_a_block():
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        m = LNLSTM(8, 1500, dtype=F32, seed=0)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    params = sum(p.nbytes for p in m.params.values())
    grads = sum(g.nbytes for g in m.grads.values())
    # float64 draws of one 8 MiB block at most; the old way held a float64
    # copy of the whole W_hh (36 MB here) beside the parameters
    assert peak <= params + grads + (8 << 20) + (1 << 20), (peak, params, grads)


def test_a_model_too_large_states_its_memory():
    with open("/proc/sys/vm/overcommit_memory") as f:
        if f.read().strip() == "1":
            pytest.skip("the kernel grants any allocation (vm.overcommit_memory = 1)")
    # 4 H x H float32 for W_hh alone: 1.4 TB
    with pytest.raises(MemoryError, match=r"LNLSTM\(input_size=8, hidden_size=600000.*"
                                          r"needs [0-9.]+ GiB"):
        LNLSTM(8, 600_000)


def test_to_float64_and_back_keeps_a_float_model_trainable():
    m = LNLSTM(3, 4, seed=0).to(np.float64)
    assert fastln.rnn._bf16._is_bf16(m.dtype) is False
    y, _ = m.forward(np.ones((2, 1, 3)))
    m.backward(np.ones_like(y))
    assert m.grads["weight_hh_l0"].dtype == F64


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_flags_take_bools(cls):
    for bad in ("yes", 1, None):
        with pytest.raises(TypeError, match="batch_first"):
            cls(3, 4, batch_first=bad)
        with pytest.raises(TypeError, match="bidirectional"):
            cls(3, 4, bidirectional=bad)
        with pytest.raises(TypeError, match="cache"):
            cls(3, 4).forward(np.ones((2, 1, 3), F32), cache=bad)
    y, _ = cls(3, 4, batch_first=np.bool_(True)).forward(np.ones((1, 2, 3), F32),
                                                         cache=np.bool_(False))
    assert y.shape == (1, 2, 4)


class _Tagged(np.ndarray):
    """An ndarray subclass, as a user's own may be."""


@pytest.mark.parametrize("kind", ["memmap r", "memmap r+", "subclass"])
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("cls", [LNLSTM, GRU], ids=["LNLSTM", "GRU"])
def test_params_may_be_memmaps_and_ndarray_subclasses(tmp_path, cls, dtype, kind):
    """Every parameter may be an np.memmap or another ndarray subclass: the
    forward, its backward and step() give what plain arrays give, and a
    change to the mapped memory applies from the next call."""
    m = cls(4, 8, num_layers=2, dtype=dtype, seed=0)
    plain = cls(4, 8, num_layers=2, dtype=dtype, seed=0)
    for key in m.params:
        a = np.asarray(m.params[key])
        if kind == "subclass":
            m.params[key] = a.copy().view(_Tagged)
        else:
            path = tmp_path / f"{key}.npy"
            np.save(path, a)
            m.params[key] = np.load(path, mmap_mode=kind.split()[1])
    x = np.random.default_rng(0).standard_normal((3, 2, 4)).astype(dtype)
    dy = np.ones((3, 2, 8), dtype)
    assert np.array_equal(m.forward(x)[0], plain.forward(x)[0])
    dx, _ = m.backward(dy)
    want_dx, _ = plain.backward(dy)
    assert np.array_equal(dx, want_dx)
    for key in m.grads:
        assert np.array_equal(m.grads[key], plain.grads[key]), key
    assert np.array_equal(m.step(x[0])[0], plain.step(x[0])[0])
    if kind != "memmap r":
        m.params["weight_hh_l0"][0] += 0.5
        plain.params["weight_hh_l0"][0] += 0.5
        assert np.array_equal(m.step(x[0])[0], plain.step(x[0])[0])
        assert np.array_equal(m.forward(x, cache=False)[0], plain.forward(x, cache=False)[0])
