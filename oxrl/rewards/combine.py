"""Several rewards, weighted, as one function of a batch; failures stop the run or are counted, never hidden.

    reward_fn = build_reward_fn([RewardSpec("math"), RewardSpec("format", weight=0.1)])
    out = reward_fn(prompts, completions, fields=[{"answer": "19"}, ...])
    out.totals        # [N] sum over rewards of weight * score, what the advantage estimator uses
    out.components    # {"math": [N], "format": [N]}: unweighted scores, for metrics
    out.metrics()     # {"reward/total": mean, "reward/math": mean, "reward/math/failures": 0, ...}

Spec `kwargs` are passed unchanged to every call (e.g. `{"cpu_seconds": 2}` for `code`); row fields
are passed per sample (as lists for `@batched` rewards). They are checked when the reward is built, before
any model loads: a kwarg the function does not take (it has no `**kwargs`), or one named like an argument
oxRL passes itself (the prompt and completion parameters, `completion_ids`), is an error naming the reward,
the key and the names it takes; then the reward's own `preflight` runs (`code`, `judge`, `reward_model`). A
name that is both a kwarg and a row field is an error, not a silent override.

Each call of every reward, built-in or not, is bounded by the spec's `timeout_s` (`rl.reward_timeout_s`); a
call that overruns stops the run with a `RewardTimeoutError` (see `oxrl.rewards.base.call_with_timeout`).
The limit is per call, and a call of a `@batched` reward scores the whole batch: it must exceed what the
reward legitimately needs for one (for `code`, up to ceil(batch / max_workers) x tests x wall_seconds; for an
HTTP `judge`, up to ceil(batch / concurrency) x (retries + 1) x timeout_s plus the backoffs). Only `math` in
the main thread runs without it, under math-verify's own alarms (`oxrl.rewards.base.signal_timed`).
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from oxrl.rewards.base import (
    RewardError,
    RewardFn,
    RewardLoadError,
    RewardTimeoutError,
    call_with_timeout,
    is_batched,
    load_reward_fn,
    time_limit,
)

# Built-in rewards by config name, each imported only by a run that names it (a `math` run loads no sandbox,
# judge or reward model); an extension adds its functions themselves (oxrl/extensions.py). Anything else
# is loaded as a dotted or file path.
REWARDS: dict[str, str | RewardFn] = {
    "math": "oxrl.rewards.math_reward:math_reward",
    "format": "oxrl.rewards.format_reward:format_reward",
    "code": "oxrl.rewards.code_reward:code_reward",
    "reasoning_gym": "oxrl.rewards.gym_reward:reasoning_gym_reward",
    "judge": "oxrl.rewards.judge:judge_reward",
    "reward_model": "oxrl.rewards.reward_model_reward:reward_model_reward",
}

EXCERPT_CHARS = 300
TOKEN_IDS = "completion_ids"  # the keyword a per-token reward takes
DEFAULT_TIMEOUT_S = 300.0  # rl.reward_timeout_s's default


@dataclass
class RewardSpec:
    """One reward in the mix: `name` is a built-in (`REWARDS`) or a reference (`pkg.mod:fn`, `file.py:fn`)."""

    name: str
    weight: float = 1.0
    kwargs: dict[str, Any] = field(default_factory=dict)
    # "raise": a failing reward stops the run with a RewardError showing the sample.
    # "zero": it scores 0 for that sample; failures are counted in the metrics and logged.
    on_error: Literal["raise", "zero"] = "raise"
    label: str | None = None  # metric name; default: the built-in name or the function's name
    # Seconds one call of the reward may take (None: no limit).
    timeout_s: float | None = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.on_error not in ("raise", "zero"):
            raise ValueError(f"reward {self.name!r}: on_error must be 'raise' or 'zero', got {self.on_error!r}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"reward {self.name!r}: timeout_s must be a positive number of seconds or None, got {self.timeout_s}")
        if not math.isfinite(self.weight):
            raise ValueError(f"reward {self.name!r}: weight must be a finite number, got {self.weight}")


@dataclass
class RewardOutput:
    totals: list[float]  # [N] weighted sum per sample (a per-token reward counts with its sum)
    components: dict[str, list[float]]  # label -> [N] unweighted scores (sums, for per-token rewards)
    failures: dict[str, int]  # label -> samples scored 0 because the reward raised (on_error="zero")
    seconds: dict[str, float]  # label -> wall time spent in that reward
    # Per sample: the weighted sum of the per-token rewards, one value per completion token, or None when
    # every reward scored the sample as a whole. Part of `totals` already.
    token_rewards: list[list[float] | None] = field(default_factory=list)

    @classmethod
    def concat(cls, parts: list[RewardOutput]) -> RewardOutput:
        """The scores of consecutive slices of one batch (e.g. scored by parallel reward workers) as one output:
        per-sample lists in order, failures summed, seconds the slowest part's (the parts ran at the same time)."""
        labels = list(parts[0].components) if parts else []
        return cls([t for p in parts for t in p.totals],
                   {label: [s for p in parts for s in p.components[label]] for label in labels},
                   {label: sum(p.failures[label] for p in parts) for label in labels},
                   {label: max(p.seconds[label] for p in parts) for label in labels},
                   [r for p in parts for r in (p.token_rewards or [None] * len(p.totals))])

    def subset(self, indices: list[int]) -> RewardOutput:
        """The samples at `indices`, in that order; failures and seconds stay the whole batch's."""
        token_rewards = self.token_rewards or [None] * len(self.totals)
        return RewardOutput([self.totals[i] for i in indices],
                            {label: [scores[i] for i in indices] for label, scores in self.components.items()},
                            dict(self.failures), dict(self.seconds), [token_rewards[i] for i in indices])

    def metrics(self, prefix: str = "reward") -> dict[str, float]:
        out = {f"{prefix}/total": _mean(self.totals)}
        for label, scores in self.components.items():
            out[f"{prefix}/{label}"] = _mean(scores)
            out[f"{prefix}/{label}/failures"] = float(self.failures[label])
            out[f"{prefix}/{label}/seconds"] = self.seconds[label]
        return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


class CombinedReward:
    """Callable returned by `build_reward_fn`: `(prompts, completions, fields, origins) -> RewardOutput`."""

    def __init__(self, rewards: list[BoundReward]):
        self.rewards = rewards

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        fields: Sequence[dict[str, Any]] | None = None,
        origins: Sequence[str] | None = None,
        completion_ids: Sequence[list[int]] | None = None,
    ) -> RewardOutput:
        """Score a batch. `fields[i]` is sample i's row fields; `origins[i]` (e.g. "gsm8k.jsonl row 12") goes into error
        messages; `completion_ids[i]`, sample i's sampled token ids, go to rewards that name `completion_ids`."""
        rows = list(fields) if fields is not None else [{} for _ in prompts]
        if not len(prompts) == len(completions) == len(rows) or (origins is not None and len(origins) != len(prompts)):
            raise ValueError(
                f"prompts ({len(prompts)}), completions ({len(completions)}), fields ({len(rows)}) "
                f"and origins ({'-' if origins is None else len(origins)}) must have the same length"
            )
        batch = _Batch(list(prompts), list(completions), rows, list(origins) if origins is not None else None,
                       list(completion_ids) if completion_ids is not None else None)
        totals = [0.0] * len(batch.prompts)
        token_rewards: list[list[float] | None] = [None] * len(batch.prompts)
        components, failures, seconds = {}, {}, {}
        for reward in self.rewards:
            start = time.perf_counter()
            scores, failures[reward.label] = reward.score(batch)
            seconds[reward.label] = time.perf_counter() - start
            components[reward.label] = [sum(score) if isinstance(score, list) else score for score in scores]
            totals = [total + reward.weight * score for total, score in zip(totals, components[reward.label])]
            for index, score in enumerate(scores):
                if isinstance(score, list):
                    token_rewards[index] = _add_per_token(token_rewards[index], score, reward, batch, index)
        return RewardOutput(totals, components, failures, seconds, token_rewards)


def build_reward_fn(specs: Sequence[RewardSpec | dict[str, Any] | str]) -> CombinedReward:
    """Resolve every reward now (typos and missing files fail before any compute is spent)."""
    if not specs:
        raise ValueError("no rewards given: name at least one (built-ins: " + ", ".join(sorted(REWARDS)) + ")")
    bound = [BoundReward.from_spec(_as_spec(spec)) for spec in specs]
    labels = [reward.label for reward in bound]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise ValueError(f"several rewards are called {duplicates}: give each a distinct `label`")
    return CombinedReward(bound)


def _as_spec(spec: RewardSpec | dict[str, Any] | str) -> RewardSpec:
    if isinstance(spec, RewardSpec):
        return spec
    if isinstance(spec, str):
        return RewardSpec(name=spec)
    return RewardSpec(**spec)


def resolve_reward(name: str) -> RewardFn:
    """A built-in reward by name, else the function a dotted/file reference names."""
    if name in REWARDS:
        return REWARDS[name] if callable(REWARDS[name]) else load_reward_fn(REWARDS[name])
    if ":" in name or "." in name or "/" in name:
        return load_reward_fn(name)
    raise RewardLoadError(
        f"unknown reward {name!r}: the built-ins are {sorted(REWARDS)}; a reward of your own is named "
        "`pkg.module:function` or `path/to/file.py:function`"
    )


@dataclass
class _Batch:
    prompts: list[str]
    completions: list[str]
    rows: list[dict[str, Any]]
    origins: list[str] | None
    completion_ids: list[list[int]] | None = None  # for per-token rewards, which name `completion_ids`


@dataclass
class BoundReward:
    fn: RewardFn
    label: str
    weight: float
    kwargs: dict[str, Any]
    on_error: str
    batched: bool
    takes_all_fields: bool  # the function has **fields
    field_names: frozenset[str]  # the keyword parameters it names
    timeout_s: float | None = None  # per call (None: no limit)

    @classmethod
    def from_spec(cls, spec: RewardSpec) -> BoundReward:
        fn = resolve_reward(spec.name)
        label = spec.label or (spec.name if spec.name in REWARDS else getattr(fn, "__name__", spec.name))
        takes_all, names, passed = _keyword_parameters(fn, spec.name)
        check_kwargs(spec.name, spec.kwargs, takes_all, names, passed)
        if hasattr(fn, "preflight"):  # e.g. `code` checks its kwargs and its sandbox now, before the model loads
            fn.preflight(**spec.kwargs)
        return cls(fn, label, spec.weight, dict(spec.kwargs), spec.on_error, is_batched(fn), takes_all, names,
                   spec.timeout_s)

    def score(self, batch: _Batch) -> tuple[list[float | list[float]], int]:
        """Scores for the batch and the number of samples that failed (scored 0, only with on_error="zero")."""
        clash = sorted({key for row in batch.rows for key in row if self._takes(key)} & set(self.kwargs))
        if clash:  # a configuration error, whatever on_error says
            raise RewardLoadError(f"{clash} are both row fields and kwargs of reward {self.label!r}: rename one")
        size = len(batch.prompts)
        if not (self.batched and size > 1):
            return self._score_one_by_one(batch)
        try:
            return self._call(batch, range(size)), 0
        except RewardError:
            # The reward's verdict on the whole batch (a timeout, a judge that does not follow its rubric): scoring
            # the samples one by one would only repeat it, once per sample.
            raise
        except Exception as batch_error:  # noqa: BLE001 - find the failing samples: score them one at a time
            scores, failures = self._score_one_by_one(batch)
            if failures == 0:  # each sample scores alone but not together: a bug in the batched reward itself
                raise RewardError(self._describe(batch_error, batch, 0, f"a batch of {size} (its first sample)")) from batch_error
            return scores, failures

    def _takes(self, key: str) -> bool:
        return self.takes_all_fields or key in self.field_names

    def _score_one_by_one(self, batch: _Batch) -> tuple[list[float | list[float]], int]:
        scores: list[float | list[float]] = []
        failed: list[str] = []
        for index in range(len(batch.prompts)):
            try:
                scores.extend(self._call(batch, [index]))
            except RewardTimeoutError:
                raise  # on_error does not apply: the hung call keeps running in the background
            except Exception as error:  # noqa: BLE001 - raised with the sample, or counted and logged
                description = self._describe(error, batch, index, f"sample {index + 1} of {len(batch.prompts)}")
                # A missing package fails every sample alike: scoring them all 0 would hide it.
                if self.on_error == "raise" or isinstance(error, ImportError):
                    raise RewardError(description) from error
                failed.append(description)
                scores.append(0.0)
        if failed:  # logged; every sample failed: the run stops (off the path of a run whose rewards never fail)
            from oxrl.rewards.failures import report_failures
            report_failures(self.label, failed, len(scores))
        return scores, len(failed)

    def _call(self, batch: _Batch, indices: Sequence[int]) -> list[float | list[float]]:
        rows = [batch.rows[i] for i in indices]
        if TOKEN_IDS in self.field_names:  # asked for by name only: `**fields` rewards get the row's fields alone
            rows = [{**row, TOKEN_IDS: batch.completion_ids[i] if batch.completion_ids else None}
                    for row, i in zip(rows, indices)]
        passed = [key for key in dict.fromkeys(key for row in rows for key in row) if self._takes(key)]
        if self.batched:
            per_field = {key: [row.get(key) for row in rows] for key in passed}
            what = f"reward {self.label!r} on a batch of {len(indices)}"
            call = functools.partial(self.fn, [batch.prompts[i] for i in indices],
                                     [batch.completions[i] for i in indices], **per_field, **self.kwargs)
            values = call_with_timeout(call, time_limit(self.fn, self.timeout_s), what)
            if not isinstance(values, Sequence) or len(values) != len(indices):
                raise TypeError(f"a @batched reward must return a list of {len(indices)} scores, got {values!r:.100}")
        else:
            (index,), (row,) = indices, rows
            selected = {key: row[key] for key in passed}
            origin = f" ({batch.origins[index]})" if batch.origins else ""
            what = f"reward {self.label!r} on sample {index + 1} of {len(batch.prompts)}{origin}"
            call = functools.partial(self.fn, batch.prompts[index], batch.completions[index], **selected, **self.kwargs)
            values = [call_with_timeout(call, time_limit(self.fn, self.timeout_s), what)]
        return [_as_score(value) for value in values]

    def _describe(self, error: BaseException, batch: _Batch, index: int, where: str) -> str:
        """One line (the console's error line): the reward, the sample, what it raised, and what to do."""
        origin = f" ({batch.origins[index]})" if batch.origins else ""
        fields = ", ".join(f"{key}={_excerpt(repr(value), 120)}" for key, value in batch.rows[index].items())
        cause = " ".join(f"{type(error).__name__}: {error}".split())
        if isinstance(error, ImportError):
            advice = "install the missing package"
        else:
            advice = "fix the reward or the data; with `rl.on_reward_error: zero` such samples score 0 and are counted instead"
        return (
            f"reward {self.label!r} failed on {where}{origin}: {cause}; "
            f"prompt {_excerpt(batch.prompts[index])!r}, completion {_excerpt(batch.completions[index])!r}, "
            f"fields {fields or '-'} "
            f"{_THREAD_HINT if 'signal only works in main thread' in str(error) else ''}"
            f"({advice})"
        )


_THREAD_HINT = (
    "(a reward runs in a worker thread under rl.reward_timeout_s, where signal-based timeouts fail: turn them "
    "off, e.g. math-verify's `parsing_timeout=None, timeout_seconds=None`) "
)


def check_kwargs(name: str, kwargs: dict[str, Any], takes_all: bool, names: frozenset[str],
                 passed: frozenset[str]) -> None:
    """A reward's kwargs, before it is ever called: each one a parameter it takes, none one that oxRL passes."""
    reserved = sorted(set(kwargs) & passed)
    if reserved:
        raise RewardLoadError(f"reward {name!r}: kwarg(s) {reserved} name what oxRL passes itself (the prompt, the "
                              f"completion, `{TOKEN_IDS}`); rename them, or read them from the row")
    unknown = sorted(set(kwargs) - names) if not takes_all else []
    if unknown:
        raise RewardLoadError(f"reward {name!r} takes no argument(s) {unknown}; it takes {sorted(names)}")


def _keyword_parameters(fn: Callable[..., Any], name: str) -> tuple[bool, frozenset[str], frozenset[str]]:
    """(takes **kwargs, names of the keyword parameters after prompt and completion, names oxRL passes: the
    prompt's and the completion's parameters and `completion_ids`)."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # some builtins and C callables have no signature: pass everything
        return True, frozenset(), frozenset({TOKEN_IDS})
    positional_kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    leading = [p for p in parameters if p.kind in positional_kinds][:2]
    if len(leading) < 2 and not any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        raise RewardLoadError(f"reward {name!r} must take (prompt, completion, **fields); its signature is {inspect.signature(fn)}")
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    names = frozenset(
        p.name for p in parameters
        if p not in leading and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    )
    passed = frozenset(p.name for p in leading if p.kind is not inspect.Parameter.POSITIONAL_ONLY) | {TOKEN_IDS}
    return takes_all, names, passed


def _as_score(value: Any) -> float | list[float]:
    """A float, or one float per completion token (a list, tuple or 1-D array / tensor)."""
    if isinstance(value, (list, tuple)) or getattr(value, "ndim", None) == 1:
        return [_as_float(item) for item in (value.tolist() if hasattr(value, "tolist") else value)]
    return _as_float(value)


def _as_float(value: Any) -> float:
    # bool is a numbers.Real too: True/False score 1/0, which is what a checker returning a bool means.
    if not isinstance(value, numbers.Real):
        raise TypeError(f"a reward must return a float (or one float per completion token), got "
                        f"{type(value).__name__} {value!r:.100}")
    score = float(value)
    if not math.isfinite(score):
        raise ValueError(f"a reward must return a finite float, got {score}")
    return score


def _add_per_token(running: list[float] | None, scores: list[float], reward: BoundReward, batch: _Batch,
                   index: int) -> list[float]:
    """`running` + weight x the per-token `scores` of sample `index`, which must match its token count."""
    ids = batch.completion_ids[index] if batch.completion_ids is not None else None
    if ids is None or len(ids) != len(scores):
        tokens = "no token ids were passed" if ids is None else f"the completion has {len(ids)} tokens"
        raise RewardError(f"reward {reward.label!r} returned {len(scores)} per-token values for sample {index + 1}, but "
                          f"{tokens}: a per-token reward takes `completion_ids` and returns one float per id")
    weighted = [reward.weight * score for score in scores]
    return weighted if running is None else [a + b for a, b in zip(running, weighted)]


def _excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """Head and tail of a long text: the end of a completion is where its answer is."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    return f"{text[:head]} [... {len(text) - limit} chars ...] {text[-(limit - head):]}"
