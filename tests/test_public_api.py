"""The public API: the names ``dca_theory.__all__`` promises resolve, are documented where they
are defined, and load lazily, so that ``import dca_theory`` does not load JAX."""

from __future__ import annotations

import inspect
import subprocess
import sys
import types

import pytest

import dca_theory

PUBLIC = [n for n in dca_theory.__all__ if n != "__version__"]


def own_docstring(obj) -> str:
    """The docstring written for ``obj`` itself: not one a class inherits, nor the signature
    a dataclass writes when it has none."""
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else obj.__doc__
    doc = (doc or "").strip()
    if isinstance(obj, type) and doc.startswith(f"{obj.__name__}("):
        return ""
    return doc


def test_public_names_are_unique_and_listed_by_dir():
    assert len(set(dca_theory.__all__)) == len(dca_theory.__all__)
    assert set(dca_theory.__all__) <= set(dir(dca_theory))


@pytest.mark.parametrize("name", PUBLIC)
def test_public_name_resolves_to_a_documented_object_of_its_module(name):
    obj = getattr(dca_theory, name)
    home = dca_theory._PUBLIC[name]
    if isinstance(obj, types.ModuleType):
        assert obj.__name__ == f"{home}.{name}"
    else:
        assert obj.__module__ == home or obj.__module__.startswith(home + "."), obj.__module__
        assert obj.__name__ == name  # exported under the name it is defined with
    assert inspect.isclass(obj) or callable(obj) or isinstance(obj, types.ModuleType)
    assert own_docstring(obj), f"dca_theory.{name} has no docstring of its own"


def test_docstring_check_rejects_a_bare_dataclass():
    import dataclasses

    @dataclasses.dataclass
    class Bare:
        x: int = 0

    assert own_docstring(Bare) == ""


def test_unknown_name_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="'no_such_name'"):
        dca_theory.no_such_name  # noqa: B018


def test_import_loads_no_jax_and_the_theory_names_load_none_either():
    """``dca-theory figures`` and ``verify`` import the package: it must stay light. The
    theory's closed forms are numpy/scipy; a model class is what first loads JAX."""
    script = (
        "import sys\n"
        "import dca_theory\n"
        "heavy = lambda: sorted(m for m in ('jax', 'numpy', 'equinox') if m in sys.modules)\n"
        "print(heavy())\n"
        "dca_theory.gain_lower_bound, dca_theory.Scheme, dca_theory.schemes\n"
        "print(heavy())\n"
        "dca_theory.GRNv3\n"
        "print(heavy())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "['numpy']", "['equinox', 'jax', 'numpy']"]
