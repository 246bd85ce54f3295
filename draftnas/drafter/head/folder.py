"""A head's folder, as vLLM serves it with `method: eagle3` (and as published EAGLE-3 heads are laid out):
`config.json` with architectures `LlamaForCausalLMEagle3`, one layer, the target's vocabulary size,
`draft_vocab_size`, `target_hidden_size` and `eagle_config.eagle_aux_hidden_state_layer_ids`, and
`model.safetensors` with `fc`, `midlayer.*`, `norm`, `lm_head`, `d2t` (draft→target id offsets, where the
draft vocabulary is smaller than the target's) and `t2d`. draftnas adds `draftnas_head` to the config: the
target the head was made for, the tokens it was trained on and the prompts its data came from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from draftnas.core.errors import InvalidInputError
from draftnas.core.records import write_folder_atomically
from draftnas.drafter.head.shape import HeadShape, TargetKey, check_same_target, shape_problems

ARCHITECTURE = "LlamaForCausalLMEagle3"
WEIGHTS = "model.safetensors"
OWN_KEY = "draftnas_head"


def write_head(head: Any, out: str | Path, *, trained_tokens: int = 0, extra: dict[str, Any] | None = None
               ) -> Path:
    """The `Eagle3Head` `head` as a folder at `out` (replacing what is there), atomically; `extra`: more of
    draftnas's own fields in the config (its training, its data)."""
    import torch
    from safetensors.torch import save_file

    def write(tmp: Path) -> None:
        config = head_config(head.shape, trained_tokens=trained_tokens, extra=extra)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        weights = {k: v.detach().to("cpu").contiguous() for k, v in head.named_weights().items()}
        t2d = torch.zeros(head.shape.target.vocab_size, dtype=torch.bool)
        t2d[head.draft_ids().cpu()] = True
        save_file(weights | {"t2d": t2d}, str(tmp / WEIGHTS), metadata={"format": "pt"})

    return write_folder_atomically(out, write)


def is_head_folder(folder: str | Path) -> bool:
    """Whether `folder` holds a head (its config names the EAGLE-3 architecture)."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return any("Eagle3" in str(a) for a in config.get("architectures") or ())


def head_config(shape: HeadShape, *, trained_tokens: int = 0, extra: dict[str, Any] | None = None
                ) -> dict[str, Any]:
    """The config.json of a head of `shape`."""
    return {
        "architectures": [ARCHITECTURE], "model_type": "llama", "num_hidden_layers": 1,
        "hidden_size": shape.hidden_size, "target_hidden_size": shape.hidden_size,
        "intermediate_size": shape.ffn, "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim, "hidden_act": "silu", "rms_norm_eps": shape.rms_norm_eps,
        "rope_theta": shape.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": shape.rope_theta},
        "max_position_embeddings": shape.max_positions, "vocab_size": shape.target.vocab_size,
        "draft_vocab_size": shape.draft_vocab, "tie_word_embeddings": False, "attention_bias": False,
        "torch_dtype": "float32",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(shape.layers),
                         "use_aux_hidden_state": True},
        # llama.cpp's converter reads the layers here (vLLM in eagle_config)
        "eagle_aux_hidden_state_layer_ids": list(shape.layers),
        OWN_KEY: {"shape": shape.to_dict(), "trained_tokens": trained_tokens} | (extra or {}),
    }


def read_config(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InvalidInputError(f"{folder}: no readable head config ({e.__class__.__name__}); a head folder "
                                "holds config.json and model.safetensors") from e
    if not is_head_folder(folder):
        raise InvalidInputError(f"{folder}: its config names {config.get('architectures')}, not a head "
                                f"({ARCHITECTURE})")
    return config


def read_shape(folder: str | Path) -> HeadShape:
    """The shape of the head in `folder` (draftnas's record where it wrote one, else read from the standard
    fields of a published head; its target then known by width and vocabulary only)."""
    config = read_config(folder)
    own = config.get(OWN_KEY) or {}
    if "shape" in own:
        shape = HeadShape.from_dict(own["shape"])
    else:
        eagle = config.get("eagle_config") or {}
        key = "eagle_aux_hidden_state_layer_ids"
        layers = config.get(key) or eagle.get(key)
        if not layers:
            raise InvalidInputError(f"{folder}: the head names no target layers "
                                    "(eagle_config.eagle_aux_hidden_state_layer_ids)")
        heads = int(config["num_attention_heads"])
        hidden = int(config.get("target_hidden_size") or config["hidden_size"])
        shape = HeadShape(
            target=TargetKey(name="its target", layers=0, hidden_size=hidden,
                             vocab_size=int(config["vocab_size"])),
            layers=tuple(int(i) for i in layers), draft_vocab=int(config.get("draft_vocab_size") or
                                                                  config["vocab_size"]),
            ffn=int(config["intermediate_size"]), heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
            rope_theta=float((config.get("rope_parameters") or {}).get("rope_theta",
                                                                        config.get("rope_theta", 10000.0))),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            max_positions=int(config.get("max_position_embeddings", 4096)))
    return shape


def head_for_target(folder: str | Path, target: TargetKey) -> HeadShape:
    """The head's shape, checked against the target it is loaded with (one line where it was made for
    another, or where a layer it reads lies outside this target)."""
    shape = read_shape(folder)
    made_for = shape.target
    if made_for.layers == 0:  # a published head: its layer count is not recorded
        made_for = TargetKey(made_for.name, target.layers, made_for.hidden_size, made_for.vocab_size)
    check_same_target(made_for, target, str(folder))
    problems = shape_problems(HeadShape.from_dict(shape.to_dict() | {"target": target.to_dict()}))
    if problems:
        raise InvalidInputError(f"{folder}: the head does not fit the target here: "
                                + "; ".join(f"{name} {said}" for name, said in problems))
    return shape


def trained_tokens(folder: str | Path) -> int:
    """Tokens the head was trained on (0: untrained; a published head's are not recorded: -1)."""
    own = read_config(folder).get(OWN_KEY)
    return int(own.get("trained_tokens", 0)) if own else -1


def head_trained_prompts(folder: str | Path) -> tuple[str, ...]:
    """Keys (`heal_records.prompt_key`) of the shipped prompts the head's data answered: a bench leaves them
    out. Empty for anything that is no head folder of draftnas's."""
    if not is_head_folder(folder):
        return ()
    own = read_config(folder).get(OWN_KEY) or {}
    return tuple(own.get("trained_prompts") or ())


def load_head(folder: str | Path, target: TargetKey, *, device: str = "cpu") -> Any:
    """The head in `folder` as an `Eagle3Head` in fp32, checked against `target`."""
    import torch
    from safetensors.torch import load_file

    from draftnas.drafter.head.model import MIDLAYER, Eagle3Head

    shape = head_for_target(folder, target)
    shape = HeadShape.from_dict(shape.to_dict() | {"target": target.to_dict()})
    head = Eagle3Head(shape, device=device)
    weights = load_file(str(Path(folder) / WEIGHTS), device=device)
    own = head.named_weights()
    missing = [k for k in own if k not in weights]
    if missing:
        raise InvalidInputError(f"{folder}: its weights miss {', '.join(missing[:3])} (a head holds "
                                f"fc, {MIDLAYER}*, norm and lm_head)")
    with torch.no_grad():
        for name, tensor in own.items():
            got = weights[name]
            if tuple(got.shape) != tuple(tensor.shape):
                raise InvalidInputError(f"{folder}: {name} has shape {tuple(got.shape)}, its config says "
                                        f"{tuple(tensor.shape)}")
            tensor.copy_(got.to(tensor.dtype))
    return head.eval()
