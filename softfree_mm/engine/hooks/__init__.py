"""The package's mmengine hooks and what they stand on: capture of every attention kernel's inputs (any backbone,
any kernel) with their layouts, the attention-norm statistics hook, and the reliability hooks the tools add
(random states in checkpoints, the non-finite-loss guard, a checkpoint when a signal comes)."""
from .attention_stats import AttentionStatsHook
from .capture import AttentionCall, AttentionCapture, attention_layers
from .loss_guard import NonFiniteLossHook
from .rng_state import RNGStateHook
from .signal_checkpoint import CheckpointOnSignalHook

__all__ = ['AttentionCall', 'AttentionCapture', 'AttentionStatsHook', 'CheckpointOnSignalHook', 'NonFiniteLossHook',
           'RNGStateHook', 'attention_layers']
