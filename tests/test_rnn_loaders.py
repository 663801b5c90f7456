"""LNLSTM.from_torch and LNLSTM.from_keras, each checked against the code of
the implementation it loads: torchaudio's and NeMo's own source (from their
released wheels, see _upstream.py), PyTorch's fastrnns benchmark cell, and
NumPy transcriptions of TensorFlow's cells. Random weights, LayerNorm gains
and biases included, and a random initial state; over 50 steps, float64
within 1e-10, and float32 within 1e-5 over the first 10 (the float32 rounding
grows with the steps); for the torch modules, the gradients of backward
against torch's autograd likewise (float32's within 1e-4, see GRAD_TOL)."""
import warnings

import numpy as np
import pytest

import fastln.rnn_reference as ref
from fastln.rnn import LNLSTM

import _upstream
from _util import named, require

I, H, B, T, F32_STEPS = 5, 8, 3, 50, 10
TOL = {"float64": 1e-10, "float32": 1e-5}
# float32 gradients back through 10 steps and up to 3 layers of LayerNorms lose
# more: torch's own float32 gradients are as far from the exact ones
GRAD_TOL = {"float64": 1e-10, "float32": 1e-4}


def _close(got, want, tol, err_msg=""):
    """got within tol of want, relative to want's magnitude (at least 1)."""
    want = np.asarray(want, np.float64)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol * scale,
                               err_msg=err_msg)


def _layer_norm(a, gain, bias, eps):
    mean = a.mean(-1, keepdims=True)
    return (a - mean) / np.sqrt(((a - mean) ** 2).mean(-1, keepdims=True) + eps) * gain + bias


def _sigmoid(a):
    return 1 / (1 + np.exp(-a))


# ---------------------------------------------------------------- the torch implementations

def _randomize(torch, module, seed=0):
    """Random parameters: weights of scale 1/sqrt(fan-in), LayerNorm gains
    about 1 and biases about 0, each perturbed."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if p.ndim == 2:
                r = r / p.shape[1] ** 0.5
            elif name.endswith("weight"):
                r = 1 + 0.3 * r
            else:
                r = 0.3 * r
            p.copy_(r.to(p.dtype))
    return module


def _fastrnns(torch, L, decompose):
    """PyTorch's benchmarks/fastrnns/custom_lstms.py, script_lnlstm(I, H, L,
    decompose_layernorm=...), transcribed: the benchmark lives in PyTorch's
    repository, in no wheel. Its LayerNormLSTMCell's forward is the one that
    NeMo's rnn.py runs (checked from NeMo's own source below); this adds its
    decomposed LayerNorm, without eps, and its module names."""
    nn = torch.nn

    class DecomposedLayerNorm(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))
            self.bias = nn.Parameter(torch.zeros(n))

        def forward(self, a):
            mu, sigma = a.mean(-1, keepdim=True), a.std(-1, keepdim=True, unbiased=False)
            return (a - mu) / sigma * self.weight + self.bias

    class LayerNormLSTMCell(nn.Module):
        def __init__(self, n_in, n):
            super().__init__()
            self.weight_ih = nn.Parameter(torch.randn(4 * n, n_in))
            self.weight_hh = nn.Parameter(torch.randn(4 * n, n))
            norm = DecomposedLayerNorm if decompose else nn.LayerNorm
            self.layernorm_i, self.layernorm_h = norm(4 * n), norm(4 * n)
            self.layernorm_c = norm(n)

        def forward(self, x, state):
            h, c = state
            gates = (self.layernorm_i(x @ self.weight_ih.t())
                     + self.layernorm_h(h @ self.weight_hh.t()))
            i, f, g, o = gates.chunk(4, 1)
            c = self.layernorm_c(torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g))
            h = torch.sigmoid(o) * torch.tanh(c)
            return h, (h, c)

    class LSTMLayer(nn.Module):
        def __init__(self, n_in, n):
            super().__init__()
            self.cell = LayerNormLSTMCell(n_in, n)

        def forward(self, x, state):
            outs = []
            for x_t in x.unbind(0):
                out, state = self.cell(x_t, state)
                outs.append(out)
            return torch.stack(outs), state

    class StackedLSTM(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([LSTMLayer(I if k == 0 else H, H) for k in range(L)])

        def forward(self, x, states):
            out = []
            for layer, s in zip(self.layers, states):
                x, s = layer(x, s)
                out.append(s)
            return x, out

    return StackedLSTM()


def _build(torch, impl, L):
    """(module, run, names): an implementation's module of L layers, a
    function running it as its model does (x, h0, c0 -> y, h_n, c_n, states
    stacked as fastln's), and fastln's name of each of its parameters."""
    if impl.startswith("torchaudio"):
        rnnt = _upstream.torchaudio_rnnt()
        if impl == "torchaudio-cell":   # one _CustomLSTM
            module = rnnt._CustomLSTM(I, H, layer_norm=True, layer_norm_epsilon=1e-3)
            layers = [module]
        else:   # the lstm_layers of the RNN-T predictor, run as its forward runs them
            module = rnnt._Predictor(num_symbols=7, output_dim=H, symbol_embedding_dim=I,
                                     num_lstm_layers=L, lstm_hidden_dim=H,
                                     lstm_layer_norm=True,
                                     lstm_layer_norm_epsilon=1e-3).lstm_layers
            layers = list(module)

        def run(x, h0, c0):
            states = []
            for k, layer in enumerate(layers):
                x, s = layer(x, [h0[k], c0[k]])
                states.append(s)
            return x, torch.stack([s[0] for s in states]), torch.stack([s[1] for s in states])

        names = {"x2g.weight": "weight_ih", "p2g.weight": "weight_hh",
                 "g_norm.weight": "ln_weight", "g_norm.bias": "ln_bias",
                 "c_norm.weight": "ln_c_weight", "c_norm.bias": "ln_c_bias"}
        prefix = "" if impl == "torchaudio-cell" else "{k}."
    else:
        if impl == "nemo":   # the stack NeMo's rnn(norm="layer") makes, scripted
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", ".*torch.jit.script", DeprecationWarning)
                module = _upstream.nemo_rnn().rnn(I, H, L, norm="layer", forget_gate_bias=1.0)
        else:
            module = _fastrnns(torch, L, decompose=impl == "fastrnns-decomposed")

        def run(x, h0, c0):
            y, states = module(x, [(h0[k], c0[k]) for k in range(L)])
            return y, torch.stack([s[0] for s in states]), torch.stack([s[1] for s in states])

        names = {"weight_ih": "weight_ih", "weight_hh": "weight_hh",
                 "layernorm_i.weight": "ln_ih_weight", "layernorm_i.bias": "ln_ih_bias",
                 "layernorm_h.weight": "ln_hh_weight", "layernorm_h.bias": "ln_hh_bias",
                 "layernorm_c.weight": "ln_c_weight", "layernorm_c.bias": "ln_c_bias"}
        prefix = "layers.{k}.cell."
    fastln_names = {prefix.format(k=k) + name: f"{new}_l{k}"
                    for k in range(L) for name, new in names.items()}
    return module, run, fastln_names


TORCH_CASES = [("torchaudio-cell", 1), ("torchaudio-layers", 1), ("torchaudio-layers", 2),
               ("nemo", 1), ("nemo", 3), ("fastrnns", 1), ("fastrnns", 2),
               ("fastrnns-decomposed", 2)]
OPTIONS = {"torchaudio": ("sum", 1e-3), "nemo": ("pair", 1e-5), "fastrnns": ("pair", 1e-5),
           "fastrnns-decomposed": ("pair", 0.0)}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("impl, L", TORCH_CASES, ids=[f"{i}-{L}l" for i, L in TORCH_CASES])
def test_from_torch_against_the_implementation(torch, impl, L, dtype, rng):
    module, run, names = _build(torch, impl, L)
    module = _randomize(torch, module.to(getattr(torch, dtype)))
    m = LNLSTM.from_torch(module)
    gate_norm, eps = OPTIONS[impl.split("-")[0] if impl.startswith("torchaudio") else impl]
    assert (m.input_size, m.hidden_size, m.num_layers, m.dtype) == (I, H, L, np.dtype(dtype))
    assert (m.gate_norm, m.carry, m.eps, m.batch_first) == (gate_norm, "normalized", eps, False)
    assert not any(k.startswith("bias_l") for k in m.params)   # the LN biases are the biases
    sd = module.state_dict()
    assert sorted(names) == sorted(sd) and all(
        np.array_equal(m.params[names[k]], v.numpy()) for k, v in sd.items())

    # the module's own code runs in float64 on the same values: what a float32
    # model is compared to is the exact result, not torch's float32 rounding
    module.double()
    x = rng.standard_normal((T, B, I)).astype(dtype)
    h0, c0 = (rng.standard_normal((L, B, H)).astype(dtype) for _ in range(2))
    xt, h0t, c0t = (torch.from_numpy(a).double().requires_grad_() for a in (x, h0, c0))
    yt, hnt, cnt = run(xt, h0t, c0t)
    y, (hn, cn) = m.forward(x, (h0, c0))
    tol, steps = TOL[dtype], T if dtype == "float64" else F32_STEPS
    _close(y[:steps], yt.detach()[:steps].numpy(), tol, "y")
    if dtype == "float64":
        _close(hn, hnt.detach().numpy(), tol, "h_n")
        _close(cn, cnt.detach().numpy(), tol, "c_n")

    # the gradients of a loss on the steps compared (and, in float64, the final state)
    dy = np.zeros_like(y)
    dy[:steps] = rng.standard_normal(dy[:steps].shape)
    dh, dc = (rng.standard_normal(hn.shape).astype(dtype) * (dtype == "float64")
              for _ in range(2))
    loss = sum((a * torch.from_numpy(b).double()).sum()
               for a, b in [(yt, dy), (hnt, dh), (cnt, dc)])
    loss.backward()
    dx, (dh0, dc0) = m.backward(dy, (dh, dc))
    tol = GRAD_TOL[dtype]
    _close(dx, xt.grad.numpy(), tol, "dx")
    _close(dh0, h0t.grad.numpy(), tol, "dh0")
    _close(dc0, c0t.grad.numpy(), tol, "dc0")
    for name, p in module.named_parameters():
        _close(m.grads[names[name]], p.grad.numpy(), tol, name)


@pytest.mark.parametrize("impl, L", [("torchaudio-layers", 2), ("nemo", 2), ("fastrnns", 1)])
def test_from_torch_takes_the_state_dict(torch, impl, L):
    module = _randomize(torch, _build(torch, impl, L)[0])
    m = LNLSTM.from_torch(module)
    eps = 1e-3 if impl.startswith("torchaudio") else None   # (torchaudio's needs it)
    m2 = LNLSTM.from_torch(module.state_dict(), eps=eps)
    assert m2.eps == m.eps and m2.gate_norm == m.gate_norm and m2.carry == m.carry
    assert m.params.keys() == m2.params.keys()
    assert all(np.array_equal(m.params[k], m2.params[k]) for k in m.params)


def test_from_torch_eps(torch):
    rnnt = _upstream.torchaudio_rnnt()
    layers = torch.nn.ModuleList([rnnt._CustomLSTM(n_in, H, layer_norm=True, layer_norm_epsilon=e)
                                  for n_in, e in [(I, 1e-3), (H, 1e-4)]])
    with pytest.raises(ValueError, match=named("module")):   # one eps per model
        LNLSTM.from_torch(layers)
    assert LNLSTM.from_torch(layers, eps=1e-4).eps == 1e-4
    with pytest.raises(ValueError, match=named("eps")):   # torchaudio's models set their own
        LNLSTM.from_torch(layers.state_dict())
    cell = _upstream.nemo_rnn().LayerNormLSTMCell(I, H, 1.0)
    assert LNLSTM.from_torch(cell).eps == 1e-5
    assert LNLSTM.from_torch(cell, eps=0.5).eps == 0.5


def test_from_torch_bfloat16(torch, rng):
    """A bfloat16 module gives a bfloat16 model (inference), close to the float32 one."""
    require("ml_dtypes")
    module = _randomize(torch, _build(torch, "torchaudio-layers", 2)[0])
    m32 = LNLSTM.from_torch(module)
    m16 = LNLSTM.from_torch(module.to(torch.bfloat16))
    assert m16.dtype.name == "bfloat16" and m16.gate_norm == "sum"
    x = rng.standard_normal((4, B, I)).astype(np.float32)
    y16, _ = m16.forward(x, cache=False)
    y32, _ = m32.forward(x)
    np.testing.assert_allclose(np.asarray(y16, np.float32), y32, atol=0.1)


def test_from_torch_refuses(torch):
    rnnt = _upstream.torchaudio_rnnt()
    with pytest.raises(ValueError, match=named("fastln.rnn.LSTM")):   # no LayerNorm there
        LNLSTM.from_torch(torch.nn.ModuleList([rnnt._CustomLSTM(I, H) for _ in range(2)]))
    with pytest.raises(ValueError, match=named("module")):
        LNLSTM.from_torch(torch.nn.LSTM(3, 4))
    with pytest.raises(ValueError, match=named("module")):   # torchaudio's predictor whole
        LNLSTM.from_torch(rnnt._Predictor(7, H, I, 2, H, lstm_layer_norm=True))
    with pytest.raises(ValueError, match=named("module")):
        LNLSTM.from_torch({})
    with pytest.raises(ValueError, match=named("module")):   # layers 0 and 2
        LNLSTM.from_torch({k: v for k, v in _fastrnns(torch, 3, False).state_dict().items()
                           if not k.startswith("layers.1.")})
    with pytest.raises(ValueError, match=named("module")):   # layer 1 without weight_hh
        LNLSTM.from_torch({k: v for k, v in _fastrnns(torch, 2, False).state_dict().items()
                           if k != "layers.1.cell.weight_hh"})
    with pytest.raises(TypeError, match=named("module")):
        LNLSTM.from_torch(42)
    with pytest.raises(TypeError, match=named("module")):
        LNLSTM.from_torch(_fastrnns(torch, 1, False).half())


# ---------------------------------------------------------------- TensorFlow's cells

def _tfa_forward(layers, x, eps=1e-3):
    """TF Addons' LayerNormLSTMCell.call (tensorflow_addons/rnn/layer_norm_lstm_cell.py,
    release 0.23.0) in NumPy, float64, layer after layer over x (B, T, I):
    z = kernel_norm(x @ kernel) + recurrent_norm(h @ recurrent_kernel) + bias;
    Keras' LSTMCell's fused carry with z's blocks i, f, c, o; c = state_norm(c);
    h = o * tanh(c). Keras' LayerNormalization: (a - mean) / sqrt(var + eps)
    * gamma + beta."""
    y = x.astype(np.float64)
    for w in layers:
        kernel, rec, bias, kg, kb, rg, rb, sg, sb = (np.asarray(a, np.float64) for a in w)
        h = c = np.zeros((y.shape[0], rec.shape[0]))
        out = []
        for t in range(y.shape[1]):
            z = (_layer_norm(y[:, t] @ kernel, kg, kb, eps) + _layer_norm(h @ rec, rg, rb, eps)
                 + bias)
            z0, z1, z2, z3 = np.split(z, 4, axis=1)
            c = _sigmoid(z1) * c + _sigmoid(z0) * np.tanh(z2)
            c = _layer_norm(c, sg, sb, eps)
            h = _sigmoid(z3) * np.tanh(c)
            out.append(h)
        y = np.stack(out, axis=1)
    return y


def _tf1_forward(layers, x, forget_bias=1.0, eps=1e-12):
    """TF1's tf.contrib.rnn.LayerNormBasicLSTMCell.call (tensorflow/contrib/rnn/
    python/ops/rnn_cell.py) in NumPy, float64, layer after layer over x
    (B, T, I): one product of [x, h] with the kernel, split into i, j, f, o,
    each normalized by its own LayerNorm (tf.contrib.layers.layer_norm, eps
    1e-12); c = LN_state(c * sigmoid(f + forget_bias) + sigmoid(i) * tanh(j));
    h = tanh(c) * sigmoid(o)."""
    y = x.astype(np.float64)
    for w in layers:
        kernel, *norms = (np.asarray(a, np.float64) for a in w)
        n = kernel.shape[1] // 4
        h = c = np.zeros((y.shape[0], n))
        out = []
        for t in range(y.shape[1]):
            gates = np.split(np.concatenate([y[:, t], h], axis=1) @ kernel, 4, axis=1)
            i, j, f, o = (_layer_norm(g, norms[2 * b], norms[2 * b + 1], eps)
                          for b, g in enumerate(gates))
            c = c * _sigmoid(f + forget_bias) + _sigmoid(i) * np.tanh(j)
            c = _layer_norm(c, norms[8], norms[9], eps)
            h = np.tanh(c) * _sigmoid(o)
            out.append(h)
        y = np.stack(out, axis=1)
    return y


def _tfa_weights(rng, L, dtype):
    """Random TF Addons LayerNormLSTMCell weights of L stacked cells, per cell
    in get_weights() order."""
    layers = []
    for k in range(L):
        n_in = I if k == 0 else H
        layers.append([rng.standard_normal((n_in, 4 * H)) / n_in ** 0.5,
                       rng.standard_normal((H, 4 * H)) / H ** 0.5,
                       0.3 * rng.standard_normal(4 * H)]
                      + [f(n) for n in (4 * H, 4 * H, H)
                         for f in (lambda n: 1 + 0.3 * rng.standard_normal(n),
                                   lambda n: 0.3 * rng.standard_normal(n))])
    return [[a.astype(dtype) for a in w] for w in layers]


def _tf1_weights(rng, L, dtype):
    """Random LayerNormBasicLSTMCell variables of L stacked cells, per cell in
    the order it makes them (kernel, then gamma and beta of input, transform,
    forget, output, state)."""
    layers = []
    for k in range(L):
        n_in = (I if k == 0 else H) + H
        layers.append([rng.standard_normal((n_in, 4 * H)) / n_in ** 0.5]
                      + [f(H) for _ in range(5)
                         for f in (lambda n: 1 + 0.3 * rng.standard_normal(n),
                                   lambda n: 0.3 * rng.standard_normal(n))])
    return [[a.astype(dtype) for a in w] for w in layers]


KERAS_CASES = [("LayerNormLSTMCell", 1), ("LayerNormLSTMCell", 2),
               ("LayerNormBasicLSTMCell", 1), ("LayerNormBasicLSTMCell", 2)]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("cell, L", KERAS_CASES, ids=[f"{c}-{L}l" for c, L in KERAS_CASES])
def test_from_keras_against_the_cell(cell, L, dtype, rng):
    tfa = cell == "LayerNormLSTMCell"
    layers = (_tfa_weights if tfa else _tf1_weights)(rng, L, dtype)
    flat = [a for w in layers for a in w]
    m = LNLSTM.from_keras(flat, cell)
    assert (m.input_size, m.hidden_size, m.num_layers, m.dtype) == (I, H, L, np.dtype(dtype))
    assert m.batch_first and m.carry == "normalized"
    assert (m.gate_norm, m.eps, "bias_l0" in m.params) == (
        ("pair", 1e-3, True) if tfa else ("per_gate", 1e-12, False))
    x = rng.standard_normal((B, T, I)).astype(dtype)
    want = _tfa_forward(layers, x) if tfa else _tf1_forward(layers, x)
    y, _ = m.forward(x)
    tol, steps = TOL[dtype], T if dtype == "float64" else F32_STEPS
    _close(y[:, :steps], want[:, :steps], tol)
    if dtype == "float64":   # and the reference, from fastln's own equations
        y_ref, _ = ref.lnlstm_forward(m.params, x, num_layers=L, eps=m.eps, batch_first=True,
                                      gate_norm=m.gate_norm, carry=m.carry)
        _close(y, y_ref, tol)


@pytest.mark.parametrize("cell", ["LayerNormLSTMCell", "LayerNormBasicLSTMCell"])
def test_from_keras_gives_the_published_outputs(cell):
    """The outputs that TensorFlow's own tests assert for each cell: TF Addons'
    tensorflow_addons/rnn/tests/layer_norm_lstm_cell_test.py (test_cell_output,
    norm_epsilon=1e-12) and TF1's tensorflow/contrib/rnn/python/kernel_tests/
    rnn_cell_test.py (LayerNormBasicLSTMCellTest.testBasicLSTMCell): kernels
    (and TF Addons' bias) 0.5, LayerNorm gains 1 and biases 0; two stacked cells of 2 units
    on x = [1, 1], from h = [.2, .3], c = [0, .1] and h = [.6, .7], c = [.4, .5];
    one cell on x = [1, 1, 1] from the first state."""
    n = 2
    if cell == "LayerNormLSTMCell":
        def weights(n_in):
            return ([np.full((n_in, 4 * n), 0.5), np.full((n, 4 * n), 0.5), np.full(4 * n, 0.5)]
                    + [np.ones(4 * n), np.zeros(4 * n)] * 2 + [np.ones(n), np.zeros(n)])
        want_h, eps = [-0.47406167, 0.47406143], 1e-12
    else:
        def weights(n_in):
            return [np.full((n_in + n, 4 * n), 0.5)] + [np.ones(n), np.zeros(n)] * 5
        want_h, eps = [-0.38079708, 0.38079708], None
    h0, c0 = np.array([[[.2, .3]], [[.6, .7]]]), np.array([[[0, .1]], [[.4, .5]]])
    for dtype in (np.float32, np.float64):
        for n_in, L in [(2, 2), (3, 1)]:
            w = [a.astype(dtype) for k in range(L) for a in weights(n_in if k == 0 else n)]
            m = LNLSTM.from_keras(w, cell, eps=eps)
            y, (h, c) = m.forward(np.ones((1, 1, n_in), dtype),
                                  (h0[:L].astype(dtype), c0[:L].astype(dtype)))
            np.testing.assert_allclose(y[0, 0], want_h, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(h[:, 0], [want_h] * L, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(c[:, 0], [[-1.0, 1.0]] * L, rtol=1e-5, atol=1e-6)


def test_from_keras_options(rng):
    w = _tfa_weights(rng, 1, np.float64)[0]
    no_bias = LNLSTM.from_keras(w[:2] + w[3:])   # use_bias=False: 8 weights
    assert "bias_l0" not in no_bias.params
    x = rng.standard_normal((B, 6, I))
    y, _ = no_bias.forward(x)
    _close(y, _tfa_forward([w[:2] + [np.zeros(4 * H)] + w[3:]], x), 1e-10)
    assert LNLSTM.from_keras(w, eps=1e-5).eps == 1e-5
    v = _tf1_weights(rng, 1, np.float64)[0]
    m = LNLSTM.from_keras(v, "LayerNormBasicLSTMCell", forget_bias=0.0)
    _close(m.forward(x)[0], _tf1_forward([v], x, forget_bias=0.0), 1e-10)


def test_from_keras_refuses(rng):
    w = _tfa_weights(rng, 2, np.float32)
    with pytest.raises(ValueError, match=named("cell")):
        LNLSTM.from_keras(w[0], "LSTMCell")
    with pytest.raises(ValueError, match=named("forget_bias")):
        LNLSTM.from_keras(w[0], forget_bias=1.0)
    with pytest.raises(TypeError, match=named("weights")):
        LNLSTM.from_keras(np.zeros(3))
    with pytest.raises(TypeError, match=named("weights")):
        LNLSTM.from_keras([a.astype(np.float16) for a in w[0]])
    with pytest.raises(TypeError, match=named("weights")):
        LNLSTM.from_keras(w[0][:1] + [a.astype(np.float64) for a in w[0][1:]])
    with pytest.raises(ValueError, match=named("weights")):
        LNLSTM.from_keras([])
    with pytest.raises(ValueError, match=named("weights")):   # a weight short
        LNLSTM.from_keras(w[0] + w[1][:-1])
    with pytest.raises(ValueError, match=named("weights")):   # the second layer reads H
        LNLSTM.from_keras(w[0] + w[0])
    with pytest.raises(ValueError, match=named("weights")):   # a bias in one layer only
        LNLSTM.from_keras(w[0] + w[1][:2] + w[1][3:])
    with pytest.raises(ValueError, match=named("weights")):   # TF Addons' weights as TF1's
        LNLSTM.from_keras(w[0], "LayerNormBasicLSTMCell")
