#!/usr/bin/env python
"""Convert an official release or timm checkpoint to softfree_mm's backbone layout.

    python tools/convert_checkpoint.py FAMILY SRC DST [--ema]
    python tools/convert_checkpoint.py FAMILY SRC --print-arch
    python tools/convert_checkpoint.py FAMILY SRC DST --whole

FAMILY: auto | xcit | pvt | pvt_v2 | swin | cswin | soft | inline_swin | inline_pvt | inline_cswin | agent_swin |
agent_pvt | agent_cswin; ``auto`` detects
the family from the key names. ``--ema`` takes the EMA weights when the file has them (always for SOFT releases,
whose official evaluation uses them). SRC may wrap its weights in 'model', 'state_dict', 'state_dict_ema'
or be bare (the official releases' other entries, such as the training arguments or config, are read as plain
data, never executed); a whole detector or segmentor checkpoint gives its 'backbone.*' weights. DST is a plain
``{'state_dict': ...}`` file that ``init_cfg=dict(type='Pretrained', checkpoint=DST)`` loads. The tool prints how
many keys it placed, which preset the file is (the depths, widths and heads read from its tensors, and the
arguments that build a model it fits when no preset does) and names any key the family's backbones do not have; a
file of another family is refused. ``--print-arch`` prints only which preset the file is (DST is then optional).
``--whole`` converts a whole official detector or segmentor (mmdet 2.x / mmseg 0.x) into our mmdet 3 / mmseg 1
model's state dict, the backbone's keys through FAMILY's converter and the rest as they are: DST is then what
``load_from=DST`` loads to evaluate the release.
"""
import argparse
import os
import sys

import tool_warnings  # noqa: F401  (tools/tool_warnings.py: before the OpenMMLab stack is imported)

import torch


def main(argv=None):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from softfree_mm.models.converters import (arch_report, checkpoint_class, convert_whole_model, detect_family,
                                               family_match,
                                               get_converter, list_converters, read_checkpoint, unplaced_keys,
                                               unwrap_state_dict)

    families = ['auto'] + list_converters()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('family', help=f'one of {", ".join(families)}')
    parser.add_argument('src', help='official or timm checkpoint')
    parser.add_argument('dst', nargs='?', help='output file (optional with --print-arch)')
    parser.add_argument('--ema', action='store_true', help='take the EMA weights when the file has them')
    parser.add_argument('--print-arch', action='store_true',
                        help='print which preset the file is (or the arguments that fit it) and write nothing '
                             'unless DST is given')
    parser.add_argument('--whole', action='store_true',
                        help='SRC is a whole detector / segmentor (mmdet 2.x, mmseg 0.x): write the whole model for '
                             'load_from, its backbone converted')
    args = parser.parse_args(argv)
    if args.dst is None and not args.print_arch:
        parser.error('DST is required (or --print-arch to only print which preset the file is)')
    if args.family not in families:
        parser.error(f'unknown family {args.family!r}; valid: {", ".join(families)}')
    if not os.path.isfile(args.src):
        parser.error(f'no such checkpoint: {args.src}')
    try:  # a release file from elsewhere: weights only (torch's safe unpickler)
        raw = read_checkpoint(args.src)
    except Exception as e:  # noqa: BLE001  (report, don't trace)
        parser.error(f'{args.src} is not a weights-only torch checkpoint: {str(e).splitlines()[0]}')
    try:
        sd = unwrap_state_dict(raw, prefer_ema=args.ema)
    except ValueError as e:
        parser.error(f'{args.src}: {e}')
    if args.whole:
        if args.dst is None or args.print_arch:
            parser.error('--whole writes DST (a whole model for load_from); --print-arch reads a backbone file')
        family = detect_family(sd)[0] if args.family == 'auto' else args.family
        try:
            whole = convert_whole_model(raw, family)
        except ValueError as e:
            parser.error(f'{args.src}: {e}')
        unplaced = unplaced_keys(family, {k[len('backbone.'):]: v for k, v in whole.items()
                                          if k.startswith('backbone.')})
        os.makedirs(os.path.dirname(os.path.abspath(args.dst)), exist_ok=True)
        padding = checkpoint_class(family).family.downstream_padding.get(family, {})
        torch.save({'state_dict': whole, 'meta': {'converted_from': os.path.basename(args.src), 'family': family,
                                                  'whole': True, 'backbone_padding': padding}}, args.dst)
        print(f'{family} (whole model): {len(whole)} keys -> {args.dst}')
        if padding:
            rule = ', '.join(f'{k}={v!r}' for k, v in padding.items())
            print(f'{family}: its detectors / segmentors were trained with the padding rule {rule}: build the '
                  f'backbone with it (model.backbone: {rule}; the Agent downstream presets carry it), or it computes '
                  'another function at sizes that pad')
        if unplaced:
            print(f'{family}: {len(unplaced)} backbone key(s) no {family} backbone has: {unplaced}', file=sys.stderr)
        return 0
    if args.family == 'auto':
        family, out = detect_family(sd)
    else:
        family, out = args.family, get_converter(args.family)(sd)
    if checkpoint_class(family)._prefer_ema and not args.ema:  # releases evaluated with their EMA weights (SOFT)
        sd = unwrap_state_dict(raw, prefer_ema=True)
        out = get_converter(family)(sd)
    share = family_match(family, out)
    if share < 0.6:
        what = 'any family' if args.family == 'auto' else f'a {family} checkpoint'
        parser.error(f'{args.src} does not look like {what}: after conversion only {share:.0%} of its {len(out)} '
                     f'keys are {family} names (e.g. {sorted(out)[:3]}); pick the family it was released for: '
                     f'{", ".join(list_converters())}')
    arch = arch_report(family, out)
    arch_line = f'{family}: ' + (arch or 'the file shows no block whose depths and widths could be read')
    if args.print_arch:
        print(arch_line)
        if args.dst is None:
            return 0
    unplaced = unplaced_keys(family, out)
    os.makedirs(os.path.dirname(os.path.abspath(args.dst)), exist_ok=True)
    torch.save({'state_dict': out, 'meta': {'converted_from': os.path.basename(args.src), 'family': family}},
               args.dst)
    placed = f'{len(out) - len(unplaced)} placed'
    print(f'{family}: {len(sd)} keys in, {len(out)} keys out, {placed} -> {args.dst}')
    if not args.print_arch:
        print(arch_line)
    if unplaced:
        print(f'{family}: {len(unplaced)} key(s) no {family} backbone has: {unplaced}', file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
