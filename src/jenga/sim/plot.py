"""Memory timeline PNG like the paper's Ministral figure: one panel per manager, stacked
areas of needed KV by layer kind, waste, prefix cache and free memory over simulated time."""

from __future__ import annotations

from pathlib import Path

from jenga.sim.simulator import SimResult

_COLORS = {"full": "#1f77b4", "sliding": "#2ca02c", "chunked": "#17becf", "mamba": "#9467bd",
           "cross": "#8c564b", "waste": "#d62728", "cached": "#ff7f0e", "free": "#d9d9d9"}


def timeline_series(r: SimResult) -> tuple[list[float], dict[str, list[float]]]:
    """``(times, {label: GiB per record})``; the labels stack to the total KV memory."""
    recs = r.timeline
    kinds = sorted({k for rec in recs for k in rec.needed_by_kind})
    series: dict[str, list[float]] = {f"used: {k}": [] for k in kinds}
    series.update({"wasted": [], "prefix cache": [], "free": []})
    gib = float(1 << 30)
    for rec in recs:
        for k in kinds:
            series[f"used: {k}"].append(rec.needed_by_kind.get(k, 0.0) / gib)
        series["wasted"].append(rec.waste_bytes / gib)
        series["prefix cache"].append(rec.cached_bytes / gib)
        rest = rec.total_bytes - rec.needed_bytes - rec.waste_bytes - rec.cached_bytes
        series["free"].append(max(0, rest) / gib)
    return [rec.time_s for rec in recs], series


def plot_timeline(results: dict[str, SimResult], path: str | Path, title: str = "") -> Path:
    """Write the PNG (matplotlib, Agg backend) and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(results)
    fig, axes = plt.subplots(n, 1, figsize=(10, 2.8 * n + 0.6), squeeze=False, sharex=True)
    for ax, (name, r) in zip(axes[:, 0], results.items(), strict=True):
        times, series = timeline_series(r)
        colors = [_COLORS.get(lbl.split(": ")[-1], _COLORS.get({"wasted": "waste", "prefix cache": "cached"}
                                                                  .get(lbl, lbl), None)) for lbl in series]
        if times:
            ax.stackplot(times, *series.values(), labels=list(series), colors=colors, step="post")
        s = r.summary()
        ax.set_title(f"{name}: waste {s['waste_frac_mean']:.1%}, decode batch {s['decode_batch_mean']:.2f}, "
                     f"{s['throughput_req_s']:.3f} req/s", fontsize=10)
        ax.set_ylabel("KV GiB")
        ax.legend(loc="upper right", fontsize=7, ncol=3)
    axes[-1, 0].set_xlabel("simulated time (s)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
