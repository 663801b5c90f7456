"""The benchmark machinery (bench/harness.py, bench/run.py, bench/plots.py) and
``python -m fastln`` (fastln/__main__.py, fastln/_selfcheck.py), fast: two tiny
shapes on one thread for every case, the peer-output checks, the RESULTS.md
text, the PNG plots, the self-check and its short table. matplotlib is skipped
where missing, except under CI (the environment variable CI set), where that is
a failure."""
import importlib
import importlib.util
import json
import os
import sys

import numpy as np
import pytest

import fastln
from fastln import __main__ as main_mod
from fastln import _selfcheck

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import harness as _bench  # noqa: E402

SHAPES = [(3, 16), (5, 64)]
CASES = [("layer_norm", "float32"), ("rms_norm", "float32"), ("add_layer_norm", "float32"),
         ("layer_norm", "float16"), ("layer_norm", "bfloat16")]
TINY = dict(repeats=2, min_sample=1e-4, budget=0.005, min_repeats=1, gap=0.0)


def _load(name, filename):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "bench", filename))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _matplotlib():
    if os.environ.get("CI"):
        return importlib.import_module("matplotlib")   # CI: a missing matplotlib fails
    return pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def rows():
    cases = [(N, H, op, dt) for op, dt in CASES for N, H in SHAPES]
    if _bench.ml_dtypes is None:
        cases = [c for c in cases if c[3] != "bfloat16"]
    return _bench.run_grid(cases, threads=[1], peers=_bench.PEERS, **TINY)


def test_rows(rows):
    common = {"op", "dtype", "N", "H", "threads", "isa", "nbytes", "itemsize", "fwd_bytes",
              "bwd_bytes", "copy", "copy_GBps", "fwd_copy_frac", "bwd_copy_frac",
              "fwd_fastln_out", "bwd_fastln_out", "fwd_fastln_f32", "fwd_fastln_f32_out",
              "elems_vs_f32", "elems_vs_f32_alloc", "jax_threads", "jax_threads_exact",
              "mismatch"}
    common |= {f"fwd_{p}" for p in _bench.FWD_PEERS} | {f"bwd_{p}" for p in _bench.BWD_PEERS}
    common |= {f"fwd_speedup_{p}" for p in _bench.FWD_PEERS}
    common |= {f"bwd_speedup_{p}" for p in _bench.BWD_PEERS}
    assert len(rows) == len({(r["op"], r["dtype"]) for r in rows}) * len(SHAPES)
    for r in rows:
        assert common <= set(r), common - set(r)
        assert r["threads"] == 1
        assert r["mismatch"] == [], r["mismatch"]
        assert r["fwd_fastln"] > 0 and r["fwd_fastln_out"] > 0 and r["copy"] > 0
        assert r["fwd_numpy"] is not None or r["dtype"] == "bfloat16"
        ln32 = (r["op"], r["dtype"]) == ("layer_norm", "float32")
        assert (r["bwd_fastln"] is not None) == ln32
        assert (r["fwd_onnxruntime"] is not None) == (ln32 and _bench.have_peer("onnxruntime"))
        assert (r["elems_vs_f32"] is not None) == (r["dtype"] != "float32")
        assert (r["fwd_jax"] is not None) == _bench.have_peer("jax")
        if r["fwd_jax"] is not None:
            assert r["jax_threads"] == 1
        for p in ("torch", "jax"):
            if _bench.have_peer(p):
                assert r[f"fwd_{p}"] is not None and r[f"fwd_speedup_{p}"] > 0
        assert r["fwd_bytes"] == _bench.STREAMS[r["op"]] * r["N"] * r["H"] * r["itemsize"]
    text = _bench.format_table(rows, parts=("fwd",), detail=True)
    assert "MISMATCH" not in text and "16-bit/f32 elem/s" in text
    bf16 = [r for r in rows if r["dtype"] == "bfloat16"]
    assert not bf16 or "| bf16/f32 elem/s |" in _bench.format_table(bf16, markdown=True)
    assert all(_bench.progress_line(r) for r in rows)


def test_thread_settings_restored(rows):
    if _bench.torch is not None:
        saved = _bench.torch.get_num_threads()
        _bench.run_grid([(2, 16)], threads=[1], peers=("torch",), **TINY)
        assert _bench.torch.get_num_threads() == saved


def test_check_outputs():
    row = {"mismatch": []}
    y = np.linspace(-3, 3, 64, dtype=np.float32).reshape(4, 16)
    assert _bench.check_outputs(row, "peer", "fwd", [y + 1e-6], [y], ("y",))
    assert row["mismatch"] == []
    assert not _bench.check_outputs(row, "peer", "fwd", [y * 1.01], [y], ("y",))
    assert not _bench.check_outputs(row, "peer", "fwd", [y[:2]], [y], ("y",))
    assert not _bench.check_outputs(row, "peer", "fwd", [y], [y, y], ("y", "s"))
    assert len(row["mismatch"]) == 3 and row["mismatch"][0].startswith("peer fwd y: max|diff|")
    # 16-bit tolerances: one bfloat16 ulp passes, 5% does not
    row = {"mismatch": []}
    assert _bench.check_outputs(row, "p", "fwd", [y * (1 + 2 ** -8)], [y], ("y",), "bfloat16")
    assert not _bench.check_outputs(row, "p", "fwd", [y * 1.05], [y], ("y",), "bfloat16")
    assert not _bench.check_outputs(row, "p", "fwd", [y * (1 + 2 ** -6)], [y], ("y",), "float16")
    # dweight / dbias: normwise
    row = {"mismatch": []}
    assert _bench.check_outputs(row, "p", "bwd", [y, y[0] + 1e-4 * 3, y[1]], [y, y[0], y[1]],
                                ("dx", "dweight", "dbias"))
    assert not _bench.check_outputs(row, "p", "bwd", [y, y[0] + 0.1, y[1]], [y, y[0], y[1]],
                                    ("dx", "dweight", "dbias"))
    assert row["mismatch"] == ["p bwd dweight: max|diff|=0.1"]


def test_wrong_peer_is_reported(monkeypatch):
    """A peer whose output is wrong is listed in the row and in the table; its time is kept."""
    monkeypatch.setattr(_bench, "numpy_rms_norm", lambda x, w, eps=1e-6: x * w)
    with fastln.threads(1):
        row = _bench.bench_shape(4, 32, op="rms_norm", peers=("numpy",), **TINY)
    assert len(row["mismatch"]) == 1 and row["mismatch"][0].startswith("numpy fwd y:")
    assert row["fwd_numpy"] is not None
    text = _bench.format_table([row], parts=("fwd",))
    assert "!! MISMATCH" in text and "rms_norm (4, 32) t=1: numpy fwd y" in text


def test_bad_arguments():
    with pytest.raises(ValueError):
        _bench.bench_shape(2, 8, op="rms_norm", dtype="float16")
    with pytest.raises(ValueError):
        _bench.bench_shape(2, 8, op="softmax")


def test_results_md(rows):
    run = _load("fastln_bench_run_test", "run.py")
    assert len(run.cases(list(run.OPS), quick=False)) == len(run.SHAPES) + 4 * len(
        run.EXTRA_SHAPES)
    assert {(n, h) for n, h, *_ in run.cases(["ln"], quick=False)} >= {
        (1, 16), (16384, 8192), (262144, 16), (262144, 64), (65536, 256)}
    info = _bench.machine_info()
    info["cpu_other_load"] = 0.0
    results = {"info": info, "quick": True, "elapsed_s": 1.0, "rows": rows}
    md = run.results_md(results, "python bench/run.py --test", plots=None, plots_note="none")
    for title in ("LayerNorm forward, float32", "LayerNorm backward, float32",
                  "RMSNorm forward, float32", "add + LayerNorm forward, float32",
                  "LayerNorm forward, float16"):
        assert f"### {title}" in md
    assert "## 1 thread" in md and "- threads: 1" in md
    if _bench.have_peer("jax"):
        assert "JAX: 1 thread" in md and "| jax us |" in md


def _synthetic_results():
    """A results dict like bench/run.py's, with made-up times."""
    rows = []
    for threads in (1, 2):
        for H in (64, 1024):
            for N in (1, 32, 4096):
                nb = N * H * 4
                t = 1e-6 + nb * 1e-10 / threads
                r = {"op": "layer_norm", "dtype": "float32", "N": N, "H": H,
                     "threads": threads, "nbytes": nb, "fwd_bytes": 2 * nb, "bwd_bytes": 3 * nb,
                     "fwd_fastln": t, "fwd_fastln_out": 0.9 * t, "bwd_fastln": 2 * t,
                     "bwd_fastln_out": 1.8 * t, "copy": 0.5 * t, "copy_GBps": 2 * nb / t / 1e9,
                     "fwd_numpy": 5 * t, "fwd_torch": 0.8 * t if N == 4096 else 2 * t,
                     "fwd_onnxruntime": None, "fwd_jax": 3 * t,
                     "bwd_numpy": 9 * t, "bwd_torch": 3 * t, "bwd_jax": None, "mismatch": []}
                rows.append(r)
    rows.append(dict(rows[0], op="rms_norm"))      # other cases are ignored by the plots
    return {"info": {"cpu": "test CPU", "cores": 2}, "rows": rows}


def test_plots(tmp_path):
    _matplotlib()
    plots = _load("fastln_bench_plots_test", "plots.py")
    res = _synthetic_results()
    paths = plots.render(res, str(tmp_path))
    assert set(paths) == {"throughput", "heatmap"}
    for p in paths.values():
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert os.path.getsize(p) > 10000
    hs, ns, grid, names = plots.speedup_grid(
        [r for r in res["rows"] if r["threads"] == 2 and r["op"] == "layer_norm"], "fwd")
    assert hs == [64, 1024] and ns == [1, 32, 4096]
    assert grid[0][2] == pytest.approx(0.8) and names[0][2] == "torch"
    assert grid[0][0] == pytest.approx(2.0)
    assert plots.render({"info": {}, "rows": []}, str(tmp_path / "none")) == {}


def test_self_check_passes(capsys):
    ok, results = main_mod.self_check()
    assert ok and all(r["pass"] for r in results)
    assert {r["function"] for r in results} >= {"layer_norm", "rms_norm_backward", "LNGRU forward"}
    (int8,) = [r for r in results if r["dtype"] == "int8"]
    assert int8["function"] == "LSTM forward" and int8["kernel"] == fastln.rnn.int8_products()
    assert 0 < int8["errors"]["y"] <= int8["tol"] == _selfcheck.INT8_TOL
    out = capsys.readouterr().out
    assert "self-check: PASS" in out
    assert f"vs float32, {fastln.rnn.int8_products()}" in out


def test_self_check_catches_a_wrong_kernel(monkeypatch, capsys):
    monkeypatch.setattr(fastln, "rms_norm", lambda x, w, eps, return_stats: (
        fastln.reference.rms_norm(x, w, eps=2 * eps, return_stats=True)))
    ok, results = main_mod.self_check()
    assert not ok
    assert {r["function"] for r in results if not r["pass"]} == {"rms_norm"}


def test_self_check_catches_a_wrong_int8_kernel(monkeypatch, capsys):
    """int8 recurrent products twice too large (their scales doubled) fail the
    int8 line, and only it."""
    quantize = fastln.rnn.quantize

    def wrong(model):
        q = quantize(model)
        q.params["weight_hh_scale_l0"] *= 2
        return q
    monkeypatch.setattr(fastln.rnn, "quantize", wrong)
    ok, results = main_mod.self_check()
    assert not ok
    assert [(r["function"], r["dtype"]) for r in results if not r["pass"]] == [
        ("LSTM forward", "int8")]
    assert "FAIL" in capsys.readouterr().out


def test_short_table():
    with fastln.threads(1):
        rows = [_selfcheck.layer_norm_row(N, H, **TINY) for N, H in SHAPES]
    for r in rows:
        assert r["mismatch"] == [], r["mismatch"]
        assert r["fwd_fastln"] > 0 and r["bwd_fastln_out"] > 0 and r["copy"] > 0
        assert (r.get("fwd_torch") is not None) == (_selfcheck.torch is not None)
        assert "fwd_onnxruntime" in r or _selfcheck.ort is None
    text = main_mod.table(rows, "bwd")
    assert "(5, 64)" in text and "bwd/copy" in text and "vs numpy" in text


def test_short_table_reports_a_wrong_peer(monkeypatch):
    monkeypatch.setattr(_selfcheck, "numpy_layer_norm", lambda x, w, b: x)
    with fastln.threads(1):
        row = _selfcheck.layer_norm_row(4, 32, **TINY)
    assert row["mismatch"] == ["numpy fwd"]


INT8_TINY = dict(T=5, B=3, I=16, H=32)


def test_int8_row():
    with fastln.threads(1):
        row = _selfcheck.int8_lstm_row(**INT8_TINY, **TINY)
    assert row["mismatch"] == [], row
    assert row["kernel"] == fastln.rnn.int8_products()
    assert row["fastln_int8"] > 0 and row["fastln"] > 0
    assert ("onnxruntime_int8" in row) == (_selfcheck.ort_quant is not None)
    assert set(row["error"]) == {"fastln_int8"} | ({"onnxruntime_int8"} & set(row))
    assert all(0 < e <= _selfcheck.INT8_TOL for e in row["error"].values()), row["error"]
    text = main_mod.int8_table(row)
    assert "(5, 3, 16, 32)" in text and "vs float32" in text and "int8 err" in text
    assert ("vs onnxruntime int8" in text) == ("onnxruntime_int8" in row)
    assert len(text.splitlines()) == 2


def test_int8_row_without_onnxruntime(monkeypatch):
    """ONNX Runtime missing: its columns go, as the LayerNorm table's do."""
    monkeypatch.setattr(_selfcheck, "ort_quant", None)
    with fastln.threads(1):
        row = _selfcheck.int8_lstm_row(**INT8_TINY, **TINY)
    assert "onnxruntime_int8" not in row and set(row["error"]) == {"fastln_int8"}
    assert row["mismatch"] == []
    text = main_mod.int8_table(row)
    assert "onnxruntime" not in text and "vs float32" in text


def test_int8_row_reports_a_wrong_peer(monkeypatch):
    """ONNX Runtime's int8 LSTM given the gate blocks in fastln's order (i, f, g,
    o, not ONNX's i, o, f, c) is reported as a mismatch."""
    if _selfcheck.ort_quant is None:
        pytest.skip("needs onnxruntime and onnx")
    onnx_lstm = _selfcheck.onnx_lstm

    def unordered(model):
        m = onnx_lstm(model)
        for t in m.graph.initializer:
            if t.name in ("W", "R"):
                a = _selfcheck.onnx.numpy_helper.to_array(t)
                parts = np.split(a[0], 4)
                a = np.concatenate([parts[k] for k in (0, 2, 3, 1)])[None]
                t.CopyFrom(_selfcheck.onnx.numpy_helper.from_array(a, t.name))
        return m
    monkeypatch.setattr(_selfcheck, "onnx_lstm", unordered)
    with fastln.threads(1):
        row = _selfcheck.int8_lstm_row(**INT8_TINY, **TINY)
    assert row["mismatch"] == ["onnxruntime int8"], row


def test_package_does_not_import_bench():
    """bench/ is not installed: nothing in fastln/ may import it."""
    for name in os.listdir(os.path.join(ROOT, "fastln")):
        if name.endswith((".py", ".pyx", ".pyi")):
            with open(os.path.join(ROOT, "fastln", name)) as f:
                text = f.read()
            assert "from bench" not in text and "import bench" not in text, name


# ---- bench/fused.py: the fused residual norms and channels-first cases --------

FUSED_SHAPES = {"add_rms": [(8, 32)], "add_ln": [(8, 32), (3, 48)], "add_ln_bwd": [(8, 32)],
                "add_rms_bwd": [(8, 32)], "cf_ln": [(2, 6, 3, 5)], "cf_rms": [(2, 6, 3, 5)],
                "cf_ln_bwd": [(2, 6, 3, 5)]}
FUSED_TINY = {k: v for k, v in TINY.items() if k != "gap"}


@pytest.fixture(scope="module")
def fused():
    return _load("fastln_bench_fused_test", "fused.py")


@pytest.fixture(scope="module")
def fused_result(fused):
    return fused.run(threads=[1], shapes=FUSED_SHAPES, timing=FUSED_TINY)


def test_fused_rows(fused, fused_result):
    import json
    rows = fused_result["rows"]
    assert [(r["case"], tuple(r["shape"])) for r in rows] == [
        (c, s) for c in fused.CASES for s in FUSED_SHAPES[c]]
    have_torch = _bench.have_peer("torch")
    have_ort = _bench.have_peer("onnxruntime")
    for r in rows:
        assert set(r) >= {"case", "family", "title", "shape", "threads", "bytes", "bytes_counted",
                          "times", "ratios", "copy_frac", "max_diff", "notes"}
        assert r["threads"] == 1
        fam = r["family"]
        streams = {"fused_fwd": 4, "fused_bwd": 4, "cf_fwd": 2, "cf_bwd": 3}[fam]
        assert r["bytes"] == streams * 4 * int(np.prod(r["shape"]))
        t = r["times"]
        mine = ("fastln", "fastln_out") if fam.startswith("fused") else (
            "fastln_cf", "fastln_cf_out", "fastln_cl", "fastln_cl_out")
        for k in mine + ("copy", "copy_nt", "copy_best"):
            assert t[k] > 0, k
        assert r["copy_frac"] > 0
        # every peer that ran agreed with fastln within the checks' tolerance
        assert all(d <= 1e-3 for d in r["max_diff"].values()), r["max_diff"]
        if fam == "fused_fwd":
            assert (t.get("ort") is not None) == have_ort
            assert (r["ratios"]["ort/fastln"] is not None) == have_ort
            if have_ort:
                assert t["ort"] == min(t["ort_run"], t["ort_iobinding"]) and t["ort_out"] > 0
                assert {"ort_run", "ort_iobinding", "ort_out"} <= set(r["max_diff"])
        if fam.startswith("fused"):
            assert (r["ratios"]["torch/fastln"] is not None) == have_torch
        else:
            assert r["ratios"]["fastln_cf/fastln_cl"] > 0
            assert (r["ratios"]["torch_cl/fastln_cf"] is not None) == have_torch
            assert "fastln_cl" in r["max_diff"]
        if have_torch:
            assert "torch" in r["max_diff"] or "torch_cl" in r["max_diff"]
    json.loads(json.dumps(fused_result))        # JSON-friendly, for --json and latest.json


def test_fused_tables(fused, fused_result):
    text = fused.format_table(fused_result)
    md = fused.results_md(fused_result)
    assert md.startswith("## Fused residual norms and channels-first LayerNorm\n")
    assert "### 1 thread" in md
    for heading, cols in fused.TABLES.values():
        assert f"#### {heading}" in md and f"{heading}:" in text
        assert "| case | shape | bytes counted | " + " | ".join(h for h, _ in cols) + " |" in md
    for r in fused_result["rows"]:
        assert f"| {r['title']} | {fused._shape(r)} | " in md
        assert fused.progress_line(r).startswith(f"  {r['title']} ")
    assert "x, r in; y, s out" in md and "dy, s, ds in; dsum out" in md


def test_fused_catches_a_disagreement(fused, monkeypatch):
    """A wrong channels-first result (checked against fastln's own channels-last
    call) or a fused forward that disagrees with its peers stops the case."""
    real = fastln.layer_norm
    monkeypatch.setattr(fastln, "layer_norm", lambda x, *a, axis=-1, **k: (
        real(x, *a, axis=axis, **k) if axis != 1 else real(x, *a, axis=axis, **k) + 1e-2))
    with pytest.raises(AssertionError, match="fastln_cl y disagrees"):
        fused.run(threads=[1], cases=["cf_ln"], shapes=FUSED_SHAPES, timing=FUSED_TINY)
    if _bench.have_peer("torch") or _bench.have_peer("onnxruntime"):
        real_add = fastln.add_rms_norm
        monkeypatch.setattr(fastln, "add_rms_norm", lambda *a, **k: tuple(
            v * 1.01 if i == 0 else v for i, v in enumerate(real_add(*a, **k))))
        with pytest.raises(AssertionError, match=r"add_rms_norm fwd \(8, 32\): \S+ y disagrees"):
            fused.run(threads=[1], cases=["add_rms"], shapes=FUSED_SHAPES, timing=FUSED_TINY)


def test_fused_arguments(fused, monkeypatch, tmp_path, capsys):
    with pytest.raises(ValueError, match="cases"):
        fused.run(cases=["softmax"])
    with pytest.raises(SystemExit):
        fused.main(["--cases", "add_rms,nope"])
    monkeypatch.setattr(fused, "SHAPES", FUSED_SHAPES)
    monkeypatch.setattr(fused, "timing_kw", lambda quick: FUSED_TINY)
    path = tmp_path / "fused.json"
    assert fused.main(["--quick", "--threads", "1", "--cases", "add_ln,cf_rms",
                       "--json", str(path)]) == 0
    import json
    res = json.loads(path.read_text())
    assert [r["case"] for r in res["rows"]] == ["add_ln", "add_ln", "cf_rms"]
    assert res["quick"] and res["threads"] == [1]
    assert "| rms_norm axis=1 fwd | (2, 6, 3, 5) |" in capsys.readouterr().out


def test_run_has_a_fused_section(fused_result, monkeypatch, capsys):
    run = _load("fastln_bench_run_test_fused", "run.py")
    assert run._fused_md(None) == ""
    assert "## Fused residual norms and channels-first LayerNorm" in run._fused_md(fused_result)
    assert "failed: AssertionError: x" in run._fused_md({"error": "AssertionError: x"})

    def broken(**kw):
        raise AssertionError("x")
    monkeypatch.setattr(run._fused_module(), "run", broken)
    assert run._run_fused([1], quick=True) == {"error": "AssertionError: x"}
    # --no-fused is an option: parsing gets as far as the thread counts
    with pytest.raises(SystemExit):
        run.main(["--no-fused", "--threads", "0"])
    assert "--threads must be" in capsys.readouterr().err


# ---- bench/rnn_grid.py: recurrent forwards against torch, ONNX Runtime, OpenVINO --

def test_rnn_grid_points_and_table(torch):
    """Each point times fastln, torch, ONNX Runtime and OpenVINO on the same
    weights (and fastln's and OpenVINO's bfloat16), every peer's y agrees with
    fastln's, and the table has a row a point; the LSTM points also time
    fastln's, ONNX Runtime's and torch's int8 models and record their errors."""
    grid = _load("fastln_bench_rnn_grid_test", "rnn_grid.py")
    missing = [name for name, mod in (("onnx", _selfcheck.onnx), ("onnxruntime", _selfcheck.ort),
                                      ("onnxruntime.quantization", _selfcheck.ort_quant),
                                      ("openvino", grid._ov),
                                      ("ml_dtypes", grid.harness.ml_dtypes))
               if mod is None]
    if missing:
        if os.environ.get("CI"):
            raise AssertionError(f"{', '.join(missing)} are in the [test] extra")
        pytest.skip(f"needs {', '.join(missing)}")
    # torch's dynamic int8 needs a quantized engine, which the x86 and arm64 wheels have
    torch_int8 = any(e != "none" for e in torch.backends.quantized.supported_engines)
    if not torch_int8 and os.environ.get("CI"):
        raise AssertionError("torch has no quantized engine: the torch int8 column is empty")
    result = grid.run(threads=1, cells=("lstm", "gru", "rnn"), hidden=(32, 40), batch=(1, 3),
                      steps=5, quick=True, bf16=True, int8=True)
    assert result["int8"] is True
    assert result["info"]["int8_products"] == fastln.rnn.int8_products()
    assert [(r["cell"], r["H"], r["B"]) for r in result["rows"]] == [
        (c, H, B) for c in ("lstm", "gru", "rnn") for H in (32, 40) for B in (1, 3)]
    for r in result["rows"]:
        assert r["mismatch"] == [], r
        assert all(r[p] > 0 for p in grid.PEERS + grid.BF16_PEERS), r
        errors = r["int8_max_abs_error"]
        assert set(errors) == set(grid.INT8_PEERS)
        # int8 for the LSTM only; torch's where it has a quantized engine
        want = {"fastln_int8": r["cell"] == "lstm", "onnxruntime_int8": r["cell"] == "lstm",
                "torch_int8": r["cell"] == "lstm" and torch_int8}
        for p, present in want.items():
            assert (r[p] is not None) == present and (errors[p] is not None) == present, (p, r)
            if present:
                assert r[p] > 0 and 0 < errors[p] < grid.INT8_TOL, (p, r)
    table = grid.format_table(result)
    for cell in ("LSTM", "GRU", "RNN"):
        assert table.count(f"\n| {cell} |") == 4
    assert "| OpenVINO bf16 |" in table and "| / OpenVINO bf16 |" in table
    for heading in ("fastln int8 ms", "ORT int8 ms", "torch int8 ms", "fastln int8 / ORT int8",
                    "fastln int8 / fastln f32"):
        assert f"| {heading} |" in table
    gru = next(line for line in table.splitlines() if line.startswith("| GRU |"))
    assert gru.endswith("| - | - | - | - | - |")
    line = grid.progress_line(result["rows"][0])
    assert "MISMATCH" not in line and "fastln int8 " in line and "ORT int8 " in line
    json.loads(json.dumps(result))
    # without the int8 columns the table is as before
    plain = dict(result, int8=False)
    assert "int8" not in grid.format_table(plain)


# ---- bench/torch_modules.py: fastln.torch against fastln.rnn and the PyTorch LN layers --

TM_SIZES = dict(hidden=(16,), train_case=dict(T=5, B=3, I=8), infer_case=dict(T=5, I=8, H=16),
                batches=(1, 2), timing=FUSED_TINY)


@pytest.fixture(scope="module")
def torch_modules():
    return _load("fastln_bench_torch_modules_test", "torch_modules.py")


def test_torch_modules_rows(torch, torch_modules):
    """At tiny sizes, every peer but torch.compile's (left out: it compiles for
    seconds) is checked and timed, and the tables have a row for each."""
    tm = torch_modules
    have = tm.fastln_torch is not None
    saved = torch.get_num_threads()
    result = tm.run(threads=[1], compile_cells=False, **TM_SIZES)
    assert torch.get_num_threads() == saved
    (res,) = result["results"]
    assert res["threads"] == 1
    assert [(r["cell"], r["H"]) for r in res["train"]] == [("LNLSTM", 16), ("LNGRU", 16)]
    for r in res["train"]:
        t = r["times"]
        assert all(t[k] > 0 for k in ("fastln.rnn", "eager", "script", "nn")), t
        assert t["compile"] is None and r["compile_s"] is None
        assert (t["fastln.torch"] is not None) == have
        assert r["ratios"]["fastln.rnn"] == 1.0 and r["ratios"]["best_cell"] in ("eager", "script")
        assert set(r["maxdiff"]) == {"eager", "script"} | ({"fastln.torch"} if have else set())
        assert all(d <= 1e-4 for d in r["maxdiff"].values()), r["maxdiff"]
        assert set(r["bitwise"]) == ({"y", "grads"} if have else set())
        assert r["notes"] == [], r["notes"]
    assert [(r["dtype"], r["B"]) for r in res["infer"]] == [
        (d, B) for B in (1, 2) for d in tm.INFER_DTYPES]
    for r in res["infer"]:
        if r["dtype"] == "bfloat16" and _bench.ml_dtypes is None:
            assert r["skipped"] and r["times"]["fastln.rnn"] is None
            continue
        assert r["times"]["fastln.rnn"] > 0
        assert (r["ratio"] is not None) == have and (r["bitwise"] is not None) == have
    text = tm.format_table(result)
    assert "LNLSTM H=16 fastln.torch / best LN cell" in text and "LNGRU H=16 nn.GRU" in text
    assert "LNLSTM int8 B=2" in text and ("cannot be imported" in text) == (not have)
    md = tm.format_table(result, markdown=True)
    assert "### 1 thread" in md and "| case | ms | / fastln.rnn | target | met |" in md
    json.loads(json.dumps(result))


def test_torch_modules_catches_a_wrong_peer(torch, torch_modules, monkeypatch):
    """An LN layer that computes something else stops the run before timing."""
    def wrong(self, gx_t, h):
        return torch.tanh(gx_t[:, :h.shape[1]])
    monkeypatch.setattr(torch_modules.EagerLNGRU, "_cell", wrong)
    with pytest.raises(AssertionError, match=r"eager PyTorch LNGRU H=16: y \(first 5 steps\)"):
        torch_modules.run(threads=[1], compile_cells=False, cells=("LNGRU",),
                          **dict(TM_SIZES, batches=()))


def test_torch_modules_main(torch, torch_modules, monkeypatch, tmp_path, capsys):
    """The command line, with fastln.torch missing: its rows are empty, the
    rest is timed and written as JSON."""
    tm = torch_modules
    monkeypatch.setattr(tm, "fastln_torch", None)
    monkeypatch.setattr(tm, "TORCH_MODULES_ERROR", "ImportError: none here")
    run = tm.run
    monkeypatch.setattr(tm, "run", lambda **kw: run(**dict(kw, **dict(TM_SIZES, batches=(1,)))))
    path = tmp_path / "tm.json"
    assert tm.main(["--quick", "--threads", "1", "--no-compile", "--json", str(path)]) == 0
    res = json.loads(path.read_text())
    assert res["quick"] and res["fastln_torch"] == "ImportError: none here"
    assert [r["times"]["fastln.torch"] for r in res["results"][0]["train"]] == [None, None]
    out = capsys.readouterr().out
    assert "fastln.torch cannot be imported (ImportError: none here)" in out
    assert "LNLSTM H=16 fastln.torch  " in out and "inference (torch.no_grad())" in out
    assert tm.main(["--threads", "1", "--infer-only"]) == 0
    out = capsys.readouterr().out
    assert "training step" not in out and "LNLSTM int8 B=1 " in out
    with pytest.raises(SystemExit):
        tm.main(["--hidden", "0"])
    assert "--hidden must be" in capsys.readouterr().err


# ---- bench/lstmp.py: LSTMP against torch.nn.LSTM(proj_size) and ONNX Runtime --------

LSTMP_CASE = dict(I=8, H=16, P=4, T=5)


@pytest.fixture(scope="module")
def lstmp():
    return _load("fastln_bench_lstmp_test", "lstmp.py")


def test_lstmp_rows(torch, lstmp):
    """At tiny sizes every peer set up is checked against torch float32 and
    timed; fastln's rows are there exactly when this fastln loads proj_size."""
    have = lstmp.fastln_lstmp_error() is None
    saved = torch.get_num_threads()
    result = lstmp.run(threads=1, batches=(1, 2), case=LSTMP_CASE, export=False, probe=False,
                       timing=FUSED_TINY)
    assert torch.get_num_threads() == saved
    assert [r["B"] for r in result["rows"]] == [1, 2] and result["exporters"] is None
    want = {"torch", "torch_bf16"} | ({"ort_scan"} if _bench.have_peer("onnxruntime") else set())
    if have:
        want |= {"fastln", "fastln_once", "fastln_int8"}
        want |= {"fastln_bf16"} if _bench.ml_dtypes else set()
    for r in result["rows"]:
        for part in ("forward", "step"):
            t = r["times"][part]
            assert {k for k, v in t.items() if v is not None} == want, (part, t)
        assert set(r["maxdiff"]) == want
        for key, d in r["maxdiff"].items():
            assert max(d.values()) <= lstmp.TOL[lstmp.PEERS[key][1]], (key, d)
        assert (r["ratios"]["fastln f32 / torch f32"]["step"] is not None) == have
        assert any("unrolled export: left out" in n for n in r["notes"])
    text = lstmp.format_table(result)
    assert "B=2 torch bfloat16 " in text and "int8 / fastln f32 packed once  <= 0.50x" in text
    assert ("fastln has no LSTMP here" in text) == (not have)
    assert "| ratio | target | B=1 fwd |" in lstmp.format_table(result, markdown=True)
    json.loads(json.dumps(result))


def test_lstmp_scan_graph_is_the_projected_lstm(torch, lstmp):
    """The ONNX graphs written here compute nn.LSTM(proj_size)'s y and state."""
    pytest.importorskip("onnxruntime")
    module = torch.nn.LSTM(8, 16, proj_size=4).eval()
    x = np.random.default_rng(0).standard_normal((5, 3, 8), dtype=np.float32)
    fwd, step, steps = lstmp._ort_fns(*lstmp.ort_scan_models(module), x, 1)
    with torch.inference_mode():
        y, (h, c) = module(torch.from_numpy(x))
    np.testing.assert_allclose(fwd(), y.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(steps(5), y.numpy(), rtol=1e-5, atol=1e-6)


def test_lstmp_catches_a_wrong_peer(torch, lstmp, monkeypatch):
    """A peer whose y is not the torch module's stops the run before timing."""
    fns = lstmp._torch_fns

    def wrong(module, x, dtype):
        fwd, step, steps = fns(module, x, dtype)
        return (lambda: 2 * fwd()) if dtype == "bfloat16" else fwd, step, steps
    monkeypatch.setattr(lstmp, "_torch_fns", wrong)
    with pytest.raises(AssertionError, match=r"torch bfloat16 forward B=1: y \(first 5 steps\)"):
        lstmp.run(threads=1, batches=(1,), case=LSTMP_CASE, export=False, probe=False,
                  timing=FUSED_TINY)


def test_lstmp_main(torch, lstmp, tmp_path, capsys):
    """The command line: a tiny case, written as JSON, with what torch.onnx.export does."""
    path = tmp_path / "lstmp.json"
    tiny = ["--input", "8", "--hidden", "16", "--proj", "4", "--steps", "5"]
    assert lstmp.main(["--quick", "--threads", "1", "--batch", "1", *tiny,
                       "--json", str(path)]) == 0
    res = json.loads(path.read_text())
    assert res["quick"] and res["case"] == LSTMP_CASE and res["threads"] == 1
    out = capsys.readouterr().out
    assert "LSTMP, one layer, I=8 H=16 P=4, forward over T=5" in out
    if _bench.have_peer("onnxruntime"):
        assert set(res["exporters"]) == {"torchscript", "dynamo"}
        assert "note: torch.onnx.export (torchscript) of nn.LSTM(proj_size): " in out
    for bad in (["--batch", "0"], ["--proj", "16", "--hidden", "16"]):
        with pytest.raises(SystemExit):
            lstmp.main(bad)
    assert "--proj below --hidden" in capsys.readouterr().err
