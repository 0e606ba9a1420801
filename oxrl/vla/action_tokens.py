"""Continuous robot actions as language-model tokens, one token per action dimension (OpenVLA, arXiv:2406.09246).

Each dimension d of an action is cut into `bins` intervals by `bins + 1` edges, and the interval an action value
falls in is one token. The edges are either uniform over [low_d, high_d] (the environment's action space or the
dataset's range, or its 1st to 99th percentile as OpenVLA bounds it) or the dataset's quantiles (each bin then holds
as many demonstration actions; the outer edges are the data's minimum and maximum). A value outside the edges is
clipped into the first or last bin.

Decoding gives each bin's centre, so encode -> decode returns every in-range value to within half its bin's
width. A chunk of `chunk` consecutive actions (OpenVLA-OFT's action chunking, arXiv:2502.19645) is `chunk x dims`
tokens, time-major: action 0's dimensions, then action 1's.

The tokens are the last `bins` entries of the tokenizer's base vocabulary, as OpenVLA takes them: in a byte-level
BPE vocabulary these are the latest (rarest) merges, so a language model loses the least by giving them a new
meaning, and no embedding has to be added or resized. Bin b is token `first_id + b`. A rollout samples from
these ids only (`SamplingParams.allowed_token_ids`), so every chunk decodes to a valid action.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class ActionTokenError(ValueError):
    """Action tokens that cannot be built for this vocabulary, or ids that are not a whole chunk of action tokens."""


@dataclass(frozen=True)
class StateBins:
    """The proprioceptive state as a prompt writes it with `vla.state_bins`: each dimension's bin among `bins` equal
    bins between per-dimension bounds (the demonstrations' 1st and 99th percentiles; values beyond fall in the end
    bins), a zero-padded integer, as pi0-FAST writes its discretised state into its prompt (arXiv:2501.09747). Every
    dimension then takes the same few digits at the same place in every prompt, where a float's digits vary in count
    and meaning with its magnitude (`241.543` and `-2.884`)."""

    low: np.ndarray  # [dims]
    high: np.ndarray  # [dims], above low
    bins: int

    @classmethod
    def from_states(cls, states: np.ndarray, bins: int) -> StateBins:
        """Bounds at the 1st and 99th percentiles of `states` [N, dims] (demonstration frames' states)."""
        states = np.asarray(states, dtype=np.float64)
        if states.ndim != 2 or states.shape[0] < 2:
            raise ActionTokenError(f"state bins need at least 2 states laid out [N, dims], got shape {list(states.shape)}")
        low, high = np.quantile(states, 0.01, axis=0), np.quantile(states, 0.99, axis=0)
        return cls.checked(low, np.where(high > low, high, low + 1e-6 * np.maximum(1.0, np.abs(low))), bins)

    @classmethod
    def checked(cls, low, high, bins: int) -> StateBins:
        """Bounds and a bin count (saved ones: `oxrl.vla.build.load_action_tokens`), checked."""
        low, high = np.atleast_1d(np.asarray(low, dtype=np.float64)), np.atleast_1d(np.asarray(high, dtype=np.float64))
        if low.ndim != 1 or low.shape != high.shape or not np.all(np.isfinite(low) & np.isfinite(high) & (high > low)):
            raise ActionTokenError(f"state bins need finite bounds with low < high in every dimension, got "
                                   f"low={low.tolist()} high={high.tolist()}")
        if bins < 2:
            raise ActionTokenError(f"state bins need at least 2 bins, got {bins}")
        return cls(low, high, bins)

    def text(self, state: np.ndarray) -> str:
        """`state` [dims] as its bins, e.g. `07 93 50` for 100 bins; a state of other dimensions is an error."""
        state = np.asarray(state, dtype=np.float64)
        if state.shape != self.low.shape:
            raise ActionTokenError(f"a state of {state.size} dimensions, but the state bins have {self.low.size}")
        bins = np.clip(np.floor((state - self.low) / (self.high - self.low) * self.bins), 0, self.bins - 1)
        width = len(str(self.bins - 1))
        return " ".join(f"{int(b):0{width}d}" for b in bins)


@dataclass(frozen=True)
class ActionTokenizer:
    edges: np.ndarray  # [dims, bins + 1], increasing along each row
    first_id: int  # the id of bin 0
    chunk: int  # actions per chunk
    state: StateBins | None = None  # how the prompts write the state (`vla.state_bins`), saved with the action bins

    @property
    def dims(self) -> int:
        return self.edges.shape[0]

    @property
    def bins(self) -> int:
        return self.edges.shape[1] - 1

    @property
    def token_ids(self) -> list[int]:
        """Every action token, bin 0 first: the only ids a rollout may sample."""
        return list(range(self.first_id, self.first_id + self.bins))

    @property
    def tokens_per_chunk(self) -> int:
        return self.chunk * self.dims

    @classmethod
    def uniform(cls, low, high, bins: int, first_id: int, chunk: int = 1) -> ActionTokenizer:
        """`bins` equal intervals per dimension over [low, high] (per-dimension arrays, or scalars)."""
        low, high = np.atleast_1d(np.asarray(low, dtype=np.float64)), np.atleast_1d(np.asarray(high, dtype=np.float64))
        if low.shape != high.shape or not np.all(np.isfinite(low)) or not np.all(np.isfinite(high)) or np.any(high <= low):
            raise ActionTokenError(f"uniform action bins need finite bounds with low < high in every dimension, got "
                                   f"low={low.tolist()} high={high.tolist()}")
        fractions = np.linspace(0.0, 1.0, bins + 1)
        return cls.from_edges(low[:, None] + (high - low)[:, None] * fractions[None, :], first_id, chunk)

    @classmethod
    def uniform_q99(cls, actions: np.ndarray, bins: int, first_id: int, chunk: int = 1) -> ActionTokenizer:
        """Equal bins between the 1st and 99th percentiles of `actions` [N, dims] (OpenVLA's q01/q99 bounds): a few
        outlying demonstration actions do not stretch every bin; values beyond fall in the end bins."""
        actions = np.asarray(actions, dtype=np.float64)
        if actions.ndim != 2 or actions.shape[0] < 2:
            raise ActionTokenError(f"percentile bounds need at least 2 actions laid out [N, dims], got shape "
                                   f"{list(actions.shape)}")
        low, high = np.quantile(actions, 0.01, axis=0), np.quantile(actions, 0.99, axis=0)
        high = np.where(high > low, high, low + 1e-6 * np.maximum(1.0, np.abs(low)))  # a joint held still
        return cls.uniform(low, high, bins, first_id, chunk)

    @classmethod
    def quantile(cls, actions: np.ndarray, bins: int, first_id: int, chunk: int = 1) -> ActionTokenizer:
        """Edges at the quantiles 0, 1/bins, ..., 1 of `actions` [N, dims] (demonstration actions)."""
        actions = np.asarray(actions, dtype=np.float64)
        if actions.ndim != 2 or actions.shape[0] < 2:
            raise ActionTokenError(f"quantile action bins need at least 2 actions laid out [N, dims], got shape "
                                   f"{list(actions.shape)}")
        edges = np.quantile(actions, np.linspace(0.0, 1.0, bins + 1), axis=0).T  # [dims, bins + 1]
        # Repeated values (a dimension the expert often holds still) make equal quantiles: nudge each edge above
        # its predecessor so that every bin is an interval and the edges stay sorted.
        for row in edges:
            for j in range(1, len(row)):
                row[j] = max(row[j], np.nextafter(row[j - 1], np.inf))
        return cls.from_edges(edges, first_id, chunk)

    @classmethod
    def from_edges(cls, edges: np.ndarray, first_id: int, chunk: int) -> ActionTokenizer:
        """Bins from their edges [dims, bins + 1] (saved ones: `oxrl.vla.build.load_action_tokens`), checked."""
        if edges.shape[1] < 3:
            raise ActionTokenError(f"action tokens need at least 2 bins per dimension, got {edges.shape[1] - 1}")
        if chunk < 1:
            raise ActionTokenError(f"an action chunk holds at least 1 action, got {chunk}")
        if first_id < 0:
            raise ActionTokenError(f"the vocabulary is too small for {edges.shape[1] - 1} action bins")
        return cls(edges, first_id, chunk)

    def encode(self, actions) -> list[int]:
        """Token ids of a chunk [chunk, dims] (or one action [dims] when chunk is 1), time-major."""
        actions = np.asarray(actions, dtype=np.float64).reshape(-1, self.dims)
        if actions.shape[0] != self.chunk:
            raise ActionTokenError(f"a chunk is {self.chunk} action(s) of {self.dims} dimensions, got {actions.shape[0]}")
        ids = []
        for action in actions:
            for d, value in enumerate(action):
                if not np.isfinite(value):
                    raise ActionTokenError(f"action dimension {d} is {value}: actions must be finite")
                # the bin whose [left, right) holds the value; the top edge belongs to the last bin
                b = int(np.searchsorted(self.edges[d], value, side="right")) - 1
                ids.append(self.first_id + min(max(b, 0), self.bins - 1))
        return ids

    def decode(self, ids: list[int]) -> np.ndarray:
        """The chunk [chunk, dims] of bin centres that `ids` name; ids that are not a whole chunk of action tokens are
        an error naming the first bad position."""
        if len(ids) != self.tokens_per_chunk:
            raise ActionTokenError(f"an action chunk is {self.tokens_per_chunk} tokens ({self.chunk} x {self.dims}), "
                                   f"got {len(ids)}")
        bins = np.asarray(ids, dtype=np.int64) - self.first_id
        bad = np.nonzero((bins < 0) | (bins >= self.bins))[0]
        if bad.size:
            raise ActionTokenError(f"token {int(ids[bad[0]])} at position {int(bad[0])} of the chunk is not an action "
                                   f"token (ids {self.first_id}..{self.first_id + self.bins - 1})")
        dims = np.arange(self.tokens_per_chunk) % self.dims
        centres = (self.edges[dims, bins] + self.edges[dims, bins + 1]) / 2
        return centres.reshape(self.chunk, self.dims)

    def half_widths(self) -> np.ndarray:
        """[dims, bins] half of each bin's width: the most a decoded value can differ from the one encoded."""
        return np.diff(self.edges, axis=1) / 2


def last_vocabulary_ids(tokenizer, bins: int, model_vocab: int | None = None) -> int:
    """The first of the last `bins` ids of `tokenizer`'s base vocabulary, checked to hold no special token and to
    have an embedding row in the model (`model_vocab`)."""
    size = tokenizer.vocab_size
    first = size - bins
    if first < 1:
        raise ActionTokenError(f"{bins} action bins do not fit a vocabulary of {size} tokens: lower vla.bins")
    special = sorted(set(tokenizer.all_special_ids) & set(range(first, size)))
    if special:
        raise ActionTokenError(f"the last {bins} ids of the vocabulary ({first}..{size - 1}) include the special "
                               f"token id(s) {special[:5]}: lower vla.bins")
    if model_vocab is not None and size > model_vocab:
        raise ActionTokenError(f"the tokenizer's vocabulary ({size}) is larger than the model's embedding ({model_vocab})")
    return first
