"""What the installed vLLM's scheduler and engine core use of their KV-cache manager, read
from vLLM's own source files (``ast``), not from a list written by hand.

Every use of ``<x>.kv_cache_manager.<chain>`` in ``Scheduler``, ``AsyncScheduler`` and the
engine core is one :class:`Use`: the attribute chain after ``kv_cache_manager`` (e.g.
``get_computed_blocks`` or ``coordinator.single_type_managers``) and, when it is called, the
number of positional arguments and the keyword names.  A local alias of the manager
(``m = self.kv_cache_manager`` / ``getattr(x, "kv_cache_manager", None)``) or of one of its
methods (``f = self.kv_cache_manager.get_num_cached_tokens``) counts as the manager.

``python tests/vllm_calls.py`` prints the uses of the vLLM it runs with.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

#: vLLM modules whose code holds the scheduler's manager
MODULES = ("vllm.v1.core.sched.scheduler", "vllm.v1.core.sched.async_scheduler", "vllm.v1.engine.core")
MANAGER = "kv_cache_manager"


@dataclass(frozen=True)
class Use:
    chain: str  # attributes after kv_cache_manager, dotted
    called: bool
    num_args: int = 0
    keywords: tuple[str, ...] = ()
    starred: bool = False  # *args / **kwargs at the call: arity unknown
    where: str = ""  # module:line


def _is_manager(node: ast.AST, aliases: set[str]) -> bool:
    if isinstance(node, ast.Attribute) and node.attr == MANAGER:
        return True
    if isinstance(node, ast.Name) and node.id in aliases:
        return True
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value == MANAGER)


def _chain(node: ast.AST, aliases: set[str]) -> str | None:
    """The dotted chain after the manager if ``node`` is ``<manager>.a.b``, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        if _is_manager(node.value, aliases):
            return ".".join([node.attr, *reversed(parts)])
        if node.attr == MANAGER:
            return None
        parts.append(node.attr)
        node = node.value
    return None


def _call_use(call: ast.Call, chain: str, where: str) -> Use:
    starred = any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords)
    return Use(chain, True, len(call.args), tuple(k.arg for k in call.keywords if k.arg), starred, where)


def uses_in_source(source: str, module: str) -> list[Use]:
    tree = ast.parse(source)
    manager_aliases: set[str] = set()
    method_aliases: dict[str, str] = {}
    for node in ast.walk(tree):  # local names bound to the manager or to one of its methods
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "cast":
                value = value.args[-1]
            if _is_manager(value, set()):
                manager_aliases.add(name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            chain = _chain(node.value, manager_aliases)
            if chain is not None:
                method_aliases[node.targets[0].id] = chain
    out, called = [], set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        where = f"{module}:{node.lineno}"
        chain = _chain(node.func, manager_aliases)
        if chain is None and isinstance(node.func, ast.Name) and node.func.id in method_aliases:
            chain = method_aliases[node.func.id]
        if chain is not None:
            out.append(_call_use(node, chain, where))
            called.add(id(node.func))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in called:
            chain = _chain(node, manager_aliases)
            # reads only at the top of a chain (``m.a.b`` is one read of ``a.b``, not also of ``a``)
            if chain is not None and not _extends(node, tree):
                out.append(Use(chain, False, where=f"{module}:{node.lineno}"))
    return out


def _extends(node: ast.Attribute, tree: ast.AST) -> bool:
    parents = _parents(tree)
    parent = parents.get(id(node))
    return isinstance(parent, ast.Attribute) and parent.value is node


_PARENTS: dict[int, dict[int, ast.AST]] = {}


def _parents(tree: ast.AST) -> dict[int, ast.AST]:
    if id(tree) not in _PARENTS:
        _PARENTS[id(tree)] = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    return _PARENTS[id(tree)]


def installed_uses() -> list[Use]:
    """The uses in the installed vLLM's scheduler, async scheduler and engine core."""
    out = []
    for module in MODULES:
        path = Path(importlib.util.find_spec(module).origin)
        out.extend(uses_in_source(path.read_text(), module))
    return out


def summary(uses: list[Use]) -> dict[str, str]:
    """One line per chain: called or read, the call shapes seen."""
    lines: dict[str, set[str]] = {}
    for u in uses:
        shape = (f"({u.num_args} positional{', ' + ', '.join(u.keywords) if u.keywords else ''}"
                 f"{', *' if u.starred else ''})") if u.called else "read"
        lines.setdefault(u.chain, set()).add(shape)
    return {k: " ".join(sorted(v)) for k, v in sorted(lines.items())}


#: where the installed vLLM calls its KV connector: the scheduler, the engine core, the workers and
#: model runners (every version's layout: 0.34 moved the runners' connector code under worker/cpu, worker/gpu)
CONNECTOR_PACKAGES = ("vllm.v1.core.sched", "vllm.v1.worker")
CONNECTOR_MODULES = ("vllm.v1.engine.core", "vllm.distributed.kv_transfer.kv_transfer_state")
#: expressions that hold the KV connector in those files (not the encoder-cache or aux-output connectors)
CONNECTOR_NAMES = ("connector", "kv_connector", "kv_transfer_group", "_KV_CONNECTOR_AGENT")


def _is_connector(node: ast.AST) -> bool:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id == "get_kv_transfer_group"
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
    return name in CONNECTOR_NAMES


def connector_calls_in_source(source: str, module: str) -> list[Use]:
    """Calls ``<connector>.method(...)`` (one level: the method's name is the chain)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is_connector(node.func.value):
            out.append(_call_use(node, node.func.attr, f"{module}:{node.lineno}"))
    return out


def installed_connector_calls() -> list[Use]:
    """What the installed vLLM's scheduler, engine core, workers and model runners call on a KV connector."""
    paths = []
    for package in CONNECTOR_PACKAGES:
        root = Path(importlib.util.find_spec(package).origin).parent
        paths += [(f"{package}.{'.'.join(p.relative_to(root).with_suffix('').parts)}", p) for p in root.rglob("*.py")]
    paths += [(m, Path(importlib.util.find_spec(m).origin)) for m in CONNECTOR_MODULES]
    out = []
    for module, path in sorted(paths):
        out.extend(connector_calls_in_source(path.read_text(), module))
    return out


if __name__ == "__main__":
    import vllm

    print(f"vLLM {vllm.__version__}: what the scheduler / async scheduler / engine core use of kv_cache_manager")
    for chain, shapes in summary(installed_uses()).items():
        print(f"  {chain}: {shapes}")
