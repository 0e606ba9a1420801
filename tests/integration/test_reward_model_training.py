"""Reward model: packed scores are the ones transformers' own forward gives, training ranks the
pairs, and the saved folder loads as a sequence classifier with the same scores."""

import logging

import pytest
import torch

from oxrl.config.schema import ModelConfig, PreferenceConfig
from oxrl.data.types import Example, Sequence, pack
from oxrl.training.strategy import SingleDevice
from oxrl.loops.objectives import get_objective
from oxrl.loops.sl import train_offline
from oxrl.models.reward_model import load_reward_model, sequence_scores
from oxrl.models.save import save_hf_folder
from tests.conftest import make_tiny_llama
from tests.integration.test_preference_training import preference_config, preference_pairs

PAD = 0  # never a token of the test data (which uses ids >= 1)


def tiny_reward_model(seed: int = 0):
    from transformers import LlamaForSequenceClassification

    config = make_tiny_llama().config
    config.num_labels, config.pad_token_id = 1, PAD
    torch.manual_seed(seed)
    return LlamaForSequenceClassification(config)


def hf_scores(model, sequences: list[list[int]]) -> torch.Tensor:
    """transformers' own route: a right-padded batch, pooled at each row's last non-pad token."""
    longest = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), longest), PAD)
    attn = torch.zeros_like(ids)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)], attn[row, : len(seq)] = torch.tensor(seq), 1
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=attn).logits[:, 0]


def test_rm_trains_and_the_saved_folder_scores_the_same(tmp_path):
    from transformers import AutoModelForSequenceClassification

    model = tiny_reward_model()
    cfg = preference_config(tmp_path, "rm", eval_every=8)
    result = train_offline(cfg, get_objective("rm", cfg.preference), model, None, preference_pairs(8), preference_pairs(4, seed=5),
                           SingleDevice(torch.device("cpu"), "no"), tmp_path / "run")
    assert result.losses[-1] < 0.5 * result.losses[0]
    assert result.final_metrics["val/rewards/accuracy"] == 1.0 and result.final_metrics["rewards/margins"] > 1.0

    examples = preference_pairs(3, seed=7)
    model.eval()
    with torch.no_grad():
        packed = sequence_scores(model, pack(examples))
    save_hf_folder(model, None, tmp_path / "rm")
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm")
    sequences = [seq.input_ids for e in examples for seq in e.sequences]
    torch.testing.assert_close(hf_scores(loaded, sequences), packed, atol=1e-5, rtol=1e-5)


def test_scores_skip_trailing_pad_tokens_like_transformers():
    # eos == pad is common (SmolLM2): a sequence ending in it is scored at the token before.
    model = tiny_reward_model().eval()
    sequences = [[1, 5, 9, PAD], [1, 7, 3, 8], [1, 4, PAD]]
    batch = pack([Example([Sequence(s, [False] + [True] * (len(s) - 1)) for s in sequences])])
    with torch.no_grad():
        packed = sequence_scores(model, batch)
    torch.testing.assert_close(packed, hf_scores(model, sequences), atol=1e-5, rtol=1e-5)


def test_margin_field_enters_the_loss():
    model = tiny_reward_model()
    pairs = [Example(e.sequences, {"margin": 2.0}) for e in preference_pairs(2)]
    batch = pack(pairs)
    plain = get_objective("rm").compute(model, batch, normaliser=2.0).loss
    with_margin = get_objective("rm", PreferenceConfig(rm_margin_field="margin"))
    assert with_margin.compute(model, batch, normaliser=2.0).loss > plain  # a required gap costs more
    missing = pack(preference_pairs(2))
    with pytest.raises(ValueError, match="rm_margin_field"):
        with_margin.compute(model, missing, normaliser=2.0)


def test_load_reward_model_adds_a_score_head_to_a_causal_lm(tmp_path):
    make_tiny_llama().save_pretrained(tmp_path)
    model = load_reward_model(ModelConfig(name_or_path=str(tmp_path)), torch.device("cpu"), pad_token_id=PAD)
    assert model.score.out_features == 1 and model.config.pad_token_id == PAD
    assert sequence_scores(model, pack(preference_pairs(2))).shape == (4,)


def test_model_compile_blocks_compiles_the_reward_models_decoder_layers_too(tmp_path, oxrl_log):
    oxrl_log.set_level(logging.INFO, logger="oxrl")
    make_tiny_llama().save_pretrained(tmp_path)
    cfg = ModelConfig(name_or_path=str(tmp_path), compile_blocks=True)
    model = load_reward_model(cfg, torch.device("cpu"), pad_token_id=PAD)
    assert f"compiling {3 * len(model.model.layers)} MLP and norm modules" in oxrl_log.text  # each layer's MLP, 2 norms
