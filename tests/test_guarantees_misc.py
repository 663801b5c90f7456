"""README promises checked as they are worded: one size grammar for
FASTLN_CACHE_LIMIT and the FASTLN_L*_BYTES variables, FASTLN_ISA in any
case, flags that take bools, the layers' state_dict and meta-device errors,
the agreement of the instruction-set paths (kernels and RNN engine), and
what a NaN or inf does to its row."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import fastln
from fastln import _lib
from fastln.rnn import LNGRU, LNLSTM, LNRNN, LSTM

from _util import named

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

# ---------------------------------------------------------------- sizes

GOOD_SIZES = [
    ("0", 0), ("1", 1), ("4096", 4096), ("33554432", 32 * MiB), ("0048K", 48 * KiB),
    ("48K", 48 * KiB), ("48k", 48 * KiB), ("48KB", 48 * KiB), ("48kb", 48 * KiB),
    ("48KiB", 48 * KiB), ("48kIb", 48 * KiB), ("32M", 32 * MiB), ("32m", 32 * MiB),
    ("32MB", 32 * MiB), ("32MiB", 32 * MiB), ("32mib", 32 * MiB), ("1G", GiB), ("1g", GiB),
    ("1GB", GiB), ("1GiB", GiB), ("3gib", 3 * GiB), ("4096B", 4096), ("4096b", 4096),
    (" 32M", 32 * MiB), ("32M ", 32 * MiB), ("\t1G\n", GiB), ("  2048K  ", 2 * MiB),
    ("1048576G", 1 << 50), ("1125899906842624", 1 << 50),
]
BAD_SIZES = [
    "", " ", "\t", "M", "B", "KB", "iB", "-1", "+1", "-0", "1.5M", "3.", "1e6", "0x100",
    "1_000", "32 M", "3 2M", "32Mi", "32MiBB", "32BB", "32iB", "32KiB!", "1T", "2P", "1PiB",
    "1048577G", "1125899906842625", "99999999999999999999999999", "lots", "inf", "nan",
    "32X", "\u0663\u0662M", "32M\u00a0", "\u00a032M",
]


def _run(code, env, *args):
    run = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    return run


@pytest.mark.parametrize("text,value", GOOD_SIZES, ids=repr)
def test_parse_bytes_accepts(text, value):
    assert _lib._parse_bytes(text) == value
    assert _lib._parse_cache_bytes(text) == (value or None)   # a cache size is >= 1


@pytest.mark.parametrize("text", BAD_SIZES + ["32M\0", "\0", None, 32, b"32M"], ids=repr)
def test_parse_bytes_rejects(text):
    assert _lib._parse_bytes(text) is None
    assert _lib._parse_cache_bytes(text) is None


_BOTH_PATHS = r"""
import json, os, sys, warnings
import fastln
from fastln import _lib, _memory
base = _lib._cache_sizes()["l2"]
out = []
for s in json.loads(sys.argv[1]):
    os.environ["FASTLN_CACHE_LIMIT"] = s   # os.environ puts it in the C environment too
    os.environ["FASTLN_L2_BYTES"] = s
    fastln.set_cache_limit(12345)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _memory._limit_from_env()          # Python reads FASTLN_CACHE_LIMIT
    _lib._set_cache_sizes()               # C's getenv reads FASTLN_L2_BYTES again
    out.append([fastln.cache_info().limit, _lib._cache_sizes()["l2"], len(caught)])
print(json.dumps({"base": base, "out": out}))
"""


def test_cache_limit_and_cache_sizes_read_one_grammar():
    """The same strings through both readers: FASTLN_CACHE_LIMIT (Python, at
    import) and FASTLN_L2_BYTES (C's getenv in policy.c) accept the same
    ones with the same values; 0 is a limit but not a cache size."""
    cases = GOOD_SIZES + [(s, None) for s in BAD_SIZES]
    env = {k: v for k, v in os.environ.items()
           if k not in ("FASTLN_CACHE_LIMIT", "FASTLN_L2_BYTES")}
    res = json.loads(_run(_BOTH_PATHS, env, json.dumps([s for s, _ in cases])).stdout)
    base = res["base"]
    for (text, value), (limit, l2, warned) in zip(cases, res["out"]):
        python_ok = limit != 12345 or value == 12345
        assert python_ok == (value is not None), text
        assert warned == (value is None), text
        if value is None:
            assert (limit, l2) == (12345, base), text
        else:
            assert limit == value, text
            if value != base:        # a size equal to the detected one reads the same either way
                assert l2 == (value if value >= 1 else base), text


def test_sizes_and_isa_in_any_case_at_import():
    isa = "avx2" if "avx2" in fastln.supported_isas() else "generic"
    code = ("import fastln; from fastln import _lib; c = _lib._cache_sizes(); "
            "print(fastln.cache_info().limit, c['l1'], c['l2'], c['l3'], fastln.get_isa())")
    env = dict(os.environ, FASTLN_CACHE_LIMIT="1G", FASTLN_L1_BYTES="48kB",
               FASTLN_L2_BYTES=" 3mib ", FASTLN_L3_BYTES="64MiB", FASTLN_ISA=f" {isa.upper()} ")
    run = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", code],
                         capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(GiB), str(48 * KiB), str(3 * MiB), str(64 * MiB), isa]


def test_bad_sizes_and_isa_warn_at_import():
    code = ("import fastln; from fastln import _lib; "
            "print(fastln.cache_info().limit, _lib._cache_sizes()['l3'] > 0, fastln.get_isa())")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTLN_")}
    best = _run(code, env).stdout.split()
    run = _run(code, dict(env, FASTLN_CACHE_LIMIT="1T", FASTLN_L3_BYTES="1.5M",
                          FASTLN_ISA="SSE4"))
    assert run.stdout.split() == best
    for text in ("FASTLN_CACHE_LIMIT='1T'", "FASTLN_L3_BYTES='1.5M'", "FASTLN_ISA='SSE4'"):
        assert text in run.stderr
    assert run.stderr.count("RuntimeWarning: FASTLN_") == 3


@pytest.mark.parametrize("spelling", [str.upper, str.title, lambda s: f"\t{s} "])
def test_isa_names_any_case(spelling):
    before = fastln.get_isa()
    try:
        for name in fastln.supported_isas():
            assert _lib.isa_supported(spelling(name))
            _lib._set_isa(spelling(name))
            assert fastln.get_isa() == name
    finally:
        _lib._set_isa(before)
    assert not _lib.isa_supported(spelling("sse"))


# ---------------------------------------------------------------- flags

X = np.arange(24, dtype=np.float32).reshape(3, 8)
BAD_FLAGS = ["yes", "", 1, 0, None, 1.0, [True]]


@pytest.mark.parametrize("value", BAD_FLAGS, ids=repr)
@pytest.mark.parametrize("call", [
    lambda v: fastln.layer_norm(X, return_stats=v),
    lambda v: fastln.rms_norm(X, return_stats=v),
    lambda v: fastln.add_layer_norm(X, X, return_stats=v),
    lambda v: fastln.add_rms_norm(X, X, return_stats=v),
    lambda v: fastln.layer_norm(X.astype(np.float16), axis=0, return_stats=v),
], ids=["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm", "slow_path"])
def test_return_stats_takes_bools(call, value):
    with pytest.raises(TypeError, match=named("return_stats")):
        call(value)
    def count(r):
        return len(r) if isinstance(r, tuple) else 1
    assert count(call(np.True_)) > count(call(np.False_)) == count(call(False))


@pytest.mark.parametrize("value", BAD_FLAGS, ids=repr)
def test_input_bias_grad_takes_bools(value):
    y, s, mean, rstd = fastln.add_layer_norm(X, X, return_stats=True)
    _, s2, rstd2 = fastln.add_rms_norm(X, X, return_stats=True)
    with pytest.raises(TypeError, match=named("input_bias_grad")):
        fastln.add_layer_norm_backward(X, s, mean, rstd, input_bias_grad=value)
    with pytest.raises(TypeError, match=named("input_bias_grad")):
        fastln.add_rms_norm_backward(X, s2, rstd2, input_bias_grad=value)
    assert len(fastln.add_layer_norm_backward(X, s, mean, rstd, input_bias_grad=np.True_)) == 4


@pytest.mark.parametrize("value", BAD_FLAGS, ids=repr)
def test_layer_flags_take_bools(value):
    with pytest.raises(TypeError, match=named("elementwise_affine")):
        fastln.LayerNorm(8, elementwise_affine=value)
    with pytest.raises(TypeError, match=named("bias")):
        fastln.LayerNorm(8, bias=value)
    with pytest.raises(TypeError, match=named("elementwise_affine")):
        fastln.RMSNorm(8, elementwise_affine=value)
    assert fastln.LayerNorm(8, elementwise_affine=np.True_, bias=np.False_).bias is None
    assert fastln.RMSNorm(8, elementwise_affine=np.False_).weight is None


# ---------------------------------------------------------------- layers' state

@pytest.mark.parametrize("make,state,keys", [
    (lambda: fastln.LayerNorm(4), {"weight": np.ones(4)}, ["bias"]),
    (lambda: fastln.LayerNorm(4), {"weight": np.ones(4), "bias": np.ones(4),
                                   "running_mean": np.ones(4)}, ["running_mean"]),
    (lambda: fastln.LayerNorm(4, bias=False), {"weight": np.ones(4), "bias": np.ones(4)},
     ["bias"]),
    (lambda: fastln.RMSNorm(4), {}, ["weight"]),
    (lambda: fastln.RMSNorm(4), {"weight": np.ones(4), "scale": np.ones(4)}, ["scale"]),
    (lambda: fastln.RMSNorm(4, elementwise_affine=False), {"weight": np.ones(4)}, ["weight"]),
    (lambda: fastln.LayerNorm(4), {"bias": np.ones(4), "gain": np.ones(4)}, ["weight", "gain"]),
])
def test_load_state_dict_key_mismatch_is_value_error(make, state, keys):
    layer = make()
    before = layer.state_dict()
    with pytest.raises(ValueError) as err:
        layer.load_state_dict(state)
    for key in keys:
        assert repr(key) in str(err.value)
    after = layer.state_dict()
    assert sorted(after) == sorted(before)
    assert all(np.array_equal(after[k], before[k]) for k in before)   # nothing changed


def test_from_torch_of_a_meta_module(torch):
    for module, cls in [(torch.nn.LayerNorm(8, device="meta"), fastln.LayerNorm),
                        (torch.nn.RMSNorm(8, device="meta"), fastln.RMSNorm)]:
        with pytest.raises(ValueError, match="meta device") as err:
            cls.from_torch(module)
        assert "weight" in str(err.value)
    assert fastln.LayerNorm.from_torch(
        torch.nn.LayerNorm(8, elementwise_affine=False, device="meta")).weight is None
    with pytest.raises(ValueError, match=r"state_dict\['weight'\].*meta device"):
        fastln.RMSNorm(8).load_state_dict({"weight": torch.ones(8, device="meta")})


# ---------------------------------------------------------------- the paths agree

# README (Guarantees, Accuracy): the kernels' outputs within these fractions
# of each output's largest magnitude; the RNN engine's within RNN_TOL;
# LayerNorm's dx over rows of one element within KERNEL_TOL of the largest
# |dy * weight| * rstd.
KERNEL_TOL = {np.float32: 1e-5, np.float64: 1e-12}
RNN_TOL = {np.float32: 1e-4, np.float64: 1e-12}


def _on_each_path(run):
    before = fastln.get_isa()
    results = {}
    try:
        for name in fastln.supported_isas():
            _lib._set_isa(name)
            results[name] = run()
    finally:
        _lib._set_isa(before)
    return results


def _agree(results, tol, scale=None):
    base = results["generic"]
    for name, res in results.items():
        for key, b in base.items():
            s = np.abs(b).max() if scale is None or key not in scale else scale[key]
            np.testing.assert_allclose(res[key], b, rtol=0, atol=tol * s,
                                       err_msg=f"{name} {key}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("H", [1, 2, 3, 5, 8, 16, 33])
def test_kernel_paths_agree_on_short_rows(rng, dtype, H):
    N = 67
    x = (rng.standard_normal((N, H)) * 3 + 2).astype(dtype)
    r = rng.standard_normal((N, H)).astype(dtype)
    dy = rng.standard_normal((N, H)).astype(dtype)
    w = rng.standard_normal(H).astype(dtype)

    def run():
        y, mean, rstd = fastln.layer_norm(x, w, w, return_stats=True)
        yr, rr = fastln.rms_norm(x, w, return_stats=True)
        dx, dw, db = fastln.layer_norm_backward(dy, x, mean, rstd, w)
        dxr, dwr = fastln.rms_norm_backward(dy, x, rr, w)
        ya, sa = fastln.add_layer_norm(x, r, w, w)
        return dict(y=y, mean=mean, rstd=rstd, yr=yr, rr=rr, dx=dx, dw=dw, db=db, dxr=dxr,
                    dwr=dwr, ya=ya, sa=sa)
    results = _on_each_path(run)
    g = results["generic"]
    scale = {}
    if H == 1:   # LayerNorm's dx is 0 in exact arithmetic (on the generic path exactly)
        assert not g["dx"].any()
        scale["dx"] = (np.abs(dy * w) * g["rstd"][:, None]).max()
        scale["dxr"] = (np.abs(dy * w) * g["rr"][:, None]).max()
    _agree(results, KERNEL_TOL[dtype], scale)


_RNN_CELLS = [(LNLSTM, {}), (LNGRU, {}), (LNRNN, {}), (LSTM, {})]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cls,kw", _RNN_CELLS, ids=["lnlstm", "lngru", "lnrnn", "lstm"])
@pytest.mark.parametrize("B", [1, 9])
def test_rnn_paths_agree(cls, kw, B, dtype):
    """Every output and gradient of a forward and backward over 16 steps."""
    T, I, H, L = 16, 6, 40, 2
    x = np.random.default_rng(B).standard_normal((T, B, I)).astype(dtype)
    dy = np.random.default_rng(B + 1).standard_normal((T, B, H)).astype(dtype)
    lengths = np.random.default_rng(B).integers(1, T + 1, B)

    def run():
        m = cls(I, H, num_layers=L, dtype=dtype, seed=3, **kw)
        rng = np.random.default_rng(3)
        for key, p in m.params.items():   # gains and biases away from 1 and 0
            if "weight_" not in key:
                p += rng.normal(0, 0.3, p.shape).astype(dtype)
        y, state = m.forward(x, lengths=lengths)
        dx, dstate = m.backward(dy)
        out = {"y": y, "dx": dx}
        for name, v in (("state", state), ("dstate", dstate)):
            for i, s in enumerate(v if isinstance(v, tuple) else (v,)):
                out[f"{name}{i}"] = s
        out.update({f"grad {k}": v.copy() for k, v in m.grads.items()})
        return out
    _agree(_on_each_path(run), RNN_TOL[dtype])


# ---------------------------------------------------------------- NaN and inf

def _all_outputs(x, r, dy, w):
    """Every output of the kernels for one set of inputs, by name."""
    y, mean, rstd = fastln.layer_norm(x, w, w, return_stats=True)
    yr, rr = fastln.rms_norm(x, w, return_stats=True)
    dx, dw, db = fastln.layer_norm_backward(dy, x, mean, rstd, w)
    dxr, dwr = fastln.rms_norm_backward(dy, x, rr, w)
    ya, sa, ma, ra = fastln.add_layer_norm(x, r, w, w, return_stats=True)
    yb, sb, rb = fastln.add_rms_norm(x, r, w, return_stats=True)
    H = x.shape[-1]
    a = fastln.add_layer_norm_backward(dy, sa, ma, ra, w, ds=dy, input_bias_grad=True,
                                       residual_shape=(H,))
    b = fastln.add_rms_norm_backward(dy, sb, rb, w, ds=dy, input_bias_grad=True,
                                     residual_shape=(H,))
    return dict(y=y, mean=mean, rstd=rstd, yr=yr, rr=rr, dx=dx, dw=dw, db=db, dxr=dxr, dwr=dwr,
                ya=ya, sa=sa, ma=ma, ra=ra, yb=yb, sb=sb, rb=rb,
                a_dsum=a[0], a_dw=a[1], a_db=a[2], a_dbi=a[3], a_dr=a[4],
                b_dsum=b[0], b_dw=b[1], b_dbi=b[2], b_dr=b[3])


# The row outputs (of each row) and the sums over rows, with each sum's term of one row
_ROWS = ("y", "mean", "rstd", "yr", "rr", "dx", "dxr", "ya", "sa", "ma", "ra", "yb", "sb",
         "rb", "a_dsum", "b_dsum")


def _terms(o, x, dy, i):
    """Row i's term of each sum over rows, in float64."""
    f = np.float64
    xhat = (x[i].astype(f) - f(o["mean"][i])) * f(o["rstd"][i])
    xhat_r = x[i].astype(f) * f(o["rr"][i])
    shat = (o["sa"][i].astype(f) - f(o["ma"][i])) * f(o["ra"][i])
    shat_r = o["sb"][i].astype(f) * f(o["rb"][i])
    g = dy[i].astype(f)
    return dict(dw=g * xhat, db=g, dwr=g * xhat_r, a_dw=g * shat, a_db=g,
                a_dbi=o["a_dsum"][i], a_dr=o["a_dsum"][i], b_dw=g * shat_r,
                b_dbi=o["b_dsum"][i], b_dr=o["b_dsum"][i])


@pytest.mark.parametrize("H", [1, 7, 64, 1037])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nan_and_inf_as_worded(isa, dtype, H):
    """README (Guarantees): a NaN, inf or -inf in a row of x or residual makes
    the row's y NaN throughout and its rstd NaN (mean NaN or +-inf), except
    RMSNorm where the row holds an inf and no NaN (rstd 0; y NaN at the inf,
    0 elsewhere); s is non-finite only where x + residual is; a NaN or inf in
    a row of x or dy makes the row's dx non-finite throughout; the other rows'
    outputs are unchanged; sums over rows are non-finite in the columns where
    the row's term is."""
    N, i = 20, 5   # 20 rows: the 16-row kernels and a tail
    rng = np.random.default_rng(H)
    x = rng.standard_normal((N, H)).astype(dtype)
    r = rng.standard_normal((N, H)).astype(dtype)
    dy = rng.standard_normal((N, H)).astype(dtype)
    w = (1 + 0.5 * rng.standard_normal(H)).astype(dtype)
    clean = _all_outputs(x, r, dy, w)
    with np.errstate(all="ignore"):
        for bad in (np.nan, np.inf, -np.inf):
            for pos in sorted({0, H // 2, H - 1}):
                for where in ("x", "residual", "dy"):
                    X, R, DY = x.copy(), r.copy(), dy.copy()
                    {"x": X, "residual": R, "dy": DY}[where][i, pos] = bad
                    o = _all_outputs(X, R, DY, w)
                    what = f"{bad} at {pos} of {where}"
                    for k in _ROWS:
                        keep = np.arange(N) != i
                        assert np.array_equal(o[k][keep], clean[k][keep]), f"{k}, {what}"
                    _check_row(o, clean, X, R, DY, i, where, what)
                    for k, term in _terms(o, X, DY, i).items():
                        np.testing.assert_array_equal(np.isfinite(o[k]), np.isfinite(term),
                                                      err_msg=f"{k}, {what}")


def _check_row(o, clean, X, R, DY, i, where, what):
    """Row i of each output, with the NaN or inf in `where`."""
    unread = {"dy": ("y", "mean", "rstd", "yr", "rr", "ya", "sa", "ma", "ra", "yb", "sb", "rb"),
              "residual": ("y", "mean", "rstd", "yr", "rr", "dx", "dxr"), "x": ()}[where]
    for k in unread:   # outputs that do not read the input
        assert np.array_equal(o[k], clean[k]), f"{k}, {what}"
    forwards = [("ya", "sa", "ma", "ra", "yb", "rb", X[i] + R[i])] if where != "dy" else []
    if where == "x":
        forwards.append(("y", None, "mean", "rstd", "yr", "rr", X[i]))
    for y, s, mean, rstd, yr, rr, v in forwards:
        if s is not None:
            np.testing.assert_array_equal(np.isfinite(o[s][i]), np.isfinite(v), err_msg=what)
        assert np.isnan(o[y][i]).all() and np.isnan(o[rstd][i]), f"{y}, {what}"
        assert not np.isfinite(o[mean][i]), f"{mean}, {what}"
        if np.isnan(v).any():
            assert np.isnan(o[yr][i]).all() and np.isnan(o[rr][i]), f"{yr}, {what}"
        else:   # an inf and no NaN: rstd 0, y NaN at the inf and 0 elsewhere
            assert o[rr][i] == 0, f"{rr}, {what}"
            np.testing.assert_array_equal(np.isnan(o[yr][i]), np.isinf(v), err_msg=f"{yr}, {what}")
            assert not o[yr][i][np.isfinite(v)].any(), f"{yr}, {what}"
    backwards = ("a_dsum", "b_dsum") if where == "residual" else ("dx", "dxr", "a_dsum", "b_dsum")
    for k in backwards:
        assert not np.isfinite(o[k][i]).any(), f"{k}, {what}"
