"""Shared fixtures. Tests never reach a model hub: HF_HUB_OFFLINE is forced on."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# stored calibrations and kernel choices of this test session only (subprocesses inherit it): a test
# never reads what an earlier run on this machine stored; converted models stay in the user's cache.
# A folder made here is removed when the session ends, so test runs leave nothing behind in /tmp.
if "DRAFTNAS_STATE" not in os.environ:
    import atexit
    import shutil
    import tempfile

    _STATE = tempfile.mkdtemp(prefix="draftnas-test-state-")
    os.environ["DRAFTNAS_STATE"] = _STATE
    atexit.register(shutil.rmtree, _STATE, ignore_errors=True)

import pytest  # noqa: E402


@pytest.fixture
def one_thread():
    """torch on one thread while a test runs: a shared 2-core box decodes small models faster so
    (no OpenMP hand-offs)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_llama_config():
    """A 4-layer LLaMA config small enough to build in milliseconds (GQA 4 q / 2 kv heads)."""
    from tests.helpers import tiny_config

    return tiny_config()


@pytest.fixture(scope="session")
def smollm2():
    """The embedded SmolLM2-135M-Instruct (converted once into the user cache)."""
    from draftnas.models.sources import load_model

    return load_model("smollm2-135m")
