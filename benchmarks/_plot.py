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
