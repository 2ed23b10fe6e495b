"""Exceptions for callers' mistakes.  Internal invariants use ``assert`` instead."""


class JengaError(Exception):
    """Base class of every error jenga raises on bad input."""


class UnknownRequestError(JengaError, KeyError):
    """The request id was never added, or was already freed."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "unknown request"


class DuplicateRequestError(JengaError, ValueError):
    """``add_request`` with an id that is still live."""


class InvalidArgumentError(JengaError, ValueError):
    """A count, size or option out of its range."""


class SequenceTooLongError(JengaError, ValueError):
    """The request would grow past the model's maximum length."""


class InsufficientMemoryError(JengaError, ValueError):
    """The memory budget cannot hold even one large page."""


class ConfigError(JengaError, ValueError):
    """A model config with a missing, malformed or out-of-range field (named in the message)."""


class MissingConfigError(ConfigError, FileNotFoundError):
    """A model directory without ``config.json``."""


class CheckpointError(JengaError, ValueError):
    """A checkpoint that lacks a parameter of the model, holds one of another shape, or has no safetensors file."""


class UnsupportedArchitectureError(JengaError, ValueError):
    """The engine has no model class for this config's architecture (the message lists those it has)."""


class UnsupportedFeatureError(UnsupportedArchitectureError, NotImplementedError):
    """The engine has the architecture but not one of the config's options (an activation, a RoPE
    kind, a block type); the message names the option and what is supported."""


class HostCopyError(JengaError, RuntimeError):
    """A copy between the device and the host tier failed (inside vLLM: in a worker); no promoted page
    was written."""
