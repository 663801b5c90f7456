"""Building fastln layers and RNNs from torch modules (``from_torch``), each
checked for the same outputs (and, for the RNNs, gradients) as the module."""
import warnings

import numpy as np
import pytest

import fastln
from fastln.rnn import LSTM, RNN

from _util import F32, F64, named


def _randomize(torch, module, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) * 0.5)
    return module


def fastln_dtype(name):
    if name == "bfloat16":
        return pytest.importorskip("ml_dtypes").bfloat16
    return np.dtype(name)


def _np(t):
    return t.detach().double().numpy()


# ---------------------------------------------------------------- LayerNorm, RMSNorm

LN_CASES = [((8,), {}), ((3, 8), {"eps": 1e-3}), ((16,), {"elementwise_affine": False}),
            ((16,), {"bias": False})]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("shape, kw", LN_CASES, ids=["plain", "2d-eps", "no-affine", "no-bias"])
def test_layer_norm_from_torch(torch, shape, kw, dtype, rng):
    fdt = fastln_dtype(dtype)   # (skips bfloat16 without ml_dtypes)
    tdt = getattr(torch, dtype)
    tm = _randomize(torch, torch.nn.LayerNorm(shape, dtype=tdt, **kw))
    m = fastln.LayerNorm.from_torch(tm)
    assert m.normalized_shape == shape and m.eps == tm.eps
    assert (m.weight is None) == (tm.weight is None) and (m.bias is None) == (tm.bias is None)
    x32 = rng.standard_normal((5,) + shape).astype(F32)
    xt = torch.from_numpy(x32).to(tdt)
    if tm.weight is not None:   # (a module without parameters has no dtype to take)
        assert m.dtype.name == dtype
    x = _np(xt).astype(fdt)   # the same values in fastln
    y = m(x)
    assert y.dtype == x.dtype
    want = _np(tm(xt))
    tol = {"float32": 1e-5, "float64": 1e-12, "float16": 2e-3, "bfloat16": 2e-2}[dtype]
    np.testing.assert_allclose(y.astype(F64), want, rtol=tol, atol=tol * 4)
    if m.weight is not None:   # a copy: later changes to the module do not leak in
        before = m.weight.copy()
        with torch.no_grad():
            tm.weight.add_(1)
        assert np.array_equal(m.weight, before)


@pytest.mark.parametrize("eps", [None, 1e-6])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_rms_norm_from_torch(torch, eps, dtype, rng):
    tdt = getattr(torch, dtype)
    tm = _randomize(torch, torch.nn.RMSNorm(12, eps=eps, dtype=tdt))
    m = fastln.RMSNorm.from_torch(tm)
    assert m.eps == (eps if eps is not None else np.finfo(dtype).eps)
    x = rng.standard_normal((4, 12)).astype(dtype) * 1e-4   # small: eps matters
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(m(x), _np(tm(torch.from_numpy(x))), rtol=tol, atol=tol)


def test_rms_norm_from_torch_without_weight(torch):
    m = fastln.RMSNorm.from_torch(torch.nn.RMSNorm((2, 3), elementwise_affine=False))
    assert m.weight is None and m.normalized_shape == (2, 3)


@pytest.mark.parametrize("cls, other", [(fastln.LayerNorm, "RMSNorm"),
                                        (fastln.RMSNorm, "LayerNorm"),
                                        (LSTM, "GRU"), (RNN, "LSTM")])
def test_from_torch_rejects_other_modules(torch, cls, other):
    module = getattr(torch.nn, other)(4) if "Norm" in other else getattr(torch.nn, other)(4, 4)
    with pytest.raises(TypeError, match=named("module")):
        cls.from_torch(module)
    with pytest.raises(TypeError, match=named("module")):
        cls.from_torch(np.ones(4))


def test_load_state_dict_takes_tensors(torch):
    m = fastln.LayerNorm(4, dtype=np.float64)
    m.load_state_dict({"weight": torch.arange(4.0), "bias": torch.ones(4)})
    assert m.weight.dtype == F64 and np.array_equal(m.weight, [0, 1, 2, 3])
    r = LSTM(2, 3)
    sd = {k: torch.from_numpy(v + 1) for k, v in r.state_dict().items()}
    r.load_state_dict(sd)
    assert all(np.array_equal(r.params[k], sd[k].numpy()) for k in sd)


# ---------------------------------------------------------------- torch.nn.LSTM, torch.nn.RNN

RNN_CASES = [("LSTM", {}), ("LSTM", {"num_layers": 2, "batch_first": True}),
             ("LSTM", {"bias": False}), ("RNN", {"num_layers": 2}),
             ("RNN", {"nonlinearity": "relu", "batch_first": True})]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind, kw", RNN_CASES,
                         ids=["lstm", "lstm-2l-bf", "lstm-nobias", "rnn-2l", "rnn-relu-bf"])
def test_rnn_from_torch_forward_and_gradients(torch, kind, kw, dtype, rng):
    I, H, B, T = 5, 16, 3, 7
    tm = _randomize(torch, getattr(torch.nn, kind)(I, H, dtype=getattr(torch, dtype), **kw))
    m = (LSTM if kind == "LSTM" else RNN).from_torch(tm)
    assert (m.input_size, m.hidden_size, m.num_layers) == (I, H, tm.num_layers)
    assert m.batch_first == tm.batch_first and m.dtype == np.dtype(dtype)
    if kind == "RNN":
        assert m.nonlinearity == tm.nonlinearity
    x = rng.standard_normal((B, T, I) if tm.batch_first else (T, B, I)).astype(dtype)
    xt = torch.from_numpy(x).requires_grad_()
    yt, st = tm(xt)
    y, s = m.forward(x)
    tol = 2e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(y, _np(yt), rtol=tol, atol=tol)
    for a, b in zip(s if kind == "LSTM" else (s,), st if kind == "LSTM" else (st,)):
        np.testing.assert_allclose(a, _np(b), rtol=tol, atol=tol)

    dy = rng.standard_normal(y.shape).astype(dtype)
    (yt * torch.from_numpy(dy)).sum().backward()
    dx, _ = m.backward(dy)
    np.testing.assert_allclose(dx, _np(xt.grad), rtol=tol * 10, atol=tol * 10)
    for k in range(tm.num_layers):
        for name in ("weight_ih", "weight_hh"):
            want = _np(getattr(tm, f"{name}_l{k}").grad)
            np.testing.assert_allclose(m.grads[f"{name}_l{k}"], want, rtol=tol * 10,
                                       atol=tol * 10, err_msg=name)
        if tm.bias:   # d/d(b_ih) = d/d(b_hh) = d/d(their sum)
            want = _np(getattr(tm, f"bias_ih_l{k}").grad)
            np.testing.assert_allclose(m.grads[f"bias_l{k}"], want, rtol=tol * 10, atol=tol * 10)
            np.testing.assert_allclose(_np(getattr(tm, f"bias_hh_l{k}").grad), want,
                                       rtol=tol, atol=tol)
        else:
            assert np.all(m.params[f"bias_l{k}"] == 0)


def test_rnn_from_torch_sums_the_biases(torch):
    tm = _randomize(torch, torch.nn.LSTM(3, 4, dtype=torch.float64))
    m = LSTM.from_torch(tm)
    assert np.array_equal(m.params["bias_l0"], _np(tm.bias_ih_l0) + _np(tm.bias_hh_l0))


def test_rnn_from_torch_rejects_what_it_cannot_run(torch):
    assert LSTM.from_torch(torch.nn.LSTM(3, 4, bidirectional=True)).bidirectional
    with pytest.raises(TypeError, match=named("module")):
        RNN.from_torch(torch.nn.RNN(3, 4, dtype=torch.float16))
    with pytest.warns(UserWarning, match="dropout"):
        LSTM.from_torch(torch.nn.LSTM(3, 4, num_layers=2, dropout=0.5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LSTM.from_torch(torch.nn.LSTM(3, 4, num_layers=2))
