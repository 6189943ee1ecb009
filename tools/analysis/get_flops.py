"""FLOPs and parameters of a detector, segmentor or classifier config, attention included.

    python tools/analysis/get_flops.py configs/maskrcnn_swin_t_poly3.py [CONFIG ...] [--shape H W]
        [--cfg-options K=V ...] [--csv PATH]

The OpenMMLab tool's output (one multiply-add = one flop, as OpenMMLab's and the papers' tables count), for one
random image of H x W (default: mmdet 1280 x 800, mmseg 2048 x 1024, mmpretrain 224 x 224; one value for a square)
through the model's tensor forward (``mode='tensor'``: backbone, neck and heads, no post-processing). mmengine's
counter counts the network; each attention kernel adds its own declared cost (softfree_mm/analysis/flops.py),
which mmengine's counter cannot see (SDPA counts 0 there, so every attention variant would look the same).
Several configs: one summary each, at the same --shape. --csv PATH writes one row per config (the columns of
CSV_COLUMNS). A missing config, an unknown kernel or a bad shape: one line on stderr, exit status 2.
"""
import argparse
import os
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))  # the repository

DEFAULT_SHAPE = {'mmdet': (1280, 800), 'mmseg': (2048, 1024), 'mmpretrain': (224, 224)}
CSV_COLUMNS = ('config', 'shape', 'params_M', 'GFLOPs', 'attention_GFLOPs', 'rest_GFLOPs', 'counter')


def parse_args(argv=None):
    from mmengine.config import DictAction

    p = argparse.ArgumentParser(description='FLOPs (attention included) and parameters of a config\'s model')
    p.add_argument('config', nargs='+', help='config file path(s)')
    p.add_argument('--shape', type=int, nargs='+', default=None, help='input image size: H W, or one value')
    p.add_argument('--cfg-options', nargs='+', action=DictAction,
                   help='override config settings, e.g. model.backbone.attn_cfg=linear')
    p.add_argument('--csv', default=None, help='write one row per config to this CSV file')
    return p.parse_args(argv)


def tensor_forward(model, scope, h, w):
    """The model's ``mode='tensor'`` forward as a module of one argument (what the counters call). mmdet's
    two-stage heads read image shapes from data samples even there: they get one per image, as mmdet's own
    get_flops hands them from its data loader."""
    import torch

    samples = None
    if scope == 'mmdet':
        from mmdet.structures import DetDataSample

        meta = dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w), batch_input_shape=(h, w),
                    scale_factor=(1.0, 1.0))
        samples = [DetDataSample(metainfo=meta)]

    class TensorForward(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x, samples, mode='tensor')

    return TensorForward(model)


def main(argv=None):
    args = parse_args(argv)
    if args.shape is not None and (len(args.shape) not in (1, 2) or min(args.shape) < 32):
        print(f'error: --shape must be H W or one size, each >= 32, got {args.shape}', file=sys.stderr)
        return 2
    rows = []
    for config in args.config:
        row = count_config(config, args.shape, args.cfg_options)
        if row is None:
            return 2
        rows.append(row)
    if args.csv:
        import csv

        with open(args.csv, 'w', newline='') as f:
            w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
            w.writeheader()
            w.writerows(rows)
        print(f'csv: {args.csv}')
    return 0


def count_config(config, shape, cfg_options):
    """Print the OpenMMLab summary of one config's model; return its CSV row (None after a one-line error)."""
    from softfree_mm.engine import config_checks as checks
    from softfree_mm.engine.device import apply_device_settings
    from softfree_mm.engine.errors import UsageError, short_error

    try:
        cfg = checks.load_config(config, cfg_options)
        checks.check_attention(cfg)
        checks.check_model_types(cfg)
        apply_device_settings(cfg, 'none')
    except UsageError as e:
        print(f'error: {e}', file=sys.stderr)
        return None
    import torch
    from mmengine.registry import MODELS

    import softfree_mm  # noqa: F401  (registers the backbones)
    from softfree_mm.analysis.flops import count_flops

    scope = cfg.default_scope
    shape = tuple(shape) if shape else DEFAULT_SHAPE[scope]
    h, w = (shape[0], shape[0]) if len(shape) == 1 else shape
    try:
        with MODELS.switch_scope_and_registry(scope) as registry:
            model = registry.build(cfg.model)
    except (KeyError, ValueError, TypeError) as e:
        print(f'error: {config}: {short_error(e)}', file=sys.stderr)
        return None
    model.eval()
    res = count_flops(tensor_forward(model, scope, h, w), inputs=(torch.randn(1, 3, h, w),))
    params = sum(p.numel() for p in model.parameters())
    split = ', '.join(f'{k}: {v / 1e9:.3f}' for k, v in (('attention', res['attention']), ('rest', res['rest'])))
    line = '=' * 30
    print(f'{line}\nConfig: {config}\nCompute type: random input, mode="tensor"\nInput shape: {(h, w)}\n'
          f'Flops: {res["total"] / 1e9:.3f} GFLOPs ({split}; rest counted by {res["counter"]})\n'
          f'Params: {params / 1e6:.3f} M\n{line}')
    return dict(config=osp.splitext(osp.basename(config))[0], shape=f'{h}x{w}', params_M=f'{params / 1e6:.3f}',
                GFLOPs=f'{res["total"] / 1e9:.3f}', attention_GFLOPs=f'{res["attention"] / 1e9:.3f}',
                rest_GFLOPs=f'{res["rest"] / 1e9:.3f}', counter=res['counter'])


if __name__ == '__main__':
    sys.exit(main())
