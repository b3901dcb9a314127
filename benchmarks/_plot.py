"""PNG plots next to a benchmark's JSON, when matplotlib is installed.

matplotlib is optional (the ``test`` extra installs it): without it
``plot`` and ``bars`` print one line and return None, so every benchmark
still writes its JSON.
"""
import os


def png_path(json_path):
    """``results/x.json`` -> ``results/x.png``."""
    return os.path.splitext(json_path)[0] + ".png"


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        print("matplotlib not installed: no plot written")
        return None
    matplotlib.use("Agg")          # files only, never a window
    import matplotlib.pyplot as plt
    return plt


def plot(path, series, xlabel, ylabel, title, logx=False, logy=False,
         hline=None, note=None):
    """Line plot. ``series``: {label: (xs, ys)}; ``hline``: a y value drawn
    dashed (e.g. 1.0 for a ratio). Returns the path written, or None."""
    plt = _pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=label)
    if hline is not None:
        ax.axhline(hline, color="grey", linestyle="--", linewidth=1)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    _finish(ax, fig, path, xlabel, ylabel, title, note)
    plt.close(fig)
    return path


def bars(path, labels, groups, ylabel, title, hline=None, note=None):
    """Grouped bars: ``groups`` is {series label: [one value per label]}."""
    plt = _pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(labels) + 2), 4),
                           dpi=100)
    n = max(1, len(groups))
    width = 0.8 / n
    for i, (name, values) in enumerate(groups.items()):
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(labels))]
        ax.bar(xs, values, width=width, label=name)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    if hline is not None:
        ax.axhline(hline, color="grey", linestyle="--", linewidth=1)
    _finish(ax, fig, path, None, ylabel, title, note)
    plt.close(fig)
    return path


def _finish(ax, fig, path, xlabel, ylabel, title, note):
    if xlabel:
        ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    if note:
        fig.text(0.01, 0.01, note, fontsize=7, color="grey")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path)
    print(f"wrote {path}")


# ------------------------------------------------ the benchmarks' pictures

def plot_step_time(json_path):
    """step_time.py: dtorch/torch step-time ratio per case and thread count."""
    import json
    with open(json_path) as f:
        res = json.load(f)
    runs = [r for r in res.get("runs", []) if r.get("cases")]
    if not runs:
        return None
    cases = [c for c in runs[0]["cases"]
             if "ratio" in runs[0]["cases"][c]]
    if not cases:
        print("no torch figures in the run: no step-time plot")
        return None
    groups = {f"{r['threads']} thread{'s' if r['threads'] > 1 else ''}":
              [r["cases"][c].get("ratio", float("nan")) for c in cases]
              for r in runs}
    return bars(png_path(json_path), cases, groups,
                "step time dtorch / PyTorch (lower is better)",
                "Training step time vs PyTorch CPU", hline=1.0)


def plot_allreduce(json_path):
    """allreduce.py: bus bandwidth vs message size, dtorch's transports
    against raw MPI."""
    import json
    with open(json_path) as f:
        res = json.load(f)
    rows = res.get("results", [])
    if not rows:
        return None
    kib = [r["bytes"] / 1024 for r in rows]
    names = {"raw": "raw MPI (mpi4py Allreduce)",
             "mpi": "dtorch collectives, mpi",
             "tcp": "dtorch collectives, tcp"}
    series = {names[k]: (kib, [r[f"{k}_busbw_GBps"] for r in rows])
              for k in ("raw", "mpi", "tcp") if f"{k}_busbw_GBps" in rows[0]}
    meta = res.get("meta", {})
    return plot(png_path(json_path), series, "message size (KiB)",
                "bus bandwidth (GB/s)",
                f"all-reduce float32, {meta.get('ranks', '?')} ranks",
                logx=True, logy=True,
                note=f"{meta.get('host', '')} {meta.get('cpus', '')} CPUs "
                     f"{meta.get('time', '')}")


def plot_quant(json_path):
    """quant.py: quantized / float32 Linear time per shape and batch."""
    import json
    with open(json_path) as f:
        res = json.load(f)
    rows = res.get("rows", [])
    if not rows:
        return None
    labels = [f"{r['in']}x{r['out']} b{r['batch']}" for r in rows]
    if res.get("numba"):
        groups = {"dtorch qint8, numba kernel": [
                      r["dtorch_kernel_ratio"] for r in rows],
                  "dtorch qint8, BLAS (no numba)": [
                      r["dtorch_blas_ratio"] for r in rows]}
    else:
        groups = {"dtorch qint8 (no numba: BLAS)": [
            r["dtorch_ratio"] for r in rows]}
    if "torch_ratio" in rows[0]:
        groups["torch qint8 (fbgemm)"] = [r["torch_ratio"] for r in rows]
    return bars(png_path(json_path), labels, groups,
                "qint8 / float32 time (lower is better)",
                f"Linear forward, dynamic int8 vs float32 "
                f"({res.get('threads', '?')} thread)", hline=1.0)


_BY_NAME = {"step_time": plot_step_time, "allreduce": plot_allreduce,
            "quant": plot_quant}


if __name__ == "__main__":
    # re-draw the PNGs of existing results: python benchmarks/_plot.py F.json
    import sys
    for p in sys.argv[1:]:
        kind = os.path.splitext(os.path.basename(p))[0]
        fn = _BY_NAME.get(kind)
        if fn is None:
            print(f"{p}: no plot for {kind!r} (known: {', '.join(_BY_NAME)})")
            continue
        fn(p)
