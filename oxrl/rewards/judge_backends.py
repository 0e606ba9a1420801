"""Where the `judge` reward's replies come from: a local model run by oxRL, or an OpenAI-compatible server.

A backend turns rendered judge prompts into reply texts, greedily (temperature 0: the same prompt gets
the same verdict, which is what makes caching judgements sound):

    backend.identity                      # names the judge in cache keys: another judge, another key
    backend.complete(texts, on_reply)     # calls on_reply(i, reply) as each reply arrives

`complete` reports every reply it got before it raises, so that a batch in which one request failed
still caches the others (`oxrl.rewards.judge`), and re-scoring the batch one sample at a time (what
`oxrl.rewards.combine` does after a batched reward raised) only asks again for the failures.

`HTTPBackend` POSTs to `{url}/chat/completions` (vLLM, SGLang, TGI and hosted APIs all serve it), with at
most `concurrency` requests in flight. Connection errors, timeouts, HTTP 429 and 5xx are retried with
exponential backoff (`backoff_s`, 2x, 4x, ...): a server under load or restarting recovers; any other 4xx
(a wrong model name, a prompt too long) cannot, so it fails at once with the server's own message. The API
key is read from the environment variable `api_key_env` names, never from the config (configs are saved
with the run and shared).

`LocalBackend` loads a model with oxRL's own loaders and generates with the built-in rollout engine
(`oxrl.rollout.hf.HFEngine`), rendering prompts through the judge tokenizer's chat template when it has
one. `local_backend` keeps one per (model, device) for the process, so a run loads its judge once however
many rewards and calls use it.
"""

from __future__ import annotations

import functools
import http.client
import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed

logger = logging.getLogger(__name__)

OnReply = Callable[[int, str], None]
RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
MESSAGE_CHARS = 500  # of a server's error body, in our error


class JudgeRequestError(RuntimeError):
    """The judge server refused a request, or could not be reached within the retries."""


class HTTPBackend:
    """An OpenAI-compatible chat endpoint, e.g. `vllm serve MODEL` at `http://127.0.0.1:8000/v1`."""

    def __init__(self, url: str, model_name: str, *, api_key_env: str | None = None, max_new_tokens: int = 512,
                 timeout_s: float = 60.0, retries: int = 3, backoff_s: float = 1.0, concurrency: int = 8):
        self.endpoint = url.rstrip("/") + "/chat/completions"
        self.model_name = model_name
        self.api_key_env = api_key_env
        self.max_new_tokens = max_new_tokens
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.concurrency = concurrency
        self.identity = f"{self.endpoint}#{model_name}#max_new_tokens={max_new_tokens}"

    def complete(self, texts: list[str], on_reply: OnReply) -> None:
        errors: list[Exception] = []
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="oxrl-judge") as pool:
            futures = {pool.submit(self.ask, text): index for index, text in enumerate(texts)}
            for future in as_completed(futures):  # in this thread: on_reply needs no lock
                try:
                    on_reply(futures[future], future.result())
                except JudgeRequestError as error:
                    errors.append(error)
        if errors:
            if len(errors) > 1:
                logger.warning("%d of %d judge requests failed; raising the first", len(errors), len(texts))
            raise errors[0]

    def ask(self, text: str) -> str:
        """The judge's reply to one prompt, after up to `retries` retries of transient failures."""
        body = json.dumps({"model": self.model_name, "messages": [{"role": "user", "content": text}],
                           "temperature": 0.0, "max_tokens": self.max_new_tokens}).encode()
        last: str = ""
        for attempt in range(self.retries + 1):
            if attempt:
                delay = self.backoff_s * 2 ** (attempt - 1)
                logger.info("judge request to %s failed (%s); retry %d of %d in %.2g s",
                            self.endpoint, last, attempt, self.retries, delay)
                time.sleep(delay)
            try:
                with urllib.request.urlopen(self._request(body), timeout=self.timeout_s) as response:
                    return _reply_text(response.read(), self.endpoint)
            except urllib.error.HTTPError as error:  # before URLError: it is one
                message = _excerpt(error.read().decode(errors="replace"))
                if error.code not in RETRIED_STATUSES:
                    raise JudgeRequestError(f"judge server {self.endpoint} answered HTTP {error.code}: {message}") from error
                last = f"HTTP {error.code}: {message}"
            except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as error:
                reason = getattr(error, "reason", error)
                last = f"timed out after {self.timeout_s:g} s" if isinstance(reason, TimeoutError) else str(reason)
        raise JudgeRequestError(
            f"judge server {self.endpoint} failed {self.retries + 1} times (timeout_s={self.timeout_s:g}, "
            f"retries={self.retries}); the last: {last}. Is the server up, and is `url` right?"
        )

    def _request(self, body: bytes) -> urllib.request.Request:
        headers = {"Content-Type": "application/json"}
        if self.api_key_env:
            headers["Authorization"] = f"Bearer {os.environ[self.api_key_env]}"  # checked at preflight
        return urllib.request.Request(self.endpoint, data=body, headers=headers, method="POST")


def _reply_text(raw: bytes, endpoint: str) -> str:
    try:
        content = json.loads(raw)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise JudgeRequestError(f"judge server {endpoint} sent no chat completion: {_excerpt(raw.decode(errors='replace'))}") from error
    if not isinstance(content, str):
        raise JudgeRequestError(f"judge server {endpoint} sent a reply without text: {content!r:.200}")
    return content


def _excerpt(text: str) -> str:
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + " [...]"


class LocalBackend:
    """A causal LM loaded by oxRL, generating greedily with the built-in engine (batches of up to 64)."""

    def __init__(self, model, tokenizer, engine, identity: str, max_new_tokens: int):
        self.model, self.tokenizer, self.engine = model, tokenizer, engine
        self.identity = f"{identity}#max_new_tokens={max_new_tokens}"
        self.max_new_tokens = max_new_tokens

    def complete(self, texts: list[str], on_reply: OnReply) -> None:
        from oxrl.rollout.base import SamplingParams

        params = SamplingParams(n=1, temperature=0.0, max_new_tokens=self.max_new_tokens)
        for completion in self.engine.generate([self._prompt_ids(text) for text in texts], params):
            on_reply(completion.prompt_index, completion.text)

    def _prompt_ids(self, text: str) -> list[int]:
        if self.tokenizer.chat_template:
            rendered = self.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                          add_generation_prompt=True, tokenize=True, return_dict=True)
            return list(rendered["input_ids"])
        return list(self.tokenizer(text)["input_ids"])


@functools.lru_cache(maxsize=4)
def load_local_model(model: str, device: str | None):
    """(model, tokenizer, engine) for a judge model, loaded once per process for each (model, device)."""
    import torch

    from oxrl.config.schema import ModelConfig
    from oxrl.models.load import load_model, load_tokenizer
    from oxrl.rollout.hf import HFEngine

    where = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    config = ModelConfig(name_or_path=model)
    logger.info("loading the judge model %s on %s", model, where)
    network = load_model(config, where)
    network.eval().requires_grad_(False)
    tokenizer = load_tokenizer(config)
    return network, tokenizer, HFEngine(network, tokenizer)


def local_backend(model: str, device: str | None, max_new_tokens: int) -> LocalBackend:
    return LocalBackend(*load_local_model(model, device), identity=f"local:{model}", max_new_tokens=max_new_tokens)
