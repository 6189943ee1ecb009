"""Forward hooks on the attention kernels: capture of their inputs (any backbone, any kernel) and the mmengine hook
that records attention norms during training."""
from .attention_stats import AttentionStatsHook
from .capture import AttentionCall, AttentionCapture, attention_layers

__all__ = ['AttentionCall', 'AttentionCapture', 'AttentionStatsHook', 'attention_layers']
