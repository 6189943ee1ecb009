"""Which device a tool runs on, and why CUDA is not usable when it is not: no silent CPU fallback on a GPU machine.

A single process on a machine with no GPU allocated runs on CPU by itself (``make demo``). Under a distributed
launcher, or with GPUs allocated (``CUDA_VISIBLE_DEVICES``, Slurm's GPU variables, a loaded NVIDIA driver), a CUDA
that does not work is an error naming the cause (a driver too old for the torch build, a CPU-only torch, GPUs
hidden...), unless the user asks for CPU: ``--device cpu`` or ``SOFTFREE_MM_DEVICE=cpu``. Without that, ``bash
tools/dist_train.sh CFG 8`` on a node whose driver is too old would train 8 CPU processes over gloo.

``python softfree_mm/engine/device.py [--launcher L] [--device D]`` is the same check as a one-line preflight
(exit status 2), which tools/dist_*.sh run before torchrun; this file needs torch only (run as a script it loads
none of the mm stack).
"""
import os
import re
import sys
from typing import Dict, List, Optional

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
