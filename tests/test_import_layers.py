"""Imports point down: every ``jenga`` import (lazy ones inside functions included) goes to a
module of the same layer or a lower one (``LAYERS``, the order ``docs/architecture.md`` draws)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "jenga"

#: (module or package, layer), lowest first; a module belongs to its longest matching entry
LAYERS = [
    # the base: errors, units, progress lines, and core's records (specs, page sizes, flat arrays,
    # input checks, page tables, request records and the ``ImageRef`` they carry, layout)
    ("jenga.errors", 0), ("jenga.units", 0), ("jenga.progress", 0),
    ("jenga.core", 0),
    ("jenga.structure", 1),  # HF config -> ModelSpec
    ("jenga.core.alloc", 2),
    ("jenga.core.prefix", 3),
    ("jenga.core.policy", 4),
    ("jenga.core.evict", 5),
    # the ledger (references, holds, the ``PageOps`` the policies call) lies under the tier, which
    # holds and drops pages through it
    ("jenga.core.manager.ledger", 6), ("jenga.core.manager.holds", 6),
    ("jenga.core.tier", 7),
    ("jenga.core.manager", 8),
    ("jenga.capacity", 9), ("jenga.baselines", 9), ("jenga.sched", 9),
    ("jenga.engine", 10), ("jenga.sim", 10),
    ("jenga.server", 11), ("jenga.bench", 11), ("jenga.multi_bench", 11), ("jenga.helptext", 11), ("jenga.cli", 12),
    ("jenga.multi_plan", 12),
    ("jenga.vllm", 12),  # a leaf
    ("jenga", 13),  # the package's front door
]

#: upward imports kept on purpose, each with its reason
ALLOWED = {
    # ``ModelSpec.from_hf_config``: the spec's convenience constructor, a lazy import of the
    # layer that builds specs
    ("jenga.core.specs", "jenga.structure"),
}


def layer_of(module: str) -> int:
    best = max((p for p, _ in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return dict(LAYERS)[best]


def imports() -> list[tuple[str, str, int]]:
    """(importing module, imported module, line) for every ``jenga`` import under ``src/jenga``."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            out.extend((module, name, node.lineno) for name in names if name.split(".")[0] == "jenga")
    return out


def upward(edges) -> list[str]:
    return [f"{a}:{line} imports {b} (layer {layer_of(a)} -> {layer_of(b)})" for a, b, line in edges
            if layer_of(b) > layer_of(a) and (a, b) not in ALLOWED]


def test_imports_point_down():
    edges = imports()
    assert len(edges) > 300  # the walk saw the package
    assert upward(edges) == []


@pytest.mark.parametrize("edge", [("jenga.core.alloc.allocator", "jenga.core.evict.evictor"),
                                  ("jenga.core.tier.host_tier", "jenga.core.manager.manager"),
                                  ("jenga.engine.llm", "jenga.server.app")])
def test_an_upward_import_is_seen(edge):
    assert upward([(*edge, 1)])
