"""Deterministic trainer for the demo target/draft pair.

Do not edit casually: the sha256 of this file is part of the build key, so any
change invalidates the committed pair and forces a retrain (~5 min with OpenBLAS).
"""

from __future__ import annotations

import json
from pathlib import Path

EOT = "<|endoftext|>"

TARGET = {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 2,
          "num_attention_heads": 4, "lr": 7e-4}
DRAFT = {"hidden_size": 128, "intermediate_size": 344, "num_hidden_layers": 2,
         "num_attention_heads": 2, "lr": 1.5e-3}
DEFAULT_ARGS = {"vocab_size": 2048, "steps": 600, "batch": 4, "seq_len": 256, "seed": 0}


def train_tokenizer(docs: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


def model_config(spec: dict, vocab_size: int) -> dict:
    return {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "hidden_size": spec["hidden_size"], "intermediate_size": spec["intermediate_size"],
        "num_hidden_layers": spec["num_hidden_layers"],
        "num_attention_heads": spec["num_attention_heads"],
        "num_key_value_heads": spec["num_attention_heads"],
        "rms_norm_eps": 1e-5, "vocab_size": vocab_size, "max_position_embeddings": 4096,
        "rope_theta": 10000.0, "tie_word_embeddings": True, "torch_dtype": "float32",
        "eos_token_id": 0, "bos_token_id": 0,
    }


def train_model(ids, cfg: dict, lr: float, args: dict, log=print):
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    import numpy as np
    from mlx.utils import tree_flatten
    from mlx_lm.models.llama import Model, ModelArgs

    mx.random.seed(args["seed"])
    model = Model(ModelArgs.from_dict(cfg))
    mx.eval(model.parameters())
    steps, batch, seq = args["steps"], args["batch"], args["seq_len"]
    warm = max(1, steps // 20)
    sched = optim.join_schedules(
        [optim.linear_schedule(1e-6, lr, warm), optim.cosine_decay(lr, steps - warm, lr * 0.05)],
        [warm])
    opt = optim.AdamW(learning_rate=sched, weight_decay=0.01)
    rng = np.random.default_rng(args["seed"])
    data = np.asarray(ids, dtype=np.int32)

    def loss_fn(m, x, y):
        return nn.losses.cross_entropy(m(x), y, reduction="mean")

    state = [model.state, opt.state]

    def step(x, y):
        loss, grads = nn.value_and_grad(model, loss_fn)(model, x, y)
        opt.update(model, grads)
        return loss

    step = mx.compile(step, inputs=state, outputs=state)
    for i in range(steps):
        starts = rng.integers(0, len(data) - seq - 1, size=batch)
        x = mx.array(np.stack([data[s:s + seq] for s in starts]))
        y = mx.array(np.stack([data[s + 1:s + seq + 1] for s in starts]))
        loss = step(x, y)
        mx.eval(state)
        if i % 100 == 0 or i == steps - 1:
            log(f"  step {i:4d}/{steps} loss {loss.item():.3f}")
    return dict(tree_flatten(model.parameters()))


def build_pair(docs: list[str], out: Path, args: dict | None = None, log=print) -> None:
    """Train tokenizer, target and draft; write ``out/target`` and ``out/draft``."""
    import mlx.core as mx

    args = {**DEFAULT_ARGS, **(args or {})}
    tok = train_tokenizer(docs, args["vocab_size"])
    ids: list[int] = []
    eot = tok.token_to_id(EOT)
    for d in docs:
        ids += tok.encode(d).ids + [eot]
    log(f"corpus: {len(ids)} tokens, vocab {tok.get_vocab_size()}")
    for name, spec in (("target", TARGET), ("draft", DRAFT)):
        cfg = model_config(spec, tok.get_vocab_size())
        log(f"training {name} ({spec['hidden_size']} hidden, {args['steps']} steps)")
        weights = train_model(ids, cfg, spec["lr"], args, log)
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        mx.save_safetensors(str(d / "model.safetensors"), weights, metadata={"format": "mlx"})
        (d / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        tok.save(str(d / "tokenizer.json"))
        (d / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOT, "bos_token": None,
            "model_max_length": 4096, "clean_up_tokenization_spaces": False,
        }, indent=2, sort_keys=True) + "\n")
