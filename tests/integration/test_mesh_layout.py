"""Tensor and context parallel, the parts that need no process group: how a row is split over context-parallel
ranks and attended, which models tensor parallel can split, what the config refuses, and what the memory estimate
and the recipe make of a mesh. That the layouts train like one process: tests/system/test_distributed.py."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, Phi3Config, Qwen2MoeConfig, Qwen3Config

from oxrl.data.types import Example, Sequence, pack
from oxrl.models.context_parallel import chunk_owners, share_row
from oxrl.models.packed_attention import key_segment_sdpa, per_sequence_sdpa
from oxrl.models.model_inputs import packed_row
from oxrl.models.model_inputs import ParallelLayout
from oxrl.models.shape import tensor_parallel_plan, tensor_parallel_refusal
from tests.distributed_worker import config


def test_each_rank_holds_an_early_and_a_late_chunk_so_causal_work_is_balanced():
    owner, local, padded = chunk_owners(10, 2)
    assert padded == 12  # a multiple of 2 x cp
    assert owner.tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0]
    assert local.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5]  # each rank: its early chunk, then its late one
    owner, _, padded = chunk_owners(4096, 4)
    work = [int(torch.arange(padded)[owner == rank].sum()) for rank in range(4)]  # keys a causal query attends to
    assert max(work) == min(work)
    contiguous = [sum(range(rank * 1024, (rank + 1) * 1024)) for rank in range(4)]
    assert max(contiguous) / min(contiguous) > 6  # what a plain split would give


def shared_prefix_row():
    """Two prompt groups packed with their completions as continuations (a GRPO micro-batch's layout), so query
    runs start mid-sequence and carry a prefix of another sequence's tokens."""
    g = torch.Generator().manual_seed(0)
    examples = []
    for prompt_length in (5, 3):
        prompt = torch.randint(3, 100, (prompt_length,), generator=g).tolist()
        for completion_length in (4, 7, 2):
            completion = torch.randint(3, 100, (completion_length,), generator=g).tolist()
            examples.append(Example([Sequence(prompt + completion, [False] * prompt_length + [True] * completion_length)]))
    return pack(examples, share_prefixes=True)


@pytest.mark.parametrize("size", [2, 3])
def test_ranks_attending_to_the_gathered_keys_give_the_whole_rows_attention(size):
    """Each rank's queries over every rank's keys and values (gathered rank after rank), per query run with its
    sequence's keys up to its last query and its shared prefix: exactly the whole row's per-sequence attention."""
    batch = shared_prefix_row()
    assert any(s.shared for s in batch.segments)
    length = batch.input_ids.shape[1]
    g = torch.Generator().manual_seed(1)
    query = torch.randn(1, 4, length, 8, generator=g)
    key, value = torch.randn(1, 2, length, 8, generator=g), torch.randn(1, 2, length, 8, generator=g)
    whole = per_sequence_sdpa(query, key, value, packed_row(batch, "cpu"), None, grouped_query=True)
    shares = [share_row(batch, ParallelLayout(cp_size=size, cp_rank=rank)) for rank in range(size)]
    padded = chunk_owners(length, size)[2]

    def padded_tokens(t):  # padding positions: zeros, a sequence of their own
        return torch.cat([t, t.new_zeros(1, t.shape[1], padded - length, t.shape[3])], dim=2)

    gathered_key = torch.cat([padded_tokens(key)[:, :, share.index] for share, _ in shares], dim=2)
    gathered_value = torch.cat([padded_tokens(value)[:, :, share.index] for share, _ in shares], dim=2)
    out = torch.zeros_like(padded_tokens(query))
    for share, inputs in shares:
        row = inputs["packed_row"]
        assert row.length == padded // size and row.gather is not None
        assert torch.equal(inputs["input_ids"][0][: int((share.index < length).sum())],
                           batch.input_ids[0][share.index[share.index < length]])
        local = key_segment_sdpa(padded_tokens(query)[:, :, share.index], gathered_key, gathered_value, row, None, True)
        out[:, :, share.index] = local
    torch.testing.assert_close(out[:, :, :length], whole, atol=1e-6, rtol=0)


def test_a_rank_finds_the_targets_it_predicts_and_their_place_in_the_row():
    batch = shared_prefix_row()
    positions = torch.nonzero(batch.loss_mask[0], as_tuple=True)[0]
    seen = torch.zeros(len(positions), dtype=torch.long)
    for rank in range(2):
        share, _ = share_row(batch, ParallelLayout(cp_size=2, cp_rank=rank))
        mine, local = share.local_positions(positions)
        assert torch.equal(share.index[local], positions[mine])
        seen += mine.long()
    assert seen.tolist() == [1] * len(positions)  # every target on exactly one rank


def test_a_row_with_images_is_not_split():
    batch = shared_prefix_row()
    batch.vision = {"pixel_values": torch.zeros(1, 3)}
    with pytest.raises(ValueError, match="text rows only"):
        share_row(batch, ParallelLayout(cp_size=2))


def llama(**changes) -> LlamaConfig:
    return LlamaConfig(**{"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                          "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": False, **changes})


def test_the_plan_entries_the_shape_accepts_are_the_ones_parallel_splits():
    from oxrl.models.parallel import plan_styles
    from oxrl.models.shape import SUPPORTED_STYLES

    assert set(plan_styles()) == set(SUPPORTED_STYLES)


def test_tensor_parallel_splits_the_families_whose_plans_it_knows_and_names_what_stops_the_others():
    assert tensor_parallel_refusal(llama(), 2) is None
    assert tensor_parallel_refusal(Phi3Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=2), 2) is None
    assert "num_key_value_heads = 2 is not divisible by strategy.mesh.tp = 4" in tensor_parallel_refusal(llama(), 4)
    assert "vocab_size = 129" in tensor_parallel_refusal(llama(vocab_size=129), 2)
    assert tensor_parallel_refusal(llama(tie_word_embeddings=True), 2) is None  # one weight, split once
    qwen3 = Qwen3Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    assert tensor_parallel_refusal(qwen3, 2) is None  # its per-head norms: replicated, gradients summed
    moe = Qwen2MoeConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_experts=4,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    assert tensor_parallel_refusal(moe, 2) is None
    kept, experts = tensor_parallel_plan(moe)  # the experts stay whole: none of their entries is applied
    assert experts == ["layers.*.mlp.experts"] and not [name for name in kept if ".experts" in name]
    assert kept["layers.*.self_attn.q_proj"] == "colwise"
    other = llama()
    other.base_model_tp_plan = {**other.base_model_tp_plan, "embed_tokens": "embedding_rowwise"}
    assert "embed_tokens: embedding_rowwise" in tensor_parallel_refusal(other, 2)


@pytest.mark.parametrize(("algorithm", "changes", "reason"), [
    ("kd_forward", {"preference": {"teacher": "t"}}, "whole vocabulary's logits"),
    ("rm", {}, "score head"),
    ("ppo", {}, "PPO's critic"),
    ("online_dpo", {}, "online algorithms"),
    ("sft", {"lora": {"enabled": True}}, "LoRA adapters are not split"),
])
def test_the_config_refuses_a_mesh_for_what_it_cannot_serve(algorithm, changes, reason):
    from oxrl.config.schema import Config

    tree = {"model": {"name_or_path": "m"}, "algorithm": {"name": algorithm}, "data": {"train": [{"path": "d.jsonl"}]},
            "strategy": {"name": "fsdp2", "mesh": {"tp": 2}}, **changes}
    Config.model_validate({**tree, "strategy": {"name": "fsdp2"}})  # valid without the mesh
    with pytest.raises(ValueError, match=f"cannot serve `{algorithm}`: .*{reason}"):
        Config.model_validate(tree)


def test_a_mesh_is_read_by_fsdp2_only(tmp_path):
    with pytest.raises(ValueError, match=r"strategy.mesh.tp = 2 is not read by `sft`: it is read only with strategy.name: fsdp2"):
        config(tmp_path, strategy={"name": "deepspeed", "mesh": {"tp": 2}})
    with pytest.raises(ValueError, match=r"strategy.mesh.cp = 2 is not read by `sft`: it is read only with strategy.name: fsdp2"):
        config(tmp_path, strategy={"name": "single", "mesh": {"cp": 2}})


def test_the_mesh_must_tile_the_processes_launched():
    from oxrl.config.schema import MeshConfig
    from oxrl.training.fsdp import data_parallel_size

    assert data_parallel_size(8, MeshConfig(tp=2, cp=2)) == 2
    assert data_parallel_size(8, MeshConfig(tp=2, dp_shard=4)) == 4
    with pytest.raises(ValueError, match="tp x cp = 2 x 3 = 6 does not divide the 8 processes"):
        data_parallel_size(8, MeshConfig(tp=2, cp=3))
    with pytest.raises(ValueError, match="dp_shard x cp x tp = 2 x 1 x 2 must equal the 8 processes"):
        data_parallel_size(8, MeshConfig(tp=2, dp_shard=2))


def test_the_memory_estimate_splits_activations_by_tp_and_tokens_by_cp():
    from dataclasses import replace

    from oxrl.models.memory import TrainingPlan, estimate_memory, layer_activation_bytes
    from oxrl.models.shape import ModelShape

    shape = ModelShape.from_config(llama(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                         num_attention_heads=32, num_key_value_heads=8, num_hidden_layers=4))
    assert [shape.tensor_parallel_refusal(tp) for tp in (2, 4, 8)] == [None, None, None]
    assert "num_key_value_heads = 2 is not divisible" in ModelShape.from_config(llama()).tensor_parallel_refusal(4)
    plan = TrainingPlan(tokens_per_micro_batch=32768, dtype="bfloat16", strategy="fsdp2", devices=8)
    alone = estimate_memory(shape, plan)
    tp2, cp2 = estimate_memory(shape, replace(plan, tp=2)), estimate_memory(shape, replace(plan, cp=2))
    norms = 2 * (2 * 4 + 2) * shape.hidden  # the norms' activations stay whole under tp (no sequence parallel)
    assert layer_activation_bytes(shape, 2, 2) - norms == (layer_activation_bytes(shape, 2) - norms) // 2
    assert tp2.activations < alone.activations and tp2.weights < alone.weights  # the gathered layers are halved
    assert (tp2.gradients, tp2.optimizer) == (alone.gradients, alone.optimizer)  # P / D either way
    gathered = 4 * 32768 * shape.kv_width * 2 * shape.layers  # each layer's gathered keys and values, and their copies
    assert cp2.activations == alone.activations // 2 + gathered
    assert cp2.logits < alone.logits
    moe = ModelShape.from_config(Qwen2MoeConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_experts=4,
                                                moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
                                                num_key_value_heads=2, tie_word_embeddings=False))
    assert moe.expert_parameters == 2 * 4 * 3 * 32 * 16  # layers x experts x (gate, up, down) x hidden x width
    small = TrainingPlan(tokens_per_micro_batch=64, strategy="fsdp2", devices=4)
    whole_experts = estimate_memory(moe, replace(small, tp=2)).optimizer - estimate_memory(moe, small).optimizer
    assert whole_experts == 2 * moe.expert_parameters * 4 // 4  # AdamW's 2 moments of E more parameters, over D


def test_the_recipe_takes_a_mesh_when_fsdp2_alone_does_not_fit(tmp_path):
    from oxrl.models.hardware import Devices
    from oxrl.models.recipe import layouts
    from oxrl.models.fit import fits
    from oxrl.models.shape import ModelShape

    shape = ModelShape.from_config(llama(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                         num_attention_heads=32, num_key_value_heads=8, num_hidden_layers=32))
    tree = {"model": {"name_or_path": "m"}, "algorithm": {"name": "sft"}, "data": {"train": [{"path": "d.jsonl"}],
            "max_length": 65536}, "train": {"micro_batch_size_per_device": 1, "global_batch_size": 8},
            "strategy": {"name": "fsdp2"}}
    devices = Devices("cuda", 8, 32 * 1024**3, "a 32 GB GPU")
    tried = list(layouts(tree, shape, devices))
    alone = [estimate for _, cfg, estimate in tried if cfg.strategy.mesh.tp * cfg.strategy.mesh.cp == 1]
    assert alone and not any(fits(estimate, devices) for estimate in alone)
    cfg = next(cfg for _, cfg, estimate in tried if fits(estimate, devices))
    # At 64k tokens a row's layer inputs, which tp keeps whole, are what does not fit: cp halves them; tp 2 is tried
    # first and does not fit.
    assert (cfg.strategy.mesh.tp, cfg.strategy.mesh.cp) == (1, 2) and cfg.model.gradient_checkpointing
    assert any(c.strategy.mesh.tp == 2 and c.strategy.mesh.cp == 1 for _, c, _ in tried)


def test_a_tp_the_model_cannot_take_is_refused_before_it_loads(tmp_path):
    """Heads that tp does not divide: one line naming the constraint, from the model's config.json alone."""
    from transformers import LlamaForCausalLM

    from oxrl.config.schema import Config
    from oxrl.models.fit import log_memory_estimate

    LlamaForCausalLM(llama(num_key_value_heads=1)).save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").unlink()  # no weights: nothing but the config may be read
    cfg = Config.model_validate({"model": {"name_or_path": str(tmp_path / "m")}, "algorithm": {"name": "sft"},
                                 "data": {"train": [{"path": "d.jsonl"}]},
                                 "strategy": {"name": "fsdp2", "mesh": {"tp": 2}}})
    with pytest.raises(ValueError, match=r"strategy.mesh.tp = 2 cannot split .*num_key_value_heads = 1 is not divisible"):
        log_memory_estimate(cfg, torch.device("cpu"), 2)


def test_context_parallel_names_the_models_it_cannot_split():
    from oxrl.models.context_parallel import context_parallel_refusal
    from oxrl.models.packed_attention import use_packed_attention
    from tests.conftest import make_tiny_llama

    model = make_tiny_llama()
    assert "runs attention 'sdpa'" in context_parallel_refusal(model)
    use_packed_attention(model)
    assert context_parallel_refusal(model) is None
