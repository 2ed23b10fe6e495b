"""Byte sizes with units: ``parse_bytes("64GiB")``, ``fmt_bytes(n)``."""

from __future__ import annotations

import re

from jenga.errors import InvalidArgumentError

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "t": 1000**4, "tb": 1000**4, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(text: str | int) -> int:
    """``"64GiB"`` -> 68719476736; ints pass through.  Raises ``InvalidArgumentError``."""
    if isinstance(text, bool):
        raise InvalidArgumentError(f"byte size must be an int or a string such as 64GiB, got {text!r} (bool)")
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise InvalidArgumentError(f"cannot read {text!r} as a byte size; use e.g. 64GiB, 512MiB, 80GB, 1000")
        value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise InvalidArgumentError(f"byte size must be positive, got {text!r}")
    return value


def parse_bytes_or_multiple(text: str | int, base: int) -> int:
    """``parse_bytes(text)``, or ``N x base`` for ``"Nx"`` (e.g. a host tier ``"4x"`` the device pool)."""
    if isinstance(text, str) and text.strip().lower().endswith("x"):
        try:
            factor = float(text.strip()[:-1])
        except ValueError:
            factor = -1.0
        if factor <= 0:
            raise InvalidArgumentError(f"cannot read {text!r} as a multiple; use e.g. 4x")
        return int(factor * base)
    return parse_bytes(text)


def fmt_bytes(n: float) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def fmt_tokens(n: float) -> str:
    if n >= 1e6:
        return f"{n / 1e6:.2f}M"
    if n >= 1e4:
        return f"{n / 1e3:.1f}k"
    return f"{int(n)}"
