"""The named repairs of softfree_mm.compat, each checked against the real failure it repairs."""
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

import softfree_mm  # noqa: F401  (applies the repairs)
from softfree_mm import compat, files


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


# compat.py loaded on its own (its repairs without the package's registries: an import of mmdet, mmseg and
# mmpretrain in each process would cost most of the test)
_DIST_SCRIPT = (
    'import sys, torch, torch.distributed as dist\n'
    'import softfree_mm  # applies softfree_mm.compat\n'
    'from mmengine.dist import init_dist\n'
    "init_dist(sys.argv[1], backend='nccl')\n"
    't = torch.ones(1) * (dist.get_rank() + 1)\n'
    'dist.all_reduce(t)\n'
    "open(f'{sys.argv[2]}/rank{dist.get_rank()}.txt', 'w').write(f'{dist.get_backend()} {float(t)}')\n"
    'dist.destroy_process_group()\n')


def _rank_results(out_dir):
    """Each rank writes its own file: two processes printing to one pipe can interleave their lines."""
    return sorted((p.name, p.read_text()) for p in out_dir.glob('rank*.txt'))


def _toy_runner(work_dir, max_epochs=1, resume=False, load_from=None, max_keep_ckpts=-1):
    from mmengine.model import BaseModel
    from mmengine.runner import Runner

    class Toy(BaseModel):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 1)

        def forward(self, inputs, targets=None, mode='tensor'):
            x = torch.stack(inputs) if isinstance(inputs, list) else inputs
            out = self.lin(x)
            if mode == 'loss':
                t = torch.stack(targets) if isinstance(targets, list) else targets
                return dict(loss=((out.squeeze(-1) - t) ** 2).mean())
            return out

    data = [dict(inputs=torch.tensor([float(i), 1.0]), targets=torch.tensor(float(i) * 0.5)) for i in range(8)]
    return Runner(model=Toy(), work_dir=str(work_dir),
                  train_dataloader=dict(dataset=data, sampler=dict(type='DefaultSampler', shuffle=False),
                                        batch_size=4, collate_fn=dict(type='default_collate')),
                  optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)),
                  train_cfg=dict(by_epoch=True, max_epochs=max_epochs),
                  default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=1,
                                                     max_keep_ckpts=max_keep_ckpts)),
                  resume=resume, load_from=load_from, default_scope='mmengine')


def test_mmengine_checkpoint_loads_with_default_weights_only(tmp_path):
    runner = _toy_runner(tmp_path, max_epochs=1)
    runner.train()
    ckpt = tmp_path / 'epoch_1.pth'
    assert ckpt.exists()
    # the file really holds the types the repair allow-lists (else this test would prove nothing)
    raw = torch.load(ckpt, weights_only=False)
    hub = raw['message_hub']
    assert any(type(v).__name__ == 'HistoryBuffer' for v in hub['log_scalars'].values())
    loaded = torch.load(ckpt)  # weights_only=True is torch's default since 2.6
    assert loaded['meta']['epoch'] == 1
    for k, v in raw['state_dict'].items():
        assert torch.equal(loaded['state_dict'][k], v)


class _HalfThenFull:
    """A file whose first write puts half the bytes on disk, then fails as a full disk does."""

    def __init__(self, f, on_write=None):
        self.f, self.on_write = f, on_write

    def write(self, data):
        self.f.write(data[:len(data) // 2])
        self.f.flush()
        if self.on_write:
            self.on_write()
        raise OSError(28, 'No space left on device')

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.f.__exit__(*exc)

    def __getattr__(self, name):
        return getattr(self.f, name)


def _full_disk_for(monkeypatch, part, on_write=None):
    """From now on, writing to a file whose path holds ``part`` (under whatever name the writer opens) fails
    half-way."""
    real_open = open

    def full_disk_open(file, mode='r', *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        return _HalfThenFull(f, on_write) if 'w' in mode and part in str(file) else f

    monkeypatch.setattr('builtins.open', full_disk_open)


def test_failed_atomic_write_leaves_the_previous_file_and_no_partial_one(tmp_path, monkeypatch):
    """The final name holds the complete old file until the new one is complete: during the write, after it fails
    (nothing else left in the folder), and the complete new file after a write that succeeds."""
    path = tmp_path / 'epoch_3.pth'
    old, new = b'old checkpoint ' * 100, b'new checkpoint ' * 200
    path.write_bytes(old)
    seen = []
    _full_disk_for(monkeypatch, 'epoch_3', on_write=lambda: seen.append(path.read_bytes()))
    with pytest.raises(OSError, match='No space left'):
        files.atomic_write(new, str(path))
    monkeypatch.undo()
    assert seen == [old]  # while the new bytes were written
    assert path.read_bytes() == old
    assert [p.name for p in tmp_path.iterdir()] == ['epoch_3.pth']
    files.atomic_write(new, str(path))
    assert path.read_bytes() == new and [p.name for p in tmp_path.iterdir()] == ['epoch_3.pth']


def test_failed_save_keeps_the_previous_checkpoint_and_no_partial_file(tmp_path, monkeypatch):
    """max_keep_ckpts=1: mmengine deletes the old checkpoint before writing the new one; a save that fails half-way
    (here: the disk fills after half the bytes) must leave the old one, and no partial file under the new name."""
    _toy_runner(tmp_path, max_epochs=1, max_keep_ckpts=1).train()
    _full_disk_for(monkeypatch, 'epoch_2')
    with pytest.raises(OSError, match='No space left'):
        _toy_runner(tmp_path, max_epochs=2, resume=True, max_keep_ckpts=1).train()
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.glob('*.pth*')) == ['epoch_1.pth']
    assert torch.load(tmp_path / 'epoch_1.pth')['meta']['epoch'] == 1
    assert (tmp_path / 'last_checkpoint').read_text().strip().endswith('epoch_1.pth')


def test_failed_save_over_an_existing_checkpoint_keeps_it_whole(tmp_path, monkeypatch):
    """Resumed from epoch 1 in a work dir that already holds epoch 2: the new epoch 2 is saved under the name of the
    old one, and fails half-way; the old file stays, byte for byte."""
    _toy_runner(tmp_path, max_epochs=2).train()
    before = (tmp_path / 'epoch_2.pth').read_bytes()
    _full_disk_for(monkeypatch, 'epoch_2')
    with pytest.raises(OSError, match='No space left'):
        _toy_runner(tmp_path, max_epochs=2, resume=True, load_from=str(tmp_path / 'epoch_1.pth')).train()
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.glob('*.pth*')) == ['epoch_1.pth', 'epoch_2.pth']
    assert (tmp_path / 'epoch_2.pth').read_bytes() == before


def test_resume_continues_from_saved_epoch(tmp_path):
    _toy_runner(tmp_path, max_epochs=1).train()
    runner = _toy_runner(tmp_path, max_epochs=2, resume=True)
    runner.train()
    assert runner.epoch == 2 and (tmp_path / 'epoch_2.pth').exists()


def test_allow_list_still_refuses_arbitrary_objects(tmp_path):
    path = tmp_path / 'evil.pth'
    torch.save({'obj': subprocess.Popen}, path)
    with pytest.raises(Exception, match='weights_only|Unsupported global'):
        torch.load(path)


def _qualname(g):
    if isinstance(g, tuple):  # (object, the name it pickles under)
        return f'{g[1]} (as {g[0].__module__}.{g[0].__name__})'
    return f'{g.__module__}.{g.__qualname__}'


def test_allow_list_is_exactly_mmengines_checkpoint_types():
    """The exact set the repair allow-lists: anything more (``builtins.getattr`` above all: a pickle of
    ``[1].append`` goes through it) widens what a downloaded checkpoint can execute."""
    core = 'numpy._core' if hasattr(np, '_core') else 'numpy.core'
    expected = {
        'mmengine.logging.history_buffer.HistoryBuffer',
        f'numpy.core.multiarray.scalar (as {core}.multiarray.scalar)', f'{core}.multiarray.scalar',
        f'numpy.core.multiarray._reconstruct (as {core}.multiarray._reconstruct)', f'{core}.multiarray._reconstruct',
        'numpy.ndarray', 'numpy.dtype',
        *(f'numpy.dtypes.{t}DType' for t in ('Float16', 'Float32', 'Float64', 'Int8', 'Int16', 'Int32', 'Int64',
                                             'UInt8', 'Bool', 'Complex64', 'Complex128')),
    }
    assert {_qualname(g) for g in compat.CHECKPOINT_SAFE_GLOBALS} == expected
    # and nothing else reached torch's list from this package: the rest is torch's own (its exception classes,
    # tracebacks, distributed tensors)
    ours = {id(g) for g in compat.CHECKPOINT_SAFE_GLOBALS}
    others = [g for g in torch.serialization.get_safe_globals() if id(g) not in ours]
    for g in others:
        obj = g[0] if isinstance(g, tuple) else g
        assert (isinstance(obj, type) and issubclass(obj, BaseException)) or \
            getattr(obj, '__module__', '').split('.')[0] in ('torch', 'traceback'), f'unexpected safe global {g!r}'


def test_pickled_bound_method_through_getattr_is_refused(tmp_path):
    """``[1].append`` pickles as ``builtins.getattr([1], 'append')``: loading it must fail under the allow-list."""
    path = tmp_path / 'getattr.pth'
    torch.save({'f': [1].append}, path)
    with pytest.raises(Exception, match='getattr'):
        torch.load(path)


def test_numpy_scalars_round_trip(tmp_path):
    path = tmp_path / 'np.pth'
    obj = {'a': np.float64(1.5), 'b': np.int64(3), 'arr': np.arange(3, dtype=np.float32)}
    torch.save(obj, path)
    out = torch.load(path)
    assert out['a'] == 1.5 and out['b'] == 3 and np.array_equal(out['arr'], obj['arr'])


def test_repairs_are_named_and_applied_once():
    # the mmcv ops route is for a compiled mmcv only: over the stand-in every op already runs on torchvision
    route = [] if compat.mmcv_ext_is_standin() else ['mmcv_ops_on_torchvision']
    assert compat.APPLIED == ['distutils_for_mmengine', 'allow_mmengine_checkpoint_types', 'init_dist_without_cuda',
                              *route, 'checkpoints_replace_atomically']
    assert compat.apply_all() == compat.APPLIED


_NO_SHIM = """
import sys
# an environment whose site-packages .pth files did not run: no setuptools distutils shim
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != 'DistutilsMetaFinder']
for name in [m for m in sys.modules if m == 'distutils' or m.startswith('distutils.')]:
    del sys.modules[name]
try:
    import distutils  # noqa: F401
    print('distutils before: yes')
except ImportError:
    print('distutils before: no')
import softfree_mm  # noqa: F401
from mmengine.utils.dl_utils import collect_env
env = collect_env()
print('collect_env:', sorted(env)[:2])
"""


def test_mmengines_collect_env_runs_where_the_distutils_shim_did_not_run():
    """mmengine's collect_env (every Runner's start) imports distutils: on Python 3.12+ it is setuptools' through its
    shim, which a .pth installs; where that .pth did not run, importing softfree_mm puts the shim in place. (On 3.11
    distutils is the standard library's: nothing to repair, the run shows it.)"""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, '-c', _NO_SHIM], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before = 'yes' if sys.version_info < (3, 12) else 'no'
    assert f'distutils before: {before}' in proc.stdout  # the check can fail: without the repair, collect_env does
    assert 'collect_env:' in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason='the repair is about machines without CUDA')
def test_init_dist_slurm_on_cpu(tmp_path):
    """Two processes started the way srun starts them (SLURM_* variables), on a machine without CUDA. (The
    torchrun start-up is the real tools/dist_train.sh run of tests/tools/test_tools_dist.py.)"""
    script = tmp_path / 'slurm_init.py'
    script.write_text(_DIST_SCRIPT)
    port = str(_free_port())
    procs = []
    for rank in range(2):
        env = dict(os.environ, OMP_NUM_THREADS='1', SLURM_PROCID=str(rank), SLURM_NTASKS='2', SLURM_LOCALID=str(rank),
                   SLURM_NODELIST='localhost', MASTER_ADDR='127.0.0.1', MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, str(script), 'slurm', str(tmp_path)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert _rank_results(tmp_path) == [('rank0.txt', 'gloo 3.0'), ('rank1.txt', 'gloo 3.0')]
