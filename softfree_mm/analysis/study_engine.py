"""One engine for the project's studies: the kernel study, the task study, the warm-start grid, and any study a
contributor adds (docs/contributing.md, "How to add a study").

A study is a :class:`Declaration`: the row fields that name one of its runs (``axes``, the pairing unit among them),
the numbers it compares (``metrics``), what pairs two runs (``pairing``), the module that states its rule (``rule``),
how its runs are made, and ``write(ctx, tables)``, which writes the CSVs, tables, plots and the docs section and
returns what the tool prints. Every run goes through ``ctx.runner`` (:class:`.grid_runner.Runner`: one process per
run, in a folder of its own, identified by its resolved config and its starts; a finished run is read, never run
again, so the same command resumes a stopped study).

How its runs are made: ``one(ctx, point)``, one run of a point of the axes' cross (``{axis: value}``), and the engine
plans the grid (:func:`cross`: the axes' values from the options, every point once, trained with the pairing unit
outermost so that a study stopped part way has whole units, the runner's jobs at a time; its rows are the table
``rows``); or ``plan(ctx)``, a study whose later runs depend on what earlier ones gave (the task study's detectors
start from its classifiers, the warm-start grid skips the seeds whose teacher failed), which returns its tables
(name -> rows) and may call :func:`cross` for each of its stages.

:func:`run` is the engine: the options checked and the kernels parsed once (:class:`Options`), the runner made
once, the plan, and with ``report_only`` the runs the selection declares that have not finished named in one line and
left out of the outputs (the outputs hold what finished, so a report of the committed outputs writes them again byte
for byte), then the outputs (their folder made).
"""
from dataclasses import dataclass, field
import itertools
import os
import os.path as osp
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..attention import Kernel
from ..engine.errors import UsageError
from .grid_runner import Runner

NOT_RUN = 'not run'
Tables = Dict[str, List[dict]]


@dataclass(frozen=True)
class Declaration:
    """A study: see the module's text; ``one`` or ``plan``, not both. ``tables``: the names of the plan's row lists
    (the first the runs')."""
    name: str
    axes: Tuple[str, ...]
    metrics: Tuple[str, ...]
    pairing: str
    rule: str
    write: Callable[['Context', Tables], Any]
    one: Optional[Callable[['Context', Dict[str, Any]], dict]] = None
    plan: Optional[Callable[['Context'], Tables]] = None
    tables: Tuple[str, ...] = ('rows', )

    def __post_init__(self):
        if (self.one is None) == (self.plan is None):
            raise ValueError(f'study {self.name!r}: give one(ctx, point) (the engine crosses the axes) or plan(ctx), '
                             'not both or neither')

    def run_name(self, row: dict) -> str:
        """A row's run, by its axes ('pvt/seg/poly:degree=3/transfer/0')."""
        return '/'.join(str(row[a]) for a in self.axes if row.get(a) not in (None, ''))


@dataclass
class Options:
    """What every study's command line gives; ``extra``: the study's own options (by name). Checked here: a bad
    value is a UsageError naming it and what is valid; the kernels are parsed once, here (:class:`Kernel`)."""
    work_dir: str
    out: str
    docs: Optional[str] = None
    seeds: Sequence[int] = (0, 1, 2)
    kernels: Optional[Sequence[str]] = None
    jobs: int = 2
    threads: Optional[int] = 1
    keep_from: Optional[str] = None
    report_only: bool = False
    extra: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        seeds = list(self.seeds)
        if (not seeds or len(set(seeds)) != len(seeds)
                or any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in seeds)):
            raise UsageError(f'--seeds {" ".join(map(str, seeds))}: distinct ints >= 0, at least one')
        self.seeds = seeds
        if not isinstance(self.jobs, int) or self.jobs < 1:
            raise UsageError(f'--jobs {self.jobs}: an int >= 1')
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise UsageError(f'--threads {self.threads}: an int >= 1')
        if self.kernels is not None:
            if not self.kernels:
                raise UsageError('--kernels: at least one kernel (or leave the option out: the study\'s own)')
            try:
                self.kernels = [Kernel(k) for k in self.kernels]
            except ValueError as e:
                raise UsageError(f'--kernels: {e}') from None

    def __getattr__(self, name):  # a study's own option, as an attribute
        extra = self.__dict__.get('extra', {})
        if name in extra:
            return extra[name]
        raise AttributeError(name)


@dataclass
class Context:
    """What a declaration's functions get: the declaration, the options, the runner, the repository root (the
    configs the study names are under it) and where to say what happens."""
    study: Declaration
    options: Options
    runner: Runner
    root: str
    echo: Callable[[str], None] = print


def axis_values(ctx: Context) -> Dict[str, list]:
    """Each declared axis's values, from the options: ``kernel`` the kernels, ``seed`` the seeds, any other axis
    ``a`` the study's own option ``a + 's'`` (or ``a``); an axis with none is a UsageError naming it."""
    out = {}
    for a in ctx.study.axes:
        extra = ctx.options.extra
        v = dict(kernel=ctx.options.kernels, seed=ctx.options.seeds).get(a, extra.get(a + 's', extra.get(a)))
        if not v:
            raise UsageError(f'study {ctx.study.name!r}: its axis {a!r} has no values (give --{a}s)')
        out[a] = list(v)
    return out


def cross(runner: Runner, values: Dict[str, Sequence], one: Callable[[Dict[str, Any]], dict],
          pairing: Optional[str] = None, kept: Optional[Callable[[Dict[str, Any]], Optional[dict]]] = None,
          check: Optional[Callable[[Dict[str, Any]], Any]] = None) -> List[dict]:
    """Every point of the cross of ``values`` (axis -> its values, in the rows' order: the first axis outermost),
    each run once through ``runner``: ``check(point)`` on every point before anything runs (a folder holding another
    run is refused before any training), then ``kept(point)``'s row where it gives one (not run again), else
    ``one(point)``'s, the axes' values (a kernel by its label) first; trained with ``pairing`` outermost, the
    runner's jobs at a time."""
    axes, values = list(values), {a: list(v) for a, v in values.items()}
    for a, v in values.items():  # the same value twice would be two runs of one folder at once
        twice = [x for i, x in enumerate(v) if x in v[:i]]
        if twice:
            raise UsageError(f'--{a}s: {twice[0]} given twice; each value once')
    points = [dict(zip(axes, combo)) for combo in itertools.product(*values.values())]
    order = list(range(len(points)))
    if pairing in values:
        order.sort(key=lambda i: values[pairing].index(points[i][pairing]))
    if check is not None:
        for i in order:
            check(points[i])

    def run_one(i):
        got = kept(points[i]) if kept is not None else None
        if got is not None:
            return got
        return {**{a: str(v) if isinstance(v, Kernel) else v for a, v in points[i].items()}, **one(points[i])}
    done = dict(zip(order, runner.map(run_one, order)))
    return [done[i] for i in range(len(points))]


def finished_only(decl: Declaration, tables: Tables, echo=print) -> Tables:
    """The tables without the rows of runs not finished (status 'not run'), each table's count said in one line."""
    out = dict(tables)
    for name in decl.tables:
        rows = list(tables.get(name) or ())
        left = [r for r in rows if r.get('status') == NOT_RUN]
        out[name] = [r for r in rows if r.get('status') != NOT_RUN]
        if left:
            shown = ', '.join(decl.run_name(r) for r in left[:4]) + (', ...' if len(left) > 4 else '')
            echo(f'[{decl.name}] report only: {len(rows) - len(left)} of the {len(rows)} {name} declared have '
                 f'finished; the {len(left)} not run yet are left out of the outputs ({shown})')
    return out


def run(decl: Declaration, options: Options, root: str, echo: Callable[[str], None] = print):
    """The engine: (the tables, what ``decl.write`` returned)."""
    runner = Runner(osp.abspath(options.work_dir), osp.join(root, 'tools'), options.jobs, options.threads,
                    echo=echo, report_only=options.report_only)
    ctx = Context(decl, options, runner, root, echo)
    if decl.plan is not None:
        tables = decl.plan(ctx)
    else:
        tables = dict(rows=cross(runner, axis_values(ctx), lambda p: decl.one(ctx, p), decl.pairing))
    if options.report_only:
        tables = finished_only(decl, tables, echo)
    os.makedirs(options.out, exist_ok=True)
    return tables, decl.write(ctx, tables)
