"""The project's own model pair: committed, keyed by build hash, loadable by mlx-lm."""

import json
import shutil

import pytest

from orchestrator.demo_models.build import COMMITTED, FILES, build_key, file_sha256
from orchestrator.demo_models.corpus import corpus_documents
from orchestrator.demo_models.train import train_tokenizer
from orchestrator.errors import SpecfleetError


def test_committed_pair_matches_its_build_key_and_hashes():
    record = json.loads((COMMITTED / "BUILD.json").read_text())
    assert record["key"] == build_key()["key"], "trainer, corpus or mlx changed: retrain"
    for rel, sha in record["files"].items():
        assert file_sha256(COMMITTED / rel) == sha


def test_pair_has_hf_layout_and_loads_with_one_tokenizer(model_pair):
    from mlx_lm import load

    for role in ("target", "draft"):
        assert sorted(p.name for p in (model_pair / role).iterdir()) == sorted(FILES)
    assert (model_pair / "BUILD.json").exists()
    assert (model_pair / "target" / "tokenizer.json").read_bytes() == \
        (model_pair / "draft" / "tokenizer.json").read_bytes()
    target, tok = load(str(model_pair / "target"))
    draft, _ = load(str(model_pair / "draft"))
    assert target.args.vocab_size == draft.args.vocab_size
    assert target.args.hidden_size > draft.args.hidden_size
    text = "def bisect_left(a, x, lo=0, hi=None):"
    assert tok.decode(tok.encode(text)) == text


def test_corrupted_committed_pair_is_refused(tmp_path):
    fake = tmp_path / "committed"
    shutil.copytree(COMMITTED, fake)
    with open(fake / "draft" / "model.safetensors", "r+b") as f:
        f.seek(1000)
        f.write(b"\x00\x01\x02")
    with pytest.raises(SpecfleetError, match=r"draft/model.safetensors does not match "
                                             r"BUILD.json; run `specfleet demo-models build "
                                             r"--retrain`"):
        from orchestrator.demo_models import build_demo_models

        build_demo_models(tmp_path / "out", committed=fake, log=lambda m: None)


def test_tokenizer_training_is_deterministic():
    docs = corpus_documents()
    assert train_tokenizer(docs, 2048).to_str() == train_tokenizer(docs, 2048).to_str()
