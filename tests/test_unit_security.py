"""The units `fitbox install --system` writes (and so the .deb, whose postinst runs it),
rated by `systemd-analyze security --offline=true`: OK or better, every exposure left
justified by a comment in the unit that names it. Before the sandbox (installer/hardening.py)
fitbox.service was rated 8.0 EXPOSED."""

from __future__ import annotations

from pathlib import Path

from fitbox.installer.central_role import central_layout, render_central_unit
from fitbox.installer.units import render_unit, service_layout

from .support.unit_security import GOOD_LEVELS, rate, unjustified

PYTHON = "/opt/fitbox/venv/bin/python"


def test_the_box_s_unit_is_rated_ok_and_every_exposure_is_justified(tmp_path: Path) -> None:
    text = render_unit(service_layout("system"), PYTHON)
    (tmp_path / "fitbox.service").write_text(text)
    rating = rate(tmp_path / "fitbox.service")
    assert rating.level in GOOD_LEVELS and rating.exposure < 5.0, rating
    assert unjustified(text, rating) == []
    # what it must still do: reach GPUs (NVML, CUDA) and nothing else of /dev
    assert "DevicePolicy=closed" in text
    assert "DeviceAllow=char-nvidia-frontend rw" in text
    assert "DeviceAllow=char-nvidia-uvm rw" in text
    assert "PrivateDevices=yes" not in text


def test_the_central_s_unit_is_rated_ok_and_has_no_devices(tmp_path: Path) -> None:
    text = render_central_unit(central_layout("system"), PYTHON)
    (tmp_path / "fitbox-central.service").write_text(text)
    rating = rate(tmp_path / "fitbox-central.service")
    assert rating.level in GOOD_LEVELS, rating
    assert unjustified(text, rating) == []
    assert "PrivateDevices=yes" in text and "DeviceAllow=" not in text
