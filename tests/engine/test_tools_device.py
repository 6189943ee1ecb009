"""No silent CPU fallback, and the launcher defaults a cluster expects.

Guards: the cause of an unusable CUDA is named for each case (CPU-only torch, driver too old for the torch build's
CUDA, GPUs hidden, no driver); GPUs count as allocated from Slurm's variables, CUDA_VISIBLE_DEVICES or a loaded
driver; under a launcher, with GPUs allocated or with --device cuda, the tools stop with one line (exit status 2)
unless CPU is asked for, and tools/dist_train.sh stops before torchrun starts; one process on a CPU machine runs
on CPU by itself; Slurm jobs get a MASTER_PORT of their own and no more data workers than CPUs; the configs' worker
counts fit the Slurm scripts' CPUs per task; no cudnn benchmark where validation runs whole images of varying
sizes; --amp picks its dtype and refuses one the GPU lacks.
"""
import glob
import os
import os.path as osp
import re
import subprocess
import sys

import pytest
import torch

from softfree_mm.engine import config_checks, device, errors

from tests.helpers import ROOT, load_tool

CPU_MACHINE = not torch.cuda.is_available() and not osp.exists(device.DRIVER_FILE)
DEMO_CLS = osp.join(ROOT, 'configs', 'demo', 'cls_xcit_s12_poly3_demo.py')


def test_cause_cpu_only_torch_build():
    msg = device.cuda_problem('2.14.1+cpu', None, '580.65.06', None)
    assert 'CPU-only build' in msg and 'TORCH_INDEX_URL' in msg


def test_cause_driver_too_old_for_the_torch_cuda_names_both_and_an_older_cuda_build():
    msg = device.cuda_problem('2.14.1', '13.0', '535.104.05', '0,1')
    assert 'driver 535.104.05 is too old' in msg and 'CUDA 13.0 needs driver >= 580.65.6' in msg
    assert 'CUDA 12.x' in msg and 'cu12' in msg
    assert 'update the NVIDIA driver' in device.cuda_problem('2.14.1', '13.0', '418.40', None)
    # a new enough driver is not blamed
    assert 'too old' not in device.cuda_problem('2.14.1', '13.0', '580.82.07', None, 'CUDA unknown error')


def test_cause_hidden_gpus_and_missing_driver():
    assert 'hides every GPU' in device.cuda_problem('2.14.1', '13.0', '580.82.07', '')
    assert 'hides every GPU' in device.cuda_problem('2.14.1', '13.0', '580.82.07', '-1')
    assert 'no NVIDIA driver is loaded' in device.cuda_problem('2.14.1', '13.0', None, None)


def test_driver_version_read_from_the_kernel_module_file(tmp_path):
    f = tmp_path / 'version'
    f.write_text('NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n'
                 'GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n')
    assert device.driver_version(str(f)) == '535.104.05'
    f.write_text('NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build\n')
    assert device.driver_version(str(f)) == '580.65.06'
    assert device.driver_version(str(tmp_path / 'missing')) is None


def test_gpus_allocated_from_slurm_visible_devices_and_the_driver(tmp_path):
    assert device.gpus_allocated({}, driver_file=str(tmp_path / 'none')) == []
    assert device.gpus_allocated({'SLURM_GPUS_ON_NODE': '4'}, driver_file='') == ['SLURM_GPUS_ON_NODE=4']
    assert device.gpus_allocated({'SLURM_TRES_PER_TASK': 'cpu=8'}, driver_file='') == []
    assert device.gpus_allocated({'SLURM_TRES_PER_TASK': 'gres/gpu:1'}, driver_file='') != []
    assert device.gpus_allocated({'CUDA_VISIBLE_DEVICES': '0,1'}, driver_file='') == ['CUDA_VISIBLE_DEVICES=0,1']
    assert device.gpus_allocated({'CUDA_VISIBLE_DEVICES': ''}, driver_file='') == []
    drv = tmp_path / 'version'
    drv.write_text('Kernel Module  550.54.14')
    assert 'an NVIDIA driver is loaded' in device.gpus_allocated({}, driver_file=str(drv))[0]


@pytest.mark.skipif(not CPU_MACHINE, reason='what a machine without CUDA does')
def test_without_cuda_cpu_only_alone_or_when_asked(monkeypatch):
    for k in device.GPU_ENV + ('CUDA_VISIBLE_DEVICES', device.DEVICE_ENV):
        monkeypatch.delenv(k, raising=False)
    assert device.check('auto', 'none') == 'cpu'  # make demo on a CPU machine
    assert device.check('cpu', 'pytorch') == 'cpu'
    with pytest.raises(device.DeviceError, match=r'--launcher pytorch.*add --device cpu'):
        device.check('auto', 'pytorch')
    with pytest.raises(device.DeviceError, match=r'\(--device cuda\)'):
        device.check('cuda', 'none')
    monkeypatch.setenv('SLURM_GPUS_ON_NODE', '8')
    with pytest.raises(device.DeviceError, match='GPUs are allocated: SLURM_GPUS_ON_NODE=8'):
        device.check('auto', 'none')
    monkeypatch.setenv(device.DEVICE_ENV, 'cpu')
    assert device.check(device.requested(None), 'slurm') == 'cpu'
    monkeypatch.setenv(device.DEVICE_ENV, 'gpu')
    with pytest.raises(device.DeviceError, match="'gpu' is not one of auto, cuda, cpu"):
        device.requested(None)


@pytest.mark.skipif(not CPU_MACHINE, reason='what a machine without CUDA does')
def test_tools_stop_with_one_line_and_dist_train_before_torchrun(tmp_path, monkeypatch, capsys):
    for k in device.GPU_ENV + ('CUDA_VISIBLE_DEVICES', device.DEVICE_ENV):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv('SLURM_GPUS_ON_NODE', '2')
    for tool, args in (('train', []), ('test', [str(tmp_path / 'x.pth')])):
        assert load_tool(tool).main([DEMO_CLS, *args, '--work-dir', str(tmp_path / 'w')]) == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith('error: ')]
        assert len(errors) == 1
        assert 'SLURM_GPUS_ON_NODE=2' in errors[0] and 'no NVIDIA driver' in errors[0] and '--device cpu' in errors[0]
    env = {k: v for k, v in os.environ.items() if k not in device.GPU_ENV and k != device.DEVICE_ENV}
    env.update(OMP_NUM_THREADS='1', PYTHON=sys.executable)
    proc = subprocess.run(['bash', osp.join(ROOT, 'tools', 'dist_train.sh'), DEMO_CLS, '2', '--work-dir',
                           str(tmp_path / 'w')], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: CUDA is not usable (--launcher pytorch)'), lines
    assert not glob.glob(str(tmp_path / 'w' / '*'))  # torchrun never started a training


def test_slurm_jobs_get_their_own_master_port_and_workers_that_fit_the_cpus(monkeypatch):
    ports = {device.slurm_master_port(str(job)) for job in range(1000, 1100)}
    assert len(ports) == 100 and all(20000 <= p < 30000 for p in ports)
    assert device.slurm_master_port('123456', '0') == device.slurm_master_port('123456', '0')
    cfg = config_checks.load_config(osp.join(ROOT, 'configs', 'cls_swin_t_softmax.py'))
    monkeypatch.delenv('MASTER_PORT', raising=False)
    monkeypatch.setenv('SLURM_JOB_ID', '4242')
    monkeypatch.setenv('SLURM_CPUS_PER_TASK', '5')
    notes = device.apply_cluster_settings(cfg, 'slurm')
    assert os.environ['MASTER_PORT'] == str(device.slurm_master_port('4242'))
    assert cfg.train_dataloader.num_workers == 4 and cfg.val_dataloader.num_workers == 4
    assert any('num_workers 8 -> 4' in n for n in notes)
    monkeypatch.setenv('MASTER_PORT', '31000')  # the user's own port is kept
    device.apply_cluster_settings(cfg, 'slurm')
    assert os.environ['MASTER_PORT'] == '31000'


def test_slurm_scripts_cpus_per_task_cover_every_configs_workers():
    from mmengine.config import Config
    workers = []
    for path in glob.glob(osp.join(ROOT, 'configs', '_base_', 'datasets', '*.py')):
        cfg = Config.fromfile(path)
        workers += [cfg[k].num_workers for k in ('train_dataloader', 'val_dataloader') if k in cfg]
    for script in ('slurm_train.sh', 'slurm_test.sh'):
        text = open(osp.join(ROOT, 'tools', script)).read()
        cpus = int(re.search(r'CPUS_PER_TASK=\$\{CPUS_PER_TASK:-(\d+)\}', text).group(1))
        assert cpus >= max(workers) + 1, script
    # multi-scale 1333 px COCO with masks: 2 workers starve a current GPU
    coco = Config.fromfile(osp.join(ROOT, 'configs', '_base_', 'datasets', 'coco_instance_ms.py'))
    assert coco.train_dataloader.num_workers >= 4


def test_no_cudnn_benchmark_where_validation_runs_whole_images_of_varying_size():
    from mmengine.config import Config
    runtime = Config.fromfile(osp.join(ROOT, 'configs', '_base_', 'default_runtime_seg.py'))
    assert runtime.env_cfg.cudnn_benchmark is False
    for name in ('upernet.py', 'semfpn.py'):  # the segmentors every seg config inherits validate whole images
        model = Config.fromfile(osp.join(ROOT, 'configs', '_base_', 'models', name)).model
        assert model.test_cfg.mode == 'whole'


def test_amp_dtype_choice():
    with pytest.raises(errors.UsageError, match='valid values are auto, float16, bfloat16'):
        device.amp_dtype('fp8')
    if not torch.cuda.is_available():
        assert device.amp_dtype('auto') == 'float16' and device.amp_dtype('float16') == 'float16'
        with pytest.raises(errors.UsageError, match='--amp needs CUDA'):
            device.enable_amp(config_checks.load_config(DEMO_CLS), 'auto')
    else:
        want = 'bfloat16' if torch.cuda.is_bf16_supported() else 'float16'
        assert device.amp_dtype('auto') == want
