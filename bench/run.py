"""The wide benchmark: fastln against NumPy, PyTorch, ONNX Runtime and JAX.

    python bench/run.py [--quick] [--threads 1,2] [--no-rnn] [--no-fused]
                        [--ops ln,rms,add,f16,bf16]
                        [--shapes NxH,...] [--peers numpy,torch,onnxruntime,jax]
                        [--no-plots] [--outdir DIR]

Measures, at each thread count, with the machinery of bench/harness.py
(medians, peers timed in turns in one process, each peer's output checked
against fastln's first, ratios of medians, fastln's out= throughput as a
fraction of a parallel copy of the same bytes):

- ln:   float32 LayerNorm forward and backward over the grid H in 16, 64, 128,
        768, 1024, 4096, 8192 x rows 1, 32, 4096, 16384, plus (262144, 16),
        (262144, 64) and (65536, 256);
- rms:  RMSNorm forward, float32;
- add:  add_layer_norm forward (x + residual, then LayerNorm), float32;
- f16, bf16: LayerNorm forward on float16 / bfloat16 storage, with fastln's
        16-bit elements/s relative to its float32 forward on the same values;
        these four on (1, 768), (4096, 768), (16384, 1024), (16384, 4096),
        (262144, 64), (65536, 256).

A peer that is not installed is a "-" column. Writes bench/results/latest.json,
the plots bench/results/throughput.png and speedup_heatmap.png (bench/plots.py;
skipped with a note when matplotlib is missing) and regenerates
bench/RESULTS.md. Then the LN-RNN cases of bench/rnn.py (skipped with
--no-rnn) add a "## LN-RNN" section to both, and the fused residual norms and
channels-first cases of bench/fused.py (skipped with --no-fused) a "## Fused
residual norms and channels-first LayerNorm" section. --quick: fewer shapes and
samples.
--shapes replaces every op's shapes; --outdir writes all the outputs to DIR
instead (handy for a trial run that should not replace the committed results).
"""
import argparse
import importlib.util
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # the repository root, for an in-place build

import fastln  # noqa: E402
from bench import harness  # noqa: E402
from fastln import _selfcheck  # noqa: E402

ROWS = (1, 32, 4096, 16384)
HS = (16, 64, 128, 768, 1024, 4096, 8192)
SHAPES = [(n, h) for h in HS for n in ROWS] + [(262144, 16), (262144, 64), (65536, 256)]
EXTRA_SHAPES = [(1, 768), (4096, 768), (16384, 1024), (16384, 4096), (262144, 64), (65536, 256)]
QUICK_SHAPES = [(n, h) for h in (64, 1024, 4096) for n in (1, 32, 4096)] + [(262144, 64)]
QUICK_EXTRA_SHAPES = [(1, 768), (16384, 1024)]

# --ops names -> (op, dtype); "ln" is float32 LayerNorm forward and backward
OPS = {"ln": ("layer_norm", "float32"), "rms": ("rms_norm", "float32"),
       "add": ("add_layer_norm", "float32"), "f16": ("layer_norm", "float16"),
       "bf16": ("layer_norm", "bfloat16")}

TITLES = {("layer_norm", "float32", "fwd"): "LayerNorm forward, float32",
          ("layer_norm", "float32", "bwd"): "LayerNorm backward, float32",
          ("rms_norm", "float32", "fwd"): "RMSNorm forward, float32",
          ("add_layer_norm", "float32", "fwd"): "add + LayerNorm forward, float32",
          ("layer_norm", "float16", "fwd"): "LayerNorm forward, float16",
          ("layer_norm", "bfloat16", "fwd"): "LayerNorm forward, bfloat16"}

# bfloat16 forward past the cache: >= 1.8x float32's elements/s (bench/README.md)
BF16_TARGET = 1.8


def timing_kw(quick, N, H):
    """harness.bench_shape's sampling settings for one shape: medians of up to
    ``repeats`` samples; every peer gets ``budget`` seconds of samples at most,
    and ``min_repeats`` samples at least. Past 64 MB per array (where a NumPy
    call takes 0.1-1.5 s) the budget is halved, so the biggest shapes cost about
    4 calls per peer (its check, a calibration call, 3 samples). Together these
    keep the full run near 9 minutes on 2 quiet cores."""
    if quick:
        return dict(repeats=5, budget=0.1, min_sample=1e-3, min_repeats=2)
    big = N * H * 4 > 64 << 20
    return dict(repeats=11, budget=0.5 if big else 1.0, min_sample=2e-3, min_repeats=3)


def cases(ops, quick, shapes=None):
    """[(N, H, op, dtype)] for the --ops names, in order."""
    out = []
    for name in ops:
        op, dtype = OPS[name]
        sh = shapes or ((QUICK_SHAPES if quick else SHAPES) if name == "ln"
                        else (QUICK_EXTRA_SHAPES if quick else EXTRA_SHAPES))
        out.extend((N, H, op, dtype) for N, H in sh)
    return out


def l3_bytes():
    """The last-level cache size from sysfs (32 MiB if unknown)."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        names = [d for d in os.listdir(base) if d.startswith("index")]   # not "uevent"
    except OSError:
        names = []
    for d in names:
        try:
            with open(os.path.join(base, d, "size")) as f:
                s = f.read().strip()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:].upper(), 1)
            best = max(best, int(s.rstrip("KMGkmg")) * mult)
        except (OSError, ValueError):
            continue
    return best or 32 << 20


def _write(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# ---- RESULTS.md ---------------------------------------------------------------

def _jax_note(rows):
    """What JAX ran on, for the tables of one thread count."""
    got = {(r.get("jax_threads"), r.get("jax_threads_exact")) for r in rows
           if r.get("jax_threads") is not None}
    if not got:
        return None
    if len(got) > 1:
        return "JAX: " + ", ".join(sorted(f"{t} threads ({'set' if e else 'its default'})"
                                          for t, e in got)) + " in different rows."
    (t, exact), = got
    if exact:
        return (f"JAX: {t} thread{'s' if t > 1 else ''} (its CPU backend created on {t} "
                f"CPU{'s' if t > 1 else ''}, which sizes XLA's thread pool).")
    return (f"JAX: {t} threads, not this section's count (XLA sizes its pool from the CPUs "
            "available when its backend is created, and it could not be created with this "
            "count here): the JAX column is not on the same threads.")


def _bf16_target(rows, l3):
    """A line on the bfloat16 target (bench/README.md) for the 16-bit rows past the cache."""
    past = [r for r in rows if r.get("dtype") == "bfloat16" and r.get("elems_vs_f32")
            and r["fwd_bytes"] > l3]
    if not past:
        big = max((r for r in rows if r.get("dtype") == "bfloat16" and r.get("elems_vs_f32")),
                  key=lambda r: r["fwd_bytes"], default=None)
        if big is None:
            return None
        return (f"Target (bfloat16 forward past the cache: ≥ {BF16_TARGET}x float32's "
                f"elements/s): no bfloat16 shape here moves more than the L3's {l3 >> 20} MiB; "
                f"at the largest, ({big['N']}, {big['H']}), it is {big['elems_vs_f32']:.2f}x.")
    parts = [f"({r['N']}, {r['H']}) {r['elems_vs_f32']:.2f}x "
             f"{'ok' if r['elems_vs_f32'] >= BF16_TARGET else 'MISS'}" for r in past]
    return (f"Target (bfloat16 forward past the cache, i.e. 16-bit input + output > L3 = "
            f"{l3 >> 20} MiB: ≥ {BF16_TARGET}x float32's elements/s): " + ", ".join(parts) + ".")


def results_md(results, command, plots=None, plots_note=None, md_dir=HERE):
    info, rows = results["info"], results["rows"]
    v = info["versions"]
    vers = ", ".join(f"{k} {v[k]}" for k in ("python", "numpy", "torch", "onnxruntime", "jax",
                                            "ml_dtypes", "fastln") if v.get(k)) or "?"
    missing = [k for k in ("torch", "onnxruntime", "jax") if not v.get(k)]
    busy = info.get("cpu_other_load")
    threads = sorted({r["threads"] for r in rows})
    l3 = info.get("l3_bytes") or (32 << 20)
    out = [
        "# fastln benchmark results",
        "",
        f"Generated by `{command}`; do not edit by hand.",
        "",
        f"- date: {info['date']}",
        f"- machine: {info['cpu']}, {info['cores']} cores, L3 {l3 >> 20} MiB",
        f"- versions: {vers}" + (f" (not installed: {', '.join(missing)})" if missing else ""),
        f"- fastln ISA path: {info['isa']} (supported: {', '.join(info['supported_isas'])}), "
        f"OpenMP {'on' if info['openmp'] else 'off'}"
        + (f", wait policy: {info['wait_policy']}" if info.get("wait_policy") else ""),
        f"- threads: {', '.join(map(str, threads))} (fastln, torch and ONNX Runtime on the same "
        "count in each section; JAX's count is given per section)",
        f"- run: {'quick, ' if results.get('quick') else ''}{results['elapsed_s']:.0f} s in all"
        + (f", the LayerNorm cases {results['ln_elapsed_s']:.0f} s"
           if results.get("ln_elapsed_s") is not None else "")
        + harness.load_phrase(busy),
        "",
    ]
    if plots:
        rel = {k: os.path.relpath(p, md_dir) for k, p in plots.items()}
        out += [f"Throughput against size ([{rel['throughput']}]({rel['throughput']}); "
                "the dashed line is the parallel copy) and fastln's speedup over the fastest "
                f"peer per shape ([{rel['heatmap']}]({rel['heatmap']})), float32 LayerNorm; "
                "`python bench/plots.py` redraws both from latest.json.", "",
                f"![throughput against size]({rel['throughput']})", "",
                f"![speedup heatmap]({rel['heatmap']})", ""]
    elif plots_note:
        out += [f"Plots: {plots_note}", ""]
    out += [
        "Normalized over the last axis; eps = 1e-5 (LayerNorm), 1e-6 (RMSNorm). Times are "
        "medians in µs per call, the peers timed in turns in one process on the same number "
        "of threads. \"vs P\" is fastln's speedup over P (t_P / t_fastln; above 1 means fastln "
        "is faster). The fastln column allocates its result like the peers do; \"out=\" is "
        "fastln writing into a preallocated array (for large shapes the page faults of fresh "
        "memory can cost as much as the kernel itself). fwd/copy is fastln's `out=` forward "
        "throughput as a fraction of a parallel copy of the same bytes on the same threads "
        "(t_copy / t_fwd for LayerNorm and RMSNorm; add + LayerNorm moves 4 arrays, x, "
        "residual, y and the sum, against the copy's 2); bwd/copy counts 3 streams for "
        "backward (read x, read dy, write dx: 1.5 t_copy / t_bwd). For tiny shapes both "
        "fractions are dominated by per-call overhead.",
        "",
        "Peers: NumPy is a plain float32 implementation (float16 computed via float32); torch "
        "is `F.layer_norm` / `F.rms_norm` and `aten.native_layer_norm_backward` (16-bit: "
        "torch.float16 / torch.bfloat16 tensors, float32 weight and bias); ONNX Runtime is one "
        "LayerNormalization node (opset 17, float32 forward only, workers told not to spin); "
        "JAX is `jax.jit` of a jnp LayerNorm / RMSNorm (16-bit input widened to float32 inside, "
        "the result rounded back) on the CPU backend, its backward `jax.vjp` of the forward, "
        "jitted (so it recomputes the statistics), each call ending in `block_until_ready`. "
        "Every peer's output is checked against fastln's before it is timed (float32: "
        "rtol = atol = 1e-4; float16: 2e-3 / 1e-3; bfloat16: 1e-2 / 1e-2, in float64); a "
        "disagreement is listed under its table as `!! MISMATCH`. In the 16-bit tables "
        "\"f32 out= us\" is fastln's float32 forward on the same values and \"bf16/f32 elem/s\" "
        "(\"f16/f32\") its 16-bit elements/s over float32's (both out=, timed in the same turns).",
        "",
    ]
    for n in threads:
        sub = [r for r in rows if r["threads"] == n]
        out.append(f"## {n} thread{'s' if n > 1 else ''}")
        out.append("")
        note = _jax_note(sub)
        if note:
            out += [note, ""]
        for (op, dtype, part), title in TITLES.items():
            rs = [r for r in sub if r.get("op", "layer_norm") == op
                  and r.get("dtype", "float32") == dtype
                  and r.get(f"{part}_fastln") is not None]
            if not rs:
                continue
            out.append(f"### {title}")
            out.append("")
            out.append(harness.format_table(rs, markdown=True, parts=(part,), detail=True))
            out.append("")
            if dtype == "bfloat16":
                line = _bf16_target(rs, l3)
                if line:
                    out += [line, ""]
    return "\n".join(out)


# ---- the LN-RNN section (bench/rnn.py); optional, and its failure is not fatal

def _load(name, filename):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, filename))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def _rnn_module():
    return _load("fastln_bench_rnn", "rnn.py")


def _section(what):
    """A progress line on stderr, flushed, as a section of the run begins."""
    print(f"-- {what} ...", file=sys.stderr, flush=True)


def _run_rnn(nthreads, quick):
    """bench/rnn.py's run() as a JSON-friendly dict, or {"error": message}."""
    print("LN-RNN (bench/rnn.py) ...", flush=True)
    _section("LN-RNN (bench/rnn.py): a line per case follows")
    try:
        return _rnn_module().run(threads=nthreads, quick=quick)
    except Exception as e:  # e.g. a failed check: reported, the LN results are still written
        return {"error": f"{type(e).__name__}: {e}"}


def _rnn_md(rnn_result):
    if rnn_result is None:
        return ""
    if "error" in rnn_result:
        return f"\n## LN-RNN\n\n`bench/rnn.py` failed: {rnn_result['error']}\n"
    return "\n" + _rnn_module().results_md(rnn_result) + "\n"


# ---- the fused and channels-first section (bench/fused.py); optional, as the LN-RNN one

def _fused_module():
    return _load("fastln_bench_fused", "fused.py")


def _run_fused(nthreads, quick):
    """bench/fused.py's run() as a JSON-friendly dict, or {"error": message}."""
    print("fused residual norms and channels-first LayerNorm (bench/fused.py) ...", flush=True)
    _section("fused residual norms and channels-first LayerNorm (bench/fused.py)")
    try:
        return _fused_module().run(threads=nthreads, quick=quick,
                                   progress=lambda r: print(_fused_module().progress_line(r),
                                                            flush=True))
    except Exception as e:  # e.g. a failed check: reported, the other results are still written
        return {"error": f"{type(e).__name__}: {e}"}


def _fused_md(fused_result):
    if fused_result is None:
        return ""
    if "error" in fused_result:
        return ("\n## Fused residual norms and channels-first LayerNorm\n\n"
                f"`bench/fused.py` failed: {fused_result['error']}\n")
    return "\n" + _fused_module().results_md(fused_result) + "\n"


def _plots(results, outdir):
    """bench/plots.py's render(): ({'throughput': path, 'heatmap': path}, None), or
    (None, why not)."""
    try:
        drawn = _load("fastln_bench_plots", "plots.py").render(results, outdir)
        return (drawn, None) if drawn else (None, "not drawn: no float32 LayerNorm rows")
    except ImportError as e:
        return None, (f"not drawn: {e} (`pip install matplotlib`, then "
                      "`python bench/plots.py`)")
    except Exception as e:  # a plotting bug must not lose the measurements
        return None, f"not drawn: {type(e).__name__}: {e}"


# ---- main ---------------------------------------------------------------------

def _parse_list(ap, text, allowed, flag):
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        ap.error(f"{flag}: choose from {', '.join(allowed)} (got {text!r})")
    return items


def _parse_shapes(ap, text):
    try:
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in text.split(",")]
        if any(len(s) != 2 or min(s) < 1 for s in shapes):
            raise ValueError
    except ValueError:
        ap.error("--shapes must look like 4096x768,1x64 (rows x H)")
    return shapes


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="fewer shapes and samples (about 1 min; 1.5 with the LN-RNN part, "
                    "and about 1 more per thread count with the fused part)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--no-rnn", action="store_true", help="skip the LN-RNN section (bench/rnn.py)")
    ap.add_argument("--no-fused", action="store_true",
                    help="skip the fused residual norms and channels-first section "
                    "(bench/fused.py)")
    ap.add_argument("--ops", default=",".join(OPS),
                    help=f"comma-separated subset of {','.join(OPS)} (default: all)")
    ap.add_argument("--shapes", metavar="NxH,...",
                    help="replace the grid: these (rows x H) shapes for every op")
    ap.add_argument("--peers", default=",".join(harness.PEERS),
                    help=f"comma-separated subset of {','.join(harness.PEERS)} (default: all; "
                    "a missing one is skipped)")
    ap.add_argument("--no-plots", action="store_true", help="do not draw the PNG plots")
    ap.add_argument("--outdir", metavar="DIR",
                    help="write latest.json, RESULTS.md and the plots to DIR instead of "
                    "bench/results and bench/RESULTS.md")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()   # the whole run's wall time counts from here
    nthreads = harness.parse_threads(ap, args.threads)
    ops = _parse_list(ap, args.ops, list(OPS), "--ops")
    peers = _parse_list(ap, args.peers, list(harness.PEERS), "--peers")
    shapes = _parse_shapes(ap, args.shapes) if args.shapes else None
    if "bf16" in ops and harness.ml_dtypes is None:
        print("bfloat16 needs ml_dtypes (pip install ml_dtypes): skipping bf16", flush=True)
        ops = [o for o in ops if o != "bf16"]
    command = "python bench/run.py" + "".join(
        " " + a for a in (sys.argv[1:] if argv is None else argv))
    todo = cases(ops, args.quick, shapes)

    info = harness.machine_info()
    info["l3_bytes"] = l3_bytes()
    info["cpu_busy_before"] = _selfcheck.cpu_busy()
    present = [p for p in peers if harness.have_peer(p)]
    absent = [p for p in harness.PEERS if p not in present]
    print(f"fastln {fastln.__version__}, ISA {info['isa']}, {info['cpu']} ({info['cores']} cores); "
          f"{len(todo)} cases x threads {nthreads}{' (quick)' if args.quick else ''}; peers: "
          f"{', '.join(present) or 'none'}"
          + (f" (not used: {', '.join(absent)})" if absent else ""),
          flush=True)
    if info["cpu_busy_before"] is not None and info["cpu_busy_before"] > 0.2:
        print(f"warning: other processes keep {100 * info['cpu_busy_before']:.0f}% of the CPUs "
              "busy; timings will be noisy", flush=True)

    _section(f"LayerNorm cases: {len(todo) * len(nthreads)}, a line per case follows")
    t0 = time.perf_counter()
    rows = []
    total = len(todo) * len(nthreads)
    saved = harness.peer_threads()   # restored after: the limit outlives the run otherwise
    try:
        with _selfcheck.OtherLoad() as load:
            for n in nthreads:
                # peers first: torch may share fastln's libgomp, and its
                # set_num_threads sets the OpenMP limit that fastln honours
                harness.set_peer_threads(n)
                with fastln.threads(n):
                    print(f"{fastln.get_num_threads()} thread(s):", flush=True)
                    for N, H, op, dtype in todo:
                        row = harness.bench_shape(
                            N, H, op=op, dtype=dtype, peers=present,
                            backward=(op, dtype) == ("layer_norm", "float32"),
                            **timing_kw(args.quick, N, H))
                        rows.append(row)
                        print(f"[{len(rows)}/{total} {time.perf_counter() - t0:.0f} s]"
                              + harness.progress_line(row), flush=True)
    finally:
        harness.restore_peer_threads(saved)
    ln_elapsed = time.perf_counter() - t0
    info["cpu_other_load"] = load.fraction
    rnn_result = None if args.no_rnn else _run_rnn(nthreads, args.quick)
    fused_result = None if args.no_fused else _run_fused(nthreads, args.quick)
    _section("writing the results")

    resdir = args.outdir or os.path.join(HERE, "results")
    md_path = os.path.join(args.outdir, "RESULTS.md") if args.outdir else os.path.join(
        HERE, "RESULTS.md")
    os.makedirs(resdir, exist_ok=True)
    results = {"info": info, "quick": args.quick, "command": command,
               "elapsed_s": time.perf_counter() - t_start, "ln_elapsed_s": ln_elapsed,
               "threads": nthreads, "ops": ops, "rows": rows, "rnn": rnn_result,
               "fused": fused_result}
    _write(os.path.join(resdir, "latest.json"), json.dumps(results, indent=1) + "\n")
    if args.no_plots:
        plots, note = None, "not drawn (--no-plots)"
    else:
        plots, note = _plots(results, resdir)
    _write(md_path, results_md(results, command, plots, note, os.path.dirname(md_path))
           + _rnn_md(rnn_result) + _fused_md(fused_result) + "\n")
    print()
    for (op, dtype, part), title in TITLES.items():
        rs = [r for r in rows if r["op"] == op and r["dtype"] == dtype
              and r.get(f"{part}_fastln") is not None]
        if rs:
            print(f"{title}:")
            print(harness.format_table(rs, parts=(part,)))
            print()
    if rnn_result is not None:
        print("LN-RNN:\n" + (_rnn_module().format_table(rnn_result) if "error" not in rnn_result
                             else "failed: " + rnn_result["error"]))
    if fused_result is not None:
        print("\nfused residual norms and channels-first LayerNorm:\n"
              + (_fused_module().format_table(fused_result) if "error" not in fused_result
                 else "failed: " + fused_result["error"]))
    if load.fraction is not None:
        print(f"other processes used {100 * load.fraction:.0f}% of the CPUs during the run")
    written = [os.path.join(resdir, "latest.json"), md_path] + list((plots or {}).values())
    print("\nwrote " + ", ".join(os.path.relpath(p) for p in written)
          + ("" if plots else f"; plots {note}")
          + f" ({time.perf_counter() - t_start:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
