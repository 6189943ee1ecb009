"""The lock (requirements/lock/*.txt, written by tools/lock.sh) against an environment: standard library only, run by
tools/setup_env.sh in the venv it sets up, by tools/test_pythons.sh and by the tests.

    python tools/lockfile.py select LOCK [--not-from-lock GROUP ...]   the lock's entries (hashes kept) less GROUPs
    python tools/lockfile.py check LOCK [--not-from-lock GROUP ...]    this environment against the lock, exit 1 on
                                                                       a difference (one line each)
    python tools/lockfile.py installed                                 this environment's own distributions,
                                                                       NAME==VERSION a line (what tools/lock.sh pins)

A GROUP is what a set-up path installs from elsewhere (:data:`GROUPS`): ``torch`` (an existing torch, TORCH_INDEX_URL:
torch, torchvision, triton and CUDA's libraries) and ``mmcv`` (a compiled mmcv instead of mmcv-lite). Everything else
is exact on every path. A locked package counts at the version ``import`` finds (a venv may see a system torch); a
package not in the lock only when it is in the environment's own site-packages. Names compare as pip compares them
(any case; '-', '_' and '.' alike).
"""
import argparse
import re
import sys
import sysconfig
from typing import Dict, Iterable, List, Sequence

GROUPS = {
    'torch': ('torch', 'torchvision', 'triton', 'nvidia-*', 'cuda-*'),
    'mmcv': ('mmcv-lite', 'mmcv'),
}
# never from the lock: the installer the venv brings, and this package (installed from the checkout, -e)
NOT_LOCKED = ('pip', 'softfree-mm')
MARKER = '.softfree_mm_lock'  # in the venv: which lock the set-up installed and which groups came from elsewhere


def canonical(name: str) -> str:
    return re.sub(r'[-_.]+', '-', name).lower()


def _in(name: str, patterns: Iterable[str]) -> bool:
    return any(name == p or (p.endswith('*') and name.startswith(p[:-1])) for p in patterns)


def excluded(groups: Sequence[str]) -> List[str]:
    """The name patterns of ``groups`` (an unknown group is a ValueError naming the known ones)."""
    out = list(NOT_LOCKED)
    for g in groups:
        if g not in GROUPS:
            raise ValueError(f'unknown group {g!r} (valid: {", ".join(GROUPS)})')
        out += GROUPS[g]
    return out


def entries(path: str) -> Dict[str, List[str]]:
    """The lock's entries by canonical name: each entry's lines (``name==version \\`` and its hash lines)."""
    out: Dict[str, List[str]] = {}
    current = None
    with open(path) as f:
        for line in f:
            line = line.rstrip('\n')
            m = re.match(r'^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)', line)
            if m:
                current = canonical(m.group(1))
                out[current] = [line]
            elif current and line.lstrip().startswith('--hash='):
                out[current].append(line)
            elif not line.startswith(' '):
                current = None
    return out


def pins(path: str) -> Dict[str, str]:
    """The lock's versions by canonical name."""
    return {name: lines[0].split('==', 1)[1].split()[0].rstrip('\\;') for name, lines in entries(path).items()}


def installed(own: bool = False) -> Dict[str, str]:
    """The distributions this environment imports, by canonical name, read from their metadata: the first found on
    ``sys.path`` for each name (what ``import`` gets); ``own``: only those in its own site-packages (a venv that sees
    a system torch does not count the system's packages as its own)."""
    from importlib import metadata
    path = list(dict.fromkeys(sysconfig.get_paths()[k] for k in ('purelib', 'platlib'))) if own else None
    out: Dict[str, str] = {}
    for d in metadata.distributions(**({'path': path} if own else {})):
        out.setdefault(canonical(d.metadata['Name']), d.version)
    return out


def differences(lock: Dict[str, str], have: Dict[str, str], own: Iterable[str] = (),
                groups: Sequence[str] = ()) -> List[str]:
    """One line per difference between the lock and the versions ``have`` (what imports), and per distribution of
    the environment's ``own`` not in the lock; names in ``groups`` and :data:`NOT_LOCKED` are left out."""
    skip = excluded(groups)
    lines = []
    for name in sorted(set(lock) | set(own)):
        if _in(name, skip):
            continue
        if name not in lock:
            lines.append(f'{name}: {have[name]} installed, not in the lock')
        elif name not in have:
            lines.append(f'{name}: {lock[name]} in the lock, not installed')
        elif lock[name] != have[name]:
            lines.append(f'{name}: {lock[name]} in the lock, {have[name]} installed')
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('command', choices=('select', 'check', 'installed'))
    p.add_argument('lock', nargs='?')
    p.add_argument('--not-from-lock', nargs='*', default=[], metavar='GROUP', choices=sorted(GROUPS))
    args = p.parse_args(argv)
    if args.command == 'installed':
        print('\n'.join(f'{n}=={v}' for n, v in sorted(installed().items()) if not _in(n, NOT_LOCKED)))
        return 0
    if not args.lock:
        p.error(f'{args.command} needs LOCK')
    if args.command == 'select':
        skip = excluded(args.not_from_lock)
        print('\n'.join(line for name, lines in entries(args.lock).items() if not _in(name, skip) for line in lines))
        return 0
    diff = differences(pins(args.lock), installed(), installed(own=True), args.not_from_lock)
    for line in diff:
        print(line)
    if diff:
        print(f'{len(diff)} difference(s) between {sys.prefix} and {args.lock}', file=sys.stderr)
    return 1 if diff else 0


if __name__ == '__main__':
    sys.exit(main())
