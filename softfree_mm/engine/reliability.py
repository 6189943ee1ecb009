"""The reliability pieces once kept in one module; they now live by concern in errors, data_errors, checkpoints
and hooks.rng_state / hooks.loss_guard (this module re-exports them for existing imports)."""
from .checkpoints import (CHECK_MODES, _CKPT_RE, _readable, check_checkpoint, latest_checkpoint,  # noqa: F401
                          load_state_dict_of, remove_stale_temporaries)
from .data_errors import (COCO_FIELDS, IMAGE_KEYS, _chain, _jpeg_cut_short, _truncated, data_file_error,  # noqa: F401
                          json_problem, name_failing_samples)
from .errors import BadInput, NonFiniteLoss, error_line  # noqa: F401
from .hooks.loss_guard import NonFiniteLossHook  # noqa: F401
from .hooks.rng_state import (RNGStateHook, _RestoreAfter, _rng_from_checkpoint, _rng_to_checkpoint,  # noqa: F401
                              capture_rng, restore_rng)
