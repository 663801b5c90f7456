"""``python -m fastln``: configuration, a self-check against fastln.reference (and
of the LN-RNN forward against fastln.rnn_reference, and of the int8 LSTM against
its float32 model), a short float32 LayerNorm benchmark against the peers
installed (NumPy, PyTorch, ONNX Runtime), and a row of the int8 LSTM against its
float32 model and ONNX Runtime's int8 LSTM.

Exits with status 1 when the self-check fails. Takes under 30 s on two cores
(``--quick``: about 10 s). The wider benchmark is bench/run.py.
"""
import argparse
import json
import sys
import time

import numpy as np

import fastln
from fastln import _selfcheck, reference

SHAPES = [(1, 768), (32, 768), (4096, 1024), (16384, 1024), (262144, 64)]

# normwise error bound: max|got - ref| <= TOL * max(1, max|ref|), per output
TOL = {np.float32: 2e-5, np.float64: 1e-11}
CHECK_SHAPES = [(1, 768), (33, 1000), (4, 9, 64), (300, 4096)]
# the int8 LSTM of the self-check and of the benchmark's int8 row
INT8_CASE = dict(T=16, B=8, I=64, H=128)


def _err(got, want):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    if not np.all(np.isfinite(got)):
        return float("inf")
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    return float(np.max(np.abs(got - want), initial=0.0)) / scale


def self_check():
    """fastln against the float64 references; prints a line per function and dtype.
    Returns (ok, results)."""
    print("self-check against fastln.reference (float64); "
          "error = max|fastln - ref| / max(1, max|ref|), worst over shapes "
          + ", ".join(str(s) for s in CHECK_SHAPES), flush=True)
    rng = np.random.default_rng(1234)
    ok = True
    results = []
    for dtype in (np.float32, np.float64):
        errs = {}   # (function, output) -> worst error

        def note(fn, names, got, want, errs=errs):
            for nm, g, r in zip(names, got, want):
                errs[(fn, nm)] = max(errs.get((fn, nm), 0.0), _err(g, r))

        for shape in CHECK_SHAPES:
            H = shape[-1]
            x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
            res = (rng.standard_normal(shape)).astype(dtype)
            dy = rng.standard_normal(shape).astype(dtype)
            w = (1 + 0.2 * rng.standard_normal(H)).astype(dtype)
            b = (0.2 * rng.standard_normal(H)).astype(dtype)

            y, mean, rstd = fastln.layer_norm(x, w, b, return_stats=True)
            note("layer_norm", ("y", "mean", "rstd"), (y, mean, rstd),
                 reference.layer_norm(x, w, b, return_stats=True))
            note("layer_norm_backward", ("dx", "dweight", "dbias"),
                 fastln.layer_norm_backward(dy, x, mean, rstd, w),
                 reference.layer_norm_backward(dy, x, mean, rstd, w))
            yr, rr = fastln.rms_norm(x, w, eps=1e-6, return_stats=True)
            note("rms_norm", ("y", "rstd"), (yr, rr),
                 reference.rms_norm(x, w, eps=1e-6, return_stats=True))
            note("rms_norm_backward", ("dx", "dweight"),
                 fastln.rms_norm_backward(dy, x, rr, w),
                 reference.rms_norm_backward(dy, x, rr, w))
            note("add_layer_norm", ("y", "sum"), fastln.add_layer_norm(x, res, w, b),
                 reference.add_layer_norm(x, res, w, b))
            ya, sa, ra = fastln.add_rms_norm(x, res[0], w, input_bias=b, return_stats=True)
            note("add_rms_norm", ("y", "sum", "rstd"), (ya, sa, ra),
                 reference.add_rms_norm(x, res[0], w, input_bias=b, return_stats=True))
            note("add_rms_norm_backward", ("dsum", "dweight", "dinput_bias"),
                 fastln.add_rms_norm_backward(dy, sa, ra, w, ds=res, input_bias_grad=True),
                 reference.add_rms_norm_backward(dy, sa, ra, w, ds=res, input_bias_grad=True))

        tol = TOL[dtype]
        for fn in dict.fromkeys(k[0] for k in errs):
            outs = [(nm, e) for (f, nm), e in errs.items() if f == fn]
            passed = all(e <= tol for _, e in outs)
            ok &= passed
            detail = "  ".join(f"{nm} {e:.1e}" for nm, e in outs)
            print(f"  {fn:<22} {np.dtype(dtype).name:<8} {detail:<46} "
                  f"tol {tol:.0e}  {'PASS' if passed else 'FAIL'}", flush=True)
            results.append({"function": fn, "dtype": np.dtype(dtype).name, "tol": tol,
                            "errors": dict(outs), "pass": passed})
    ok &= _rnn_check(rng, results)
    ok &= _int8_check(results)
    print(f"self-check: {'PASS' if ok else 'FAIL'}", flush=True)
    return ok, results


def _rnn_check(rng, results):
    """fastln.rnn forward (2 layers, a padded batch) against fastln.rnn_reference."""
    from fastln import rnn, rnn_reference
    ok = True
    T, B, I, H = 7, 5, 6, 33
    lengths = np.array([7, 3, 1, 7, 5])
    for name, cls, ref in (("LNLSTM", rnn.LNLSTM, rnn_reference.lnlstm_forward),
                           ("LNGRU", rnn.LNGRU, rnn_reference.lngru_forward),
                           ("LNRNN", rnn.LNRNN, rnn_reference.lnrnn_forward)):
        for dtype in (np.float32, np.float64):
            m = cls(I, H, num_layers=2, dtype=dtype, seed=3)
            x = rng.standard_normal((T, B, I)).astype(dtype)
            y, _ = m.forward(x, lengths=lengths, cache=False)
            err = _err(y, ref(m.params, x, lengths=lengths, num_layers=2)[0])
            tol = 10 * TOL[dtype]   # a recurrence compounds rounding
            passed = err <= tol
            ok &= passed
            print(f"  {name + ' forward':<20} {np.dtype(dtype).name:<8} "
                  f"{'y ' + format(err, '.1e'):<46} tol {tol:.0e}  {'PASS' if passed else 'FAIL'}",
                  flush=True)
            results.append({"function": name + " forward", "dtype": np.dtype(dtype).name,
                            "tol": tol, "errors": {"y": err}, "pass": passed})
    return ok


def _int8_check(results):
    """The int8 LSTM (fastln.rnn.quantize) of INT8_CASE against its float32 model:
    max |int8 y - float32 y| <= _selfcheck.INT8_TOL (an LSTM's |y| < 1, so that
    :func:`_err` is the max abs error); the line names the kernel."""
    from fastln import rnn
    model, q, x = _selfcheck.int8_lstm(**INT8_CASE)
    err = _err(q.forward(x, cache=False)[0], model.forward(x, cache=False)[0])
    tol, kernel = _selfcheck.INT8_TOL, rnn.int8_products()
    passed = err <= tol
    print(f"  {'LSTM forward':<20} {'int8':<8} "
          f"{f'y {err:.1e} vs float32, {kernel}':<46} tol {tol:.0e}  "
          f"{'PASS' if passed else 'FAIL'}", flush=True)
    results.append({"function": "LSTM forward", "dtype": "int8", "tol": tol,
                    "errors": {"y": err}, "pass": passed, "kernel": kernel})
    return passed


def _us(t):
    """Seconds t as microseconds, one decimal below a millisecond."""
    return f"{t * 1e6:.1f}" if t < 1e-3 else f"{t * 1e6:.0f}"


def _columns(heads, cells):
    """Lines of heads and the rows of cells in aligned columns: the first to the
    left, the others to the right."""
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    return "\n".join("  ".join(v.ljust(wd) if i == 0 else v.rjust(wd)
                               for i, (v, wd) in enumerate(zip(line, widths)))
                     for line in [heads] + cells)


def table(rows, part):
    """Text table of :func:`fastln._selfcheck.layer_norm_row` rows for ``part`` ("fwd" or
    "bwd"): microseconds per call, fastln's speedup over each peer, and its out= throughput
    relative to the copy's (the backward moves 3 arrays, the forward and the copy 2)."""
    peers = [p for p in ("numpy", "torch", "onnxruntime") if f"{part}_{p}" in rows[0]]
    heads = (["shape", "fastln us", "out= us", "copy us"] + [f"{p} us" for p in peers]
             + [f"vs {p}" for p in peers] + [f"{part}/copy"])
    cells = [[f"({r['N']}, {r['H']})"] + [_us(r[k]) for k in (
        f"{part}_fastln", f"{part}_fastln_out", "copy", *(f"{part}_{p}" for p in peers))]
        + [f"{r[f'{part}_{p}'] / r[f'{part}_fastln']:.2f}x" for p in peers]
        + [f"{100 * (1.5 if part == 'bwd' else 1) * r['copy'] / r[f'{part}_fastln_out']:.0f}%"]
        for r in rows]
    return _columns(heads, cells)


def int8_table(row):
    """Text table of a :func:`fastln._selfcheck.int8_lstm_row` row: microseconds per
    forward of the int8 LSTM, its float32 model and ONNX Runtime's int8 LSTM (where
    installed), the int8 model's speedup over each, and each int8 y's max |error|
    against the float32 y."""
    peers = [p for p in ("fastln", "onnxruntime_int8") if p in row]
    names = {"fastln": "float32", "onnxruntime_int8": "onnxruntime int8"}
    errs = [p for p in ("fastln_int8", "onnxruntime_int8") if p in row["error"]]
    enames = {"fastln_int8": "int8", "onnxruntime_int8": "onnxruntime int8"}
    heads = (["(T, B, I, H)", "int8 us"] + [f"{names[p]} us" for p in peers]
             + [f"vs {names[p]}" for p in peers] + [f"{enames[p]} err" for p in errs])
    cells = ([f"({row['T']}, {row['B']}, {row['I']}, {row['H']})", _us(row["fastln_int8"])]
             + [_us(row[p]) for p in peers]
             + [f"{row[p] / row['fastln_int8']:.2f}x" for p in peers]
             + [f"{row['error'][p]:.1e}" for p in errs])
    return _columns(heads, [cells])


def header(info):
    """The lines ``python -m fastln`` starts with, from
    :func:`fastln._selfcheck.machine_info`: versions, OpenMP's threads and how
    they wait between calls, the instruction-set path, the CPU, the peers."""
    v = info["versions"]
    peers = [f"{p} {v[p]}" for p in ("torch", "onnxruntime") if v[p]]
    missing = [p for p in ("torch", "onnxruntime") if not v[p]]
    return [f"fastln {fastln.__version__} (python {v['python']}, numpy {v['numpy']})",
            f"OpenMP: {'on' if info['openmp'] else 'off'}, threads: {info['threads']} "
            f"(cpus: {info['cores']})",
            f"wait policy: {info['wait_policy']}",
            f"ISA: {info['isa']} (supported: {', '.join(info['supported_isas'])})",
            f"CPU: {info['cpu']}",
            "peers: numpy " + v["numpy"] + "".join(", " + p for p in peers)
            + (f" (not installed: {', '.join(missing)})" if missing else "")]


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m fastln", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer samples (about 10 s in all)")
    ap.add_argument("--threads", type=int, metavar="N",
                    help="run fastln and the peers on N threads")
    ap.add_argument("--json", metavar="PATH", help="write the results to PATH as JSON")
    args = ap.parse_args(argv)
    if args.json is not None:
        _selfcheck.check_output_path(ap, "--json", args.json)
    if args.threads is not None:
        if args.threads < 1:
            ap.error("--threads must be >= 1")
        fastln.set_num_threads(args.threads)

    t_start = time.perf_counter()
    info = _selfcheck.machine_info()
    print("\n".join(header(info)), flush=True)
    print()

    ok, check = self_check()
    print()

    busy = _selfcheck.cpu_busy()
    info["cpu_busy_before"] = busy
    print(f"benchmark: float32 LayerNorm and the int8 LSTM, {fastln.get_num_threads()} "
          f"thread(s), medians of "
          f"samples taken in turns{' (quick)' if args.quick else ''}", flush=True)
    if busy is not None and busy > 0.2:
        print(f"  warning: other processes keep {100 * busy:.0f}% of the CPUs busy; "
              "timings (above all multithreaded ones) will be noisy", flush=True)
    kw = (dict(repeats=5, budget=0.12, min_sample=1e-3) if args.quick
          else dict(repeats=9, budget=0.4, min_sample=2e-3))
    rows = []
    with _selfcheck.OtherLoad() as load:
        for N, H in SHAPES:
            rows.append(_selfcheck.layer_norm_row(N, H, **kw))
            print(f"  ({N}, {H}) done", flush=True)
        int8_row = _selfcheck.int8_lstm_row(**INT8_CASE, **kw)
        print("  int8 LSTM done", flush=True)
    info["cpu_other_load"] = load.fraction
    print()
    print("median us per call. fastln allocates its result like the peers; out= writes into a "
          "preallocated array;\ncopy = fastln's parallel copy of x (the bandwidth ceiling); "
          "vs P = fastln's speedup over P (t_P / t_fastln);\nfwd/copy, bwd/copy = out= "
          "throughput as a fraction of the copy's (backward moves 3 arrays, the copy 2).")
    for part, title in (("fwd", "forward"), ("bwd", "backward")):
        print(f"\n{title}:")
        print(table(rows, part), flush=True)
    print(f"\nint8 LSTM forward: fastln.rnn.quantize of the float32 model (products on "
          f"{int8_row['kernel']});")
    if "onnxruntime_int8" in int8_row:
        print("onnxruntime int8 = ONNX Runtime's quantize_dynamic of the same float32 model;")
    print("vs P = the int8 model's speedup over P (t_P / t_int8); "
          "err = max|y - the float32 model's y|:")
    print(int8_table(int8_row), flush=True)
    bad = [f"({r['N']}, {r['H']}) {m}" for r in rows for m in r["mismatch"]]
    bad += [f"int8 LSTM {m}" for m in int8_row["mismatch"]]
    if bad:
        print("\n!! MISMATCH: these peers' outputs disagree with fastln's: " + "; ".join(bad))
    if load.fraction is not None:
        print(f"other processes used {100 * load.fraction:.0f}% of the CPUs during the benchmark"
              + ("; the timings are unreliable" if load.fraction > 0.1 else ""))
    elapsed = time.perf_counter() - t_start
    print(f"\n{'PASS' if ok else 'FAIL'} ({elapsed:.1f} s)")

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "selfcheck": check, "rows": rows, "int8_lstm": int8_row,
                       "elapsed_s": elapsed}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
