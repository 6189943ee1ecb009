"""The docs stay true to the repository: README.md, CHANGELOG.md and docs/.

* Every relative link (and image) resolves, anchors included.
* Every command shown (`python tools/...`, `python -m softfree_mm...`, `bash tools/...`, `make ...`) names a tool that
  exists, and each option shown is listed by that tool's `--help` (all tools answered in one process); make targets
  exist in the Makefile.
* Every `configs/....py` path named exists, and the README's model zoo names every shipped config and no other.
* A table under a `Data: [...](x.csv)` line shows, cell for cell, rows of that CSV file (columns by name).
* The official configs' headers state the parameters and FLOPs of docs/results/official_setups_*.csv.
* The README's kernel example runs as written; the README is short, with the two commands in its first screen, and
  no page carries timestamps or commit hashes.
"""
import csv
import glob
import json
import os
import os.path as osp
import re
import shlex
import subprocess
import sys

import pytest

from tests.helpers import ROOT

PAGES = [osp.join(ROOT, 'README.md'), osp.join(ROOT, 'CHANGELOG.md')] + sorted(
    glob.glob(osp.join(ROOT, 'docs', '**', '*.md'), recursive=True))
FENCE = re.compile(r'^```([\w-]*)\n(.*?)^```', re.S | re.M)
LINK = re.compile(r'\[[^\]]*\]\(([^)\s]+)\)')
TASKS = ('cls', 'maskrcnn', 'upernet', 'semfpn')


def _read(path):
    with open(path, encoding='utf-8') as f:
        return f.read()


def _rel(path):
    return osp.relpath(path, ROOT)


def _prose(text):
    """The text without fenced blocks and inline code (links there are not links)."""
    return re.sub(r'`[^`\n]*`', '', FENCE.sub('', text))


def _slug(heading):
    """GitHub's anchor of a heading: markdown marks dropped, lower case, punctuation removed, spaces -> '-'."""
    text = re.sub(r'[`*]', '', heading).strip().lower()
    return re.sub(r'[^\w\- ]', '', text).replace(' ', '-')


def _anchors(path):
    seen, out = {}, set()
    for line in FENCE.sub('', _read(path)).splitlines():
        m = re.match(r'#{1,6} (.*)', line)
        if m:
            slug = _slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f'{slug}-{n}')
    return out


def test_pages_exist():
    names = {_rel(p) for p in PAGES}
    for page in ('get_started', 'training', 'clusters', 'kernels', 'backbones', 'official_weights', 'swap',
                 'research_tools', 'benchmarks', 'reliability', 'index'):
        assert f'docs/{page}.md' in names, page


def test_every_relative_link_resolves_anchors_included():
    bad = []
    for page in PAGES:
        for target in LINK.findall(_prose(_read(page))):
            if re.match(r'[a-z]+:', target):  # https:, mailto:
                continue
            path, _, anchor = target.partition('#')
            dest = osp.normpath(osp.join(osp.dirname(page), path)) if path else page
            if not osp.exists(dest):
                bad.append(f'{_rel(page)}: {target} (no such file)')
            elif anchor and dest.endswith('.md') and anchor not in _anchors(dest):
                bad.append(f'{_rel(page)}: {target} (no heading #{anchor} in {_rel(dest)})')
    assert not bad, '\n'.join(bad)


# ------------------------------------------------------------------------------------------------------ commands
def _command_lines(text):
    """Shell lines from bash / unlabelled fenced blocks (continuations joined) and from inline code spans."""
    lines = []
    for lang, body in FENCE.findall(text):
        if lang in ('', 'bash', 'sh', 'shell'):
            lines += body.replace('\\\n', ' ').splitlines()
    lines += re.findall(r'`([^`\n]*(?:python|bash|make) [^`\n]*)`', FENCE.sub('', text))
    return lines


def _commands(page):
    """(kind, name, options) of every command the page shows: kind is tool, module, script or make."""
    out = []
    for line in _command_lines(_read(page)):
        for segment in re.split(r'&&|;|\|', line):
            try:
                words = shlex.split(segment, comments=True)
            except ValueError:
                words = segment.split()
            while words and re.match(r'[A-Z_][A-Z0-9_]*=', words[0]):  # VAR=value prefixes
                words = words[1:]
            if len(words) < 2:
                continue
            opts = sorted({w.lstrip('[').rstrip(']').split('=')[0] for w in words[2:]
                           if w.lstrip('[').startswith('--') and w.lstrip('[') != '--'})
            if words[0] in ('python', 'python3') and words[1].startswith('tools/'):
                out.append(('tool', words[1], opts))
            elif words[0] in ('python', 'python3') and words[1] == '-m' and words[2].startswith('softfree_mm'):
                out.append(('module', words[2], sorted({w.split('=')[0] for w in words[3:] if w.startswith('--')})))
            elif words[0] == 'bash' and words[1].startswith('tools/'):
                out.append(('script', words[1], opts))
            elif words[0] == 'make':
                out += [('make', w, []) for w in words[1:] if '=' not in w and not w.startswith('-')]
    return out


HELP = r"""
import contextlib, io, json, os, runpy, sys
out = {}
for path in json.loads(sys.argv[1]):
    buf, code = io.StringIO(), None
    argv, sys.argv = sys.argv, [path, '--help']
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))  # as `python PATH` puts the script's folder first
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            runpy.run_path(path, run_name='__main__')
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = argv
        sys.path.pop(0)
    out[path] = [code, buf.getvalue()]
print(json.dumps(out))
"""


def _helps(paths):
    """Each tool's `--help` (exit code, text), every tool run in one process (the mm stack imported once)."""
    env = dict(os.environ, PYTHONWARNINGS='ignore')
    proc = subprocess.run([sys.executable, '-c', HELP, json.dumps(sorted(paths))], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _listed(option, text):
    return re.search(r'(?<![\w-])' + re.escape(option) + r'(?![\w-])', text) is not None


# the launchers pass their trailing arguments to these tools
FORWARDS = {'tools/dist_train.sh': 'tools/train.py', 'tools/slurm_train.sh': 'tools/train.py',
            'tools/dist_test.sh': 'tools/test.py', 'tools/slurm_test.sh': 'tools/test.py'}


def test_commands_shown_name_tools_and_options_that_exist():
    shown = [(_rel(page), c) for page in PAGES for c in _commands(page)]
    kinds = {k for _, (k, _, _) in shown}
    assert {'tool', 'module', 'script', 'make'} <= kinds and len(shown) > 40, shown  # the parser finds them
    bad = []
    for where, (kind, name, _) in shown:
        if kind in ('tool', 'script') and not osp.isfile(osp.join(ROOT, name)):
            bad.append(f'{where}: {name} does not exist')
        if kind == 'module':
            base = osp.join(ROOT, *name.split('.'))
            if not (osp.isfile(base + '.py') or osp.isfile(osp.join(base, '__init__.py'))):
                bad.append(f'{where}: python -m {name}: no such module')
    targets = set(re.findall(r'^([\w-]+):', _read(osp.join(ROOT, 'Makefile')), re.M))
    bad += [f'{where}: make {name}: no such target' for where, (kind, name, _) in shown
            if kind == 'make' and name not in targets]
    assert not bad, '\n'.join(bad)

    tools = {name for _, (kind, name, _) in shown if kind == 'tool'}
    tools |= {FORWARDS[name] for _, (kind, name, opts) in shown if kind == 'script' and name in FORWARDS and opts}
    helps = _helps(tools)
    for path, (code, text) in helps.items():
        if code not in (0, None) or 'usage' not in text.lower():
            bad.append(f'{path} --help: exit {code}: {text[-300:]}')
    for where, (kind, name, opts) in shown:
        for opt in opts:
            if kind == 'tool':
                ok = _listed(opt, helps[name][1])
            elif kind == 'script' and name in FORWARDS:
                ok = _listed(opt, helps[FORWARDS[name]][1])
            elif kind == 'script':
                ok = _listed(opt, _read(osp.join(ROOT, name)))
            else:  # a module with options: none is shown today
                ok = False
            if not ok:
                bad.append(f'{where}: {name} {opt}: not an option of the tool')
    assert not bad, '\n'.join(bad)


# ------------------------------------------------------------------------------------------------------ configs
def test_config_and_test_paths_named_in_the_docs_exist():
    # not an official repository's configs/ folder; test files move with the layout of tests/
    named = re.compile(r'(?<![\w/.-])(?:configs|tests)/[\w/.-]+?\.py')
    bad = [f'{_rel(page)}: {path}' for page in PAGES for path in named.findall(_read(page))
           if not osp.isfile(osp.join(ROOT, path))]
    assert not bad, '\n'.join(bad)


def _table_after(lines, start):
    """(header, rows) of the first markdown table at or after line `start`."""
    i = start
    while i < len(lines) and not lines[i].startswith('|'):
        i += 1
    table = []
    while i < len(lines) and lines[i].startswith('|'):
        table.append(lines[i])
        i += 1

    def cells(line):
        return [c.strip() for c in re.split(r'(?<!\\)\|', line.strip())[1:-1]]
    return cells(table[0]), [cells(line) for line in table[2:]]


def _model_zoo():
    lines = _read(osp.join(ROOT, 'README.md')).splitlines()
    header, rows = _table_after(lines, lines.index('## Model zoo'))
    assert header[:2] == ['backbone', 'attentions'] and set(TASKS) <= set(header), header
    names = []
    for row in rows:
        backbone = row[0].strip('`')
        attentions = re.findall(r'`(\w+)`', row[1])
        assert attentions, row
        names += [f'{task}_{backbone}_{attn}' for task in TASKS for attn in attentions]
        # the backbone-start column: "softmax: the ... release; inline: ...; others: their warm start" -> the
        # attentions without a release of their own have the warm start's two configs
        start = row[-1]
        if 'others: their warm start' in start:
            released = set(re.findall(r'(?:^|; )(\w+):', start)) - {'others'}
            names += [f'{stage}_{backbone}_{attn}' for stage in ('transfer', 'finetune') for attn in attentions
                      if attn not in released]
    return names


def test_model_zoo_names_every_shipped_config_and_only_existing_ones():
    names = _model_zoo()
    shipped = {osp.splitext(osp.basename(p))[0] for p in glob.glob(osp.join(ROOT, 'configs', '*.py'))}
    assert sorted(set(names) - shipped) == [], 'in the model zoo but not in configs/'
    assert sorted(shipped - set(names)) == [], 'in configs/ but not in the model zoo'


# ------------------------------------------------------------------------------------------------------ data
def _same(cell, value):
    cell = cell.replace('**', '').replace('`', '').replace('\\|', '|').strip()
    value = value.strip()
    if cell == value:
        return True
    try:
        return float(cell) == float(value)
    except ValueError:
        return False


def _data_tables():
    """(page, line, csv paths, header, rows) of every table under a `Data:` line."""
    for page in PAGES:
        lines = _read(page).splitlines()
        for i, line in enumerate(lines):
            if line.startswith('Data:'):
                csvs = [osp.normpath(osp.join(osp.dirname(page), t)) for t in LINK.findall(line)
                        if t.endswith('.csv')]
                yield (page, i + 1, csvs, *_table_after(lines, i + 1))


def _merged_rows(paths, key):
    """The CSV files' rows: files with the same columns one after another, files with other columns joined on
    `key` (the table's first column)."""
    groups = {}
    for path in paths:
        with open(path, newline='') as f:
            reader = csv.DictReader(f)
            groups.setdefault(tuple(reader.fieldnames), []).extend(reader)
    (first, *others) = list(groups.values())
    for rows in others:
        by_key = {r[key]: r for r in rows}
        first = [dict(r, **by_key.get(r[key], {})) for r in first]
    return first


def test_tables_under_a_data_line_show_rows_of_their_csv_files():
    found, bad = 0, []
    for page, line, paths, header, rows in _data_tables():
        where = f'{_rel(page)}:{line}'
        missing = [p for p in paths if not osp.isfile(p)]
        if not paths or missing:
            bad.append(f'{where}: no CSV file {missing}')
            continue
        data = _merged_rows(paths, header[0])
        unknown = [h for h in header if h not in data[0]]
        if unknown:
            bad.append(f'{where}: columns {unknown} are not in {[_rel(p) for p in paths]}')
            continue
        j = 0  # the table's rows are rows of the data, in its order
        for row in rows:
            while j < len(data) and not all(_same(c, data[j][h]) for h, c in zip(header, row)):
                j += 1
            if j == len(data):
                bad.append(f'{where}: row {row} is no row of {[_rel(p) for p in paths]} (in order)')
                break
            j += 1
        found += 1
    assert not bad, '\n'.join(bad)
    assert found >= 10, found


def _official_rows():
    rows = []
    for path in sorted(glob.glob(osp.join(ROOT, 'docs', 'results', 'official_setups_*.csv'))):
        if not path.endswith('_reported.csv'):
            with open(path, newline='') as f:
                rows += list(csv.DictReader(f))
    return rows


def test_official_config_headers_state_the_counted_parameters_and_flops():
    rows = _official_rows()
    with open(osp.join(ROOT, 'docs', 'results', 'official_setups_reported.csv'), newline='') as f:
        reported = {r['config']: r for r in csv.DictReader(f)}
    assert len(rows) >= 19 and {r['config'] for r in rows} == set(reported)
    bad = []
    for r in rows:
        lines = _read(osp.join(ROOT, 'configs', r['config'] + '.py')).splitlines()
        head = ' '.join(line.lstrip('#').strip() for line in lines[:next(i for i, x in enumerate(lines)
                                                                        if not x.startswith('#'))])
        want = [f"{r['params_M']}M", f"{r['GFLOPs']} GFLOPs", r['shape']]
        rep = reported[r['config']]
        want += [f"{rep[k]}{unit}" for k, unit in (('reported_params_M', 'M'), ('reported_GFLOPs', 'G')) if rep[k]]
        bad += [f"{r['config']}: header lacks {w!r}" for w in want if w not in head]
    assert not bad, '\n'.join(bad)


# ------------------------------------------------------------------------------------------------------ README
BLOCK_MM = """
import sys
class Block:  # the README's claim: the kernel library needs torch only
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('mmengine', 'mmcv', 'mmdet', 'mmseg', 'mmpretrain', 'timm'):
            raise ImportError('blocked ' + name)
sys.meta_path.insert(0, Block())
"""


def test_readme_kernel_example_runs_as_written_without_openmmlab():
    readme = _read(osp.join(ROOT, 'README.md'))
    section = readme[readme.index('### A kernel on its own'):]
    snippet = re.search(r'```python\n(.*?)```', section, re.S).group(1)
    code = BLOCK_MM + snippet + 'assert tuple(out.shape) == tuple(v.shape); print("OK")\n'
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == 'OK', res.stderr[-3000:]


def test_readme_is_short_with_the_two_commands_in_its_first_screen():
    lines = _read(osp.join(ROOT, 'README.md')).splitlines()
    assert len(lines) <= 200, len(lines)
    first = '\n'.join(lines[:40])
    assert 'make demo' in first and 'make test' in first
    assert 'docs/' in first or 'docs/' in '\n'.join(lines)


@pytest.mark.parametrize('page', PAGES, ids=_rel)
def test_pages_hold_no_timestamps_or_commit_hashes(page):
    text = re.sub(r'https?://\S+|\.\.\./\S+', '', _read(page))
    stamps = re.findall(r'\b\d{1,2}:\d\d UTC\b|\b20\d\d-\d\d-\d\d\b', text)
    hashes = [w for w in re.findall(r'(?<![\w/.-])[0-9a-f]{7,12}(?![\w/-])', text)
              if re.search(r'\d', w) and re.search(r'[a-f]', w)]
    assert not stamps and not hashes, (stamps, hashes)
