"""The training examples (examples/sequential_digits.py, its PyTorch loop
examples/sequential_digits_torch.py, examples/longer_sequences.py) run end to end
with tiny settings, and their shared pieces (examples/_common.py:
NumPy Adam, the linear readout, the losses) are right.

The examples need scikit-learn, tqdm and matplotlib: skipped when one is
missing, unless the CI variable is set (as in CI), where that is a failure; the
PyTorch loop needs torch too (the ``torch`` fixture: a failure under
FASTLN_REQUIRE_TORCH=1).
"""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import fastln

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
sys.path.insert(0, EXAMPLES)

import longer_sequences  # noqa: E402
import sequential_digits  # noqa: E402

import _common as C  # noqa: E402


@pytest.fixture(scope="module")
def example_deps():
    """scikit-learn, tqdm and matplotlib: skip when missing, fail under CI."""
    missing = []
    for name in ("sklearn", "tqdm", "matplotlib"):
        try:
            __import__(name)
        except Exception as exc:  # ImportError, or a broken install
            missing.append(f"{name} ({exc!r})")
    if missing:
        msg = "the examples need " + ", ".join(missing)
        if os.environ.get("CI"):
            pytest.fail("CI is set but " + msg)
        pytest.skip(msg)


def check_png(path):
    """The PNG exists, is a real picture and not blank."""
    import matplotlib.image

    assert os.path.getsize(path) > 10_000, os.path.getsize(path)
    img = matplotlib.image.imread(path)
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 300, img.shape
    assert img[..., :3].std() > 0.05          # lines and text on white
    assert len(np.unique(img[..., :3].reshape(-1, 3), axis=0)) > 20


# ---------------------------------------------------------------- smoke runs

DIGITS_ARGS = ["--epochs", "2", "--seeds", "1", "--lrs", "1e-2", "--hidden", "16",
               "--subset", "150", "--no-progress"]


def test_sequential_digits_smoke(example_deps, tmp_path, capsys):
    png = tmp_path / "digits.png"
    res = sequential_digits.main(DIGITS_ARGS + ["--out", str(png)])
    out = capsys.readouterr().out
    lines = re.findall(r"^lr=0\.01 seed=0 (LN-LSTM|LSTM) +epoch +(\d+)  train loss "
                       r"(\d+\.\d+)  test acc (\d\.\d{4})$", out, re.M)
    assert [(m, int(e)) for m, e, _, _ in lines] == [
        ("LN-LSTM", 1), ("LN-LSTM", 2), ("LSTM", 1), ("LSTM", 2)], out
    for _, _, loss, acc in lines:
        assert np.isfinite(float(loss)) and 0.0 <= float(acc) <= 1.0
    assert "| LN-LSTM |" in out and "| LSTM |" in out and "epochs to 0.85" in out
    assert re.search(r"^wall time: \d+\.\d s$", out, re.M), out
    check_png(png)
    assert res["out"] == str(png)
    # 150 images, 50 test images: above chance after 2 epochs at lr 1e-2 is not
    # guaranteed at this size, but the loss must have moved down
    for model in ("LN-LSTM", "LSTM"):
        hist = res["results"][0.01, model, 0]
        assert hist[1][0] < hist[0][0], hist

    # deterministic: the same run again gives the same numbers
    again = sequential_digits.main(DIGITS_ARGS + ["--out", str(tmp_path / "again.png")])
    assert again["results"] == res["results"]


def test_sequential_digits_torch_smoke(torch, example_deps, capsys):
    """The PyTorch loop trains from the NumPy example's start: the same initial
    model and batches; its first epoch's loss is the NumPy run's up to float32
    rounding outside the engine."""
    import sequential_digits_torch as DT

    from _util import assert_every_option_shows_its_default

    res = DT.main(DIGITS_ARGS + ["--numpy"])
    out = capsys.readouterr().out
    lines = re.findall(r"^lr=0\.01 seed=0 LN-LSTM \((torch|NumPy)\) epoch +(\d+)  train loss "
                       r"(\d+\.\d+)  test acc (\d\.\d{4})$", out, re.M)
    assert [(m, int(e)) for m, e, _, _ in lines] == [
        ("torch", 1), ("torch", 2), ("NumPy", 1), ("NumPy", 2)], out
    assert "| LN-LSTM (torch) |" in out and "| LN-LSTM (NumPy) |" in out, out
    assert re.search(r"^wall time: \d+\.\d s$", out, re.M), out
    mine, numpy_run = (res["results"][0.01, label, 0] for label in (DT.TORCH, DT.NUMPY))
    assert mine[1][0] < mine[0][0], mine                     # the loss moved down
    assert abs(mine[0][0] - numpy_run[0][0]) < 1e-4, (mine, numpy_run)

    # the initial model: fastln.rnn's seeded LN-LSTM (bitwise, through the same
    # engine) and the NumPy example's readout
    x = sequential_digits.load_data(4, subset=40)[0]
    model = DT.make_model(4, 16, seed=3)
    rnn = C.rnn_class("LNLSTM")(4, 16, seed=3)
    head = C.Linear(16, 10, np.random.default_rng([3, 1]))
    y, _ = rnn.forward(x, cache=False)
    with torch.no_grad():
        np.testing.assert_array_equal(model.lstm(DT.batch_first(x))[0][:, -1].numpy(), y[-1])
        np.testing.assert_allclose(model(DT.batch_first(x)).numpy(), head(y[-1]),
                                   rtol=0, atol=1e-6)
    # the batches of the NumPy example, epoch after epoch
    sampler, rng = DT.SeededBatches(70, 32, seed=3), np.random.default_rng([3, 2])
    for _ in range(3):
        assert list(sampler) == [b.tolist() for b in C.minibatches(70, 32, rng)]
    assert len(sampler) == 3
    assert_every_option_shows_its_default(DT.make_parser())


def test_sequential_digits_pixels_per_step(example_deps):
    x_tr, y_tr, x_te, y_te = sequential_digits.load_data(1, subset=30)
    assert x_tr.shape == (64, 30, 1) and x_te.shape == (64, 10, 1)
    assert x_tr.dtype == np.float32 and 0.0 <= x_tr.min() and x_tr.max() <= 1.0
    x4 = sequential_digits.load_data(4, subset=30)[0]
    assert x4.shape == (16, 30, 4)
    # the same permuted pixel sequence, just cut differently
    np.testing.assert_array_equal(x4.transpose(1, 0, 2).reshape(30, 64),
                                  x_tr.transpose(1, 0, 2).reshape(30, 64))
    xb = sequential_digits.load_data(4, subset=30, binarize=True)[0]
    np.testing.assert_array_equal(xb, (x4 > 0).astype(np.float32))
    with pytest.raises(SystemExit):
        sequential_digits.load_data(3)


def test_longer_sequences_smoke(example_deps, tmp_path, capsys):
    png = tmp_path / "adding.png"
    res = longer_sequences.main(["--steps", "30", "--seeds", "1", "--hidden", "8",
                                 "--min-T", "4", "--max-T", "12", "--eval-T", "12,24",
                                 "--eval-size", "64", "--eval-every", "10", "--no-progress",
                                 "--lrs", "3e-3",
                                 "--out", str(png)])
    out = capsys.readouterr().out
    lines = re.findall(r"^lr=0\.003 seed=0 (LN-RNN|RNN) +step +(\d+)  train mse (\d+\.\d+)  "
                       r"eval mse T=12 (\d+\.\d+)$", out, re.M)
    assert [(m, int(s)) for m, s, _, _ in lines] == [
        (m, s) for m in ("LN-RNN", "RNN") for s in (10, 20, 30)], out
    for model in ("LN-RNN", "RNN"):
        row = re.search(rf"^\| {model} \| (\S+) \| (\S+) \| (?:\d+|>30) \| \d+\.\d \|$",
                        out, re.M)
        assert row, out
        assert all(np.isfinite(float(v)) for v in row.groups())
        assert set(res["finals"][0.003, model, 0]) == {12, 24}
    assert re.search(r"^\| predict 1\.0 \| 0\.\d{3} \| 0\.\d{3} \| \| \|$", out, re.M), out
    assert re.search(r"^wall time: \d+\.\d s$", out, re.M), out
    check_png(png)


@pytest.mark.parametrize("script", ["sequential_digits.py", "longer_sequences.py"])
def test_examples_help(script):
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "--seeds" in r.stdout and "--out" in r.stdout


# ---------------------------------------------------------------- the adding problem

def test_adding_batch():
    rng = np.random.default_rng(0)
    for T in (2, 3, 10, 51):
        x, target = longer_sequences.adding_batch(T, 200, rng)
        assert x.shape == (T, 200, 2) and target.shape == (200, 1)
        assert x.dtype == target.dtype == np.float32
        marks = x[..., 1]
        assert np.all(marks.sum(axis=0) == 2)
        for b in range(200):
            i, j = np.nonzero(marks[:, b])[0]
            assert i < max(T // 2, 1) <= j
            assert np.isclose(target[b, 0], x[i, b, 0] + x[j, b, 0])
        assert 0.0 <= x[..., 0].min() and x[..., 0].max() <= 1.0


# ---------------------------------------------------------------- Adam

def adam_reference(p0, grads, lr, b1=0.9, b2=0.999, eps=1e-8, clip=0.0):
    """Adam as in the paper (Algorithm 1), float64, one scalar at a time."""
    p = {k: v.astype(np.float64).ravel().copy() for k, v in p0.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    for t, g in enumerate(grads, 1):
        g = {k: a.astype(np.float64).ravel() for k, a in g.items()}
        norm = np.sqrt(sum(float((a * a).sum()) for a in g.values()))
        if clip and norm > clip:
            g = {k: a * clip / (norm + 1e-6) for k, a in g.items()}
        for k in p:
            for i in range(p[k].size):
                m[k][i] = b1 * m[k][i] + (1 - b1) * g[k][i]
                v[k][i] = b2 * v[k][i] + (1 - b2) * g[k][i] ** 2
                mhat = m[k][i] / (1 - b1 ** t)
                vhat = v[k][i] / (1 - b2 ** t)
                p[k][i] -= lr * mhat / (np.sqrt(vhat) + eps)
    return {k: a.reshape(p0[k].shape) for k, a in p.items()}


@pytest.mark.parametrize("clip", [0.0, 0.5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adam_matches_reference(clip, dtype):
    rng = np.random.default_rng(1)
    p0 = {"w": rng.standard_normal((3, 4)).astype(dtype),
          "b": rng.standard_normal(5).astype(dtype)}
    grads = [{k: rng.standard_normal(v.shape).astype(dtype) * (t + 1) for k, v in p0.items()}
             for t in range(6)]
    params = {k: v.copy() for k, v in p0.items()}
    opt = C.Adam(params, lr=0.01, clip=clip)
    for g in grads:
        norm = opt.step(g)
        assert np.isclose(norm, np.sqrt(sum((a.astype(np.float64) ** 2).sum()
                                            for a in g.values())), rtol=1e-5)
    want = adam_reference(p0, grads, 0.01, clip=clip)
    tol = 1e-6 if dtype == np.float32 else 1e-12
    for k in p0:
        assert params[k].dtype == dtype
        np.testing.assert_allclose(params[k], want[k], rtol=0, atol=tol)
    assert opt.t == len(grads)


@pytest.mark.parametrize("clip", [0.0, 0.5])
def test_adam_matches_torch(torch, clip):
    rng = np.random.default_rng(2)
    p0 = {"w": rng.standard_normal((4, 3)), "b": rng.standard_normal(4)}
    grads = [{k: rng.standard_normal(v.shape) for k, v in p0.items()} for _ in range(5)]
    params = {k: v.copy() for k, v in p0.items()}
    opt = C.Adam(params, lr=3e-3, clip=clip)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in p0.items()}
    topt = torch.optim.Adam(list(tp.values()), lr=3e-3)
    for g in grads:
        opt.step(g)
        for k, t in tp.items():
            t.grad = torch.tensor(g[k])
        if clip:
            torch.nn.utils.clip_grad_norm_(list(tp.values()), clip)
        topt.step()
    for k in p0:
        np.testing.assert_allclose(params[k], tp[k].detach().numpy(), rtol=0, atol=1e-12)


def test_adam_huge_float32_gradient():
    """A float32 gradient past 1.8e19 (its square overflows): clipping (norm in
    float64) keeps the update finite; without clipping the overflowed second
    moment is reported and that entry stops moving, as in torch.optim.Adam."""
    huge = {"w": np.array([1e21, 1.0], np.float32)}
    p = {"w": np.zeros(2, np.float32)}
    opt = C.Adam(p, lr=0.1, clip=1.0)
    assert opt.step(huge) == pytest.approx(1e21, rel=1e-6)
    assert np.all(np.isfinite(p["w"])) and p["w"][0] == pytest.approx(-0.1, rel=1e-4)
    assert opt.inf_moments == 0 and C.adam_note(opt) is None

    p = {"w": np.zeros(2, np.float32)}
    opt = C.Adam(p, lr=0.1)
    opt.step(huge)
    assert opt.inf_moments == 1 and "overflowed" in C.adam_note(opt)
    before = p["w"].copy()
    opt.step({"w": np.ones(2, np.float32)})
    assert p["w"][0] == before[0] and p["w"][1] != before[1]


def test_joint_shares_arrays():
    from fastln.rnn import LNRNN

    model = LNRNN(2, 4, seed=0)
    head = C.Linear(4, 1, np.random.default_rng(0))
    params = C.joint(model, head, "params")
    assert set(params) == {"rnn." + k for k in model.params} | {"head.weight", "head.bias"}
    assert params["rnn.weight_hh_l0"] is model.params["weight_hh_l0"]
    assert params["head.bias"] is head.params["bias"]


def test_adam_minimizes_a_quadratic():
    rng = np.random.default_rng(3)
    target = rng.standard_normal(10).astype(np.float32)
    params = {"x": np.zeros(10, np.float32)}
    opt = C.Adam(params, lr=0.05)
    for _ in range(500):
        opt.step({"x": 2 * (params["x"] - target)})
    np.testing.assert_allclose(params["x"], target, atol=1e-3)


# ---------------------------------------------------------------- readout and losses

def numeric_grad(f, a, h=1e-6):
    g = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        old = a[i]
        a[i] = old + h
        up = f()
        a[i] = old - h
        down = f()
        a[i] = old
        g[i] = (up - down) / (2 * h)
    return g


@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
def test_readout_gradients_finite_differences(loss):
    rng = np.random.default_rng(4)
    B, H, K = 5, 7, 4 if loss == "cross_entropy" else 1
    head = C.Linear(H, K, rng, dtype=np.float64)
    x = rng.standard_normal((B, H))
    labels = rng.integers(0, K, B)
    target = rng.standard_normal((B, 1))

    def value_and_grad():
        out = head(x)
        if loss == "cross_entropy":
            return C.softmax_cross_entropy(out, labels)
        return C.mse(out, target)

    _, dout = value_and_grad()
    dx = head.backward(dout)
    f = lambda: value_and_grad()[0]  # noqa: E731
    np.testing.assert_allclose(dx, numeric_grad(f, x), rtol=1e-6, atol=1e-9)
    for k in ("weight", "bias"):
        np.testing.assert_allclose(head.grads[k], numeric_grad(f, head.params[k]),
                                   rtol=1e-6, atol=1e-9)


def test_linear_init_and_dtype():
    head = C.Linear(16, 3, np.random.default_rng(0))
    assert head.params["weight"].shape == (3, 16) and head.params["bias"].shape == (3,)
    assert all(p.dtype == np.float32 for p in head.params.values())
    assert np.abs(head.params["weight"]).max() <= 0.25
    y = head(np.ones((2, 16), np.float32))
    assert y.dtype == np.float32 and y.shape == (2, 3)


def test_softmax_cross_entropy_values():
    logits = np.array([[0.0, 0.0], [1000.0, 0.0]], np.float32)   # stable at large logits
    loss, d = C.softmax_cross_entropy(logits, np.array([0, 0]))
    assert np.isclose(loss, np.log(2) / 2, rtol=1e-6)
    assert d.dtype == np.float32 and np.all(np.isfinite(d))


def test_minibatches_cover_everything_once():
    batches = C.minibatches(70, 32, np.random.default_rng(0))
    assert [len(b) for b in batches] == [32, 32, 6]
    assert sorted(np.concatenate(batches)) == list(range(70))


# ------------------------------------------------- the pitfall of docs/examples.md

def test_layer_norm_of_a_scaled_vector_keeps_only_the_sign():
    """LN(x_t * w) of a scalar x_t is sign(x_t) * LN(w); x_t = 0 gives the bias
    (the 1-pixel-per-step pitfall of docs/examples.md)."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((1, 64)).astype(np.float32)
    gain = rng.uniform(0.5, 1.5, 64).astype(np.float32)
    bias = rng.standard_normal(64).astype(np.float32)
    base = fastln.layer_norm(w, gain, bias)
    for x in (0.25, 0.5, 1.0):
        np.testing.assert_allclose(fastln.layer_norm(x * w, gain, bias), base, atol=1e-3)
        np.testing.assert_allclose(fastln.layer_norm(-x * w, gain, bias), 2 * bias - base,
                                   atol=1e-3)
    np.testing.assert_array_equal(fastln.layer_norm(0 * w, gain, bias)[0], bias)


# ---------------------------------------------------------------- gradient_flow.py

def test_gradient_flow_smoke(example_deps, tmp_path, capsys):
    import gradient_flow as G

    res = G.main(["--quick", "--no-progress", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    args = G.parse_args(["--quick"])
    labels = [label for label, _ in G.MODELS]
    assert set(res["table"]) == {(k, m, s) for k in G.KINDS for m in labels
                                 for s in args.scales}
    assert res["t_points"] == [args.T - 1, 0]
    for r in list(res["table"].values()) + list(res["trained_table"].values()):
        assert sorted(r["at"]) == [0, args.T - 1]
        values = list(r["at"].values()) + [r["rate"], r["lyap"], r["rate_long"]]
        assert np.all(np.isfinite(values)), r
    assert set(res["trained_table"]) == set(labels)
    for r in res["trained_table"].values():
        assert 0 <= r["mse"] < 10 and 0 < r["max_norm"] < np.inf
    assert set(res["variants"]) == {(k, name) for k in G.KINDS for name, _ in G.VARIANTS}
    for r in res["variants"].values():
        assert np.all(np.isfinite([r["lyap"], r["rate"], r["rate_long"], r["rstd"],
                                   r["gain"], r["h_norm"]])), r
    assert set(res["dynamics"]) == {(k, m) for k in G.KINDS for m in labels}
    for stats in res["dynamics"].values():
        assert [a.shape for a in stats] == [(args.lyap_T,)] * 3
        assert all(np.all(np.isfinite(a)) and np.all(a >= 0) for a in stats)
    # LN(h W_hh^T) does not see the scale of W_hh (up to eps); the plain LSTM does
    for kind in G.KINDS:
        t = res["table"]
        assert abs(t[kind, "LN-LSTM", 1.0]["lyap"] - t[kind, "LN-LSTM", 2.0]["lyap"]) < 0.01
        assert abs(t[kind, "LSTM", 1.0]["lyap"] - t[kind, "LSTM", 2.0]["lyap"]) > 0.05
    for name in ("| model | W_hh x |", "| LN-LSTM | 2 |", "| model | eval MSE |",
                 "| variant | Lyapunov (gaussian) |", "| ln_hh gain 0.1 |"):
        assert name in out, out
    assert re.search(r"^wall time: \d+\.\d s$", out, re.M), out
    assert res["figures"] == [str(tmp_path / "gradient_flow.png"),
                              str(tmp_path / "gradient_flow_dynamics.png")]
    for png in res["figures"]:
        check_png(png)


def test_gradient_flow_measurements():
    """The example's chunked, renormalized backward gives the log norms of one
    plain backward; at the fixed point h = 0 of a tanh RNN with zero input the
    Lyapunov exponent and the gradient's growth rate are log of W_hh's
    spectral radius."""
    import gradient_flow as G

    rng = np.random.default_rng(0)
    for cls in ("RNN", "LNLSTM"):
        m = G.make_model(cls, 3, 8, seed=1, scale=1.5)
        x = rng.standard_normal((30, 4, 3))
        readout = rng.standard_normal(8)
        y, _ = m.forward(x)
        dy = np.zeros_like(y)
        dy[-1] = readout
        dx, _ = m.backward(dy)
        np.testing.assert_allclose(G.grad_logs(m, x, readout, chunk=7),
                                   np.log(np.linalg.norm(dx, axis=2)), rtol=0, atol=1e-9)

    m = G.make_model("RNN", 2, 8, seed=3, scale=2.0)
    rho = np.abs(np.linalg.eigvals(m.params["weight_hh_l0"])).max()
    x = np.zeros((600, 2, 2))
    lam = G.lyapunov(m, x, 1e-8, 10, 100, np.random.default_rng(1))
    assert abs(lam - np.log(rho)) < 0.02, (lam, np.log(rho))
    curve = G.grad_logs(m, x, rng.standard_normal(8), chunk=50).mean(axis=1)
    assert abs(G.growth_rate(curve, 100, 500) - np.log(rho)) < 0.02

    t = np.arange(50)
    assert G.growth_rate(0.3 * (49 - t), 0, 50) == pytest.approx(0.3)     # grows to the past
    assert G.growth_rate(-0.3 * (49 - t), 0, 50) == pytest.approx(-0.3)
    assert G.fmt_ln(np.log(2.4e9)) == "2.4e+09"
    assert G.fmt_ln(-1000.0) == "5.1e-435"     # exp(-1000) = 5.08e-435
    assert G.fmt_ln(-np.inf) == "0"
