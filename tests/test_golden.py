"""Golden outputs: the exact bytes of a fixed matrix of calls, hashed.

Every public kernel (LayerNorm, RMSNorm and add + LayerNorm, forward and
backward) runs on float32, float64, float16 and bfloat16 rows of many widths
and row counts, the streamed sizes among them, on every instruction-set path
this CPU supports and on 1 and 2 threads; the recurrent cells run forward and
backward. The SHA-256 of each call's outputs must equal the one recorded in
``golden.json``. A change to the kernels that moves a single bit fails here,
so a refactor proves it changed nothing, and a deliberate change of results
regenerates the file in a commit of its own that says why:

    python tests/test_golden.py            # rewrite tests/golden.json

The hashes are those of an x86-64 build with GCC; elsewhere (another
architecture contracts multiplies and adds differently) the test is skipped.
No hash depends on a BLAS library: the recurrent engine computes its products
itself, so the same hashes hold whichever kernel OpenBLAS would pick for the
CPU (CI runs the recurrent hashes under several OPENBLAS_CORETYPE values).
"""
import hashlib
import json
import os
import platform
import sys

import numpy as np
import pytest

import fastln
from fastln import rnn

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden.json")

WIDTHS = (1, 7, 16, 64, 128, 256, 300, 768, 1024, 4099)
ROWS = (1, 17, 300)
# (H, output MiB): sizes past each streaming point of the forwards and backwards
STREAMED = ((64, 5), (64, 17), (1024, 9), (1024, 33))
FUNCTIONS = ("layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward",
             "add_layer_norm")
THREADS = (1, 2)


def _dtypes():
    import ml_dtypes
    return {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
            "float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


def _digest(arrays):
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.view(np.uint8))   # the array's own bytes, not a copy
    return h.hexdigest()[:24]


def _cases():
    """(name, function, dtype name, H, N, with_weight)."""
    out = []
    for fn in FUNCTIONS:
        for dt in ("float32", "float64", "float16", "bfloat16"):
            for H in WIDTHS:
                for N in ROWS:
                    out.append((fn, dt, H, N, True))
            for H in (16, 300):
                out.append((fn, dt, H, 17, False))
            item = 8 if dt == "float64" else 4 if dt == "float32" else 2
            for H, mib in STREAMED:
                out.append((fn, dt, H, mib * 2**20 // (H * item) + 3, True))
    return out


def _case_name(fn, dt, H, N, weighted):
    return f"{fn}/{dt}/H{H}/N{N}" + ("" if weighted else "/noweight")


class _Inputs:
    """The inputs of one (dtype, H, N, weighted) case, made once and reused."""

    def __init__(self, dt, H, N, weighted):
        dtype = _dtypes()[dt]
        stats = np.float64 if dt == "float64" else np.float32
        param = stats
        rng = np.random.default_rng([H, N, len(dt)])
        x64 = 3.0 + 2.0 * rng.standard_normal((N, H))
        self.x = x64.astype(dtype)
        self.res = rng.standard_normal((N, H)).astype(dtype)
        self.dy = rng.standard_normal((N, H)).astype(dtype)
        self.w = (1.0 + 0.5 * rng.standard_normal(H)).astype(param) if weighted else None
        self.b = (0.5 * rng.standard_normal(H)).astype(param) if weighted else None
        xs = self.x.astype(np.float64)
        mean = xs.mean(axis=1)
        self.mean = mean.astype(stats)
        self.rstd = (1.0 / np.sqrt(((xs - mean[:, None]) ** 2).mean(axis=1) + 1e-5)).astype(stats)
        self.rrstd = (1.0 / np.sqrt((xs ** 2).mean(axis=1) + 1e-6)).astype(stats)


def _call(fn, a):
    if fn == "layer_norm":
        return fastln.layer_norm(a.x, a.w, a.b, return_stats=True)
    if fn == "layer_norm_backward":
        return fastln.layer_norm_backward(a.dy, a.x, a.mean, a.rstd, a.w)
    if fn == "rms_norm":
        return fastln.rms_norm(a.x, a.w, return_stats=True)
    if fn == "rms_norm_backward":
        return fastln.rms_norm_backward(a.dy, a.x, a.rrstd, a.w)
    return fastln.add_layer_norm(a.x, a.res, a.w, a.b, return_stats=True)


def _kernel_digests(isas):
    """{case name: {isa: digest}}; raises if 1 and 2 threads disagree."""
    result = {}
    groups = {}
    for case in _cases():
        groups.setdefault(case[1:], []).append(case[0])
    before = fastln.get_isa()
    try:
        for (dt, H, N, weighted), fns in groups.items():
            a = _Inputs(dt, H, N, weighted)
            for fn in fns:
                name = _case_name(fn, dt, H, N, weighted)
                result[name] = {}
                for isa in isas:
                    fastln._lib._set_isa(isa)
                    seen = set()
                    for nt in THREADS:
                        with fastln.threads(nt):
                            seen.add(_digest(_call(fn, a)))
                    assert len(seen) == 1, f"{name} on {isa}: 1 and 2 threads differ"
                    result[name][isa] = seen.pop()
            del a
    finally:
        fastln._lib._set_isa(before)
    return result


RNN_MODELS = ("LNLSTM", "LNGRU", "LNRNN", "LSTM", "RNN")
# (T, B, I, H, num_layers, with lengths)
RNN_SHAPES = ((6, 3, 5, 16, 1, False), (5, 4, 7, 33, 2, True), (3, 2, 9, 130, 1, True))


def _rnn_digest(model, dtype, T, B, I, H, layers, with_lengths):
    m = getattr(rnn, model)(I, H, num_layers=layers, dtype=dtype, seed=7)
    rng = np.random.default_rng([T, B, I, H])
    for k in sorted(m.params):   # non-trivial LN gains and biases
        p = m.params[k]
        p[...] = p + 0.1 * rng.standard_normal(p.shape).astype(dtype)
    x = rng.standard_normal((T, B, I)).astype(dtype)
    lengths = None
    if with_lengths:
        lengths = np.maximum(1, T - np.arange(B) % T)
    y, state = m.forward(x, lengths=lengths)
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx, dstate = m.backward(dy)
    states = state if isinstance(state, tuple) else (state,)
    dstates = dstate if isinstance(dstate, tuple) else (dstate,)
    grads = [m.grads[k] for k in sorted(m.grads)]
    return _digest([y, *states, dx, *dstates, *grads])


def _rnn_digests(isas):
    result = {}
    before = fastln.get_isa()
    try:
        for model in RNN_MODELS:
            for dtype in (np.float32, np.float64):
                for shape in RNN_SHAPES:
                    name = f"rnn/{model}/{np.dtype(dtype).name}/" + "x".join(map(str, shape))
                    result[name] = {}
                    for isa in isas:
                        fastln._lib._set_isa(isa)
                        seen = set()
                        for nt in THREADS:
                            with fastln.threads(nt):
                                seen.add(_rnn_digest(model, dtype, *shape))
                        assert len(seen) == 1, f"{name} on {isa}: 1 and 2 threads differ"
                        result[name][isa] = seen.pop()
    finally:
        fastln._lib._set_isa(before)
    return result


def _load():
    with open(GOLDEN) as f:
        return json.load(f)


requires_x86 = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                  reason="golden hashes are those of an x86-64 build")


def _compare(got, want):
    bad = [f"{name} [{isa}]" for name, by_isa in got.items() for isa, h in by_isa.items()
           if want.get(name, {}).get(isa) != h]
    missing = [name for name in got if name not in want]
    assert not missing, f"cases without a golden hash: {missing[:5]}"
    assert not bad, f"{len(bad)} outputs changed, e.g. {bad[:8]}"


@requires_x86
def test_kernels_match_golden_hashes():
    want = _load()["kernels"]
    _compare(_kernel_digests(fastln.supported_isas()), want)


@requires_x86
def test_rnn_matches_golden_hashes():
    _compare(_rnn_digests(fastln.supported_isas()), _load()["rnn"])


def test_golden_covers_every_path():
    """The file records every case on all three paths (x86-64, AVX-512)."""
    golden = _load()
    assert set(golden["kernels"]) == {_case_name(*c) for c in _cases()}
    for section in ("kernels", "rnn"):
        for name, by_isa in golden[section].items():
            assert set(by_isa) == {"avx512", "avx2", "generic"}, name


if __name__ == "__main__":
    isas = fastln.supported_isas()
    if set(isas) != {"avx512", "avx2", "generic"}:
        sys.exit("regenerate on a CPU that runs every path (AVX-512 too)")
    data = {"kernels": _kernel_digests(isas), "rnn": _rnn_digests(isas)}
    with open(GOLDEN, "w") as f:
        json.dump(data, f, indent=0, sort_keys=True)
        f.write("\n")
    print(f"wrote {GOLDEN}: {len(data['kernels'])} kernel cases, {len(data['rnn'])} rnn cases")
