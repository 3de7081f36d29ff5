"""Where wb.yaml and WB_HOME are by default; imports nothing of wb's (the receiver's hot path uses it)."""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "WB_HOME"


def config_path() -> Path:
    explicit = os.environ.get("WB_CONFIG")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg) if xdg else Path.home() / ".config"
    return base / "wb" / "wb.yaml"


def default_home() -> Path:
    """WB_HOME when set, else ~/.wb: what agents.home falls back to."""
    from_env = os.environ.get(HOME_ENV)
    return Path(os.path.expanduser(from_env)) if from_env else Path.home() / ".wb"
