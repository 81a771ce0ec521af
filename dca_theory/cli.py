"""The ``dca-theory`` command line.

``dca-theory --version`` prints the package version. Sub-commands (each imports its own code
lazily, so ``figures`` and ``verify`` start fast and never load training code):

* ``dca-theory figures [--out DIR] [--experiments]``: theory figures from closed forms
  (``--experiments`` also redraws the figures of saved experiment results);
* ``dca-theory verify [--json]``: the verification report of every Section 4 claim;
* ``dca-theory run NAME [--quick] [--out DIR] [--set KEY=VALUE ...]``: one experiment of
  ``experiments/`` (found by :func:`bundled` in a checkout or an installed wheel;
  ``dca-theory run --list`` lists them; ``dca-theory run NAME --show`` lists the settings that
  ``--set`` can change, see :mod:`dca_theory.overrides`);
* ``dca-theory lm {train,eval,sample,info} ...``: the DCA transformer language model.

Errors in user input print one line ``dca-theory: error: ...`` and exit with status 2; OS errors
(permissions, a full disk, a folder the file system refuses such as one under ``/proc``, a closed
pipe as in ``dca-theory verify --json | head``, a closed stdout as in ``dca-theory lm info >&-``,
a run directory in use by another ``lm train``) and running out of memory print one line and
exit with status 1. No entry point prints a traceback for these. (A runtime that aborts, as
XLA does with ``std::bad_alloc`` under ``ulimit -v``, cannot be caught: see README.)
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import pkgutil
import sys
from pathlib import Path
from types import ModuleType

from dca_theory import __version__


def bundled(name: str) -> ModuleType:
    """The ``experiments`` or ``figures`` package, wherever this copy of dca_theory keeps it.

    An installed wheel ships them inside the package (``dca_theory.experiments``), so that it
    claims no generic top-level name; a checkout keeps them at the repository root beside
    ``dca_theory/``, importable as top-level packages (the editable install and the tests put
    the root on ``sys.path``). Their modules import each other relatively, so either name works.
    A top-level package of the same name from elsewhere (a user's own ``experiments``) is refused
    rather than run.
    """
    if name not in ("experiments", "figures"):
        raise ValueError(f"unknown bundled package {name!r}; valid: experiments, figures")
    if importlib.util.find_spec(f"dca_theory.{name}") is not None:
        return importlib.import_module(f"dca_theory.{name}")
    beside = Path(__file__).resolve().parents[1] / name
    spec = importlib.util.find_spec(name)
    found = Path(spec.origin).resolve().parent if spec is not None and spec.origin else None
    if found != beside:
        raise FileNotFoundError(
            f"dca_theory has no {name} package: neither dca_theory.{name} (installed wheel) nor "
            f"{beside} (checkout) is importable{f'; found {found} instead' if found else ''}")
    return importlib.import_module(name)


def _experiment_names() -> list[str]:
    return sorted(
        m.name for m in pkgutil.iter_modules(bundled("experiments").__path__)
        if not m.name.startswith("_")
    )


def _experiment(name: str) -> ModuleType:
    return importlib.import_module(f"{bundled('experiments').__name__}.{name}")


def _cmd_run(args: argparse.Namespace) -> int:
    names = _experiment_names()
    if args.list or args.name is None:
        for name in names:
            mod = _experiment(name)
            first = (mod.__doc__ or "").strip().splitlines()
            print(f"{name:24s} {first[0] if first else ''}")
        return 0
    if args.name not in names:
        raise ValueError(f"unknown experiment {args.name!r}; valid: {', '.join(names)}")
    mod = _experiment(args.name)
    if args.show:
        from dca_theory.overrides import describe

        lines = describe(mod.settings(args.quick, args.overrides))  # validates first
        preset = "quick" if args.quick else "full"
        print(f"{args.name} settings ({preset} preset{', with --set' if args.overrides else ''};"
              " change with --set KEY=VALUE):")
        for line in lines:
            print(f"  {line}")
        return 0
    from dca_theory.io import failed_runs_discarded

    with failed_runs_discarded():  # a crash leaves no directory that looks like a run
        run_dir = mod.main(quick=args.quick, out=args.out, overwrite=args.overwrite,
                           overrides=args.overrides)
    print(f"results in {run_dir}")
    return 0


def _cmd_figures(args: argparse.Namespace) -> int:
    if args.experiments and not Path(args.results).is_dir():
        # Say so before drawing the theory figures: an installed package run outside a checkout
        # has no experiments/results of its own.
        raise FileNotFoundError(
            f"no saved results at {args.results}; pass --results DIR (a checkout's "
            "experiments/results) or run the experiments first (dca-theory run NAME)")
    make_all = bundled("figures").make_all
    for path in make_all(Path(args.out), Path(args.results), experiments=args.experiments):
        print(path)
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from dca_theory.theory.verify import main as verify_main

    return verify_main(as_json=args.json, quick=args.quick)


def _cmd_lm(args: argparse.Namespace) -> int:
    from dca_theory.lm.cli import main as lm_main

    return lm_main(args.lm_args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dca-theory",
        description="Check the theory of DeepCrossAttention (Heddes et al., ICML 2025), "
        "regenerate its figures and run its experiments.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("figures", help="regenerate figures (theory figures from closed forms)")
    p.add_argument("--out", default="figures/out", help="output folder (default: figures/out)")
    p.add_argument("--results", default="experiments/results",
                   help="saved experiment results (default: experiments/results)")
    p.add_argument("--experiments", action="store_true",
                   help="also draw the figures of saved experiment results")
    p.set_defaults(func=_cmd_figures)

    p = sub.add_parser("verify", help="numerically/symbolically check every Section 4 claim")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--quick", action="store_true", help="fewer random cases")
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser("run", help="run one experiment (see --list)")
    p.add_argument("name", nargs="?", help="experiment name, e.g. fig1")
    p.add_argument("--list", action="store_true", help="list experiments and exit")
    p.add_argument("--quick", action="store_true", help="small, fast version (under a minute)")
    p.add_argument("--out", default=None, help="run directory (default: experiments/results/NAME"
                   " or runs/NAME-quick)")
    p.add_argument("--overwrite", action="store_true", help="replace a finished run in --out")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="change one setting (repeatable; lists comma-separated, e.g. "
                   "--set widths=1,2,4 --set kinds=res,grn_v1); runs with --set default to "
                   "runs/NAME[-quick]-set-HASH and record the settings in config.json")
    p.add_argument("--show", action="store_true",
                   help="print the experiment's settings (with --quick/--set applied) and exit")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("lm", help="DCA transformer LM: train, eval, sample, info",
                       add_help=False)
    p.add_argument("lm_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_lm)
    return parser


def _attach_closed_streams() -> bool:
    """Point closed standard descriptors (``dca-theory ... >&-``) at /dev/null, so that no file
    opened later takes descriptor 1 and receives what is printed; True if stdout was closed."""
    closed = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.append(fd)
    for fd in closed:  # lowest first: os.open returns the lowest free descriptor
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
    if sys.stderr is None and 2 in closed:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (lives as long as the process)
    if sys.stdout is None and 1 in closed:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    return 1 in closed


def main(argv: list[str] | None = None) -> int:
    if _attach_closed_streams():  # before any work: its results would have nowhere to go
        return _fail("standard output is closed, so the results would be lost; redirect it "
                     "instead (e.g. >/dev/null or >out.txt)", 1)
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["lm"]:
        # argparse's REMAINDER drops a leading option ("lm --help"): hand lm its args verbatim
        args = argparse.Namespace(func=_cmd_lm, lm_args=argv[1:])
    else:
        args = parser.parse_args(argv)
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the handlers below
        return status
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        # One line naming the bad value; no traceback for user errors.
        return _fail(err, 2)
    except BrokenPipeError:
        # The reader went away (``| head``): detach stdout so the exit flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return _fail("output closed before it was all written (broken pipe)", 1)
    except OSError as err:  # permissions, full disk, read-only folders
        return _fail(err, 1)
    except MemoryError as err:
        return _fail(str(err) or "out of memory", 1)
    except KeyboardInterrupt:
        print("dca-theory: interrupted", file=sys.stderr)
        return 130


def _fail(err: BaseException | str, status: int) -> int:
    print(f"dca-theory: error: {str(err).splitlines()[0] if str(err) else type(err).__name__}",
          file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
