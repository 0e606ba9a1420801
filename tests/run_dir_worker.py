"""Run-directory claims under `torchrun --nproc_per_node 2` (gloo, CPU), for tests/integration/test_run_dir.py.

    torchrun --nproc_per_node 2 -m tests.run_dir_worker OUT_DIR

Every rank claims an unnamed run (rank 0 picks the name), then a run whose directory already holds
a run (rank 0 refuses; rank 1 must fail too, not wait), and writes what it saw to OUT_DIR/rank<r>.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from oxrl.config.schema import Config
from oxrl.training import distributed
from oxrl.training.run_dir import RunDirError
from oxrl.training.build import build_strategy
from oxrl.runner import claimed_run


def main() -> None:
    out = Path(sys.argv[1])
    cfg = Config.model_validate({"run": {"output_dir": str(out / "runs"), "device": "cpu"}, "model": {"name_or_path": "unused"},
                                 "algorithm": {"name": "sft"}, "strategy": {"name": "fsdp2"}})
    strategy = build_strategy(cfg)
    seen: dict = {}
    with claimed_run(cfg, strategy) as (named, run_dir):
        seen.update(name=named.run.name, run_dir=str(run_dir))
    taken = cfg.model_copy(update={"run": cfg.run.model_copy(update={"name": "taken"})})
    try:
        with claimed_run(taken, strategy):
            seen["taken"] = "claimed"
    except RunDirError as error:
        seen["taken"] = str(error)
    (out / f"rank{strategy.rank}.json").write_text(json.dumps(seen))
    # Both ranks leave together: gloo can abort a process whose peer tore the group down first.
    distributed.barrier()
    strategy.close()


if __name__ == "__main__":
    main()
