"""`DataConfig` -> tokenized training and validation examples, all of them before any training.

Every row of every dataset is read, validated and tokenized up front, so a bad row stops the run
before any compute is spent (or, with `skip_invalid_rows`, is skipped and counted). Then, when no
validation datasets are given, `validation_fraction` of each training dataset's examples is held
out (seeded, before mixing, so no held-out row is also trained on), and the rest is mixed.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from oxrl.config.schema import DataConfig, DatasetSpec
from oxrl.data.errors import DataError
from oxrl.data.formats import detect_format, parse_row
from oxrl.data.mix import mix
from oxrl.data.read import RawDataset, Row, dataset_name, read_dataset
from oxrl.data.tokenize import NO_TRAINED_TOKENS_LEFT, ExampleTokenizer, truncate
from oxrl.data.types import Example

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

INVALID_ROW = "invalid_row"  # a key of `LoadedData.skipped`, beside those of `oxrl.data.tokenize`
_LOGGED_SKIPS = 5  # skipped rows logged one by one per dataset; the rest only counted

T = TypeVar("T")


@dataclass
class LoadedData:
    train: list[Example]
    validation: list[Example]
    counts: dict[str, int]  # training examples contributed by each dataset (after mixing)
    skipped: dict[str, int]  # rows skipped, by reason: invalid_row, too_long, no_trained_tokens_after_truncation


def load_examples(cfg: DataConfig, tokenizer: PreTrainedTokenizerBase, *, seed: int, processor=None,
                  readers: dict[str, Callable[[DatasetSpec], list[Example]]] | None = None) -> LoadedData:
    """`processor`: a vision-language model's, which renders chats and turns rows' images into image tokens.
    `readers`: formats read by a caller's own code (`lerobot`: robot demonstrations, oxrl/vla/build.py), each a
    dataset spec -> its examples, then truncated and mixed as every other dataset's."""
    row_tokenizer = ExampleTokenizer(tokenizer, processor)
    skipped: Counter[str] = Counter()
    names = distinct_names(cfg.train)
    readers = readers or {}
    per_dataset = {name: _load_dataset(spec, cfg, row_tokenizer, skipped, readers.get(spec.format))
                   for name, spec in zip(names, cfg.train)}
    validation: list[Example] = []
    if cfg.validation:  # (a DataConfig with both validation datasets and validation_fraction is refused)
        for spec in cfg.validation:
            validation.extend(_load_dataset(spec, cfg, row_tokenizer, skipped, readers.get(spec.format)))
    elif cfg.validation_fraction:
        per_dataset, validation = hold_out(per_dataset, cfg.validation_fraction, seed)

    weights = {name: spec.weight for name, spec in zip(names, cfg.train)}
    train, counts = mix(per_dataset, weights, total=cfg.num_examples, seed=seed)
    _check_compatible(train + validation)
    if skipped[NO_TRAINED_TOKENS_LEFT]:
        logger.warning("%d rows lost all their trained tokens to truncation (data.max_length=%d) and were skipped",
                       skipped[NO_TRAINED_TOKENS_LEFT], cfg.max_length)
    logger.info("data: %d training / %d validation examples; per dataset %s; skipped %s",
                len(train), len(validation), counts, dict(skipped) or "none")
    return LoadedData(train, validation, counts, dict(skipped))


def distinct_names(specs: list[DatasetSpec]) -> list[str]:
    """The datasets' names (logs, mixing counts, hold-out seeds), which must differ."""
    names = [dataset_name(spec) for spec in specs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"several training datasets are named {duplicates}; give each a distinct `name`")
    return names


def _load_dataset(
    spec: DatasetSpec, cfg: DataConfig, row_tokenizer: ExampleTokenizer, skipped: Counter[str],
    reader: Callable[[DatasetSpec], list[Example]] | None = None,
) -> list[Example]:
    """Every usable row of one dataset as an Example; raises DataError on the first bad row unless skipping."""
    if reader is not None:
        return _truncated(reader(spec), cfg, spec.path, skipped)
    raw = read_dataset(spec)
    fmt = detect_format(raw.columns, raw.location) if spec.format == "auto" else spec.format
    logger.info("%s: %d rows, format %s%s", raw.name, len(raw.rows), fmt, " (detected)" if spec.format == "auto" else "")

    def example(row: Row) -> Example:
        parsed = parse_row(fmt, row.values, location=raw.location, row=row.number, chat_template=spec.chat_template,
                           image_root=raw.root, max_image_pixels=cfg.max_image_pixels)
        return row_tokenizer.example(parsed, source=raw.name, location=raw.location, row=row.number)

    parsed, invalid = parse_rows(raw, example, cfg.skip_invalid_rows)
    if invalid:
        skipped[INVALID_ROW] += invalid
    # After parsing: truncation "error" stops the run even when invalid rows are skipped.
    examples = _truncated(parsed, cfg, raw.location, skipped)
    if not examples:
        # Every row was skipped: say why now, rather than after the model has loaded.
        raise DataError(raw.location, None, None, f"none of its {len(raw.rows)} rows is usable: {invalid} invalid "
                        f"(data.skip_invalid_rows), {len(raw.rows) - invalid} too long for data.max_length="
                        f"{cfg.max_length} (data.truncation={cfg.truncation!r})")
    return examples


def _truncated(examples: list[Example], cfg: DataConfig, location: str, skipped: Counter[str]) -> list[Example]:
    """The examples that fit `data.max_length` (by `data.truncation`); the others counted in `skipped`."""
    kept_examples = []
    for each in examples:
        kept, reason = truncate(each, cfg.max_length, cfg.truncation, location=location)
        if kept is None:
            skipped[reason] += 1
        else:
            kept_examples.append(kept)
    return kept_examples


def parse_rows(raw: RawDataset, parse: Callable[[Row], T], skip_invalid_rows: bool) -> tuple[list[T], int]:
    """`parse` of every row, in order, and how many rows were invalid.

    A row that could not be read, or whose `parse` raises a DataError, stops the run, or with
    `skip_invalid_rows` is skipped, counted and (the first few) logged.
    """
    parsed: list[T] = []
    invalid = 0
    for row in raw.rows:
        try:
            if row.error is not None:
                raise row.error
            parsed.append(parse(row))
        except DataError as error:
            if not skip_invalid_rows:
                raise
            invalid += 1
            if invalid <= _LOGGED_SKIPS:
                logger.warning("skipping invalid row: %s", error)
    if invalid:
        logger.warning("%s: skipped %d invalid rows of %d (data.skip_invalid_rows)", raw.name, invalid, len(raw.rows))
    return parsed, invalid


def hold_out(per_dataset: dict[str, list[T]], fraction: float, seed: int) -> tuple[dict[str, list[T]], list[T]]:
    """Move `fraction` of each dataset (at least one item, never all) to validation, seeded by name."""
    train: dict[str, list[T]] = {}
    validation: list[T] = []
    for name, examples in per_dataset.items():
        size = len(examples)
        held_count = min(max(1, round(size * fraction)), size - 1) if size > 1 else 0
        held = set(random.Random(f"{seed}:validation:{name}").sample(range(size), held_count))
        train[name] = [e for i, e in enumerate(examples) if i not in held]
        validation.extend(e for i, e in enumerate(examples) if i in held)
    return train, validation


def _check_compatible(examples: list[Example]) -> None:
    """Examples batched together need the same number of sequences and the same per-example fields."""
    shapes: dict[tuple[int, tuple[str, ...]], str] = {}
    for example in examples:
        shapes.setdefault((len(example.sequences), tuple(sorted(example.fields))), example.source)
    if len(shapes) > 1:
        described = "; ".join(
            f"{source}: {n} sequence(s) per example, fields {list(keys)}" for (n, keys), source in shapes.items()
        )
        raise ValueError(f"these datasets cannot be trained together (different row formats): {described}")
