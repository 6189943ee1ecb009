"""What of tools/gpu_check.sh (make gpu-check) and the GPU set-ups runs without a GPU.

Guards: without CUDA the check stops at once with one line and exit status 2, before any set-up; the 8-minute
budget: a step past its cap or the budget is stopped and reported, later steps are skipped, the summary still comes;
the kernel benchmark runs in the half dtypes the check uses; the SOFT detection set-ups keep activation checkpointing, and the
saved-bytes figure the README's memory estimate rests on (about 21.5 bytes per token x landmark x head) holds.
"""
import math
import os
import os.path as osp
import shutil
import subprocess
import sys
import time

import pytest
import torch

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)


@pytest.mark.skipif(shutil.which('nvidia-smi') is not None, reason='a machine that has nvidia-smi runs the check')
def test_gpu_check_without_cuda_stops_at_once_with_one_line(tmp_path):
    env = dict(os.environ, GPU_CHECK_DIR=str(tmp_path / 'out'), SOFTFREE_VENV=str(tmp_path / 'venv'))
    t0 = time.time()
    proc = subprocess.run(['bash', osp.join(ROOT, 'tools', 'gpu_check.sh')], env=env, capture_output=True,
                          text=True, timeout=60)
    assert time.time() - t0 < 10
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        'gpu-check: no CUDA GPU on this machine (nvidia-smi lists none); run it where nvidia-smi lists a GPU']
    assert not (tmp_path / 'out').exists() and not (tmp_path / 'venv').exists()  # no set-up started
    make = subprocess.run(['make', '-s', '-C', ROOT, 'gpu-check'], env=env, capture_output=True, text=True,
                          timeout=60)
    assert make.returncode != 0 and 'no CUDA GPU on this machine' in make.stderr


def test_gpu_check_steps_keep_to_their_caps_and_the_budget(tmp_path):
    """The check's own step / finish functions (the script sourced, its GPU steps not run): a step that outlives its
    cap is stopped at the cap, one that would outlive the budget at the budget's end, steps after the budget are
    skipped, the set-up (cap 0) is never cut, and the summary lists each with the exit status 1."""
    script = f"""
source {osp.join(ROOT, 'tools', 'gpu_check.sh')!r}
GPU_CHECK_BUDGET=4 begin {str(tmp_path / 'out')!r}
PY=/nonexistent
step setup 0 true
step capped 1 sleep 30
step budget 60 sleep 30
step after 60 true
finish
"""
    t0 = time.time()
    proc = subprocess.run(['bash', '-c', script], capture_output=True, text=True, timeout=60)
    took = time.time() - t0
    assert proc.returncode == 1, proc.stderr
    assert took < 15, f'{took:.0f} s: the caps and the budget did not stop the steps'
    lines = (tmp_path / 'out' / 'summary.txt').read_text().splitlines()
    by_step = {line.split()[0]: line for line in lines if line and not line.startswith(('---', 'total', 'gpu:'))}
    assert by_step['setup'].split()[1] == 'PASS'
    assert by_step['capped'].split()[1] == 'FAIL' and 'stopped after 1s (step cap 1s' in by_step['capped']
    assert by_step['budget'].split()[1] == 'FAIL' and 'of the 4s budget' in by_step['budget']
    assert by_step['after'].split()[1] == 'SKIP' and 'no time left of the 4s budget' in by_step['after']
    assert lines[-1].startswith('total: ') and lines[-1].endswith('FAILED steps above')
    assert 'gpu-check summary' in proc.stderr


def test_benchmark_runs_as_the_gpu_check_calls_it(capsys):
    """The gpu check's benchmark command and the table row its summary reads (on CPU, small N, bf16)."""
    sys.path.insert(0, osp.join(ROOT, 'tools'))
    import benchmark
    text = open(osp.join(ROOT, 'tools', 'gpu_check.sh')).read()
    assert 'tools/benchmark.py kernels --device cuda --dtype fp32 --tokens 1024 4096 16384 --backward' in text
    assert benchmark.main(['kernels', '--device', 'cpu', '--dtype', 'bf16', '--tokens', '16', '--backward',
                           '--heads', '4', '--head-dim', '32', '--repeats', '1', '--no-memory',
                           '--kernels', 'softmax', 'poly', 'soft']) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith('| soft | 16 | fwdbwd ')]
    assert len(rows) == 1 and float(rows[0].split('|')[4]) > 0


def test_setup_refuses_a_bad_mmcv_cuda_value_and_its_op_check_runs_the_ops(tmp_path, monkeypatch, capsys):
    """tools/setup_env.sh: MMCV_CUDA is 0 or 1 (one line, exit status 2, nothing created); the check it runs after
    installing mmcv calls nms and roi_align (not just imports them)."""
    import re
    env = dict(os.environ, SOFTFREE_VENV=str(tmp_path / 'venv'), MMCV_CUDA='yes')
    proc = subprocess.run(['bash', osp.join(ROOT, 'tools', 'setup_env.sh')], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == "[setup_env] error: MMCV_CUDA must be 0 or 1, got 'yes'"
    assert not (tmp_path / 'venv').exists()
    text = open(osp.join(ROOT, 'tools', 'setup_env.sh')).read()
    ops_run = re.search(r"OPS_RUN='(.*?)'\n", text, re.S).group(1)
    monkeypatch.setattr(sys, 'argv', ['-c', 'cpu'])  # what `python -c "$OPS_RUN" cpu` sees (run here: no new import)
    capsys.readouterr()
    exec(compile(ops_run, 'OPS_RUN', 'exec'), {'__name__': '__main__'})
    assert capsys.readouterr().out.strip() == 'mmcv nms and roi_align ran on cpu'
    assert '--no-cache-dir "mmcv==2.1.0"' in text  # a cached CPU build never comes back for MMCV_CUDA=1


def test_setup_refuses_to_start_on_a_disk_without_room(tmp_path):
    """tools/setup_env.sh measures the free disk of the venv's filesystem before writing anything: too little is one
    line naming the free MiB, the path, what the set-up needs and how to get round it; exit 2, no venv created."""
    env = dict(os.environ, SOFTFREE_VENV=str(tmp_path / 'a' / 'venv'), SOFTFREE_NEED_MIB=str(2 ** 40))
    proc = subprocess.run(['bash', osp.join(ROOT, 'tools', 'setup_env.sh')], env=env, capture_output=True, text=True,
                          timeout=60)
    free = os.statvfs(tmp_path)
    free_mib = free.f_bavail * free.f_frsize // 2 ** 20
    assert proc.returncode == 2, proc.stderr
    msg = proc.stderr.strip()
    assert msg.startswith('[setup_env] error: ') and '\n' not in msg, msg
    said = int(msg.split('error: ')[1].split(' MiB free')[0])
    assert abs(said - free_mib) <= max(64, free_mib // 100), (said, free_mib)
    assert f'on the disk of {tmp_path / "a" / "venv"};' in msg and f'needs about {2 ** 40} MiB' in msg
    assert 'SOFTFREE_VENV' in msg and 'SOFTFREE_NEED_MIB=0' in msg
    assert not (tmp_path / 'a').exists()
    for bad in ('6.5G', '-1', ''):
        env['SOFTFREE_NEED_MIB'] = bad
        proc = subprocess.run(['bash', osp.join(ROOT, 'tools', 'setup_env.sh')], env=env, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2 and proc.stderr.strip() == (
            "[setup_env] error: SOFTFREE_NEED_MIB must be a whole number of MiB (0 skips the disk check), "
            f"got '{bad}'"), proc.stderr
        assert not (tmp_path / 'a').exists()


@pytest.mark.parametrize('backbone', ['swin_t', 'cswin_t', 'pvt_v2_b2', 'soft_s_softnorm'])
def test_soft_detection_setups_checkpoint_their_blocks(backbone):
    from softfree_mm.engine import launch
    name = backbone if backbone.startswith('soft_') else f'{backbone}_soft'
    cfg = launch.load_config(osp.join(ROOT, 'configs', f'maskrcnn_{name}.py'))
    assert cfg.model.backbone.with_cp is True


def test_soft_saved_bytes_per_token_landmark_head_is_the_readmes_figure():
    """The README's estimate: SOFT keeps about 21.5 bytes per (token, landmark, head) for backward (some five float32
    N x m maps; the Newton inverse's backward is analytic, its iterations are not kept). Measured exactly with
    saved_tensors_hooks on one call at N = 1600 tokens, m = 400 landmarks, 3 heads of 32."""
    from softfree_mm.analysis.benchmark import saved_bytes
    from softfree_mm.attention import build_attention
    h, d, side, ratio = 3, 32, 40, 2
    kern = build_attention(dict(type='soft', landmark_ratio=ratio, conv_size=3), num_heads=h, head_dim=d)
    q, k, v = (torch.randn(1, h, side * side, d, requires_grad=True) for _ in range(3))
    saved = saved_bytes(lambda: kern(q, k, v, hw=(side, side)))
    n, m = side * side, (side // ratio) ** 2
    per = (saved - 9 * n * d * h * 4) / (n * m * h)  # the O(N d) tensors (q, k, v, outputs...) aside
    assert 15 < per < 24, f'{per:.1f} bytes per token x landmark x head'
    # 1344 x 800 (1333 x 800 padded to 32), stage 1 of Swin-T: 67200 tokens, 25 x 42 landmarks, 3 heads, 2 images
    stage1_gib = 67200 * 1050 * 3 * 2 * 21.5 / 2 ** 30
    assert math.isclose(stage1_gib, 8.5, abs_tol=0.1)
