"""Where wb.yaml and WB_HOME are, without reading wb.yaml when there is none.

The receiver's hot path (status, await, list, logs, stop) needs only the home. When no
wb.yaml exists, `load_config` would resolve it from WB_HOME or ~/.wb and could refuse
nothing, so `configured_home` answers that without importing yaml or the config models;
when the file exists, it is read by `load_config` exactly as before (same refusals).
"""

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


def configured_home() -> Path:
    """agents.home as `load_config().home` resolves it (raising what it raises)."""
    path = config_path()
    if not path.exists():
        return default_home()
    from courier.config import load_config

    return load_config(path).home
