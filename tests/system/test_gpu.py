"""The CUDA paths: packed rows, bf16 autocast training, the rollout engine and the RL loop on a GPU.

On CUDA a packed row runs through oxRL's variable-length kernel (varlen FlashAttention in bf16, FlexAttention in
fp32) and the `hf` engine decodes from a compiled static cache; the checks of benchmarks/gpu.py hold them to
transformers' sdpa and `generate`. These tests skip on machines without CUDA (CI has none); docs/benchmarks.md
records where they last ran on a GPU.
"""

import pytest
import torch

from oxrl.models.logprobs import forward_logits, token_logprobs_from_logits
from oxrl.data.types import pack
from oxrl.training.strategy import SingleDevice
from oxrl.loops.objectives import get_objective
from oxrl.data.types import RLPromptBatch
from oxrl.loops.rl import train_rl
from oxrl.loops.sl import train_offline
from oxrl.rewards.combine import build_reward_fn
from oxrl.rollout.base import SamplingParams
from oxrl.rollout.hf import HFEngine
from tests.conftest import make_tiny_llama, rl_handles
from tests.integration.test_packing import _examples, _padded_reference
from tests.integration.test_rl_loop import prompts, rl_config
from tests.integration.test_rollout_hf import TinyTokenizer
from tests.integration.test_tiny_training import copy_task, tiny_config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda")


def test_packed_logits_equal_padded_logits_on_cuda():
    torch.backends.cuda.matmul.allow_tf32 = False  # compare fp32 with fp32
    model = make_tiny_llama().eval()
    examples = _examples()
    with torch.no_grad():
        padded_logits, attn, _ = _padded_reference(model, examples)  # the textbook padded batch, on the CPU
        packed_logits = forward_logits(model.to(CUDA), pack(examples).to(CUDA)).cpu()  # one packed row, on CUDA
    pieces = [padded_logits[row, : int(attn[row].sum())] for row in range(len(examples))]
    torch.testing.assert_close(packed_logits, torch.cat(pieces), atol=1e-4, rtol=1e-4)


def test_packed_kernels_give_each_sequences_own_logprobs_on_cuda():
    from benchmarks.gpu import packed_equality
    from oxrl.models.cuda_attention import VARLEN

    fp32 = packed_equality("fp32")  # TF32 off: FlexAttention against sdpa, sequence by sequence
    assert fp32["kernel"] == "flex" and fp32["max"] < 1e-4, fp32
    bf16 = packed_equality("bf16")
    assert bf16["kernel"] == ("varlen" if VARLEN.function is not None else "flex"), bf16
    assert bf16["mean"] < 1e-2 and bf16["max"] < 0.1 and bf16["grad_cosine"] > 0.99, bf16


def test_compiled_decoding_gives_generates_tokens_on_cuda():
    from benchmarks.gpu import decode_equality

    fp32 = decode_equality("fp32")
    assert fp32["rows_identical"] == 1.0 and fp32["max_logprob_gap"] < 1e-4, fp32


def test_bf16_autocast_training_learns_and_every_parameter_moves(tmp_path):
    cfg = tiny_config(tmp_path)
    model = make_tiny_llama().to(CUDA)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    strategy = SingleDevice(CUDA, max_grad_norm=1.0)
    assert strategy.use_bf16_autocast  # `auto` mixed precision on CUDA
    result = train_offline(cfg, get_objective("sft"), model, None, copy_task(), [], strategy, tmp_path / "run")
    assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 master weights
    assert result.losses[-1] < 0.7 * result.losses[0]
    unmoved = [n for n, p in model.named_parameters() if torch.equal(p.detach(), before[n])]
    assert not unmoved, f"parameters that did not move: {unmoved}"


def test_hf_engine_logprobs_match_the_model_on_cuda():
    torch.manual_seed(0)
    model = make_tiny_llama().to(CUDA)
    completions = HFEngine(model, TinyTokenizer()).generate([[1, 5, 6, 7], [1, 9]], SamplingParams(n=4, temperature=0.7, max_new_tokens=8))
    assert len(completions) == 8
    for c in completions:
        ids = torch.tensor(c.prompt_ids + c.completion_ids, device=CUDA)
        with torch.no_grad():
            logits = model(ids[None]).logits[0].float() / 0.7
        recomputed = token_logprobs_from_logits(logits, ids)[len(c.prompt_ids):].cpu()
        torch.testing.assert_close(torch.tensor(c.logprobs), recomputed, atol=2e-3, rtol=2e-3)


def test_rl_reward_goes_up_on_cuda(tmp_path):
    cfg = rl_config(tmp_path, "dr_grpo")
    torch.manual_seed(0)
    model = make_tiny_llama().to(CUDA)
    reward = build_reward_fn([{"name": "tests.integration.test_rl_loop:share_of_sevens"}])
    h = rl_handles(cfg, model, HFEngine(model, TinyTokenizer()), reward, SingleDevice(CUDA, max_grad_norm=1.0))
    result = train_rl(h, prompts(), RLPromptBatch([], [], [], []), tmp_path / "rl")
    first, last = sum(result.rewards[:4]) / 4, sum(result.rewards[-4:]) / 4
    assert last > first + 0.2, result.rewards
    # The engine samples and the trainer scores in fp32 (autocast is for the update only): they agree.
    assert result.final_metrics["logprob_mismatch/mean_abs"] < 1e-2


def test_ppo_with_its_critic_on_cuda_learns_and_resumes(tmp_path):
    """PPO on CUDA (bf16 autocast for both updates): the reward goes up, the critic trains through its
    companion strategy, and a run resumed from a checkpoint repeats the uninterrupted steps."""
    from tests.conftest import make_tiny_critic

    def run(name, resume=False, seed=0):
        cfg = rl_config(tmp_path, "ppo")
        cfg.checkpoint.every, cfg.checkpoint.keep_last, cfg.run.resume = 8, 3, resume
        torch.manual_seed(0)
        model = make_tiny_llama(seed=seed).to(CUDA)
        reward = build_reward_fn([{"name": "tests.integration.test_rl_loop:share_of_sevens"}])
        h = rl_handles(cfg, model, HFEngine(model, TinyTokenizer()), reward, SingleDevice(CUDA, max_grad_norm=1.0),
                       critic_model=make_tiny_critic(seed=seed).to(CUDA))
        return train_rl(h, prompts(), RLPromptBatch([], [], [], []), tmp_path / name)

    full = run("full")
    first, last = sum(full.rewards[:4]) / 4, sum(full.rewards[-4:]) / 4
    assert last > first + 0.2, full.rewards
    assert full.final_metrics["critic/loss"] > 0 and full.final_metrics["critic/nonfinite_steps"] == 0
    resumed = run("resumed", str(tmp_path / "full" / "checkpoints" / "step_000008"), seed=5)
    assert resumed.rewards == pytest.approx(full.rewards[8:], abs=1e-3)
