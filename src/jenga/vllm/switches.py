"""The plugin's environment switches (``JENGA_VLLM_*``): one reader for all of them, a typed error
naming the choices for a value that is none of them."""

from __future__ import annotations

import os

from jenga.errors import InvalidArgumentError, JengaError


def switch(env: str, choices: tuple[str, ...], default: str,
           error: type[JengaError] = InvalidArgumentError) -> str:
    """The value of ``env`` (``default`` when unset or empty); ``error`` naming ``choices`` when it is
    none of them."""
    name = os.environ.get(env, default) or default
    if name not in choices:
        raise error(f"{env}={name!r}; choose one of {', '.join(choices)}")
    return name
