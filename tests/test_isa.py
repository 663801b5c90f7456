"""Instruction-set dispatch: every path this CPU supports is selectable and agrees."""
import os

import numpy as np
import pytest

import fastln
from fastln import reference as ref

from _util import run_python

ALL_ISAS = ("avx512", "avx2", "generic")


def test_supported_isas():
    isas = fastln.supported_isas()
    assert isinstance(isas, list)
    assert "generic" in isas
    assert set(isas) <= set(ALL_ISAS)
    assert len(set(isas)) == len(isas)


def test_current_isa_is_supported():
    assert fastln.get_isa() in fastln.supported_isas()


def test_default_is_best_supported():
    """Without FASTLN_ISA the best path the CPU runs is chosen at import."""
    env = {k: v for k, v in os.environ.items() if k != "FASTLN_ISA"}
    out = run_python("import fastln; print(fastln.get_isa(), fastln.supported_isas())", env)
    assert out.returncode == 0, out.stderr
    isa = out.stdout.split()[0]
    best = [i for i in ALL_ISAS if i in fastln.supported_isas()][0]
    assert isa == best


@pytest.mark.parametrize("name", ALL_ISAS)
def test_env_var_forces_path(name):
    if name not in fastln.supported_isas():
        pytest.skip("%s not supported on this CPU" % name)
    env = dict(os.environ, FASTLN_ISA=name)
    code = ("import numpy as np, fastln; print(fastln.get_isa()); "
            "x = np.arange(12.0).reshape(3, 4); print(float(abs(fastln.layer_norm(x)).sum()))")
    out = run_python(code, env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines[0] == name
    expect = np.abs(ref.layer_norm(np.arange(12.0).reshape(3, 4))).sum()
    np.testing.assert_allclose(float(lines[1]), expect)


def test_set_isa_rejects_unknown_name():
    before = fastln.get_isa()
    with pytest.raises(ValueError):
        fastln._lib._set_isa("sse9000")
    assert fastln.get_isa() == before


def test_set_isa_rejects_unsupported_path():
    missing = [i for i in ALL_ISAS if i not in fastln.supported_isas()]
    if not missing:
        pytest.skip("this CPU runs every path")
    before = fastln.get_isa()
    with pytest.raises(ValueError):
        fastln._lib._set_isa(missing[0])
    assert fastln.get_isa() == before


def test_isa_fixture_switches_path(isa):
    assert fastln.get_isa() == isa


# The documented agreement between ISA paths (README, Guarantees): outputs
# within this relative tolerance of the generic path's, scaled by the largest
# magnitude of each output.
PATH_TOL = {np.float32: 1e-5, np.float64: 1e-12}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_paths_agree(rng, dtype):
    """Every function's every output on each path agrees with the generic
    path's within PATH_TOL (each path is also checked against the reference
    elsewhere); the LN-RNN's paths are compared in test_rnn_engine.py."""
    x = (rng.standard_normal((64, 1037)) * 3 + 2).astype(dtype)
    r = rng.standard_normal((64, 1037)).astype(dtype)
    dy = rng.standard_normal((64, 1037)).astype(dtype)
    w = rng.standard_normal(1037).astype(dtype)

    def run():
        y, mean, rstd = fastln.layer_norm(x, w, w, return_stats=True)
        yr, rr = fastln.rms_norm(x, w, return_stats=True)
        return {"layer_norm": (y, mean, rstd),
                "layer_norm_backward": fastln.layer_norm_backward(dy, x, mean, rstd, w),
                "rms_norm": (yr, rr),
                "rms_norm_backward": fastln.rms_norm_backward(dy, x, rr, w),
                "add_layer_norm": fastln.add_layer_norm(x, r, w, w)}
    before = fastln.get_isa()
    results = {}
    try:
        for name in fastln.supported_isas():
            fastln._lib._set_isa(name)
            results[name] = run()
    finally:
        fastln._lib._set_isa(before)
    base, tol = results["generic"], PATH_TOL[dtype]
    for name, res in results.items():
        for fn, outs in res.items():
            for k, (a, b) in enumerate(zip(outs, base[fn])):
                np.testing.assert_allclose(a, b, rtol=tol, atol=tol * np.abs(b).max(),
                                           err_msg=f"{name} {fn} output {k}")
