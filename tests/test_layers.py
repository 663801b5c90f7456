"""fastln.LayerNorm / fastln.RMSNorm layer objects."""
import numpy as np
import pytest

import fastln
from fastln import reference as ref

from _util import F32, F64, assert_close


def _randomize(layer, rng):
    if layer.weight is not None:
        layer.weight[...] = 1 + 0.5 * rng.standard_normal(layer.weight.shape)
    if getattr(layer, "bias", None) is not None:
        layer.bias[...] = rng.standard_normal(layer.bias.shape)


# ---------------------------------------------------------------- LayerNorm

@pytest.mark.parametrize("shape", [768, (768,), (7, 64)], ids=repr)
def test_layer_norm_init(shape):
    ln = fastln.LayerNorm(shape)
    nshape = (shape,) if isinstance(shape, int) else tuple(shape)
    assert isinstance(ln.weight, np.ndarray) and isinstance(ln.bias, np.ndarray)
    assert ln.weight.shape == ln.bias.shape == nshape
    assert ln.weight.dtype == ln.bias.dtype == F32
    np.testing.assert_array_equal(ln.weight, 1)
    np.testing.assert_array_equal(ln.bias, 0)


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("nshape,xshape", [((768,), (4, 768)), ((7, 64), (5, 7, 64)),
                                           ((16,), (2, 3, 16))], ids=repr)
def test_layer_norm_forward_backward(nshape, xshape, dtype, rng):
    ln = fastln.LayerNorm(nshape, dtype=dtype)
    assert ln.weight.dtype == dtype
    _randomize(ln, rng)
    axis = tuple(range(-len(nshape), 0))
    x = rng.standard_normal(xshape).astype(dtype)
    dy = rng.standard_normal(xshape).astype(dtype)
    y = ln(x)
    assert y.dtype == dtype and y.shape == xshape
    np.testing.assert_array_equal(y, ln.forward(x))
    np.testing.assert_array_equal(y, fastln.layer_norm(x, ln.weight, ln.bias, axis=axis))
    assert_close(y, ref.layer_norm(x, ln.weight, ln.bias, axis=axis), dtype)
    dx = ln.backward(dy)
    _, mean, rstd = fastln.layer_norm(x, ln.weight, ln.bias, axis=axis, return_stats=True)
    edx, edw, edb = fastln.layer_norm_backward(dy, x, mean, rstd, ln.weight, axis=axis)
    np.testing.assert_array_equal(dx, edx)
    assert set(ln.grads) >= {"weight", "bias"}
    np.testing.assert_array_equal(ln.grads["weight"], edw)
    np.testing.assert_array_equal(ln.grads["bias"], edb)
    assert ln.grads["weight"].shape == nshape


def test_layer_norm_backward_uses_last_forward_input(rng):
    ln = fastln.LayerNorm(32)
    _randomize(ln, rng)
    x1 = rng.standard_normal((3, 32)).astype(F32)
    x2 = (rng.standard_normal((3, 32)) * 5 + 2).astype(F32)
    dy = rng.standard_normal((3, 32)).astype(F32)
    ln(x1)
    ln(x2)
    dx = ln.backward(dy)
    rdx, rdw, rdb = ref.layer_norm_backward(dy, x2, *ref.layer_norm(
        x2, ln.weight, ln.bias, return_stats=True)[1:], ln.weight)
    assert_close(dx, rdx, F32)
    assert_close(ln.grads["weight"], rdw, F32)
    assert_close(ln.grads["bias"], rdb, F32)


def test_layer_norm_eps_is_used(rng):
    x = (rng.standard_normal((4, 16)) * 0.1).astype(F64)
    ln = fastln.LayerNorm(16, eps=0.5, dtype=F64)
    np.testing.assert_allclose(ln(x), ref.layer_norm(x, eps=0.5), rtol=1e-12, atol=1e-12)
    ln = fastln.LayerNorm(16, dtype=F64)
    np.testing.assert_allclose(ln(x), ref.layer_norm(x, eps=1e-5), rtol=1e-12, atol=1e-12)


def test_layer_norm_no_affine(rng):
    ln = fastln.LayerNorm(16, elementwise_affine=False)
    assert ln.weight is None and ln.bias is None
    x = rng.standard_normal((4, 16)).astype(F32)
    dy = rng.standard_normal((4, 16)).astype(F32)
    y = ln(x)
    np.testing.assert_array_equal(y, fastln.layer_norm(x))
    dx = ln.backward(dy)
    _, mean, rstd = fastln.layer_norm(x, return_stats=True)
    np.testing.assert_array_equal(dx, fastln.layer_norm_backward(dy, x, mean, rstd)[0])
    assert ln.grads.get("weight") is None and ln.grads.get("bias") is None
    assert ln.state_dict() == {}


def test_layer_norm_without_bias(rng):
    ln = fastln.LayerNorm(16, bias=False)
    assert ln.bias is None and ln.weight.shape == (16,)
    _randomize(ln, rng)
    x = rng.standard_normal((4, 16)).astype(F32)
    dy = rng.standard_normal((4, 16)).astype(F32)
    np.testing.assert_array_equal(ln(x), fastln.layer_norm(x, ln.weight))
    dx = ln.backward(dy)
    _, mean, rstd = fastln.layer_norm(x, ln.weight, return_stats=True)
    edx, edw, _ = fastln.layer_norm_backward(dy, x, mean, rstd, ln.weight)
    np.testing.assert_array_equal(dx, edx)
    np.testing.assert_array_equal(ln.grads["weight"], edw)
    assert ln.grads.get("bias") is None
    assert set(ln.state_dict()) == {"weight"}


def test_layer_norm_state_dict_round_trip(rng):
    a = fastln.LayerNorm((7, 64))
    _randomize(a, rng)
    sd = a.state_dict()
    assert set(sd) == {"weight", "bias"}
    np.testing.assert_array_equal(sd["weight"], a.weight)
    np.testing.assert_array_equal(sd["bias"], a.bias)
    b = fastln.LayerNorm((7, 64))
    b.load_state_dict(sd)
    x = rng.standard_normal((3, 7, 64)).astype(F32)
    np.testing.assert_array_equal(a(x), b(x))
    np.testing.assert_array_equal(b.weight, a.weight)
    assert b.weight.dtype == F32


# ---------------------------------------------------------------- RMSNorm

def test_rms_norm_init():
    m = fastln.RMSNorm(768)
    assert m.weight.shape == (768,) and m.weight.dtype == F32
    np.testing.assert_array_equal(m.weight, 1)


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("nshape,xshape", [((768,), (4, 768)), ((7, 64), (5, 7, 64))], ids=repr)
def test_rms_norm_forward_backward(nshape, xshape, dtype, rng):
    m = fastln.RMSNorm(nshape, dtype=dtype)
    _randomize(m, rng)
    axis = tuple(range(-len(nshape), 0))
    x = rng.standard_normal(xshape).astype(dtype)
    dy = rng.standard_normal(xshape).astype(dtype)
    y = m(x)
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, m.forward(x))
    np.testing.assert_array_equal(y, fastln.rms_norm(x, m.weight, axis=axis))
    assert_close(y, ref.rms_norm(x, m.weight, axis=axis), dtype)
    dx = m.backward(dy)
    _, rstd = fastln.rms_norm(x, m.weight, axis=axis, return_stats=True)
    edx, edw = fastln.rms_norm_backward(dy, x, rstd, m.weight, axis=axis)
    np.testing.assert_array_equal(dx, edx)
    np.testing.assert_array_equal(m.grads["weight"], edw)


def test_rms_norm_eps_default_and_custom(rng):
    x = (rng.standard_normal((4, 16)) * 1e-3).astype(F64)
    np.testing.assert_allclose(fastln.RMSNorm(16, dtype=F64)(x), ref.rms_norm(x, eps=1e-6),
                               rtol=1e-12)
    np.testing.assert_allclose(fastln.RMSNorm(16, eps=1e-3, dtype=F64)(x),
                               ref.rms_norm(x, eps=1e-3), rtol=1e-12)


def test_rms_norm_no_affine_and_state_dict(rng):
    m = fastln.RMSNorm(16, elementwise_affine=False)
    assert m.weight is None
    x = rng.standard_normal((4, 16)).astype(F32)
    np.testing.assert_array_equal(m(x), fastln.rms_norm(x))
    assert m.state_dict() == {}
    a = fastln.RMSNorm(16)
    _randomize(a, rng)
    assert set(a.state_dict()) == {"weight"}
    b = fastln.RMSNorm(16)
    b.load_state_dict(a.state_dict())
    np.testing.assert_array_equal(a(x), b(x))


# ---------------------------------------------------------------- torch interop

@pytest.mark.parametrize("kwargs", [{}, {"bias": False}, {"elementwise_affine": False}], ids=repr)
@pytest.mark.parametrize("nshape", [(768,), (7, 64)], ids=repr)
def test_layer_norm_loads_torch_state_dict(torch, nshape, kwargs, rng):
    tm = torch.nn.LayerNorm(nshape, eps=1e-5, **kwargs)
    with torch.no_grad():
        for p in tm.parameters():
            p.copy_(torch.from_numpy(rng.standard_normal(tuple(p.shape)).astype(F32)))
    sd = {k: v.detach().numpy() for k, v in tm.state_dict().items()}
    m = fastln.LayerNorm(nshape, eps=1e-5, **kwargs)
    assert set(m.state_dict()) == set(sd)
    m.load_state_dict(sd)
    x = (rng.standard_normal((3,) + nshape) * 2 + 1).astype(F32)
    with torch.no_grad():
        yt = tm(torch.from_numpy(x)).numpy()
    scale = max(1.0, float(np.abs(yt).max()))
    np.testing.assert_allclose(m(x), yt, rtol=1e-5, atol=2e-5 * scale)
    # and back: fastln's state dict loads into torch and gives the same module
    tm2 = torch.nn.LayerNorm(nshape, eps=1e-5, **kwargs)
    tm2.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in m.state_dict().items()})
    with torch.no_grad():
        np.testing.assert_array_equal(tm2(torch.from_numpy(x)).numpy(), yt)


@pytest.mark.parametrize("kwargs", [{}, {"elementwise_affine": False}], ids=repr)
def test_rms_norm_loads_torch_state_dict(torch, kwargs, rng):
    tm = torch.nn.RMSNorm(768, eps=1e-6, **kwargs)
    with torch.no_grad():
        for p in tm.parameters():
            p.copy_(torch.from_numpy(rng.standard_normal(tuple(p.shape)).astype(F32)))
    sd = {k: v.detach().numpy() for k, v in tm.state_dict().items()}
    m = fastln.RMSNorm(768, eps=1e-6, **kwargs)
    assert set(m.state_dict()) == set(sd)
    m.load_state_dict(sd)
    x = rng.standard_normal((5, 768)).astype(F32)
    with torch.no_grad():
        yt = tm(torch.from_numpy(x)).numpy()
    scale = max(1.0, float(np.abs(yt).max()))
    np.testing.assert_allclose(m(x), yt, rtol=1e-5, atol=2e-5 * scale)


def test_layer_grads_match_torch_autograd(torch, rng):
    tm = torch.nn.LayerNorm(64)
    with torch.no_grad():
        tm.weight.copy_(torch.from_numpy((1 + rng.standard_normal(64)).astype(F32)))
        tm.bias.copy_(torch.from_numpy(rng.standard_normal(64).astype(F32)))
    m = fastln.LayerNorm(64)
    m.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    x = rng.standard_normal((8, 64)).astype(F32)
    dy = rng.standard_normal((8, 64)).astype(F32)
    xt = torch.from_numpy(x).requires_grad_(True)
    tm(xt).backward(torch.from_numpy(dy))
    m(x)
    dx = m.backward(dy)
    assert_close(dx, xt.grad.numpy(), F32)
    assert_close(m.grads["weight"], tm.weight.grad.numpy(), F32)
    assert_close(m.grads["bias"], tm.bias.grad.numpy(), F32)
