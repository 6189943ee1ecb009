"""softfree_mm: softmax-free attention for OpenMMLab 2.x backbones.

``pip install -e .`` installs the package; configs and tools ship the OpenMMLab way, under ``softfree_mm/.mim``
(symlinks for an editable install, copies otherwise), so that ``mim`` finds them.
"""
import os
import os.path as osp
import shutil
import sys

from setuptools import find_packages, setup

HERE = osp.dirname(osp.abspath(__file__))


def read_version():
    ns = {}
    with open(osp.join(HERE, 'softfree_mm', '__init__.py')) as f:
        for line in f:
            if line.startswith('__version__'):
                exec(line, ns)
    return ns['__version__']


def parse_requirements(name):
    """Lines of requirements/<name>.txt, without comments, -r includes resolved."""
    out = []
    with open(osp.join(HERE, 'requirements', name)) as f:
        for line in f:
            line = line.split('#', 1)[0].strip()
            if not line:
                continue
            if line.startswith('-r '):
                out += parse_requirements(line[3:].strip())
            elif not line.startswith('-'):
                out.append(line)
    return out


def add_mim_extension():
    """Place configs/ and tools/ under softfree_mm/.mim (as mmdet, mmseg, mmpretrain do)."""
    if 'develop' in sys.argv or 'editable_wheel' in sys.argv:
        mode = 'symlink'
    elif any(a in sys.argv for a in ('sdist', 'bdist_wheel', 'install', 'build', 'build_py')):
        mode = 'copy'
    else:
        return
    mim = osp.join(HERE, 'softfree_mm', '.mim')
    os.makedirs(mim, exist_ok=True)
    for name in ('configs', 'tools'):
        src, dst = osp.join(HERE, name), osp.join(mim, name)
        if osp.islink(dst) or osp.isfile(dst):
            os.remove(dst)
        elif osp.isdir(dst):
            shutil.rmtree(dst)
        if mode == 'symlink':
            os.symlink(osp.relpath(src, mim), dst)
        else:
            shutil.copytree(src, dst)


if __name__ == '__main__':
    add_mim_extension()
    setup(
        name='softfree_mm',
        version=read_version(),
        description='Softmax-free attention kernels swappable inside XCiT, PVT, Swin and CSwin for mmdet, mmseg '
                    'and mmpretrain',
        long_description=open(osp.join(HERE, 'README.md')).read() if osp.exists(osp.join(HERE, 'README.md')) else '',
        long_description_content_type='text/markdown',
        python_requires='>=3.9',
        packages=find_packages(exclude=('configs', 'tools', 'tests', 'data')),
        include_package_data=True,
        package_data={'softfree_mm': ['.mim/configs/**/*', '.mim/tools/**/*', '.mim/configs/*', '.mim/tools/*']},
        install_requires=parse_requirements('runtime.txt'),
        extras_require={'tests': parse_requirements('tests.txt'), 'build': parse_requirements('build.txt')},
        license='Apache-2.0',
        zip_safe=False,
    )
