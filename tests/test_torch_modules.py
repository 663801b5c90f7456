"""fastln.torch's modules in training: bitwise the fastln.rnn model on the same
weights (outputs, states and every gradient), torch.nn's LSTM/GRU/RNN for the
plain cells (and their state_dicts both ways), gradcheck, dropout, packed
sequences, torch.compile and the errors."""
import copy
import os

import numpy as np
import pytest

import fastln
import fastln.rnn as R

CELLS = ["LNLSTM", "LNGRU", "LNRNN", "LSTM", "GRU", "RNN"]


@pytest.fixture(scope="module")
def ft(torch):
    import fastln.torch

    return fastln.torch


def _np(t):
    return t.detach().numpy()


def _run(torch, module, x, hx=None, lengths=None, seed=0):
    """Forward and backward of sum(y * g) + sum(h_n * g_h) through module; x
    and hx time-major (or batch-first, as the module) tensors."""
    gen = torch.Generator().manual_seed(seed)
    x = x.detach().clone().requires_grad_()
    hx_in = None
    if hx is not None:
        hx_in = tuple(h.detach().clone().requires_grad_() for h in hx) \
            if isinstance(hx, tuple) else hx.detach().clone().requires_grad_()
    module.zero_grad(set_to_none=True)
    y, state = module(x, hx_in)
    g = torch.randn(y.shape, generator=gen, dtype=y.dtype)
    parts = state if isinstance(state, tuple) else (state,)
    gs = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in parts]
    loss = (y * g).sum() + sum((p * q).sum() for p, q in zip(parts, gs))
    loss.backward()
    dhx = None if hx_in is None else (
        tuple(h.grad for h in hx_in) if isinstance(hx_in, tuple) else hx_in.grad)
    return dict(y=y, state=state, g=g, gs=gs, dx=x.grad, dhx=dhx,
                grads={n: p.grad for n, p in module.named_parameters()})


def _model_grads(module, model):
    """The module's gradients, by its parameter names, from the fastln.rnn model's."""
    H = module.hidden_size
    out = {}
    for name, _ in module.named_parameters():
        if not module._plain:
            out[name] = model.grads[name]
            continue
        base, sfx = name.split("_l", 1)
        key = "_l" + sfx
        bias = model.grads.get("bias" + key)
        if base.startswith("weight"):
            out[name] = model.grads[name]
        elif "bias_hn" + key in model.grads:   # a GRU: b_hh's n block is bias_hn
            hn = model.grads["bias_hn" + key]
            out[name] = bias if base == "bias_ih" else np.concatenate([bias[:2 * H], hn])
        else:
            out[name] = bias
    return out


CASES = [  # (cell, num_layers, bidirectional, batch_first, dtype)
    (cell, L, bi, bf, dt) for cell in CELLS
    for (L, bi, bf, dt) in [(1, False, False, "float32"), (2, True, True, "float32"),
                            (2, False, False, "float64")]]


@pytest.mark.parametrize("cell,L,bi,bf,dt", CASES)
def test_bitwise_the_fastln_rnn_model(torch, ft, cell, L, bi, bf, dt):
    _check_bitwise_the_model(torch, getattr(ft, cell), {}, L, bi, bf, dt)


VARIANTS = [dict(gate_norm="sum", carry="normalized", bias=False),
            dict(gate_norm="per_gate", ln_bias=False), dict(carry="normalized")]


@pytest.mark.parametrize("kw", VARIANTS, ids=["sum", "per_gate", "carry"])
@pytest.mark.parametrize("L,bi,bf,dt", [(1, False, False, "float32"),
                                        (2, True, True, "float64")])
def test_lnlstm_variants_bitwise_the_fastln_rnn_model(torch, ft, kw, L, bi, bf, dt):
    """The variants run the fastln.rnn model of the same options (bias as
    its gate_bias), which has the module's parameters and no others."""
    model = _check_bitwise_the_model(torch, ft.LNLSTM, kw, L, bi, bf, dt)
    assert (model.gate_norm, model.carry, model.gate_bias, model.ln_bias) == (
        kw.get("gate_norm", "pair"), kw.get("carry", "raw"), kw.get("bias", True),
        kw.get("ln_bias", True))
    back = ft.LNLSTM.from_rnn(model)
    assert repr(back) == repr(ft.LNLSTM(5, 7, L, bidirectional=bi, batch_first=bf,
                                        dtype=getattr(torch, dt), **kw))


def _check_bitwise_the_model(torch, cls, kw, L, bi, bf, dt):
    """Forward and backward of a module of cls bitwise its fastln.rnn
    model's, whose parameters are the module's: returns the model."""
    torch.manual_seed(0)
    dtype = getattr(torch, dt)
    m = cls(5, 7, num_layers=L, bidirectional=bi, batch_first=bf, dtype=dtype, **kw)
    with torch.no_grad():   # LayerNorm gains and biases away from 1 and 0
        for p in m.parameters():
            p.add_(torch.randn(p.shape, dtype=dtype) * 0.1)
    D = 2 if bi else 1
    T, B = 6, 3
    x = torch.randn((B, T, 5) if bf else (T, B, 5), dtype=dtype)
    shape = (D * L, B, 7)
    hx = (torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)) \
        if m._has_cell else torch.randn(shape, dtype=dtype)
    got = _run(torch, m, x, hx)
    model = m.to_rnn()
    assert model.batch_first == bf and model.dtype == np.dtype(dt)
    state = tuple(map(_np, hx)) if m._has_cell else _np(hx)
    y, st = model.forward(_np(x), state)
    np.testing.assert_array_equal(_np(got["y"]), y)
    for a, b in zip(got["state"] if m._has_cell else (got["state"],),
                    st if m._has_cell else (st,)):
        np.testing.assert_array_equal(_np(a), b)
    gs = tuple(map(_np, got["gs"])) if m._has_cell else _np(got["gs"][0])
    dx, dst = model.backward(_np(got["g"]), gs)
    np.testing.assert_array_equal(_np(got["dx"]), dx)
    for a, b in zip(got["dhx"] if m._has_cell else (got["dhx"],),
                    dst if m._has_cell else (dst,)):
        np.testing.assert_array_equal(_np(a), b)
    want = _model_grads(m, model)
    assert sorted(got["grads"]) == sorted(want)
    for name, grad in got["grads"].items():
        np.testing.assert_array_equal(_np(grad), want[name], err_msg=name)
    if not m._plain:
        assert sorted(model.params) == sorted(got["grads"])
    return model


@pytest.mark.parametrize("cell", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("bi", [False, True])
def test_plain_cells_match_torch_nn_and_load_its_state_dict(torch, ft, cell, bi):
    torch.manual_seed(1)
    ref = getattr(torch.nn, cell)(6, 8, num_layers=2, bidirectional=bi, batch_first=True)
    m = getattr(ft, cell)(6, 8, num_layers=2, bidirectional=bi, batch_first=True)
    assert m.load_state_dict(ref.state_dict()).missing_keys == []
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in ref.named_parameters()]
    x = torch.randn(3, 9, 6)
    a, b = _run(torch, m, x), _run(torch, ref, x)
    torch.testing.assert_close(a["y"], b["y"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a["dx"], b["dx"], rtol=1e-4, atol=1e-5)
    for name in a["grads"]:
        torch.testing.assert_close(a["grads"][name], b["grads"][name], rtol=1e-4, atol=1e-4)
    back = getattr(torch.nn, cell)(6, 8, num_layers=2, bidirectional=bi, batch_first=True)
    back.load_state_dict(m.state_dict())
    for name, p in back.named_parameters():
        assert torch.equal(p, getattr(m, name))


def test_same_seed_same_initial_weights_as_torch_nn(torch, ft):
    torch.manual_seed(3)
    ref = torch.nn.LSTM(4, 5, num_layers=2, bidirectional=True)
    torch.manual_seed(3)
    m = ft.LSTM(4, 5, num_layers=2, bidirectional=True)
    for (n, p), (n2, q) in zip(m.named_parameters(), ref.named_parameters()):
        assert n == n2 and torch.equal(p, q)


@pytest.mark.parametrize("cell,kw", [("LNLSTM", {}), ("LNGRU", {}), ("LNRNN", {}),
                                     ("LSTM", {}), ("LNLSTM", VARIANTS[0]),
                                     ("LNLSTM", VARIANTS[1])],
                         ids=["LNLSTM", "LNGRU", "LNRNN", "LSTM", "LNLSTM-sum",
                              "LNLSTM-per_gate"])
@pytest.mark.parametrize("bi", [False, True])
def test_gradcheck_in_float64(torch, ft, cell, kw, bi):
    torch.manual_seed(2)
    m = getattr(ft, cell)(3, 4, num_layers=2, bidirectional=bi, dtype=torch.float64, **kw)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, dtype=torch.float64) * 0.1)
    names = [n for n, _ in m.named_parameters()]
    D = 2 if bi else 1
    x = torch.randn(4, 2, 3, dtype=torch.float64, requires_grad=True)
    hs = [torch.randn(2 * D, 2, 4, dtype=torch.float64, requires_grad=True)
          for _ in range(2 if m._has_cell else 1)]
    ps = [p.detach().clone().requires_grad_() for p in m.parameters()]

    def f(x, *rest):
        states, params = rest[:len(hs)], rest[len(hs):]
        hx = tuple(states) if m._has_cell else states[0]
        y, st = torch.func.functional_call(m, dict(zip(names, params)), (x, hx))
        return (y,) + (st if m._has_cell else (st,))

    assert torch.autograd.gradcheck(f, (x, *hs, *ps))


def test_double_backward_raises(torch, ft):
    m = ft.LNLSTM(3, 4, dtype=torch.float64)
    x = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
    y, _ = m(x)
    (gx,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        gx.sum().backward()


@pytest.mark.parametrize("cell", CELLS)
def test_packed_sequences_as_torch_nn_packs_them(torch, ft, cell):
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    torch.manual_seed(4)
    m = getattr(ft, cell)(5, 6, num_layers=2, bidirectional=True, dtype=torch.float64)
    x = torch.randn(7, 4, 5, dtype=torch.float64)
    lengths = torch.tensor([3, 7, 1, 7])
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    out, state = m(packed)
    assert torch.equal(out.batch_sizes, packed.batch_sizes)
    assert torch.equal(out.sorted_indices, packed.sorted_indices)
    y, lens = pad_packed_sequence(out)
    assert torch.equal(lens, lengths)
    model = m.to_rnn()
    y2, st2 = model.forward(_np(x), lengths=lengths.numpy())
    np.testing.assert_array_equal(_np(y), y2)
    for a, b in zip(state if m._has_cell else (state,), st2 if m._has_cell else (st2,)):
        np.testing.assert_array_equal(_np(a), b)
    if cell in ("LSTM", "GRU", "RNN"):
        ref = getattr(torch.nn, cell)(5, 6, num_layers=2, bidirectional=True,
                                      dtype=torch.float64)
        ref.load_state_dict(m.state_dict())
        out_ref, _ = ref(packed)
        torch.testing.assert_close(out.data, out_ref.data)


def test_dropout_between_layers_as_torch_applies_it(torch, ft):
    torch.manual_seed(5)
    m = ft.LNLSTM(4, 6, num_layers=2, dropout=0.5)
    x = torch.randn(5, 3, 4)
    first, second = ft.LNLSTM(4, 6), ft.LNLSTM(6, 6)
    with torch.no_grad():
        for name, p in m.named_parameters():
            layer = first if name.endswith("_l0") else second
            getattr(layer, name[:-1] + "0").copy_(p)
    m.train()
    torch.manual_seed(9)
    y, _ = m(x)
    torch.manual_seed(9)
    y0, _ = first(x)
    want, _ = second(torch.nn.functional.dropout(y0, 0.5, training=True))
    assert torch.equal(y, want)
    m.eval()
    assert torch.equal(m(x)[0], second(first(x)[0])[0])


def test_unbatched_and_empty_inputs(torch, ft):
    m = ft.LNGRU(3, 4, num_layers=2)
    x = torch.randn(5, 3)
    y, h = m(x)
    assert y.shape == (5, 4) and h.shape == (2, 4)
    yb, hb = m(x[:, None])
    assert torch.equal(y, yb[:, 0]) and torch.equal(h, hb[:, 0])
    y, h = m(torch.randn(5, 0, 3))
    assert y.shape == (5, 0, 4) and h.shape == (2, 0, 4)


def test_results_do_not_depend_on_threads_or_isa(torch, ft, restore_threads):
    torch.manual_seed(6)
    m = ft.LNLSTM(16, 32, num_layers=2, bidirectional=True)
    x = torch.randn(9, 5, 16)
    runs = []
    for isa in fastln.supported_isas():
        for n in (1, 2, 4):
            previous = fastln.get_isa()
            fastln._lib._set_isa(isa)
            try:
                with fastln.threads(n):
                    r = _run(torch, m, x)
            finally:
                fastln._lib._set_isa(previous)
            runs.append((isa, n, r))
    isa0, _, first = runs[0]
    for isa, n, r in runs[1:]:
        if isa != isa0:   # the paths' float32 sums differ in order, not the threads'
            continue
        assert torch.equal(r["y"], first["y"]), (isa, n)
        for name in r["grads"]:
            assert torch.equal(r["grads"][name], first["grads"][name]), (isa, n, name)


def test_deterministic_algorithms(torch, ft):
    m = ft.LNLSTM(4, 8)
    x = torch.randn(6, 2, 4)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        a, b = _run(torch, m, x), _run(torch, m, x)
    finally:
        torch.use_deterministic_algorithms(previous)
    assert torch.equal(a["y"], b["y"]) and torch.equal(a["dx"], b["dx"])


def test_trains_in_a_loop_with_an_optimizer(torch, ft):
    torch.manual_seed(7)
    net = torch.nn.ModuleDict(dict(rnn=ft.LNLSTM(3, 16, batch_first=True),
                                   out=torch.nn.Linear(16, 1)))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    x = torch.randn(32, 10, 3)
    target = x.sum(dim=(1, 2))[:, None] / 10
    losses = []
    for _ in range(60):
        opt.zero_grad()
        y, _ = net["rnn"](x)
        loss = torch.nn.functional.mse_loss(net["out"](y[:, -1]), target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]


def test_compile_fullgraph_trains_a_module_with_linear_layers(torch, ft):
    torch.manual_seed(8)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = torch.nn.Linear(4, 6)
            self.rnn = ft.LNLSTM(6, 8, num_layers=2, bidirectional=True)
            self.out = torch.nn.Linear(16, 2)

        def forward(self, x):
            y, (h, c) = self.rnn(torch.tanh(self.inp(x)))
            return self.out(y[-1]).square().sum() + c.sum()

    net = Net()
    twin = copy.deepcopy(net)
    compiled = torch.compile(twin, fullgraph=True)   # inductor, through AOTAutograd
    x = torch.randn(5, 3, 4)
    loss = net(x)
    loss.backward()
    loss_c = compiled(x)
    loss_c.backward()
    torch.testing.assert_close(loss_c, loss)
    for (name, p), q in zip(net.named_parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)


def test_fake_shapes_match_the_operators(torch, ft):
    """register_fake's shapes (the cache's size included) are the real ones."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fastln.torch import _ops

    for cell, has_c, D in [("lstm", True, 2), ("gru", False, 1), ("rnn_relu_plain", False, 2),
                           ("gru_plain", False, 1), ("lstm_plain", True, 1)]:
        m = {"lstm": ft.LNLSTM(3, 4, bidirectional=D == 2),
             "gru": ft.LNGRU(3, 4), "gru_plain": ft.GRU(3, 4),
             "lstm_plain": ft.LSTM(3, 4),
             "rnn_relu_plain": ft.RNN(3, 4, nonlinearity="relu", bidirectional=True)}[cell]
        params = [p.detach() for d in range(D) for p in m._engine_params(0, d)]
        args = (torch.randn(5, 2, 3), torch.zeros(D, 2, 4),
                torch.zeros(D, 2, 4) if has_c else None)
        real = _ops.rnn_layer(*args, params, None, cell, 1e-5, D, True)
        with FakeTensorMode(allow_non_fake_inputs=True):
            fake = _ops.rnn_layer(*args, params, None, cell, 1e-5, D, True)
        assert [tuple(t.shape) for t in fake] == [tuple(t.shape) for t in real], cell
        assert real[3].shape[1] == R.functional.cache_size(cell, 5, 2, 4)


def test_compile_with_dynamic_shapes(torch, ft):
    m = ft.LNGRU(3, 4)
    f = torch.compile(m, fullgraph=True, dynamic=True, backend="aot_eager")
    for T, B in [(5, 2), (7, 3), (4, 6)]:
        x = torch.randn(T, B, 3)
        assert torch.equal(f(x)[0], m(x)[0])


def test_import_fastln_does_not_import_torch():
    from _util import run_python

    r = run_python("import sys, fastln, fastln.rnn, fastln.rnn.functional; "
                   "print('torch' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


BAD = [  # (call, error, words of the message)
    (lambda t, m: m(t.randn(5, 3, 4, dtype=t.float64)), TypeError, "input has dtype"),
    (lambda t, m: m(t.randn(5, 3, 4).int()), TypeError, "input has dtype"),
    (lambda t, m: m(t.randn(5, 3, 4, device="meta")), ValueError, "input is on meta"),
    (lambda t, m: m(t.randn(5, 3, 2)), ValueError, "input must have shape"),
    (lambda t, m: m(t.randn(4)), ValueError, "input must have shape"),
    (lambda t, m: m([[1.0]]), TypeError, "input must be a torch.Tensor"),
    (lambda t, m: m(t.randn(5, 3, 4), t.zeros(1, 3, 6)), TypeError, "tuple (h_0, c_0)"),
    (lambda t, m: m(t.randn(5, 3, 4), (t.zeros(2, 3, 6), t.zeros(1, 3, 6))), ValueError,
     "hx[0] must have shape"),
    (lambda t, m: m(t.randn(5, 3, 4), (t.zeros(1, 3, 6), t.zeros(1, 3, 6).double())),
     TypeError, "hx[1] has dtype"),
    (lambda t, m: m(t.randn(5, 3, 4), (t.zeros(1, 3, 6, device="meta"), t.zeros(1, 3, 6))),
     ValueError, "hx[0] is on meta"),
    (lambda t, m: m.step(t.randn(3, 5)), ValueError, "input must have shape"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_calls_raise_naming_the_argument(torch, ft, case):
    call, error, words = BAD[case]
    m = ft.LNLSTM(4, 6)
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        call(torch, m)


BAD_CONSTRUCTION = [
    (dict(input_size=0, hidden_size=3), ValueError, "input_size"),
    (dict(input_size=2.5, hidden_size=3), TypeError, "input_size"),
    (dict(input_size=2, hidden_size=3, num_layers=0), ValueError, "num_layers"),
    (dict(input_size=2, hidden_size=3, dropout=1.5), ValueError, "dropout"),
    (dict(input_size=2, hidden_size=3, device="meta"), ValueError, "device"),
    (dict(input_size=2, hidden_size=3, dtype="int32"), TypeError, "dtype"),
    (dict(input_size=2, hidden_size=3, eps=-1.0), ValueError, "eps"),
    (dict(input_size=2, hidden_size=3, batch_first="yes"), TypeError, "batch_first"),
]


@pytest.mark.parametrize("case", range(len(BAD_CONSTRUCTION)))
def test_bad_construction_raises_naming_the_argument(torch, ft, case):
    kwargs, error, name = BAD_CONSTRUCTION[case]
    if kwargs.get("dtype") == "int32":
        kwargs = dict(kwargs, dtype=torch.int32)
    with pytest.raises(error, match=name):
        ft.LNLSTM(**kwargs)


def test_plain_lstm_refuses_a_projection_and_rnn_a_bad_nonlinearity(torch, ft):
    with pytest.raises(ValueError, match="proj_size"):
        ft.LSTM(3, 4, proj_size=2)
    with pytest.raises(ValueError, match="nonlinearity"):
        ft.RNN(3, 4, nonlinearity="gelu")
    with pytest.raises(TypeError, match="construct"):
        ft.RecurrentModule(3, 4, 1, True, False, 0.0, False, 1e-5, None, None, "lstm")


def test_weight_matrices_are_column_major_and_stay_so(torch, ft):
    """The engine reads column-major weight matrices in place; loading a
    state_dict, an optimizer's step and .to() keep the layout."""
    m = ft.LSTM(3, 4)
    assert m.weight_ih_l0.stride() == (1, 16) and m.weight_hh_l0.stride() == (1, 16)
    m.load_state_dict(torch.nn.LSTM(3, 4).state_dict())
    opt = torch.optim.Adam(m.parameters())
    m(torch.randn(2, 1, 3))[0].sum().backward()
    opt.step()
    assert m.weight_hh_l0.grad.stride() == (1, 16)
    assert m.double().weight_hh_l0.stride() == (1, 16)


def test_repr_and_module_names(torch, ft):
    assert repr(ft.LNLSTM(3, 4, num_layers=2, bidirectional=True)) == \
        "LNLSTM(3, 4, num_layers=2, bidirectional=True, eps=1e-05)"
    assert repr(ft.RNN(3, 4, nonlinearity="relu", bias=False)) == \
        "RNN(3, 4, bias=False, nonlinearity='relu')"
    assert ft.LNLSTM.__module__ == "fastln.torch"
    assert sorted(n for n, _ in ft.LNLSTM(3, 4, bias=False).named_parameters()) == [
        "ln_c_bias_l0", "ln_c_weight_l0", "ln_hh_bias_l0", "ln_hh_weight_l0", "ln_ih_bias_l0",
        "ln_ih_weight_l0", "weight_hh_l0", "weight_ih_l0"]


def test_conversions_share_memory_where_layouts_allow(torch, ft):
    m = ft.LNLSTM(3, 4)
    model = m.to_rnn()
    assert np.shares_memory(model.params["weight_hh_l0"], _np(m.weight_hh_l0))
    with torch.no_grad():
        m.ln_c_weight_l0.fill_(2.0)
    assert (model.params["ln_c_weight_l0"] == 2.0).all()
    back = ft.LNLSTM.from_rnn(model)
    assert back.weight_hh_l0.data_ptr() == m.weight_hh_l0.data_ptr()
    fresh = R.LNLSTM(3, 4, seed=0)   # a model's own weight matrices, column-major
    module = ft.LNLSTM.from_rnn(fresh)
    assert all(np.shares_memory(_np(p), fresh.params[n]) for n, p in module.named_parameters())
    assert module.weight_ih_l0.stride() == (1, 16)
    fresh.params["weight_ih_l0"] = np.ascontiguousarray(fresh.params["weight_ih_l0"][:, ::-1])
    module = ft.LNLSTM.from_rnn(fresh)   # a row-major one is shared as it is
    assert np.shares_memory(_np(module.weight_ih_l0), fresh.params["weight_ih_l0"])
    fresh.params["weight_ih_l0"] = fresh.params["weight_ih_l0"][:, ::-1]   # copied
    module = ft.LNLSTM.from_rnn(fresh)
    np.testing.assert_array_equal(_np(module.weight_ih_l0), fresh.params["weight_ih_l0"])
    with pytest.raises(TypeError, match="fastln.rnn.LNLSTM"):
        ft.LNLSTM.from_rnn(R.LSTM(3, 4))
    g = R.GRU(3, 4, linear_before_reset=False)
    with pytest.raises(ValueError, match="linear_before_reset"):
        ft.GRU.from_rnn(g)
    plain = R.GRU(3, 4, seed=1)
    mg = ft.GRU.from_rnn(plain)
    x = np.random.default_rng(0).standard_normal((5, 2, 3)).astype(np.float32)
    with torch.no_grad():
        np.testing.assert_array_equal(_np(mg(torch.from_numpy(x))[0]),
                                      plain.forward(x, cache=False)[0])


def test_torch_set_num_threads_caps_fastln_where_they_share_openmp(torch, ft):
    """One libgomp.so.1 in the process (torch's Linux wheels and fastln both
    load it by that name): torch.set_num_threads caps fastln's count, as the
    module's docstring says; with two it leaves fastln's alone. (Wheels that
    bundle a renamed copy, libgomp-<hash>.so.1, keep it to themselves.)"""
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("reads the process's libraries from Linux's /proc/self/maps")
    with open("/proc/self/maps", encoding="utf-8") as f:
        runtimes = {line.split()[-1] for line in f
                    if os.path.basename(line.split()[-1]).startswith("libgomp.so")}
    before, fastln_before = torch.get_num_threads(), fastln.get_num_threads()
    try:
        torch.set_num_threads(1)
        want = 1 if len(runtimes) == 1 else fastln_before
        assert fastln.get_num_threads() == want, runtimes
    finally:
        torch.set_num_threads(before)
    assert fastln.get_num_threads() == fastln_before
