"""A reward as an extension, named in the config like a built-in.

    extensions: [examples/extensions/brevity_reward.py]
    rl: {rewards: [{name: math}, {name: brevity, weight: 0.1, kwargs: {max_chars: 200}}]}

1 for an empty completion, falling linearly to 0 at `max_chars` characters and beyond: a small
pressure towards short answers, weighted against the task's own reward.
"""

from oxrl.extensions import register_reward


@register_reward("brevity")
def brevity(prompt: str, completion: str, max_chars: int = 200) -> float:
    if max_chars <= 0:
        raise ValueError(f"brevity: max_chars must be > 0, got {max_chars}")
    return max(0.0, 1.0 - len(completion) / max_chars)
