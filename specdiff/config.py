"""The user's config file: ``~/.config/specdiff/config.toml`` (the platform's config dir).

Known keys: ``theme = "NAME"`` (the TUI's default theme) and ``sessions_dir = "PATH"``
(where sessions are saved and listed when ``--sessions-dir`` is not given).
"""

from __future__ import annotations

from pathlib import Path

from specdiff.errors import SpecdiffError, did_you_mean

KNOWN_KEYS = ("theme", "sessions_dir")


class ConfigError(SpecdiffError):
    """The config file cannot be used."""


def config_path() -> Path:
    import platformdirs

    return Path(platformdirs.user_config_dir("specdiff")) / "config.toml"


def read_config() -> dict[str, str]:
    """The file's settings; an empty dict when there is no file."""
    from specdiff.lanes import tomllib

    path = config_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path}: cannot read the config file ({error})") from None
    settings: dict[str, str] = {}
    for key, value in data.items():
        if key not in KNOWN_KEYS:
            raise ConfigError(
                f"{path}: unknown setting {key!r}; {did_you_mean(key, KNOWN_KEYS)}known: "
                f"{', '.join(KNOWN_KEYS)}"
            )
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{path}: {key} must be a non-empty string, got {value!r}")
        settings[key] = value
    return settings


def config_value(key: str) -> str | None:
    return read_config().get(key)
