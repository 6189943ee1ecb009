"""softfree_mm: softmax-free attention for OpenMMLab 2.x backbones.

``pip install -e .`` installs the package in place; ``pip install .`` (or a wheel) installs a copy. Either way the
configs, the tools and ``model-index.yml`` ship the OpenMMLab way, under ``softfree_mm/.mim``, where ``mim`` looks
for them (``mim list``, ``mim train softfree_mm CONFIG``, ``mim test``, ``mim run softfree_mm TOOL``):

* a wheel / regular install: ``build_py`` copies them into the built package (the source tree is not touched);
* an editable install: ``editable_wheel`` links ``softfree_mm/.mim/{configs,tools,model-index.yml}`` in the source
  tree to the repository's own folders, and points mim at the repository: mim finds a package at
  ``<distribution location>/<package>``, else at ``<location>/<first line of top_level.txt>``; a PEP 660 editable
  install's location is site-packages, where the package is not, so the editable wheel's ``top_level.txt`` starts
  with the package's absolute path in the repository (see ``point_top_level_to_source``). Edits to configs and
  tools are seen at once; ``pip uninstall`` works as for any editable install.

Both kinds of install also put ``softfree_mm-mmcv-ext.pth`` in site-packages: one line, run at the start of every
Python process, that lets ``softfree_mm/mmcv_ext/ops.py`` stand in for mmcv's compiled ``mmcv._ext`` where mmcv-lite
has none (``softfree_mm/mmcv_ext/finder.py``); it is listed in the install's RECORD, so ``pip uninstall`` removes it.
"""
import os
import os.path as osp
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = osp.dirname(osp.abspath(__file__))
PACKAGE = 'softfree_mm'
MIM_ITEMS = ('configs', 'tools', 'model-index.yml')  # what mim looks for under <package>/.mim
# the CPython versions the whole test suite passes on (tools/setup_env.sh reads this line: one tuple, in order)
PYTHONS = ('3.11', '3.12', '3.13')


def mmcv_ext_pth():
    """(file name, line) of the .pth, read from softfree_mm/mmcv_ext/finder.py without importing the package."""
    ns = {'__file__': osp.join(HERE, PACKAGE, 'mmcv_ext', 'finder.py')}
    with open(ns['__file__']) as f:
        exec(f.read(), ns)
    return ns['PTH_NAME'], ns['PTH_LINE']


def write_mmcv_ext_pth(folder):
    name, line = mmcv_ext_pth()
    with open(osp.join(folder, name), 'w') as f:
        f.write(line)


def read_version():
    ns = {}
    with open(osp.join(HERE, PACKAGE, '__init__.py')) as f:
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


def _remove(path):
    if osp.islink(path) or osp.isfile(path):
        os.remove(path)
    elif osp.isdir(path):
        shutil.rmtree(path)


def _copy(src, dst):
    _remove(dst)
    if osp.isdir(src):
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
    else:
        shutil.copyfile(src, dst)


class BuildPy(build_py):
    """Regular builds (wheel, ``pip install .``): copies of configs/, tools/ and model-index.yml in the package."""

    def run(self):
        super().run()
        if getattr(self, 'editable_mode', False):
            return  # an editable install links the source tree instead (EditableWheel)
        write_mmcv_ext_pth(self.build_lib)  # the wheel's root is site-packages
        mim = osp.join(self.build_lib, PACKAGE, '.mim')
        os.makedirs(mim, exist_ok=True)
        for name in MIM_ITEMS:
            _copy(osp.join(HERE, name), osp.join(mim, name))


def link_mim_in_source_tree():
    """``softfree_mm/.mim/<item>`` -> the repository's own configs/, tools/, model-index.yml (relative links; copies
    where the file system has no symbolic links)."""
    mim = osp.join(HERE, PACKAGE, '.mim')
    os.makedirs(mim, exist_ok=True)
    for name in MIM_ITEMS:
        src, dst = osp.join(HERE, name), osp.join(mim, name)
        _remove(dst)
        try:
            os.symlink(osp.relpath(src, mim), dst)
        except OSError:
            _copy(src, dst)


def _editable_wheel_class():
    try:
        from setuptools.command.editable_wheel import editable_wheel
    except ImportError:  # setuptools < 64: `pip install -e .` runs `setup.py develop`, whose location is the repo
        return None

    class EditableWheel(editable_wheel):
        def run(self):
            link_mim_in_source_tree()
            try:
                self._ensure_dist_info()  # the dist-info this wheel will carry (given by pip, or made here)
            except AttributeError:  # a setuptools without it: the install works, mim does not find it
                print('softfree_mm: this setuptools has no editable_wheel._ensure_dist_info; mim will not find '
                      'the editable install (a regular install works with mim)')
            else:
                point_top_level_to_source(self.dist_info_dir)
            super().run()

        def _install_namespaces(self, installation_dir, pth_prefix):
            # what this folder holds goes into the editable wheel's root, i.e. site-packages
            super()._install_namespaces(installation_dir, pth_prefix)
            write_mmcv_ext_pth(installation_dir)

    return EditableWheel


def point_top_level_to_source(dist_info_dir):
    """First line of the editable wheel's ``top_level.txt``: the package's absolute path in the repository.

    mim (``get_installed_path``, ``mim list``) looks for a package at ``<location>/<package>`` and, when that does not
    exist, at ``os.path.join(<location>, <first line of top_level.txt>)``. For a PEP 660 editable install the
    location is site-packages, where the package is not; an absolute first line makes that join the repository's
    package, where ``.mim`` links to the repository's configs and tools. The second line keeps the plain name.
    """
    path = osp.join(dist_info_dir, 'top_level.txt')
    with open(path, 'w') as f:
        f.write(f'{osp.join(HERE, PACKAGE)}\n{PACKAGE}\n')


def cmdclass():
    out = {'build_py': BuildPy}
    editable = _editable_wheel_class()
    if editable is not None:
        out['editable_wheel'] = editable
    return out


if __name__ == '__main__':
    setup(
        name=PACKAGE,
        version=read_version(),
        description='Softmax-free attention kernels swappable inside XCiT, PVT, Swin and CSwin for mmdet, mmseg '
                    'and mmpretrain',
        long_description=open(osp.join(HERE, 'README.md')).read() if osp.exists(osp.join(HERE, 'README.md')) else '',
        long_description_content_type='text/markdown',
        python_requires=f'>={PYTHONS[0]},<3.{int(PYTHONS[-1].split(".")[1]) + 1}',
        classifiers=['Programming Language :: Python :: 3', 'Programming Language :: Python :: Implementation :: CPython',
                     *(f'Programming Language :: Python :: {v}' for v in PYTHONS), 'Operating System :: POSIX :: Linux'],
        packages=find_packages(exclude=('configs', 'configs.*', 'tools', 'tools.*', 'tests', 'tests.*', 'data')),
        cmdclass=cmdclass(),
        install_requires=parse_requirements('runtime.txt') + parse_requirements('mmcv.txt'),
        extras_require={'tests': parse_requirements('tests.txt'), 'build': parse_requirements('build.txt'),
                        'tensorboard': parse_requirements('tensorboard.txt'), 'onnx': parse_requirements('onnx.txt')},
        license='Apache-2.0',
        zip_safe=False,
    )
