"""Import litellm on first use, offline and quiet.

Below both `litellm` (the client) and `catalog` (model facts), so the catalog reads
litellm's model map without importing the client module.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any

__all__ = ("load_litellm",)


def load_litellm() -> ModuleType:
    """Import litellm on first use, offline and quiet.

    `LITELLM_LOCAL_MODEL_COST_MAP` keeps litellm from fetching its price map over the
    network at import time (a caller may still set it to something else beforehand).
    Returned as a `ModuleType` so mypy does not type-check litellm itself.
    """
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = importlib.import_module("litellm")
    # Global litellm setting, set here once: stop litellm from printing its "Provider List"
    # and debugging banners to stdout on every failure. turnkit raises its own errors.
    settings: Any = litellm  # a module attribute mypy cannot see on ModuleType
    settings.suppress_debug_info = True
    return litellm
