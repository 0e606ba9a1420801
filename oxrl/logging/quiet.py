"""Other libraries' console output that says nothing to an oxRL user, kept off the console.

    quiet_other_libraries()     # once, by `setup_logging`: DeepSpeed's "Setting accelerator to CPU" notice
    with no_progress_bars():    # transformers' bars (loading and writing weights), for the block only
    with no_key_report():       # transformers' table of missing/unexpected keys of a load, for the block only
    with no_dataset_bars():     # datasets' bars ("Generating train split" of a local file), for the block only

Scoped toggles, never the libraries' global switches: a user's own code in the same process, and the
downloads a run makes from the Hugging Face hub, keep their bars.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

# DeepSpeed logs this at import whenever no GPU is found; on a CPU that is the expected case, not news. It goes to
# stdout, where it also lands in output meant for a file (`oxrl onboard`'s Markdown).
_DEEPSPEED_CPU_NOTICE = "Setting accelerator to CPU"


def _not_the_cpu_notice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_DEEPSPEED_CPU_NOTICE)


def quiet_other_libraries() -> None:
    """Drop DeepSpeed's CPU notice. A filter on its logger (`DeepSpeed`, created at its import with its own
    handler): every other DeepSpeed message still shows. Idempotent."""
    deepspeed = logging.getLogger("DeepSpeed")
    if _not_the_cpu_notice not in deepspeed.filters:
        deepspeed.addFilter(_not_the_cpu_notice)


@contextmanager
def no_progress_bars():
    """Within the block, transformers draws no progress bars (its "Writing model shards" bar on every
    `save_pretrained`); the user's own setting is back afterwards.

    Uses transformers' `set_tqdm_hook` (which returns the previous hook to restore): the hook creates
    every bar with `disable=True`, passing it on through any hook already set. Versions without the
    hook (before 5.x) draw no bar on save, so there it does nothing. A scoped toggle, not the global
    `disable_progress_bar()`, which would also switch off the user's huggingface_hub download bars.
    """
    from transformers.utils import logging as hf_logging

    set_hook = getattr(hf_logging, "set_tqdm_hook", None)
    if set_hook is None:
        yield
        return
    previous = None

    def quiet(factory, args, kwargs):
        kwargs = {**kwargs, "disable": True}
        return previous(factory, args, kwargs) if previous is not None else factory(*args, **kwargs)

    previous = set_hook(quiet)
    try:
        yield
    finally:
        set_hook(previous)


@contextmanager
def no_dataset_bars():
    """Within the block, `datasets` draws no progress bars (its "Generating train split" bar for every local file
    read); its own setting is back afterwards."""
    from datasets.utils import logging as datasets_logging

    enabled = datasets_logging.is_progress_bar_enabled()
    datasets_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            datasets_logging.enable_progress_bar()


class KeyReportFilter(logging.Filter):
    """Drops transformers' key report: 5.x's "<Model> LOAD REPORT" table (with ANSI colours), 4.x's "Some weights of
    ..." lines. Every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        return "LOAD REPORT" not in message and not message.startswith("Some weights of")


@contextmanager
def no_key_report():
    """Within the block, transformers' `from_pretrained` shows no table of missing and unexpected keys, for a load
    whose new head is the point (PPO's critic, a reward model built from a causal LM): the caller reads the keys from
    `output_loading_info=True` and says in one line what is new. A filter on the logger the report is logged to."""
    report = logging.getLogger("transformers.modeling_utils")
    hold_back = KeyReportFilter()
    report.addFilter(hold_back)
    try:
        yield
    finally:
        report.removeFilter(hold_back)
