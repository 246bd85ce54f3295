"""One-token steps with each lone row padded to two, where whole steps time faster that way.

On some hosts a one-row product has a slow mode that shows on whole decode steps only, while
`MatmulChooser`, timing each shape's products on their own, keeps every form unpadded; so the choice
is made on whole steps (`benchmarks/row_padding.py`; figures in docs/hosts/amd-epyc-zen5-2core.md).

The slow mode also comes and goes inside one process, over seconds to minutes
(`benchmarks/row_padding.py --timeline 300`). A choice made in a fast spell would leave the run
unpadded through every slow one, so padding is kept unless it costs more than `tolerance` at the
moment of choice; where padding truly costs, it is still dropped.
"""

from __future__ import annotations

import statistics
import time

import torch

from draftnas.models import kernel_choices
from draftnas.models.decoder import StaticDecoder
from draftnas.models.records import MAX_WEIGHT_ONCE_ROWS


def choose_row_padding(decoder: StaticDecoder, steps: int = 4, rounds: int = 3,
                       tolerance: float = 0.02) -> bool:
    """CPU: time `decoder`'s one-token steps with every lone-row F.linear product as it is and padded
    to two rows (`MatmulChooser.pad_single_rows`), alternating `rounds` times, `steps` steps each,
    and keep padding unless its median costs more than `tolerance` (a fraction) over the unpadded
    one; inside `kernel_choices.kept_choices()` a choice made for the same shapes on this host is reused.
    Returns whether padding was kept (False on a device whose products are not chosen here, or
    of a decoder whose every product is quantized)."""
    chooser = decoder.matmul
    if not chooser.enabled or all(id(w) in chooser.packed for ws in chooser.by_shape.values() for w in ws):
        return False  # products not chosen here, or every one quantized: no F.linear row to pad
    context = MAX_WEIGHT_ONCE_ROWS + 1  # a context read by plain F.linear: it times no product form
    with torch.inference_mode():
        cache = decoder.new_cache(1, context + 1)
        ids = torch.zeros((1, context), dtype=torch.long, device=decoder.device)
        decoder(ids, torch.arange(context, device=decoder.device), cache)
        token, position = ids[:, :1], torch.tensor([context], device=decoder.device)
        decoder(token, position, cache)  # chooses each one-row product's form
        if not chooser.single_rows():
            return False
        store = kernel_choices.active()
        shapes = sorted((k[1], k[2], len(chooser.by_shape.get((k[1], k[2]), [])))
                        for k in chooser.single_rows())
        store_key = store.key("row-padding", str(decoder.dtype), shapes) if store else ""
        kept = store.get(store_key) if store else None
        if kept is not None:
            chooser.pad_single_rows(bool(kept))
            return bool(kept)
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(rounds):
            for padded in (False, True):
                chooser.pad_single_rows(padded)
                decoder(token, position, cache)
                started = time.perf_counter()
                for _ in range(steps):
                    decoder(token, position, cache)
                times[padded].append((time.perf_counter() - started) / steps)
    keep = statistics.median(times[True]) <= (1.0 + tolerance) * statistics.median(times[False])
    chooser.pad_single_rows(keep)
    if store:
        store.put(store_key, keep)
    return keep
