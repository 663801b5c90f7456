"""fastln.add_layer_norm / add_rms_norm against ONNX Runtime's contrib operators
SkipLayerNormalization and SkipSimplifiedLayerNormalization (domain
com.microsoft, version 1) on the CPU execution provider.

Each model is one node with inputs ``input`` (B, S, H), ``skip``, ``gamma``,
``beta`` (SkipLayerNormalization only, optional) and ``bias`` (optional), and
all four outputs ``output``, ``mean``, ``inv_std_var`` and
``input_skip_bias_sum``. fastln's counterpart is ``add_*_norm(input, skip,
gamma, beta, input_bias=bias, eps=epsilon, return_stats=True)``.

What ONNX Runtime's CPU kernel does, as these tests pin down:

* skip of shape (B, S, H), (1, S, H) and (S, H) is accepted (row n of the
  input adds skip row n % (rows of skip), as fastln broadcasts); (H,),
  (1, H) and (B, 1, H) are refused ("skip is expected to have 3 or 2
  dimensions" / "last two dimensions of skip needs to be same as input"), so
  only the first three forms are compared.
* float32 and float16 run (the operators' type constraint refuses float64
  when the model is loaded; ONNX Runtime's Python API cannot feed
  ml_dtypes.bfloat16). The sum is formed as
  ``(input + skip) + bias`` in the compute type (float for float16, whose
  operands are widened and whose sum is rounded once), so
  ``input_skip_bias_sum`` is bitwise fastln's s; the norm is taken of the
  unrounded sum in both.
* ``mean`` and ``inv_std_var`` are float32 of shape (B, S, 1) whatever the
  input type: for SkipLayerNormalization, s's mean and 1 / sqrt(var + eps);
  for SkipSimplifiedLayerNormalization, ``mean`` is all zeros and
  ``inv_std_var`` is 1 / sqrt(mean(s**2) + eps), fastln's rstd.
* ONNX Runtime takes the variance in one pass, as E[s**2] - E[s]**2 in the
  compute type. On rows far from zero (an offset of 100 with a spread of 0.1
  in float32) that loses digits that fastln's centred variance keeps; the
  data here are of order one, where both agree to float32's precision.

Tolerances (relative, and absolute scaled by the largest magnitude): float32
1e-5, float16 outputs 2e-3 (about two units in the last place,
as both round a float result of about the same value once).
"""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import fastln
from fastln import reference as ref

B, S = 2, 5
F16, F32, F64 = np.float16, np.float32, np.float64
TOL = {np.dtype(F32): 1e-5, np.dtype(F16): 2e-3}
# mean and inv_std_var are float32 on both sides
OPS = {"SkipLayerNormalization": False, "SkipSimplifiedLayerNormalization": True}
SKIP_SHAPES = {"full": (B, S), "batch1": (1, S), "2d": (S,)}


def make_session(op, dtype, beta, bias, eps):
    """An ONNX Runtime session of one op node over inputs of dtype, with the
    optional beta (SkipLayerNormalization only) and bias present or not."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    names = ["input", "skip", "gamma"]
    if not OPS[op]:
        names.append("beta" if beta else "")
    names.append("bias" if bias else "")
    while not names[-1]:
        names.pop()
    outputs = ["output", "mean", "inv_std_var", "input_skip_bias_sum"]
    node = helper.make_node(op, names, outputs, domain="com.microsoft", epsilon=eps)
    graph = helper.make_graph(
        [node], "skip_norm",
        [helper.make_tensor_value_info(n, elem, None) for n in names if n],
        [helper.make_tensor_value_info(n, elem if n in ("output", "input_skip_bias_sum")
                                       else TensorProto.FLOAT, None) for n in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session, [n for n in names if n]


def feeds_for(names, dtype, H, skip_shape, rng):
    shapes = {"input": (B, S, H), "skip": skip_shape + (H,), "gamma": (H,), "beta": (H,),
              "bias": (H,)}
    scale = {"input": 1.0, "skip": 1.0, "gamma": 0.5, "beta": 0.5, "bias": 0.5}
    loc = {"input": 0.3, "skip": -0.1, "gamma": 1.0, "beta": 0.0, "bias": 0.2}
    return {n: (loc[n] + scale[n] * rng.standard_normal(shapes[n])).astype(dtype)
            for n in names}


def run_fastln(op, feeds, eps):
    """fastln on the node's inputs: (output, mean or None, rstd, sum)."""
    x, skip = feeds["input"], feeds["skip"]
    # float16 inputs compute in float32, where fastln takes the parameters
    par = {n: (None if feeds.get(n) is None else feeds[n].astype(F32))
           for n in ("gamma", "beta", "bias")}
    if OPS[op]:
        y, s, rstd = fastln.add_rms_norm(x, skip, par["gamma"], input_bias=par["bias"], eps=eps,
                                         return_stats=True)
        return y, None, rstd, s
    y, s, mean, rstd = fastln.add_layer_norm(x, skip, par["gamma"], par["beta"],
                                             input_bias=par["bias"], eps=eps, return_stats=True)
    return y, mean, rstd, s


def close(got, want, tol, what):
    got, want = np.asarray(got, F64), np.asarray(want, F64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, err_msg=what)


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint8)


@pytest.mark.parametrize("H", [16, 768, 1031])
@pytest.mark.parametrize("skip", list(SKIP_SHAPES))
@pytest.mark.parametrize("dtype", [F32, F16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", list(OPS))
def test_matches_onnxruntime(op, dtype, skip, H):
    rng = np.random.default_rng(H * 7 + len(skip))
    eps = 1e-5
    for beta in ([False] if OPS[op] else [True, False]):
        for bias in (True, False):
            session, names = make_session(op, dtype, beta, bias, eps)
            feeds = feeds_for(names, dtype, H, SKIP_SHAPES[skip], rng)
            out, mean, inv_std, total = session.run(None, feeds)
            y, fmean, rstd, s = run_fastln(op, feeds, eps)
            what = f"{op} {np.dtype(dtype).name} skip {skip} beta {beta} bias {bias}"
            assert out.shape == total.shape == (B, S, H), what
            assert out.dtype == total.dtype == y.dtype == s.dtype == np.dtype(dtype), what
            assert mean.shape == inv_std.shape == (B, S, 1), what
            assert mean.dtype == inv_std.dtype == np.dtype(F32), what
            # the same sum, formed in the same order and rounded once
            np.testing.assert_array_equal(bits(s), bits(total), err_msg=what + " sum")
            close(y, out, TOL[np.dtype(dtype)], what + " output")
            close(rstd.reshape(B, S, 1), inv_std, 1e-5,
                  what + " inv_std_var")
            if fmean is None:
                np.testing.assert_array_equal(mean, 0.0, err_msg=what + " mean")
            else:
                close(fmean.reshape(B, S, 1), mean, 1e-5, what + " mean")


@pytest.mark.parametrize("eps", [0.0, 1e-12, 1e-5, 0.25])
@pytest.mark.parametrize("op", list(OPS))
def test_epsilon_attribute(op, eps):
    """The epsilon attribute is fastln's eps; a large one changes the result
    (rows of small spread make it visible)."""
    rng = np.random.default_rng(3)
    session, names = make_session(op, F32, True, True, eps)
    feeds = feeds_for(names, F32, 64, SKIP_SHAPES["2d"], rng)
    feeds["input"] *= 0.3
    out, _, inv_std, total = session.run(None, feeds)
    y, _, rstd, s = run_fastln(op, feeds, eps)
    close(y, out, 1e-5, f"{op} eps {eps}")
    close(rstd.reshape(B, S, 1), inv_std, 1e-5, f"{op} eps {eps} inv_std_var")
    if eps == 0.25:
        y_small, _, _, _ = run_fastln(op, feeds, 1e-5)
        assert not np.allclose(y_small, out, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("op", list(OPS))
def test_onnxruntime_agrees_with_float64_reference(op):
    """Both sides against the float64 reference on the same data: the
    comparisons above test the two implementations, not a shared mistake."""
    rng = np.random.default_rng(5)
    session, names = make_session(op, F32, True, True, 1e-5)
    feeds = feeds_for(names, F32, 300, SKIP_SHAPES["batch1"], rng)
    out, _, inv_std, total = session.run(None, feeds)
    f64 = {n: a.astype(F64) for n, a in feeds.items()}
    if OPS[op]:
        ry, rs, rrstd = ref.add_rms_norm(f64["input"], f64["skip"], f64["gamma"],
                                         input_bias=f64["bias"], eps=1e-5, return_stats=True)
    else:
        ry, rs, _, rrstd = ref.add_layer_norm(f64["input"], f64["skip"], f64["gamma"],
                                              f64["beta"], input_bias=f64["bias"], eps=1e-5,
                                              return_stats=True)
    close(total, rs, 1e-6, "sum")
    close(out, ry, 1e-5, "output")
    close(inv_std[..., 0], rrstd, 1e-5, "inv_std_var")
    y, _, rstd, s = run_fastln(op, feeds, 1e-5)
    close(y, ry, 1e-5, "fastln output")
    close(rstd, rrstd, 1e-5, "fastln rstd")
