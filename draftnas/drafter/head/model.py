"""The head module, in the layout vLLM's `eagle3` loads (`LlamaForCausalLMEagle3`):

- `fc` fuses the target's residual stream at the head's layers, [A·H] → H;
- one decoder layer whose attention reads [norm(embedding of the token), norm(hidden)] (2H wide), the
  hidden input being the residual: row p reads the target's features at position p and the token at p+1,
  and predicts the token at p+2;
- the final norm, then `lm_head` over the draft vocabulary; draft id i is target id i + d2t[i].

A draft step after the first reads the head's own output before its final norm (`prenorm`) as the hidden
input, one position further, as vLLM's EAGLE proposer does. The token embedding is the target's own (the
head keeps none). Rows are one sequence, [T, H]; the KV cache is positional (a row written at position p
overwrites what a rejected draft left there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from draftnas.drafter.head.shape import HeadShape
from draftnas.models.decoder import RMSNorm

#: the head's weight names (vLLM's and the published EAGLE-3 checkpoints')
MIDLAYER = "midlayer."


@dataclass
class HeadCache:
    """The head's keys and values, [kv_heads, slots, head_dim] each."""

    keys: torch.Tensor
    values: torch.Tensor

    @property
    def slots(self) -> int:
        return int(self.keys.shape[1])


class Eagle3Head(nn.Module):
    d2t: torch.Tensor  # draft id i is target id i + d2t[i] (vLLM's offsets)
    inv_freq: torch.Tensor  # RoPE's

    def __init__(self, shape: HeadShape, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.shape = shape
        h, q, kv = shape.hidden_size, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
        f: dict[str, Any] = {"dtype": dtype, "device": device}
        self.fc = nn.Linear(len(shape.layers) * h, h, bias=False, **f)
        self.input_layernorm = RMSNorm(h, shape.rms_norm_eps, False, **f)
        self.hidden_norm = RMSNorm(h, shape.rms_norm_eps, False, **f)
        self.post_attention_layernorm = RMSNorm(h, shape.rms_norm_eps, False, **f)
        self.q_proj = nn.Linear(2 * h, q, bias=False, **f)
        self.k_proj = nn.Linear(2 * h, kv, bias=False, **f)
        self.v_proj = nn.Linear(2 * h, kv, bias=False, **f)
        self.o_proj = nn.Linear(q, h, bias=False, **f)
        self.gate_proj = nn.Linear(h, shape.ffn, bias=False, **f)
        self.up_proj = nn.Linear(h, shape.ffn, bias=False, **f)
        self.down_proj = nn.Linear(shape.ffn, h, bias=False, **f)
        self.norm = RMSNorm(h, shape.rms_norm_eps, False, **f)
        self.lm_head = nn.Linear(h, shape.draft_vocab, bias=False, **f)
        self.register_buffer("d2t", torch.zeros(shape.draft_vocab, dtype=torch.long, device=device))
        half = torch.arange(0, shape.head_dim, 2, dtype=torch.float64, device=device) / shape.head_dim
        self.register_buffer("inv_freq", (1.0 / shape.rope_theta ** half).float(), persistent=False)

    # the weights under vLLM's names
    def named_weights(self) -> dict[str, torch.Tensor]:
        """The head's tensors under the names vLLM's `eagle3` loader reads (d2t only where the draft
        vocabulary is smaller than the target's: vLLM has no map otherwise)."""
        mid = {"input_layernorm": self.input_layernorm, "hidden_norm": self.hidden_norm,
               "post_attention_layernorm": self.post_attention_layernorm}
        out = {"fc.weight": self.fc.weight, "norm.weight": self.norm.weight,
               "lm_head.weight": self.lm_head.weight}
        out |= {f"{MIDLAYER}{k}.weight": m.weight for k, m in mid.items()}
        out |= {f"{MIDLAYER}self_attn.{k}.weight": getattr(self, k).weight
                for k in ("q_proj", "k_proj", "v_proj", "o_proj")}
        out |= {f"{MIDLAYER}mlp.{k}.weight": getattr(self, k).weight
                for k in ("gate_proj", "up_proj", "down_proj")}
        if self.shape.draft_vocab < self.shape.target.vocab_size:
            out["d2t"] = self.d2t
        return out

    def set_draft_ids(self, ids: Sequence[int] | torch.Tensor) -> None:
        """The target ids of the draft vocabulary's rows, ascending (stored as vLLM's offsets d2t)."""
        table = torch.as_tensor(ids, dtype=torch.long, device=self.d2t.device)
        self.d2t.copy_(table - torch.arange(table.numel(), device=table.device))

    def draft_ids(self) -> torch.Tensor:
        """The target id of each draft-vocabulary row."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def new_cache(self, slots: int) -> HeadCache:
        s = self.shape
        w = self.fc.weight
        zeros = torch.zeros(s.kv_heads, slots, s.head_dim, dtype=w.dtype, device=w.device)
        return HeadCache(zeros, zeros.clone())

    def fuse(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's residual stream at the head's layers, [A, T, H], fused to the head's hidden input
        [T, H] (the layers side by side, in the head's order, as vLLM concatenates them)."""
        a, t, h = hidden.shape
        return self.fc(hidden.to(self.fc.weight.dtype).permute(1, 0, 2).reshape(t, a * h))

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = positions.float()[:, None] * self.inv_freq[None]  # [T, d/2]
        cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), -1)
        return (x.float() * cos[:, None] + rotated.float() * sin[:, None]).to(x.dtype)

    def _qkv(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries [..., T, heads, d] and keys, values [..., T, kv_heads, d] of rows reading `embeds` and
        `hidden` [..., T, H] at `positions` [T] (RoPE applied)."""
        s = self.shape
        x = torch.cat((self.input_layernorm(embeds), self.hidden_norm(hidden)), -1)
        lead = x.shape[:-1]
        q = self._rope(self.q_proj(x).view(*lead, s.heads, s.head_dim), positions)
        k = self._rope(self.k_proj(x).view(*lead, s.kv_heads, s.head_dim), positions)
        return q, k, self.v_proj(x).view(*lead, s.kv_heads, s.head_dim)

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
                ) -> torch.Tensor:
        """Attention of q [..., T, heads, d] over keys, values [..., S, kv_heads, d] where `mask` [T, S]
        allows -> [..., T, heads·d]."""
        group = self.shape.heads // self.shape.kv_heads
        keys = keys.transpose(-3, -2).repeat_interleave(group, -3)
        values = values.transpose(-3, -2).repeat_interleave(group, -3)
        out = F.scaled_dot_product_attention(q.transpose(-3, -2), keys, values, attn_mask=mask)
        return out.transpose(-3, -2).flatten(-2)

    def _finish(self, hidden: torch.Tensor, attended: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's residual additions after attention and the final norm: (normed, prenorm)."""
        residual = hidden + self.o_proj(attended)
        y = self.post_attention_layernorm(residual)
        residual = residual + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))
        return self.norm(residual), residual

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                cache: HeadCache | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows [T, H] of token embeddings and hidden inputs at `positions` [T] (increasing) -> (the normed
        output for the logits, the output before the final norm for the next draft step), [T, H] each.
        With `cache` the rows' keys and values are written at their positions and each row attends to every
        slot at or before its own; without, the rows attend causally among themselves."""
        q, k, v = self._qkv(embeds, hidden, positions)
        if cache is None:
            keys, values = k, v
            mask = torch.ones(len(positions), len(positions), dtype=torch.bool, device=q.device).tril()
        else:
            cache.keys[:, positions] = k.transpose(0, 1)
            cache.values[:, positions] = v.transpose(0, 1)
            end = int(positions[-1]) + 1
            keys, values = cache.keys[:, :end].transpose(0, 1), cache.values[:, :end].transpose(0, 1)
            mask = torch.arange(end, device=q.device)[None] <= positions[:, None]
        return self._finish(hidden, self._attend(q, keys, values, mask))

    def unrolled(self, embeds: torch.Tensor, features: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training and exact held-out acceptance: `steps` draft steps over rows [B, T, H] at positions
        0..T-1 at once, the normed output of each, [B, T, H].

        Row p of step 0 reads the target's features at p; row p of step j > 0 reads step j-1's output at
        p - 1 (before the final norm), as the j-th draft after base b = p - j does at inference. Both read
        the token at p + 1 (what the draft is, where every draft before it was accepted). Row p of step j
        attends to step 0's rows at or before b and to the rows of its own chain, step i's row b + i for
        1 <= i <= j: the keys the head's cache holds when it drafts there."""
        t = embeds.shape[-2]
        positions = torch.arange(t, device=embeds.device)
        p, s = positions[:, None], positions[None]
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        outs: list[torch.Tensor] = []
        hidden, prenorm = features, features
        for j in range(steps):
            if j:
                hidden = torch.cat((torch.zeros_like(prenorm[..., :1, :]), prenorm[..., :-1, :]), -2)
            q, k, v = self._qkv(embeds, hidden, positions)
            keys.append(k)
            values.append(v)
            blocks = [s <= p - j] + [s == p - j + i for i in range(1, j + 1)]
            normed, prenorm = self._finish(hidden, self._attend(q, torch.cat(keys, -3), torch.cat(values, -3),
                                                                torch.cat(blocks, -1)))
            outs.append(normed)
        return outs

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary, [..., draft_vocab]."""
        return self.lm_head(normed)


def init_head(head: Eagle3Head, target_head: torch.Tensor, draft_ids: Sequence[int] | torch.Tensor,
              *, seed: int = 0, std: float = 0.02) -> Eagle3Head:
    """A head ready to train: its output rows the target's own rows of `draft_ids` (ascending target ids),
    its norms ones, every other weight N(0, std²) from `seed`, and `fc` the mean of its layers."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * std)
        ids = torch.as_tensor(draft_ids, dtype=torch.long)
        head.lm_head.weight.copy_(target_head[ids.to(target_head.device)].to(head.lm_head.weight))
        h, a = head.shape.hidden_size, len(head.shape.layers)
        head.fc.weight.copy_(torch.eye(h).repeat(1, a) / a)
        head.set_draft_ids(ids)
    return head
