"""How long `oxrl train` takes to start, and what it prints on the way.

    .venv/bin/python benchmarks/startup.py                      # 3 tiny runs, 2 SmolLM2 runs, 3 x `oxrl --help`
    .venv/bin/python benchmarks/startup.py --runs 1 --example-runs 0   # a quick check that it works
    .venv/bin/python benchmarks/startup.py --runs 1 --example-runs 0 --tokenizer DIR   # and no GGUF tokenizer to read

What is measured (each run a fresh `python -m oxrl ...` process, as a user starts it):

* `oxrl --help`: the wall time of the whole process.
* A tiny run: a 2-layer random Llama (3.2M parameters, the SmolLM2 tokenizer) saved in a temporary
  folder, SFT on 24 chat rows, `train.max_steps=1`, no progress bar. A pure start-up measurement:
  the step itself takes milliseconds.
* The bundled example `examples/sft_smollm2_chat.yaml` with `train.max_steps=1` (SmolLM2-135M,
  batch 8, up to 512 tokens), run once untimed first so that the bundled model's one-time GGUF
  conversion is cached (measured warm).

For each: **to model** = from starting the process to the `loaded <model>` log line (imports, config,
data, model load), **to step 1** = to the wall-clock time stamp of step 1 in the run's
`metrics.jsonl` (everything before the first optimizer step, and that step), **total** = to the
process's exit (the final save, and the example's sample generations). Reported: the median over the
runs. The same output is searched for the noise this benchmark was written against: DeepSpeed's
"Setting accelerator to CPU" warning, transformers' "Writing model shards" bars, and a
missing/unexpected-keys report.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as `python benchmarks/startup.py`: make `oxrl` and `benchmarks` importable
    sys.path.insert(0, str(ROOT))

from benchmarks.common import machine_summary, print_table  # noqa: E402

NOISE = {
    "deepspeed warning": "Setting accelerator to CPU",
    "shard bars": "Writing model shards: 100%",
    "key tables": "LOAD REPORT",
}
LOADED = re.compile(r"oxrl\.models\.load: loaded ")


def build_tiny(folder: Path, tokenizer_dir: Path | None) -> Path:
    """A tiny random Llama with the bundled SmolLM2 tokenizer (or the one in `tokenizer_dir`), a chat file and a
    config; the config's path."""
    import yaml
    from transformers import AutoTokenizer

    from tests.conftest import bundled_gguf, save_tiny_model, write_chat_rows

    if tokenizer_dir is not None:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    else:
        gguf = bundled_gguf()
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    save_tiny_model(folder / "tiny-model", tokenizer)
    write_chat_rows(folder / "chat.jsonl", 24)
    config = {
        "run": {"name": "tiny", "output_dir": str(folder / "runs")},
        "model": {"name_or_path": str(folder / "tiny-model")},
        "data": {"train": [{"path": str(folder / "chat.jsonl")}], "max_length": 64},
        "algorithm": {"name": "sft"},
        "train": {"global_batch_size": 4, "micro_batch_size_per_device": 2, "max_steps": 1},
        "logging": {"progress_bar": False},
    }
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def time_process(args: list[str], run_dir: Path | None = None) -> dict:
    """Start `python -m oxrl <args>`; the seconds to the model-loaded line, to step 1 and to the exit."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    start = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "oxrl", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    to_model = None
    output = []
    for line in proc.stdout:
        output.append(line)
        if to_model is None and LOADED.search(line):
            to_model = time.time() - start
    proc.wait()
    total = time.time() - start
    text = "".join(output)
    if proc.returncode != 0:
        raise RuntimeError(f"oxrl {' '.join(args)} exited with {proc.returncode}:\n{text[-3000:]}")
    to_step = None
    if run_dir is not None:
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        to_step = next(r["time"] for r in rows if r["step"] == 1) - start
    return {"to_model": to_model, "to_step": to_step, "total": total, "lines": text.count("\n"),
            **{name: text.count(needle) for name, needle in NOISE.items()}}


def summarise(name: str, runs: list[dict]) -> dict[str, str]:
    def median(key: str) -> str:
        values = [r[key] for r in runs if r[key] is not None]
        return f"{statistics.median(values):.2f}" if values else "-"

    return {"run": name, "runs": str(len(runs)), "to model s": median("to_model"), "to step 1 s": median("to_step"),
            "total s": median("total"), "output lines": str(runs[-1]["lines"]),
            **{k: str(runs[-1][k]) for k in NOISE}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="timed tiny runs (and `oxrl --help` runs)")
    parser.add_argument("--example-runs", type=int, default=2, help="timed SmolLM2 example runs (0: skip)")
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="a folder with tokenizer files for the tiny run (default: the bundled SmolLM2's GGUF file)")
    args = parser.parse_args(argv)

    print(machine_summary())
    rows = []
    with tempfile.TemporaryDirectory(prefix="oxrl-startup-") as tmp:
        tmp = Path(tmp)
        rows.append(summarise("oxrl --help", [time_process(["--help"]) for _ in range(args.runs)]))
        tiny = build_tiny(tmp, args.tokenizer)
        run_dir = tmp / "runs" / "tiny"
        time_process(["train", str(tiny), "run.overwrite=true"], run_dir)  # warm the page cache
        rows.append(summarise("tiny SFT, 1 step", [time_process(["train", str(tiny), "run.overwrite=true"], run_dir)
                                                    for _ in range(args.runs)]))
        if args.example_runs:
            example = ["train", "examples/sft_smollm2_chat.yaml", "train.max_steps=1",
                       f"run.output_dir={tmp / 'runs'}", "run.overwrite=true"]
            example_dir = tmp / "runs" / "sft-smollm2-chat"
            time_process(example, example_dir)  # untimed: converts (once) and caches the bundled model
            rows.append(summarise("SmolLM2 SFT example, 1 step",
                                  [time_process(example, example_dir) for _ in range(args.example_runs)]))
    print_table(rows, title="Start-up (median seconds from starting the process; noise counted in the last run's output)")
    print("load avg after:", " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
