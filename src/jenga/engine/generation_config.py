"""A model directory's ``generation_config.json``: extra EOS ids and default sampling values.

Read the way transformers' ``generate`` reads it: ``eos_token_id`` (an int or a list) names
every token that ends a generation; ``do_sample`` false (or absent) means greedy decoding
whatever ``temperature`` says; with ``do_sample`` true, ``temperature`` / ``top_p`` /
``top_k`` apply (transformers' own defaults, 1.0 / 1.0 / 50, where the file leaves one out);
``max_new_tokens`` becomes the default ``max_tokens``.  Only requests that pass no
``SamplingParams`` get these defaults; the EOS ids apply to every request (unless
``ignore_eos``).  A directory without the file (and every tiny model) has no defaults.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from jenga.errors import InvalidArgumentError
from jenga.sched.sampling_params import SamplingParams

FILE = "generation_config.json"
HF_SAMPLING_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 50}


@dataclass(frozen=True)
class GenerationDefaults:
    """What a ``generation_config.json`` says: EOS ids and ``SamplingParams`` field values."""

    eos_token_ids: tuple[int, ...] = ()
    sampling: dict = field(default_factory=dict)

    def params(self) -> SamplingParams:
        """The ``SamplingParams`` of a request that asked for nothing in particular."""
        return SamplingParams(**self.sampling)


def _ids(value, where: str) -> tuple[int, ...]:
    values = [value] if isinstance(value, int) else list(value or ())
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
        raise InvalidArgumentError(f"{where}: eos_token_id must be a token id or a list of them, got {value!r}")
    return tuple(values)


def load_generation_defaults(path: str | Path) -> GenerationDefaults:
    """The defaults of model directory ``path`` (empty when it has no ``generation_config.json``)."""
    file = Path(path) / FILE
    if not file.is_file():
        return GenerationDefaults()
    try:
        cfg = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise InvalidArgumentError(f"{file}: not a readable JSON file ({e})") from e
    if not isinstance(cfg, dict):
        raise InvalidArgumentError(f"{file}: expected a JSON object")
    sampling: dict = {}
    if cfg.get("do_sample"):
        for key, default in HF_SAMPLING_DEFAULTS.items():
            value = cfg.get(key)
            sampling[key] = default if value is None else type(default)(value)
        if sampling["top_k"] == 0:  # transformers: 0 disables top-k
            sampling["top_k"] = -1
    else:
        sampling["temperature"] = 0.0
    if cfg.get("max_new_tokens") is not None:
        sampling["max_tokens"] = int(cfg["max_new_tokens"])
    defaults = GenerationDefaults(_ids(cfg.get("eos_token_id"), str(file)), sampling)
    defaults.params()  # validate now, not at the first request
    return defaults
