"""A run's identity (softfree_mm/engine/run_identity.py; issue 63): its resolved config, its starts and its launch.

Guards: every leaf of the config is in the identity and only the named keys (each with a reason) and the tools' machine
hooks are not; SyncBN is BN; a checkpoint path is replaced by its start (a release by content hash, a run by its own
record), so a change upstream changes the identity downstream and a moved work root changes none; the world size and
the per-GPU batch are part of it (the hole an injected bug left: a resume at another world size accepted); the flags of
tools/train.py that change a result are, --device is not; a config tools/train.py ran gives back the record of the
config it was given; differences name an upstream change by the upstream's key, a release of unknown hash by its
name; the work dir's file round-trips and an unreadable one is one error naming it; a file is hashed once.
"""
import copy
import json
import os

import pytest

from softfree_mm.engine import run_identity as ri
from softfree_mm.engine.errors import UsageError

RELEASE = ri.release_start('release.pth', 'a' * 64)


def _cfg(**over):
    cfg = dict(
        model=dict(type='ImageClassifier',
                   backbone=dict(type='SoftFreeXCiT', arch='s12', attn_cfg=dict(type='poly', degree=3),
                                 norm_cfg=dict(type='SyncBN'), drop_path_rate=0.1,
                                 init_cfg=dict(type='Pretrained', checkpoint='work_dirs/stage1', prefix='backbone.')),
                   head=dict(type='LinearClsHead', num_classes=1000,
                             init_cfg=dict(type='ReleaseHead', checkpoint='https://x.org/release.pth'))),
        train_dataloader=dict(batch_size=128, num_workers=8,
                              dataset=dict(type='ImageNet', data_root='data/imagenet', pipeline=[
                                  dict(type='RandomResizedCrop', scale=224), dict(type='PackInputs')])),
        optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-4, weight_decay=0.05,
                                                               betas=(0.9, 0.999))),
        param_scheduler=[dict(type='LinearLR', end=10), dict(type='CosineAnnealingLR', begin=10, end=100)],
        train_cfg=dict(type='IterBasedTrainLoop', max_iters=100),
        randomness=dict(seed=0), auto_scale_lr=dict(enable=False, base_batch_size=1024),
        default_hooks=dict(logger=dict(type='LoggerHook', interval=50), checkpoint=dict(interval=10),
                           timer=dict(type='IterTimerHook'), param_scheduler=dict(type='ParamSchedulerHook')),
        custom_hooks=[dict(type='EMAHook', momentum=1e-4)],
        log_processor=dict(by_epoch=False), log_level='INFO', visualizer=dict(type='Visualizer'),
        vis_backends=[dict(type='LocalVisBackend')], env_cfg=dict(cudnn_benchmark=False),
        work_dir='work_dirs/stage2', launcher='none', load_from=None, resume=False,
        warm_start=dict(recipe='transfer', scale='imagenet'))
    cfg.update(over)
    return cfg


def _starts(stage1=None):
    return {'work_dirs/stage1': ri.run_start(stage1 or _stage1()), 'https://x.org/release.pth': RELEASE}


def _stage1(**over):
    cfg = dict(model=dict(type='AttentionTransfer', loss='blocks',
                          teacher=dict(type='SoftFreeXCiT', init_cfg=dict(type='Pretrained',
                                                                          checkpoint='https://x.org/release.pth'))),
               optim_wrapper=dict(optimizer=dict(type='AdamW', lr=3e-3, weight_decay=0.0)),
               train_dataloader=dict(batch_size=128), work_dir='elsewhere')
    cfg.update(over)
    return ri.record(cfg, {'https://x.org/release.pth': RELEASE}, 8)


def _leaves(node, path=''):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f'{path}.{k}' if path else k)
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            yield from _leaves(v, f'{path}.{i}')
    else:
        yield path, node


def _changed(cfg, dotted, value):
    cfg = copy.deepcopy(cfg)
    node, keys = cfg, dotted.split('.')
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, (list, tuple)) else node[k]
    if isinstance(node, tuple):
        raise AssertionError('tuples are changed whole')
    node[int(keys[-1]) if isinstance(node, list) else keys[-1]] = value
    return cfg


def _other(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value * 2 + 1
    if value is None:
        return 'something'
    return f'{value}_other'


def test_record_is_the_resolved_config_less_the_named_keys_with_starts_in_place_of_paths():
    rec = ri.record(_cfg(), _starts(), 8)
    c = rec['config']
    for key in ri.IGNORED:  # every ignored key is gone, whatever else is there
        node = c
        for k in key.split('.'):
            node = node.get(k) if isinstance(node, dict) else None
        assert node is None, key
    assert c['default_hooks'] == {'param_scheduler': {'type': 'ParamSchedulerHook'}}
    assert c['warm_start'] == {'scale': 'imagenet'} and c['train_dataloader']['batch_size'] == 128
    assert c['model']['backbone']['norm_cfg'] == {'type': 'BN'}  # SyncBN: the tools swap it for one process
    assert c['optim_wrapper']['optimizer']['betas'] == [0.9, 0.999]  # tuples as lists
    assert c['model']['backbone']['init_cfg']['checkpoint'] == ri.run_start(_stage1())
    assert c['model']['head']['init_cfg']['checkpoint'] == RELEASE
    assert c['train_dataloader']['dataset']['data_root'] == 'data/imagenet'  # another data set is another run
    assert (rec['world_size'], rec['batch_per_gpu']) == (8, 128)
    assert rec['train_args'] == ri.train_flags() == {'amp': False, 'amp_dtype': None, 'auto_scale_lr': False,
                                                     'skip_nonfinite_loss': False}
    json.dumps(rec, allow_nan=False)  # plain JSON
    assert all(reason for reason in list(ri.IGNORED.values()) + list(ri.MACHINE_HOOKS.values()))


def test_every_leaf_of_the_config_but_the_named_keys_changes_the_identity():
    cfg, base = _cfg(), ri.identity(ri.record(_cfg(), _starts(), 8))
    checked = 0
    for key, value in _leaves(cfg):
        if key in ('model.backbone.init_cfg.checkpoint', 'model.head.init_cfg.checkpoint') or \
                key.startswith('optim_wrapper.optimizer.betas.'):
            continue  # starts: by their records (below); a tuple is changed whole
        new = _changed(cfg, key, _other(value))
        if any(key == k or key.startswith(k + '.') for k in ri.IGNORED) and not (key == 'load_from'):
            assert ri.identity(ri.record(new, _starts(), 8)) == base, key
            continue
        starts = dict(_starts(), something=RELEASE) if key == 'load_from' else _starts()
        assert ri.identity(ri.record(new, starts, 8)) != base, key
        checked += 1
    assert checked >= 25


def test_the_hooks_tools_train_adds_and_its_machine_settings_change_nothing():
    from mmengine.config import Config

    from softfree_mm.engine.runner import add_reliability_hooks
    planned = ri.record(_cfg(), _starts(), 8)
    ran = Config(_cfg(launcher='pytorch', work_dir='/scratch/job/stage2', env_cfg=dict(dist_cfg=dict(backend='gloo')),
                      model_wrapper_cfg=dict(type='MMDistributedDataParallel', device_ids=None)))
    ran.model.backbone.norm_cfg.type = 'BN'
    os.environ['SOFTFREE_MM_CHECKPOINT_SIGNAL'] = 'USR1'
    try:
        add_reliability_hooks(ran)
    finally:
        del os.environ['SOFTFREE_MM_CHECKPOINT_SIGNAL']
    assert {h['type'] for h in ran.custom_hooks} == {'EMAHook', *ri.MACHINE_HOOKS}
    assert ri.record(ran, _starts(), 8) == planned
    # a resumed run is the run it resumes: its load_from (its own checkpoint) is not a start
    resumed = _cfg(resume=True, load_from='/scratch/job/stage2/iter_50.pth')
    assert ri.record(resumed, _starts(), 8) == planned


def test_a_checkpoint_path_without_its_start_is_an_error():
    with pytest.raises(ValueError, match=r"no start given for model.head.init_cfg.checkpoint='https://x.org/"):
        ri.record(_cfg(), {'work_dirs/stage1': ri.run_start(_stage1())}, 8)
    assert ri.checkpoint_paths(_cfg(load_from='a.pth')) == {
        'load_from': 'a.pth', 'model.backbone.init_cfg.checkpoint': 'work_dirs/stage1',
        'model.head.init_cfg.checkpoint': 'https://x.org/release.pth'}


def test_a_change_upstream_changes_the_identity_downstream_and_is_named_by_the_upstreams_key():
    stage2 = ri.record(_cfg(), _starts(), 8)
    main = ri.record(dict(model=dict(backbone=dict(init_cfg=dict(checkpoint='w/stage2')))),
                     {'w/stage2': ri.run_start(stage2)}, 8)
    stage1b = _stage1(optim_wrapper=dict(optimizer=dict(type='AdamW', lr=3e-3, weight_decay=0.1)))
    stage2b = ri.record(_cfg(), _starts(stage1b), 8)
    # the same runs from another work root: nothing changes
    moved = ri.record(dict(model=dict(backbone=dict(init_cfg=dict(checkpoint='/elsewhere/stage2')))),
                      {'/elsewhere/stage2': ri.run_start(stage2)}, 8)
    assert ri.identity(moved) == ri.identity(main)
    mainb = ri.record(dict(model=dict(backbone=dict(init_cfg=dict(checkpoint='w/stage2')))),
                      {'w/stage2': ri.run_start(stage2b)}, 8)
    assert len({ri.identity(r) for r in (stage2, stage2b)}) == 2 and ri.identity(mainb) != ri.identity(main)
    diffs = ri.differences(main, mainb, upstream=['stage 2 (fine-tune)', 'stage 1 (transfer)'])
    assert diffs == [("stage 1 (transfer)'s optim_wrapper.optimizer.weight_decay", '0.0', '0.1')], diffs
    assert ri.describe(diffs) == "stage 1 (transfer)'s optim_wrapper.optimizer.weight_decay: 0.0 -> 0.1"
    # without names, the path of starts says where
    (key, _, _), = ri.differences(main, mainb)
    assert key.endswith("-> the run's optim_wrapper.optimizer.weight_decay"), key


def test_world_size_and_batch_are_part_of_the_identity():
    """The injected bug: the world size left out of the comparison accepted a resume at another world size."""
    at8, at4 = ri.record(_cfg(), _starts(), 8), ri.record(_cfg(), _starts(), 4)
    assert ri.identity(at8) != ri.identity(at4)
    assert ri.differences(at8, at4) == [('world_size', '8', '4')]
    bigger = _changed(_cfg(), 'train_dataloader.batch_size', 256)
    assert [k for k, _, _ in ri.differences(at8, ri.record(bigger, _starts(), 8))] == [
        'batch_per_gpu', 'train_dataloader.batch_size']


def test_the_flags_that_change_a_result_are_part_of_it_and_the_device_is_not():
    assert ri.train_flags('--amp --device cpu') == {'amp': True, 'amp_dtype': 'auto', 'auto_scale_lr': False,
                                                    'skip_nonfinite_loss': False}
    assert ri.train_flags(['--device', 'cuda']) == ri.train_flags()
    assert ri.train_flags('--amp-dtype float16') == ri.train_flags()  # no --amp: the dtype is not used
    flags = ri.train_flags('--auto-scale-lr --skip-nonfinite-loss --amp --amp-dtype bfloat16')
    assert flags == {'amp': True, 'amp_dtype': 'bfloat16', 'auto_scale_lr': True, 'skip_nonfinite_loss': True}
    plain, amp = (ri.record(_cfg(), _starts(), 8, f) for f in (ri.train_flags(), ri.train_flags('--amp')))
    assert ri.differences(plain, amp) == [('train_args.amp', 'false', 'true'),
                                          ('train_args.amp_dtype', 'null', 'auto')]


def test_a_config_tools_train_ran_gives_back_the_record_of_the_config_it_was_given():
    """What --amp, --auto-scale-lr and --skip-nonfinite-loss wrote into the config mmengine saved, back as flags."""
    from mmengine.config import Config

    from softfree_mm.engine.runner import add_reliability_hooks, enable_auto_scale_lr
    ran = Config(_cfg())
    ran.optim_wrapper.update(type='AmpOptimWrapper', dtype='bfloat16', loss_scale='dynamic')
    enable_auto_scale_lr(ran)
    add_reliability_hooks(ran, skip_nonfinite_loss=True)
    given, flags = ri.undo_train_flags(ran)
    assert flags == {'amp': True, 'amp_dtype': 'bfloat16', 'auto_scale_lr': True, 'skip_nonfinite_loss': True}
    assert ri.record(given, _starts(), 8, flags) == ri.record(_cfg(), _starts(), 8, flags)
    assert ran.optim_wrapper.type == 'AmpOptimWrapper'  # the argument is left as it was


def test_a_release_is_compared_by_hash_and_by_name_only_while_its_hash_is_not_known():
    def rec(name, sha):
        return ri.record(dict(load_from='x'), {'x': ri.release_start(name, sha)}, 1)
    assert ri.differences(rec('a.pth', 'a' * 64), rec('b.pth', 'a' * 64)) == []  # the same file, renamed
    assert ri.differences(rec('a.pth', 'a' * 64), rec('a.pth', 'b' * 64)) == [
        ('load_from', 'a.pth (sha256 aaaaaaaaaaaa)', 'a.pth (sha256 bbbbbbbbbbbb)')]
    assert ri.differences(rec('a.pth', None), rec('a.pth', 'b' * 64)) == []
    assert ri.differences(rec('a.pth', None), rec('b.pth', 'b' * 64)) == [
        ('load_from', 'a.pth (sha256 not known here yet: compared by its file name)',
         'b.pth (sha256 not known here yet: compared by its file name)')]


def test_the_work_dir_file_round_trips_with_the_versions_and_an_unreadable_one_is_named(tmp_path):
    rec = ri.record(_cfg(), _starts(), 8)
    ri.write(str(tmp_path), rec, adopted_from='iter_10.pth')
    data = ri.read(str(tmp_path))
    assert data['record'] == rec and data['identity'] == ri.identity(rec) and data['adopted_from'] == 'iter_10.pth'
    assert {'torch', 'torchvision', 'mmengine', 'mmcv', 'mmdet', 'mmseg', 'mmpretrain', 'timm', 'numpy', 'opencv',
            'softfree_mm', 'softfree_mm_commit'} == set(data['versions'])
    assert ri.version_changes(data['versions']) == ''
    assert ri.version_changes(dict(data['versions'], torch='1.0')) == f"torch 1.0 -> {data['versions']['torch']}"
    # another commit of this checkout is recorded, not announced on every resume
    assert ri.version_changes(dict(data['versions'], softfree_mm_commit='0' * 40)) == ''
    assert ri.read(str(tmp_path / 'none')) is None
    (tmp_path / ri.FILE).write_text('{"identity": ')
    with pytest.raises(UsageError, match=f'^{tmp_path / ri.FILE}: not a run identity that can be read'):
        ri.read(str(tmp_path))


def test_a_file_is_hashed_once_and_again_only_when_it_changed(tmp_path, monkeypatch):
    import hashlib
    calls = []
    from softfree_mm.engine import file_hash
    digest = file_hash.digest
    monkeypatch.setattr(file_hash, 'digest', lambda p: calls.append(p) or digest(p))
    monkeypatch.setattr(file_hash, '_MEMO', {})
    path = tmp_path / 'release.pth'
    path.write_bytes(b'weights' * 1000)
    want = hashlib.sha256(path.read_bytes()).hexdigest()
    assert ri.sha256_of(str(path)) == want and ri.sha256_of(str(path)) == want and len(calls) == 1
    side = json.loads((tmp_path / ('release.pth' + ri.SIDECAR)).read_text())
    assert side == {'size': 7000, 'mtime_ns': os.stat(path).st_mtime_ns, 'sha256': want}
    monkeypatch.setattr(file_hash, '_MEMO', {})  # another process: the sidecar answers
    assert ri.sha256_of(str(path)) == want and len(calls) == 1
    path.write_bytes(b'other weights')  # another size: hashed again
    assert ri.sha256_of(str(path)) == hashlib.sha256(b'other weights').hexdigest() and len(calls) == 2
