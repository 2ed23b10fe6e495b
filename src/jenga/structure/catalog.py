"""The catalog's structure, derived once through transformers and stored (``catalog/structure.json``).

A catalog name is planned from this file alone, so ``jenga plan --model <catalog name>`` imports neither
transformers nor torch (their import is most of the old 5-8 s).  The file is exactly what
:func:`~jenga.structure.derive.facts_from_config` gives for each ``catalog/<name>.json``; a test rederives
every entry through transformers and compares, so it cannot go stale silently.  Regenerate it after editing
a catalog config::

    python -m jenga.structure.catalog
"""

from __future__ import annotations

import json
from functools import cache

from jenga.structure.facts import ModelFacts
from jenga.structure.source import CATALOG_NAMES, catalog_dir, parse_config, read_source

__all__ = ["catalog_facts", "derive_catalog_facts"]

_FILE = "structure.json"


@cache
def _stored() -> dict[str, dict]:
    return json.loads(catalog_dir().joinpath(_FILE).read_text())


def catalog_facts(name: str) -> ModelFacts:
    """The stored facts of catalog model ``name``."""
    return ModelFacts.from_json(_stored()[name])


def derive_catalog_facts(name: str) -> ModelFacts:
    """The facts of catalog model ``name``, derived through transformers now."""
    from jenga.structure.derive import facts_from_config

    src = read_source(name)
    return facts_from_config(parse_config(src), src.where)


def _dumps(data: dict[str, dict]) -> str:
    """One model per block, one component per line, the layer table on one line."""
    blocks = []
    for name, d in sorted(data.items()):
        fields = [f'  "{k}": {json.dumps(d[k])}' for k in ("num_layers", "max_model_len", "vision_hidden_size")]
        comps = ",\n".join(f"   {json.dumps(c, sort_keys=True)}" for c in d["components"])
        fields += [f'  "components": [\n{comps}\n  ]', f'  "layers": {json.dumps(d["layers"])}']
        blocks.append(f' "{name}": {{\n' + ",\n".join(fields) + "\n }")
    return "{\n" + ",\n".join(blocks) + "\n}\n"


def main() -> None:
    data = {name: derive_catalog_facts(name).to_json() for name in CATALOG_NAMES}
    path = catalog_dir().joinpath(_FILE)
    path.write_text(_dumps(data))  # type: ignore[union-attr]
    print(f"wrote {path} ({len(data)} models)")


if __name__ == "__main__":
    main()
