"""tools/convert_checkpoint.py: release/timm layouts in, our layout out, loadable through init_cfg."""
import os
import subprocess
import sys

import pytest
import torch

import softfree_mm  # noqa: F401
from softfree_mm.models.backbones import SoftFreePVTv2, SoftFreeXCiT
from softfree_mm.models.converters import get_converter, list_converters, unwrap_state_dict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, 'tools', 'convert_checkpoint.py')
sys.path.insert(0, os.path.join(ROOT, 'tools'))
import convert_checkpoint  # noqa: E402


def test_every_family_has_a_converter():
    assert list_converters() == ['cswin', 'pvt', 'pvt_v2', 'swin', 'xcit']
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


def test_cli_pvt_v2_round_trip_in_process(tmp_path):
    timm = pytest.importorskip('timm')
    ref = timm.create_model('pvt_v2_b0', pretrained=False)
    src, dst = tmp_path / 'b0.pth', tmp_path / 'b0_ours.pth'
    torch.save(ref.state_dict(), src)
    assert convert_checkpoint.main(['pvt_v2', str(src), str(dst)]) == 0
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
