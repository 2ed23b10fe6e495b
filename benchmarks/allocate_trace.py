"""The modules one ``KVCacheManager.allocate`` enters, traced with ``sys.settrace``.

Llama-3.1-8B with prefix caching on a pool that evicts nothing: a first request of 1,024 tokens is
allocated, computed and freed (its pages stay cached); then one ``allocate`` of a new request is
traced twice: one whose ``lookup`` found a 512-token hit (its prompt starts like the first one's),
one that found none (a prompt of its own).  Prints, per case, the modules whose code the call ran
(``jenga.*`` only, in the order first entered): a frame counts for the file its code is in, so the
``__init__`` a dataclass generates (code of the standard library's, run in no file) counts for none.
``tests/test_allocate_trace.py`` holds the count.

    PYTHONPATH=src python benchmarks/allocate_trace.py
"""

from __future__ import annotations

import sys

from jenga import KVCacheManager, ModelSpec

PROMPT = 1024  # tokens of each prompt
HIT = 512  # tokens the hit case shares with the first request


def traced(call) -> list[str]:
    """The ``jenga`` modules ``call()`` runs code of, in the order first entered."""
    seen: dict[str, None] = {}

    def tracer(frame, event, arg):
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            if name.startswith("jenga.") and frame.f_code.co_filename == frame.f_globals.get("__file__"):
                seen.setdefault(name)
        return None  # calls only: no line events

    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(None)
    return list(seen)


def allocate_modules() -> dict[str, list[str]]:
    """``{"hit": modules, "miss": modules}`` of one first ``allocate`` each (module doc)."""
    model = ModelSpec.from_hf_config("llama-3.1-8b")
    m = KVCacheManager(model, "4GiB", enable_prefix_caching=True)
    first = list(range(1, PROMPT + 1))
    m.add_request("a", first)
    assert m.lookup("a") == 0
    m.allocate("a", PROMPT)
    m.append_tokens("a", [7])
    m.free("a")
    out = {}
    for case, prompt in (("hit", first[:HIT] + list(range(50_000, 50_000 + PROMPT - HIT))),
                         ("miss", list(range(60_000, 60_000 + PROMPT)))):
        m.add_request(case, prompt)
        hit = m.lookup(case)
        assert hit == (HIT if case == "hit" else 0), (case, hit)
        out[case] = traced(lambda case=case, hit=hit: m.allocate(case, PROMPT - hit))
        m.check_integrity()
    return out


def main() -> None:
    for case, modules in allocate_modules().items():
        print(f"{case}: {len(modules)} modules")
        for name in modules:
            print(f"  {name}")


if __name__ == "__main__":
    main()
