"""Makes ``--dist loadgroup`` honour ``xdist_group`` marks again under pytest 9.

pytest-xdist (3.8) groups tests by appending ``@<group>`` to each marked item's node id, which
it does by assigning ``item._nodeid``; pytest 9 builds ``Item.nodeid`` from ``item._id`` (a
``NodeId``) and never reads ``_nodeid``.  The suffix is lost, every group is ignored, and each
worker starts its own copy of a module's vLLM engines and servers (measured: every family's
engine set in ``test_vllm_models.py`` built twice per run).  This hook runs after xdist's and
appends the suffix where it is missing (a ``NodeId`` whose string is xdist's); where xdist's
assignment works (pytest 8) it finds the suffix present and changes nothing.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items) -> None:
    if not config.getoption("loadgroup", False):  # set on the workers of --dist loadgroup
        return
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if names and "@" not in item.nodeid:  # "path::name[params]@group", as xdist means it
            from _pytest.nodeid import NodeId  # pytest 9 only (pytest 8 never gets here)

            old = item._id
            last = old.names[-1] + ("" if old.params is None else f"[{old.params}]") + "@" + "_".join(names)
            item._id = NodeId(path=old.path, names=(*old.names[:-1], last))
