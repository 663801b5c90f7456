"""The README's promises about layouts, checked on the general path (fastln/_layout.py).

- A forward with ``out=`` allocates nothing that grows with the input: inputs
  and outputs that are not C-contiguous rows of the kernel's dtype (Fortran
  order, reversed, byte-swapped, strided, 16-bit over a non-last axis) go
  through blocks of bounded scratch, and the blocks change no value.
- float16/bfloat16 results are the float32 kernels' results on the widened
  input (``x.astype(np.float32)``), rounded once: for every axis, the stats
  and the backward too.
- A CPU torch tensor is accepted as ``out=``: written through its memory; the
  result is the NumPy array that shares it.
"""
import tracemalloc

import numpy as np
import pytest

import fastln
from fastln import _layout

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
HALVES = [F16, BF16]
MiB = 1 << 20


def _same(got, want, what=""):
    got, want = tuple(np.atleast_1d(g) for g in got), tuple(np.atleast_1d(w) for w in want)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, (what, i, g.dtype, w.dtype)
        assert np.ascontiguousarray(g).tobytes() == np.ascontiguousarray(w).tobytes(), (what, i)


def _peak(f):
    """The most bytes traced (NumPy's allocations included) above the start while f runs."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        f()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def _layouts(base):
    """(name, array) views of base's values in other layouts."""
    yield "C", base
    yield "F", np.asfortranarray(base)
    yield "reversed", base[::-1, ..., ::-1]
    if base.dtype != BF16:
        yield "byteswapped", base.astype(base.dtype.newbyteorder(">"))
    yield "strided", np.repeat(base, 2, axis=-1)[..., ::2]
    yield "permuted", np.moveaxis(np.ascontiguousarray(np.moveaxis(base, 0, -1)), -1, 0)
    raw = np.empty(base.nbytes + 1, np.uint8)[1:]        # unaligned (for 2+ byte types)
    un = raw.view(base.dtype).reshape(base.shape)
    un[...] = base
    yield "unaligned", un


# ---- 1. bounded scratch -----------------------------------------------------

BOUND = 4 * _layout.BLOCK_BYTES + MiB    # four scattered or gathered arrays, and slack


@pytest.fixture(scope="module")
def memory_cases():
    """name: (forward writing its y into out, an out), inputs of 32 MiB (x's bytes)."""
    rng = np.random.default_rng(0)
    rows = 32 * MiB // 4 // 512
    xc = rng.standard_normal((rows, 512), F32)
    xf = np.asfortranarray(xc)
    swapped = xc.astype(">f4")
    x16 = rng.standard_normal((16, 64, 2048), F32).astype(F16)      # (N, C, S), 4 MiB a sample
    xb16 = x16.astype(BF16)
    x3 = rng.standard_normal((8, 64, rows // 8 * 512 // 64), F32)
    s_out = np.empty_like(xf)
    return {
        "fortran": (lambda o: fastln.layer_norm(xf, out=o), np.empty_like(xc)),
        "fortran_rms": (lambda o: fastln.rms_norm(xf, out=o), np.empty_like(xc)),
        "fortran_into_fortran": (lambda o: fastln.layer_norm(xf, out=o), np.empty_like(xf)),
        "reversed": (lambda o: fastln.layer_norm(xc[::-1, ::-1], out=o), np.empty_like(xc)),
        "byteswapped": (lambda o: fastln.rms_norm(swapped, out=o), np.empty_like(xc)),
        "f16_channels": (lambda o: fastln.layer_norm(x16, axis=1, out=o), np.empty_like(x16)),
        "bf16_channels_rms": (lambda o: fastln.rms_norm(xb16, axis=1, out=o),
                              np.empty_like(xb16)),
        "f16_axis0_fortran": (lambda o: fastln.layer_norm(x16, axis=0, out=o),
                              np.asfortranarray(np.empty_like(x16))),
        "f32_channels_into_fortran": (lambda o: fastln.layer_norm(x3, axis=1, out=o),
                                      np.asfortranarray(np.empty_like(x3))),
        "add_fortran": (lambda o: fastln.add_layer_norm(xf, xf[::-1], out=(o, s_out)),
                        np.empty_like(xf)),
        "add_rms_broadcast": (lambda o: fastln.add_rms_norm(xf, xf[:1, ::-1], out=(o, s_out)),
                              np.empty_like(xf)),
    }


@pytest.mark.parametrize("case", ["fortran", "fortran_rms", "fortran_into_fortran", "reversed",
                                  "byteswapped", "f16_channels", "bf16_channels_rms",
                                  "f16_axis0_fortran", "f32_channels_into_fortran",
                                  "add_fortran", "add_rms_broadcast"])
def test_forward_with_out_allocates_a_bounded_scratch(memory_cases, case):
    f, out = memory_cases[case]
    want = f(np.empty_like(out))      # the values, and any first-call allocations
    peak = _peak(lambda: f(out))
    assert peak < BOUND, f"{case}: {peak / MiB:.1f} MiB traced, bound {BOUND / MiB:.1f} MiB"
    _same([out], [want if not isinstance(want, tuple) else want[0]])


# ---- 1. the blocks change no value -------------------------------------------

def _calls(x, axis):
    """Every forward of the general path on x over axis, with fresh and given
    outputs: a list of (name, thunk returning a tuple of arrays)."""
    axes = (axis,) if isinstance(axis, int) else axis
    nshape = tuple(x.shape[a] for a in axes)
    w = np.linspace(0.5, 1.5, int(np.prod(nshape))).reshape(nshape)
    b = np.linspace(-1, 1, int(np.prod(nshape))).reshape(nshape)
    y0 = fastln.layer_norm(x, axis=axis)
    res = (x * 0.5).astype(y0.dtype) if x.dtype.kind != "i" else x // 2
    batch = [a for a in range(x.ndim) if a % x.ndim not in [c % x.ndim for c in axes]]
    rb = res[:1] if batch and batch[0] == 0 else res     # broadcast over axis 0 where batch

    def with_out(f, order):
        def g():
            o = np.empty(y0.shape, y0.dtype, order=order)
            r = f(o)
            return (o,) + (tuple(r[1:]) if isinstance(r, tuple) else ())
        return g
    return [
        ("ln", lambda: fastln.layer_norm(x, w, b, axis=axis, return_stats=True)),
        ("rms", lambda: fastln.rms_norm(x, w, axis=axis, return_stats=True)),
        ("ln_outF", with_out(lambda o: fastln.layer_norm(x, w, b, axis=axis, out=o,
                                                         return_stats=True), "F")),
        ("rms_outC", with_out(lambda o: fastln.rms_norm(x, w, axis=axis, out=o), "C")),
        ("add", lambda: fastln.add_layer_norm(x, res, w, b, input_bias=b, axis=axis,
                                              return_stats=True)),
        ("add_bc", lambda: fastln.add_rms_norm(x, rb, w, axis=axis, return_stats=True)),
        ("add_outF", with_out(lambda o: fastln.add_layer_norm(
            x, rb, w, b, axis=axis, out=(o, np.empty(y0.shape, y0.dtype, order="F"))), "F")),
    ]


def _blocked_cases():
    """(name, x, axis, block bytes): blocks of whole samples and runs of positions
    (channels first), of one row and of several (rows)."""
    rng = np.random.default_rng(2)
    for shape, block in [((6, 5, 33), 1000), ((3, 40, 17), 100)]:
        raw = rng.standard_normal(shape) * 3 + 1
        for dt in [F32, F64, F16, BF16, np.dtype(np.int32)]:
            base = (raw * (10 if dt.kind == "i" else 1)).astype(dt)
            for lname, x in _layouts(base):
                for axis in [-1, 0, 1, (0, 2), (2, 0)]:
                    yield f"{shape}-{dt}-{lname}-{axis}", x, axis, block


def test_blocks_change_no_value(isa, monkeypatch):
    """The same calls in one block (scratch of the whole input, as before
    blocks) and in blocks of a row or a few: bitwise the same."""
    n = 0
    for name, x, axis, block in _blocked_cases():
        monkeypatch.setattr(_layout, "BLOCK_BYTES", 1 << 60)
        whole = [(k, f()) for k, f in _calls(x, axis)]
        monkeypatch.setattr(_layout, "BLOCK_BYTES", block)
        for (k, f), (_, want) in zip(_calls(x, axis), whole):
            got = f()
            try:
                _same(got if isinstance(got, tuple) else (got,),
                      want if isinstance(want, tuple) else (want,))
            except AssertionError as e:
                raise AssertionError(f"{name} {k}: {e}") from None
            n += 1
    assert n > 500


def test_rows_are_those_of_the_contiguous_fast_path(isa, monkeypatch):
    """The general path's rows, blocked, equal the fast path's on a C-contiguous copy."""
    monkeypatch.setattr(_layout, "BLOCK_BYTES", 700)
    rng = np.random.default_rng(3)
    for dt in [F32, F64, F16, BF16]:
        base = rng.standard_normal((7, 9, 24)).astype(dt)
        for _, x in _layouts(base):
            for axis in [-1, (0, 2), (2, 1)]:
                axes = (axis,) if isinstance(axis, int) else axis
                moved = np.moveaxis(x, axes, range(3 - len(axes), 3))
                rows = np.ascontiguousarray(moved, dt.newbyteorder("="))
                rows = rows.reshape(-1, int(np.prod([x.shape[a] for a in axes])))
                want = fastln.layer_norm(rows, return_stats=True)
                got = fastln.layer_norm(x, axis=axis, return_stats=True)
                _same([np.ascontiguousarray(np.moveaxis(got[0], axes, range(3 - len(axes), 3)))
                       .reshape(rows.shape), got[1].reshape(-1), got[2].reshape(-1)], want)


def test_out_aliasing_an_input(monkeypatch):
    """out= x itself (any layout) is in place; an out that overlaps x otherwise
    still gives the values of a separate out."""
    monkeypatch.setattr(_layout, "BLOCK_BYTES", 256)
    rng = np.random.default_rng(4)
    base = rng.standard_normal((40, 24), F32)
    for lname, x in _layouts(base):
        if not x.dtype.isnative or lname == "unaligned":
            continue
        xi = x.copy(order="K")
        want = fastln.layer_norm(xi, axis=0)
        assert fastln.layer_norm(xi, axis=0, out=xi) is xi
        _same([xi], [want], lname)
    sq = rng.standard_normal((32, 32), F32)
    want = fastln.layer_norm(sq)
    a = sq.copy()
    fastln.layer_norm(a, out=a.T.T[::-1][::-1])     # the same view
    _same([a], [want])
    a = sq.copy()
    fastln.layer_norm(a.T, out=a)                  # overlapping, transposed
    _same([a], [fastln.layer_norm(sq.T.copy())])


# ---- 2. 16-bit == the float32 call on the widening, rounded once -----------------------

def _half_layouts(base):
    for name, x in _layouts(base):
        if name != "unaligned" or base.ndim > 1:
            yield name, x


@pytest.mark.parametrize("dt", HALVES, ids=["f16", "bf16"])
def test_half_is_float32_on_the_widening(isa, dt):
    rng = np.random.default_rng(5)
    for shape in [(300, 500), (4, 6, 5, 7), (2, 3, 64, 9)]:
        base = (rng.standard_normal(shape) * 2 + 0.5).astype(dt)
        dy_base = rng.standard_normal(shape).astype(dt)
        axes = list(range(len(shape))) + [(0, 2), (1, len(shape) - 1), (len(shape) - 1, 0)]
        for lname, x in _half_layouts(base):
            assert _layout.c_ordered(x) == x.astype(F32).flags.c_contiguous, lname
            dy = dy_base if lname == "C" else np.asfortranarray(dy_base)
            for axis in axes:
                if shape == (300, 500) and not isinstance(axis, int):
                    continue
                x32, dy32 = x.astype(F32), dy.astype(F32)
                what = f"{shape} {lname} axis={axis}"
                y, m, r = fastln.layer_norm(x, axis=axis, return_stats=True)
                y32, m32, r32 = fastln.layer_norm(x32, axis=axis, return_stats=True)
                _same([y, m, r], [y32.astype(dt), m32, r32], what)
                yr, rr = fastln.rms_norm(x, axis=axis, return_stats=True)
                yr32, rr32 = fastln.rms_norm(x32, axis=axis, return_stats=True)
                _same([yr, rr], [yr32.astype(dt), rr32], what)
                dx, dw, db = fastln.layer_norm_backward(dy, x, m, r, axis=axis)
                dx32, dw32, db32 = fastln.layer_norm_backward(dy32, x32, m32, r32, axis=axis)
                _same([dx, dw, db], [dx32.astype(dt), dw32, db32], what)
                dx, dw = fastln.rms_norm_backward(dy, x, rr, axis=axis)
                dx32, dw32 = fastln.rms_norm_backward(dy32, x32, rr32, axis=axis)
                _same([dx, dw], [dx32.astype(dt), dw32], what)


def test_half_layer_norm_axis0_means():
    """The case that failed: (300, 500) over axis 0, its 500 means."""
    x = np.random.default_rng(6).standard_normal((300, 500)).astype(F16)
    _, m, _ = fastln.layer_norm(x, axis=0, return_stats=True)
    _, m32, _ = fastln.layer_norm(x.astype(F32), axis=0, return_stats=True)
    assert m.tobytes() == m32.tobytes()


def test_half_with_out_into_any_layout(monkeypatch):
    monkeypatch.setattr(_layout, "BLOCK_BYTES", 512)
    x = np.random.default_rng(7).standard_normal((5, 16, 40)).astype(F16)
    want = fastln.layer_norm(x.astype(F32), axis=1).astype(F16)
    for order in "CF":
        o = np.empty(x.shape, F16, order=order)
        assert fastln.layer_norm(x, axis=1, out=o) is o
        _same([o], [want])


# ---- 3. torch tensors as out= ---------------------------------------------------------

def test_torch_out(torch):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((6, 10)).astype(F32)
    t = torch.from_numpy(x.copy())
    o = torch.empty(6, 10)
    y = fastln.layer_norm(t, out=o)
    assert isinstance(y, np.ndarray) and np.shares_memory(y, o.numpy())
    _same([o.numpy()], [fastln.layer_norm(x)])
    o = torch.empty(6, 10)
    y, rstd = fastln.rms_norm(x, out=o, return_stats=True)
    _same([o.numpy()], [fastln.rms_norm(x)])
    of = torch.empty(10, 6).T                              # a non-contiguous tensor
    fastln.layer_norm(x, axis=0, out=of)
    _same([np.ascontiguousarray(of.numpy())], [fastln.layer_norm(x, axis=0)])
    fastln.layer_norm(t, out=t)                            # in place
    _same([t.numpy()], [fastln.layer_norm(x)])
    y, mean, rstd = fastln.layer_norm(x, return_stats=True)
    dy = rng.standard_normal(x.shape).astype(F32)
    o = torch.empty(6, 10)
    fastln.layer_norm_backward(dy, x, mean, rstd, out=o)
    _same([o.numpy()], [fastln.layer_norm_backward(dy, x, mean, rstd)[0]])
    oy, os_ = torch.empty(6, 10), torch.empty(6, 10)
    ry, rs = fastln.add_layer_norm(x, x, out=(oy, os_))
    assert np.shares_memory(ry, oy.numpy()) and np.shares_memory(rs, os_.numpy())
    _same([oy.numpy(), os_.numpy()], list(fastln.add_layer_norm(x, x)))
    o = torch.empty(6, 10)
    fastln.add_rms_norm(x, x, out=o)
    _same([o.numpy()], [fastln.add_rms_norm(x, x)[0]])


def test_torch_out_bfloat16(torch):
    x = np.random.default_rng(9).standard_normal((4, 32)).astype(BF16)
    o = torch.empty(4, 32, dtype=torch.bfloat16)
    y = fastln.layer_norm(x, out=o)
    assert y.dtype == BF16 and np.shares_memory(y, o.view(torch.int16).numpy())
    _same([o.view(torch.int16).numpy().view(BF16)], [fastln.layer_norm(x)])


def test_torch_out_that_requires_grad_is_refused(torch):
    x = np.ones((2, 3), F32)
    o = torch.empty(2, 3, requires_grad=True)
    for call in (lambda: fastln.layer_norm(x, out=o), lambda: fastln.rms_norm(x, out=o),
                 lambda: fastln.add_layer_norm(x, x, out=(torch.empty(2, 3), o))):
        with pytest.raises(TypeError, match=r"out(\[1\])? is a torch tensor that requires grad"):
            call()
