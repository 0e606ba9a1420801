"""The `judge` reward (RLAIF): parsing, the score mapping and the pairwise position swap derived by hand; an
OpenAI-compatible fake server on 127.0.0.1 for the HTTP path (concurrency, retries, errors, caches, failures
through `build_reward_fn`); a tiny random local judge, loaded once."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from oxrl.rewards import RewardError, RewardLoadError, build_reward_fn
from oxrl.rewards.judge import (
    Judge,
    JudgeParseError,
    judge_for,
    judge_reward,
    pairwise_reward,
    parse_score,
    parse_verdict,
    score_reward,
)
from oxrl.rewards.failures import EveryCallFailedError
from oxrl.rewards.judge_backends import JudgeRequestError, load_local_model
from oxrl.rewards.judge_settings import JudgeSettings
from tests.conftest import save_tiny_model

SCORE_RUBRIC = "PROMPT: {prompt}\nCOMPLETION: {completion}"
PAIR_RUBRIC = "PAIR {prompt}\nA: {answer_a}\nB: {answer_b}"


@pytest.fixture(autouse=True)
def fresh_judges():
    judge_for.cache_clear()
    load_local_model.cache_clear()
    yield
    judge_for.cache_clear()
    load_local_model.cache_clear()


# --- pure parts, by hand ---------------------------------------------------------------------------------


def test_the_verdict_is_the_last_line_alone():
    assert parse_score("Score: 3\nOn reflection, better.\nScore: 7", 10) == 7
    assert parse_score("The response is fine.\n**Score:** 8/10\n\n", 10) == 8
    assert parse_score("Fine.\nScore: [[4]].", 5) == 4
    assert parse_score("Fine.\nＳｃｏｒｅ：９", 10) == 9  # full-width, as NFKC reads it
    assert parse_score("Score: 11", 10) is None  # out of range: unparseable, not clipped
    assert parse_score("Score: 0", 10) is None
    assert parse_score("Score: 8/9", 10) is None  # another scale than asked
    assert parse_score("Score: 5\nScore: 12", 10) is None  # the last line counts, even when it is invalid
    assert parse_score("final score = 4.", 5) is None  # not the format: the line must be the verdict alone
    assert parse_score("Score: 4\nThanks for reading.", 5) is None  # anything after the verdict: no verdict
    assert parse_score("Score: ٩", 10) is None  # digits other than 0-9 are not read
    assert parse_score("I would give it a seven.", 10) is None
    assert parse_score("Score: N", 10) is None


def test_verdicts_parse_a_b_and_tie():
    assert parse_verdict("A is longer, but B is right.\nVerdict: B") == "B"
    assert parse_verdict("Verdict: [[A]]") == "A"
    assert parse_verdict("**Verdict:** Tie.") == "tie"
    assert parse_verdict("Verdict: A\nWait, no.\nVerdict: tie") == "tie"
    assert parse_verdict("Verdict: a tie") is None  # lower-case `a` is an article, not response A
    assert parse_verdict("Verdict: both") is None
    assert parse_verdict("Verdict: B\nA quoted: 'Verdict: A'") is None
    assert parse_verdict("B is better") is None


def test_scores_map_onto_zero_one():
    assert score_reward(1, 10) == 0.0
    assert score_reward(10, 10) == 1.0
    assert score_reward(7, 10) == pytest.approx(6 / 9)
    assert score_reward(2, 3) == 0.5


def test_pairwise_swap_cancels_position_bias():
    # first verdict: completion shown as A; second: completion shown as B
    assert pairwise_reward("A", "A") == 0.5  # always "A": position bias only, no information
    assert pairwise_reward("B", "B") == 0.5
    assert pairwise_reward("A", "B") == 1.0  # prefers the completion in both positions
    assert pairwise_reward("B", "A") == 0.0  # prefers the reference in both positions
    assert pairwise_reward("tie", "tie") == 0.5
    assert pairwise_reward("A", "tie") == 0.75


class ScriptedBackend:
    """Replies by a rule on the rendered judge prompt; records what it was asked."""

    identity = "scripted"

    def __init__(self, rule):
        self.rule, self.asked = rule, []

    def complete(self, texts, on_reply):
        self.asked.extend(texts)
        for index, text in enumerate(texts):
            on_reply(index, self.rule(text))


def pairwise_judge(rule) -> Judge:
    settings = JudgeSettings(url="http://unused", model_name="m", mode="pairwise", rubric="{prompt}|{answer_a}|{answer_b}")
    return Judge(settings, ScriptedBackend(rule))


def test_pairwise_judges_see_both_orders():
    always_a = pairwise_judge(lambda text: "Verdict: A")
    assert always_a.rewards(["q", "q"], ["mine", "other"], ["ref", "ref"]) == [0.5, 0.5]
    assert always_a.backend.asked == ["q|mine|ref", "q|ref|mine", "q|other|ref", "q|ref|other"]
    likes_completion = pairwise_judge(lambda text: "Verdict: A" if text.split("|")[1] == "mine" else "Verdict: B")
    assert likes_completion.rewards(["q"], ["mine"], ["ref"]) == [1.0]
    likes_reference = pairwise_judge(lambda text: "Verdict: A" if text.split("|")[1] == "ref" else "Verdict: B")
    assert likes_reference.rewards(["q"], ["mine"], ["ref"]) == [0.0]


# --- a fake OpenAI-compatible server ---------------------------------------------------------------------


class FakeJudgeServer:
    """`POST /v1/chat/completions`. Score prompts: `Score: 1 + (count of "good" in the completion)`; pair
    prompts: the answer with more "good"s wins. Markers in the text: BAD400 (a 400), FLAKY (a 503 the first
    time), SLOW (sleeps 1 s), GARBLE (an unparseable reply)."""

    def __init__(self, delay_s: float = 0.0):
        self.delay_s = delay_s
        self.requests = 0
        self.in_flight = self.max_in_flight = 0
        self.seen: Counter[str] = Counter()
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.lock = threading.Lock()

    def answer(self, content: str) -> tuple[int, dict]:
        if "BAD400" in content:
            return 400, {"error": {"message": "The model `nope` does not exist."}}
        if "FLAKY" in content and self.seen[content] == 1:
            return 503, {"error": {"message": "overloaded"}}
        if "SLOW" in content:
            time.sleep(1.0)
        if "GARBLE" in content:
            reply = "I cannot decide."
        elif content.startswith("PAIR"):
            a, b = content.split("\nA: ", 1)[1].split("\nB: ", 1)
            reply = "Verdict: " + ("A" if a.count("good") > b.count("good") else "B" if b.count("good") > a.count("good") else "tie")
        else:
            reply = f"Looks fine.\nScore: {1 + content.split('COMPLETION: ', 1)[1].count('good')}"
        return 200, {"choices": [{"message": {"role": "assistant", "content": reply}}]}

    def handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                content = body["messages"][0]["content"]
                with fake.lock:
                    fake.requests += 1
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                    fake.seen[content] += 1
                    fake.bodies.append(body)
                    fake.headers.append(dict(self.headers))
                try:
                    time.sleep(fake.delay_s)
                    status, payload = fake.answer(content)
                finally:
                    with fake.lock:
                        fake.in_flight -= 1
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # quiet
                pass

        return Handler


@pytest.fixture
def server():
    fake = FakeJudgeServer()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), fake.handler())
    httpd.handle_error = lambda request, address: None  # a client that gave up (the timeout test) is no error
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    yield fake
    httpd.shutdown()
    httpd.server_close()


def http_kwargs(server, **overrides):
    return {"url": server.url, "model_name": "judge", "rubric": SCORE_RUBRIC, "backoff_s": 0.01, **overrides}


def test_http_judge_scores_by_the_servers_rule(server):
    rewards = judge_reward(["q1", "q2", "q3"], ["bad", "good", "good good good"], **http_kwargs(server))
    assert rewards == [0.0, pytest.approx(1 / 9), pytest.approx(3 / 9)]
    body = server.bodies[0]
    assert body["model"] == "judge" and body["temperature"] == 0.0 and body["max_tokens"] == 512


def test_concurrency_is_bounded(server):
    server.delay_s = 0.05
    judge_reward([f"q{i}" for i in range(8)], ["good"] * 8, **http_kwargs(server, concurrency=2))
    assert server.requests == 8
    assert server.max_in_flight == 2


def test_a_503_is_retried(server):
    assert judge_reward(["q", "q"], ["good FLAKY", "x"], **http_kwargs(server, retries=2)) == [pytest.approx(1 / 9), 0.0]
    assert server.requests == 3  # the flaky one twice


def test_a_400_fails_at_once_with_the_servers_message(server):
    with pytest.raises(JudgeRequestError, match="HTTP 400.*does not exist"):
        judge_reward(["q"], ["BAD400"], **http_kwargs(server, retries=3))
    assert server.requests == 1


def test_a_timeout_raises_after_the_retries(server):
    with pytest.raises(JudgeRequestError, match="failed 2 times.*timed out"):
        judge_reward(["q"], ["SLOW"], **http_kwargs(server, timeout_s=0.2, retries=1))
    assert server.requests == 2


def test_the_api_key_comes_from_the_environment(server, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "sekret")
    judge_reward(["q"], ["good"], **http_kwargs(server, api_key_env="JUDGE_KEY"))
    assert server.headers[0]["Authorization"] == "Bearer sekret"


def test_judgements_are_cached_in_memory(server):
    kwargs = http_kwargs(server)
    first = judge_reward(["q", "q", "r"], ["good", "good", "x"], **kwargs)  # a repeated pair is asked once
    assert server.requests == 2
    assert judge_reward(["r", "q"], ["x", "good"], **kwargs) == first[::-1][:2]
    assert server.requests == 2


def test_the_jsonl_cache_serves_a_new_judge(server, tmp_path):
    kwargs = http_kwargs(server, cache_path=str(tmp_path / "judgements.jsonl"))
    first = judge_reward(["q1", "q2"], ["good", "x"], **kwargs)
    assert server.requests == 2 and len((tmp_path / "judgements.jsonl").read_text().splitlines()) == 2
    judge_for.cache_clear()  # as in a resumed run: a new process, a new judge object
    assert judge_reward(["q1", "q2"], ["good", "x"], **kwargs) == first
    assert server.requests == 2
    judge_reward(["q1"], ["good"], **{**kwargs, "model_name": "another"})  # another judge: not its judgement
    assert server.requests == 3


def test_a_cached_reply_that_no_longer_parses_is_asked_again(server, tmp_path):
    from oxrl.rewards.judge_cache import JudgementCache

    kwargs = http_kwargs(server, cache_path=str(tmp_path / "judgements.jsonl"))
    judge = judge_for(JudgeSettings.from_kwargs(kwargs))
    old = JudgementCache(str(tmp_path / "judgements.jsonl"))  # written when "the last `Score:` counted"
    old.put(judge.backend.identity, SCORE_RUBRIC.format(prompt="q", completion="x"), "Score: 2\nIt claims 'Score: 10'.")
    judge_for.cache_clear()
    assert judge_reward(["q"], ["x"], **kwargs) == [0.0]  # the server's own verdict, asked afresh
    assert server.requests == 1


def test_pairwise_over_http_with_a_named_reference_field(server):
    reward_fn = build_reward_fn([{"name": "judge", "kwargs": http_kwargs(
        server, mode="pairwise", rubric=PAIR_RUBRIC, reference_field="answer")}])
    out = reward_fn(["q"] * 3, ["good good", "x", "good"], fields=[{"answer": "good"}] * 3)
    assert out.components["judge"] == [1.0, 0.0, 0.5]
    # two orders per sample, but a completion equal to its reference reads the same both ways: asked once
    assert server.requests == 5


def test_an_unparseable_reply_stops_the_run(server):
    reward_fn = build_reward_fn([{"name": "judge", "kwargs": http_kwargs(server)}])
    with pytest.raises(RewardError, match="(?s)JudgeParseError.*I cannot decide"):
        reward_fn(["q1", "q2"], ["good", "GARBLE"])


def test_a_judge_whose_replies_mostly_do_not_parse_stops_the_run_at_once(server):
    """More than max_unparsed_fraction (half) of a batch unparsed: one error naming the judge, whatever on_error
    says, and no sample judged again one at a time."""
    from oxrl.rewards.judge import JudgeUnusableError

    reward_fn = build_reward_fn([{"name": "judge", "kwargs": http_kwargs(server), "on_error": "zero"}])
    with pytest.raises(JudgeUnusableError, match=r"^reward 'judge': 2 of 3 judgements of this batch do not parse "
                                                 r"\(more than max_unparsed_fraction = 0.5\): the judge judge at http"):
        reward_fn(["q1", "q2", "q3"], ["GARBLE", "good", "GARBLE too"])
    assert server.requests == 3
    lenient = build_reward_fn([{"name": "judge", "kwargs": http_kwargs(server, max_unparsed_fraction=1.0),
                                "on_error": "zero"}])
    assert lenient(["q1", "q2", "q3"], ["GARBLE", "good", "GARBLE too"]).failures["judge"] == 2


def test_an_unparseable_reply_is_counted_and_the_rest_keep_their_scores(server, oxrl_log):
    reward_fn = build_reward_fn([{"name": "judge", "kwargs": http_kwargs(server), "on_error": "zero"}])
    out = reward_fn(["q1", "q2", "q3"], ["good", "GARBLE", "good good"])
    assert out.failures["judge"] == 1
    assert out.components["judge"] == [pytest.approx(1 / 9), 0.0, pytest.approx(2 / 9)]
    assert server.requests == 3  # the batch; scored one by one after, nothing is asked again (a greedy judge)
    # One warning, with the batch: the sample scored again alone fails again without a second line or count.
    records = {id(r): r for r in oxrl_log.records}.values()  # the fixture's handler may see a record twice
    warnings = [r.getMessage() for r in records if "did not parse" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("judge: 1 of 3 replies did not parse (1 so far)"), warnings
    with pytest.raises(JudgeParseError, match="I cannot decide.*GARBLE"):
        judge_reward(["q"], ["GARBLE"], **http_kwargs(server))


# --- settings, checked when the reward is built ----------------------------------------------------------


@pytest.mark.parametrize("kwargs, message", [
    ({"rubric": "Rate {completion}."}, r"lacks the placeholder\(s\) \['\{prompt\}'\]"),
    ({"mode": "pairwise", "rubric": "{prompt} {answer_a}"}, r"\['\{answer_b\}'\]"),
    ({"rubric": "{prompt} {completion} {answer}"}, "unknown placeholder"),
    ({"rubric": "{prompt} {completion} {"}, "literal braces"),
    ({"mode": "best_of"}, "mode must be one of"),
    ({"scale": 1}, "scale must be at least 2"),
    ({"concurrency": "4"}, "concurrency must be an integer"),
    ({"api_key": "sekret"}, "api_key_env"),
    ({"api_key_env": "OXRL_TEST_UNSET_KEY"}, "not set"),
    ({"model_name": None}, "needs `model_name`"),
    ({"model": "some/model"}, "exactly one of"),
])
def test_bad_settings_fail_when_the_reward_is_built(kwargs, message):
    settings = {"url": "http://127.0.0.1:9/v1", "model_name": "judge", **kwargs}
    with pytest.raises(ValueError, match=message):
        build_reward_fn([{"name": "judge", "kwargs": settings}])


def test_pairwise_without_references_is_an_error(server):
    with pytest.raises(ValueError, match="needs the row field 'reference'.*2 of 2"):
        judge_reward(["q", "q"], ["a", "b"], **http_kwargs(server, mode="pairwise", rubric=PAIR_RUBRIC))
    with pytest.raises(RewardLoadError, match="both row fields and kwargs"):
        build_reward_fn([{"name": "judge", "kwargs": http_kwargs(server)}])(["q"], ["a"], fields=[{"url": "x"}])
    assert server.requests == 0


# --- a tiny local judge ----------------------------------------------------------------------------------


def test_a_tiny_local_judge_loads_once_and_its_babble_stops_the_run(tmp_path, smollm2_tokenizer, monkeypatch):
    import oxrl.models.load

    folder = save_tiny_model(tmp_path / "judge", smollm2_tokenizer)
    loads = []
    real_load = oxrl.models.load.load_model
    monkeypatch.setattr(oxrl.models.load, "load_model", lambda *args, **kw: loads.append(args) or real_load(*args, **kw))
    spec = {"name": "judge", "kwargs": {"model": str(folder), "device": "cpu", "max_new_tokens": 4,
                                        "max_unparsed_fraction": 1.0}, "on_error": "zero"}
    for _ in range(2):  # a second reward_fn, as a second reward or stage would build: the same judge
        # A random model writes no `Score: N`: every call fails, which stops the run even under `on_error: zero`.
        with pytest.raises(EveryCallFailedError, match=r"reward 'judge' failed on every sample .*\(2 of 2 calls"):
            build_reward_fn([spec])(["What is 2+2?", "Name a colour."], ["4", "blue"])
    assert len(loads) == 1
