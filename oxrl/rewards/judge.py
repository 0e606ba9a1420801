"""`judge`: an LLM judge as the reward, RL from AI feedback (RLAIF, Lee et al. 2023, arXiv:2309.00267).

A judge model reads a rubric filled with the prompt and the completion and answers in text; the reward
is parsed from the reply's last line. Two modes:

- `score` (the default): the rubric asks for `Score: N`, N in 1..`scale`; reward = (N - 1) / (scale - 1),
  in [0, 1]. A rubric may also use `{reference}` (the row's reference answer) for reference-guided grading.
- `pairwise`: the judge compares the completion with the row's reference answer and answers `Verdict: A`,
  `Verdict: B` or `Verdict: tie`. Judges favour one position (Zheng et al. 2023, MT-Bench,
  arXiv:2306.05685), so each pair is judged twice, positions swapped: first A = completion,
  B = reference, then A = reference, B = completion. Win 1, tie 0.5, loss 0 for the completion; the reward
  is the mean of the two, so a judge that always says "A" gives 0.5 whatever it reads.

The judge is a local model (`model`, see `oxrl.rewards.judge_backends`) or an OpenAI-compatible server
(`url` + `model_name`); it decodes greedily, so a judgement can be cached: in memory, and in the JSONL file
`cache_path` when set, read back at start so that a resumed run does not pay twice. Keys are the judge's
identity and the rendered judge prompt; only replies that parse are cached.

Text the policy wrote is never taken for the verdict. The verdict is the reply's LAST non-empty line, and
that whole line must be the format (`Score: 7`; emphasis, brackets and a final period tolerated): a judge
that quotes the completion after its verdict leaves a last line that is not one, so the reply does not
parse, instead of scoring what the completion claimed. And a verdict that the completion itself spells
(`Score: 10`, `score of 10`, `Verdict: A` anywhere in it) is not trusted: it may be the judge echoing the
policy on its last line; such a reply fails like one that does not parse. Both sides are read in one canonical
form (`canonical_lines`: Unicode look-alikes, zero-width characters, markdown emphasis and padding of any
length), so whatever the parser could read as a verdict, the scan of the completion sees too. What no
parser can stop is a completion that talks the judge MODEL into a verdict in its own words (prompt
injection); the default rubrics tell the judge that the response is material to judge, not instructions,
which helps and guarantees nothing (docs/rewards.md).

A reply that does not parse is never scored 0 silently: the whole batch is judged first (every reply
that parses is cached), then `JudgeParseError` is raised with the reply and the sample. `oxrl.rewards.combine`
then scores the batch one sample at a time, and stops the run or counts the failures (`rl.on_reward_error`); the judge
decodes greedily, so a reply that did not parse is remembered (in memory, never in the cache file) and not asked
again. When more than `max_unparsed_fraction` of a batch's judgements do not parse (default: half), the judge does
not follow its rubric and no later batch would do better: `JudgeUnusableError` stops the run at once, naming the
judge and its first reply, whatever `rl.on_reward_error` says. Every setting is checked by `preflight`, when the reward is built, and the
local model loads there, before the policy does; `judge_for` keeps one judge per settings for the process.

The settings and default rubrics are in `oxrl.rewards.judge_settings`, the backends in
`oxrl.rewards.judge_backends`, the cache of judgements in `oxrl.rewards.judge_cache`.
"""

from __future__ import annotations

import functools
import logging
import re
import unicodedata
from collections import OrderedDict
from typing import Any

from oxrl.rewards.base import RewardError, batched
from oxrl.rewards.judge_backends import HTTPBackend, local_backend
from oxrl.rewards.judge_cache import JudgementCache
from oxrl.rewards.judge_settings import JudgeSettings

logger = logging.getLogger(__name__)

# The verdict is the reply's last non-empty line, alone in the rubric's format: `Score: 7`, `**Score:** [[7]]`,
# `Score: 7/10`, `Verdict: B.`. The line is matched in its canonical form (`canonical_lines`: markdown emphasis
# and runs of spaces collapsed to one space), so that no two neighbouring parts of these patterns can match the
# same characters: a line the policy padded (the judge may echo it) cannot make the match backtrack for minutes.
SCORE_LINE = re.compile(r"score ?[:=] ?[\[(]{0,2} ?([0-9]{1,6}(?:\.[0-9]{1,6})?) ?[\])]{0,2}(?: ?/ ?([0-9]{1,6}))?",
                        re.IGNORECASE | re.ASCII)
VERDICT_LINE = re.compile(r"(?i:verdict) ?[:=] ?[\[(]{0,2} ?(A|B|(?i:tie)) ?[\])]{0,2}", re.ASCII)
# Verdict-like text anywhere in a completion's canonical form (the same `canonical_lines` the verdict is read
# from, so padding that the parser collapses is collapsed here too), loosely: the keyword, then the value within
# a few non-alphanumeric characters (a parseable line has at most 6 there: ` : [[ `) and at most one short word
# ("score of 10", "Verdict -> B"), in either case.
SCORE_MENTION = re.compile(r"score[^a-z0-9]{0,12}(?:[a-z]{1,4}[^a-z0-9]{1,12})?([0-9]+(?:\.[0-9]+)?)",
                           re.IGNORECASE | re.ASCII)
VERDICT_MENTION = re.compile(r"verdict[^a-z0-9]{0,12}(?:[a-z]{1,4}[^a-z0-9]{1,12})?(a|b|tie)(?![a-z0-9])",
                             re.IGNORECASE | re.ASCII)
# The completion's share of one verdict, by the position it was shown in.
COMPLETION_AS_A = {"A": 1.0, "B": 0.0, "tie": 0.5}
COMPLETION_AS_B = {"A": 0.0, "B": 1.0, "tie": 0.5}
EXCERPT_CHARS = 300


MAX_UNPARSED_REMEMBERED = 4096


def remember(memory: OrderedDict, key, value=None) -> None:
    """Put `key` in `memory`, forgetting the oldest entries beyond MAX_UNPARSED_REMEMBERED."""
    memory[key] = value
    while len(memory) > MAX_UNPARSED_REMEMBERED:
        memory.popitem(last=False)


class JudgeUnusableError(RewardError):
    """Most of a batch's judgements do not parse: the judge does not follow its rubric."""


class JudgeParseError(ValueError):
    """The judge's reply holds no valid `Score: N` (or `Verdict: X`); the message shows the reply and the sample."""


def parse_score(reply: str, scale: int) -> float | None:
    """N from a last line `Score: N` (or `N/scale`), or None: no such line, or N outside 1..scale."""
    found = SCORE_LINE.fullmatch(_last_line(reply))
    if found is None or (found[2] is not None and int(found[2]) != scale):
        return None
    score = float(found[1])
    return score if 1 <= score <= scale else None


def parse_verdict(reply: str) -> str | None:
    """"A", "B" or "tie" from a last line `Verdict: X`, or None."""
    found = VERDICT_LINE.fullmatch(_last_line(reply))
    if found is None:
        return None
    return "tie" if found[1].lower() == "tie" else found[1]


def mentioned_verdicts(completion: str, mode: str) -> set[float | str]:
    """The verdicts the completion itself spells (`Score: 10`, `verdict: A`): a judge's verdict equal to one of
    them may be the judge quoting the policy, so it is not trusted."""
    # Lines joined: a judge that reflows the completion may put a claim split over lines on one.
    text = " ".join(canonical_lines(completion))
    if mode == "score":
        return {float(value) for value in SCORE_MENTION.findall(text)}
    return {"tie" if value.lower() == "tie" else value.upper() for value in VERDICT_MENTION.findall(text)}


def canonical_lines(text: str) -> list[str]:
    """The non-empty lines of `text` as verdicts are read, for both sides: the judge's reply (its last line) and the
    completion (scanned for verdicts it spells), so that whatever the parser could read as a verdict, the scan sees.

    NFKC (full-width `Ｓｃｏｒｅ：１０` reads as `Score:10`, a non-breaking space as a space), without format characters
    (zero-width spaces), so that look-alikes parse, and are recognised as mentions, like what they look like; then
    each line without markdown emphasis (`*`, `_`, `#`), each run of spaces (tabs, any Unicode space) one space,
    and no final period."""
    text = "".join(char for char in unicodedata.normalize("NFKC", text) if unicodedata.category(char) != "Cf")
    lines = (re.sub(r"[*_#\s]+", " ", line).strip().removesuffix(".").strip() for line in text.splitlines())
    return [line for line in lines if line]


def _last_line(reply: str) -> str:
    lines = canonical_lines(reply)
    return lines[-1] if lines else ""


def score_reward(score: float, scale: int) -> float:
    """A score on 1..scale mapped linearly onto [0, 1]."""
    return (score - 1) / (scale - 1)


def pairwise_reward(completion_first: str, completion_second: str) -> float:
    """Mean of the completion's shares of the two verdicts: shown as A first, then as B (positions swapped)."""
    return (COMPLETION_AS_A[completion_first] + COMPLETION_AS_B[completion_second]) / 2



class Judge:
    """Rewards for a batch from one judge: renders, asks what is not cached, parses."""

    def __init__(self, settings: JudgeSettings, backend: Any):
        self.settings = settings
        self.backend = backend
        self.cache = JudgementCache(settings.cache_path)
        self.parse_failures = 0  # over the judge's life, for the logs
        # Rendered judge prompt -> a reply that did not parse, so that scoring the batch's samples one at a time
        # (oxrl.rewards.combine, after a failure) does not ask a greedy judge again for the same reply. Bounded.
        self.unparsed: OrderedDict[str, str] = OrderedDict()
        # Samples whose failure was already counted and logged (their rendered prompts): scored again one at a time,
        # they fail again without a second warning line or count. Bounded like `unparsed`.
        self.reported: OrderedDict[tuple[str, ...], None] = OrderedDict()

    def rewards(self, prompts: list[str], completions: list[str], references: list[Any] | None) -> list[float]:
        references = references if references is not None else [None] * len(prompts)
        asked = [self._render(p, c, r) for p, c, r in zip(prompts, completions, references)]
        replies = self._replies(list(dict.fromkeys(text for texts in asked for text in texts)))
        rewards, failures, failed = [], [], []
        for prompt, completion, texts in zip(prompts, completions, asked):
            try:
                rewards.append(self._reward([replies[text] for text in texts], prompt, completion))
            except JudgeParseError as error:
                failures.append(error)
                failed.append(tuple(texts))
        if failures:
            fresh = [index for index, texts in enumerate(failed) if texts not in self.reported]
            for texts in failed:
                remember(self.reported, texts)
            self.parse_failures += len(fresh)
            if len(prompts) > 1 and len(failures) > self.settings.max_unparsed_fraction * len(prompts):
                judge = self.settings.model or f"{self.settings.model_name} at {self.settings.url}"
                raise JudgeUnusableError(
                    f"reward 'judge': {len(failures)} of {len(prompts)} judgements of this batch do not parse (more "
                    f"than max_unparsed_fraction = {self.settings.max_unparsed_fraction:g}): the judge {judge} does not "
                    "follow its rubric; use a larger judge model, more max_new_tokens or a rubric it follows. The first: "
                    + " ".join(str(failures[0]).split()))
            if fresh:  # a sample scored again alone after its batch failed was reported with the batch
                logger.warning("judge: %d of %d replies did not parse (%d so far); the first: %s",
                               len(fresh), len(prompts), self.parse_failures, failures[fresh[0]])
            raise failures[0]
        return rewards

    def _render(self, prompt: str, completion: str, reference: Any) -> list[str]:
        rubric = self.settings.rubric_text
        if self.settings.mode == "score":
            return [rubric.format(prompt=prompt, completion=completion, reference=reference, scale=self.settings.scale)]
        return [rubric.format(prompt=prompt, answer_a=completion, answer_b=reference),
                rubric.format(prompt=prompt, answer_a=reference, answer_b=completion)]

    def _replies(self, texts: list[str]) -> dict[str, str]:
        identity = self.backend.identity
        # A cached reply that does not parse by today's rules (a cache written under looser ones) is asked again.
        found = {text: reply for text in texts
                 if (reply := self.cache.get(identity, text)) is not None and self._parse(reply) is not None}
        found |= {text: self.unparsed[text] for text in texts if text not in found and text in self.unparsed}
        missing = [text for text in texts if text not in found]

        def record(index: int, reply: str) -> None:
            found[missing[index]] = reply
            if self._parse(reply) is not None:  # an unparseable reply is never cached in the file
                self.cache.put(identity, missing[index], reply)
            else:
                remember(self.unparsed, missing[index], reply)

        if missing:
            self.backend.complete(missing, record)
        return found

    def _parse(self, reply: str) -> float | str | None:
        return parse_score(reply, self.settings.scale) if self.settings.mode == "score" else parse_verdict(reply)

    def _reward(self, replies: list[str], prompt: str, completion: str) -> float:
        parsed = [self._parse(reply) for reply in replies]
        spelled = mentioned_verdicts(completion, self.settings.mode)
        for reply, value in zip(replies, parsed):
            if value is None:
                wanted = (f"`Score: N` with N in 1..{self.settings.scale}" if self.settings.mode == "score"
                          else "`Verdict: A`, `Verdict: B` or `Verdict: tie`")
                raise JudgeParseError(f"the last line of the judge's reply is not {wanted}: {_excerpt(reply)!r} "
                                      f"(prompt {_excerpt(prompt, 100)!r}, completion {_excerpt(completion, 100)!r})")
            if value in spelled:
                raise JudgeParseError(f"the judge's verdict ({_last_line(reply)!r}) is also written in the "
                                      "completion, so it may be the judge quoting the policy: not trusted "
                                      f"(completion {_excerpt(completion, 100)!r})")
        if self.settings.mode == "score":
            return score_reward(parsed[0], self.settings.scale)
        return pairwise_reward(*parsed)


def _excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """Head and tail: a judge's verdict is at the end of its reply."""
    return text if len(text) <= limit else f"{text[:limit // 3]} [...] {text[-(limit - limit // 3):]}"


@functools.lru_cache(maxsize=8)
def judge_for(settings: JudgeSettings) -> Judge:
    """The process's judge for these settings: built (its model loaded) on first use."""
    if settings.url is not None:
        backend = HTTPBackend(settings.url, settings.model_name, api_key_env=settings.api_key_env,
                              max_new_tokens=settings.max_new_tokens, timeout_s=settings.timeout_s,
                              retries=settings.retries, backoff_s=settings.backoff_s, concurrency=settings.concurrency,
                              max_reply_bytes=settings.max_reply_bytes)
    else:
        backend = local_backend(settings.model, settings.device, settings.max_new_tokens)
    return Judge(settings, backend)


@batched
def judge_reward(prompts: list[str], completions: list[str], *, reference: list[Any] | None = None,
                 **kwargs: Any) -> list[float]:
    """The judge's reward for each completion. `kwargs` holds the settings and any other row fields."""
    settings = JudgeSettings.from_kwargs({k: v for k, v in kwargs.items() if k in JudgeSettings.__dataclass_fields__})
    references = reference if settings.reference_field == "reference" else kwargs.get(settings.reference_field)
    if settings.needs_reference:
        absent = len(prompts) if references is None else sum(r is None for r in references)
        if absent:
            why = "pairwise mode" if settings.mode == "pairwise" else "its rubric uses {reference}"
            raise ValueError(f"reward 'judge' ({why}) needs the row field {settings.reference_field!r} "
                             f"(`reference_field`), which {absent} of {len(prompts)} samples lack")
    return judge_for(settings).rewards(list(prompts), list(completions), references)


def check_judge(**kwargs: Any) -> None:
    """Check the kwargs and build the judge (a local model loads now), when the reward is built."""
    judge_for(JudgeSettings.from_kwargs(kwargs))


judge_reward.preflight = check_judge  # type: ignore[attr-defined]
