"""fastln.torch's modules in inference: float under torch.no_grad, bfloat16
(module.to(torch.bfloat16)), int8 (fastln.torch.quantize), the streaming
step() and torch.export, each bitwise the fastln.rnn model on the same
weights."""
import copy
import io

import numpy as np
import pytest

import fastln.rnn as R

CELLS = ["LNLSTM", "LNGRU", "LNRNN", "LSTM", "GRU", "RNN"]


@pytest.fixture(scope="module")
def ft(torch):
    import fastln.torch

    return fastln.torch


def _module(torch, ft, cell, **kw):
    torch.manual_seed(10)
    m = getattr(ft, cell)(6, 8, **kw)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape) * 0.1)
    return m


def _parts(state, has_cell):
    return state if has_cell else (state,)


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("B", [1, 4])
def test_no_grad_forward_is_the_model_forward(torch, ft, cell, B):
    m = _module(torch, ft, cell, num_layers=2, bidirectional=True)
    x = torch.randn(7, B, 6)
    with torch.no_grad():
        y, st = m(x)
    y2, st2 = m.to_rnn().forward(x.numpy(), cache=False)
    np.testing.assert_array_equal(y.numpy(), y2)
    for a, b in zip(_parts(st, m._has_cell), _parts(st2, m._has_cell)):
        np.testing.assert_array_equal(a.numpy(), b)


@pytest.mark.parametrize("cell", CELLS)
def test_bfloat16_module_runs_the_bfloat16_model(torch, ft, cell):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    m = _module(torch, ft, cell, num_layers=2)
    mb = copy.deepcopy(m).to(torch.bfloat16)   # every parameter rounded to bfloat16
    model = mb.to_rnn()
    assert model.dtype == ml_dtypes.bfloat16
    x = torch.randn(6, 3, 6)
    with torch.no_grad():
        for xin in (x.to(torch.bfloat16), x):
            y, st = mb(xin)
            assert y.dtype == torch.bfloat16
            assert all(s.dtype == torch.float32 for s in _parts(st, m._has_cell))
            want, wst = model.forward(xin.float().numpy(), cache=False)
            np.testing.assert_array_equal(y.float().numpy(), want.astype(np.float32))
            for a, b in zip(_parts(st, m._has_cell), _parts(wst, m._has_cell)):
                np.testing.assert_array_equal(a.numpy(), b)
    with pytest.raises(TypeError, match="torch.no_grad"):
        mb(x)
    # fastln.rnn's bfloat16 model keeps its gains and biases in float32, and so
    # does the module made from it
    mixed = m.to_rnn().to(ml_dtypes.bfloat16)
    back = type(m).from_rnn(mixed)
    assert back.weight_hh_l0.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for n, p in back.named_parameters()
               if not n.startswith("weight_"))
    with torch.no_grad():
        np.testing.assert_array_equal(back(x)[0].float().numpy(),
                                      mixed.forward(x.numpy(), cache=False)[0].astype(
                                          np.float32))
        np.testing.assert_allclose(back(x)[0].float().numpy(), y.float().numpy(), atol=0.05)


def test_bfloat16_module_sees_updated_weights(torch, ft):
    pytest.importorskip("ml_dtypes")
    m = ft.LNLSTM(4, 8).to(torch.bfloat16)
    x = torch.randn(3, 2, 4)
    with torch.no_grad():
        a = m(x)[0]
        m.weight_hh_l0.mul_(2)
        b = m(x)[0]
    assert not torch.equal(a, b)


@pytest.mark.parametrize("cell", CELLS)
def test_int8_module_runs_the_int8_model(torch, ft, cell):
    m = _module(torch, ft, cell, num_layers=2, bidirectional=cell == "LNGRU")
    q = ft.quantize(m)
    assert q.quantized and list(q.parameters()) == []
    assert q.weight_hh_l0.dtype == torch.int8
    model = R.quantize(m.to_rnn())
    x = torch.randn(6, 3, 6)
    with torch.no_grad():
        y, st = q(x)
    want, wst = model.forward(x.numpy(), cache=False)
    np.testing.assert_array_equal(y.numpy(), want)
    for a, b in zip(_parts(st, m._has_cell), _parts(wst, m._has_cell)):
        np.testing.assert_array_equal(a.numpy(), b)
    # its state_dict carries the int8 values and scales into another int8 module
    other = ft.quantize(getattr(ft, cell)(6, 8, num_layers=2, bidirectional=cell == "LNGRU"))
    buf = io.BytesIO()
    torch.save(q.state_dict(), buf)
    buf.seek(0)
    other.load_state_dict(torch.load(buf))
    with torch.no_grad():
        assert torch.equal(other(x)[0], y)
    with pytest.raises(TypeError, match="torch.no_grad"):
        q(x.clone().requires_grad_())
    with pytest.raises(ValueError, match="int8 already"):
        ft.quantize(q)
    with pytest.raises(TypeError, match="fastln.torch module"):
        ft.quantize(torch.nn.LSTM(3, 4))


def test_int8_module_refuses_converted_scales(torch, ft):
    pytest.importorskip("ml_dtypes")
    q = ft.quantize(ft.LSTM(3, 4)).to(torch.bfloat16)
    with torch.no_grad(), pytest.raises(TypeError, match="float32"):
        q(torch.randn(2, 1, 3))


@pytest.mark.parametrize("cell", CELLS)
def test_step_is_the_model_step(torch, ft, cell):
    m = _module(torch, ft, cell, num_layers=2)
    model = m.to_rnn()
    x = torch.randn(5, 3, 6)
    state, mstate = None, None
    for t in range(5):
        h, state = m.step(x[t], state)
        mh, mstate = model.step(x[t].numpy(), mstate)
        np.testing.assert_array_equal(h.numpy(), mh)
    with torch.no_grad():
        y, final = m(x)
    np.testing.assert_allclose(h.numpy(), y[-1].numpy(), rtol=1e-5, atol=1e-6)
    for a, b in zip(_parts(state, m._has_cell), _parts(final, m._has_cell)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_step_of_bfloat16_and_int8_modules(torch, ft):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    m = _module(torch, ft, "LNLSTM")
    x = torch.randn(3, 6)
    q = ft.quantize(m)
    h, (hh, c) = q.step(x)
    np.testing.assert_array_equal(h.numpy(), R.quantize(m.to_rnn()).step(x.numpy())[0])
    mb = copy.deepcopy(m).to(torch.bfloat16)
    h, _ = mb.step(x.to(torch.bfloat16))
    model = mb.to_rnn()
    assert model.dtype == ml_dtypes.bfloat16
    want = model.step(x.to(torch.bfloat16).float().numpy())[0]
    np.testing.assert_array_equal(h.float().numpy(), want.astype(np.float32))


def test_export_for_inference(torch, ft):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = ft.LNLSTM(6, 8, num_layers=2, batch_first=True)
            self.out = torch.nn.Linear(8, 3)

        def forward(self, x):
            return self.out(self.rnn(x)[0][:, -1])

    net = Net().eval()
    x = torch.randn(2, 5, 6)
    with torch.no_grad():
        ep = torch.export.export(net, (x,))
        assert torch.equal(ep.module()(x), net(x))
    assert any("fastln.rnn_layer" in str(n.target) for n in ep.graph.nodes)


def test_inference_mode(torch, ft):
    m = _module(torch, ft, "LNLSTM", num_layers=2)
    x = torch.randn(5, 2, 6)
    with torch.no_grad():
        want = m(x)[0]
    with torch.inference_mode():
        q = ft.quantize(m)   # its buffers are inference tensors, without versions
        assert torch.equal(m(x)[0], want)
        assert q(x)[0].shape == want.shape
        assert torch.equal(m.step(x[0])[0], want[0])


def test_step_of_a_bidirectional_module_and_bfloat16_states(torch, ft):
    with pytest.raises(ValueError, match="bidirectional"):
        ft.LNGRU(3, 4, bidirectional=True).step(torch.randn(2, 3))
    pytest.importorskip("ml_dtypes")
    m = ft.LNLSTM(3, 4).to(torch.bfloat16)
    x = torch.randn(5, 2, 3)
    h = torch.randn(1, 2, 4).to(torch.bfloat16)
    with torch.no_grad():   # a bfloat16 state is taken as the float32 state it equals
        assert torch.equal(m(x, (h, h))[0], m(x, (h.float(), h.float()))[0])
