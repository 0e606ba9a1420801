"""Regenerate the arithmetic KTO rows: `python examples/data/make_arithmetic_kto.py`.

KTO learns from single answers labelled desirable or not, no pairs needed. These rows are the
preference pairs of make_arithmetic_preferences.py (same questions, same split) taken apart: each
question keeps only ONE of its two answers, the correct one (`label: true`) or the near-miss
(`label: false`), alternately, so no question shows both and the data are truly unpaired (KTO,
arXiv:2402.01306, also trains with one answer per prompt), e.g.

    {"messages": [{"role": "user", "content": "What is 38 + 45?"}],
     "completion": [{"role": "assistant", "content": "38 + 45 = 83"}], "label": true}
"""

from __future__ import annotations

import json
from pathlib import Path

from make_arithmetic_preferences import build

HERE = Path(__file__).parent
TRAIN_FILE, TEST_FILE = HERE / "arithmetic_kto_train.jsonl", HERE / "arithmetic_kto_test.jsonl"


def unpaired(pairs: list[dict]) -> list[dict]:
    rows = []
    for index, pair in enumerate(pairs):
        desirable = index % 2 == 0
        answer = pair["chosen"] if desirable else pair["rejected"]
        rows.append({"messages": pair["messages"], "completion": answer, "label": desirable})
    return rows


def files() -> dict[Path, list[dict]]:
    train, test = build()
    return {TRAIN_FILE: unpaired(train), TEST_FILE: unpaired(test)}


def main() -> None:
    for path, rows in files().items():
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        print(f"wrote {len(rows)} rows to {path}")


if __name__ == "__main__":
    main()
