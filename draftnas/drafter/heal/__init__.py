"""Healing: a pruned drafter distilled toward its target (data, batches and losses, low-rank adapters,
and the records of what healing was asked and did)."""
