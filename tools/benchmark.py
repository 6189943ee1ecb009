#!/usr/bin/env python
"""Speed, memory and FLOPs of attention kernels and backbones; every ratio measured in one run, alternating.

    python tools/benchmark.py kernels --tokens 1024 4096 16384 --kernels softmax poly relu sigmoid [--backward]
        [--heads 1] [--head-dim 64] [--batch 1] [--dtype fp32|bf16|fp16] [--repeats 3] [--plot PATH] [--csv PATH]
    python tools/benchmark.py backbone --backbones swin_t pvt_v2_b2 --kernels softmax poly linear
        --sizes 224x224 512x768 [--batch 1] [--dtype fp32] [--no-flops] [--csv PATH]
    python tools/benchmark.py compare --backbones swin_t pvt_v2_b2 xcit_s12 --size 512x768 [--repeats 11]
    python tools/benchmark.py flops --backbones swin_t pvt_v2_b2 xcit_s12 cswin_t --kernels softmax poly
        --sizes 224x224 800x1216
    python tools/benchmark.py detector --detectors swin_t:softmax swin_t:mmdet ... [--size 800x1216] [--batch 2]
        [--dtype fp32|bf16] [--repeats 3]
    python tools/benchmark.py kernels --ceilings ...   (also the device's matrix rate and copy bandwidth)

kernels: one attention call per kernel and N (B x heads x N x head_dim): forward latency (no grad) and, with
  --backward, forward + backward; peak memory beyond the inputs (CPU: torch profiler's allocation record; CUDA:
  the allocator's peak), bytes saved for backward, GFLOP/s from each kernel's declared multiply-adds. ``matmul``
  is the plain (q @ k^T) @ v of the same size. Ratios to softmax (SDPA); log-log slopes over N and the N from
  which each kernel is faster than softmax. --sides S ... gives N = S^2 (the older form).
backbone: backbone x kernel x image size, each point in a fresh subprocess (forward, forward + backward,
  images/s, peak memory, parameters, GFLOPs at that size).
compare: our softmax backbones against mmdet's SwinTransformer / PyramidVisionTransformerV2 and timm's
  xcit_small_12_p16 with the same weights (outputs checked), alternating in one process; speed ratio = the
  median over repeats of reference time / ours within each repeat (>= 1: ours at least as fast), with the range
  of those per-repeat ratios; memory ratio = ours / reference (<= 1: no more).
flops: GFLOPs (attention included) and parameters of backbone x kernel x size, no timing.
detector: one Mask R-CNN training step (loss, backward, AdamW step) on 2 random images of 800x1216 with our
  backbones (swin_t / pvt_v2_b2 with softmax, poly3, inline) and with mmdet's own SwinTransformer /
  PyramidVisionTransformerV2 in the same detector (backbone:mmdet), each in a fresh subprocess: images/s, peak
  memory, and the ratios to mmdet's backbone and to our softmax one. Names: backbone:kernel, default all.
--ceilings (kernels): measures the device's dense matrix rate (n = 8192, the run's dtype) and copy bandwidth first,
  and reports each kernel's fraction of them (of_matrix_rate, of_copy_bandwidth). On CUDA, times are CUDA events.

Kernel specs: a name, or name:arg=value,... (poly:degree=1, soft:num_landmarks=64). Bad input: one line, exit 2.
CUDA is used when available (--device cpu to force the CPU); threads are torch's default (set OMP_NUM_THREADS).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tools/, also when this file is loaded by path
import tool_warnings  # noqa: E402,F401  (tools/tool_warnings.py: before the OpenMMLab stack is imported)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository

MODES = ('kernels', 'backbone', 'compare', 'flops', 'detector')


def parse_kernel(text):
    """'poly:degree=1,scale=0.1' -> dict(type='poly', degree=1, scale=0.1); a bare name stays a string."""
    name, _, rest = text.partition(':')
    cfg = dict(type=name)
    for item in filter(None, rest.split(',')):
        key, eq, val = item.partition('=')
        if not eq:
            raise ValueError(f'kernel spec {text!r}: expected name:arg=value,..., got {item!r}')
        for cast in (int, float):
            try:
                val = cast(val)
                break
            except ValueError:
                continue
        if val in ('True', 'False', 'None'):
            val = {'True': True, 'False': False, 'None': None}[val]
        cfg[key] = val
    return cfg if len(cfg) > 1 else name


def parse_size(text):
    parts = text.lower().split('x')
    try:
        h, w = (int(parts[0]), int(parts[0])) if len(parts) == 1 else (int(parts[0]), int(parts[1]))
    except ValueError:
        raise ValueError(f'image size must be HxW or one number, got {text!r}') from None
    if len(parts) > 2 or min(h, w) < 32:
        raise ValueError(f'image size must be HxW (each >= 32), got {text!r}')
    return h, w


def build_parser(default_device):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('mode', nargs='?', default='kernels', help=f'one of {", ".join(MODES)} (default kernels)')
    p.add_argument('--kernels', nargs='+', default=None)
    p.add_argument('--tokens', nargs='+', type=int, default=None, help='kernels: token counts N')
    p.add_argument('--sides', nargs='+', type=int, default=None, help='kernels: token grid sides (N = side^2)')
    p.add_argument('--heads', type=int, default=None)
    p.add_argument('--head-dim', type=int, default=None)
    p.add_argument('--batch', type=int, default=None, help='images / sequences (default 1; detector: 2)')
    p.add_argument('--backward', action='store_true', help='kernels: also forward + backward')
    p.add_argument('--no-memory', action='store_true', help='kernels: skip the memory measurements')
    p.add_argument('--backbones', nargs='+', default=None)
    p.add_argument('--sizes', nargs='+', default=None, help='backbone / flops: image sizes HxW')
    p.add_argument('--size', default=None, help='compare (default 512x768) / detector (default 800x1216): HxW')
    p.add_argument('--detectors', nargs='+', default=None, help='detector: backbone:kernel names (default all)')
    p.add_argument('--ceilings', action='store_true', help="kernels: measure the device's matrix rate and copy "
                                                           'bandwidth and report the fractions reached')
    p.add_argument('--no-flops', action='store_true', help='backbone: skip the FLOP count')
    p.add_argument('--dtype', default='fp32', help='fp32, bf16 or fp16 (backbones: autocast)')
    p.add_argument('--repeats', type=int, default=3)
    p.add_argument('--device', default=default_device)
    p.add_argument('--clock', default='wall', help='wall (default) or cpu: this process\'s CPU time, for a shared '
                                                   'machine with OMP_NUM_THREADS=1 (CPU device only)')
    p.add_argument('--plot', default=None, help='kernels: write latency and memory against N (log-log) here')
    p.add_argument('--csv', default=None, help='write every measured row to this CSV file')
    return p


def main(argv=None):
    import torch

    from softfree_mm.analysis import benchmark as bm
    from softfree_mm.attention import normalize_cfg

    parser = build_parser('cuda' if torch.cuda.is_available() else 'cpu')
    args = parser.parse_args(argv)

    def fail(msg):
        print(f'error: {msg}', file=sys.stderr)
        return 2

    if args.mode not in MODES:
        return fail(f'unknown mode {args.mode!r}; valid modes: {", ".join(MODES)}')
    if args.dtype not in ('fp32', 'bf16', 'fp16'):
        return fail(f'--dtype must be fp32, bf16 or fp16, got {args.dtype!r}')
    if args.device.startswith('cuda') and not torch.cuda.is_available():
        return fail(f'--device {args.device}: CUDA is not available on this machine')
    if args.clock not in bm.CLOCKS:
        return fail(f'--clock must be wall or cpu, got {args.clock!r}')
    if args.clock == 'cpu' and args.device != 'cpu':
        return fail('--clock cpu measures CPU time: use it with --device cpu')
    if args.repeats < 1:
        return fail(f'--repeats must be >= 1, got {args.repeats}')
    if args.batch is not None and args.batch < 1:
        return fail(f'--batch must be >= 1, got {args.batch}')
    args.batch = args.batch or (2 if args.mode == 'detector' else 1)
    try:
        kernels = [parse_kernel(k) for k in (args.kernels or [])]
        for k in kernels:
            if k != 'matmul':
                normalize_cfg(k)
        sizes = [parse_size(s) for s in (args.sizes or [])]
        for name in args.backbones or []:
            if name not in bm.backbone_presets():
                raise ValueError(f"unknown backbone {name!r}; valid: {', '.join(sorted(bm.backbone_presets()))}")
    except (KeyError, TypeError, ValueError) as e:
        return fail(e.args[0] if e.args else str(e))

    def show(rows, columns, title):
        print(f'{title}  (device={args.device}, threads={torch.get_num_threads()}, clock={args.clock})')
        print(bm.markdown(rows, columns))

    def progress(row):
        print('  ' + ', '.join(f'{k}={v:.4g}' if isinstance(v, float) else f'{k}={v}' for k, v in row.items()
                               if k not in ('device', 'threads', 'dtype', 'heads', 'head_dim', 'batch')
                               and not k.startswith('_')),
              file=sys.stderr, flush=True)

    if args.mode == 'kernels':
        if args.tokens and args.sides:
            return fail('give --tokens or --sides, not both')
        tokens = args.tokens or [s * s for s in (args.sides or [32, 64])]
        if min(tokens) < 1:
            return fail(f'token counts must be >= 1, got {tokens}')
        kernels = kernels or ['softmax', 'poly', 'relu', 'sigmoid', 'linear', 'taylor', 'inline']
        passes = ('fwd', 'fwdbwd') if args.backward else ('fwd',)
        ceilings = None
        if args.ceilings:
            ceilings = bm.device_ceilings(args.device, bm.DTYPES[args.dtype],
                                          **({} if args.device.startswith('cuda') else dict(n=512, copy_mib=64)))
            print('ceilings: ' + ', '.join(f'{k}={v:.4g}' if isinstance(v, float) else f'{k}={v}'
                                           for k, v in ceilings.items()))
        rows = bm.run_kernels(kernels, tokens, heads=args.heads or 1, head_dim=args.head_dim or 64,
                              batch=args.batch, dtype=bm.DTYPES[args.dtype], device=args.device,
                              repeats=args.repeats, passes=passes, memory=not args.no_memory, log=progress,
                              clock=args.clock, ceilings=ceilings)
        r0 = rows[0]
        show(rows, bm.KERNEL_COLUMNS, f"kernels: B={r0['batch']} heads={r0['heads']} head_dim={r0['head_dim']} "
                                      f"{r0['dtype']}")
        if len(tokens) > 1:
            print()
            show(bm.scaling(rows), ('kernel', 'pass', 'N_min', 'N_max', 'time_slope', 'memory_slope',
                                    'faster_than_softmax_from_N'), 'log-log slopes over N')
        if args.plot:
            bm.plot(rows, args.plot)
            print(f'plot: {args.plot}')
    elif args.mode in ('backbone', 'flops'):
        backbones = args.backbones or ['swin_t', 'pvt_v2_b2', 'xcit_s12']
        kernels = kernels or ['softmax']
        sizes = sizes or [(224, 224)]
        if args.mode == 'flops':
            rows = bm.flops_table(backbones, kernels, sizes, log=progress)
            show(rows, ('backbone', 'kernel', 'setup', 'size', 'GFLOPs', 'attention_GFLOPs', 'params_M',
                        'counter'), 'flops (multiply-adds, attention included)')
        else:
            rows = bm.run_backbones(backbones, kernels, sizes, batch=args.batch, dtype=args.dtype,
                                    device=args.device, repeats=args.repeats, flops=not args.no_flops, log=progress,
                                    clock=args.clock)
            show(rows, bm.BACKBONE_COLUMNS, f'backbones: batch={args.batch} {args.dtype}, one subprocess a point')
    elif args.mode == 'detector':
        names = args.detectors or list(bm.DETECTORS)
        bad = [n for n in names if n not in bm.DETECTORS]
        if bad:
            return fail(f'detector: unknown detector(s) {bad}; valid: {", ".join(bm.DETECTORS)}')
        try:
            size = parse_size(args.size or 'x'.join(map(str, bm.DETECTOR_SIZE)))
        except ValueError as e:
            return fail(str(e))
        if size[0] % 32 or size[1] % 32:
            return fail(f'detector: --size must be a multiple of 32 each way (the FPN strides), got {args.size}')
        rows = bm.run_detectors(names, size=size, batch=args.batch, dtype=args.dtype,
                                device=args.device, repeats=args.repeats, log=progress)
        show(rows, bm.DETECTOR_COLUMNS, f'Mask R-CNN training step, batch {args.batch}, {args.dtype}, one '
                                        'subprocess a detector')
    else:
        backbones = args.backbones or ['swin_t', 'pvt_v2_b2', 'xcit_s12']
        bad = [b for b in backbones if b not in bm.REFERENCES]
        if bad:
            return fail(f'compare: no reference for {bad}; valid: {", ".join(bm.REFERENCES)}')
        try:
            size = parse_size(args.size or '512x768')
        except ValueError as e:
            return fail(str(e))
        rows = bm.compare(backbones, size=size, batch=args.batch, repeats=args.repeats, device=args.device,
                          log=progress, clock=args.clock)
        show(rows, bm.COMPARE_COLUMNS, f'ours vs reference, softmax, same weights, batch={args.batch}')
    if args.csv:
        bm.write_csv(rows, args.csv)
        print(f'csv: {args.csv}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
