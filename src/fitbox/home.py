"""What lives in fitbox's data dir (FITBOX_HOME), named once for `serve` and `install`.

`serve` reads it through config.Config; `install` makes it through installer/units.py's
ServiceLayout. A file that moves here moves for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Home:
    path: Path

    @property
    def store(self) -> Path:
        return self.path / "fitbox.sqlite3"

    @property
    def box_key(self) -> Path:
        return self.path / "box.key"

    @property
    def central_secret(self) -> Path:
        """The box's proof of identity at its central, minted there at its first join
        (central/identity.py); mode 0600 like the box key."""
        return self.path / "central.secret"

    @property
    def identity(self) -> Path:
        """The box's id with where it was made (server/manage/box_identity.py)."""
        return self.path / "identity.json"

    @property
    def endpoint(self) -> Path:
        """Written by a serving fitbox: the url, host, port and pid it answers on."""
        return self.path / "endpoint.json"

    @property
    def logs(self) -> Path:
        """The engine children's own logs, one file per launch."""
        return self.path / "logs"

    @property
    def spool(self) -> Path:
        """Task calls' uploads while their call runs (removed after it, whatever happens)."""
        return self.path / "spool"

    @property
    def artifacts(self) -> Path:
        """Task calls' outputs, pruned by age and size (FITBOX_ARTIFACT_MAX_AGE, _MAX)."""
        return self.path / "artifacts"

    @property
    def engines(self) -> Path:
        """Engine environments fitbox builds when no engine dir is set (``tf/``: the
        transformers engine's venv, from ``fitbox install --tf``)."""
        return self.path / "engines"

    @property
    def tf_support(self) -> Path:
        """What the transformers engine's transformers loads, as its probe found it: the
        catalog judges folders by it (models/folder_judge.py)."""
        return self.path / "tf-capabilities.json"

    @property
    def models(self) -> Path:
        """The model root when FITBOX_MODELS names none; pulls land here."""
        return self.path / "models"

    @property
    def facts_cache(self) -> Path:
        return self.path / "cache" / "gguf-facts.json"

    @property
    def aliases(self) -> Path:
        return self.path / "aliases.toml"


@dataclass(frozen=True)
class CentralHome:
    """A central's data dir: its own store and endpoint file, never a box's."""

    path: Path

    @property
    def store(self) -> Path:
        return self.path / "central.sqlite3"

    @property
    def endpoint(self) -> Path:
        return self.path / "central-endpoint.json"


def default_home() -> Path:
    """A user's data dir when FITBOX_HOME is not set (a system install sets it)."""
    import platformdirs

    return Path(platformdirs.user_data_dir("fitbox", appauthor=False))


def make_private(path: Path) -> None:
    """Make the folder ``path`` owner-only if it is made here (its parents as usual). One
    that exists keeps its mode: a system install gives its home 0710, so the fitbox group
    may pass through to the model store (installer/install.py)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
