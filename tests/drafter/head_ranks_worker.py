"""One process of `test_head_ranks`: launched by torchrun, it trains the tiny head of tests/drafter/
test_head_train.py on DATA with its ranks and saves what it holds at the end to OUT/rank<R>.pt."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from draftnas.drafter.head.records import HeadTrainRequest
from draftnas.drafter.head.train import HeadTrainer
from draftnas.drafter.training.distill_store import iter_sequences, read_manifest
from draftnas.drafter.training.packing import build_stream
from draftnas.drafter.training.ranks import start_ranks, stop_ranks


def main(data: str, out: str, features: str) -> None:
    from tests.drafter.test_head_train import _head, _held
    from tests.helpers import tiny_config, tiny_llama

    torch.set_num_threads(1)
    ranks = start_ranks("cpu")
    target = tiny_llama(tiny_config(), initializer_range=0.2).requires_grad_(False)
    request = HeadTrainRequest(data=data, out=out, tokens=500, seq_len=16, batch_rows=2, readings=3,
                               warmup_tokens=50, lr=5e-3, unroll=2, checkpoint_minutes=1000.0,
                               features=features)
    Path(out).mkdir(parents=True, exist_ok=True)
    head = _head(target)
    trainer = HeadTrainer(request, head, target, _held(target, head), Path(out), "key", None, ranks)
    finished = trainer.train(build_stream(list(iter_sequences(data, read_manifest(data)))))
    trainer.save()
    torch.save({"finished": finished, "tokens": trainer.state.tokens, "world": ranks.world,
                "head": head.state_dict(), "store": trainer.store,
                "readings": [r.tokens_per_step for r in trainer.state.readings]},
               Path(out) / f"rank{ranks.rank}.pt")
    stop_ranks(ranks)


if __name__ == "__main__":
    main(*sys.argv[1:4])
