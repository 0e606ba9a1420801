"""Policy losses: hand-derived values and gradients, equivalences, accumulation exactness."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from oxrl.algorithms.policy_loss import (
    AGGREGATIONS,
    POLICY_LOSSES,
    PolicyLossInput,
    PolicyLossParams,
    aggregate,
    local_normaliser,
    policy_loss,
)

LN = math.log


def leaf(values):
    return torch.tensor(values, requires_grad=True)


def make_input(logprobs, old_logprobs, advantages, mask=None, normaliser=None, **extra):
    mask = torch.ones_like(old_logprobs) if mask is None else mask
    normaliser = float(mask.sum()) if normaliser is None else normaliser
    return PolicyLossInput(logprobs, old_logprobs, advantages, mask, normaliser, **extra)


# ----------------------------------------------------------------------------- aggregation


def test_aggregate_hand_values_and_local_normaliser():
    values = torch.tensor([[1.0, 2.0, 3.0, 99.0], [4.0, 99.0, 99.0, 99.0], [99.0] * 4])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])  # last row: padding only
    # token_mean: (1 + 2 + 3 + 4) / 4 tokens = 2.5
    assert float(aggregate(values, mask, "token_mean", normaliser=4)) == pytest.approx(2.5)
    # seq_mean_token_mean: row means 2 and 4, summed over 2 sequences / 2 = 3
    assert float(aggregate(values, mask, "seq_mean_token_mean", normaliser=2)) == pytest.approx(3.0)
    # seq_mean_token_sum_norm: row sums 6 and 4 over max_len 4 -> 1.5 + 1 = 2.5, / 2 = 1.25
    assert float(aggregate(values, mask, "seq_mean_token_sum_norm", 2, max_len=4)) == pytest.approx(1.25)
    assert local_normaliser(mask, "token_mean") == 4.0
    assert local_normaliser(mask, "seq_mean_token_mean") == 2.0  # the padding row doesn't count
    assert local_normaliser(mask, "seq_mean_token_sum_norm") == 2.0


def test_aggregate_errors():
    values, mask = torch.ones(1, 2), torch.ones(1, 2)
    with pytest.raises(ValueError, match=r"seq_mean_token_mean.*seq_mean_token_sum_norm.*token_mean"):
        aggregate(values, mask, "mean", 1.0)
    with pytest.raises(ValueError, match="max_len"):
        aggregate(values, mask, "seq_mean_token_sum_norm", 1.0)
    with pytest.raises(ValueError, match="max_len"):
        PolicyLossParams(aggregation="seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="dual_clip"):
        PolicyLossParams(dual_clip=1.0)
    with pytest.raises(ValueError, match="k1"):
        PolicyLossParams(kl_estimator="k9")
    with pytest.raises(ValueError, match=r"cispo.*gspo.*ppo"):
        policy_loss("grpo", make_input(leaf([[0.0]]), torch.zeros(1, 1), torch.ones(1, 1)))
    with pytest.raises(ValueError, match="advantages"):
        make_input(leaf([[0.0, 0.0]]), torch.zeros(1, 2), torch.ones(2, 1))


# ----------------------------------------------------------------------------- PPO


def ppo_four_tokens(**params):
    # old logp = 0, so ratio = exp(logp): ratios 1.5, 0.5, 0.5, 1.5 with A = +1, +1, -1, -1.
    logprobs = leaf([[LN(1.5), LN(0.5), LN(0.5), LN(1.5)]])
    inp = make_input(logprobs, torch.zeros(1, 4), torch.tensor([[1.0, 1.0, -1.0, -1.0]]))
    loss, metrics = policy_loss("ppo", inp, PolicyLossParams(**params))
    loss.backward()
    return loss, metrics, logprobs.grad


def test_ppo_hand_values_and_gradients():
    loss, metrics, grad = ppo_four_tokens()
    # eps 0.2, per token -min(r A, clip(r, 0.8, 1.2) A):
    #   t0 r 1.5 A +1: -min(1.5, 1.2) = -1.2   (clipped high: no gradient)
    #   t1 r 0.5 A +1: -min(0.5, 0.8) = -0.5   (d/dlogp = -A r = -0.5)
    #   t2 r 0.5 A -1: -min(-0.5, -0.8) = 0.8  (clipped low: no gradient)
    #   t3 r 1.5 A -1: -min(-1.5, -1.2) = 1.5  (d/dlogp = -A r = 1.5)
    # token_mean over 4 tokens: (-1.2 - 0.5 + 0.8 + 1.5) / 4 = 0.15
    assert loss.item() == pytest.approx(0.15, abs=1e-6)
    assert torch.allclose(grad, torch.tensor([[0.0, -0.5 / 4, 0.0, 1.5 / 4]]))
    assert float(metrics["clip_frac_high"]) == pytest.approx(0.25)
    assert float(metrics["clip_frac_low"]) == pytest.approx(0.25)
    assert float(metrics["ratio_mean"]) == pytest.approx(1.0)  # (1.5 + 0.5 + 0.5 + 1.5) / 4
    # approx_kl = mean of (r - 1) - ln r: r 1.5 -> 0.0945349, r 0.5 -> 0.1931472; mean 0.1438410
    assert float(metrics["approx_kl"]) == pytest.approx(0.1438410, abs=1e-6)
    assert all(not value.requires_grad for value in metrics.values())


def test_ppo_clip_higher():
    # DAPO eps_high 0.28: t0 is now clipped at 1.28: (-1.28 - 0.5 + 0.8 + 1.5) / 4 = 0.13
    loss, _, _ = ppo_four_tokens(eps_high=0.28)
    assert loss.item() == pytest.approx(0.13, abs=1e-6)


def test_ppo_dual_clip_and_padding_garbage():
    # Token 0: r 4, A -1: PPO loss -min(-4, -1.2) = 4; dual clip c 3 caps it at c |A| = 3, no gradient.
    # Token 1: r 2, A -1: 2 < c, untouched: loss 2, gradient -A r = 2.
    # Token 2: padding with old logp -1000 (exp would overflow) must change nothing.
    logprobs = leaf([[LN(4.0), LN(2.0), 0.0]])
    old = torch.tensor([[0.0, 0.0, -1000.0]])
    inp = make_input(logprobs, old, torch.tensor([[-1.0, -1.0, -1.0]]), mask=torch.tensor([[1, 1, 0]]))
    loss, metrics = policy_loss("ppo", inp, PolicyLossParams(dual_clip=3.0))
    loss.backward()
    assert loss.item() == pytest.approx((3.0 + 2.0) / 2)
    assert torch.allclose(logprobs.grad, torch.tensor([[0.0, 2.0 / 2, 0.0]]))
    assert float(metrics["dual_clip_frac"]) == pytest.approx(0.5)


def test_ppo_with_huge_eps_is_vanilla_importance_weighted_pg():
    torch.manual_seed(0)
    logprobs = (-torch.rand(3, 5) * 3).requires_grad_()
    old = logprobs.detach() + 0.5 * torch.randn(3, 5)
    adv = torch.randn(3, 5)
    mask = torch.rand(3, 5) > 0.3
    loss, _ = policy_loss("ppo", make_input(logprobs, old, adv, mask), PolicyLossParams(eps_low=1e6, eps_high=1e6))
    (grad,) = torch.autograd.grad(loss, logprobs)
    vanilla = (-(adv * torch.exp(logprobs - old))[mask]).sum() / mask.sum()  # -A * ratio, token mean
    (vanilla_grad,) = torch.autograd.grad(vanilla, logprobs)
    assert torch.allclose(loss, vanilla, atol=1e-6)
    assert torch.allclose(grad, vanilla_grad, atol=1e-6)


def test_on_policy_ppo_gradient_is_reinforce():
    # A tiny softmax policy over 6 tokens; 2 sequences x 4 sampled tokens.
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 6, requires_grad=True)
    tokens = torch.randint(0, 6, (2, 4))
    adv = torch.randn(2, 1).expand(2, 4)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])

    def sampled_logprobs():
        return torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)

    logprobs = sampled_logprobs()
    loss, _ = policy_loss("ppo", make_input(logprobs, logprobs.detach(), adv, mask))
    (ppo_grad,) = torch.autograd.grad(loss, logits)
    # REINFORCE: -(1/N) sum_t A_t logp_t over the 6 trained tokens.
    reinforce = -(adv * sampled_logprobs())[mask.bool()].sum() / 6
    (reinforce_grad,) = torch.autograd.grad(reinforce, logits)
    assert torch.allclose(ppo_grad, reinforce_grad, atol=1e-7)


# ----------------------------------------------------------------------------- CISPO


def test_cispo_keeps_gradient_of_clipped_tokens():
    # The cispo preset's bounds: eps_low 1.0 (no lower bound), eps_high 4.0.
    # Token 0: logp -0.5, old -3.5: ratio e^3 = 20.1 > 1 + 4, weight truncated to 5; A = +1.
    #   loss = -5 * 1 * (-0.5) = 2.5, gradient -w A = -5.
    # Token 1: on-policy (ratio 1, weight 1), logp -1, A = -2: loss -1 * (-2) * (-1) = -2, gradient 2.
    # token_mean over 2: (2.5 - 2) / 2 = 0.25, gradients [-2.5, 1].
    logprobs = leaf([[-0.5, -1.0]])
    inp = make_input(logprobs, torch.tensor([[-3.5, -1.0]]), torch.tensor([[1.0, -2.0]]))
    loss, metrics = policy_loss("cispo", inp, PolicyLossParams(eps_low=1.0, eps_high=4.0))
    loss.backward()
    assert loss.item() == pytest.approx(0.25, abs=1e-6)
    assert torch.allclose(logprobs.grad, torch.tensor([[-2.5, 1.0]]))
    assert float(metrics["clip_frac_high"]) == pytest.approx(0.5)
    # The same inputs under PPO: token 0 is clipped high and gets no gradient at all.
    logprobs_ppo = leaf([[-0.5, -1.0]])
    loss, _ = policy_loss("ppo", make_input(logprobs_ppo, inp.old_logprobs, inp.advantages))
    loss.backward()
    assert float(logprobs_ppo.grad[0, 0]) == 0.0
    assert float(logprobs.grad[0, 0]) != 0.0


# ----------------------------------------------------------------------------- GSPO


def test_gspo_sequence_ratio_and_gradient():
    # Row 0: token log-ratios 0.2 and -0.1 -> s_0 = exp(mean 0.05) = 1.0512711, A = +1.
    # Row 1: one real token, log-ratio 0.3 -> s_1 = exp(0.3) = 1.3498588, A = -1; then padding.
    logprobs = leaf([[-1.0, -2.0], [-0.5, 0.0]])
    old = torch.tensor([[-1.2, -1.9], [-0.8, -50.0]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    wide = PolicyLossParams(eps_low=10.0, eps_high=10.0, aggregation="seq_mean_token_mean")
    loss, metrics = policy_loss("gspo", make_input(logprobs, old, adv, mask, normaliser=2.0), wide)
    loss.backward()
    # Unclipped, per-sequence mean: row 0 -> -s_0 A = -1.0512711, row 1 -> +1.3498588;
    # summed over 2 sequences / 2 = 0.1492939.
    assert loss.item() == pytest.approx(0.1492939, abs=1e-6)
    # Sequence GSPO: d(-A s_i)/d logp_t = -A s_i / |y_i|, then / 2 sequences:
    #   row 0: -1.0512711 / 2 / 2 = -0.2628178 per token; row 1: +1.3498588 / 1 / 2 = 0.6749294.
    assert torch.allclose(logprobs.grad, torch.tensor([[-0.2628178, -0.2628178], [0.6749294, 0.0]]), atol=1e-6)
    # Metrics follow the aggregation: mean over sequences of token means, (1.0512711 + 1.3498588) / 2
    assert float(metrics["ratio_mean"]) == pytest.approx((1.0512711 + 1.3498588) / 2, abs=1e-6)

    # Paper eps (3e-4 / 4e-4, the gspo preset's): row 0 (s > 1.0004, A > 0) and row 1 (A < 0, s > 1 so not
    # the low clip; -min(-s, -clip(s)) = s, unclipped) -> row 0 loses its gradient only.
    logprobs.grad = None
    loss, metrics = policy_loss("gspo", make_input(logprobs, old, adv, mask, normaliser=2.0),
                                PolicyLossParams(eps_low=3e-4, eps_high=4e-4, aggregation="seq_mean_token_mean"))
    loss.backward()
    # (-1.0004 + 1.3498588) / 2 = 0.1747294
    assert loss.item() == pytest.approx(0.1747294, abs=1e-6)
    assert torch.allclose(logprobs.grad[0], torch.zeros(2))
    assert float(metrics["clip_frac_high"]) == pytest.approx(0.5)  # row 0 all clipped, row 1 not: (1 + 0) / 2


# ----------------------------------------------------------------------------- extras


def test_kl_and_entropy_terms():
    # On-policy, A = 0, so the PG term is 0. ref: k1 = [-1 - (-1.5), -2 - (-2)] = [0.5, 0];
    # token_mean over 2 = 0.25, x kl_coef 0.1 = 0.025. Entropy [1, 3] mean 2, x 0.01 = 0.02.
    # loss = 0 + 0.025 - 0.02 = 0.005; d/dlogp of the KL term: 0.1 * 1 / 2 = 0.05 per token.
    logprobs = leaf([[-1.0, -2.0]])
    inp = make_input(logprobs, logprobs.detach(), torch.zeros(1, 2),
                     ref_logprobs=torch.tensor([[-1.5, -2.0]]), entropy=torch.tensor([[1.0, 3.0]]))
    params = PolicyLossParams(kl_coef=0.1, kl_estimator="k1", entropy_coef=0.01)
    loss, metrics = policy_loss("ppo", inp, params)
    loss.backward()
    assert loss.item() == pytest.approx(0.005, abs=1e-7)
    assert torch.allclose(logprobs.grad, torch.tensor([[0.05, 0.05]]))
    assert float(metrics["kl_ref"]) == pytest.approx(0.25)
    assert float(metrics["entropy"]) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss("ppo", make_input(logprobs, logprobs.detach(), torch.zeros(1, 2)), params)


def test_truncated_importance_sampling():
    # old - behaviour = [ln 2, -ln 2] -> weights [2, 0.5]; cap 1.5 -> [1.5, 0.5].
    # On-policy with A = 1: per-token PPO loss -1 each, weighted [-1.5, -0.5], / 2 = -1.0,
    # gradient -A w / 2 = [-0.75, -0.25].
    logprobs = leaf([[-1.0, -1.0]])
    behaviour = torch.tensor([[-1.0 - LN(2.0), -1.0 + LN(2.0)]])
    inp = make_input(logprobs, logprobs.detach(), torch.ones(1, 2), behaviour_logprobs=behaviour)
    loss, metrics = policy_loss("ppo", inp, PolicyLossParams(off_policy_correction="tis", off_policy_cap=1.5))
    loss.backward()
    assert loss.item() == pytest.approx(-1.0, abs=1e-6)
    assert torch.allclose(logprobs.grad, torch.tensor([[-0.75, -0.25]]))
    assert float(metrics["off_policy/truncated_frac"]) == pytest.approx(0.5)
    assert float(metrics["off_policy/dropped_frac"]) == 0.0
    assert float(metrics["off_policy/weight_mean"]) == pytest.approx(1.0)
    assert "behaviour_kl" not in metrics  # the mismatch has one home: logprob_mismatch/kl (oxrl/loops/rl_update.py)
    with pytest.raises(ValueError, match="behaviour_logprobs"):
        policy_loss("ppo", make_input(leaf([[0.0]]), torch.zeros(1, 1), torch.ones(1, 1)),
                    PolicyLossParams(off_policy_correction="tis"))


@pytest.mark.parametrize("correction, cap, loss_value, grad, weight_mean, dropped", [
    # decoupled PPO, cap 1.5: the token with w = 2 > 1.5 is dropped, the other weighted by 0.5:
    # loss (0 - 0.5) / 2 = -0.25, gradient -A w / 2 = [0, -0.25]; weight mean over trained tokens (0 + 0.5) / 2.
    ("decoupled", 1.5, -0.25, [0.0, -0.25], 0.25, 0.5),
    # decoupled, cap 2.5: both kept at their full weights [2, 0.5]: loss -2.5 / 2, gradient [-1, -0.25].
    ("decoupled", 2.5, -1.25, [-1.0, -0.25], 1.25, 0.0),
    # IcePop's two-sided mask, cap 1.5: 2 > 1.5 and 0.5 < 1/1.5, both dropped: no loss, no gradient.
    ("mask", 1.5, 0.0, [0.0, 0.0], 0.0, 1.0),
    # mask, cap 2.5: both inside [0.4, 2.5], weighted as decoupled.
    ("mask", 2.5, -1.25, [-1.0, -0.25], 1.25, 0.0),
])
def test_decoupled_and_masked_corrections_by_hand(correction, cap, loss_value, grad, weight_mean, dropped):
    logprobs = leaf([[-1.0, -1.0]])
    behaviour = torch.tensor([[-1.0 - LN(2.0), -1.0 + LN(2.0)]])  # w = pi_old / mu = [2, 0.5]
    inp = make_input(logprobs, logprobs.detach(), torch.ones(1, 2), behaviour_logprobs=behaviour)
    loss, metrics = policy_loss("ppo", inp, PolicyLossParams(off_policy_correction=correction, off_policy_cap=cap))
    loss.backward()
    assert loss.item() == pytest.approx(loss_value, abs=1e-6)
    assert torch.allclose(logprobs.grad, torch.tensor([grad]), atol=1e-7)
    assert float(metrics["off_policy/weight_mean"]) == pytest.approx(weight_mean)
    assert float(metrics["off_policy/dropped_frac"]) == pytest.approx(dropped)
    assert float(metrics["off_policy/truncated_frac"]) == 0.0


def test_a_sequence_beyond_the_kl_bound_is_dropped_whole():
    # Row 0: w = [2, 0.5], k3 = w - ln w - 1 = [0.3069, 0.1931], mean 0.25 > 0.2: dropped. Row 1: w = [1, 1], KL 0.
    # Kept: row 1's two tokens, weight 1, PPO on-policy loss -1 each; token_mean over the step's 4 tokens: -0.5.
    logprobs = leaf([[-1.0, -1.0], [-1.0, -1.0]])
    behaviour = torch.tensor([[-1.0 - LN(2.0), -1.0 + LN(2.0)], [-1.0, -1.0]])
    inp = make_input(logprobs, logprobs.detach(), torch.ones(2, 2), behaviour_logprobs=behaviour)
    params = PolicyLossParams(off_policy_correction="tis", off_policy_cap=4.0, off_policy_max_kl=0.2)
    loss, metrics = policy_loss("ppo", inp, params)
    loss.backward()
    assert loss.item() == pytest.approx(-0.5, abs=1e-6)
    assert torch.allclose(logprobs.grad, torch.tensor([[0.0, 0.0], [-0.25, -0.25]]))
    assert float(metrics["off_policy/dropped_frac"]) == pytest.approx(0.5)
    loose = policy_loss("ppo", inp, dataclasses.replace(params, off_policy_max_kl=0.3))[1]
    assert float(loose["off_policy/dropped_frac"]) == 0.0


@pytest.mark.parametrize("correction", ["tis", "decoupled", "mask"])
@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_overflowing_weights_never_give_nan(name, correction):
    """A token the behaviour policy found all but impossible (w = exp(1e30)) and padding holding inf/NaN: the loss
    and its gradient stay finite; the overflowing token is truncated (tis) or dropped."""
    logprobs = leaf([[-1.0, -1.0, -1.0]])
    old = torch.tensor([[-1.0, -1.0, float("nan")]])
    behaviour = torch.tensor([[-1e30, -1.0, float("-inf")]])
    mask = torch.tensor([[True, True, False]])
    inp = make_input(logprobs, old, torch.ones(1, 3), mask, behaviour_logprobs=behaviour)
    params = PolicyLossParams(off_policy_correction=correction, off_policy_cap=2.0, off_policy_max_kl=None)
    loss, metrics = policy_loss(name, inp, params)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logprobs.grad).all()
    assert all(torch.isfinite(value) for value in metrics.values())
    assert logprobs.grad[0, 2] == 0.0


def test_unknown_correction_and_bad_bounds_are_refused():
    with pytest.raises(ValueError, match="valid: none, tis, decoupled, mask"):
        PolicyLossParams(off_policy_correction="clip")
    with pytest.raises(ValueError, match="off_policy_cap must be > 1"):
        PolicyLossParams(off_policy_cap=1.0)


# ----------------------------------------------------------------------------- accumulation


@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS))
@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_one_call_equals_sum_of_per_sequence_calls(name, aggregation):
    """Gradient accumulation exactness: 1 call over 8 sequences == 8 calls of 1, same normaliser
    (loss, gradient and metrics)."""
    torch.manual_seed(0)
    batch, length = 8, 6
    logprobs = (-torch.rand(batch, length) * 3).requires_grad_()
    old = logprobs.detach() + 0.3 * torch.randn(batch, length)
    adv = torch.randn(batch, 1).expand(batch, length)
    lengths = torch.tensor([6, 1, 3, 5, 2, 6, 4, 3])
    mask = torch.arange(length)[None, :] < lengths[:, None]
    extra = dict(ref_logprobs=old - 0.1, entropy=torch.rand(batch, length), behaviour_logprobs=old + 0.05)
    params = PolicyLossParams(aggregation=aggregation, max_len=length, kl_coef=0.05, entropy_coef=0.01,
                              off_policy_correction="tis", dual_clip=3.0)
    normaliser = local_normaliser(mask, aggregation)  # the step's count, shared by every micro-batch

    loss_all, metrics_all = policy_loss(name, make_input(logprobs, old, adv, mask, normaliser, **extra), params)
    (grad_all,) = torch.autograd.grad(loss_all, logprobs)

    loss_sum, grad_sum = torch.zeros(()), torch.zeros_like(logprobs)
    metrics_sum = dict.fromkeys(metrics_all, 0.0)
    for b in range(batch):
        row = slice(b, b + 1)
        micro_logprobs = logprobs.detach()[row].clone().requires_grad_()
        micro = make_input(micro_logprobs, old[row], adv[row], mask[row], normaliser,
                           **{key: value[row] for key, value in extra.items()})
        loss, metrics = policy_loss(name, micro, params)
        loss.backward()
        loss_sum = loss_sum + loss.detach()
        metrics_sum = {key: total + metrics[key] for key, total in metrics_sum.items()}
        grad_sum[row] = micro_logprobs.grad
    assert torch.allclose(loss_all, loss_sum, atol=1e-6)
    assert torch.allclose(grad_all, grad_sum, atol=1e-7)
    for key, value in metrics_all.items():  # metrics are additive too: sum, don't average
        assert torch.allclose(value, metrics_sum[key], atol=1e-6), key
