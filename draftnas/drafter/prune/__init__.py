"""Pruning: which heads, KV groups, MLP channels and layers a drafter keeps (importance strategies and the
statistics they read), the plan that records it, its checks, and the surgery that applies it."""
