"""examples/emformer_predictor.py: fastln's step of the RNN-T predictor of
torchaudio's emformer_rnnt_base against torchaudio's own forward (its
models/rnnt.py from the pinned wheel: tests/_upstream.py), and bitwise the same
per stream in any batch; the example's command line, with and without
torchaudio; and its benchmark, bench/predictor.py, at tiny settings."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import _upstream

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import emformer_predictor as EP  # noqa: E402

TOKENS = 20


@pytest.fixture(scope="module")
def rnnt(torch):
    return _upstream.torchaudio_rnnt()


@pytest.fixture(scope="module")
def predictors(torch, rnnt):
    """torchaudio's emformer_rnnt_base predictor, its LayerNorms' gains and
    biases moved off 1 and 0 so that they matter, and the example's Predictor
    of it."""
    torch.manual_seed(0)
    module = rnnt.emformer_rnnt_base(EP.NUM_SYMBOLS).predictor.eval()
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return module, EP.Predictor.from_torch(module)


def tokens_of(B, seed=0):
    """B streams of TOKENS tokens, each starting with the blank."""
    tokens = np.random.default_rng(seed).integers(0, EP.BLANK, (B, TOKENS))
    tokens[:, 0] = EP.BLANK
    return tokens


def steps(predictor, tokens):
    """The outputs (B, U, 1024) of the predictor stepped over tokens (B, U), and the state."""
    state = predictor.initial_state(len(tokens))
    return np.stack([predictor.step(t, state) for t in tokens.T], axis=1), state


def test_weights_map(predictors):
    module, predictor = predictors
    assert predictor.lstm.num_layers == 3 and predictor.lstm.hidden_size == 512
    assert predictor.lstm.eps == 1e-3 and predictor.eps == 1e-5
    assert (predictor.lstm.gate_norm, predictor.lstm.carry) == ("sum", "normalized")
    assert not predictor.lstm.gate_bias
    np.testing.assert_array_equal(predictor.lstm.params["ln_c_bias_l2"],
                                  module.lstm_layers[2].c_norm.bias.detach().numpy())


@pytest.mark.parametrize("B", [1, 4])
def test_matches_torchaudio(torch, predictors, B):
    """fastln's steps agree with torchaudio's forward over the whole token
    sequence within float32 rounding (rtol = atol = 1e-5): the outputs and the
    final state (h, c of each layer)."""
    module, predictor = predictors
    tokens = tokens_of(B)
    with torch.no_grad():
        want, lengths, want_state = module(torch.from_numpy(tokens), torch.full((B,), TOKENS))
    got, (h, c) = steps(predictor, tokens)
    assert got.shape == (B, TOKENS, 1024) and got.dtype == np.float32
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)
    for k, (want_h, want_c) in enumerate(want_state):
        np.testing.assert_allclose(h[k], want_h.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(c[k], want_c.numpy(), rtol=1e-5, atol=1e-5)


def test_bitwise_in_any_batch(predictors):
    """A stream's outputs are bitwise the same alone, in a batch of 4 or 7, and
    stepped as a batched greedy decoder steps it (decode_like)."""
    _, predictor = predictors
    tokens = tokens_of(7, seed=1)
    alone = np.concatenate([steps(predictor, tokens[b:b + 1])[0] for b in range(7)])
    np.testing.assert_array_equal(steps(predictor, tokens)[0], alone)
    np.testing.assert_array_equal(steps(predictor, tokens[:4])[0], alone[:4])
    for seed in (0, 1):
        np.testing.assert_array_equal(EP.decode_like(predictor, tokens, seed), alone)


def test_random_weights():
    """The weights without torchaudio: the predictor's names and shapes."""
    w = EP.random_weights(0)
    assert w["embedding.weight"].shape == (EP.NUM_SYMBOLS, 512)
    assert w["lstm_layers.2.x2g.weight"].shape == (2048, 512)
    assert w["linear.weight"].shape == (1024, 512) and w["output_layer_norm.bias"].shape == (1024,)
    assert all(v.dtype == np.float32 for v in w.values())
    assert len(w) == 7 + 3 * 6
    out, _ = steps(EP.Predictor(w), tokens_of(2))
    assert np.isfinite(out).all()


def test_main_with_torchaudio(rnnt, monkeypatch, capsys):
    monkeypatch.setattr(EP, "load_torchaudio", lambda: (rnnt, None))
    res = EP.main(["--streams", "3", "--tokens", "4"])
    out = capsys.readouterr().out
    assert "emformer_rnnt_base(4097).predictor" in out
    assert "every stream bitwise the same as alone: yes" in out
    assert res["bitwise"] and res["max_diff"] <= 1e-5
    assert set(res["ms"]) == {(who, B) for who in ("fastln", "torchaudio") for B in (1, 3)}
    assert "torchaudio" in out.splitlines()[-1]


def test_main_without_torchaudio(monkeypatch, capsys):
    monkeypatch.setattr(EP, "load_torchaudio", lambda: (None, "ImportError: none here"))
    res = EP.main(["--streams", "2", "--tokens", "3"])
    out = capsys.readouterr().out
    assert "torchaudio cannot be imported (ImportError: none here): random weights" in out
    assert res["bitwise"] and res["max_diff"] is None and set(res["ms"]) == {
        ("fastln", 1), ("fastln", 2)}
    with pytest.raises(SystemExit):
        EP.main(["--streams", "0"])


def test_script_runs():
    """``python examples/emformer_predictor.py`` as a user runs it."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "emformer_predictor.py"),
                        "--streams", "2", "--tokens", "3"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert "every stream bitwise the same as alone: yes" in r.stdout, r.stdout


# ---- bench/predictor.py: its latency against torchaudio's and ONNX Runtime's --

TINY = dict(repeats=2, min_sample=1e-4, budget=0.005, min_repeats=1)


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("fastln_bench_predictor_test",
                                                  os.path.join(ROOT, "bench", "predictor.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_rows(torch, bench, predictors):
    """Every peer is checked against torchaudio's step and timed, at two batch
    sizes; the table has a row for each and the targets' line."""
    module, _ = predictors
    saved = torch.get_num_threads()
    result = bench.run(threads=[1], batches=(1, 2), timing=TINY, module=module)
    assert torch.get_num_threads() == saved
    (res,) = result["results"]
    have_ort = bench.ort is not None
    assert result["onnx"] is None if have_ort else "not installed" in result["onnx"]
    assert [r["B"] for r in res["rows"]] == [1, 2]
    lossy = {"fastln int8", "fastln bfloat16"}
    for r in res["rows"]:
        timed = {p for p, t in r["times"].items() if t is not None}
        assert timed >= {"fastln", "fastln int8", "torchaudio"} | ({"onnxruntime"} if have_ort
                                                                    else set())
        assert all(r["times"][p] > 0 for p in timed)
        for p in timed - lossy:
            assert r["maxdiff"][p] <= bench.TOL, r["maxdiff"]
        for p in timed & lossy:
            assert 0 < r["maxdiff"][p] < 1, r["maxdiff"]
    text = bench.format_table(result)
    assert "fastln, LSTM int8" in text and "targets at B = 1, fastln float32: <= 0.3x" in text
    assert "| B | case | ms |" in bench.format_table(result, markdown=True)
    json.loads(json.dumps(result))


def test_bench_catches_a_wrong_peer(torch, bench, predictors, monkeypatch):
    """A fastln step that computes something else stops the run before timing."""
    module, _ = predictors
    monkeypatch.setattr(EP.Predictor, "step", lambda self, tokens, state: np.zeros((len(tokens),
                                                                                     1024)))
    with pytest.raises(AssertionError, match="fastln B=1: its output or state disagrees"):
        bench.run(threads=[1], batches=(1,), timing=TINY, module=module)


def test_bench_main(torch, bench, predictors, monkeypatch, tmp_path, capsys):
    module, _ = predictors
    monkeypatch.setattr(bench, "load_module", lambda: module)
    run = bench.run
    monkeypatch.setattr(bench, "run", lambda **kw: run(**dict(kw, timing=TINY)))
    path = tmp_path / "predictor.json"
    assert bench.main(["--threads", "1", "--batch", "1", "--json", str(path)]) == 0
    assert json.loads(path.read_text())["results"][0]["rows"][0]["B"] == 1
    assert "fastln float32" in capsys.readouterr().out

    def unavailable():
        pytest.skip("upstream source not available: no network")
    monkeypatch.setattr(bench, "load_module", unavailable)
    assert bench.main(["--threads", "1"]) == 1
    assert "cannot be had (Skipped: upstream source not available" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--batch", "0"])
