"""The names tools/train.py and tools/test.py once took from one module; they now live by concern in
config_checks, device, runner and errors (this module re-exports them for existing imports)."""
from .config_checks import (DATALOADERS, EVALUATORS, LAUNCH_ENV, LAUNCH_HOW, TASKS, VIS_BACKEND_PACKAGES,  # noqa: F401
                            _datasets, _option_problem, _walk, check_attention, check_data, check_launcher,
                            check_model_types, check_pretrained, check_types, check_vis_backends, data_roots,
                            demo_roots, load_config, registered_names, unknown_types)
from .device import (AMP_DTYPES, SLURM_PORTS, _mmcv_version, _replace_syncbn, amp_dtype,  # noqa: F401
                     apply_cluster_settings, apply_device_settings, check_cuda_ops, enable_amp,
                     enable_determinism_env, select_device, slurm_master_port)
from .errors import UsageError, short_error  # noqa: F401
from .runner import (RANK_ENV, _RunStarted, add_reliability_hooks, build_runner, enable_auto_scale_lr,  # noqa: F401
                     finish_dist, print_error, run)
