"""The command lines of the served model (fastln.serve), the benchmarks and
``python -m fastln``, as a new user meets them:

1. python -m fastln.serve.loadtest --quick runs every mode; it writes its
   results to an --outdir given, and without one writes nothing and says why
   (a full run writes them to --outdir, by default the current folder).
2. fastln-serve --model takes an .npz of a bare state_dict (the class and sizes
   inferred from the parameters, a clear error where they cannot be) and an
   .onnx file; a missing file, a file of another kind, a port out of range
   and a bad setting are one-line argparse errors.
3. Every option of fastln-serve, fastln.serve.model and .loadtest shows its default in
   --help; gradient_flow.py's --threads help says what its default does.
4. bench/harness.py says it is a library module; bench/plots.py's missing
   --json and ``python -m fastln --json`` into a missing folder are argparse
   errors, the latter before anything runs.
5. bench/rnn.py prints no targets; bench/run.py reports the whole run's wall
   time and prints a progress line per section to stderr.
6. setup.py's docstring says why each build artifact is in the checkout.
"""
import ast
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import types

import numpy as np
import pytest

from fastln import rnn

from _util import assert_every_option_shows_its_default, require

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.append(ROOT)


def serve(name):
    """fastln.serve.<name>; its packages missing: a skip, or a failure under CI."""
    for dep in ("picows", "starlette", "uvicorn", "ml_dtypes"):
        require(dep)
    return importlib.import_module(f"fastln.serve.{name}")


def bench(name):
    spec = importlib.util.spec_from_file_location(f"fastln_bench_{name}_cli",
                                                  os.path.join(ROOT, "bench", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def exits(code, fn, *args):
    with pytest.raises(SystemExit) as info:
        fn(*args)
    assert info.value.code == code


# ---------------------------------------------------------------- 1. loadtest --quick

FAKE_ROW = {"run": "closed", "dtype": "float32", "hz": None, "streams": 1, "steps": 20,
            "steps_per_s": 1.0, "p50_ms": 1.0, "p99_ms": 2.0, "cpu_us": 20.0, "mean_batch": 1.0,
            "errors": 0, "mismatches": 0, "lost": 0, "lat_ms": np.array([1.0, 2.0])}


@pytest.fixture
def fake_loadtest(monkeypatch, tmp_path):
    """loadtest's command line with run_all answering at once and plot
    recording its path, in tmp_path (the current folder)."""
    import fastln
    lt = serve("loadtest.cli")
    threads = fastln.get_num_threads()   # main sets --threads for the whole process
    monkeypatch.setattr(lt, "run_all", lambda args, workdir: ([dict(FAKE_ROW)],
                                                               {"float32": 256}))
    lt.drawn = []
    monkeypatch.setattr(lt, "plot", lambda rows, path: lt.drawn.append(path))
    monkeypatch.chdir(tmp_path)
    yield lt
    fastln.set_num_threads(threads)


def test_quick_loadtest_writes_nothing_and_says_why(fake_loadtest, tmp_path, capsys):
    for argv in (["--quick"], ["--runs", "closed"]):
        assert fake_loadtest.main(argv) == 0
        out = capsys.readouterr().out
        assert "nothing written" in out and "--outdir DIR writes these to DIR" in out, out
    assert os.listdir(tmp_path) == [] and fake_loadtest.drawn == []


@pytest.mark.parametrize("argv", [["--quick"], ["--runs", "closed"]])
def test_quick_loadtest_writes_to_an_outdir_given(fake_loadtest, tmp_path, argv):
    assert fake_loadtest.main([*argv, "--outdir", "out"]) == 0
    text = (tmp_path / "out" / "RESULTS.md").read_text()
    assert f"Command: `python -m fastln.serve.loadtest {' '.join(argv)} --outdir out`" in text
    assert "| closed | float32 | 1 | - | 20 |" in text
    assert ("largest stream count" in text) == (argv == ["--quick"])   # the sweep ran
    assert fake_loadtest.drawn == [os.path.join("out", "serve_latency.png")]
    exits(2, fake_loadtest.main, [*argv, "--outdir", "out", "--no-write"])


def test_full_loadtest_writes_its_results(fake_loadtest, tmp_path):
    assert fake_loadtest.main(["--streams", "1", "--steps", "3"]) == 0
    text = (tmp_path / "RESULTS.md").read_text()
    assert "| closed | float32 | 1 | - | 20 |" in text
    assert "largest stream count at 50 Hz with p99 < 20 ms: 256 (float32)" in text
    assert fake_loadtest.drawn == [os.path.join(".", "serve_latency.png")]
    assert fake_loadtest.main(["--streams", "1", "--no-write"]) == 0
    assert sorted(os.listdir(tmp_path)) == ["RESULTS.md"]


def test_quick_loadtest_runs_every_mode(capsys):
    """The real --quick run: every mode against real servers, every reply checked."""
    lt = serve("loadtest")
    import fastln
    threads = fastln.get_num_threads()
    try:
        assert lt.main(["--quick", "--dtypes", "float32"]) == 0
    finally:
        fastln.set_num_threads(threads)
    out = capsys.readouterr().out
    for run in ("echo", "closed", "open", "sweep", "restart", "engine", "mux-closed", "mux-open"):
        assert f"| {run} | float32 |" in out, out
    assert "multiplexed (2 connections) / the engine in-process at B = 4" in out
    assert "4 streams on 2 multiplexed connections" in out


# ---------------------------------------------------------------- 2. fastln-serve --model

def bare(path, model):
    np.savez(path, **model.state_dict())
    return str(path)


def bf16(model):
    import ml_dtypes
    return model.to(ml_dtypes.bfloat16)


@pytest.mark.parametrize("make", [
    lambda: rnn.LNLSTM(5, 8, 2, seed=1),
    lambda: rnn.LSTM(5, 8, seed=2),
    lambda: rnn.LNGRU(5, 8, 3, seed=3),
    lambda: rnn.LNLSTM(5, 8, dtype=np.float64, seed=4),
    lambda: bf16(rnn.LNLSTM(5, 8, seed=5)),
    lambda: bf16(rnn.LSTM(5, 8, 2, seed=6)),
], ids=["LNLSTM-2", "LSTM", "LNGRU-3", "LNLSTM-f64", "LNLSTM-bf16", "LSTM-bf16"])
def test_bare_state_dict_loads_as_its_model(make, tmp_path):
    sm = serve("model")
    model = make()
    loaded = sm.load_model(bare(tmp_path / "m.npz", model))
    assert sm.config_of(loaded) == sm.config_of(model)
    xs = np.random.default_rng(0).standard_normal((4, 5), dtype=np.float32)
    assert np.array_equal(sm.reference_run(loaded, xs), sm.reference_run(model, xs))


@pytest.fixture
def no_serving(monkeypatch):
    """fastln.serve.cli.serve records its arguments and the service instead of serving."""
    server = serve("cli")
    served = []

    async def record(args, service, token=None, store=None):
        served.append((args, service))
    monkeypatch.setattr(server, "serve", record)
    return served


def test_server_serves_a_bare_lnlstm_state_dict(tmp_path, no_serving):
    server = serve("cli")
    path = bare(tmp_path / "lnlstm.npz", rnn.LNLSTM(6, 10, seed=0))
    server.main(["--model", path, "--port", "8123"])
    ((args, service),) = no_serving
    assert (args.port, args.ws_port, args.host) == (8123, 8001, "127.0.0.1")
    assert service.config == {"class": "LNLSTM", "input_size": 6, "hidden_size": 10,
                              "num_layers": 1, "dtype": "float32", "eps": 1e-05}


def test_bare_state_dict_served_over_websocket(tmp_path):
    import asyncio
    sm, client = serve("model"), serve("client")
    model = rnn.LNLSTM(6, 10, 2, seed=3)
    path = bare(tmp_path / "lnlstm.npz", model)
    xs = sm.stream_inputs(0, 0, 5, 6)

    async def main(url):
        async with await client.StreamClient.connect(url, "bare", new=True) as c:
            return [(await c.step(x)).copy() for x in xs]
    with client.run_server("--model", path, "--threads", 1) as server:
        ys = asyncio.run(main(server.ws))
    assert np.array_equal(np.stack(ys), sm.reference_run(model, xs))


def test_server_takes_an_onnx_file_as_model(tmp_path, no_serving):
    require("onnx")
    from tests.test_serve import onnx_lstm
    server = serve("cli")
    path = tmp_path / "lstm.onnx"
    onnx_lstm(path, 5, 9)
    server.main(["--model", str(path)])
    ((_, service),) = no_serving
    assert service.config["class"] == "LSTM"
    assert (service.model.input_size, service.model.hidden_size) == (5, 9)


def server_error(argv, capsys):
    """fastln.serve.cli.main(argv)'s argparse error: (its last line, all of stderr)."""
    server = serve("cli")
    exits(2, server.main, argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1], err


@pytest.mark.parametrize("make, setting", [
    (lambda: rnn.GRU(4, 6), "linear_before_reset"),
    (lambda: rnn.RNN(4, 6), "nonlinearity"),
    (lambda: rnn.LNRNN(4, 6), "nonlinearity"),
])
def test_bare_state_dict_with_hidden_settings_is_refused(make, setting, tmp_path, capsys):
    line, _ = server_error(["--model", bare(tmp_path / "m.npz", make())], capsys)
    assert setting in line and "save_model" in line and "no config entry" in line


def test_bidirectional_and_foreign_npz_are_refused(tmp_path, capsys):
    line, _ = server_error(["--model", bare(tmp_path / "bi.npz",
                                            rnn.LNLSTM(4, 6, bidirectional=True))], capsys)
    assert "bidirectional" in line
    np.savez(tmp_path / "other.npz", weights=np.zeros(3))
    line, _ = server_error(["--model", str(tmp_path / "other.npz")], capsys)
    assert "'weights'" in line and "save_model" in line


def test_missing_model_file_is_one_line(tmp_path, capsys):
    line, err = server_error(["--model", str(tmp_path / "nope.npz")], capsys)
    assert line.endswith("--model " + str(tmp_path / "nope.npz") + ": no such file")
    assert "FileNotFoundError" not in err
    line, _ = server_error(["--onnx", str(tmp_path / "nope.onnx")], capsys)
    assert "--onnx" in line and "no such file" in line


def test_files_of_another_kind_are_named_so(tmp_path, capsys):
    (tmp_path / "bad.onnx").write_bytes(b"garbage\x00\xff")
    line, _ = server_error(["--model", str(tmp_path / "bad.onnx")], capsys)
    assert "not an ONNX model" in line and "pickled" not in line
    (tmp_path / "bad.npz").write_bytes(b"garbage\x00\xff")
    line, _ = server_error(["--model", str(tmp_path / "bad.npz")], capsys)
    assert "is not an .npz file" in line and "pickled" not in line


def test_server_settings_errors_name_the_option(tmp_path, capsys):
    path = bare(tmp_path / "m.npz", rnn.LNLSTM(4, 6))
    line, _ = server_error(["--model", path, "--max-batch", "0"], capsys)
    assert "--max-batch must be at least 1, got 0" in line
    line, _ = server_error(["--model", path, "--idle-timeout", "0"], capsys)
    assert "--idle-timeout must be finite and above 0, got 0.0" in line


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_port_out_of_range_is_an_argparse_error(port, capsys):
    line, _ = server_error(["--model", "m.npz", "--port", port], capsys)
    assert "argument --port" in line


# ---------------------------------------------------------------- 3. defaults in --help

@pytest.mark.parametrize("name", ["cli", "model", "loadtest"])
def test_serve_options_show_their_defaults(name):
    assert_every_option_shows_its_default(serve(name).make_parser())


def test_gradient_flow_threads_help_matches_its_default():
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        import gradient_flow
    finally:
        sys.path.remove(os.path.join(ROOT, "examples"))
    parser = gradient_flow.make_parser()
    (threads,) = [a for a in parser._actions if "--threads" in a.option_strings]
    assert threads.default == 1 and "None" not in threads.help
    assert_every_option_shows_its_default(parser)
    assert gradient_flow.parse_args([]).threads == 1


# ---------------------------------------------------------------- 4. bench and python -m fastln

def test_harness_says_it_is_a_library_module(capsys):
    harness = bench("harness")
    assert harness.main([]) == 2
    assert "library module" in capsys.readouterr().err
    exits(2, harness.main, ["--quick"])
    exits(0, harness.main, ["--help"])
    assert "library module" in capsys.readouterr().out
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "harness.py"), "-x"],
                         capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert run.returncode == 2 and "unrecognized arguments: -x" in run.stderr


def test_plots_missing_json_is_an_argparse_error(tmp_path, capsys):
    exits(2, bench("plots").main, ["--json", str(tmp_path / "missing.json")])
    err = capsys.readouterr().err
    assert "--json" in err and "No such file" in err and "Traceback" not in err
    (tmp_path / "bad.json").write_text("{")
    exits(2, bench("plots").main, ["--json", str(tmp_path / "bad.json")])
    assert "not JSON" in capsys.readouterr().err


def ran(*args, **kwargs):
    raise AssertionError("the run started before the --json path was checked")


def test_fastln_json_into_a_missing_folder_fails_before_running(tmp_path, monkeypatch, capsys):
    from fastln import __main__ as main_mod
    monkeypatch.setattr(main_mod, "self_check", ran)
    exits(2, main_mod.main, ["--json", str(tmp_path / "no" / "such" / "x.json")])
    out, err = capsys.readouterr()
    assert out == "" and "--json" in err and "does not exist" in err
    exits(2, main_mod.main, ["--json", str(tmp_path)])
    assert "is a folder" in capsys.readouterr().err


@pytest.mark.parametrize("script", ["rnn", "fused", "streams", "step"])
def test_bench_json_into_a_missing_folder_fails_before_running(script, tmp_path, monkeypatch,
                                                                capsys):
    mod = bench(script)
    monkeypatch.setattr(mod, "run", ran)
    exits(2, mod.main, ["--json", str(tmp_path / "no" / "x.json")])
    out, err = capsys.readouterr()
    assert "--json" in err and "does not exist" in err and "(quick)" not in out


def test_bench_streams_options_show_their_defaults():
    mod = bench("streams")
    assert_every_option_shows_its_default(mod.make_parser())
    args = mod.parse_args([])
    assert (args.streams, args.hidden, args.input, args.threads, args.dtype) == (
        256, 256, 128, 2, "float32")
    exits(2, mod.parse_args, ["--streams", "0"])


def test_bench_streams_runs_and_reports(tmp_path, capsys):
    """A tiny run of bench/streams.py: every rate positive, the ratios and the
    batcher's metrics in the report and the JSON."""
    mod = bench("streams")
    path = tmp_path / "streams.json"
    assert mod.main(["--streams", "8", "--hidden", "16", "--input", "8", "--seconds", "0.06",
                     "--rounds", "2", "--threads", "1", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "batcher / engine" in out and "StreamTable.step B=8" in out
    res = json.loads(path.read_text())
    assert set(res["median"]) == {"engine", "engine_thread", "table", "batcher"}
    assert all(len(v) == 2 and min(v) > 0 for v in res["rates"].values())
    assert res["batcher_metrics"]["steps"] > 0 and res["batcher_metrics"]["failed"] == 0


def test_bench_step_runs_and_reports(tmp_path, capsys):
    """A tiny run of bench/step.py: fastln's cases and every installed peer,
    each with a positive time, in the table and the JSON."""
    mod = bench("step")
    assert_every_option_shows_its_default(mod.make_parser())
    saved = mod.torch.get_num_threads() if mod.torch is not None else None
    path = tmp_path / "step.json"
    mod.main(["--input", "4", "--hidden", "8", "--repeat", "2", "--calls", "5",
              "--json", str(path)])
    out = capsys.readouterr().out
    rows = json.loads(path.read_text())
    names = [r["case"] for r in rows]
    assert names[:2] == ["fastln step()", "fastln step(), read-only weights"]
    assert (mod.ort is not None) == ("ONNX Runtime, LSTM node, T = 1" in names)
    assert (mod.torch is not None) == ("torch.nn.LSTMCell" in names)
    assert all(r["us"] > 0 and f"| {r['case']} |" in out for r in rows)
    if mod.torch is not None:   # the caller's torch keeps its thread count
        assert mod.torch.get_num_threads() == saved


# ---------------------------------------------------------------- 5. bench output

def rnn_result():
    """A result of bench/rnn.py's run() with made-up times, ratios past and short
    of every former target."""
    keys = ["fwd_eager_over_fastln", "fwd_fastln_over_lstm", "fwd_nocache_eager_over_fastln",
            "fwd_nocache_fastln_over_lstm", "fwdbwd_eager_over_fastln",
            "fwdbwd_fastln_over_lstm", "stream_eager_over_fastln", "stream_fastln_over_lstm"]
    results = [{"threads": n, "fastln": True, "times": {"fastln_fwd": 1e-3, "fastln_step": 2e-5},
                "ratios": {**{k: 0.5 * n for k in keys}, "step_us": 20.0 / n}, "checks": [],
                "models": {"GRU": {"fwd": (2e-3, 1e-3), "fwdbwd": (1e-3, 2e-3)},
                           "LNLSTM bidir": {"fwd": (3e-3, 1e-3), "fwdbwd": (1e-3, 3e-3)}}}
               for n in (1, 4)]
    return {"info": {"cpu_other_load": 0.0}, "quick": True, "elapsed_s": 1.0,
            "fastln_rnn": None, "results": results, "bf16": None}


def test_rnn_tables_carry_no_targets():
    mod = bench("rnn")
    text = mod.format_table(rnn_result()) + mod.results_md(rnn_result())
    assert "0.50x" in text and "2.00x" in text and "step 20.0 µs" in text
    for word in ("MISS", " ok", "≥", "≤", "target"):
        assert word not in text, word


def test_rnn_progress_goes_to_stderr(capsys):
    bench("rnn")._progress("a case")
    out, err = capsys.readouterr()
    assert out == "" and "a case" in err


def test_run_reports_the_whole_wall_time(tmp_path, monkeypatch, capsys):
    run = bench("run")
    skew = [0.0]
    monkeypatch.setattr(run, "time", types.SimpleNamespace(
        perf_counter=lambda: time.perf_counter() + skew[0]))

    def slow_rnn(nthreads, quick):   # a section that takes 500 s of the run's clock
        skew[0] += 500.0
        return {"error": "left out"}
    monkeypatch.setattr(run, "_run_rnn", slow_rnn)
    monkeypatch.setattr(run, "timing_kw", lambda quick, N, H: dict(
        repeats=2, min_sample=1e-4, budget=0.005, min_repeats=1))
    peers_before = run.harness.peer_threads()
    assert run.main(["--quick", "--shapes", "3x16", "--ops", "ln", "--threads", "1",
                     "--peers", "numpy", "--no-fused", "--no-plots",
                     "--outdir", str(tmp_path)]) == 0
    # the peers' thread counts come back (torch's would cap fastln's OpenMP limit)
    assert run.harness.peer_threads() == peers_before
    out, err = capsys.readouterr()
    total = int(re.search(r"\((\d+) s in all\)", out).group(1))
    assert total >= 500
    results = json.loads((tmp_path / "latest.json").read_text())
    assert results["elapsed_s"] >= 500 > results["ln_elapsed_s"]
    assert "s in all, the LayerNorm cases" in (tmp_path / "RESULTS.md").read_text()
    assert "-- LayerNorm cases" in err and "-- writing the results" in err


# ---------------------------------------------------------------- 6. setup.py's docstring

def test_setup_docstring_explains_each_build_artifact():
    with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read()))
    for artifact, why in (("build/", "setuptools"), ("fastln.egg-info/", "setuptools"),
                          ("fastln/*.c", "Cython's output"),
                          ("fastln/*.so", "the extension")):
        sentence = doc[doc.index(artifact):].split(";")[0]
        assert why in sentence, (artifact, sentence)
