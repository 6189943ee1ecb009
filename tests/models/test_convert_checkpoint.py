"""tools/convert_checkpoint.py: release/timm layouts in, our layout out, loadable through init_cfg."""
import os
import subprocess
import sys

import pytest
import torch

import softfree_mm  # noqa: F401
from softfree_mm.models.backbones import SoftFreePVTv2, SoftFreeXCiT
from softfree_mm.models.converters import get_converter, list_converters, unwrap_state_dict

import convert_checkpoint  # tools/convert_checkpoint.py (tests/conftest.py puts tools/ on sys.path)

from tests.helpers import ROOT

TOOL = os.path.join(ROOT, 'tools', 'convert_checkpoint.py')


def test_every_family_has_a_converter():
    assert list_converters() == ['agent_cswin', 'agent_pvt', 'agent_swin', 'cswin', 'inline_cswin', 'inline_pvt',
                                 'inline_swin', 'pvt', 'pvt_v2', 'soft', 'swin', 'xcit']
    for fam in list_converters():
        assert callable(get_converter(fam))


@pytest.mark.parametrize('wrapper', ['model', 'state_dict', 'state_dict_ema', None])
def test_unwrap_finds_weights_in_every_release_wrapper(wrapper):
    sd = {'a.weight': torch.ones(2), 'b': torch.zeros(1)}
    obj = sd if wrapper is None else {wrapper: sd, 'epoch': 3}
    assert unwrap_state_dict(obj).keys() == sd.keys()


def test_unwrap_strips_ddp_prefix_and_refuses_non_checkpoints():
    assert list(unwrap_state_dict({'module.x': torch.ones(1)})) == ['x']
    with pytest.raises(ValueError, match='no state dict'):
        unwrap_state_dict({'epoch': 3})


def test_cli_converts_a_timm_xcit_release_that_init_cfg_then_loads_exactly(tmp_path):
    timm = pytest.importorskip('timm')
    torch.manual_seed(0)
    ref = timm.create_model('xcit_tiny_12_p16_224', pretrained=False, embed_dim=32, num_heads=4)
    src, dst = tmp_path / 'release.pth', tmp_path / 'ours.pth'
    torch.save({'model': ref.state_dict(), 'epoch': 400}, src)
    res = subprocess.run([sys.executable, TOOL, 'xcit', str(src), str(dst)], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert 'xcit:' in res.stdout and dst.exists()
    ours = SoftFreeXCiT(arch='t12', embed_dims=32, num_heads=4, out_type='cls_token', norm_cfg=dict(type='BN'))
    ours.load_state_dict(torch.load(dst)['state_dict'], strict=True)
    for name, p in ref.state_dict().items():
        if name.startswith('blocks.0.attn.qkv'):
            torch.testing.assert_close(ours.state_dict()[name], p)


def test_cli_pvt_v2_round_trip_in_process(tmp_path, capsys):
    timm = pytest.importorskip('timm')
    ref = timm.create_model('pvt_v2_b0', pretrained=False)
    src, dst = tmp_path / 'b0.pth', tmp_path / 'b0_ours.pth'
    torch.save(ref.state_dict(), src)
    assert convert_checkpoint.main(['pvt_v2', str(src), str(dst)]) == 0
    # the report says which preset the file is, read from its tensors
    assert capsys.readouterr().out.splitlines()[1] == (
        "pvt_v2: SoftFreePVTv2(arch='b0'): the file holds depths (2, 2, 2, 2), widths (32, 64, 160, 256), heads "
        '(?, ?, ?, ?), MLP ratios (8, 8, 4, 4), spatial reduction (8, 4, 2, 1)')
    ours = SoftFreePVTv2(arch='b0')
    missing, unexpected = ours.load_state_dict(torch.load(dst)['state_dict'], strict=False)
    assert not missing, missing
    assert all(k.startswith('head') or k.startswith('norm.') for k in unexpected), unexpected


def test_cli_errors_name_the_bad_value(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        convert_checkpoint.main(['vit', str(tmp_path / 'a'), str(tmp_path / 'b')])
    assert e.value.code == 2
    assert "unknown family 'vit'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        convert_checkpoint.main(['swin', str(tmp_path / 'missing.pth'), str(tmp_path / 'b')])
    assert 'no such checkpoint' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        convert_checkpoint.main(['swin', str(tmp_path / 'missing.pth')])
    assert 'DST is required (or --print-arch' in capsys.readouterr().err


def test_unwrap_takes_the_backbone_of_a_whole_detector_checkpoint():
    det = {'state_dict': {'backbone.patch_embed.proj.weight': torch.ones(2), 'backbone.norm0.bias': torch.zeros(2),
                          'neck.lateral_convs.0.conv.weight': torch.ones(3), 'roi_head.bbox_head.fc_cls.bias':
                          torch.ones(4)}, 'meta': {}}
    assert list(unwrap_state_dict(det)) == ['patch_embed.proj.weight', 'norm0.bias']
    assert len(unwrap_state_dict(det, backbone_only=False)) == 4


def _small_timm_swin():
    timm = pytest.importorskip('timm')
    torch.manual_seed(0)
    return timm.create_model('swin_tiny_patch4_window7_224', pretrained=False, embed_dim=16, depths=(1, 1, 2, 1),
                             num_heads=(1, 2, 2, 4))


def test_cli_converts_a_detector_release_to_a_backbone_that_loads(tmp_path):
    ref = _small_timm_swin()
    sd = {f'backbone.{k}': v for k, v in ref.state_dict().items()}
    sd.update({'neck.fpn_convs.0.conv.weight': torch.ones(8, 8, 3, 3), 'rpn_head.rpn_cls.bias': torch.ones(3)})
    src, dst = tmp_path / 'mask_rcnn_swin.pth', tmp_path / 'ours.pth'
    torch.save({'state_dict': sd, 'meta': {'epoch': 36}}, src)
    assert convert_checkpoint.main(['swin', str(src), str(dst)]) == 0
    from softfree_mm.models.backbones import SoftFreeSwin
    ours = SoftFreeSwin(arch=dict(embed_dims=16, depths=(1, 1, 2, 1), num_heads=(1, 2, 2, 4)))
    converted = torch.load(dst)['state_dict']
    assert not any(k.startswith(('neck.', 'rpn_head.', 'backbone.')) for k in converted)
    missing, unexpected = ours.load_state_dict(converted, strict=False)
    # a classification-trained backbone has no per-output norms for strides 4-16 (a detection release has them)
    assert not [k for k in missing if 'relative_position_index' not in k and not k.startswith(('norm0.', 'norm1.',
                                                                                              'norm2.'))], missing
    assert all(k.startswith('head') for k in unexpected), unexpected
    torch.testing.assert_close(ours.state_dict()['stages.2.blocks.1.attn.qkv.weight'],
                               ref.state_dict()['layers.2.blocks.1.attn.qkv.weight'])


def test_cli_refuses_a_checkpoint_of_another_family(tmp_path, capsys):
    ref = _small_timm_swin()
    src = tmp_path / 'swin.pth'
    torch.save({'model': ref.state_dict()}, src)
    for family in ('xcit', 'cswin'):
        with pytest.raises(SystemExit) as e:
            convert_checkpoint.main([family, str(src), str(tmp_path / 'out.pth')])
        assert e.value.code == 2
        assert f'does not look like a {family} checkpoint' in capsys.readouterr().err
    assert not (tmp_path / 'out.pth').exists()
