"""`run.push_to_hub`: upload the run's `final/` folder to the Hugging Face Hub, after everything else is written.

Only huggingface_hub's public API: `HfApi.create_repo(..., private=, exist_ok=True)` then `HfApi.upload_folder`.
The token is the environment's `HF_TOKEN` (huggingface_hub's own login when unset); it is registered with the log
redaction before any call, so no error message or log line can show it. A failed upload raises `HubPushError`,
one line that names the repository and says `final/` is kept; the trained folder is never touched.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from oxrl.config.schema import Config
from oxrl.errors import UserError
from oxrl.logging.redaction import redact, register_secret

logger = logging.getLogger(__name__)


class HubPushError(UserError, RuntimeError):
    """The upload of a trained folder to the Hub failed; the folder is still on disk."""


def hub_api(token: str | None):
    """The client the push talks to: the seam a test replaces with a fake (oxRL's own function, not the library's)."""
    from huggingface_hub import HfApi

    return HfApi(token=token)


def push_folder(folder: Path, repo_id: str, private: bool) -> str:
    """Create `repo_id` (private or not; an existing one is kept) and upload `folder` to it; returns its URL."""
    token = os.environ.get("HF_TOKEN") or None
    if token is not None:
        register_secret(token)
    logger.info("pushing %s to the Hugging Face Hub as %s (%s)", folder, repo_id, "private" if private else "public")
    try:
        api = hub_api(token)
        url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="model",
                          commit_message="Upload a model trained with oxRL")
    except Exception as error:  # any failure of the client or the network: one line, the folder kept
        reason = redact(str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__)
        raise HubPushError(f"pushing {folder} to the Hugging Face Hub as {repo_id} failed: {reason}. The trained model "
                           f"is kept in {folder}; upload it later with `huggingface-cli upload {repo_id} {folder}` "
                           "(a token with write access in HF_TOKEN)") from None
    logger.info("pushed %s to %s", folder, url)
    return str(url)


def push_final(cfg: Config, final_dir: Path | None) -> str:
    """`run.push_to_hub`: the run's final folder to `run.hub_model_id` (the config requires `checkpoint.save_final`)."""
    if final_dir is None:
        raise HubPushError(f"run.push_to_hub: no final model was written, so nothing was pushed to "
                           f"{cfg.run.hub_model_id}")
    return push_folder(final_dir, cfg.run.hub_model_id, cfg.run.hub_private)
