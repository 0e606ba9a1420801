"""Pairwise preference losses: values derived by hand on inputs chosen so that every sigmoid is
1/2, 3/4 or 1/4 (sigmoid(0) = 1/2, sigmoid(ln 3) = 3 / (3 + 1) = 3/4, sigmoid(-ln 3) = 1/4)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from oxrl.algorithms.preference import (
    PREFERENCE_LOSSES,
    BetaParams,
    DPOParams,
    IPOParams,
    ORPOParams,
    PreferenceInput,
    RDPOParams,
    SimPOParams,
    preference_loss,
)

LN2, LN3 = math.log(2.0), math.log(3.0)


def params_for(name: str, **values):
    """`name`'s own parameter class, with those of `values` it has (the others belong to other losses)."""
    params_class = PREFERENCE_LOSSES[name].params
    own = {field.name for field in dataclasses.fields(params_class)}
    return params_class(**{key: value for key, value in values.items() if key in own})


def t(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def make_pairs(chosen, rejected, ref_chosen=None, ref_rejected=None, chosen_tokens=None, rejected_tokens=None, chosen_nll=None):
    n = len(chosen)
    return PreferenceInput(
        chosen_logps=t(chosen),
        rejected_logps=t(rejected),
        chosen_tokens=t(chosen_tokens or [1.0] * n),
        rejected_tokens=t(rejected_tokens or [1.0] * n),
        ref_chosen_logps=None if ref_chosen is None else t(ref_chosen),
        ref_rejected_logps=None if ref_rejected is None else t(ref_rejected),
        chosen_nll=None if chosen_nll is None else t(chosen_nll),
    )


# Pair A: chosen log-ratio (-1) - (-1 - 2 ln 3) = 2 ln 3, rejected log-ratio 0, so h = 2 ln 3 and,
# with beta = 1/2, beta h = ln 3.  Pair B: both log-ratios are 1, so h = 0.
PAIR_A_AND_B = dict(chosen=[-1.0, -2.0], ref_chosen=[-1.0 - 2 * LN3, -3.0], rejected=[-4.0, -5.0], ref_rejected=[-4.0, -6.0])


def test_dpo_hand_values_and_summed_metrics():
    out = preference_loss("dpo", make_pairs(**PAIR_A_AND_B), DPOParams(beta=0.5))
    # A: -log sigmoid(ln 3) = -log(3/4) = ln(4/3);  B: -log sigmoid(0) = ln 2.  Sum: ln(8/3).
    assert out.loss.item() == pytest.approx(math.log(8 / 3), abs=1e-12)
    m = out.metrics
    # rewards = beta * log-ratio: chosen 0.5 * 2 ln 3 + 0.5 * 1 = ln 3 + 0.5; rejected 0 + 0.5.
    assert m["rewards/chosen"].item() == pytest.approx(LN3 + 0.5)
    assert m["rewards/rejected"].item() == pytest.approx(0.5)
    assert m["rewards/margins"].item() == pytest.approx(LN3)
    assert m["rewards/accuracy"].item() == 1.0  # A is right, B is a tie and ties count as wrong
    assert m["logps/chosen"].item() == pytest.approx(-3.0)
    assert m["logps/rejected"].item() == pytest.approx(-9.0)
    assert m["count/pairs"].item() == 2.0


@pytest.mark.parametrize("name", ["dpo", "rdpo"])
@pytest.mark.parametrize("beta", [0.1, 1.0, 5.0])
def test_zero_margin_costs_log2_per_pair(name, beta):
    # Equal log-ratios (here 0.3 each) make h = 0: sigmoid(0) = 1/2 -> ln 2, for any smoothing.
    batch = make_pairs(chosen=[-2.0, -7.0, -1.0], ref_chosen=[-2.3, -7.3, -1.3], rejected=[-4.0, -1.0, -9.0], ref_rejected=[-4.3, -1.3, -9.3])
    for eps in (0.0, 0.2):
        params = params_for(name, beta=beta, label_smoothing=eps, rdpo_epsilon=eps)
        assert preference_loss(name, batch, params).loss.item() == pytest.approx(3 * LN2, abs=1e-12)


def test_cdpo_label_smoothing_is_the_soft_label_cross_entropy():
    # Pair A alone (beta h = ln 3) and its mirror (beta h = -ln 3), eps = 1/4.
    batch = make_pairs(chosen=[-1.0, -4.0], ref_chosen=[-1.0 - 2 * LN3, -4.0], rejected=[-4.0, -1.0], ref_rejected=[-4.0, -1.0 - 2 * LN3])
    out = preference_loss("dpo", batch, DPOParams(beta=0.5, label_smoothing=0.25))
    # A: 3/4 * -log(3/4) + 1/4 * -log(1/4) = 3/4 ln(4/3) + 1/4 ln 4
    # mirror: 3/4 * -log(1/4) + 1/4 * -log(3/4) = 3/4 ln 4 + 1/4 ln(4/3)   -> sum ln(4/3) + ln 4
    assert out.loss.item() == pytest.approx(math.log(4 / 3) + math.log(4.0), abs=1e-12)


def test_cdpo_with_zero_smoothing_and_rdpo_with_zero_epsilon_are_dpo():
    torch.manual_seed(0)
    batch = PreferenceInput(*(torch.randn(6, dtype=torch.float64) for _ in range(2)), torch.ones(6), torch.ones(6), *(torch.randn(6, dtype=torch.float64) for _ in range(2)))
    dpo = preference_loss("dpo", batch, DPOParams(beta=0.3)).loss
    cdpo = preference_loss("dpo", batch, DPOParams(beta=0.3, label_smoothing=0.0)).loss
    rdpo = preference_loss("rdpo", batch, RDPOParams(beta=0.3, rdpo_epsilon=0.0)).loss
    assert torch.allclose(cdpo, dpo) and torch.allclose(rdpo, dpo)


def test_rdpo_subtracts_the_flipped_term():
    batch = make_pairs(chosen=[-1.0], ref_chosen=[-1.0 - 2 * LN3], rejected=[-4.0], ref_rejected=[-4.0])  # beta h = ln 3
    out = preference_loss("rdpo", batch, RDPOParams(beta=0.5, rdpo_epsilon=0.25))
    # [(3/4) * -log(3/4) - (1/4) * -log(1/4)] / (1 - 1/2) = 1.5 ln(4/3) - 0.5 ln 4 = ln((4/3)^1.5 / 2) ~ -0.2616
    # (adding the flipped term instead, as in cDPO, would give +1.8178).
    expected = 1.5 * math.log(4 / 3) - 0.5 * math.log(4.0)
    assert out.loss.item() == pytest.approx(expected, abs=1e-12)
    assert out.loss.item() < 0


def test_rdpo_is_unbiased_under_known_label_noise():
    # rDPO's defining property: if the observed label is right with prob 1 - eps and flipped with
    # prob eps, the expected rDPO loss is the clean DPO loss.  Pair as observed, and swapped:
    eps, params = 0.2, RDPOParams(beta=0.5, rdpo_epsilon=0.2)
    right = make_pairs(chosen=[-1.0], ref_chosen=[-1.0 - 2 * LN3], rejected=[-4.0], ref_rejected=[-4.0])
    flipped = make_pairs(chosen=[-4.0], ref_chosen=[-4.0], rejected=[-1.0], ref_rejected=[-1.0 - 2 * LN3])
    expected_loss = (1 - eps) * preference_loss("rdpo", right, params).loss + eps * preference_loss("rdpo", flipped, params).loss
    assert expected_loss.item() == pytest.approx(math.log(4 / 3), abs=1e-12)  # clean DPO: -log sigmoid(ln 3)


def test_hinge_hand_values():
    # beta = 1/2.  A: log-ratios 0.5 and 0 -> beta h = 0.25 -> 1 - 0.25 = 0.75.
    # B: log-ratios -1 and 1 -> h = -2 -> beta h = -1 -> 2.  C: h = 6 -> beta h = 3 -> max(0, -2) = 0.
    batch = make_pairs(chosen=[-1.5, -3.0, -1.0], ref_chosen=[-2.0, -2.0, -4.0], rejected=[-2.0, -1.0, -5.0], ref_rejected=[-2.0, -2.0, -2.0])
    out = preference_loss("hinge", batch, BetaParams(beta=0.5))
    assert out.loss.item() == pytest.approx(2.75, abs=1e-12)


@pytest.mark.parametrize("normalise, expected, expected_chosen_reward", [(False, 25.0, 1.0), (True, 1.0, 0.5)])
def test_ipo_sum_vs_length_normalised(normalise, expected, expected_chosen_reward):
    # beta = 1/2 so the target 1/(2 beta) = 1.  Chosen: log-ratio -4 - (-6) = 2 over 2 tokens;
    # rejected: -8 - (-4) = -4 over 4 tokens.
    # Paper (sums): h = 2 - (-4) = 6 -> (6 - 1)^2 = 25.  Normalised: h = 2/2 - (-4/4) = 2 -> (2 - 1)^2 = 1.
    batch = make_pairs(chosen=[-4.0], ref_chosen=[-6.0], rejected=[-8.0], ref_rejected=[-4.0], chosen_tokens=[2.0], rejected_tokens=[4.0])
    out = preference_loss("ipo", batch, IPOParams(beta=0.5, ipo_length_normalise=normalise))
    assert out.loss.item() == pytest.approx(expected, abs=1e-12)
    assert out.metrics["rewards/chosen"].item() == pytest.approx(expected_chosen_reward)  # 0.5 * 2 or 0.5 * 1


def test_simpo_hand_values_unequal_lengths():
    # beta = 2, gamma = 1, no reference.
    # A: chosen -3 over 3 tokens -> reward 2 * -1 = -2; rejected -3 over 2 tokens -> 2 * -1.5 = -3;
    #    logit -2 - (-3) - 1 = 0 -> ln 2.  (Sums would tie at -3 and give logit -1 instead.)
    # B: chosen -2 over 2 -> -2; rejected -6 - 2 ln 3 over 4 -> 2 * (-1.5 - ln3 / 2) = -3 - ln 3;
    #    logit -2 + 3 + ln 3 - 1 = ln 3 -> ln(4/3).   Sum: ln(8/3).
    batch = make_pairs(chosen=[-3.0, -2.0], rejected=[-3.0, -6.0 - 2 * LN3], chosen_tokens=[3.0, 2.0], rejected_tokens=[2.0, 4.0])
    out = preference_loss("simpo", batch, SimPOParams(beta=2.0, simpo_gamma=1.0))
    assert out.loss.item() == pytest.approx(math.log(8 / 3), abs=1e-12)
    assert out.metrics["rewards/chosen"].item() == pytest.approx(-4.0)
    assert out.metrics["rewards/rejected"].item() == pytest.approx(-6.0 - LN3)
    assert out.metrics["rewards/accuracy"].item() == 2.0


def test_orpo_hand_values():
    # lambda = 1/2.  Mean log-probs are logs of simple probabilities P, odds = P / (1 - P).
    # A: chosen 2 tokens at P = 1/2 (odds 1, log-odds 0); rejected 3 tokens at P = 1/4
    #    (odds 1/3, log-odds -ln 3): log odds ratio ln 3 -> -log sigmoid(ln 3) = ln(4/3).
    #    SFT term: NLL 2 ln 2 over 2 tokens = ln 2.  l_A = ln 2 + ln(4/3) / 2.
    # B: chosen 4 tokens at P = 3/4, rejected 1 token at P = 3/4: log odds ratio 0 -> ln 2;
    #    given NLL 6 over 4 tokens = 1.5.  l_B = 1.5 + ln(2) / 2.
    batch = make_pairs(
        chosen=[2 * math.log(1 / 2), 4 * math.log(3 / 4)],
        rejected=[3 * math.log(1 / 4), math.log(3 / 4)],
        chosen_tokens=[2.0, 4.0],
        rejected_tokens=[3.0, 1.0],
        chosen_nll=[2 * LN2, 6.0],
    )
    out = preference_loss("orpo", batch, ORPOParams(orpo_lambda=0.5))
    assert out.loss.item() == pytest.approx(LN2 + 0.5 * math.log(4 / 3) + 1.5 + 0.5 * LN2, abs=1e-12)
    m = out.metrics
    assert m["orpo/log_odds_ratio"].item() == pytest.approx(LN3, abs=1e-12)
    assert m["orpo/nll"].item() == pytest.approx(LN2 + 1.5, abs=1e-12)
    assert m["rewards/chosen"].item() == pytest.approx(0.5 * (math.log(1 / 2) + math.log(3 / 4)))
    assert m["rewards/accuracy"].item() == 1.0  # B ties


def test_orpo_log_odds_are_accurate_near_probability_one_and_finite_at_it():
    # fp32. Chosen mean log-prob m = -1e-6: odds = e^m / (1 - e^m) ~ (1 - 1e-6) / (1e-6 (1 - 5e-7)),
    # log odds = ln(1e6) - 5e-7 + O(1e-12) = 13.815510...; rejected P = 1/2 has log odds 0.
    # Computing 1 - exp(m) in fp32 directly loses ~1% of it (and ~0.01 of the log odds).
    batch = PreferenceInput(
        chosen_logps=torch.tensor([-1e-6]), rejected_logps=torch.tensor([math.log(0.5)]),
        chosen_tokens=torch.tensor([1.0]), rejected_tokens=torch.tensor([1.0]),
    )
    out = preference_loss("orpo", batch, ORPOParams())
    assert out.metrics["orpo/log_odds_ratio"].item() == pytest.approx(math.log(1e6) - 5e-7, abs=1e-4)
    # P = 1 exactly (m = 0) and a very unlikely rejected response: still finite, no NaN gradient.
    chosen = torch.tensor([0.0, -3.0], requires_grad=True)
    rejected = torch.tensor([-200.0, -1e-30], requires_grad=True)
    batch = PreferenceInput(chosen, rejected, torch.tensor([4.0, 3.0]), torch.tensor([2.0, 1.0]))
    out = preference_loss("orpo", batch, ORPOParams())
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(chosen.grad).all() and torch.isfinite(rejected.grad).all()


def test_dpo_gradient_hand_value_at_zero_margin():
    # d/dc -log sigmoid(beta (c - r)) = -beta (1 - sigmoid(0)) = -beta/2 at h = 0; +beta/2 for r.
    chosen = torch.tensor([-3.0], dtype=torch.float64, requires_grad=True)
    rejected = torch.tensor([-5.0], dtype=torch.float64, requires_grad=True)
    batch = PreferenceInput(chosen, rejected, t([1.0]), t([1.0]), t([-3.0]), t([-5.0]))
    preference_loss("dpo", batch, DPOParams(beta=0.4)).loss.backward()
    assert chosen.grad.item() == pytest.approx(-0.2) and rejected.grad.item() == pytest.approx(0.2)


@pytest.mark.parametrize("name", sorted(PREFERENCE_LOSSES))
def test_gradient_descent_raises_chosen_and_lowers_rejected(name):
    # At h = 0 (every loss here is in its active region) a descent step must raise log pi(y_w)
    # and lower log pi(y_l): dL/d chosen < 0 < dL/d rejected.
    chosen = torch.tensor([-3.0, -6.0], dtype=torch.float64, requires_grad=True)
    rejected = torch.tensor([-3.0, -2.0], dtype=torch.float64, requires_grad=True)
    batch = PreferenceInput(chosen, rejected, t([3.0, 6.0]), t([3.0, 2.0]), t([-3.0, -6.0]), t([-3.0, -2.0]))
    preference_loss(name, batch, params_for(name, beta=0.5)).loss.backward()
    assert (chosen.grad < 0).all() and (rejected.grad > 0).all()


@pytest.mark.parametrize("name", sorted(PREFERENCE_LOSSES))
def test_batch_equals_sum_of_single_pairs(name):
    # The loss and metrics are sums over pairs, so any split of the pairs (micro-batches, ranks)
    # adds up to the whole.
    torch.manual_seed(1)
    n = 5
    chosen, rejected = -torch.rand(n, dtype=torch.float64) * 10, -torch.rand(n, dtype=torch.float64) * 10
    tokens_c, tokens_r = torch.randint(1, 20, (n,)).double(), torch.randint(1, 20, (n,)).double()
    ref_c, ref_r = chosen + torch.randn(n, dtype=torch.float64), rejected + torch.randn(n, dtype=torch.float64)
    params = params_for(name, beta=0.7, label_smoothing=0.1, rdpo_epsilon=0.15, ipo_length_normalise=True)
    whole = preference_loss(name, PreferenceInput(chosen, rejected, tokens_c, tokens_r, ref_c, ref_r), params)
    parts = [preference_loss(name, PreferenceInput(chosen[i : i + 1], rejected[i : i + 1], tokens_c[i : i + 1], tokens_r[i : i + 1], ref_c[i : i + 1], ref_r[i : i + 1]), params) for i in range(n)]
    assert torch.allclose(whole.loss, sum(p.loss for p in parts))
    for key, value in whole.metrics.items():
        assert torch.allclose(value, sum(p.metrics[key] for p in parts)), key


def test_reference_free_losses_need_no_reference_and_the_others_refuse_to_run_without():
    needs = {name: loss.needs_reference for name, loss in PREFERENCE_LOSSES.items()}
    assert not needs["simpo"] and not needs["orpo"] and needs["dpo"]
    batch = make_pairs(chosen=[-1.0], rejected=[-2.0])
    for name, needs_reference in needs.items():
        if needs_reference:
            with pytest.raises(ValueError, match="reference"):
                preference_loss(name, batch)
        else:
            assert torch.isfinite(preference_loss(name, batch).loss)


def test_unknown_loss_lists_valid_names():
    with pytest.raises(ValueError, match="valid: .*'dpo'.*'simpo'"):
        preference_loss("dpoo", make_pairs(chosen=[-1.0], rejected=[-2.0]))


def test_bad_inputs_and_params_are_rejected():
    with pytest.raises(ValueError, match="rejected_logps"):
        PreferenceInput(t([-1.0, -2.0]), t([-1.0]), t([1.0, 1.0]), t([1.0, 1.0]))
    with pytest.raises(ValueError, match="both"):
        PreferenceInput(t([-1.0]), t([-1.0]), t([1.0]), t([1.0]), ref_chosen_logps=t([-1.0]))
    with pytest.raises(ValueError, match="rdpo_epsilon"):
        RDPOParams(rdpo_epsilon=0.5)
    with pytest.raises(ValueError, match="label_smoothing"):
        DPOParams(label_smoothing=0.7)
    with pytest.raises(ValueError, match="beta"):
        SimPOParams(beta=0.0)
    with pytest.raises(ValueError, match="orpo_lambda"):
        ORPOParams(orpo_lambda=-0.1)


def test_a_loss_takes_its_own_params_only():
    batch = make_pairs(chosen=[-1.0], rejected=[-2.0], ref_chosen=[-1.5], ref_rejected=[-1.5])
    with pytest.raises(TypeError, match="'hinge' takes BetaParams, not DPOParams"):
        preference_loss("hinge", batch, DPOParams())  # a subclass's extra field would be silently ignored
    with pytest.raises(TypeError, match="'orpo' takes ORPOParams, not BetaParams"):
        preference_loss("orpo", batch, BetaParams(beta=0.5))
