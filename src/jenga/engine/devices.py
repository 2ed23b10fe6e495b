"""The engine's device argument, checked before anything is built on it."""

from __future__ import annotations

import torch

from jenga.errors import InvalidArgumentError


def checked_device(device) -> torch.device:
    """``torch.device(device)``; a typed error for a name torch does not know or a device this
    machine lacks (``cuda`` without CUDA), instead of an assertion deep inside torch."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise InvalidArgumentError(f"device {device!r} is not a torch device: {e}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidArgumentError(f"device {device!r}: this machine has no CUDA device (torch "
                                       f"{torch.__version__}, built {'with' if torch.version.cuda else 'without'} "
                                       "CUDA); use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InvalidArgumentError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type not in ("cpu", "meta") and not getattr(torch, dev.type).is_available():
        raise InvalidArgumentError(f"device {device!r} is not available on this machine; use --device cpu")
    return dev
