"""The Agent Attention det / seg set-ups: the official Mask R-CNN (mmdet 2.x), UperNet and Semantic FPN (mmseg 0.x)
files convert into our mmdet 3 / mmseg 1 models (random weights in the official layout: the backbone as the official
detection backbone names it, the neck and heads under the names mmdet 2.x / mmseg 0.x and mmdet 3 / mmseg 1 share),
and the Mask R-CNN Agent-Swin-T config counts the official 48M parameters."""
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import MODELS

import softfree_mm  # noqa: F401
from softfree_mm.models.converters import convert_whole_model

import convert_checkpoint  # tools/convert_checkpoint.py (tests/conftest.py puts tools/ on sys.path)

from tests.helpers import ROOT
from tests.models.test_agent_releases import PVT, SWIN, agent_pvt_layout, agent_swin_layout
from tests.test_configs import _skip_random_init

SMALL = {
    'maskrcnn_swin_t_agent.py': (dict(embed_dims=16, num_heads=SWIN['num_heads'], depths=SWIN['depths']),
                                 dict(neck=dict(in_channels=[16, 32, 64, 128])), 'agent_swin'),
    'upernet_swin_t_agent.py': (dict(embed_dims=16, num_heads=SWIN['num_heads'], depths=SWIN['depths']),
                                dict(decode_head=dict(in_channels=[16, 32, 64, 128]),
                                     auxiliary_head=dict(in_channels=64)), 'agent_swin'),
    'maskrcnn_pvt_s_agent.py': (PVT, dict(neck=dict(in_channels=[16, 32, 40, 64])), 'agent_pvt'),
    'semfpn_pvt_s_agent.py': (PVT, dict(neck=dict(in_channels=[16, 32, 40, 64])), 'agent_pvt'),
}


def _build(name, monkeypatch, backbone=None, rest=None):
    cfg = Config.fromfile(osp.join(ROOT, 'configs', name))
    if backbone is not None:
        cfg.merge_from_dict(dict(model=dict(backbone=dict(backbone, init_cfg=None), **rest)))
    from softfree_mm.engine.device import _replace_syncbn
    _replace_syncbn(cfg.model)
    _skip_random_init(monkeypatch)
    with MODELS.switch_scope_and_registry(cfg.default_scope) as registry:
        return registry.build(cfg.model)


def _official_file(model, family):
    """A release file as mmdet 2.x / mmseg 0.x save it: 'state_dict' (the official backbone layout under 'backbone.',
    the neck and heads by their shared names) and 'meta'."""
    backbone = agent_swin_layout('AAAB', detection=True) if family == 'agent_swin' else \
        {k: v for k, v in agent_pvt_layout().items() if not k.startswith('head.')}
    g = torch.Generator().manual_seed(0)
    rest = {k: (torch.randn(v.shape, generator=g, dtype=torch.float64) if v.is_floating_point() else v)
            for k, v in model.state_dict().items() if not k.startswith('backbone.')}
    return {'state_dict': {**{'backbone.' + k: v for k, v in backbone.items()}, **rest},
            'meta': {'mmdet_version': '2.25.0', 'CLASSES': ('person',)}}, backbone


@pytest.mark.parametrize('name', sorted(SMALL))
def test_official_whole_release_converts_and_loads_strictly(name, monkeypatch):
    backbone_args, rest, family = SMALL[name]
    model = _build(name, monkeypatch, backbone_args, rest).double()
    release, official_backbone = _official_file(model, family)
    converted = convert_whole_model(release, family)
    model.load_state_dict(converted, strict=True)
    key = 'stages.0.blocks.0.attn.kernel.an_bias'
    src = 'layers.0.blocks.0.attn.an_bias' if family == 'agent_swin' else 'block1.0.attn.an_bias'
    assert torch.equal(model.backbone.state_dict()[key], official_backbone[src])
    head = next(k for k in release['state_dict'] if not k.startswith('backbone.'))
    assert torch.equal(model.state_dict()[head], release['state_dict'][head])


def test_convert_tool_writes_a_whole_model_for_load_from(tmp_path, monkeypatch, capsys):
    model = _build('maskrcnn_swin_t_agent.py', monkeypatch, *SMALL['maskrcnn_swin_t_agent.py'][:2]).double()
    release, _ = _official_file(model, 'agent_swin')
    src, dst = tmp_path / 'release.pth', tmp_path / 'whole.pth'
    torch.save(release, src)
    assert convert_checkpoint.main(['auto', str(src), str(dst), '--whole']) == 0
    out = capsys.readouterr().out
    assert 'agent_swin (whole model)' in out
    # the release's padding rule is named and recorded, and the config's preset carries it
    assert "padding rule pad_keys='zeros', always_shift=True" in out
    saved = torch.load(dst, weights_only=True)
    assert saved['meta']['backbone_padding'] == dict(pad_keys='zeros', always_shift=True)
    assert (model.backbone.pad_keys, model.backbone.always_shift) == ('zeros', True)
    model.load_state_dict(saved['state_dict'], strict=True)
    torch.save({'state_dict': {'a.weight': torch.ones(1)}}, src)
    with pytest.raises(SystemExit):
        convert_checkpoint.main(['agent_swin', str(src), str(dst), '--whole'])
    assert 'holds no backbone.* keys' in capsys.readouterr().err


def test_maskrcnn_agent_swin_t_counts_the_official_48m_parameters(monkeypatch):
    model = _build('maskrcnn_swin_t_agent.py', monkeypatch)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    assert abs(params - 48) / 48 < 0.02, params


# the classifiers as shipped: the release's backbone (Pretrained) and its linear classifier (ReleaseHead), at a small
# width that keeps the layout; the logits against the official computation (float64)
CLS = {'cls_swin_t_agent.py': (dict(embed_dims=16, num_heads=SWIN['num_heads'], depths=SWIN['depths']), 128),
       'cls_pvt_s_agent.py': (PVT, 64)}


@pytest.mark.parametrize('name', sorted(CLS))
def test_agent_classifier_config_as_shipped_is_the_release_with_its_head(name, tmp_path, monkeypatch):
    from tests.models.test_agent_releases import official_agent_pvt, official_agent_swin
    from tests.models.test_official_weights import image
    backbone, width = CLS[name]
    cfg = Config.fromfile(osp.join(ROOT, 'configs', name))
    release = cfg.agent_release
    assert cfg.model.backbone.init_cfg == dict(type='Pretrained', checkpoint=release)
    assert cfg.model.head.init_cfg == dict(type='ReleaseHead', checkpoint=release)
    official = agent_swin_layout('AAAB') if 'swin' in name else agent_pvt_layout()
    official = {k: v.float() if v.is_floating_point() else v for k, v in official.items()}  # as released: float32
    path = str(tmp_path / 'release.pth')
    torch.save({'model': official}, path)
    official = {k: v.double() if v.is_floating_point() else v for k, v in official.items()}
    cfg.merge_from_dict(dict(model=dict(backbone=dict(backbone, init_cfg=dict(checkpoint=path)),
                                        head=dict(in_channels=width, num_classes=10, init_cfg=dict(checkpoint=path)))))
    with MODELS.switch_scope_and_registry(cfg.default_scope) as registry:
        model = registry.build(cfg.model)
    model.init_weights()  # what tools/test.py CONFIG init does
    model = model.double().eval()
    x = image(224, 224)
    with torch.no_grad():
        feats = model.extract_feat(x)
        logits = model.head(feats)
    if 'swin' in name:
        final = official_agent_swin(official, x, 'AAAB')[0]
    else:
        final = official_agent_pvt(official, x)[-1]
    expect = torch.nn.functional.linear(final.mean((2, 3)), official['head.weight'], official['head.bias'])
    torch.testing.assert_close(logits, expect, rtol=1e-10, atol=1e-10)
