"""`oxrl onboard`'s chat-template checks: what the trainer and the rollout engine assume of a template.

Each returns a `CheckResult`: the template exists; oxRL's assistant mask trains exactly each assistant
content + end of turn; the generation prompt renders what the trainer later scores (what RL relies on);
rendering the first k messages is a prefix of rendering all of them (multi-turn RL and the mask rely on it);
eos, pad and the end-of-turn token that generation must stop on.
"""

from __future__ import annotations

from oxrl.data.errors import DataError
from oxrl.data.formats import Chat
from oxrl.data.tokenize import ExampleTokenizer
from oxrl.onboard_report import FAIL, PASS, WARN, CheckResult

# Two user/assistant turns after a system prompt: enough to see earlier turns re-rendered (prefix stability).
CONVERSATION = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "What is 2+3?"},
    {"role": "assistant", "content": "2+3 is 5."},
    {"role": "user", "content": "And 4+4?"},
    {"role": "assistant", "content": "4+4 is 8."},
]
NO_TEMPLATE = "no chat template (see the chat_template check)"


def render(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def conversation_for(tokenizer) -> list[dict]:
    """CONVERSATION, without its system message when the template refuses one (e.g. Gemma's raises)."""
    from jinja2 import TemplateError

    if not tokenizer.chat_template:
        return CONVERSATION
    try:
        render(tokenizer, CONVERSATION)
        return CONVERSATION
    except TemplateError:
        return CONVERSATION[1:]


def end_of_turn_token(tokenizer, messages: list[dict]) -> str | None:
    """The first special token the template puts after the last assistant content: the turn's end."""
    from jinja2 import TemplateError

    if not tokenizer.chat_template:
        return None
    try:
        full, content = render(tokenizer, messages), messages[-1]["content"]
    except TemplateError:  # reported by the template checks
        return None
    after = full.rfind(content) + len(content)
    found = [(full.find(token, after), token) for token in ExampleTokenizer(tokenizer).special_tokens
             if full.find(token, after) >= 0]
    return min(found)[1] if found else None


def check_has_chat_template(tokenizer) -> CheckResult:
    if tokenizer.chat_template:
        return CheckResult("chat_template", PASS, "the tokenizer has a chat template")
    return CheckResult("chat_template", FAIL, "the tokenizer has no chat template: oxRL's chat formats need one; "
                       "set `model.chat_template` to a Jinja template (or `chat_template: false` on plain datasets)")


def trained_texts(tokenizer, input_ids: list[int], loss_mask: list[bool]) -> list[str]:
    """The trained tokens, decoded, one string per contiguous run."""
    runs, current = [], []
    for token, trained in zip(input_ids, loss_mask):
        if trained:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    runs += [current] if current else []
    return [tokenizer.decode(run) for run in runs]


def check_assistant_mask(tokenizer, messages: list[dict], end_of_turn: str | None) -> CheckResult:
    """Tokenize through oxRL's own path; the trained tokens must be each assistant content + end of turn."""
    name = "assistant_mask"
    if not tokenizer.chat_template:
        return CheckResult(name, FAIL, NO_TEMPLATE)
    try:
        sequence = ExampleTokenizer(tokenizer).sequence(Chat(messages), location="onboard", row=1)
    except (DataError, ValueError) as error:
        return CheckResult(name, FAIL, f"oxRL cannot locate the assistant tokens: {error}")
    trained = trained_texts(tokenizer, sequence.input_ids, sequence.loss_mask)
    expected = [m["content"] + (end_of_turn or "") for m in messages if m["role"] == "assistant"]
    if trained == expected:
        return CheckResult(name, PASS, f"trains exactly {len(expected)} assistant contents + {end_of_turn!r}")
    if len(trained) == len(expected) and all(t.endswith(e) for t, e in zip(trained, expected)):
        extra = trained[-1][: -len(expected[-1])]
        return CheckResult(name, WARN, f"also trains {extra!r}, which the template inserts before the assistant content")
    return CheckResult(name, FAIL, f"trained tokens {trained!r}, expected {expected!r}")


def check_generation_prompt(tokenizer, messages: list[dict], end_of_turn: str | None) -> CheckResult:
    """render(prompt, generation prompt) + content + end of turn must begin render(prompt + [answer]): what
    the engine samples after the generation prompt is then exactly what the trainer scores."""
    name = "generation_prompt"
    if not tokenizer.chat_template:
        return CheckResult(name, FAIL, NO_TEMPLATE)
    prompt, answer = messages[:-1], messages[-1]["content"]
    with_prompt = render(tokenizer, prompt, add_generation_prompt=True)
    if with_prompt == render(tokenizer, prompt):
        return CheckResult(name, FAIL, "add_generation_prompt=True renders nothing more: the template has no "
                           "generation prompt, so the engine would sample without the assistant header")
    full = render(tokenizer, messages)
    sampled = with_prompt + answer + (end_of_turn or "")
    if full.startswith(sampled):
        return CheckResult(name, PASS, f"adds {with_prompt[len(render(tokenizer, prompt)):]!r}; sampled == scored")
    if full.startswith(with_prompt) and answer in full[len(with_prompt):]:
        inserted = full[len(with_prompt): full.index(answer, len(with_prompt))]
        return CheckResult(name, WARN, f"the template inserts {inserted!r} after the generation prompt, before the "
                           "answer: the model must generate it itself")
    return CheckResult(name, FAIL, "the answer rendered in the conversation does not start with the generation "
                       f"prompt: {_first_difference(sampled, full)}")


def check_prefix_stable(tokenizer, messages: list[dict]) -> CheckResult:
    """render(messages[:k]) must be a prefix of render(messages), k = 1..n."""
    from jinja2 import TemplateError

    name = "prefix_stable"
    if not tokenizer.chat_template:
        return CheckResult(name, FAIL, NO_TEMPLATE)
    full, refused = render(tokenizer, messages), 0
    for k in range(1, len(messages) + 1):
        try:
            partial = render(tokenizer, messages[:k])
        except TemplateError:  # some templates refuse e.g. a system message alone: no prefix to compare
            refused += 1
            continue
        if not full.startswith(partial):
            return CheckResult(name, FAIL, f"rendering the first {k} messages is not a prefix of rendering all "
                               f"{len(messages)} (earlier turns re-rendered, e.g. reasoning stripped): "
                               f"{_first_difference(partial, full)}; multi-turn RL and oxRL's assistant mask need it")
    skipped = f" ({refused} partial conversations refused by the template, not compared)" if refused else ""
    return CheckResult(name, PASS, f"every prefix of the {len(messages)} messages renders as a prefix{skipped}")


def _first_difference(a: str, b: str) -> str:
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"they differ at character {at}: {a[at:at + 30]!r} vs {b[at:at + 30]!r}"


def check_eos_and_pad(tokenizer, end_of_turn: str | None, generation_eos: set[int]) -> CheckResult:
    """An eos token; a pad token (or eos as pad); and generation stopping at the template's end of turn."""
    name = "eos_pad"
    if tokenizer.eos_token_id is None:
        return CheckResult(name, FAIL, "the tokenizer has no eos token: sequences cannot end")
    pad = (f"pad is the eos token {tokenizer.eos_token!r} (oxRL sets it so when none is set; padding is never trained)"
           if tokenizer.pad_token_id == tokenizer.eos_token_id else f"pad {tokenizer.pad_token!r}")
    if end_of_turn is None or end_of_turn == tokenizer.eos_token:
        return CheckResult(name, PASS, f"eos {tokenizer.eos_token!r} ends each turn; {pad}")
    eot_id = tokenizer.convert_tokens_to_ids(end_of_turn)
    if eot_id in generation_eos:
        return CheckResult(name, PASS, f"end of turn {end_of_turn!r} is not eos {tokenizer.eos_token!r}, but the "
                           f"generation config stops on it; {pad}")
    return CheckResult(name, FAIL, f"end of turn {end_of_turn!r} (id {eot_id}) is neither the eos "
                       f"{tokenizer.eos_token!r} nor in the generation config's eos_token_id {sorted(generation_eos)}: "
                       f"generation would not stop at the end of a turn (set it in generation_config.json); {pad}")
