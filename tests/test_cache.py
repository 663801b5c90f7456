"""The cache of large outputs (fastln._memory, src_c/runtime/pool.c).

Outputs of 4 MiB or more that fastln allocates come from blocks earlier
outputs gave back: the tests check that a freed block is taken again, that
the results are those of fresh memory and of ``out=`` bitwise, that memory
an array (or a view of it) still uses is never handed out, that NumPy's
resize works on such arrays, that the limit holds, and the argument errors.
"""
import os
import subprocess
import sys
import threading

import ml_dtypes
import numpy as np
import pytest

import fastln

MiB = 1 << 20
H = 512
N = 8 * MiB // (4 * H)          # float32 rows of 8 MiB


@pytest.fixture(autouse=True)
def fresh_cache():
    """Each test starts with an empty cache at the default limit, and leaves
    the limit as it found it."""
    limit = fastln.cache_info().limit
    fastln.set_cache_limit(1 << 30)
    fastln.empty_cache()
    yield
    fastln.set_cache_limit(limit)


def _x(rng, n=N, h=H, dtype=np.float32):
    return (rng.standard_normal((n, h)) * 3 + 1).astype(dtype)


@pytest.fixture(scope="module")
def calls():
    """(name, function returning the outputs) for every function's fast path
    and two of the general path's; the inputs made once for all the cases."""
    rng = np.random.default_rng(20240607)
    x, dy, res = _x(rng), _x(rng), _x(rng)
    w = rng.standard_normal(H).astype(np.float32)
    b = rng.standard_normal(H).astype(np.float32)
    _, mean, rstd = fastln.layer_norm(x, w, b, return_stats=True)
    _, r = fastln.rms_norm(x, w, return_stats=True)
    xd = x.astype(np.float64)[: N // 2]
    xh = x.astype(np.float16)
    xb = x.astype(ml_dtypes.bfloat16)
    xf = np.asfortranarray(x)
    return [
        ("layer_norm", lambda: (fastln.layer_norm(x, w, b),)),
        ("layer_norm float64", lambda: (fastln.layer_norm(xd),)),
        ("layer_norm float16", lambda: (fastln.layer_norm(xh, w, b),)),
        ("layer_norm bfloat16", lambda: (fastln.layer_norm(xb, w, b),)),
        ("layer_norm Fortran order (fastln._general)", lambda: (fastln.layer_norm(xf, w, b),)),
        ("layer_norm axis 0 (fastln._general)", lambda: (fastln.layer_norm(x, axis=0),)),
        ("layer_norm_backward", lambda: fastln.layer_norm_backward(dy, x, mean, rstd, w)),
        ("rms_norm", lambda: (fastln.rms_norm(x, w),)),
        ("rms_norm_backward", lambda: fastln.rms_norm_backward(dy, x, r, w)),
        ("add_layer_norm", lambda: fastln.add_layer_norm(x, res, w, b)),
    ]


@pytest.mark.parametrize("k", range(10))
def test_results_are_those_of_fresh_memory(calls, k):
    name, call = calls[k]
    fastln.set_cache_limit(0)
    fresh = [a.copy() for a in call()]
    fastln.set_cache_limit(1 << 30)
    first = call()
    del first                    # its large outputs go to the cache
    hits = fastln.cache_info().hits
    again = call()
    big = [a for a in again if a.nbytes >= 4 * MiB]
    assert big, name
    assert fastln.cache_info().hits - hits == len(big), name
    for a, f in zip(again, fresh):
        assert a.flags.writeable and (a.flags.owndata or a.base.flags.owndata)   # _general: a view
        assert a.dtype == f.dtype and a.shape == f.shape
        np.testing.assert_array_equal(a, f, err_msg=name)


def test_a_freed_block_is_taken_again_and_out_agrees(rng):
    x = _x(rng)
    y = fastln.layer_norm(x)
    address = y.ctypes.data
    del y
    y = fastln.layer_norm(x)
    assert y.ctypes.data == address and y.flags.owndata and y.flags.c_contiguous
    out = np.empty_like(x)
    np.testing.assert_array_equal(y, fastln.layer_norm(x, out=out))
    info = fastln.cache_info()
    assert info.hits >= 1 and info.bytes == 0 and info.blocks == 0


def test_memory_in_use_is_never_handed_out(rng):
    """A view keeps its array's block: later outputs get other memory, and
    the view's values stay."""
    x = _x(rng)
    y = fastln.layer_norm(x)
    view = y[N // 2:]
    kept = view.copy()
    del y
    assert fastln.cache_info().blocks == 0
    z = [fastln.layer_norm(x * k) for k in range(1, 4)]
    for a in z:
        assert not np.shares_memory(a, view)
    np.testing.assert_array_equal(view, kept)
    del view
    assert fastln.cache_info().blocks == 1


def test_small_and_stats_outputs_bypass_the_cache(rng):
    x = _x(rng, n=1024)          # 2 MiB
    before = fastln.cache_info()
    for _ in range(3):
        y, mean, rstd = fastln.layer_norm(x, return_stats=True)
        del y, mean, rstd
    after = fastln.cache_info()
    assert (after.hits, after.misses, after.bytes) == (before.hits, before.misses, 0)


def test_numpy_resize_of_a_cached_array(rng):
    """NumPy reallocates through the cache's allocator: the values kept, the
    new part writable, the old block given back."""
    x = _x(rng)
    y = fastln.layer_norm(x)
    ref = y.copy()
    y.resize((2 * N, H), refcheck=False)
    np.testing.assert_array_equal(y[:N], ref)
    y[N:] = 7
    assert fastln.cache_info().blocks == 1       # the old 8 MiB block
    y.resize((N // 4, H), refcheck=False)        # shrinks into a new block
    np.testing.assert_array_equal(y, ref[:N // 4])
    del y
    assert fastln.cache_info().blocks == 2


def test_limit_and_eviction(rng):
    x = _x(rng)
    ys = [fastln.layer_norm(x) for _ in range(3)]
    block = ys[0].nbytes          # a multiple of the page: the block's size
    fastln.set_cache_limit(2 * block + block // 2)
    del ys                        # the third block does not fit: the oldest goes
    info = fastln.cache_info()
    assert info.blocks == 2 and info.bytes == 2 * block
    fastln.set_cache_limit(block)
    assert fastln.cache_info().blocks == 1
    fastln.set_cache_limit(block - 1)             # too small for any block
    assert fastln.cache_info().bytes == 0
    y = fastln.layer_norm(x)
    del y
    assert fastln.cache_info().bytes == 0
    fastln.set_cache_limit(1 << 30)
    many = [fastln.layer_norm(x) for _ in range(12)]
    del many
    assert fastln.cache_info().blocks == 8        # at most 8 blocks
    fastln.empty_cache()
    assert fastln.cache_info()[3:] == (0, 0)


def test_sizes_reuse_within_an_eighth(rng):
    x = _x(rng)
    y = fastln.layer_norm(x)
    del y
    hits = fastln.cache_info().hits
    smaller = fastln.layer_norm(x[: N * 9 // 10])  # the block is under 1/8 larger: taken
    assert fastln.cache_info().hits == hits + 1
    del smaller
    half = fastln.layer_norm(x[: N // 2])          # twice its size: a new block
    assert fastln.cache_info().hits == hits + 1
    del half


def test_concurrent_calls(rng):
    """8 threads allocating and dropping outputs of two sizes at once give the
    serial results bitwise."""
    xs = [_x(rng), _x(rng, n=N // 2 + 3)]
    want = [fastln.layer_norm(x) for x in xs]
    errors = []

    def work(t):
        try:
            for i in range(30):
                k = (t + i) % 2
                y = fastln.layer_norm(xs[k])
                if not np.array_equal(y, want[k]):
                    errors.append((t, i))
        except Exception as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    info = fastln.cache_info()
    assert info.bytes <= info.limit and info.blocks <= 8


@pytest.mark.parametrize("bad, err", [("1", TypeError), (True, TypeError), (1.5, TypeError),
                                      (None, TypeError), (-1, ValueError)])
def test_set_cache_limit_errors(bad, err):
    with pytest.raises(err, match="nbytes"):
        fastln.set_cache_limit(bad)
    assert fastln.cache_info().limit == 1 << 30


def _in_subprocess(code, **env):
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, **env))
    assert run.returncode == 0, run.stderr
    return run


def test_environment_variable():
    code = "import fastln; print(fastln.cache_info().limit)"
    # the three children start together: each spends its time importing fastln
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, FASTLN_CACHE_LIMIT=value))
             for value in ("0", "123456", "lots")]
    runs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        runs.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    assert runs[0].stdout.split() == ["0"]
    assert runs[1].stdout.split() == ["123456"]
    run = runs[2]
    assert run.stdout.split() == [str(1 << 30)]
    assert "FASTLN_CACHE_LIMIT='lots'" in run.stderr and "RuntimeWarning" in run.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_forked_child_uses_the_cache():
    code = """if True:
        import os, numpy as np, fastln
        x = np.ones((4096, 512), np.float32)
        y = fastln.layer_norm(x); del y          # a kept block, inherited by the child
        pid = os.fork()
        if pid == 0:
            y = fastln.layer_norm(x)
            ok = fastln.cache_info().hits >= 1 and np.array_equal(y, fastln.layer_norm(x))
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
        """
    _in_subprocess(code)
