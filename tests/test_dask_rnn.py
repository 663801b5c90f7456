"""fastln.dask.rnn_forward: fastln.rnn models over dask arrays chunked along the
batch, on the threaded scheduler and on a 2-process LocalCluster.

The reference is the model itself, in process: ``model.forward(x, lengths,
cache=False)[0]`` on the whole NumPy batch. A row's output does not depend on
which other rows share its batch (the engine is batch-invariant), so the
results must be bitwise equal, in float32, bfloat16 and float64 alike.

Skipped where dask is missing -- unless the CI environment variable is set
(CI installs dask and distributed), where a missing one is a failure.
"""
import doctest
import pickle
import warnings

import numpy as np
import pytest

import fastln
from fastln.rnn import LNGRU, LNLSTM, LSTM

from _util import F32, F64, named, require

dask = require("dask")
da = require("dask.array")
import fastln.dask as fd  # noqa: E402  (after the skip: it needs dask)

T, B, I, H = 7, 16, 6, 10
CHUNKS = (3, 5, 8)

MODELS = {
    "lnlstm": lambda dt: LNLSTM(I, H, num_layers=2, dtype=dt, seed=1),
    "lngru": lambda dt: LNGRU(I, H, dtype=dt, seed=2),
    "lnlstm_bidir": lambda dt: LNLSTM(I, H, dtype=dt, seed=3, bidirectional=True),
}


def _data(rng, dtype, batch_first=False):
    shape = (B, T, I) if batch_first else (T, B, I)
    return rng.standard_normal(shape).astype(dtype)


def _lengths(rng):
    lens = rng.integers(1, T + 1, B)
    lens[0] = T   # one full-length sequence: y has T steps
    return lens


def _dask(xn, chunks=CHUNKS, batch_first=False):
    return da.from_array(xn, chunks=(chunks, T, I) if batch_first else (T, chunks, I))


def _lazy_lengths(lens, kind):
    """lengths as the test passes it: None, a NumPy array, or a dask array
    chunked unlike x (rnn_forward rechunks it to x's B chunks)."""
    if lens is None or kind == "numpy":
        return lens
    return da.from_array(lens, chunks=6)


def _check(model, xn, x, lens, lengths, scheduler=None, client=None, exact=True):
    """y: lazy, x's B chunks, the model's dtype; equal to the in-process forward."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", fd.RechunkWarning)    # whole sequences: no rechunk
        y = fd.rnn_forward(model, x, lengths)
    D = model.num_directions
    b_axis = 0 if model.batch_first else 1
    assert isinstance(y, da.Array)
    assert y.dtype == model.dtype
    assert y.shape == x.shape[:2] + (D * H,)
    assert y.chunks[b_axis] == x.chunks[b_axis] and y.chunks[2] == (D * H,)
    yn = client.compute(y, sync=True) if client is not None else y.compute(scheduler=scheduler)
    want, _ = model.forward(xn, lengths=lens, cache=False)
    assert yn.dtype == want.dtype == model.dtype and yn.shape == want.shape
    if exact:
        np.testing.assert_array_equal(yn, want)
    else:
        np.testing.assert_allclose(yn, want, rtol=1e-12, atol=1e-13)
    return yn


# ------------------------------------------------------------------ threaded scheduler

@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("kind", [None, "numpy", "dask"])
def test_float32_bitwise_threads(name, kind, rng):
    model = MODELS[name](F32)
    xn = _data(rng, F32)
    lens = None if kind is None else _lengths(rng)
    _check(model, xn, _dask(xn), lens, _lazy_lengths(lens, kind), scheduler="threads")


@pytest.mark.parametrize("chunks", [(1, 15), (4, 1, 1, 10), (1,) * B])
def test_float32_bitwise_with_one_sequence_blocks(chunks, rng):
    # a block of one sequence takes the engine's B = 1 path
    model = MODELS["lnlstm"](F32)
    xn = _data(rng, F32)
    lens = _lengths(rng)
    _check(model, xn, _dask(xn, chunks), lens, lens, scheduler="threads")


@pytest.mark.parametrize("name", MODELS)
def test_float64_bitwise_threads(name, rng):
    model = MODELS[name](F64)
    xn = _data(rng, F64)
    lens = _lengths(rng)
    for lengths in (None, lens):
        _check(model, xn, _dask(xn), lengths, lengths, scheduler="threads")


def test_batch_first_and_plain_lstm(rng):
    model = LSTM(I, H, num_layers=2, batch_first=True, seed=4)
    xn = _data(rng, F32, batch_first=True)
    lens = _lengths(rng)
    yn = _check(model, xn, _dask(xn, batch_first=True), lens, _lazy_lengths(lens, "dask"),
                scheduler="threads")
    assert yn.shape == (B, T, H)
    assert np.all(yn[1, lens[1]:] == 0)        # after its length a sequence's output is 0


def test_bfloat16_model_bitwise(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = np.dtype(ml_dtypes.bfloat16)
    base = MODELS["lnlstm"](F32)
    if not hasattr(base, "to"):
        pytest.skip("fastln.rnn models have no .to(dtype) (bfloat16 models) yet")
    model = base.to(bf16)
    lens = _lengths(rng)
    for x_dtype in (bf16, F32):
        xn = _data(rng, x_dtype)
        for lengths in (None, lens):
            yn = _check(model, xn, _dask(xn), lengths, lengths, scheduler="threads")
            assert yn.dtype == bf16


def test_empty_batch_chunk(rng):
    model = MODELS["lngru"](F32)
    xn = _data(rng, F32)
    x = _dask(xn, (8, 0, 8))
    y = fd.rnn_forward(model, x)
    assert y.chunks[1] == (8, 0, 8)
    np.testing.assert_array_equal(y.compute(scheduler="threads"),
                                  model.forward(xn, cache=False)[0])


def test_is_lazy():
    """Neither x nor dask lengths is computed by rnn_forward itself."""
    def fail(block):
        raise AssertionError("computed eagerly")
    x = da.zeros((T, B, I), dtype=F32, chunks=(T, 8, I)).map_blocks(fail, dtype=F32)
    lens = da.ones(B, dtype=int, chunks=4).map_blocks(fail, dtype=int)
    y = fd.rnn_forward(MODELS["lnlstm"](F32), x, lens)
    assert y.shape == (T, B, H) and y.dtype == F32


def test_later_changes_to_the_model_do_not_reach_y(rng):
    model = MODELS["lngru"](F32)
    xn = _data(rng, F32)
    want = model.forward(xn, cache=False)[0]
    y = fd.rnn_forward(model, _dask(xn))
    model.params["weight_hh_l0"] *= 2                 # in place, after the call
    model.params["weight_ih_l0"] = np.zeros_like(model.params["weight_ih_l0"])
    np.testing.assert_array_equal(y.compute(scheduler="threads"), want)


def test_a_cache_for_backward_is_neither_shipped_nor_dropped(rng):
    model = MODELS["lnlstm"](F32)
    xn = _data(rng, F32)
    y0, _ = model.forward(xn)                         # cache=True: kept for backward
    graph = fd.rnn_forward(model, _dask(xn)).__dask_graph__()
    # the graph holds x and one copy of the parameters; the cache alone (about
    # 11 H values per sequence, step and layer) is larger than that
    assert len(pickle.dumps(dict(graph))) < xn.nbytes + 4 * sum(
        p.nbytes for p in model.params.values())
    dx, _ = model.backward(np.ones_like(y0))          # the model's cache is intact
    assert dx.shape == xn.shape


def test_rechunks_time_and_features_with_a_warning(rng):
    model = MODELS["lnlstm"](F32)
    xn = _data(rng, F32)
    x = da.from_array(xn, chunks=(3, CHUNKS, 4))
    with pytest.warns(fd.RechunkWarning, match=r"time or feature axis \(0, 2\)") as rec:
        y = fd.rnn_forward(model, x)
    assert rec[0].filename == __file__               # points at the caller
    assert y.chunks == ((T,), CHUNKS, (H,))
    np.testing.assert_array_equal(y.compute(scheduler="threads"),
                                  model.forward(xn, cache=False)[0])


def test_errors():
    model = MODELS["lnlstm"](F32)
    x = da.zeros((T, B, I), dtype=F32, chunks=(T, 8, I))
    with pytest.raises(TypeError, match=named("x")) as e:
        fd.rnn_forward(model, np.zeros((T, B, I), F32))
    assert "model.forward" in str(e.value)
    with pytest.raises(TypeError, match=named("model")):
        fd.rnn_forward(object(), x)
    with pytest.raises(TypeError, match=named("model")):
        fd.rnn_forward(fastln.LayerNorm(I), x)
    for bad in (da.zeros((T, B), dtype=F32), da.zeros((T, B, I + 1), dtype=F32),
                da.zeros((1, T, B, I), dtype=F32), da.zeros((0, B, I), dtype=F32),
                da.zeros((T, 0, I), dtype=F32)):
        with pytest.raises(ValueError, match=named("x")):
            fd.rnn_forward(model, bad)
    for bad_dtype in (F64, np.int32):
        with pytest.raises(TypeError, match=named("x")):
            fd.rnn_forward(model, x.astype(bad_dtype))
    unknown = x.transpose(1, 0, 2)[x[0, :, 0] == 0].transpose(1, 0, 2)   # B of unknown size
    assert np.isnan(unknown.shape[1])
    with pytest.raises(ValueError, match=named("x")):
        fd.rnn_forward(model, unknown)
    for bad in (np.ones(B - 1, int), np.ones((B, 1), int), da.ones(B + 1, dtype=int, chunks=4),
                da.ones((B, 2), dtype=int), np.zeros(B, int), np.full(B, T + 1)):
        with pytest.raises(ValueError, match=named("lengths")):
            fd.rnn_forward(model, x, bad)
    for bad in (np.ones(B), np.ones(B, bool), da.ones(B, chunks=4)):
        with pytest.raises(TypeError, match=named("lengths")):
            fd.rnn_forward(model, x, bad)


def test_docstring_example():
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    (test,) = doctest.DocTestFinder().find(fd.rnn_forward, "rnn_forward", globs={})
    assert test.examples
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


# ------------------------------------------------------------------ the model is shipped once

# how often a _Counted model was unpickled in this process (read on the workers)
_UNPICKLED = 0


class _Counted(LNLSTM):
    """An LNLSTM that counts its unpickling in the process that unpickles it."""

    def __setstate__(self, state):
        global _UNPICKLED
        _UNPICKLED += 1
        self.__dict__.update(state)


def _unpickled():
    return _UNPICKLED


def _reset():
    global _UNPICKLED
    _UNPICKLED = 0


def test_the_graph_holds_the_model_once(rng):
    model = _Counted(I, H, seed=5)
    x = _dask(_data(rng, F32), (2,) * 8)
    y = fd.rnn_forward(model, x, da.from_array(_lengths(rng), chunks=4))
    graph = dict(y.__dask_graph__())
    holders = []
    for key, task in graph.items():
        _reset()
        pickle.loads(pickle.dumps(task))              # each task as a scheduler sends it
        holders += [key] * _unpickled()
    assert len(holders) == 1, holders                 # one key holds the model, once
    blocks = [k for k in graph if isinstance(k, tuple) and k[0] == y.name]
    assert len(blocks) == 8
    assert all(holders[0] in graph[k].dependencies for k in blocks)
    # the key is the model's content: the same model gives the same key
    y2 = fd.rnn_forward(model, x)
    assert holders[0] in dict(y2.__dask_graph__())


# ------------------------------------------------------------------ dask.distributed



@pytest.mark.parametrize("name", MODELS)
def test_float32_bitwise_local_cluster(dask_client, name, rng):
    model = MODELS[name](F32)
    xn = _data(rng, F32)
    lens = _lengths(rng)
    for kind in (None, "dask"):
        lengths = None if kind is None else lens
        _check(model, xn, _dask(xn), lengths, _lazy_lengths(lengths, kind), client=dask_client)


def test_bfloat16_local_cluster(dask_client, rng):
    bf16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    base = MODELS["lnlstm_bidir"](F32)
    if not hasattr(base, "to"):
        pytest.skip("fastln.rnn models have no .to(dtype) (bfloat16 models) yet")
    model = base.to(bf16)
    xn = _data(rng, bf16)
    lens = _lengths(rng)
    yn = _check(model, xn, _dask(xn), lens, _lazy_lengths(lens, "dask"), client=dask_client)
    assert yn.dtype == bf16


def test_float64_local_cluster(dask_client, rng):
    model = MODELS["lngru"](F64)
    xn = _data(rng, F64)
    lens = _lengths(rng)
    _check(model, xn, _dask(xn), lens, lens, client=dask_client)


def test_each_worker_unpickles_the_model_at_most_once(dask_client, rng):
    workers = len(dask_client.scheduler_info()["workers"])
    assert workers == 2
    model = _Counted(I, H, seed=6)
    xn = _data(rng, F32)
    x = _dask(xn, (2,) * 8)
    lens = _lengths(rng)
    dask_client.run(_reset)
    y = fd.rnn_forward(model, x, lens)
    yn = dask_client.compute(y, sync=True)
    counts = dask_client.run(_unpickled)
    assert 1 <= sum(counts.values()) <= workers, counts
    assert max(counts.values()) <= 1, counts
    np.testing.assert_array_equal(yn, model.forward(xn, lengths=lens, cache=False)[0])
    # the counter sees a model that travels with every task: one per block
    dask_client.run(_reset)
    naive = x.map_blocks(lambda b, m: m.forward(b, cache=False)[0], model,
                         chunks=(T, x.chunks[1], H), dtype=F32, meta=np.empty((0, 0, 0), F32))
    dask_client.compute(naive, sync=True)
    assert sum(dask_client.run(_unpickled).values()) > workers
