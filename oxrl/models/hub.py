"""A hub id, checked against the Hugging Face hub before a transformers loader tries it (oxrl/models/source.py).

With the hub out of reach, huggingface_hub retries each file for minutes before it gives up. So a hub id that is not
in the local cache is checked once per process (`hub_unreachable`: one request, a few seconds at most): out of reach,
a cached model loads from the cache (`local_files_only`) and any other fails at once (oxrl/models/source.py says so,
naming the model, a near miss (`did_you_mean`) and HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import functools
import logging

logger = logging.getLogger(__name__)
HUB_PROBE_TIMEOUT_S = 3.0
OFFLINE_HINT = "HF_HUB_OFFLINE=1 loads only from the local cache, without trying the hub"


def hub_or_cache(repo_id: str, revision: str | None) -> dict | str:
    """Extra loader arguments for hub id `repo_id`: none while the hub answers (or HF_HUB_OFFLINE is set: the loaders
    then read the cache alone), `local_files_only` when it does not and the model is cached; when it is neither
    reachable nor cached, the text saying so, for the caller's error."""
    from huggingface_hub import constants, try_to_load_from_cache

    if constants.HF_HUB_OFFLINE:
        return {}
    reason = hub_unreachable(constants.ENDPOINT)
    if reason is None:
        return {}
    if any(isinstance(try_to_load_from_cache(repo_id, name, revision=revision), str)
           for name in ("config.json", "tokenizer_config.json")):
        logger.info("the Hugging Face hub (%s) cannot be reached: %s loads from the local cache", constants.ENDPOINT,
                    repo_id)
        return {"local_files_only": True}
    return (f"not in the Hugging Face cache, and the hub ({constants.ENDPOINT}) cannot be reached ({reason}): connect "
            f"to it, or download the model where there is a network; {OFFLINE_HINT}")


@functools.cache  # once per process: every loader of a run (config, tokenizer, weights) asks again
def hub_unreachable(endpoint: str) -> str | None:
    """Why the Hugging Face hub at `endpoint` cannot be reached, or None when it answers (any HTTP status): one
    request through huggingface_hub's own session (its proxies and certificates), no retries."""
    from huggingface_hub.utils import get_session

    try:
        get_session().head(endpoint, timeout=HUB_PROBE_TIMEOUT_S)
    except Exception as error:  # noqa: BLE001 (the session is requests' or httpx's by version, each with its errors)
        return f"{type(error).__name__}: {error}"
    return None


def did_you_mean(name: str, aliases) -> str:
    """` (did you mean `X`?)` for the alias (of `aliases`) or registry model closest to a mistyped `name`, else ``."""
    import difflib

    from oxrl.models.registry import load_registry

    known = [*aliases, *(entry.name for entry in load_registry())]
    by_lower = {candidate.lower(): candidate for candidate in known}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.75)
    return f" (did you mean `{by_lower[close[0]]}`?)" if close else ""
