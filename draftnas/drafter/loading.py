"""Loading a drafter folder draftnas wrote: a reduced head is built with this package's own class (never
code shipped in the folder) and its kept ids checked against `draft_vocab.json`; any other spec loads as
`models.sources.load_model` loads it. Below the search, which prices exported drafters as references."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

from draftnas.core.errors import ModelSourceError
from draftnas.drafter.records import VOCAB_FILE, load_vocab_subset
from draftnas.drafter.vocab import apply_vocab_subset
from draftnas.models import hf_head
from draftnas.models.records import HEAD_MODULE_FILE
from draftnas.models.sources import LoadedModel, auto_class_name, load_model, names_draftnas_head

log = logging.getLogger(__name__)


#: sha256 of copies of draftnas/models/hf_head.py that earlier draftnas versions wrote into folders ->
#: what plain transformers gets from that copy. They define the same classes over the same
#: weights, so draftnas (which builds the class from its own package) still loads such a folder.
EARLIER_HEAD_COPIES = {
    "ac674263583e45e68437c335d1cc812905bc9d6de43e74a1d685976ec6aec259":
        "its forward hides its parameters behind **kwargs, so transformers' generate feeds the drafter "
        "the whole sequence at every assisted step",
    "ad994c8a7f6162e47cdca8cacb99f2b7df81940fbeb87b1f4f38571fbc37a3e2":
        "assisted generation asks the drafter for its candidates through transformers' full generate "
        "at every step (2.6% fewer assisted tokens/s, Gemma-3-270M on a 2-core AMD EPYC)",
    "20289f3b9a09622a03ebf190d366a09ec1ee6ab5fdca1df87b1d866de5980769":
        "from transformers 5.24 on, which passes an assistant its cache as `cache`, it answers only the "
        "first candidate call of a sequence with its own loop and leaves the rest to transformers' generate",
}


def reduced_head_class_of(folder: Path) -> Any:
    """The draftnas.models.hf_head class a draftnas reduced-head folder names, or None for other folders.

    draftnas never runs code shipped in a folder: the folder's copy must be this package's
    draftnas/models/hf_head.py byte for byte (or a known earlier copy, with a warning), and the class
    is built from the package.
    """
    auto = auto_class_name(folder)
    if not names_draftnas_head(folder):
        return None
    shipped = folder / HEAD_MODULE_FILE
    fallback = "re-export it with this draftnas, or load its full-head/ variant"
    if not shipped.is_file():
        raise ModelSourceError(f"{folder} is a draftnas reduced-head drafter but {shipped.name} is missing; "
                               + fallback)
    copy = shipped.read_bytes()
    earlier = EARLIER_HEAD_COPIES.get(hashlib.sha256(copy).hexdigest())
    if earlier is not None:
        log.warning("%s is an earlier draftnas copy: draftnas loads the folder with its own class, but in "
                    "plain transformers %s; re-export the drafter to ship the present copy", shipped, earlier)
    elif copy != Path(hf_head.__file__).read_bytes():
        raise ModelSourceError(f"{shipped} is not the file this draftnas ships (altered, or from another "
                               f"version), and draftnas runs no code from a folder; {fallback}")
    cls = getattr(hf_head, auto.split(".", 1)[1], None)
    if cls is None:
        raise ModelSourceError(f"{folder}/config.json names {auto}, which this draftnas does not define; "
                               + fallback)
    return cls


def _check_reduced_head(model: Any, folder: Path) -> None:
    """A reduced-head model's kept ids must be its draft_vocab.json's; records the subset."""

    if not (folder / VOCAB_FILE).is_file():
        raise ModelSourceError(f"{folder} has a reduced LM head but no {VOCAB_FILE}")
    subset = load_vocab_subset(folder)
    ids = model.draft_vocab_ids.tolist()
    if list(subset.ids) != ids or subset.vocab_size != model.config.vocab_size:
        raise ModelSourceError(f"{folder}/{VOCAB_FILE} ({subset.size} ids of {subset.vocab_size}) does not "
                               f"match the model's head ({len(ids)} rows of {model.config.vocab_size})")
    apply_vocab_subset(model, subset)


def load_drafter(spec: str, *, dtype: str = "float32", device: str = "cpu") -> LoadedModel:
    """A drafter from any spec (`models.sources.load_model`), a draftnas reduced-head folder included:
    that one is built with draftnas's own class and its kept ids checked against draft_vocab.json."""
    path = Path(spec).expanduser()
    cls = reduced_head_class_of(path) if path.is_dir() else None
    loaded = load_model(spec, dtype=dtype, device=device, model_class=cls)
    if cls is not None:
        _check_reduced_head(loaded.model, path)
    return loaded
