"""The kernel library is pure PyTorch: its files import nothing from OpenMMLab or timm, and it works on a Python
where those packages cannot be imported at all."""
import ast
import os
import subprocess
import sys

from tests.helpers import ROOT

ATTN = os.path.join(ROOT, 'softfree_mm', 'attention')
ALLOWED = {'torch', 'math', 'typing', 'copy', 'inspect', 'functools', 'itertools', 'dataclasses', 'collections',
           'numbers', 'warnings', 'os', 'logging'}
# the Triton programs, imported on a fused kernel's first use only
TRITON_ONLY = ('_fused_pointwise_kernels.py', '_fused_linear_kernels.py')


def test_attention_files_import_only_torch_and_the_standard_library():
    for name in sorted(os.listdir(ATTN)):
        if not name.endswith('.py'):
            continue
        tree = ast.parse(open(os.path.join(ATTN, name)).read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: inside softfree_mm.attention
                    assert node.level == 1, f'{name} reaches outside attention/: {ast.dump(node)}'
                    continue
                mods = [node.module]
            else:
                continue
            for m in mods:
                assert m.split('.')[0] in ALLOWED or (name in TRITON_ONLY and m.split('.')[0] == 'triton'), \
                    f'{name} imports {m}'


def test_kernels_work_where_openmmlab_and_timm_cannot_be_imported():
    code = (
        'import sys\n'
        'class Block:\n'
        "    blocked = {'mmengine', 'mmcv', 'mmdet', 'mmseg', 'mmpretrain', 'timm'}\n"
        '    def find_spec(self, name, path=None, target=None):\n'
        "        if name.split('.')[0] in self.blocked:\n"
        "            raise ImportError('blocked ' + name)\n"
        'sys.meta_path.insert(0, Block())\n'
        'import torch\n'
        "Block.blocked.add('triton')  # after torch, which probes for it (the kernels import it on a fused use only)\n"
        'from softfree_mm.attention import build_attention, list_attentions\n'
        'q = torch.randn(1, 2, 16, 8)\n'
        'for n in list_attentions():\n'
        '    k = build_attention(n, num_heads=2, head_dim=8)\n'
        '    assert k(q, q, q, hw=(4, 4)).shape == (1, 2, 16, 8)\n'
        "print('OK', len(list_attentions()), sorted(m for m in sys.modules if m.split('.')[0] in ('mmengine', 'mmcv', 'mmdet', 'mmseg', 'mmpretrain', 'timm')))\n")
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().startswith('OK') and res.stdout.strip().endswith('[]')
