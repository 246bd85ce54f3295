"""Training to a token budget: self-distillation data made at scale and kept on disk, a drafter trained on
it (pretrain, then finetune), kept as a delta over its base, and the fitted curves of acceptance against
training tokens."""
