"""Extending oxRL from outside the package: four registries, a decorator for each (docs/extending.md).

A file or module that uses these decorators is an extension. A config names it at the top level,
`extensions: [my_loss.py]`, and it is imported before the rest of the config is read (in every process
that reads the config: torchrun ranks, Ray workers, a resumed run), so the names it registers are valid
choices in that same config:

    @register_advantage("name", params=MyParams)     rl.advantage: name, rl.advantage_params: {...}
    @register_policy_loss("name", params=MyParams)   rl.policy_loss: name, rl.policy_loss_params: {...}
    @register_reward("name")                         rl.rewards: [{name: name, kwargs: {...}}]
    @register_engine("name", params=MyParams)        rl.rollout.engine: name, rl.rollout.engine_params: {...}

Each decorator adds to the registry the built-ins live in, with the built-ins' own signature, so the
loop calls an extension exactly as it calls a built-in. A name that is taken is an error. `params`, a
dataclass, declares the extension's own parameters once, beside its code: the config's `*_params` mapping
is checked against it when the config loads, and the extension gets an instance of it as its last
argument (a reward's own parameters are its keyword arguments). The core never imports this module: only
extensions do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from oxrl.algorithms.advantages import ADVANTAGES
from oxrl.algorithms.policy_loss import POLICY_LOSSES, PolicyLossInput, PolicyLossParams
from oxrl.config.names import declare
from oxrl.rewards.combine import REWARDS
from oxrl.rollout.build import ENGINES

F = TypeVar("F", bound=Callable[..., Any])


def _registering(kind: str, registry: dict, name: str, info: Any = None,
                 entry: Callable[[F], Callable] = lambda fn: fn) -> Callable[[F], F]:
    """The decorator that declares `name` of `kind` (a taken name is an error) and puts `entry(fn)` in `registry`."""

    def add(fn: F) -> F:
        declare(kind, name, list(registry), info)
        registry[name] = entry(fn)
        return fn

    return add


def _own_params(kind: str, name: str, params: type | None) -> type | None:
    if params is not None and not dataclasses.is_dataclass(params):
        raise TypeError(f"{kind.replace('_', ' ')} {name!r}: params must be a dataclass of its parameters, got "
                        f"{params!r}")
    return params


def register_advantage(name: str, params: type | None = None) -> Callable[[F], F]:
    """An advantage estimator `(RolloutRewards, AdvantageParams) -> Advantages` (oxrl/algorithms/advantages.py),
    chosen by `rl.advantage: name`. It gets the token rewards, the mask and the group ids (no critic values:
    an estimator that needs a critic is not an extension yet). With `params`, a dataclass of its own
    parameters: `(RolloutRewards, AdvantageParams, own) -> Advantages`, `own` being
    `params(**rl.advantage_params)` (`outcome_on_tokens` passes it on to a per-completion estimator)."""
    if _own_params("advantage", name, params) is None:
        return _registering("advantage", ADVANTAGES, name)
    return _registering("advantage", ADVANTAGES, name, params, lambda estimator: (
        lambda rewards, shared: estimator(rewards, shared, params(**shared.advantage_params))))


def register_policy_loss(name: str, params: type | None = None) -> Callable[[F], F]:
    """A policy loss, chosen by `rl.policy_loss: name`.

    Without `params`: `(PolicyLossInput, PolicyLossParams) -> (loss, metrics)`, as the built-ins. With
    `params`, a dataclass of the loss's own parameters: `(PolicyLossInput, PolicyLossParams, own) ->
    (loss, metrics)`, where `own` is `params(**rl.policy_loss_params)`, checked when the config loads.
    `oxrl.algorithms.policy_loss.finish` applies the shared terms (truncated IS, aggregation, KL, entropy)
    to a per-token objective, as every built-in loss does."""
    if _own_params("policy_loss", name, params) is None:
        return _registering("policy_loss", POLICY_LOSSES, name)

    def with_own(loss: F) -> Callable[[PolicyLossInput, PolicyLossParams], Any]:
        return lambda inp, shared: loss(inp, shared, params(**shared.policy_loss_params))

    return _registering("policy_loss", POLICY_LOSSES, name, params, with_own)


def register_reward(name: str) -> Callable[[F], F]:
    """A reward `(prompt, completion, **row fields) -> float` (or `@batched`; oxrl/rewards/base.py), named in
    `rl.rewards` as `{name: name}` like a built-in."""
    return _registering("reward", REWARDS, name)


def register_engine(name: str, params: type | None = None) -> Callable[[F], F]:
    """A rollout engine factory `(RolloutConfig, model, tokenizer, strategy, seed, processor) -> RolloutEngine`
    (oxrl/rollout/base.py), chosen by `rl.rollout.engine: name`. With `params`, a dataclass of the engine's own
    parameters, the factory gets `params(**rl.rollout.engine_params)` last."""
    if _own_params("engine", name, params) is None:
        return _registering("engine", ENGINES, name)
    return _registering("engine", ENGINES, name, params, lambda factory: (
        lambda rollout, model, tokenizer, strategy, seed, processor=None: factory(
            rollout, model, tokenizer, strategy, seed, processor, params(**rollout.engine_params))))
