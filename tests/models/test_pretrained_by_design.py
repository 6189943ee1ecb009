"""Start checkpoints whose keys differ from the model by design (a classifier's XCiT into the detector's feature
maps): one note naming what was left out, no warning; any other difference still warns with the exact keys."""
import logging

import pytest
import torch

import softfree_mm  # noqa: F401  (registers the backbones)
from softfree_mm.models.backbones.xcit import SoftFreeXCiT
from softfree_mm.models.backbones.xcit_convert import convert_xcit
from softfree_mm.models.converters import load_pretrained

SMALL = dict(arch='t12', embed_dims=32, num_heads=4, depth=4, out_indices=(0, 1, 2, 3),
             norm_cfg=dict(type='BN'))


def _save(model, path):
    torch.save(dict(state_dict=model.state_dict()), path)
    return str(path)


def _records(caplog, level):
    return [r.getMessage() for r in caplog.records if r.levelno == level and r.name == 'by_design']


def test_a_classifiers_checkpoint_into_feature_maps_is_one_note_and_every_block_loads(tmp_path, caplog):
    torch.manual_seed(0)
    cls = SoftFreeXCiT(out_type='cls_token', **SMALL)
    ckpt = _save(cls, tmp_path / 'cls.pth')
    dense = SoftFreeXCiT(**SMALL)
    with caplog.at_level(logging.INFO, logger='by_design'):
        missing, unexpected, _ = load_pretrained(dense, ckpt, convert_xcit, logger=logging.getLogger('by_design'))
    n_head = sum(1 for k in cls.state_dict() if k.startswith(('cls_attn_blocks.', 'cls_token', 'norm.')))
    n_adapter = sum(1 for k in dense.state_dict() if k.startswith(('fpn1.', 'fpn2.', 'fpn3.', 'fpn4.'))
                    and not k.endswith('num_batches_tracked'))  # BatchNorm's counter is not reported
    assert set(unexpected) == {k for k in cls.state_dict() if k not in dense.state_dict()} and len(unexpected) == n_head
    assert {k.split('.')[0] for k in missing} <= {'fpn1', 'fpn2', 'fpn3', 'fpn4'} and len(missing) == n_adapter > 0
    assert _records(caplog, logging.WARNING) == []
    (note,) = _records(caplog, logging.INFO)
    assert f'as intended, {n_head} key(s) classification-only' in note
    assert f'{n_adapter} key(s) of the stride-fixing adapter, new to the feature maps' in note
    for k, v in dense.state_dict().items():  # every shared weight is the classifier's
        if k in cls.state_dict():
            assert torch.equal(v, cls.state_dict()[k]), k


def test_other_differences_still_warn_with_their_keys(tmp_path, caplog):
    """A feature-map checkpoint into a classifier leaves the class-attention blocks unloaded: that is no design and
    stays a warning naming them (only the adapter keys are a note)."""
    dense = SoftFreeXCiT(**SMALL)
    ckpt = _save(dense, tmp_path / 'dense.pth')
    cls = SoftFreeXCiT(out_type='cls_token', **SMALL)
    with caplog.at_level(logging.INFO, logger='by_design'):
        load_pretrained(cls, ckpt, convert_xcit, logger=logging.getLogger('by_design'))
    (warning,) = _records(caplog, logging.WARNING)
    assert 'missing in the checkpoint' in warning and "'cls_attn_blocks.0." in warning and "'fpn" not in warning
    (note,) = _records(caplog, logging.INFO)
    assert 'of the stride-fixing adapter, not used by the class token' in note


@pytest.mark.parametrize('extra', ['blocks.0.surplus', 'fpn9.weight'])
def test_a_key_outside_the_design_is_not_hidden(tmp_path, caplog, extra):
    dense = SoftFreeXCiT(**SMALL)
    sd = dict(dense.state_dict())
    sd[extra] = torch.zeros(1)
    path = tmp_path / 'extra.pth'
    torch.save(dict(state_dict=sd), path)
    with caplog.at_level(logging.INFO, logger='by_design'):
        load_pretrained(dense, str(path), convert_xcit, logger=logging.getLogger('by_design'))
    (warning,) = _records(caplog, logging.WARNING)
    assert 'unexpected (not placed)' in warning and repr(extra) in warning
