"""The ``public-api`` directive: autodoc entries for the public names of ``dca_theory``.

The names are ``dca_theory.__all__`` when the package defines it (the curated public API), else
the main modules listed in ``FALLBACK_MODULES``. Each name becomes the autodoc directive that
fits its object (module, class, function or data), so the reference follows the package
without a hand-kept list of entries.
"""

from __future__ import annotations

import importlib
import inspect

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

PACKAGE = "dca_theory"
FALLBACK_MODULES = (
    "dca_theory.residual",
    "dca_theory.schemes",
    "dca_theory.gates",
    "dca_theory.theory",
    "dca_theory.nets",
    "dca_theory.sim",
    "dca_theory.lm.config",
    "dca_theory.lm.model",
    "dca_theory.lm.train",
    "dca_theory.vit.config",
    "dca_theory.vit.model",
)


def public_entries() -> list[tuple[str, str]]:
    """(autodoc directive, dotted name) for every public name, in the order given."""
    package = importlib.import_module(PACKAGE)
    names = getattr(package, "__all__", None)
    if names is None:
        return [("automodule", name) for name in FALLBACK_MODULES]
    entries = []
    for name in names:
        if name.startswith("__"):  # __version__ and friends are not API entries
            continue
        obj = getattr(package, name)
        if inspect.ismodule(obj):
            kind = "automodule"
        elif inspect.isclass(obj):
            kind = "autoclass"
        elif callable(obj):
            kind = "autofunction"
        else:
            kind = "autodata"
        entries.append((kind, f"{PACKAGE}.{name}"))
    return entries


class PublicAPI(SphinxDirective):
    """Expands to one autodoc directive per public name (with members for modules/classes)."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        lines = []
        for kind, name in public_entries():
            lines.append(f".. {kind}:: {name}")
            if kind in ("automodule", "autoclass"):
                lines.append("   :members:")
            lines.append("")
        content = StringList(lines, source="public_api")
        section = nodes.section()
        section.document = self.state.document
        nested_parse_with_titles(self.state, content, section)
        return section.children


def setup(app):
    app.add_directive("public-api", PublicAPI)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
