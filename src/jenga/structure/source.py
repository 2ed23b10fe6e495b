"""Where a config comes from: a catalog name, a local directory, a json file or a dict (never the hub).

:func:`read_source` only reads json (no transformers import); :func:`parse_config` hands the raw dict (or the
directory) to transformers' own config classes (``AutoConfig.for_model`` / ``AutoConfig.from_pretrained`` with
``local_files_only=True``), so defaults and derived fields (``layer_types``, Nemotron-H's
``hybrid_override_pattern`` ...) are exactly what transformers reads.
"""

from __future__ import annotations

import json
import logging
import os
import re
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from jenga.core.validation import check_config_sizes
from jenga.errors import ConfigError, JengaError, MissingConfigError

__all__ = ["CATALOG_NAMES", "Source", "UnsupportedModelError", "catalog_dir", "list_catalog", "parse_config",
           "read_source"]


def catalog_dir():
    return resources.files("jenga").joinpath("catalog")


def list_catalog() -> list[str]:
    """Sorted names of the bundled model configs (``jenga/catalog/<name>.json``)."""
    return sorted(p.name[:-len(".json")] for p in catalog_dir().iterdir()
                  if p.name.endswith(".json") and p.name != "structure.json")


#: Names accepted by :func:`model_spec_from_hf_config` besides paths and dicts.
CATALOG_NAMES: tuple[str, ...] = tuple(list_catalog())


class UnsupportedModelError(JengaError, ValueError):
    """The source is not a model jenga can map to cache groups; the message names the missing fact."""


@dataclass(frozen=True)
class Source:
    raw: dict
    name: str  # default model name
    where: str  # for messages
    directory: Path | None = None  # parse with from_pretrained (sub-config files, trust of local files)
    catalog: str | None = None
    config: Any = None  # a transformers config object passed in as the source


def read_source(source: Any) -> Source:
    if hasattr(source, "to_dict") and hasattr(source, "get_text_config"):  # a transformers config object
        raw = source.to_dict()
        return Source(raw, str(raw.get("_name_or_path") or source.model_type).rstrip("/").split("/")[-1],
                      f"{type(source).__name__}", config=source)
    if isinstance(source, Mapping):
        raw = dict(source)
        name = str(raw.get("_name_or_path") or raw.get("model_type") or "model").rstrip("/").split("/")[-1]
        return Source(raw, name, "config dict")
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"expected a catalog name, path or dict, got {type(source).__name__}")
    path = Path(source)
    if path.is_dir():
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise MissingConfigError(f"{path} has no config.json")
        return Source(read_json_object(cfg_file), path.resolve().name, str(cfg_file), directory=path)
    if path.is_file():
        name = path.resolve().parent.name if path.stem == "config" else path.stem
        return Source(read_json_object(path), name, str(path))
    if str(source) in CATALOG_NAMES:
        raw = json.loads(catalog_dir().joinpath(f"{source}.json").read_text())
        return Source(raw, str(source), f"catalog {source!r}", catalog=str(source))
    raise UnsupportedModelError(f"{str(source)!r} is neither a catalog name nor an existing path{name_hint(str(source))}. "
                                f"Catalog names: {', '.join(CATALOG_NAMES)}.")


def read_json_object(file: Path) -> dict:
    """A config file's JSON object; ``ConfigError`` naming the file for invalid JSON or another JSON value."""
    try:
        raw = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{file} is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{file} holds a JSON {type(raw).__name__}, not an object of config fields")
    return raw


#: ``owner/name``: what a Hugging Face hub id looks like
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def name_hint(name: str) -> str:
    """A clause for an unknown model name: a hub id (jenga never downloads) or a built-in tiny model."""
    if _HUB_ID.match(name):
        return (f" ({name!r} looks like a Hugging Face hub id; jenga never downloads: download it, e.g. "
                f"`huggingface-cli download {name} --local-dir DIR`, and pass the directory)")
    if name.startswith("tiny-"):
        return (f" ({name!r} looks like one of the engine's built-in tiny models, which jenga.LLM, `jenga serve` "
                "and `jenga bench` run; plan and simulate take a catalog name or a model directory)")
    return ""


#: sizes a decoder config needs; without them transformers' defaults for the model type stand in
_CORE_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads")
#: per-layer patterns some families derive the layer count from (Nemotron-H, Falcon-H1, ...)
_LAYER_PATTERNS = ("layer_types", "hybrid_override_pattern", "layers_block_type", "block_types")


def warn_missing_sizes(src: Source) -> None:
    """Warn when a config (or its text config) lacks the core sizes: it is planned from
    transformers' defaults for its ``model_type``, which are rarely the model meant."""
    if src.catalog is not None:
        return
    raw = src.raw.get("text_config") if isinstance(src.raw.get("text_config"), Mapping) else src.raw
    missing = [f for f in _CORE_SIZES if f not in raw and f not in src.raw]
    if any(k in raw for k in _LAYER_PATTERNS):  # the layer count follows from a per-layer pattern
        missing = [f for f in missing if f != "num_hidden_layers"]
    if missing == ["num_attention_heads"]:  # an attention-free model (Mamba, RWKV, ...) has none
        missing = []
    if missing:
        warnings.warn(f"{src.where}: no {', '.join(missing)}; transformers' defaults for "
                      f"{src.raw.get('model_type')!r} are used, which may not be the model you mean",
                      MissingSizesWarning, stacklevel=3)


class MissingSizesWarning(UserWarning):
    """A config without the core sizes, planned from transformers' defaults."""


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' advisory warnings (e.g. Mistral + ``layer_types``) while parsing."""
    log = logging.getLogger("transformers")
    old = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(old)


def parse_config(src: Source) -> Any:
    """The transformers config object of ``src``; typed errors for what transformers cannot read."""
    if src.config is not None:
        return src.config
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    check_config_sizes(src.raw, src.where, UnsupportedModelError)  # before transformers replaces a 0 / divides
    mt = src.raw.get("model_type")
    if not mt:
        raise UnsupportedModelError(f"{src.where}: config has no 'model_type'")
    warn_missing_sizes(src)
    if mt not in CONFIG_MAPPING_NAMES:
        raise UnsupportedModelError(f"{src.where}: model_type {mt!r} is not one transformers knows")
    errors = (TypeError, ValueError, KeyError, AttributeError, StrictDataclassError)
    try:
        with quiet_transformers():
            if src.directory is not None:
                return AutoConfig.from_pretrained(str(src.directory), local_files_only=True)
            return AutoConfig.for_model(mt, **{k: v for k, v in src.raw.items() if k != "model_type"})
    except errors as e:
        raise UnsupportedModelError(f"{src.where}: transformers rejected the {mt!r} config: {e}") from e
