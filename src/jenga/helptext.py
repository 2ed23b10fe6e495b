"""``--help`` for every ``jenga`` subcommand: defaults shown, accepted names listed.

Help strings may name a list in braces -- ``{catalog}``, ``{tiny}``, ``{workloads}``, ``{gpus}``,
``{managers}``, ``{dtypes}``, ``{sections}`` -- which :class:`HelpFormatter` fills in only when
help is printed, so a normal run imports none of the modules that own those lists.
"""

from __future__ import annotations

import argparse


def _catalog() -> str:
    from jenga.structure import CATALOG_NAMES
    return ", ".join(CATALOG_NAMES)


def _tiny() -> str:
    from jenga.engine.tiny import TINY_MODELS
    return ", ".join(TINY_MODELS)


def _workloads() -> str:
    from jenga.sim.workloads import WORKLOAD_NAMES
    return ", ".join(WORKLOAD_NAMES)


def _gpus() -> str:
    from jenga.sim.gpu import GPUS
    return ", ".join(GPUS)


def _managers() -> str:
    from jenga.baselines import MANAGER_NAMES
    return ", ".join(MANAGER_NAMES)


def _dtypes() -> str:
    from jenga.core.specs import DTYPE_BYTES
    return ", ".join(DTYPE_BYTES)


def _sections() -> str:
    from jenga.sim.reproduce import SECTIONS
    return "; ".join(SECTIONS)


LISTS = {"catalog": _catalog, "tiny": _tiny, "workloads": _workloads, "gpus": _gpus, "managers": _managers,
         "dtypes": _dtypes, "sections": _sections}


def expand(text: str) -> str:
    """``text`` with each ``{name}`` of :data:`LISTS` replaced by the names it accepts."""
    for key, names in LISTS.items():
        if "{" + key + "}" in text:
            text = text.replace("{" + key + "}", names())
    return text


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults after each option's help (unless it has none, or its help already says it), lists filled."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = expand(action.help or "")
        d = action.default
        if d is None or d is False or d is argparse.SUPPRESS or "default" in text or not action.option_strings:
            return text
        return text + " (default: %(default)s)"


def use_for(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` and each of its subcommands :class:`HelpFormatter`."""
    parser.formatter_class = HelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.formatter_class = HelpFormatter
                for opt in sub._actions:  # argparse prints nothing for an option without help
                    if opt.help is None and opt.option_strings and opt.default not in (None, False):
                        opt.help = "(default: %(default)s)"
