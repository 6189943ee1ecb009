"""The task route of the warm start (softfree_mm/engine/task_route.py, ``tools/warm_start.py --from-task``; issue 67)
on a user's mmdet Swin-T Mask R-CNN: mmdet's own config at a reduced width and depth on the demo scenes, and a
checkpoint saved from mmdet's model built from it (random weights in mmdet's SwinTransformer layout); the kernel's
config is the user's with ``type='SoftFreeSwin'`` (the drop-in), x^3 and mmdet's padding rule.

Guards: each stage receives the config the recipe defines, read as tools/train.py reads its command line (stage 1:
attention transfer on the task's training set, teacher the checkpoint's backbone with softmax and mmdet's padding;
stage 2: the whole detector, backbone from stage 1 and every other part from the checkpoint); the dry run says the
route and each stage's cost in images, stage 1 runs on the demo scenes (its work dir then refuses another recipe's
stage 1), its teacher computes mmdet's backbone at a padded size, and stage 2 starts from stage 1's backbone and the
checkpoint's neck and heads; bad input is one line naming the value, before any run.
"""
import os.path as osp
import pickle

import pytest
import torch

from softfree_mm.engine import chain_run
from softfree_mm.engine import task_route as tr
from softfree_mm.engine import warm_start as ws
from softfree_mm.engine.errors import UsageError

from tests.helpers import ROOT, load_tool, main_as_command
from tests.helpers.stages import stages_as_run

WIDTH = """model = dict(
    backbone=dict(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 2, 4], init_cfg=None),
    neck=dict(in_channels=[16, 32, 64, 128], out_channels=32),
    rpn_head=dict(in_channels=32, feat_channels=32),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=32),
        bbox_head=dict(in_channels=32, fc_out_channels=64, num_classes=10),
        mask_roi_extractor=dict(out_channels=32),
        mask_head=dict(in_channels=32, conv_out_channels=32, num_classes=10)))
"""


@pytest.fixture(scope='module')
def user(tmp_path_factory):
    """(folder, the kernel's config, the softmax checkpoint): mmdet's Swin-T Mask R-CNN config at a reduced width on
    the demo scenes, a checkpoint of mmdet's model built from it."""
    import mmdet
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    from mmengine.config import Config

    from softfree_mm.engine.demo_data import make_demo_data
    home = tmp_path_factory.mktemp('task_route')
    data = make_demo_data(str(home / 'data'), only=('coco', ))
    mmdet_cfg = osp.join(osp.dirname(mmdet.__file__), '.mim', 'configs', 'swin',
                         'mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py')
    (home / 'user_maskrcnn_swin_t.py').write_text(
        f'_base_ = {mmdet_cfg!r}\ndata_root = {osp.join(data, "coco") + "/"!r}\n'
        "metainfo = dict(classes=tuple(f'digit_{d}' for d in range(10)))\n" + WIDTH +
        "train_pipeline = [dict(type='LoadImageFromFile'),\n"
        "                  dict(type='LoadAnnotations', with_bbox=True, with_mask=True),\n"
        "                  dict(type='Resize', scale=(200, 150), keep_ratio=True), dict(type='PackDetInputs')]\n"
        'train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,\n'
        '                        dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=train_pipeline))\n')
    config = home / 'user_maskrcnn_swin_t_poly3.py'
    config.write_text("_base_ = './user_maskrcnn_swin_t.py'\nmodel = dict(backbone=dict(type='SoftFreeSwin', "
                      "attn_cfg=dict(type='poly', degree=3), pad_keys='zeros', always_shift=True))\n")
    register_all_modules()
    torch.manual_seed(0)
    model = MODELS.build(Config.fromfile(str(home / 'user_maskrcnn_swin_t.py')).model)
    with torch.no_grad():  # every tensor random (norms and position biases too): a teacher that drops one shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    checkpoint = str(home / 'mask_rcnn_swin_t_softmax.pth')
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, checkpoint)
    return home, str(config), checkpoint


def _plan(user, **kw):
    home, config, checkpoint = user
    kw = dict(dict(iters=6, batch_scale='linear'), **kw)
    return tr.plan(chain_run.Request(config, str(home / 'w'), **kw), ROOT, checkpoint)


@pytest.fixture
def tool(capsys, user, monkeypatch):
    monkeypatch.chdir(user[0])
    return main_as_command(load_tool('warm_start'), capsys)


@pytest.mark.parametrize('name', ['transfer', 'transfer-newhead'])
def test_each_stage_of_the_task_route_receives_the_config_its_recipe_defines(name, user):
    """Through the commands the chain starts, parsed by tools/train.py and merged as its run merges them; the plan
    pickles as the cluster path hands it to each job."""
    from mmengine.config import Config
    p = _plan(user, recipe=name)
    assert pickle.loads(pickle.dumps(p)).records == p.records
    recipe, checkpoint = ws.RECIPES[name], user[2]
    own = Config.fromfile(user[1])
    # the config's lr at its batch (mmdet's 16), the warm start's 6 iterations at that batch, run at 1 x 2 images
    scale = ws.Scale('task', scratch_lr=own.optim_wrapper.optimizer.lr, iters=6, batch=16, checkpoint_every=0,
                     log_every=50, val_every=0)
    s1, s2 = stages_as_run(p, checkpoint, ws.stage_settings(recipe, ws.at_batch(scale, 2, 'linear')))
    for cfg in (s1, s2):  # the task's images
        assert cfg.train_dataloader.dataset.to_dict() == own.train_dataloader.dataset.to_dict()
    assert (s1.model.type, s1.model.loss, list(s1.model.train)) == ('AttentionTransfer', recipe.loss,
                                                                    list(recipe.groups))
    assert (s1.model.teacher.init_cfg.checkpoint, s1.model.teacher.init_cfg.prefix) == (checkpoint, 'backbone.')
    assert (s1.model.teacher.attn_cfg.type, s1.model.backbone.attn_cfg.type) == ('softmax', 'poly')
    assert (s1.model.teacher.pad_keys, s1.model.teacher.always_shift) == ('zeros', True)  # mmdet's padding rule
    assert s1.model.data_preprocessor.type == own.model.data_preprocessor.type
    assert s2.model.type == 'MaskRCNN'
    assert (s2.model.backbone.init_cfg.checkpoint, s2.model.backbone.attn_cfg.type) == (p.runs[0].work_dir, 'poly')
    for part in ('neck', 'rpn_head', 'roi_head'):
        init = s2.model[part].get('init_cfg') or {}
        if recipe.head == 'new':
            assert init.get('type') != 'Pretrained'
        else:
            assert (init['type'], init['checkpoint'], init['prefix']) == ('Pretrained', checkpoint, f'{part}.')


def test_an_mmdet_swin_mask_rcnn_goes_through_the_dry_run_and_stage_1_whose_teacher_is_mmdets_backbone(user, tool):
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    home, config, checkpoint = user
    status, out, err = tool(config, '--from-task', checkpoint, '--work-root', 'w', '--batch-scale', 'linear',
                            '--dry-run')
    assert status == 0, err
    assert 'route: the task (--from-task)' in out and '(12 epochs x 800 images)' in out
    assert 'cost of stage 1 (transfer): 400 iterations x 2 images = 800 images' in out
    assert 'cost of stage 2 (fine-tune): 800 iterations x 2 images = 1,600 images' in out

    p = _plan(user, batch_scale='keep')  # 6 iterations: stage 1 runs 2
    probe = chain_run.probe(p)
    ran, train = [], load_tool('train')

    def launch(cmd, env):  # stage 1's command as the chain starts it, run here; stage 2 not (not this test's)
        ran.append(cmd)
        assert cmd[1].endswith(osp.join('tools', 'train.py'))
        return train.main(cmd[2:]) if len(ran) == 1 else 3

    assert chain_run.execute(p, probe, checkpoint, launch=launch, say=lambda *a, **k: None) == 3
    assert chain_run.run_state(p, 0).state == 'done' and len(ran) == 2
    with pytest.raises(UsageError, match="holds another run than this command's stage 1 .*model.train"):
        chain_run.probe(_plan(user, batch_scale='keep', recipe='transfer-blocks'))  # its work dir: another recipe's

    with DefaultScope.overwrite_default_scope('mmdet'):
        stage1, stage2 = (MODELS.build(chain_run.run_config(r).model) for r in p.runs)
        stage1.init_weights()
        stage2.init_weights()
        theirs = MODELS.build(Config.fromfile(str(home / 'user_maskrcnn_swin_t.py')).model.backbone)
    sd = torch.load(checkpoint, weights_only=True)['state_dict']
    transferred = torch.load(chain_run.run_state(p, 0).checkpoint, weights_only=False)['state_dict']
    for k, v in stage2.state_dict().items():  # stage 2 starts: the backbone stage 1's, the rest the checkpoint's
        assert torch.equal(v, (transferred if k.startswith('backbone.') else sd)[k]), k
    theirs.load_state_dict({k[len('backbone.'):]: v for k, v in sd.items() if k.startswith('backbone.')})
    x = torch.randn(1, 3, 150, 206, dtype=torch.float64)  # a patch grid of 38 x 52: windows of 7 pad it
    teacher = stage1.teacher.double()
    teacher.eval(), theirs.double().eval()
    with torch.no_grad():
        ours, ref = teacher(x), theirs(x)
    assert len(ours) == len(ref) == 4
    for a, b in zip(ours, ref):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-10, rtol=0), (a - b).abs().max()


def _other_architecture(user) -> str:
    """The user's checkpoint with a backbone of another width (mmdet's Swin at 24 channels)."""
    from mmdet.models.backbones import SwinTransformer
    sd = torch.load(user[2], weights_only=True)['state_dict']
    other = SwinTransformer(embed_dims=24, depths=[2, 2, 2, 2], num_heads=[1, 2, 2, 4])
    sd = {k: v for k, v in sd.items() if not k.startswith('backbone.')}
    sd.update({f'backbone.{k}': v for k, v in other.state_dict().items()})
    path = str(user[0] / 'swin_24.pth')
    torch.save({'state_dict': sd}, path)
    return path


def _classifier(user) -> str:
    sd = torch.load(user[2], weights_only=True)['state_dict']
    path = str(user[0] / 'classifier.pth')
    torch.save({'state_dict': {k: v for k, v in sd.items() if k.startswith('backbone.')}}, path)
    return path


@pytest.mark.parametrize('case, named', [
    ('missing', "--from-task nowhere.pth: no such file"),
    ('classifier', 'holds no neck.*, rpn_head.*, roi_head.* weights'),
    ('architecture', 'swin_24.pth'),
    ('cls config', 'cls_xcit_t12_poly3_demo.py is a cls config'),
])
def test_bad_input_is_one_line_naming_it_before_any_run(case, named, user, tool):
    config, checkpoint = user[1], user[2]
    if case == 'missing':
        checkpoint = 'nowhere.pth'
    elif case == 'classifier':
        checkpoint = _classifier(user)
    elif case == 'architecture':
        checkpoint = _other_architecture(user)
    else:
        config = osp.join(ROOT, 'configs', 'demo', 'cls_xcit_t12_poly3_demo.py')
    status, out, err = tool(config, '--from-task', checkpoint, '--work-root', 'bad', '--iters', '6', '--batch-scale',
                            'linear')
    lines = [ln for ln in err.strip().splitlines() if ln.startswith('error:')]
    assert status == 2 and len(lines) == 1 and named in lines[0], err
    assert not osp.exists(user[0] / 'bad' / 'transfer_task_user_maskrcnn_swin_t_poly3')
