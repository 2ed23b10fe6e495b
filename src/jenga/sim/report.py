"""Rich tables and JSON payloads for ``jenga simulate`` and ``jenga reproduce``."""

from __future__ import annotations

from jenga.sim.simulator import SimResult

#: Columns of the simulate table: (summary key, header, format).
COLUMNS = (
    ("throughput_req_s", "req/s", "{:.3f}"),
    ("throughput_tok_s", "out tok/s", "{:.1f}"),
    ("latency_mean_s", "latency s", "{:.2f}"),
    ("latency_p99_s", "p99 s", "{:.2f}"),
    ("ttft_mean_s", "TTFT s", "{:.2f}"),
    ("ttft_p99_s", "TTFT p99", "{:.2f}"),
    ("decode_batch_mean", "decode batch", "{:.2f}"),
    ("max_concurrent", "max conc.", "{}"),
    ("waste_frac_mean", "waste", "{:.2%}"),
    ("prefix_hit_rate", "prefix hit", "{:.2%}"),
    ("preemptions", "preempt", "{}"),
    ("steps", "steps", "{}"),
    ("rejected", "rejected", "{}"),
    ("wall_s", "wall s", "{:.1f}"),
)


def simulate_payload(results: dict[str, SimResult], meta: dict, unavailable: dict[str, str]) -> dict:
    """``{"managers": {name: summary}, "rejected": {name: {rid: reason}}, "unavailable": ..., **meta}``."""
    return {
        **meta,
        "managers": {name: r.summary() for name, r in results.items()},
        "rejected": {name: {str(k): v for k, v in r.rejected.items()} for name, r in results.items() if r.rejected},
        "unavailable": unavailable,
    }


def _console():
    import sys

    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=220)


def print_simulate(results: dict[str, SimResult], meta: dict, console=None) -> None:
    from rich.table import Table

    con = console or _console()
    t = Table(title=f"{meta['model']} on {meta['workload']} ({meta['requests']} requests), "
                    f"{meta['gpu']} x{meta['tp']}, KV {meta['memory_bytes'] / 2**30:.1f} GiB")
    t.add_column("manager")
    for _, head, _ in COLUMNS:
        t.add_column(head, justify="right")
    base = None
    for name, r in results.items():
        s = r.summary()
        base = base or s
        t.add_row(name, *(fmt.format(s[key]) for key, _, fmt in COLUMNS))
    con.print(t)
    if "jenga" in results and len(results) > 1:
        j = results["jenga"].summary()
        for name, r in results.items():
            s = r.summary()
            if name != "jenga" and s["throughput_req_s"]:
                con.print(f"jenga / {name}: throughput {j['throughput_req_s'] / s['throughput_req_s']:.2f}x, "
                          f"decode batch {j['decode_batch_mean'] / max(s['decode_batch_mean'], 1e-9):.2f}x")
    print_host_tier(results, con)
    for name, r in results.items():
        for rid, why in list(r.rejected.items())[:3]:
            con.print(f"[yellow]{name}: rejected {rid}: {why}[/yellow]")


#: Columns of the host-tier table (``--host-kv-memory``): (summary key, header, format).
HOST_COLUMNS = (
    ("host_total_bytes", "host GiB", "{:.2f}"),
    ("host_peak_used_bytes", "host peak GiB", "{:.2f}"),
    ("host_hit_tokens", "host hit tok", "{}"),
    ("bytes_demoted", "demoted GiB", "{:.2f}"),
    ("bytes_promoted", "promoted GiB", "{:.2f}"),
    ("host_copy_s", "copy s", "{:.3f}"),
    ("host_recompute_s", "recompute s", "{:.3f}"),
)


def print_host_tier(results: dict[str, SimResult], con) -> None:
    """The host tier's copies per manager next to what recomputing its hits would cost (when it ran)."""
    from rich.table import Table

    rows = {name: r.summary() for name, r in results.items() if r.host is not None}
    if not rows:
        return
    t = Table(title="host KV tier: copies (serial, on the host link) vs recomputing the tokens served from host")
    t.add_column("manager")
    for _, head, _ in HOST_COLUMNS:
        t.add_column(head, justify="right")
    for name, s in rows.items():
        t.add_row(name, *(fmt.format(s[k] / 2**30 if "GiB" in head else s[k]) for k, head, fmt in HOST_COLUMNS))
    con.print(t)


def reproduce_title(quick: bool) -> str:
    if quick:
        return "jenga reproduce --quick: a smoke run on tiny request counts, NOT the paper's figures"
    return "Jenga (SOSP 2025) headline numbers: paper vs this reproduction"


def print_reproduce(rows, console=None, *, quick: bool = False) -> None:
    from rich.table import Table

    con = console or _console()
    t = Table(title=reproduce_title(quick), show_lines=False)
    for col in ("section", "what", "paper", "ours", "why they differ"):
        t.add_column(col, justify="right" if col in ("paper", "ours") else "left", overflow="fold")
    for r in rows:
        t.add_row(r.section, r.what, r.paper, r.ours, r.note)
    con.print(t)
