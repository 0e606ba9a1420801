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
with the run and shared), and registered as a secret (`oxrl.logging.redaction`): nothing the server sends
back reaches an error, a log line or the judgement cache before the key is redacted from it.

A request is bounded as a whole, not read by read: `timeout_s` is the wall time from connecting to the
reply's last byte, after which the connection is shut down (a server that drips a byte at a time cannot
hold the run), and a reply larger than `max_reply_bytes` is refused unread (by its Content-Length) or cut
there. Redirects are never followed: a 3xx is an error naming its target's origin, so the key never goes
to another host and no other host's reply is scored. The request goes to `url` directly (proxy variables
in the environment are not used).

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
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from urllib.parse import urlsplit

from oxrl.logging.redaction import redact, register_secret

logger = logging.getLogger(__name__)

OnReply = Callable[[int, str], None]
RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
MESSAGE_CHARS = 500  # of a server's error body, in our error
ERROR_BODY_BYTES = 64 * 1024  # read of an error reply: enough for its message
READ_CHUNK_BYTES = 64 * 1024
MAX_REPLY_BYTES = 1024 * 1024  # `max_reply_bytes`' default: a chat completion of a few thousand tokens is ~20 KiB


class JudgeRequestError(RuntimeError):
    """The judge server refused a request, or could not be reached within the retries."""


class TransientError(Exception):
    """A failure that another attempt may not meet: no connection, a timeout, HTTP 429 or 5xx."""


class HTTPBackend:
    """An OpenAI-compatible chat endpoint, e.g. `vllm serve MODEL` at `http://127.0.0.1:8000/v1`."""

    def __init__(self, url: str, model_name: str, *, api_key_env: str | None = None, max_new_tokens: int = 512,
                 timeout_s: float = 60.0, retries: int = 3, backoff_s: float = 1.0, concurrency: int = 8,
                 max_reply_bytes: int = MAX_REPLY_BYTES):
        self.endpoint = url.rstrip("/") + "/chat/completions"
        self.path = urlsplit(self.endpoint).path
        self.model_name = model_name
        self.max_new_tokens = max_new_tokens
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.concurrency = concurrency
        self.max_reply_bytes = max_reply_bytes
        self.identity = f"{self.endpoint}#{model_name}#max_new_tokens={max_new_tokens}"
        self.tls = ssl.create_default_context() if urlsplit(self.endpoint).scheme == "https" else None  # verifies certificates
        self.headers = {"Content-Type": "application/json"}
        if api_key_env:
            key = os.environ[api_key_env]  # set and header-safe: checked by JudgeSettings
            register_secret(key)
            self.headers["Authorization"] = f"Bearer {key}"

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
                return self.post(body)
            except TransientError as error:
                last = str(error)
        raise JudgeRequestError(
            f"judge server {self.endpoint} failed {self.retries + 1} times (timeout_s={self.timeout_s:g}, "
            f"retries={self.retries}); the last: {last}. Is the server up, and is `url` right?"
        )

    def post(self, body: bytes) -> str:
        """One request, bounded as a whole by `timeout_s`: the reply's text, or TransientError / JudgeRequestError."""
        connection = self._connection()
        cut = threading.Event()

        def cut_off() -> None:  # runs in the timer's thread; shutting the socket down wakes a blocked read
            cut.set()
            if connection.sock is not None:
                try:
                    connection.sock.shutdown(socket.SHUT_RDWR)
                except OSError:  # closed already: the request ended as the deadline came
                    pass

        deadline = threading.Timer(self.timeout_s, cut_off)
        deadline.daemon = True
        deadline.start()
        try:
            connection.connect()
            if cut.is_set():  # the deadline passed while connecting, before there was a socket to shut down
                raise TimeoutError
            connection.request("POST", self.path, body=body, headers=self.headers)
            response = connection.getresponse()
            status = response.status
            if status == 200:
                raw = self._read(response, self.max_reply_bytes, refuse_more=True)
            else:
                raw = self._read(response, ERROR_BODY_BYTES, refuse_more=False)
            if cut.is_set():
                raise TimeoutError
        except (OSError, http.client.HTTPException, ValueError) as error:
            # A shut-down socket surfaces as any of these; a server's malformed reply as the latter two.
            if cut.is_set() or isinstance(error, TimeoutError):
                raise TransientError(f"timed out: no complete reply within timeout_s={self.timeout_s:g} s") from None
            raise TransientError(redact(f"{type(error).__name__}: {error}")) from None
        finally:
            deadline.cancel()
            connection.close()
        return self._reply(status, response, raw)

    def _connection(self) -> http.client.HTTPConnection:
        parts = urlsplit(self.endpoint)
        if self.tls is not None:
            return http.client.HTTPSConnection(parts.hostname, parts.port, timeout=self.timeout_s, context=self.tls)
        return http.client.HTTPConnection(parts.hostname, parts.port, timeout=self.timeout_s)

    def _read(self, response: http.client.HTTPResponse, limit: int, refuse_more: bool) -> bytes:
        """At most `limit` bytes of the body, read in chunks; with `refuse_more`, a longer body is an error."""
        header = response.getheader("Content-Length", "")
        declared = int(header) if header.isascii() and header.isdigit() else None
        if refuse_more and declared is not None and declared > limit:
            raise JudgeRequestError(f"judge server {self.endpoint} sent a reply of {declared} bytes, more than "
                                    f"max_reply_bytes={limit}; it was not read")
        chunks, size = [], 0
        while size <= limit:
            chunk = response.read(min(READ_CHUNK_BYTES, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit and refuse_more:
            raise JudgeRequestError(f"judge server {self.endpoint} sent a reply of more than max_reply_bytes={limit} "
                                    "bytes; it was cut there")
        if declared is not None and size < min(declared, limit):
            raise http.client.IncompleteRead(b"", declared - size)  # the connection ended early
        return b"".join(chunks)[:limit]

    def _reply(self, status: int, response: http.client.HTTPResponse, raw: bytes) -> str:
        message = _excerpt(redact(raw.decode(errors="replace")))
        if status == 200:
            return _reply_text(raw, self.endpoint)
        if 300 <= status < 400:
            raise JudgeRequestError(
                f"judge server {self.endpoint} answered HTTP {status}, a redirect to "
                f"{_origin(response.getheader('Location', ''))}; redirects are not followed (the request carries the "
                "API key and its reply would be scored): set `url` to the address that serves the judge")
        if status in RETRIED_STATUSES:
            raise TransientError(f"HTTP {status}: {message}")
        raise JudgeRequestError(f"judge server {self.endpoint} answered HTTP {status}: {message}")


def _origin(location: str) -> str:
    """scheme://host:port of a redirect's target: where it points, without a path or query that may hold anything."""
    parts = urlsplit(location)
    if not parts.netloc:
        return "the same server" if location else "nowhere (no Location header)"
    return redact(f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}")  # never a user:password@


def _reply_text(raw: bytes, endpoint: str) -> str:
    try:
        content = json.loads(raw)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError, RecursionError) as error:
        raise JudgeRequestError(f"judge server {endpoint} sent no chat completion: "
                                f"{_excerpt(redact(raw.decode(errors='replace')))}") from error
    if not isinstance(content, str):
        raise JudgeRequestError(f"judge server {endpoint} sent a reply without text: {redact(repr(content)):.200}")
    return redact(content)


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
