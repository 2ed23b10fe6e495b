"""Tokenizers: a model directory's own, or a tiny byte-level BPE trained offline at runtime.

:class:`TextTokenizer` is the engine's view: ``encode(text) -> ids``, ``decode(ids) -> text``
and ``eos_token_ids``.  :func:`load_tokenizer` reads ``tokenizer.json`` (or anything
transformers' ``AutoTokenizer`` understands) from a local directory without network access;
:func:`tiny_tokenizer` trains a byte-level BPE of ``vocab_size`` tokens on a built-in corpus
(milliseconds; any text round-trips since every byte is in the alphabet).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path

CORPUS = """\
Jenga is a memory manager for the key value cache of large language models with heterogeneous layers.
Full attention layers keep every token, sliding window layers keep only the last few hundred tokens,
chunked local attention layers keep the current chunk, and state space layers keep one fixed size state.
A single page size wastes memory when the layers differ, so jenga allocates large pages that are the
least common multiple of every layer group's page and cuts them into small pages for each group.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
Once upon a time there was a little engine that served many requests at once, batching them together,
evicting old prefixes when memory was tight and preempting requests when it ran out of pages.
def generate(prompts, sampling_params): return [request.output for request in engine.run(prompts)]
The numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 and the words one two three four five six seven eight nine.
"""

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
#: files that carry a vocabulary; without one, transformers would fabricate a tokenizer from
#: the config alone (a Gemma folder got 5 tokens and its BOS as EOS), so none is loaded
VOCAB_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "vocab.txt", "tekken.json")


class TextTokenizer:
    """Engine-facing tokenizer: wraps a ``tokenizers.Tokenizer`` or a transformers tokenizer."""

    def __init__(self, backend, eos_token_ids: Iterable[int] = (), *, hf: bool = False):
        self.backend = backend
        self.hf = hf
        self.eos_token_ids = tuple(dict.fromkeys(int(t) for t in eos_token_ids))

    def encode(self, text: str) -> list[int]:
        if self.hf:
            return list(self.backend(text)["input_ids"])
        return self.backend.encode(text).ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)


@lru_cache(maxsize=4)
def _train_bpe(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS.splitlines() * 4, trainer)
    return tok


def tiny_tokenizer(vocab_size: int = 512) -> TextTokenizer:
    """Byte-level BPE with ``<pad>=0, <bos>=1, <eos>=2``; at most ``vocab_size`` ids (>= 259)."""
    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"a byte-level tokenizer needs vocab_size >= 259, got {vocab_size}")
    tok = _train_bpe(vocab_size)
    assert tok.get_vocab_size() <= vocab_size, "BPE grew past the model vocabulary"
    return TextTokenizer(tok, [tok.token_to_id("<eos>")])


def has_tokenizer_files(path: str | Path) -> bool:
    path = Path(path)
    return any((path / f).is_file() for f in VOCAB_FILES) or any(path.glob("*.tiktoken"))


def load_tokenizer(path: str | Path, eos_token_ids: Iterable[int] = ()) -> TextTokenizer | None:
    """The tokenizer of a local model directory, or ``None`` when it ships no vocabulary file
    (:data:`VOCAB_FILES`, or a ``*.tiktoken``): such a model takes token-id prompts only."""
    path = Path(path)
    eos = list(eos_token_ids)
    if not has_tokenizer_files(path):
        return None
    try:
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception:  # noqa: BLE001 - any failure: fall back to the raw tokenizer.json
        hf = None
    if hf is not None:
        if hf.eos_token_id is not None:
            eos.append(hf.eos_token_id)
        return TextTokenizer(hf, eos, hf=True)
    file = path / "tokenizer.json"
    if file.is_file():
        from tokenizers import Tokenizer

        return TextTokenizer(Tokenizer.from_file(str(file)), eos)
    return None
