"""The distribution: what the wheel installs, how it finds experiments and figures, the version,
the licence and the citation.

The wheel must install one top-level name, ``dca_theory``, carrying ``experiments/`` and
``figures/`` inside it (``dca_theory.experiments``, ``dca_theory.figures``); a checkout keeps
them at the root as top-level packages. The default tests build the wheel in-process with
hatchling (under a second) and read it, and run its CLI from the unpacked wheel; the ``slow``
test builds the sdist and wheel with ``python -m build``, checks them with ``twine`` and runs
the CLI from a new virtual environment that pip fills from the index.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

import dca_theory
from dca_theory.cli import bundled, main

REPO = Path(__file__).resolve().parents[1]
BUNDLED = ("experiments", "figures")
# sha256 of the Apache License 2.0 as published (apache.org/licenses/LICENSE-2.0.txt)
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    from hatchling.builders.wheel import WheelBuilder

    out = tmp_path_factory.mktemp("wheel")
    (built,) = WheelBuilder(str(REPO)).build(directory=str(out), versions=["standard"])
    return Path(built)


def record_paths(record_text: str) -> list[str]:
    """The installed paths a wheel's RECORD lists (scripts live outside site-packages: ``..``)."""
    return [row[0] for row in csv.reader(io.StringIO(record_text)) if row]


def top_level_names(paths: list[str]) -> set[str]:
    """What a distribution puts directly into site-packages, less its own ``.dist-info``."""
    return {p.split("/")[0] for p in paths
            if not p.startswith("..") and not p.split("/")[0].endswith(".dist-info")}


def _dist_info(names: list[str], leaf: str) -> str:
    (path,) = [n for n in names if n.split("/")[0].endswith(".dist-info") and n.endswith(leaf)]
    return path


def test_wheel_installs_only_dca_theory(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        listed = record_paths(z.read(_dist_info(names, "/RECORD")).decode())
    assert top_level_names(names) == {"dca_theory"}
    assert top_level_names(listed) == {"dca_theory"}
    assert set(listed) == set(names)


def test_wheel_ships_every_experiment_and_figure_but_no_results(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in BUNDLED:
        sources = {f"dca_theory/{package}/{p.name}" for p in (REPO / package).glob("*.py")}
        shipped = {n for n in names if n.startswith(f"dca_theory/{package}/")}
        assert shipped == sources, sorted(shipped ^ sources)
    core = {f"dca_theory/{p.relative_to(REPO / 'dca_theory').as_posix()}"
            for p in (REPO / "dca_theory").rglob("*.py")}
    assert core <= names, sorted(core - names)


def test_wheel_metadata_names_version_licence_and_command(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(_dist_info(names, "/METADATA")).decode()
        entry_points = z.read(_dist_info(names, "/entry_points.txt")).decode()
        licence = z.read(_dist_info(names, "/licenses/LICENSE"))
    fields = dict(line.split(": ", 1) for line in meta.split("\n\n")[0].splitlines()
                  if ": " in line)
    assert fields["Version"] == dca_theory.__version__
    assert fields["License-Expression"] == "Apache-2.0"
    assert fields["License-File"] == "LICENSE"
    assert licence == (REPO / "LICENSE").read_bytes()
    assert "dca-theory = dca_theory.cli:main" in entry_points


def test_unpacked_wheel_finds_its_experiments_and_figures_inside_the_package(wheel, tmp_path):
    """The wheel's own layout, run from where it was unpacked (its dependencies come from this
    environment): experiments and figures load as ``dca_theory.*`` and every module imports."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    script = (
        "import sys\n"
        "import dca_theory\n"
        "from dca_theory.cli import bundled, main\n"
        f"assert dca_theory.__file__.startswith({str(site)!r}), dca_theory.__file__\n"
        "figs = bundled('figures')\n"
        "print(figs.__name__, len(figs.figure_modules()))\n"
        "status = main(['run', '--list'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('experiments', 'figures')))\n"
        "sys.exit(status)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    n_figures = len(list((REPO / "figures").glob("fig_*.py")))
    assert lines[0] == f"dca_theory.figures {n_figures}"
    assert any(line.startswith("rank_vs_width ") for line in lines)
    assert lines[-1] == "[]", "a top-level experiments/figures package was loaded"


def test_editable_install_puts_the_checkout_on_the_path(tmp_path):
    """An editable install is one .pth line naming the checkout, so the tests and the CLI see
    experiments and figures there as top-level packages, and nothing is copied."""
    from hatchling.builders.wheel import WheelBuilder

    (built,) = WheelBuilder(str(REPO)).build(directory=str(tmp_path), versions=["editable"])
    with zipfile.ZipFile(built) as z:
        names = z.namelist()
        (pth,) = [n for n in names if n.endswith(".pth")]
        assert z.read(pth).decode().splitlines() == [str(REPO)]
    assert top_level_names(names) == {pth}


def test_bundled_packages_of_a_checkout_are_the_folders_beside_the_package():
    for name in BUNDLED:
        assert Path(bundled(name).__file__) == REPO / name / "__init__.py"
    with pytest.raises(ValueError, match="'results'.*valid: experiments, figures"):
        bundled("results")


def test_a_foreign_experiments_package_is_refused_not_run(tmp_path):
    """A user's own top-level ``experiments`` first on the path is not taken for ours."""
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "__init__.py").write_text("raise SystemExit('ran the foreign one')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    done = subprocess.run([sys.executable, "-m", "dca_theory.cli", "run", "--list"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("dca-theory: error: ")
    assert f"found {tmp_path / 'experiments'} instead" in done.stderr


def test_version_flag_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"dca-theory {dca_theory.__version__}\n"


def test_licence_is_the_apache_2_text():
    """Word for word (the wheel's metadata test checks that pyproject names it)."""
    assert hashlib.sha256((REPO / "LICENSE").read_bytes()).hexdigest() == APACHE_2_SHA256


def test_citation_cites_this_version_and_the_paper():
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0"
    assert cff["type"] == "software"
    assert str(cff["version"]) == dca_theory.__version__
    assert cff["license"] == "Apache-2.0"
    (paper,) = cff["references"]
    assert paper["title"] == "DeepCrossAttention: Supercharging Transformer Residual Connections"
    assert [a["family-names"] for a in paper["authors"]] == [
        "Heddes", "Javanmard", "Axiotis", "Fu", "Bateni", "Mirrokni"]
    assert paper["year"] == 2025
    assert {"type": "other", "value": "arXiv:2502.06785"}.items() <= paper["identifiers"][0].items()


def _run(args: list, cwd: Path, timeout: int, env: dict | None = None) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{args}: {done.stderr[-2000:]}"
    return done.stdout


@pytest.mark.slow  # ~5 min: pip fills a new venv from the index (1.1 GB), then four CLI runs
def test_wheel_from_a_new_venv_runs_the_cli_and_installs_only_dca_theory(tmp_path):
    """What a user gets from ``pip install``: the sdist and wheel ``python -m build`` makes pass
    ``twine check``; the wheel, in a new venv (not editable, not from the checkout), draws the
    figures, verifies the theory, runs an experiment and trains the LM on a text file, writing
    everything under the working directory."""
    dist, venv, work = tmp_path / "dist", tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    _run([sys.executable, "-m", "build", "--outdir", dist, REPO], tmp_path, 600)
    assert _run([sys.executable, "-m", "twine", "check", *sorted(dist.iterdir())],
                tmp_path, 120).count("PASSED") == 2
    (whl,) = dist.glob("*.whl")
    _run([sys.executable, "-m", "venv", venv], tmp_path, 300)
    bin_dir = venv / "bin"
    _run([bin_dir / "pip", "install", whl], tmp_path, 1200)

    # a clean environment: nothing points at the checkout
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DCA_DATA_DIR")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    cli = bin_dir / "dca-theory"
    assert _run([cli, "--version"], work, 60, env) == f"dca-theory {dca_theory.__version__}\n"
    _run([cli, "figures", "--experiments", "--results", REPO / "experiments" / "results",
          "--out", "figs"], work, 900, env)
    drawn = {p.stem for p in (work / "figs").glob("*.png")}
    assert {"fig_thresholds", "fig_toy_fig1", "fig_lm_width"} <= drawn, sorted(drawn)
    assert len(drawn) >= len(list((REPO / "figures").glob("fig_*.py")))  # one or more each
    assert " 0 FAILED" in _run([cli, "verify"], work, 600, env)
    _run([cli, "run", "rank_vs_width", "--quick"], work, 600, env)
    assert (work / "runs" / "rank_vs_width-quick" / "summary.json").is_file()
    text = "\n".join(p.read_text() for p in sorted((REPO / "paper").glob("*.md")))[:60_000]
    (work / "corpus.txt").write_text(text)
    _run([cli, "lm", "train", "--preset", "tiny", "--data", "corpus.txt", "--steps", "20",
          "--workdir", "lm", "--no-progress"], work, 600, env)
    summary = json.loads((work / "lm" / "summary.json").read_text())
    assert summary["steps"] == 20 and math.isfinite(summary["valid_loss"])
    assert (work / "lm" / "checkpoints" / "20").is_dir()

    (site,) = venv.glob("lib/python*/site-packages")
    (record,) = site.glob("dca_theory-*.dist-info/RECORD")
    assert top_level_names(record_paths(record.read_text())) == {"dca_theory"}
    probe = "import importlib.util as u; print([n for n in ('experiments', 'figures') if " \
            "u.find_spec(n)])"
    assert _run([bin_dir / "python", "-c", probe], work, 60, env) == "[]\n"
    written = {p.name for p in (site / "dca_theory").rglob("*")} & {"runs", "out", "results"}
    assert not written, "the installed package wrote into site-packages"
