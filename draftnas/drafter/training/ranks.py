"""Training across processes with torch's own launcher: `torchrun --nproc_per_node N -m draftnas distill head
...` starts N copies of the command, and each reads its rank from the environment torchrun sets. Each process
trains on its own rows of every step (the step's rows are the per-process rows times N), the gradients are
averaged over the processes before each optimizer step (an all-reduce, as DistributedDataParallel does), so
every process holds the same weights, and the tokens a step taught are summed over them, so the budget counts
every process's tokens. Rank 0 alone writes checkpoints, the head folder and the result. CPU processes talk
over gloo, CUDA ones over gloo for host tensors and NCCL for GPU tensors, each on its local rank's GPU.

Run by itself (no torchrun), a command is rank 0 of 1 and nothing here talks to anything.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Ranks:
    """This process's place among the training processes."""

    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def total(self, count: int) -> int:
        """`count` summed over the processes."""
        if self.world == 1:
            return count
        import torch
        import torch.distributed as dist

        t = torch.tensor([count], dtype=torch.long)
        dist.all_reduce(t)
        return int(t.item())

    def average_gradients(self, params: Iterable[Any]) -> None:
        """Each parameter's gradient replaced by its mean over the processes (a missing one counts as 0)."""
        if self.world == 1:
            return
        import torch
        import torch.distributed as dist

        for p in params:
            grad = p.grad if p.grad is not None else torch.zeros_like(p)
            dist.all_reduce(grad)
            p.grad = grad / self.world

    def sum_(self, tensor: Any) -> Any:
        """`tensor` summed over the processes, in place (each filled its own rows, zeros elsewhere)."""
        if self.world > 1:
            import torch.distributed as dist

            dist.all_reduce(tensor)
        return tensor

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def share(self, count: int) -> int:
        """This process's part of `count` things split as evenly as the processes allow."""
        return count // self.world + (1 if self.rank < count % self.world else 0)


def launched_ranks() -> Ranks:
    """The ranks torchrun's environment says (rank 0 of 1 without it), read without starting anything."""
    return Ranks(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")))


def start_ranks(device: str) -> Ranks:
    """This process's ranks, its process group started where torchrun launched several (gloo on CPU; on CUDA
    gloo for host tensors and NCCL for GPU ones, this process on its local rank's GPU)."""
    ranks = launched_ranks()
    if ranks.world == 1:
        return ranks
    import torch
    import torch.distributed as dist

    if device.startswith("cuda"):
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group(backend="cpu:gloo,cuda:nccl" if device.startswith("cuda") else "gloo")
    return ranks


def stop_ranks(ranks: Ranks) -> None:
    """The process group ended (where one was started)."""
    if ranks.world > 1:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
