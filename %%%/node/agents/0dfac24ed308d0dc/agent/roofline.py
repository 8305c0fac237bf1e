"""How close a decode rate is to the node's memory bandwidth (a roofline check).

Decoding one token reads every weight once plus the KV cache; speculative decoding
reads the target once per verify round and the draft once per drafted token, and
a round yields (accepted + 1) tokens.
"""

from __future__ import annotations

# Unified memory bandwidth in GB/s (Apple's published figures; binned Max parts are lower,
# override per node with specfleet_memory_bandwidth_gbs in the inventory).
APPLE_BANDWIDTH_GBS = {
    "M1": 68.25, "M1 Pro": 200, "M1 Max": 400, "M1 Ultra": 800,
    "M2": 100, "M2 Pro": 200, "M2 Max": 400, "M2 Ultra": 800,
    "M3": 100, "M3 Pro": 150, "M3 Max": 400, "M3 Ultra": 819,
    "M4": 120, "M4 Pro": 273, "M4 Max": 546,
}


def chip_bandwidth_gbs(brand: str | None) -> float | None:
    """Bandwidth for a ``machdep.cpu.brand_string`` such as ``Apple M2 Max``."""
    if not brand or not brand.startswith("Apple "):
        return None
    return APPLE_BANDWIDTH_GBS.get(brand[len("Apple "):].strip())


def model_bytes(model) -> int:
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))  # type: ignore[str-unpack,union-attr]  # mlx stubs type leaves loosely


def kv_bytes_per_position(model) -> int:
    """Bytes of K and V one position adds, summed over layers."""
    args = model.args
    heads = getattr(args, "num_key_value_heads", None) or args.num_attention_heads
    head_dim = getattr(args, "head_dim", None) or args.hidden_size // args.num_attention_heads
    itemsize = model.layers[0].self_attn.k_proj.weight.dtype.size  # KV follows weight dtype
    return 2 * len(model.layers) * heads * head_dim * itemsize


def bytes_per_token(target_bytes: int, target_kv_pos: int, context_tokens: float,
                    draft_bytes: int = 0, draft_kv_pos: int = 0, drafted_per_round: float = 0,
                    tokens_per_round: float = 1) -> float:
    """Bytes read from memory per generated token."""
    per_round = target_bytes + target_kv_pos * context_tokens
    per_round += drafted_per_round * (draft_bytes + draft_kv_pos * context_tokens)
    return per_round / max(tokens_per_round, 1e-9)


def utilisation(bytes_token: float, decode_tok_s: float | None,
                bandwidth_gbs: float | None) -> float | None:
    if not decode_tok_s or not bandwidth_gbs:
        return None
    return bytes_token * decode_tok_s / (bandwidth_gbs * 1e9)
