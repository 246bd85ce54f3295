"""Heads on the target's hidden states (EAGLE-3's layout): one decoder layer at the target's width reading the
residual stream at a few target layers, fused by a linear layer, with a pruned draft vocabulary and its
draft→target id map. `shape` declares a head's dimensions (torch-free), `model` is the module, `proposer` its
proposer for the one speculative loop, `folder` the folder vLLM serves as `eagle3`."""
