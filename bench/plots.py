"""PNG plots of bench/run.py's results, redrawn from its JSON without re-running.

    python bench/plots.py [--json bench/results/latest.json] [--outdir bench/results]

- throughput.png: float32 LayerNorm throughput (input + output bytes per second:
  forward reads x and writes y, backward reads x and dy and writes dx) against
  size (rows x H, log axes) per peer, forward and backward, for H = 64 and
  H = 1024 (or the two H with the most shapes), at 2 threads (or the largest
  thread count measured). The dashed line is the ceiling: fastln's parallel
  copy of the same bytes on the same threads.
- speedup_heatmap.png: fastln's speedup over the fastest peer for each shape
  (rows = H, columns = rows N), forward and backward, at the same thread count;
  each cell names the fastest peer. The colours are diverging and centred on 1
  (blue: fastln faster; red: a peer faster), on a log scale.

Needs matplotlib (drawn with the Agg backend; no display).
"""
import argparse
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

PEERS = ("numpy", "torch", "onnxruntime", "jax")    # fastln's peers, as in fastln/_bench.py
SHORT = {"numpy": "numpy", "torch": "torch", "onnxruntime": "ort", "jax": "jax"}
STYLE = {"fastln": dict(color="C3", marker="o", lw=2.4, zorder=5),
         "fastln_out": dict(color="C3", marker="", lw=1.2, ls=":", zorder=4),
         "numpy": dict(color="C7", marker="s", lw=1.2),
         "torch": dict(color="C1", marker="^", lw=1.2),
         "onnxruntime": dict(color="C2", marker="v", lw=1.2),
         "jax": dict(color="C0", marker="D", lw=1.2)}
LABEL = {"fastln": "fastln", "fastln_out": "fastln out=", "numpy": "NumPy",
         "torch": "PyTorch", "onnxruntime": "ONNX Runtime", "jax": "JAX"}


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _ln_rows(results):
    """float32 LayerNorm rows at 2 threads (else the largest count), and that count."""
    rows = [r for r in results["rows"] if r.get("op", "layer_norm") == "layer_norm"
            and r.get("dtype", "float32") == "float32"]
    if not rows:
        return [], None
    counts = sorted({r["threads"] for r in rows})
    n = 2 if 2 in counts else counts[-1]
    return [r for r in rows if r["threads"] == n], n


def _machine(results):
    info = results.get("info", {})
    return f"{info.get('cpu', '?')}, {info.get('cores', '?')} cores"


def _bytes(r, part):
    key = f"{part}_bytes"
    if r.get(key):
        return r[key]
    return (2 if part == "fwd" else 3) * r["nbytes"]


def _pick_hs(rows):
    """Up to two H values for the throughput panels."""
    count = {}
    for r in rows:
        count[r["H"]] = count.get(r["H"], 0) + 1
    multi = [h for h, c in count.items() if c > 1] or list(count)
    pref = [h for h in (64, 1024) if h in multi]
    if len(pref) == 2 or len(multi) == len(pref):
        return pref
    rest = sorted((h for h in multi if h not in pref), key=lambda h: (-count[h], h))
    return sorted(pref + rest[:2 - len(pref)])


def plot_throughput(results, path):
    """Throughput against size per peer (see the module docstring). Returns path, or
    None when there are no float32 LayerNorm rows."""
    rows, n = _ln_rows(results)
    if not rows:
        return None
    plt = _pyplot()
    hs = _pick_hs(rows)
    parts = [p for p in ("fwd", "bwd") if any(r.get(f"{p}_fastln") for r in rows)]
    fig, axes = plt.subplots(len(parts), len(hs), figsize=(5.2 * len(hs), 3.9 * len(parts)),
                             squeeze=False, sharex="col")
    for i, part in enumerate(parts):
        for j, H in enumerate(hs):
            ax = axes[i][j]
            rs = sorted((r for r in rows if r["H"] == H), key=lambda r: r["N"])
            size = [r["N"] * r["H"] for r in rs]
            for peer in ("fastln", "fastln_out") + PEERS:
                pts = [(s, _bytes(r, part) / r[f"{part}_{peer}"] / 1e9)
                       for s, r in zip(size, rs) if r.get(f"{part}_{peer}")]
                if pts:
                    ax.plot(*zip(*pts), label=LABEL[peer], ms=4, **STYLE[peer])
            ceil = [(s, r["copy_GBps"]) for s, r in zip(size, rs) if r.get("copy_GBps")]
            if ceil:
                ax.plot(*zip(*ceil), color="k", ls="--", lw=1.2, label="copy (ceiling)")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.grid(True, which="major", alpha=0.3)
            ax.set_title(f"{'forward' if part == 'fwd' else 'backward'}, H = {H}", fontsize=10)
            if i == len(parts) - 1:
                ax.set_xlabel("size: rows x H (elements)")
            if j == 0:
                ax.set_ylabel("GB/s (input + output bytes)")
            ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"float32 LayerNorm throughput, {n} thread{'s' if n > 1 else ''} "
                 f"({_machine(results)})", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def speedup_grid(rows, part):
    """(Hs, Ns, speedups, fastest peers): fastln's speedup over the fastest peer for
    each (H, N) -- a list of lists, None where not measured."""
    hs = sorted({r["H"] for r in rows})
    ns = sorted({r["N"] for r in rows})
    by = {(r["H"], r["N"]): r for r in rows}
    grid, names = [], []
    for H in hs:
        g, nm = [], []
        for N in ns:
            r = by.get((H, N))
            t = r.get(f"{part}_fastln") if r else None
            peers = [(r[f"{part}_{p}"], p) for p in PEERS if r and r.get(f"{part}_{p}")]
            if t and peers:
                best, who = min(peers)
                g.append(best / t)
                nm.append(who)
            else:
                g.append(None)
                nm.append(None)
        grid.append(g)
        names.append(nm)
    return hs, ns, grid, names


def plot_heatmap(results, path):
    """fastln's speedup over the fastest peer (see the module docstring). Returns
    path, or None when there are no float32 LayerNorm rows."""
    rows, n = _ln_rows(results)
    if not rows:
        return None
    plt = _pyplot()
    import numpy as np
    from matplotlib.colors import LogNorm
    parts = [p for p in ("fwd", "bwd") if any(r.get(f"{p}_fastln") for r in rows)]
    grids = {p: speedup_grid(rows, p) for p in parts}
    vals = [v for p in parts for g in grids[p][2] for v in g if v]
    m = max([2.0] + [max(v, 1 / v) for v in vals])
    m = min(2.0 ** math.ceil(math.log2(m)), 64.0)
    norm = LogNorm(vmin=1 / m, vmax=m)     # symmetric in log space: 1.0 in the middle
    hs, ns = grids[parts[0]][0], grids[parts[0]][1]
    fig, axes = plt.subplots(1, len(parts), squeeze=False, layout="constrained",
                             figsize=(1.0 + 1.15 * len(ns) * len(parts) + 1.2,
                                      1.5 + 0.55 * len(hs)))
    im = None
    cmap = plt.get_cmap("RdBu").with_extremes(bad="#dddddd")
    for ax, part in zip(axes[0], parts):
        hs, ns, grid, names = grids[part]
        a = np.array([[np.nan if v is None else v for v in g] for g in grid], float)
        im = ax.imshow(np.ma.masked_invalid(a), cmap=cmap, norm=norm, aspect="auto",
                       origin="lower")
        for i in range(len(hs)):
            for j in range(len(ns)):
                v = grid[i][j]
                if v is None:
                    ax.text(j, i, "-", ha="center", va="center", fontsize=8, color="#777")
                    continue
                dark = abs(math.log(v)) > 0.6 * math.log(m)
                ax.text(j, i, f"{v:.2f}\n{SHORT[names[i][j]]}", ha="center", va="center",
                        fontsize=7.5, color="white" if dark else "black")
        ax.set_xticks(range(len(ns)), [str(N) for N in ns])
        ax.set_yticks(range(len(hs)), [str(H) for H in hs])
        ax.set_xlabel("rows N")
        ax.set_ylabel("H")
        ax.set_title(f"{'forward' if part == 'fwd' else 'backward'}: fastln's speedup over "
                     "the fastest peer", fontsize=9)
    cb = fig.colorbar(im, ax=list(axes[0]), shrink=0.9)
    step = 1 if m <= 16 else 2
    ticks = [2.0 ** k for k in range(-6, 7, step) if 1 / m <= 2.0 ** k <= m]
    cb.set_ticks(ticks, labels=[f"{t:g}" if t >= 1 else f"1/{1 / t:g}" for t in ticks])
    cb.minorticks_off()
    cb.set_label("t_fastest peer / t_fastln")
    fig.suptitle(f"float32 LayerNorm, {n} thread{'s' if n > 1 else ''} "
                 f"({_machine(results)})", fontsize=10)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def render(results, outdir):
    """Draw both plots into outdir. Returns {"throughput": path, "heatmap": path}
    for those drawn (none without float32 LayerNorm rows). ImportError without
    matplotlib."""
    _pyplot()
    os.makedirs(outdir, exist_ok=True)
    out = {}
    p = plot_throughput(results, os.path.join(outdir, "throughput.png"))
    if p:
        out["throughput"] = p
    p = plot_heatmap(results, os.path.join(outdir, "speedup_heatmap.png"))
    if p:
        out["heatmap"] = p
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=os.path.join(HERE, "results", "latest.json"),
                    help="bench/run.py's results (default bench/results/latest.json)")
    ap.add_argument("--outdir", help="where to write the PNGs (default: beside the JSON)")
    args = ap.parse_args(argv)
    try:
        with open(args.json) as f:
            results = json.load(f)
    except OSError as e:
        ap.error(f"--json {args.json}: {e.strerror or e} (write it with python bench/run.py)")
    except ValueError as e:   # json.JSONDecodeError and UnicodeDecodeError
        ap.error(f"--json {args.json}: not JSON ({e})")
    if not isinstance(results, dict) or not isinstance(results.get("rows"), list):
        ap.error(f"--json {args.json}: not the results of bench/run.py (no 'rows' list)")
    paths = render(results, args.outdir or os.path.dirname(os.path.abspath(args.json)))
    if not paths:
        print("no float32 LayerNorm rows: nothing to draw")
        return 1
    print("wrote " + ", ".join(os.path.relpath(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
