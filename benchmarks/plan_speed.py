"""``jenga plan`` wall time: a catalog name vs the same config from a local directory, in one run.

Usage: ``python benchmarks/plan_speed.py [--models jamba-1.5-mini,llama-3.1-8b] [--repeat 3]``.

A catalog name is planned from ``catalog/structure.json`` (no transformers / torch import); a directory
holding the same ``config.json`` goes through transformers (config classes, ``DynamicCache``, and for
state layers the meta-device build).  Each row is the median of ``--repeat`` fresh ``jenga plan --json``
processes, so imports are counted, as a user sees them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _time(args: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "jenga.cli", "plan", *args, "--json"], check=True,
                       stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    from jenga.structure.source import read_source

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="jamba-1.5-mini,llama-3.1-8b,gemma-3-27b")
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args(argv)
    print(f"{'model':<22} {'catalog name':>13} {'local dir':>10} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models.split(","):
            d = Path(tmp) / name
            d.mkdir()
            (d / "config.json").write_text(json.dumps(read_source(name).raw))
            fast, slow = _time(["--model", name], a.repeat), _time(["--model", str(d)], a.repeat)
            print(f"{name:<22} {fast:>12.2f}s {slow:>9.2f}s {slow / fast:>5.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
