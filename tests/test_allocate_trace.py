"""``benchmarks/allocate_trace.py``: one ``allocate`` on Llama-3.1-8B with prefix caching enters at
most ``MOST`` modules, with a 512-token hit and without one (the count only goes down)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from allocate_trace import allocate_modules, traced  # noqa: E402

#: modules entered by one allocate (jenga.* only): ratchet down as modules merge
MOST = {"hit": 8, "miss": 8}


def test_allocate_enters_few_modules():
    modules = allocate_modules()
    for case, most in MOST.items():
        names = modules[case]
        assert "jenga.core.manager.manager" in names and "jenga.core.alloc.allocator" in names  # the trace saw it
        assert len(names) <= most, f"{case}: {len(names)} modules > {most}: {names}"


def test_the_tracer_sees_every_module_called():
    import jenga.core.flat_arrays as fa
    import jenga.units as units
    assert traced(lambda: (units.parse_bytes("1KiB"), fa.zeros(3))) == ["jenga.units", "jenga.core.flat_arrays"]


def test_a_generated_dataclass_init_counts_for_no_module():
    from jenga.core.tables import TokenTable
    assert traced(lambda: TokenTable(0, 16, [])) == []
