"""A stage package's public names, imported when first used: `import draftnas.search` stays as light
as its records (no torch, no optuna) until a caller reaches for `draftnas.search.search`."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, names: dict[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package` whose public `names` live in its modules
    (name -> module within the package)."""
    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    def __dir__() -> list[str]:
        return sorted(names)

    return __getattr__, __dir__
