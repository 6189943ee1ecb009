"""mim finds softfree_mm, its configs and its tools, in an editable install and in a regular (wheel) install.

Each install goes into its own scratch virtual environment that sees this environment's packages through a ``.pth``
file (torch and the OpenMMLab stack are not copied), made from a copy of the repository's files. mim itself runs
(``python -m mim``, without PYTHONPATH, from a scratch folder), and so do the tools it starts:

* editable: ``mim list`` shows the package; ``mim train softfree_mm CONFIG_NAME --dry-run`` finds the config in the
  repository (through ``softfree_mm/.mim``, which the install links) and runs the repository's tools/train.py;
* wheel: ``mim list``; ``mim test softfree_mm CONFIG_NAME --checkpoint ...`` evaluates a checkpoint on the demo set
  with the config and tools/test.py copied into site-packages; ``mim run softfree_mm convert_checkpoint`` converts
  an official-layout file.
The three tool runs go in parallel.
"""
import os
import os.path as osp
import shutil
import subprocess
import sys
import sysconfig

import pytest
import torch

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIG = 'cls_xcit_s12_poly3_demo.py'
# a small XCiT keeps the tool runs short: the config's own recipe otherwise
TINY = ['model.backbone.embed_dims=32', 'model.backbone.depth=2', 'model.backbone.num_heads=4',
        'model.backbone.norm_cfg.type=BN', 'model.head.in_channels=32']


def _copy_repo(dst):
    """The repository's files a user's clone has (what git tracks, without tests and local data)."""
    skip = {'.git', '.venv', 'data', 'work_dirs', 'build', 'dist', 'tests', '__pycache__', '.pytest_cache'}

    def ignore(folder, names):
        return [n for n in names if n in skip or n.endswith(('.egg-info', '.pyc')) or
                (n == '.mim' and osp.basename(folder) == 'softfree_mm')]

    shutil.copytree(ROOT, dst, ignore=ignore, symlinks=True)
    return dst


def _venv(path):
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(path)], check=True)
    site = subprocess.run([str(path / 'bin' / 'python'), '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
                          check=True, capture_output=True, text=True).stdout.strip()
    outer = [p for p in sys.path if osp.basename(p) in ('site-packages', 'dist-packages') and osp.isdir(p)]
    with open(osp.join(site, 'outer_environment.pth'), 'w') as f:  # this environment's packages (and the system's)
        f.write('\n'.join(dict.fromkeys([sysconfig.get_paths()['purelib'], *outer])) + '\n')
    return str(path / 'bin' / 'python'), site


def _env():
    return {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'PYTHONWARNINGS')}


def _pip(python, *args, cwd=None):
    proc = subprocess.run([python, '-m', 'pip', '--disable-pip-version-check', '--no-input', *args],
                          capture_output=True, text=True, env=_env(), cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def _mim(python, *args, cwd):
    return [python, '-m', 'mim', *args], dict(cwd=str(cwd), env=_env())


@pytest.fixture(scope='module')
def installs(tmp_path_factory):
    base = tmp_path_factory.mktemp('mim')
    repo = _copy_repo(base / 'repo')
    editable, editable_site = _venv(base / 'editable')
    _pip(editable, 'install', '--no-deps', '--no-build-isolation', '--no-index', '-e', str(repo))
    _pip(editable, 'wheel', '--no-deps', '--no-build-isolation', '--no-index', '-w', str(base / 'dist'), str(repo))
    wheel, wheel_site = _venv(base / 'wheel')
    (whl,) = (base / 'dist').glob('softfree_mm-*.whl')
    _pip(wheel, 'install', '--no-deps', '--no-index', str(whl))
    work = base / 'work'
    work.mkdir()
    return dict(repo=str(repo), editable=editable, wheel=wheel, wheel_site=wheel_site, work=work)


def test_installs_place_configs_tools_and_model_index_where_mim_looks(installs):
    repo, site = installs['repo'], installs['wheel_site']
    for name in ('configs', 'tools', 'model-index.yml'):
        linked = osp.join(repo, 'softfree_mm', '.mim', name)
        assert osp.islink(linked) and osp.realpath(linked) == osp.realpath(osp.join(repo, name))
        copied = osp.join(site, 'softfree_mm', '.mim', name)
        assert osp.exists(copied) and not osp.islink(copied)
    assert osp.isfile(osp.join(site, 'softfree_mm', '.mim', 'configs', 'demo', CONFIG))
    assert osp.isfile(osp.join(site, 'softfree_mm', '.mim', 'tools', 'train.py'))


@pytest.mark.parametrize('kind', ['editable', 'wheel'])
def test_mim_list_shows_softfree_mm(installs, kind):
    cmd, kw = _mim(installs[kind], 'list', cwd=installs['work'])
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert any(line.split()[:2] == ['softfree-mm', '0.1.0'] for line in proc.stdout.splitlines()), proc.stdout


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


def test_mim_train_test_and_run_use_the_installed_configs_and_tools(installs, tmp_path):
    work = installs['work']
    ckpt = str(tmp_path / 'tiny.pth')
    _checkpoint(ckpt)
    official = str(tmp_path / 'official_xcit.pth')  # the official release's names: pos_embeder, a classifier head
    torch.save({'model': {'pos_embeder.token_projection.weight': torch.ones(4, 64, 1, 1), 'head.weight': torch.ones(3)}},
               official)
    runs = {
        'train': _mim(installs['editable'], 'train', 'softfree_mm', CONFIG, '--dry-run', '--work-dir',
                      str(tmp_path / 'train'), '--cfg-options', *TINY, cwd=work),
        'test': _mim(installs['wheel'], 'test', 'softfree_mm', CONFIG, '--checkpoint', ckpt, '--work-dir',
                     str(tmp_path / 'test'), '--cfg-options', *TINY, 'test_dataloader.dataset.indices=8',
                     'test_dataloader.batch_size=8', cwd=work),
        'run': _mim(installs['wheel'], 'run', 'softfree_mm', 'convert_checkpoint', 'xcit', official,
                    str(tmp_path / 'converted.pth'), cwd=work),
    }
    procs = {k: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
             for k, (cmd, kw) in runs.items()}
    out = {k: p.communicate(timeout=900) for k, p in procs.items()}
    for k, p in procs.items():
        assert p.returncode == 0, f'mim {k}:\n{out[k][0][-3000:]}\n{out[k][1][-3000:]}'

    repo, site = osp.realpath(installs['repo']), osp.realpath(installs['wheel_site'])
    train_out = out['train'][0]
    assert f'will use {osp.join(repo, "configs", "demo", CONFIG)} instead' in train_out
    assert f'{osp.join(repo, "softfree_mm", ".mim", "tools", "train.py")} ' in train_out
    assert 'config checked, no data read, nothing trained' in train_out

    test_out = out['test'][0]
    assert f'will use {osp.join(site, "softfree_mm", ".mim", "configs", "demo", CONFIG)} instead' in test_out
    assert f'{osp.join(site, "softfree_mm", ".mim", "tools", "test.py")} ' in test_out
    metrics = [line for line in test_out.splitlines() if line.startswith('metrics: ')]
    assert metrics and 'accuracy/top1' in metrics[-1]

    assert osp.join(site, 'softfree_mm', '.mim', 'tools', 'convert_checkpoint.py') in out['run'][0]
    converted = torch.load(str(tmp_path / 'converted.pth'), map_location='cpu', weights_only=False)
    keys = set(converted.get('state_dict', converted))
    assert 'pos_embed.token_projection.weight' in keys and not any(k.startswith('head') for k in keys)
