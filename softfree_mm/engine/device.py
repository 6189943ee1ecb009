"""Which device a tool runs on, with no silent CPU fallback on a GPU machine, and the settings a machine or a
cluster job needs (CPU stand-ins for SyncBN / nccl / DDP device ids, --amp, Slurm's port and CPUs).

One process on a machine without GPUs runs on CPU by itself; under a launcher, with GPUs allocated or with --device
cuda, a CUDA that does not work is an error naming the cause unless CPU is asked for (--device cpu,
$SOFTFREE_MM_DEVICE=cpu): else a node whose driver is too old would train N CPU processes over gloo. Run as a script
(tools/dist_*.sh's preflight) this file loads torch only, so the mm stack and the errors are imported in functions.
"""
import os
import re
import sys
from typing import TYPE_CHECKING, Dict, List, Optional

if TYPE_CHECKING:
    from mmengine.config import Config

DEVICES = ('auto', 'cuda', 'cpu')
DEVICE_ENV = 'SOFTFREE_MM_DEVICE'
# the oldest Linux driver each CUDA major version runs on (NVIDIA's minor-version compatibility table)
MIN_DRIVER = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580, 65, 6)}
GPU_ENV = ('SLURM_GPUS', 'SLURM_GPUS_ON_NODE', 'SLURM_JOB_GPUS', 'SLURM_STEP_GPUS', 'SLURM_GPUS_PER_NODE',
           'SLURM_GPUS_PER_TASK', 'SLURM_TRES_PER_TASK')
DRIVER_FILE = '/proc/driver/nvidia/version'


class DeviceError(Exception):
    """CUDA was expected and is not usable; one line, exit status 2."""


def requested(arg: Optional[str] = None) -> str:
    """The device asked for: the --device argument, else $SOFTFREE_MM_DEVICE, else 'auto'."""
    dev = arg or os.environ.get(DEVICE_ENV) or 'auto'
    if dev not in DEVICES:
        raise DeviceError(f'device {dev!r} is not one of {", ".join(DEVICES)} (--device or ${DEVICE_ENV})')
    return dev


def hide_gpus_if_cpu(device: str) -> None:
    """An explicit CPU request hides the GPUs before anything initialises CUDA, so that every part (mmengine's
    device choice, DDP, SyncBN) takes its CPU path."""
    if device == 'cpu':
        os.environ['CUDA_VISIBLE_DEVICES'] = ''


def _visible_hides_all(value: Optional[str]) -> bool:
    return value is not None and value.strip() in ('', '-1', 'NoDevFiles', 'none')


def gpus_allocated(env: Optional[Dict[str, str]] = None, driver_file: str = DRIVER_FILE) -> List[str]:
    """Signs that this process was given GPUs: set, non-empty GPU variables of Slurm, a CUDA_VISIBLE_DEVICES naming
    devices, a loaded NVIDIA kernel driver. Empty list: none."""
    env = os.environ if env is None else env
    signs = [f'{k}={env[k]}' for k in GPU_ENV if env.get(k, '').strip() not in ('', '0')
             and (k != 'SLURM_TRES_PER_TASK' or 'gpu' in env[k])]
    visible = env.get('CUDA_VISIBLE_DEVICES')
    if visible is not None and not _visible_hides_all(visible):
        signs.append(f'CUDA_VISIBLE_DEVICES={visible}')
    if driver_file and os.path.exists(driver_file):
        signs.append(f'an NVIDIA driver is loaded ({driver_file})')
    return signs


def driver_version(driver_file: str = DRIVER_FILE) -> Optional[str]:
    """The NVIDIA kernel driver's version (e.g. '535.104.05'), or None without a driver."""
    try:
        with open(driver_file) as f:
            text = f.read()
    except OSError:
        return None
    m = re.search(r'Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)', text) or re.search(r'\b(\d{3}\.\d+(?:\.\d+)?)\b',
                                                                                         text)
    return m.group(1) if m else None


def _version_tuple(v: str):
    return tuple(int(x) for x in re.findall(r'\d+', v))


def cuda_problem(torch_version: str, torch_cuda: Optional[str], driver: Optional[str],
                 visible: Optional[str], torch_says: str = '') -> str:
    """Why CUDA is not usable, from the facts: the torch build, its CUDA version, the driver version, the
    CUDA_VISIBLE_DEVICES value and what torch itself warned. A pure function (tested with each cause)."""
    if not torch_cuda:
        return (f'this torch ({torch_version}) is a CPU-only build; install a CUDA build '
                '(TORCH_INDEX_URL=https://download.pytorch.org/whl/cuXXX bash tools/setup_env.sh)')
    if _visible_hides_all(visible):
        return f'CUDA_VISIBLE_DEVICES={visible!r} hides every GPU'
    if driver is None:
        return f'no NVIDIA driver is loaded ({DRIVER_FILE} is missing) although torch is built for CUDA {torch_cuda}'
    major = _version_tuple(torch_cuda)[0]
    need = MIN_DRIVER.get(major)
    if need is not None and _version_tuple(driver) < need:
        older = max((m for m, d in MIN_DRIVER.items() if _version_tuple(driver) >= d), default=None)
        fix = (f'install a torch built for CUDA {older}.x (TORCH_INDEX_URL=https://download.pytorch.org/whl/cu{older}X'
               ' with a version that has one, see tools/setup_env.sh)' if older else 'update the NVIDIA driver')
        return (f'the NVIDIA driver {driver} is too old for this torch ({torch_version}, CUDA {torch_cuda} needs '
                f'driver >= {".".join(str(x) for x in need)}); update the driver or {fix}')
    said = ' '.join(torch_says.split())
    return f'torch.cuda.is_available() is False (driver {driver}, torch CUDA {torch_cuda})' + \
        (f': {said}' if said else '')


def diagnose() -> Optional[str]:
    """None when CUDA works, else the cause in one line."""
    import warnings
    import torch
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        ok = torch.cuda.is_available()
    if ok:
        return None
    said = '; '.join(str(w.message) for w in caught if 'CUDA' in str(w.message))
    return cuda_problem(torch.__version__, torch.version.cuda, driver_version(),
                        os.environ.get('CUDA_VISIBLE_DEVICES'), said)


def check(device: str = 'auto', launcher: str = 'none') -> str:
    """The device the tool will run on, 'cuda' or 'cpu'; raises DeviceError when CUDA is expected and unusable."""
    if device == 'cpu':
        return 'cpu'
    problem = diagnose()
    if problem is None:
        return 'cuda'
    signs = gpus_allocated()
    if device == 'auto' and launcher == 'none' and not signs:
        return 'cpu'  # a CPU machine: the single-process tools run on CPU
    why = ('--device cuda' if device == 'cuda' else f'--launcher {launcher}' if launcher != 'none'
           else 'GPUs are allocated: ' + ', '.join(signs))
    raise DeviceError(f'CUDA is not usable ({why}): {problem}. To run on CPU on purpose, add --device cpu '
                      f'(or set {DEVICE_ENV}=cpu)')


def select_device(device: Optional[str], launcher: str) -> str:
    """'cuda' or 'cpu' as :func:`check` decides; its DeviceError as the tools' UsageError."""
    from .errors import UsageError
    try:
        return check(requested(device), launcher)
    except DeviceError as e:
        raise UsageError(str(e)) from None


# ------------------------------------------------------------------------------------------ settings per machine
def _replace_syncbn(node) -> int:
    n = 0
    if isinstance(node, dict):
        if node.get('type') in ('SyncBN', 'MMSyncBN', 'TorchSyncBN'):
            node['type'] = 'BN'
            n += 1
        for v in node.values():
            n += _replace_syncbn(v)
    elif isinstance(node, list):
        for v in node:
            n += _replace_syncbn(v)
    return n


def apply_device_settings(cfg: 'Config', launcher: str) -> List[str]:
    """Settings a machine without CUDA needs; returns a note for each change made."""
    import torch
    notes = []
    if torch.cuda.is_available():
        return notes
    # SyncBN needs CUDA: plain BN (statistics per process) is the CPU stand-in
    if _replace_syncbn(cfg._cfg_dict.get('model')):
        notes.append('no CUDA: SyncBN -> BN')
    cfg.setdefault('env_cfg', {})
    cfg.env_cfg.setdefault('dist_cfg', {})
    if cfg.env_cfg.dist_cfg.get('backend', 'nccl') != 'gloo':
        cfg.env_cfg.dist_cfg.backend = 'gloo'
        notes.append('no CUDA: distributed backend gloo')
    if launcher != 'none':
        # DDP refuses device_ids for CPU modules
        wrapper = cfg.get('model_wrapper_cfg') or dict(type='MMDistributedDataParallel')
        wrapper['device_ids'] = None
        cfg.model_wrapper_cfg = wrapper
        notes.append('no CUDA: DDP without device_ids')
    return notes


def check_cuda_ops(cfg: 'Config') -> None:
    """A detector on CUDA needs nms / roi_align on CUDA: mmcv's own (compiled with CUDA) or torchvision's (the
    stand-in for mmcv._ext, or the compat route of a compiled mmcv without CUDA ops). Names what is missing."""
    if cfg.default_scope != 'mmdet':
        return
    import torch

    from softfree_mm import compat

    from .errors import UsageError
    if compat.mmcv_has_cuda_ops():
        return
    if os.environ.get(compat.ROUTE_ENV) == '0' and not compat.mmcv_ext_is_standin():
        raise UsageError(f'mmcv {_mmcv_version()} has no CUDA ops and {compat.ROUTE_ENV}=0 turns the torchvision '
                         'route off: the detector cannot run nms / roi_align on CUDA; unset it, or build mmcv with '
                         'CUDA ops (MMCV_CUDA=1 bash tools/setup_env.sh)')
    try:
        cuda_ops = torch.ops.torchvision._cuda_version() > 0
    except Exception:
        cuda_ops = False
    if not cuda_ops:
        import torchvision
        raise UsageError(f'mmcv {_mmcv_version()} has no CUDA ops and torchvision {torchvision.__version__} none '
                         'either: the detector cannot run nms / roi_align on CUDA; install the torchvision built for '
                         f'torch {torch.__version__} (CUDA {torch.version.cuda})')


def _mmcv_version() -> str:
    try:
        import mmcv
        return mmcv.__version__
    except ImportError:
        return '(not installed)'


def enable_determinism_env(cfg: 'Config') -> None:
    """cuBLAS refuses deterministic mode unless its workspace is fixed before its first use."""
    if (cfg.get('randomness') or {}).get('deterministic'):
        os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')


AMP_DTYPES = ('auto', 'float16', 'bfloat16')


def amp_dtype(requested: str = 'auto') -> str:
    """The autocast dtype of --amp: bfloat16 where the GPU has it (no overflow at 65504, the loss scaler idle),
    else float16 with dynamic loss scaling; or the one asked for."""
    import torch

    from .errors import UsageError
    if requested not in AMP_DTYPES:
        raise UsageError(f'--amp-dtype {requested!r}: valid values are {", ".join(AMP_DTYPES)}')
    bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if requested == 'auto':
        return 'bfloat16' if bf16 else 'float16'
    if requested == 'bfloat16' and not bf16:
        raise UsageError(f'--amp-dtype bfloat16: {torch.cuda.get_device_name()} has no bfloat16; use float16')
    return requested


def enable_amp(cfg: 'Config', dtype: str = 'auto') -> str:
    import torch

    from .errors import UsageError
    if not torch.cuda.is_available():
        raise UsageError('--amp needs CUDA (mmengine AmpOptimWrapper); this machine has none')
    wrapper = cfg.optim_wrapper.get('type', 'OptimWrapper')
    if wrapper not in ('OptimWrapper', 'AmpOptimWrapper'):
        raise UsageError(f'--amp works with optim_wrapper.type OptimWrapper, the config has {wrapper!r}')
    dtype = amp_dtype(dtype)
    cfg.optim_wrapper.type = 'AmpOptimWrapper'
    cfg.optim_wrapper.dtype = dtype
    cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
    return dtype


# ------------------------------------------------------------------------------------------ settings per cluster
SLURM_PORTS = (20000, 30000)  # below Linux's ephemeral range (32768-60999)


def slurm_master_port(job_id: str, step_id: str = '0') -> int:
    """A port every task of one Slurm job step computes alike and two jobs on one node do not share (unless their
    ids differ by a multiple of 10000)."""
    lo, hi = SLURM_PORTS
    return lo + (int(job_id) * 7 + int(step_id or 0)) % (hi - lo)


def apply_cluster_settings(cfg: 'Config', launcher: str) -> List[str]:
    """What a cluster job needs from the environment: a MASTER_PORT of its own under Slurm (two jobs on one node
    would both take 29500), and no more data-loading workers than the CPUs Slurm gave each task."""
    notes = []
    if launcher == 'slurm' and 'MASTER_PORT' not in os.environ and os.environ.get('SLURM_JOB_ID', '').isdigit():
        step = os.environ.get('SLURM_STEP_ID', '0')
        port = slurm_master_port(os.environ['SLURM_JOB_ID'], step if step.isdigit() else '0')
        os.environ['MASTER_PORT'] = str(port)
        notes.append(f'MASTER_PORT={port} (from SLURM_JOB_ID)')
    cpus = os.environ.get('SLURM_CPUS_PER_TASK', '')
    if cpus.isdigit():
        most = max(1, int(cpus) - 1)  # one CPU for the training process itself
        for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
            loader = cfg.get(key)
            if loader and loader.get('num_workers', 0) > most:
                notes.append(f'{key}.num_workers {loader.num_workers} -> {most} (SLURM_CPUS_PER_TASK={cpus})')
                loader.num_workers = most
    return notes


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(description='Check that the device the tools would use works (preflight)')
    p.add_argument('--launcher', default='none')
    p.add_argument('--device', default=None)
    args, _ = p.parse_known_args(argv)
    try:
        dev = check(requested(args.device), args.launcher)
    except DeviceError as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    print(dev)
    return 0


if __name__ == '__main__':
    sys.exit(main())
