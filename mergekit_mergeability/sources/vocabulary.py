"""What a model's token ids mean: its token → id map, special tokens and chat template,
read from its tokenizer files without building a tokenizer.

Two checkpoints can agree on every tensor shape and still mean different words by the
same token id (a tokenizer retrained, or ids reassigned); their merge writes garbled
text. Comparing vocabularies by content, from small files, catches it before a merge.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

from mergekit_mergeability.errors import UserError
from mergekit_mergeability.sources import HubModel, Source, small_file

SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")


@dataclass(frozen=True)
class Vocabulary:
    tokens: Dict[str, int]  # token -> id, added tokens included
    special: Dict[str, Optional[str]]  # bos/eos/pad/unk -> token text
    chat_template: Optional[str]

    def ids(self) -> Dict[int, str]:
        return {i: token for token, i in self.tokens.items()}


def read(model: Source) -> Optional[Vocabulary]:
    """The model's vocabulary, or None when it ships no tokenizer files."""
    tokens = _tokens(model)
    if tokens is None:
        return None
    settings = _json(small_file(model, "tokenizer_config.json")) or {}
    special_map = _json(small_file(model, "special_tokens_map.json")) or {}
    special = {key: _content(settings.get(key, special_map.get(key))) for key in SPECIAL_TOKENS}
    template = settings.get("chat_template") or _text(small_file(model, "chat_template.jinja"))
    return Vocabulary(tokens, special, template if isinstance(template, str) else json.dumps(template))


def _tokens(model: Source) -> Optional[Dict[str, int]]:
    fast = _json(small_file(model, "tokenizer.json"))
    if fast is not None:
        vocab = (fast.get("model") or {}).get("vocab") or {}
        # Unigram models list [piece, score] pairs: the position is the id
        tokens = {piece: i for i, (piece, _) in enumerate(vocab)} if isinstance(vocab, list) else dict(vocab)
        tokens.update({added["content"]: added["id"] for added in fast.get("added_tokens") or []})
        return tokens
    slow = _json(small_file(model, "vocab.json"))  # GPT-2 style files
    if slow is not None:
        return {**slow, **(_json(small_file(model, "added_tokens.json")) or {})}
    if not isinstance(model, HubModel) and (Path(model) / "tokenizer.model").is_file():
        import transformers  # a sentencepiece model: only a loaded tokenizer knows its map

        return transformers.AutoTokenizer.from_pretrained(model).get_vocab()
    return None


def _json(path: Optional[Path]) -> Optional[dict]:
    """The file parsed (shared by every caller: not to be changed)."""
    if path is None:
        return None
    try:
        return _parsed(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"{path}: not JSON; save the tokenizer again") from None


@functools.lru_cache(maxsize=4)
def _parsed(text: bytes) -> dict:
    """Parsed once for the many fine-tunes that ship their base's very files (a pool of 100
    adapters, each with SmolLM2's 3.5 MB tokenizer.json: 12 s to parse them all). Four: one
    tokenizer's files, read model after model, and no more held."""
    return json.loads(text.decode("utf-8"))


def _text(path: Optional[Path]) -> Optional[str]:
    return path.read_text(encoding="utf-8") if path is not None else None


def _content(token) -> Optional[str]:
    """A special token as tokenizer files write it: text, or ``{"content": text, ...}``."""
    return token.get("content") if isinstance(token, dict) else token
