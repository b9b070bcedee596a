"""Old module paths kept importable: ``import ggmlpy.<old>`` gives the module that now holds the code.

Three modules were renamed so that names say what they hold; their old paths still work, both as
``import ggmlpy.test_backend_ops`` and as attributes (``ggmlpy.test_backend_ops.compare_graph``):

* ``ggmlpy.test_backend_ops`` -> :mod:`ggmlpy.testops` (a ``test_*.py`` file inside the package
  would be collected by pytest);
* ``ggmlpy.compare`` -> :mod:`ggmlpy.backend_compare` (``graph_copy``, ``compare_graph_backend``);
* ``ggmlpy.testops.graph_compare`` -> :mod:`ggmlpy.testops.divergence` (the first-divergence finder).

A meta-path finder maps the old name to the new module when it is first imported, so nothing is
loaded before it is asked for (``import ggmlpy`` stays cheap). The alias is the same module
object: ``ggmlpy.compare is ggmlpy.backend_compare``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

__all__ = ["ALIASES", "install"]

#: old module name -> module that now holds the code.
ALIASES: dict[str, str] = {
    "ggmlpy.test_backend_ops": "ggmlpy.testops",
    "ggmlpy.compare": "ggmlpy.backend_compare",
    "ggmlpy.testops.graph_compare": "ggmlpy.testops.divergence",
}


class _AliasLoader(importlib.abc.Loader):
    """Loads an alias by importing the real module and returning that same object."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        pass  # already executed under its real name


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds the names in :data:`ALIASES` (and nothing else)."""

    def find_spec(self, fullname: str, path: object, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        real = ALIASES.get(fullname)
        if real is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(real))


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` once (called by ``ggmlpy/__init__``)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
