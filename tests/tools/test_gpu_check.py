"""What of tools/gpu_check.sh (make gpu-check) and the GPU set-ups runs without a GPU.

Guards: without CUDA the check stops at once with one line and exit status 2, before any set-up; the budget: a step
past its cap or the budget is stopped and reported, later steps are skipped, the summary still comes; the kernel
benchmark runs as the check calls it (N = 1k..64k, forward + backward, the device ceilings), in the half dtypes; the
offline set-up (a node without a package index): --fetch-wheels fetches wheels only, the lock's but torch's (mmcv-lite
at requirements/mmcv.txt's pin, no mmcv source), the set-up installs exactly those from the folder, then this package,
and checks mmcv.ops in a bare Python (the stand-in for mmcv._ext from the install's .pth); what the folder lacks and
bad arguments are one error line, before anything is made; the transformers metadata shadow turns mmpretrain's
multimodal switch off; the SOFT detection set-ups keep activation checkpointing, and the saved-bytes figure the
README's memory estimate rests on (about 21.5 bytes per token x landmark x head) holds.
"""
import importlib.util
import json
import math
import os
import os.path as osp
import re
import shutil
import subprocess
import sys
import time

import pytest
import torch

from tests.helpers import ROOT


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
    """The gpu check's kernel benchmark commands (their arguments but the device and the sizes) and the table rows
    its summary reads (on CPU, small N, bf16): the ceilings line, a row per kernel with its fractions of them and the
    path it took; the anchors' command (batch x heads, a peer that is not installed: its rows skipped, said once) and
    the window shape's."""
    import benchmark  # tools/benchmark.py (tests/conftest.py puts tools/ on sys.path)
    text = open(osp.join(ROOT, 'tools', 'gpu_check.sh')).read()
    assert 'GPU_CHECK_TOKENS:-1024 4096 16384 65536' in text
    assert '--dtype "$HALF" --tokens $TOKENS --backward --heads 4 --head-dim 64 --ceilings --kernels "${KERNELS[@]}"' \
        in text
    kernels = 'softmax poly relu sigmoid linear inline poly:degree=1 soft:num_landmarks=64'
    assert f'KERNELS=({kernels})' in text
    assert benchmark.main(['kernels', '--device', 'cpu', '--dtype', 'bf16', '--tokens', '16', '--backward',
                           '--heads', '4', '--head-dim', '64', '--repeats', '1', '--no-memory', '--ceilings',
                           '--kernels', *kernels.split()]) == 0
    out = capsys.readouterr().out.splitlines()
    ceil = [line for line in out if line.startswith('ceilings: ')]
    assert len(ceil) == 1 and 'matrix_TFLOP_per_s=' in ceil[0] and 'copy_GB_per_s=' in ceil[0]
    paths = {}
    for name in kernels.split():
        rows = [line for line in out if line.startswith(f'| {name} | 16 | fwdbwd ')]
        assert len(rows) == 1 and float(rows[0].split('|')[4]) > 0, name
        paths[name] = rows[0].split('|')[-2].strip()
    # N = 16 < d = 64: the association rule takes linear's explicit order here
    assert paths['linear'] == 'explicit order' and paths['poly'] == 'explicit' and paths['softmax'] == 'torch'
    anchor = ('--tokens $FIXED_TOKENS --backward --batch 8 --heads 16 --head-dim 64 --no-memory --repeats 3 \\\n'
              '        --kernels softmax linear poly:degree=1 inline peer:fbi_la')
    assert anchor in text and 'FIXED_TOKENS="4096 16384 65536"' in text
    assert '--tokens 49 --backward --batch 4096 --heads 3 --head-dim 32' in text
    assert benchmark.main(['kernels', '--device', 'cpu', '--dtype', 'bf16', '--tokens', '49', '--backward',
                           '--batch', '2', '--heads', '2', '--head-dim', '16', '--no-memory', '--repeats', '1',
                           '--kernels', 'softmax', 'linear', 'inline', 'peer:fbi_la']) == 0
    cap = capsys.readouterr()
    rows = [line for line in cap.out.splitlines() if line.startswith('| ') and ' | 49 | ' in line]
    assert {r.split('|')[1].strip() for r in rows} == {'softmax', 'linear', 'inline'}
    assert cap.err.count('peer fbi_la: none of flash_bla.ops.linear_attn.fused, fbi_la.ops.linear_attn.fused') == 1


def test_the_default_run_is_planned_within_seven_minutes_and_names_only_valid_detectors():
    """The prepared run: its steps' caps add up to at most the budget (420 s, 7 minutes) less the set-up's share,
    each default step runs under its own cap, `--plan` says so; every detector the two detector steps name is valid
    (the benchmark's parser), the bf16 step holds InLine PVTv2-b2 with its no-reduction softmax reference and
    XCiT-S12 + linear before and after the association rule, and the fp32 step writes the profile tables."""
    import re
    from softfree_mm.analysis.benchmark.detector import parse_detector
    proc = subprocess.run(['bash', '-c', f"source {osp.join(ROOT, 'tools', 'gpu_check.sh')!r}; plan_seconds; "
                           'echo $DEFAULT_BUDGET $SETUP_SECONDS; echo $PLAN'], capture_output=True, text=True,
                          timeout=60)
    total, budget_setup, plan = proc.stdout.splitlines()
    budget, setup = map(int, budget_setup.split())
    assert budget == 420 and int(total) + setup <= budget
    text = open(osp.join(ROOT, 'tools', 'gpu_check.sh')).read()
    for name in plan.split():
        assert f'step {name} "${{CAP[{name}]}}"' in text or f'step "bench-$HALF" "${{CAP[{name}]}}"' in text or \
            f'step cuda "${{CAP[cuda]}}"' in text, name
    shown = subprocess.run(['bash', osp.join(ROOT, 'tools', 'gpu_check.sh'), '--plan'], capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0 and f'steps: {total}s of the 420s budget' in shown.stdout
    dets = {}
    for step in ('detector', 'detector-bf16'):
        block = text[text.index(f'wanted {step} && step'):]
        block = block[:block.index('\n    wanted', 1)]
        dets[step] = re.findall(r'[a-z0-9_]+:[a-z0-9_]+(?:\+[a-z]+)?', block.split('--detectors', 1)[1])
        for name in dets[step]:
            parse_detector(name)
    assert {'pvt_v2_b2:inline', 'pvt_v2_b2:softmax+nosr', 'xcit_s12:linear', 'xcit_s12:linear+factorised'} <= \
        set(dets['detector-bf16'])
    assert {'swin_t:mmdet', 'swin_t:softmax', 'swin_t:inline', 'pvt_v2_b2:mmdet', 'pvt_v2_b2:softmax',
            'pvt_v2_b2:poly3'} <= set(dets['detector'])
    assert '--profile "$OUT"' in text[text.index('wanted detector && step'):text.index('wanted detector-bf16')]


def test_detector_names_options_and_a_profiled_step(tmp_path, capsys):
    """backbone:kernel[+option]: PVTv2 without spatial reduction and a forced association order reach the model's
    config; bad names are one line naming what is valid; one real CPU step with --profile writes its top operators
    and the row's layout."""
    import benchmark
    from softfree_mm.analysis.benchmark.detector import detector_config, parse_detector
    assert detector_config('pvt_v2_b2:softmax+nosr').model.backbone.sr_ratios == [1, 1, 1, 1]
    assert detector_config('xcit_s12:linear+factorised').model.backbone.attn_cfg['impl'] == 'factorised'
    for bad, why in (('swin_t:softmax+nosr', "+nosr is PVTv2's"), ('swin_t:nope', 'unknown detector'),
                     ('pvt_v2_b2:mmdet+explicit', 'one association order')):
        with pytest.raises(ValueError, match=re.escape(why)):
            parse_detector(bad)
    assert benchmark.main(['detector', '--device', 'cpu', '--size', '64x64', '--batch', '1', '--repeats', '1',
                           '--detectors', 'pvt_v2_b2:softmax+nosr', '--profile', str(tmp_path),
                           '--csv', str(tmp_path / 'd.csv')]) == 0
    (prof,) = list(tmp_path.glob('profile_*.txt'))
    assert prof.name == 'profile_pvt_v2_b2_softmax_nosr_fp32.txt'
    body = prof.read_text()
    assert body.startswith('# one Mask R-CNN training step of pvt_v2_b2:softmax+nosr') and 'Self CPU' in body
    import csv
    (row,) = list(csv.DictReader(open(tmp_path / 'd.csv')))
    assert row['layout'] == 'no reduction' and float(row['images_per_s']) > 0


def _source(script, tmp_path, env=None):
    return subprocess.run(['bash', '-c', f"source {osp.join(ROOT, 'tools', 'gpu_check.sh')!r}\n{script}"],
                          capture_output=True, text=True, timeout=120, cwd=str(tmp_path), env=env)


# `python -m pip` for the offline set-up's tests (first on PYTHONPATH): logs each call's arguments and requirements;
# `download` writes an empty wheel per requirement, named as on PyPI; `install -e` writes what the package's install
# puts in site-packages (a path entry for the package and, unless FAKE_PIP_NO_PTH, the mmcv._ext .pth)
FAKE_PIP = r"""
import json, os, re, sys, sysconfig
args = sys.argv[1:]
valued = {'--dest', '--python-version', '--implementation', '--platform', '--find-links', '-e'}
reqs = [a for i, a in enumerate(args) if i and not a.startswith('-') and args[i - 1] not in valued]
with open(os.environ['FAKE_PIP_LOG'], 'a') as f:
    f.write(json.dumps({'args': args, 'reqs': reqs}) + '\n')
if args[0] == 'download':
    for req in reqs:
        name = re.split('[<>=!~]', req)[0]
        version = req.split('==')[1] if '==' in req else '1.0'
        tag = 'py2.py3-none-any' if name == 'mmcv-lite' else 'py3-none-any'
        wheel = f"{re.sub('[-_.]+', '_', name)}-{version}-{tag}.whl"
        open(os.path.join(args[args.index('--dest') + 1], wheel), 'w').close()
elif '-e' in args:
    site = sysconfig.get_paths()['purelib']
    with open(os.path.join(site, '__editable__.softfree_mm.pth'), 'w') as f:
        f.write(args[args.index('-e') + 1] + '\n')
    if not os.environ.get('FAKE_PIP_NO_PTH'):
        with open(os.path.join(site, PTH_NAME), 'w') as f:
            f.write(PTH_LINE)
"""


def _fake_pip(tmp_path):
    """The environment that runs the script's pip calls through FAKE_PIP, and the log of those calls."""
    from softfree_mm.mmcv_ext import PTH_LINE, PTH_NAME
    pkg = tmp_path / 'fake_pip' / 'pip'
    pkg.mkdir(parents=True)
    (pkg / '__init__.py').write_text('')
    (pkg / '__main__.py').write_text(f'PTH_NAME, PTH_LINE = {PTH_NAME!r}, {PTH_LINE!r}\n{FAKE_PIP}')
    log = tmp_path / 'pip_calls.jsonl'
    env = dict(os.environ, PYTHONPATH=str(tmp_path / 'fake_pip'), FAKE_PIP_LOG=str(log), PYTHON=sys.executable,
               GPU_CHECK_PYTHON=sys.executable)
    return env, log


def _pip_calls(log):
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    log.unlink()
    return calls


def _lock_pins():
    """The lock the offline set-up installs for this Python (requirements/lock/), name -> version in its order."""
    from tests.helpers import load_tool
    lock = osp.join(ROOT, 'requirements', 'lock', 'py%d.%d.txt' % sys.version_info[:2])
    return load_tool('lockfile').pins(lock if osp.isfile(lock) else osp.join(ROOT, 'requirements', 'lock', 'all.txt'))


def _needs_triton():
    if importlib.util.find_spec('triton') is None:
        pytest.skip('the offline set-up needs a Python with torch and triton; this one has no triton')


def test_offline_setup_installs_exactly_what_fetch_wheels_fetches_and_checks_mmcv_ops_in_a_bare_python(tmp_path):
    """--fetch-wheels: one pip download, of wheels only (no mmcv source), with mmcv-lite at requirements/mmcv.txt's
    pin; the offline set-up: exactly those requirements from that folder alone, then this package (-e), then mmcv.ops
    and the mm packages imported in a bare Python, where mmcv._ext can only come from the .pth that the install
    writes: without it the set-up fails. pip is FAKE_PIP; the venv, its view of this environment and the check are
    real."""
    _needs_triton()
    env, log = _fake_pip(tmp_path)
    wheels, venv = tmp_path / 'wheels', tmp_path / 'venv'
    proc = _source(f'fetch_wheels {wheels} 3.11', tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    (fetch,) = _pip_calls(log)
    args, fetched = fetch['args'], fetch['reqs']
    assert args[0] == 'download' and '--only-binary=:all:' in args and not any('no-binary' in a for a in args)
    assert args[args.index('--python-version') + 1] == '3.11' and args[args.index('--dest') + 1] == str(wheels)
    with open(osp.join(ROOT, 'requirements', 'mmcv.txt')) as f:
        pin = [line.split('#')[0].strip() for line in f if line.split('#')[0].strip()]
    assert pin == ['mmcv-lite==2.1.0'] and pin[0] in fetched
    assert not [r for r in fetched if r.split('==')[0] == 'mmcv']
    # the lock at its exact versions, less torch, torchvision, triton and CUDA's libraries (the machine's own)
    pins = _lock_pins()
    assert fetched == [f'{n}=={v}' for n, v in pins.items() if not re.match(r'(torch|torchvision|triton|nvidia-.*|'
                                                                         r'cuda-.*)$', n)]
    for need in ('mmengine==0.10.7', 'mmdet==3.3.0', 'mmsegmentation==1.2.2', 'mmpretrain==1.2.0', 'addict', 'numpy',
                 'timm', 'opencv-python', 'pycocotools', 'shapely', 'ftfy', 'model-index', 'setuptools', 'wheel'):
        assert need in fetched or f'{need}=={pins[need]}' in fetched, need
    assert 'mmcv_lite-2.1.0-py2.py3-none-any.whl' in os.listdir(wheels)
    assert all(name.endswith('.whl') for name in os.listdir(wheels))

    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True)  # pip is FAKE_PIP
    proc = _source(f'offline_setup {wheels} {venv}', tmp_path, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1].endswith('mmcv.ops and the mm packages import without softfree_mm')
    install, editable = _pip_calls(log)
    args = install['args']
    assert args[0] == 'install' and install['reqs'] == fetched
    assert '--no-index' in args and '--no-deps' in args and args[args.index('--find-links') + 1] == str(wheels)
    assert editable['reqs'] == [] and editable['args'][-2:] == ['-e', ROOT] and '--no-index' in editable['args']

    from softfree_mm.mmcv_ext import PTH_NAME
    purelib = 'import sysconfig; print(sysconfig.get_paths()["purelib"])'
    site = subprocess.run([str(venv / 'bin' / 'python'), '-c', purelib], capture_output=True, text=True,
                          check=True).stdout.strip()
    os.remove(osp.join(site, PTH_NAME))
    proc = _source(f'offline_setup {wheels} {venv}', tmp_path, dict(env, FAKE_PIP_NO_PTH='1'))
    assert proc.returncode != 0 and "No module named 'mmcv._ext'" in proc.stderr, proc.stdout + proc.stderr[-3000:]


def test_offline_setup_and_fetch_wheels_name_what_is_missing_or_wrong_in_one_line(tmp_path):
    """A Python without torch, a wheel folder that is no folder, one that lacks wheels (one filled by the former
    --fetch-wheels: mmcv's source, no mmcv-lite wheel; a pinned package at another version) is one error line naming
    them and the fetch command for this Python, before any venv is made; names compare as pip's do. --fetch-wheels
    with a bad Python version or a fourth argument, and an unknown argument, are one line naming it."""
    no_torch = tmp_path / 'python'
    no_torch.write_text('#!/bin/sh\nexit 1\n')
    no_torch.chmod(0o755)
    venv = tmp_path / 'venv'
    proc = _source(f'GPU_CHECK_PYTHON={no_torch} offline_setup {tmp_path} {venv}', tmp_path)
    assert proc.returncode == 2 and proc.stdout.strip() == (
        f'error: {no_torch} cannot import torch and triton: set GPU_CHECK_PYTHON to the Python that holds them')
    _needs_triton()
    env, log = _fake_pip(tmp_path)
    wheels = tmp_path / 'wheels'
    proc = _source(f'offline_setup {wheels} {venv}', tmp_path, env)
    assert proc.returncode == 2 and proc.stdout.strip() == f'error: GPU_CHECK_WHEELS={wheels} is not a folder'
    here = '%d.%d' % sys.version_info[:2]  # the lock of this Python: other Pythons' locks pin other versions
    assert _source(f'fetch_wheels {wheels} {here}', tmp_path, env).returncode == 0
    _pip_calls(log)
    fetch = f'bash tools/gpu_check.sh --fetch-wheels DIR {here}'
    os.remove(wheels / 'mmcv_lite-2.1.0-py2.py3-none-any.whl')
    (wheels / 'mmcv-2.1.0.tar.gz').write_text('')
    proc = _source(f'offline_setup {wheels} {venv}', tmp_path, env)
    assert proc.returncode == 2 and proc.stdout.strip() == (
        f'error: no mmcv_lite-2.1.0-py2.py3-none-any.whl in GPU_CHECK_WHEELS={wheels}: fetch them where there is a '
        f'package index with {fetch}'), proc.stdout + proc.stderr
    pins = _lock_pins()
    os.remove(wheels / 'mmdet-3.3.0-py3-none-any.whl')
    os.rename(wheels / 'mmpretrain-1.2.0-py3-none-any.whl', wheels / 'mmpretrain-1.1.0-py3-none-any.whl')
    ordered = f'ordered_set-{pins["ordered-set"]}-py3-none-any.whl'
    os.rename(wheels / ordered, wheels / ordered.replace('ordered_set', 'Ordered.Set'))
    os.remove(wheels / f'termcolor-{pins["termcolor"]}-py3-none-any.whl')
    proc = _source(f'offline_setup {wheels} {venv}', tmp_path, env)
    assert proc.returncode == 2 and proc.stdout.strip() == (
        f'error: no mmcv_lite-2.1.0-py2.py3-none-any.whl, mmdet==3.3.0, mmpretrain==1.2.0, '
        f'termcolor=={pins["termcolor"]} in GPU_CHECK_WHEELS={wheels}: fetch them where there is a package index '
        f'with {fetch}'), proc.stdout
    assert not venv.exists() and not log.exists()  # no venv, no pip call

    script = osp.join(ROOT, 'tools', 'gpu_check.sh')
    for args, line in (
            ([], 'usage: bash tools/gpu_check.sh --fetch-wheels DIR [PYTHON_VERSION]'),
            ([str(tmp_path / 'w'), 'py3.12'], "error: PYTHON_VERSION must be the GPU node's MAJOR.MINOR, e.g. 3.12; "
                                              "got 'py3.12'"),
            ([str(tmp_path / 'w'), '3.12', 'cp312'], "error: unexpected argument 'cp312' after --fetch-wheels DIR "
                                                     "PYTHON_VERSION")):
        proc = subprocess.run(['bash', script, '--fetch-wheels', *args], capture_output=True, text=True, timeout=60,
                              env=env)
        assert proc.returncode == 2 and proc.stderr.strip() == line, proc.stderr
    assert not (tmp_path / 'w').exists() and not log.exists()
    proc = subprocess.run(['bash', script, '--fetch_wheels'], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "error: unknown argument '--fetch_wheels' (valid: --plan, --fetch-wheels DIR [PYTHON_VERSION], or none)")


def test_gpu_check_steps_runs_only_the_named_steps():
    text = open(osp.join(ROOT, 'tools', 'gpu_check.sh')).read()
    for name in ('cuda', 'fused', 'bench-bf16', 'bench-anchor', 'bench-window', 'bench-fp32', 'detector',
                 'detector-bf16', 'warm-start', 'tests'):
        assert f'wanted {name} ' in text or name == 'cuda', name
    proc = subprocess.run(['bash', '-c', f"source {osp.join(ROOT, 'tools', 'gpu_check.sh')!r}; "
                           'GPU_CHECK_STEPS="detector tests"; for s in fused detector tests; do wanted $s && echo $s; '
                           'done'], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ['detector', 'tests']


def test_transformers_metadata_shadow_turns_mmpretrains_multimodal_switch_off(tmp_path):
    """With the shadow entry first on the path, mmpretrain's own requirement check finds transformers 0.0.0 (below
    its 4.28), so its multimodal code (which fails to import beside a current transformers) stays off."""
    site = tmp_path / 'site'
    proc = _source(f'shadow_transformers {site}', tmp_path)
    assert proc.returncode == 0 and 'version 0.0.0' in proc.stdout
    code = ('import sys; sys.path.insert(0, sys.argv[1]); import importlib_metadata as m; '
            'from mmpretrain.utils.dependency import satisfy_requirement as s; '
            "print(m.version('transformers'), s('transformers>=4.28.0'))")
    out = subprocess.run([sys.executable, '-c', code, str(site)], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ['0.0.0', 'False'], out.stderr[-2000:]


def test_setup_refuses_a_bad_mmcv_cuda_value_and_its_op_check_runs_the_ops(tmp_path):
    """tools/setup_env.sh: MMCV_CUDA is 0 or 1 (one line, exit status 2, nothing created); the check it runs after
    installing mmcv calls nms and roi_align (not just imports them), in a bare Python as the set-up runs it."""
    import re
    env = dict(os.environ, SOFTFREE_VENV=str(tmp_path / 'venv'), MMCV_CUDA='yes')
    proc = subprocess.run(['bash', osp.join(ROOT, 'tools', 'setup_env.sh')], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == "[setup_env] error: MMCV_CUDA must be 0 or 1, got 'yes'"
    assert not (tmp_path / 'venv').exists()
    text = open(osp.join(ROOT, 'tools', 'setup_env.sh')).read()
    ops_run = re.search(r"OPS_RUN='(.*?)'\n", text, re.S).group(1)
    out = subprocess.run([sys.executable, '-c', ops_run, 'cpu'], capture_output=True, text=True, timeout=120,
                         cwd=str(tmp_path))
    assert out.stdout.strip() == 'mmcv nms and roi_align ran on cpu', out.stderr[-2000:]
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
    from softfree_mm.engine import config_checks
    name = backbone if backbone.startswith('soft_') else f'{backbone}_soft'
    cfg = config_checks.load_config(osp.join(ROOT, 'configs', f'maskrcnn_{name}.py'))
    assert cfg.model.backbone.with_cp is True


def test_soft_saved_bytes_per_token_landmark_head_is_the_readmes_figure():
    """The README's estimate: SOFT keeps about 21.5 bytes per (token, landmark, head) for backward (some five float32
    N x m maps; the Newton inverse's backward is analytic, its iterations are not kept). Measured exactly with
    saved_tensors_hooks on one call at N = 1600 tokens, m = 400 landmarks, 3 heads of 32."""
    from softfree_mm.analysis.benchmark.timing import saved_bytes
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


def test_offline_venv_sees_the_base_pythons_torch_after_its_own_packages(tmp_path):
    """The GPU images' python3 is itself a venv, whose --system-site-packages would hide its torch: the offline venv
    lists the base Python's package folders in a .pth file instead, after its own site-packages (so what the set-up
    installs there, and the transformers shadow, come first)."""
    venv = tmp_path / 'venv'
    proc = _source(f'offline_venv {sys.executable} {venv}', tmp_path)
    assert proc.returncode == 0, proc.stderr
    code = ('import sys, sysconfig, torch, os; own = sysconfig.get_paths()["purelib"]; '
            'base = os.path.dirname(os.path.dirname(torch.__file__)); '
            'print(sys.path.index(own) < sys.path.index(base), base != own)')
    out = subprocess.run([str(venv / 'bin' / 'python'), '-c', code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ['True', 'True'], out.stderr[-2000:]
