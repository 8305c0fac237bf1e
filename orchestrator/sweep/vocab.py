"""Does a draft speak the target's vocabulary? Checked at lock time, before measuring.

Speculative decoding hands token ids from the draft to the target: a draft whose tokenizer
maps text to other ids is not an error anywhere at run time, it just has almost every
drafted token rejected. mlx-lm compares only the two vocabularies' sizes; this compares
the tokenizers themselves (``tokenizer.json``): every token's id, the added and special
tokens, the BPE merges and the end-of-sequence token, and says what differs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def vocabulary(folder: Path) -> dict | None:
    """The parts of a model folder's tokenizer that decide token ids (None: no
    tokenizer.json to compare, e.g. a SentencePiece-only folder)."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    tok = json.loads(path.read_text(encoding="utf-8"))
    model = tok.get("model") or {}
    vocab = model.get("vocab") or {}
    if isinstance(vocab, list):  # Unigram: [[piece, score], …], ids are positions
        vocab = {piece: i for i, (piece, _score) in enumerate(vocab)}
    merges = model.get("merges") or []
    config = folder / "tokenizer_config.json"
    eos = json.loads(config.read_text(encoding="utf-8")).get("eos_token") \
        if config.is_file() else None
    if isinstance(eos, dict):
        eos = eos.get("content")
    return {"type": model.get("type"), "vocab": vocab,
            "added": {a["content"]: a["id"] for a in tok.get("added_tokens") or []},
            "merges": hashlib.sha256(json.dumps(merges).encode()).hexdigest(),
            "merges_n": len(merges), "eos": eos}


def _examples(names: list[str], n: int = 3) -> str:
    shown = ", ".join(repr(x) for x in names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")


def differences(target: dict, draft: dict) -> list[str]:
    """What differs between two vocabularies, in words (empty: the same)."""
    out = []
    if target["type"] != draft["type"]:
        out.append(f"tokenizer model {target['type']} (target) vs {draft['type']} (draft)")
    tv, dv = target["vocab"], draft["vocab"]
    if len(tv) != len(dv):
        out.append(f"vocabulary of {len(tv)} tokens (target) vs {len(dv)} (draft)")
    moved = sorted(t for t in tv.keys() & dv.keys() if tv[t] != dv[t])
    if moved:
        t = moved[0]
        out.append(f"{len(moved)} token(s) have other ids, e.g. {t!r} is {tv[t]} in the target "
                   f"and {dv[t]} in the draft")
    only_t, only_d = sorted(tv.keys() - dv.keys()), sorted(dv.keys() - tv.keys())
    if only_t:
        out.append(f"{len(only_t)} token(s) only in the target: {_examples(only_t)}")
    if only_d:
        out.append(f"{len(only_d)} token(s) only in the draft: {_examples(only_d)}")
    if target["added"] != draft["added"]:
        diff = sorted(set(target["added"].items()) ^ set(draft["added"].items()))
        out.append(f"added/special tokens differ: {_examples([f'{c}={i}' for c, i in diff])}")
    if target["merges"] != draft["merges"]:
        out.append(f"BPE merges differ ({target['merges_n']} vs {draft['merges_n']})")
    if target["eos"] != draft["eos"]:
        out.append(f"end-of-sequence token {target['eos']!r} (target) vs {draft['eos']!r} "
                   "(draft)")
    return out
