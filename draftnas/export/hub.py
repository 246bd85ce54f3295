"""Publishing an exported folder to the model hub (when the machine is online).
"""

from __future__ import annotations

from pathlib import Path

from draftnas.core.errors import ExportError
from draftnas.models.sources import hub_reachable


def push_to_hub(folder: str | Path, repo: str, *, private: bool = False) -> str:
    """Upload an exported folder to the hub; ExportError (one line) when the machine is offline."""
    if not hub_reachable():
        raise ExportError(f"cannot push to {repo}: the model hub is unreachable from this machine "
                          f"(offline or HF_HUB_OFFLINE set); the drafter is saved at {folder}, upload it "
                          f"later with: huggingface-cli upload {repo} {folder}")
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        api.create_repo(repo, private=private, exist_ok=True)
        api.upload_folder(repo_id=repo, folder_path=str(folder), commit_message="draftnas export")
    except Exception as exc:  # noqa: BLE001 - hub errors vary (auth, network); one line for the CLI
        raise ExportError(f"push to {repo} failed: {type(exc).__name__}: {exc}".splitlines()[0]) from exc
    return f"https://huggingface.co/{repo}"
