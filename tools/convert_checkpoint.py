#!/usr/bin/env python
"""Convert an official release or timm checkpoint to softfree_mm's backbone layout.

    python tools/convert_checkpoint.py {xcit|pvt|pvt_v2|swin|cswin} SRC DST [--ema]

SRC may wrap its weights in 'model', 'state_dict', 'state_dict_ema' or be bare; a whole detector or segmentor
checkpoint gives its 'backbone.*' weights. DST is a plain ``{'state_dict': ...}`` file that
``init_cfg=dict(type='Pretrained', checkpoint=DST)`` loads. A file of another family is refused.
"""
import argparse
import os
import sys

import torch


def main(argv=None):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from softfree_mm.models.converters import family_match, get_converter, list_converters, unwrap_state_dict

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('family', help=f'one of {", ".join(list_converters())}')
    parser.add_argument('src', help='official or timm checkpoint')
    parser.add_argument('dst', help='output file')
    parser.add_argument('--ema', action='store_true', help='take the EMA weights when the file has them')
    args = parser.parse_args(argv)
    if args.family not in list_converters():
        parser.error(f'unknown family {args.family!r}; valid: {", ".join(list_converters())}')
    if not os.path.isfile(args.src):
        parser.error(f'no such checkpoint: {args.src}')
    # a release file from elsewhere: weights only (torch's safe unpickler)
    try:
        raw = torch.load(args.src, map_location='cpu', weights_only=True)
    except Exception as e:  # noqa: BLE001  (report, don't trace)
        parser.error(f'{args.src} is not a weights-only torch checkpoint: {str(e).splitlines()[0]}')
    sd = unwrap_state_dict(raw, prefer_ema=args.ema)
    out = get_converter(args.family)(sd)
    share = family_match(args.family, out)
    if share < 0.6:
        parser.error(f'{args.src} does not look like a {args.family} checkpoint: after conversion only '
                     f'{share:.0%} of its {len(out)} keys are {args.family} names (e.g. {sorted(out)[:3]}); '
                     f'pick the family it was released for: {", ".join(list_converters())}')
    os.makedirs(os.path.dirname(os.path.abspath(args.dst)), exist_ok=True)
    torch.save({'state_dict': out, 'meta': {'converted_from': os.path.basename(args.src),
                                            'family': args.family}}, args.dst)
    print(f'{args.family}: {len(sd)} keys in, {len(out)} keys out -> {args.dst}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
