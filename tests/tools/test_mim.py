"""mim finds softfree_mm, its configs and its tools, in an editable install and in a regular (wheel) install.

Each install goes into its own scratch virtual environment that sees this environment's packages through a ``.pth``
file (torch and the OpenMMLab stack are not copied), made from a copy of the repository's files. mim itself runs
(``python -m mim``, without PYTHONPATH, from a scratch folder), and so do the tools it starts:

* editable: ``mim list`` shows the package; ``mim train softfree_mm CONFIG_NAME --dry-run`` finds the config in the
  repository (through ``softfree_mm/.mim``, which the install links) and runs the repository's tools/train.py;
* wheel: ``mim list``; ``mim test softfree_mm CONFIG_NAME --checkpoint ...`` evaluates a checkpoint on 8 images written here
  with the config and tools/test.py copied into site-packages; ``mim run softfree_mm convert_checkpoint`` converts
  an official-layout file.
The five mim calls go in parallel, and so do the two builds, each under a fresh empty home folder (HOME and
XDG_CACHE_HOME): on a machine that never ran mim, its import creates ~/.cache/mim without ``exist_ok``, so processes
started side by side race unless the folders first use creates are made before they start (tests/helpers/home.py).
"""
import os
import os.path as osp
import subprocess

import pytest
import torch

from tests.helpers import ROOT
from tests.helpers.home import folders_under, fresh_home_env, prepare_home
from tests.helpers.installs import copy_repo, venv_on_this_environment

CONFIG = 'cls_xcit_s12_poly3_demo.py'
# a small XCiT keeps the tool runs short: the config's own recipe otherwise
TINY = ['model.backbone.embed_dims=32', 'model.backbone.depth=2', 'model.backbone.num_heads=4',
        'model.backbone.norm_cfg.type=BN', 'model.head.in_channels=32']


def _env(root):
    """This environment without PYTHONPATH and PYTHONWARNINGS, on CPU (the tools' CUDA path is not what is checked
    here), with a fresh empty home folder under ``root``."""
    env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'PYTHONWARNINGS')}
    return fresh_home_env(dict(env, CUDA_VISIBLE_DEVICES=''), root=str(root))


def _mim(python, *args, cwd):
    return [python, '-m', 'mim', *args], dict(cwd=str(cwd))


def _popen(cmd, **kw):
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _homes(env):
    return env['HOME'], env['XDG_CACHE_HOME']


def _start_side_by_side(runs, env):
    """Start every ``name: (cmd, kwargs)`` of ``runs`` at once under ``env``, once the folders their first use
    creates are in place. Returns the processes and the home folders' folders at the start."""
    prepare_home(env)
    at_start = folders_under(*_homes(env))
    return {name: _popen(cmd, env=env, **kw) for name, (cmd, kw) in runs.items()}, at_start


def _wait(name, proc, timeout=900):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f'{name}:\n{out[-3000:]}\n{err[-3000:]}'
    return out


def _pip_args(*args):
    return ['-m', 'pip', '--disable-pip-version-check', '--no-input', *args]


@pytest.fixture(scope='module')
def installs(tmp_path_factory):
    """An editable install of one copy of the repository and a wheel built from another copy and installed (the two
    builds run side by side: each writes its own egg-info and build folders)."""
    base = tmp_path_factory.mktemp('mim')
    repo = copy_repo(base / 'repo')
    wheel_src = copy_repo(base / 'wheel_src')
    editable, editable_site = venv_on_this_environment(base / 'editable')
    wheel, wheel_site = venv_on_this_environment(base / 'wheel')
    env = _env(base)
    procs, _ = _start_side_by_side({
        'pip install -e': ([editable, *_pip_args('install', '--no-deps', '--no-build-isolation', '--no-index', '-e',
                                                 str(repo))], {}),
        'pip wheel': ([wheel, *_pip_args('wheel', '--no-deps', '--no-build-isolation', '--no-index', '-w',
                                         str(base / 'dist'), str(wheel_src))], {})}, env)
    _wait('pip wheel', procs.pop('pip wheel'))
    (whl,) = (base / 'dist').glob('softfree_mm-*.whl')
    procs['pip install wheel'] = _popen([wheel, *_pip_args('install', '--no-deps', '--no-index', str(whl))], env=env)
    for name, proc in procs.items():
        _wait(name, proc)
    work = base / 'work'
    work.mkdir()
    return dict(repo=str(repo), editable=editable, editable_site=editable_site, wheel=wheel, wheel_site=wheel_site,
                work=work)


def test_installs_place_configs_tools_and_model_index_where_mim_looks(installs):
    repo, site = installs['repo'], installs['wheel_site']
    for name in ('configs', 'tools', 'model-index.yml'):
        linked = osp.join(repo, 'softfree_mm', '.mim', name)
        assert osp.islink(linked) and osp.realpath(linked) == osp.realpath(osp.join(repo, name))
        copied = osp.join(site, 'softfree_mm', '.mim', name)
        assert osp.exists(copied) and not osp.islink(copied)
    assert osp.isfile(osp.join(site, 'softfree_mm', '.mim', 'configs', 'demo', CONFIG))
    assert osp.isfile(osp.join(site, 'softfree_mm', '.mim', 'tools', 'train.py'))


def test_installs_put_the_mmcv_ext_standin_in_place_for_every_process(installs):
    """Each install writes softfree_mm-mmcv-ext.pth into its own site-packages (this environment's does not run in
    the scratch venvs), so a bare Python there imports mmdet and mmseg with the stand-in of its own copy."""
    from softfree_mm.compat import mmcv_ext_is_standin
    from softfree_mm.mmcv_ext import PTH_LINE, PTH_NAME
    if not mmcv_ext_is_standin():
        pytest.skip('mmcv._ext is a compiled build here (MMCV_COMPILED=1)')
    code = ('import sys, mmdet.models, mmseg.models, mmcv._ext; assert "softfree_mm" not in sys.modules; '
            'print(mmcv._ext.__file__)')
    for python, site, package in ((installs['editable'], installs['editable_site'], osp.join(installs['repo'],
                                   'softfree_mm')), (installs['wheel'], installs['wheel_site'],
                                                     osp.join(installs['wheel_site'], 'softfree_mm'))):
        with open(osp.join(site, PTH_NAME)) as f:
            assert f.read() == PTH_LINE
        proc = subprocess.run([python, '-c', code], capture_output=True, text=True, cwd=str(installs['work']),
                              env={k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert osp.realpath(proc.stdout.strip()) == osp.realpath(osp.join(package, 'mmcv_ext', 'ops.py'))


def _checkpoint(path):
    """A checkpoint of the demo config's model with the TINY overrides (random weights)."""
    import softfree_mm  # noqa: F401
    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS
    cfg = Config.fromfile(osp.join(ROOT, 'configs', 'demo', CONFIG))
    cfg.merge_from_dict({k: eval(v) if v[0].isdigit() else v for k, v in (o.split('=') for o in TINY)})
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        model = MODELS.build(cfg.model)
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, path)
    return model


def _mini_val_set(root):
    """8 images in the ImageNet layout the config reads (val/<class>/*.JPEG, meta/val.txt): what ``mim test``
    evaluates on (the demo set would be written first otherwise)."""
    import cv2
    import numpy as np
    rng = np.random.default_rng(0)
    lines = []
    for i in range(8):
        name = f'digit_{i % 4}/{i}.JPEG'
        os.makedirs(osp.join(root, 'val', osp.dirname(name)), exist_ok=True)
        cv2.imwrite(osp.join(root, 'val', name), rng.integers(0, 255, (64, 64, 3), dtype=np.uint8))
        lines.append(f'{name} {i % 4}')
    os.makedirs(osp.join(root, 'meta'))
    with open(osp.join(root, 'meta', 'val.txt'), 'w') as f:
        f.write('\n'.join(lines) + '\n')
    return root


def test_mim_list_train_test_and_run_use_the_installed_configs_and_tools(installs, tmp_path):
    """The five mim calls run side by side under a fresh empty HOME and XDG_CACHE_HOME: ``mim list`` in both
    installs, ``mim train`` (editable), ``mim test`` and ``mim run`` (wheel). None of them has to create a folder in
    the home folders: what their first use needs was made before they started (else they race to create it)."""
    work = installs['work']
    ckpt = str(tmp_path / 'tiny.pth')
    _checkpoint(ckpt)
    official = str(tmp_path / 'official_xcit.pth')  # the official release's names: pos_embeder, a classifier head
    torch.save({'model': {'pos_embeder.token_projection.weight': torch.ones(4, 64, 1, 1), 'head.weight': torch.ones(3)}},
               official)
    data = _mini_val_set(str(tmp_path / 'mini_imagenet'))
    runs = {
        'list editable': _mim(installs['editable'], 'list', cwd=work),
        'list wheel': _mim(installs['wheel'], 'list', cwd=work),
        'train': _mim(installs['editable'], 'train', 'softfree_mm', CONFIG, '--dry-run', '--work-dir',
                      str(tmp_path / 'train'), '--cfg-options', *TINY, cwd=work),
        'test': _mim(installs['wheel'], 'test', 'softfree_mm', CONFIG, '--checkpoint', ckpt, '--work-dir',
                     str(tmp_path / 'test'), '--cfg-options', *TINY, f'test_dataloader.dataset.data_root={data}',
                     'test_dataloader.batch_size=8', cwd=work),
        'run': _mim(installs['wheel'], 'run', 'softfree_mm', 'convert_checkpoint', 'xcit', official,
                    str(tmp_path / 'converted.pth'), cwd=work),
    }
    env = _env(tmp_path)
    assert not folders_under(*_homes(env))  # fresh and empty
    procs, at_start = _start_side_by_side(runs, env)
    out = {k: _wait(f'mim {k}', p) for k, p in procs.items()}
    made = folders_under(*_homes(env)) - at_start
    assert not made, f'folders the side-by-side processes created on first use (prepare_home must make them): {made}'

    for kind in ('editable', 'wheel'):
        assert any(line.split()[:2] == ['softfree-mm', '0.1.0'] for line in out[f'list {kind}'].splitlines()), \
            out[f'list {kind}']

    repo, site = osp.realpath(installs['repo']), osp.realpath(installs['wheel_site'])
    train_out = out['train']
    assert f'will use {osp.join(repo, "configs", "demo", CONFIG)} instead' in train_out
    assert f'{osp.join(repo, "softfree_mm", ".mim", "tools", "train.py")} ' in train_out
    assert 'config checked, no data read, nothing trained' in train_out

    test_out = out['test']
    assert f'will use {osp.join(site, "softfree_mm", ".mim", "configs", "demo", CONFIG)} instead' in test_out
    assert f'{osp.join(site, "softfree_mm", ".mim", "tools", "test.py")} ' in test_out
    metrics = [line for line in test_out.splitlines() if line.startswith('metrics: ')]
    assert metrics and 'accuracy/top1' in metrics[-1]
    assert not (work / 'data').exists()  # evaluated on the given root, nothing written into the user's folder

    assert osp.join(site, 'softfree_mm', '.mim', 'tools', 'convert_checkpoint.py') in out['run']
    converted = torch.load(str(tmp_path / 'converted.pth'), map_location='cpu', weights_only=False)
    keys = set(converted.get('state_dict', converted))
    assert 'pos_embed.token_projection.weight' in keys and not any(k.startswith('head') for k in keys)
