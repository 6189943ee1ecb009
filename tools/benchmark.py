#!/usr/bin/env python
"""Speed, memory and FLOPs of attention kernels and backbones; every ratio measured in one run, alternating.

    python tools/benchmark.py kernels --tokens 1024 4096 16384 --kernels softmax poly relu sigmoid [--backward]
        [--heads 1] [--head-dim 64] [--batch 1] [--dtype fp32|bf16|fp16] [--repeats 3] [--plot PATH] [--csv PATH]
    python tools/benchmark.py backbone --backbones swin_t pvt_v2_b2 --kernels softmax poly linear
        --sizes 224x224 512x768 [--batch 1] [--dtype fp32] [--no-flops] [--csv PATH]
    python tools/benchmark.py backbone --layouts xcit_s12 pvt_v2_b2 pvt_v2_b2_nosr swin_t cswin_t
        [--kernels softmax poly3 linear inline soft] [--short-sides 512 800 1024] [--large-side 1600]
        [--seg-size 512x2048] [--time-limit 600] [--mem-limit 16] [--no-models] --csv PATH [--plot PATH]
        [--docs docs/benchmarks.md]
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
  images/s, peak memory, parameters, GFLOPs at that size). With --layouts, what each kernel costs as images grow
  (softfree_mm/analysis/benchmark/cost.py): the backbones in the layouts their Mask R-CNN configs use (the kernel's
  own config, else softmax's with the kernel in place; a kernel the layout does not take is a row with its fit
  error), inference at short sides --short-sides of 1333:800 images (then --large-side where the largest ran within
  the limits), at 512x2048, forward + backward at the smallest; whole Mask R-CNN and Semantic FPN (Swin-T, softmax
  and linear) at the same sizes (--no-models: none). Each case in a fresh process killed over --time-limit seconds
  or --mem-limit GiB of resident memory (a row saying so; memory: the process's resident set, read every 20 ms); the
  --csv file is appended as each case ends and a case already there is not measured again (the same command resumes
  a stopped sweep); the table (with the crossover with softmax and the largest size) goes to stdout, the plot to
  --plot, both into --docs between its markers.
compare: our softmax backbones against mmdet's SwinTransformer / PyramidVisionTransformerV2 and timm's
  xcit_small_12_p16 with the same weights (outputs checked), alternating in one process; speed ratio = the
  median over repeats of reference time / ours within each repeat (>= 1: ours at least as fast), with the range
  of those per-repeat ratios; memory ratio = ours / reference (<= 1: no more).
flops: GFLOPs (attention included) and parameters of backbone x kernel x size, no timing.
detector: one Mask R-CNN training step (loss, backward, AdamW step) on 2 random images of 800x1216 with our
  backbones (swin_t / pvt_v2_b2 with softmax, poly3, inline) and with mmdet's own SwinTransformer /
  PyramidVisionTransformerV2 in the same detector (backbone:mmdet), each in a fresh subprocess: images/s, peak
  memory, and the ratios to mmdet's backbone and to our softmax one (of the same layout). Names: backbone:kernel
  (any configs/maskrcnn_<backbone>_<kernel>.py, or backbone:mmdet), optionally +nosr (PVTv2 without spatial
  reduction) or +explicit / +factorised (the association order forced, as before the rule chose it); default the
  Swin-T and PVTv2-b2 rows. --profile DIR: one more step each under torch.profiler, its top operators in DIR.
--ceilings (kernels): measures the device's dense matrix rate (n = 8192, the run's dtype) and copy bandwidth first,
  and reports each kernel's fraction of them (of_matrix_rate, of_copy_bandwidth). On CUDA, times are CUDA events.

Kernel specs: a name, or name:arg=value,... (poly:degree=1, soft:num_landmarks=64); in kernels mode also peer:fbi_la
(fla-org's flash bidirectional linear attention, where installed; else its rows are skipped, said on stderr). Each
kernels row names the path the call took (fused linear / fused pointwise / the kernel's quadratic path or order).
Bad input: one line, exit 2.
CUDA is used when available (--device cpu to force the CPU); threads are torch's default (set OMP_NUM_THREADS).
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tools/, also when this file is loaded by path
import tool_warnings  # noqa: E402,F401  (tools/tool_warnings.py: before the OpenMMLab stack is imported)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
from benchmark_options import (at_least, backbone_name, clock_name, dtype_name, kernel_or_layout_kernel,  # noqa: E402
                               kernel_spec, parse_size, positive, refusing)

MODES = ('kernels', 'backbone', 'compare', 'flops', 'detector')
DEFAULT_KERNELS = ('softmax', 'poly', 'relu', 'sigmoid', 'linear', 'taylor', 'inline')
DEFAULT_BACKBONES = ('swin_t', 'pvt_v2_b2', 'xcit_s12')


class BadArgs(Exception):
    """A refused option: one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message):
        # argparse's 'argument --dtype: must be ...' reads as '--dtype must be ...'
        raise BadArgs(re.sub(r'^argument ([^:]+): ', r'\1 ', message))


# ---------------------------------------------------------------------------------------------- parser
def build_parser(default_device):
    common = argparse.ArgumentParser(add_help=False)  # what every mode takes
    common.add_argument('--batch', type=refusing(at_least(1)), default=None,
                        help='images / sequences (default 1; detector: 2)')
    common.add_argument('--dtype', type=refusing(dtype_name), default='fp32',
                        help='fp32, bf16 or fp16 (backbones: autocast)')
    common.add_argument('--repeats', type=refusing(at_least(1)), default=3)
    common.add_argument('--device', default=default_device)
    common.add_argument('--clock', type=refusing(clock_name), default='wall',
                        help="wall (default) or cpu: this process's CPU time, for a shared machine with "
                             'OMP_NUM_THREADS=1 (CPU device only)')
    common.add_argument('--csv', default=None, help='write every measured row to this CSV file')
    kernel = refusing(kernel_spec)
    backbone = refusing(backbone_name)
    size = refusing(parse_size)

    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = p.add_subparsers(dest='mode', metavar='MODE', parser_class=Parser)
    k = modes.add_parser('kernels', parents=[common], help='one attention call per kernel and token count')
    k.add_argument('--kernels', nargs='+', type=refusing(lambda t: kernel_spec(t, plain_products=True)), default=None)
    k.add_argument('--tokens', nargs='+', type=refusing(at_least(1)), default=None, help='token counts N')
    k.add_argument('--sides', nargs='+', type=refusing(at_least(1)), default=None,
                   help='token grid sides (N = side^2)')
    k.add_argument('--heads', type=int, default=1)
    k.add_argument('--head-dim', type=int, default=64)
    k.add_argument('--backward', action='store_true', help='also forward + backward')
    k.add_argument('--no-memory', action='store_true', help='skip the memory measurements')
    k.add_argument('--ceilings', action='store_true', help="measure the device's matrix rate and copy bandwidth and "
                                                           'report the fractions reached')
    k.add_argument('--plot', default=None, help='write latency and memory against N (log-log) here')
    k.set_defaults(handler=run_kernels)
    for name, handler, what in (('backbone', run_backbone, 'backbone x kernel x image size, a process a point'),
                                ('flops', run_flops, 'GFLOPs and parameters of backbone x kernel x size')):
        b = modes.add_parser(name, parents=[common], help=what)
        b.add_argument('--backbones', nargs='+', type=backbone, default=None)
        b.add_argument('--kernels', nargs='+', type=refusing(kernel_or_layout_kernel) if name == 'backbone'
                       else kernel, default=None)
        b.add_argument('--sizes', nargs='+', type=size, default=None, help='image sizes HxW')
        if name == 'backbone':
            b.add_argument('--no-flops', action='store_true', help='skip the FLOP count')
            b.add_argument('--layouts', nargs='+', default=None, help='the cost sweep: det/seg layouts')
            b.add_argument('--short-sides', nargs='+', type=refusing(at_least(32)), default=None)
            b.add_argument('--large-side', type=refusing(at_least(0)), default=None,
                           help='measured where the largest short side ran within the limits (0: none)')
            b.add_argument('--seg-size', type=refusing(lambda t: None if t == '0' else parse_size(t)),
                           default=(512, 2048), help='the segmentation size (0: none; default 512x2048)')
            b.add_argument('--time-limit', type=refusing(positive), default=600.0, help='seconds a case')
            b.add_argument('--mem-limit', type=refusing(positive), default=16.0, help='GiB resident a case')
            b.add_argument('--no-models', action='store_true', help='no whole-model points')
            b.add_argument('--plot', default=None, help='the cost plot (PNG)')
            b.add_argument('--docs', default=None, help='write the table and plot into this page\'s section')
            b.add_argument('--readme', default=None, help='with --docs: write the headline into this page too')
        b.set_defaults(handler=handler)
    c = modes.add_parser('compare', parents=[common], help='our softmax backbones against the references')
    c.add_argument('--backbones', nargs='+', default=None)
    c.add_argument('--size', type=size, default=(512, 768), help='HxW (default 512x768)')
    c.set_defaults(handler=run_compare)
    d = modes.add_parser('detector', parents=[common], help='one Mask R-CNN training step per detector')
    d.add_argument('--detectors', nargs='+', default=None,
                   help='backbone:kernel[+nosr|+explicit|+factorised] names (default: Swin-T and PVTv2-b2 with '
                        'softmax, poly3, inline and mmdet\'s own backbone)')
    d.add_argument('--profile', default=None, help='a folder: one more step of each detector under torch.profiler, '
                                                   'its top operators written there')
    d.add_argument('--size', type=size, default=None, help='HxW (default 800x1216)')
    d.set_defaults(handler=run_detector)
    # the top-level help lists every mode's options (each mode's own --help says what they mean)
    p.epilog = 'Every mode and its options:\n' + ''.join(
        '  ' + m.format_usage().replace('usage: ', '') for m in modes.choices.values())
    return p


# ---------------------------------------------------------------------------------------------- modes
def run_kernels(args, out):
    from softfree_mm.analysis.benchmark import kernels as bm
    from softfree_mm.analysis.benchmark.output import plot
    from softfree_mm.analysis.benchmark.timing import DTYPES
    if args.tokens and args.sides:
        raise BadArgs('give --tokens or --sides, not both')
    tokens = args.tokens or [s * s for s in (args.sides or [32, 64])]
    passes = ('fwd', 'fwdbwd') if args.backward else ('fwd',)
    ceilings = None
    if args.ceilings:
        ceilings = bm.device_ceilings(args.device, DTYPES[args.dtype],
                                      **({} if args.device.startswith('cuda') else dict(n=512, copy_mib=64)))
        print('ceilings: ' + ', '.join(f'{k}={v:.4g}' if isinstance(v, float) else f'{k}={v}'
                                       for k, v in ceilings.items()))
    rows = bm.run_kernels(args.kernels or list(DEFAULT_KERNELS), tokens, heads=args.heads, head_dim=args.head_dim,
                          batch=args.batch, dtype=DTYPES[args.dtype], device=args.device, repeats=args.repeats,
                          passes=passes, memory=not args.no_memory, log=out.progress, clock=args.clock,
                          ceilings=ceilings)
    r0 = rows[0]
    out.show(rows, bm.KERNEL_COLUMNS, f"kernels: B={r0['batch']} heads={r0['heads']} head_dim={r0['head_dim']} "
                                      f"{r0['dtype']}")
    if len(tokens) > 1:
        print()
        out.show(bm.scaling(rows), ('kernel', 'pass', 'N_min', 'N_max', 'time_slope', 'memory_slope',
                                    'faster_than_softmax_from_N'), 'log-log slopes over N')
    if args.plot:
        plot(rows, args.plot)
        print(f'plot: {args.plot}')
    return rows


def run_cost(args, out):
    import os.path as osp

    from softfree_mm.analysis.benchmark import cost
    from softfree_mm.analysis.benchmark.cost_layouts import COST_KERNELS, COST_LAYOUTS, KERNEL_NAMES
    bad = [x for x in args.layouts if x not in COST_LAYOUTS]
    if bad:
        raise BadArgs(f'--layouts: unknown layout(s) {bad}; valid: {", ".join(COST_LAYOUTS)}')
    kernels = list(args.kernels or COST_KERNELS)
    bad = [k for k in kernels if not isinstance(k, str) or k not in KERNEL_NAMES]
    if bad:
        raise BadArgs(f'--kernels with --layouts: unknown kernel(s) {bad}; valid: {", ".join(KERNEL_NAMES)}')
    if args.sizes:
        raise BadArgs('--sizes is for the plain backbone mode; with --layouts give --short-sides')
    if not args.csv:
        raise BadArgs('--layouts needs --csv PATH: the sweep appends each case there and resumes from it')
    os.makedirs(osp.dirname(osp.abspath(args.csv)), exist_ok=True)
    sides = args.short_sides or list(cost.SHORT_SIDES)
    cases = cost.plan(args.layouts, kernels, sides, large=cost.LARGE_SIDE if args.large_side is None else
                      (args.large_side or None), seg=args.seg_size, models=() if args.no_models else cost.MODELS)
    import signal
    import threading
    if threading.current_thread() is threading.main_thread():  # SIGTERM an exit: the running case goes with it
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows = cost.sweep(cases, args.csv, args.time_limit, args.mem_limit, repeats=args.repeats, log=out.progress,
                      device=args.device, dtype=args.dtype)
    from softfree_mm.analysis.benchmark import cost_report
    print(cost_report.markdown(rows))
    print(cost_report.findings(rows))
    if args.plot:
        cost_report.plot(rows, args.plot)
        print(f'plot: {args.plot}')
    if args.docs:
        cost_report.write_docs(args.docs, rows, args.plot, readme=args.readme)
    args.csv_written = True
    return rows


def run_backbone(args, out):
    if args.layouts:
        return run_cost(args, out)
    from softfree_mm.analysis.benchmark.backbones import BACKBONE_COLUMNS, run_backbones
    rows = run_backbones(args.backbones or list(DEFAULT_BACKBONES), args.kernels or ['softmax'],
                         args.sizes or [(224, 224)], batch=args.batch, dtype=args.dtype, device=args.device,
                         repeats=args.repeats, flops=not args.no_flops, log=out.progress, clock=args.clock)
    out.show(rows, BACKBONE_COLUMNS, f'backbones: batch={args.batch} {args.dtype}, one subprocess a point')
    return rows


def run_flops(args, out):
    from softfree_mm.analysis.benchmark.backbones import flops_table
    rows = flops_table(args.backbones or list(DEFAULT_BACKBONES), args.kernels or ['softmax'],
                       args.sizes or [(224, 224)], log=out.progress)
    out.show(rows, ('backbone', 'kernel', 'setup', 'size', 'GFLOPs', 'attention_GFLOPs', 'params_M', 'counter'),
             'flops (multiply-adds, attention included)')
    return rows


def run_compare(args, out):
    from softfree_mm.analysis.benchmark.comparison import COMPARE_COLUMNS, compare
    from softfree_mm.analysis.benchmark.references import REFERENCES
    backbones = args.backbones or list(DEFAULT_BACKBONES)
    bad = [b for b in backbones if b not in REFERENCES]
    if bad:
        raise BadArgs(f'compare: no reference for {bad}; valid: {", ".join(REFERENCES)}')
    rows = compare(backbones, size=args.size, batch=args.batch, repeats=args.repeats, device=args.device,
                   log=out.progress, clock=args.clock)
    out.show(rows, COMPARE_COLUMNS, f'ours vs reference, softmax, same weights, batch={args.batch}')
    return rows


def run_detector(args, out):
    from softfree_mm.analysis.benchmark.detector import (DETECTOR_COLUMNS, DETECTOR_SIZE, DETECTORS, parse_detector,
                                                         run_detectors)
    names = args.detectors or list(DETECTORS)
    for n in names:
        try:
            parse_detector(n)
        except ValueError as e:
            raise BadArgs(str(e))
    size = args.size or DETECTOR_SIZE
    if size[0] % 32 or size[1] % 32:
        raise BadArgs(f'detector: --size must be a multiple of 32 each way (the FPN strides), got '
                      f'{size[0]}x{size[1]}')
    rows = run_detectors(names, size=size, batch=args.batch, dtype=args.dtype, device=args.device,
                         repeats=args.repeats, log=out.progress, profile=args.profile or '')
    out.show(rows, DETECTOR_COLUMNS, f'Mask R-CNN training step, batch {args.batch}, {args.dtype}, one '
                                     'subprocess a detector')
    return rows


class _Output:
    """The tables on stdout, one progress line per measured row on stderr."""

    def __init__(self, args, threads):
        self.args, self.threads = args, threads

    def show(self, rows, columns, title):
        from softfree_mm.analysis.benchmark.output import markdown
        print(f'{title}  (device={self.args.device}, threads={self.threads}, clock={self.args.clock})')
        print(markdown(rows, columns))

    @staticmethod
    def progress(row):
        print('  ' + ', '.join(f'{k}={v:.4g}' if isinstance(v, float) else f'{k}={v}' for k, v in row.items()
                               if k not in ('device', 'threads', 'dtype', 'heads', 'head_dim', 'batch')
                               and not k.startswith('_')),
              file=sys.stderr, flush=True)


def main(argv=None):
    import torch

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith('-') and argv[0] not in ('-h', '--help')):
        argv.insert(0, 'kernels')  # the mode defaults to kernels
    try:
        if argv[0] not in MODES and argv[0] not in ('-h', '--help'):
            raise BadArgs(f'unknown mode {argv[0]!r}; valid modes: {", ".join(MODES)}')
        args = build_parser('cuda' if torch.cuda.is_available() else 'cpu').parse_args(argv)
        if args.device.startswith('cuda') and not torch.cuda.is_available():
            raise BadArgs(f'--device {args.device}: CUDA is not available on this machine')
        if args.clock == 'cpu' and args.device != 'cpu':
            raise BadArgs('--clock cpu measures CPU time: use it with --device cpu')
        args.batch = args.batch or (2 if args.mode == 'detector' else 1)
        rows = args.handler(args, _Output(args, torch.get_num_threads()))
    except BadArgs as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    if args.csv and not getattr(args, 'csv_written', False):
        from softfree_mm.analysis.tables import write_csv
        write_csv(args.csv, rows)
        print(f'csv: {args.csv}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
