"""What the central gives its own inference clients of a box's insider answers
(central/outsider.py): the box's paths and engine internals withheld, its routes and
everything else of the message kept."""

from __future__ import annotations

import json

from fitbox.central.outsider import PATH_WITHHELD, error_body, props_body, withhold_paths
from fitbox.errors import ModelNotFound, ModelNotServable
from fitbox.server.door.errors import body_for


def test_a_box_s_folders_are_withheld_and_its_routes_kept() -> None:
    said = (
        "The model 'x' does not exist on this box. Put its GGUF under /srv/models:/tmp/a b "
        "or run 'fitbox pull'. GET /v1/models lists them; /tokenize?model=NAME; see "
        "https://example.org/docs/a. Or under /home/u/models."
    )
    shown = withhold_paths(said)
    assert "/srv/models" not in shown and "/tmp/a" not in shown and "/home/u" not in shown
    assert shown.endswith(f"under {PATH_WITHHELD}.")
    assert "GET /v1/models lists" in shown and "/tokenize?model=NAME" in shown
    assert "https://example.org/docs/a" in shown


def test_an_insider_s_error_from_a_box_reaches_an_outsider_without_paths() -> None:
    """The body a box sends the central (an insider: its admin key), as the central's
    inference client gets it: the operator reason's path gone, the engine log withheld."""
    error = ModelNotServable.because(
        "m", "cannot read /srv/models/m.gguf (owner root, 0600)", unreadable=True
    )
    sent = body_for(error, insider=True)
    sent["error"]["log_tail"] = ["llama: loading /srv/models/m.gguf"]
    assert "/srv/models" in json.dumps(sent)
    shown = json.loads(error_body(json.dumps(sent).encode()))["error"]
    assert "/srv/models" not in json.dumps(shown)
    assert "log_tail" not in shown and shown["code"] == sent["error"]["code"]
    assert set(shown) == set(sent["error"]) - {"log_tail"}


def test_a_box_s_404_keeps_its_code_and_its_advice() -> None:
    sent = ModelNotFound("The model 'x' does not exist. Put its GGUF under /srv/m.").body()
    shown = json.loads(error_body(json.dumps(sent).encode()))
    assert shown["error"]["code"] == "model_not_found"
    assert (
        shown["error"]["message"]
        == f"The model 'x' does not exist. Put its GGUF under {PATH_WITHHELD}."
    )


def test_a_body_that_is_no_fitbox_error_passes_as_it_came() -> None:
    for raw in (b"not json", b"[1, 2]", b'{"detail": "x"}'):
        assert error_body(raw) == raw


def test_props_lose_the_model_s_path() -> None:
    shown = json.loads(props_body(json.dumps({"model_path": "/srv/m.gguf", "n_ctx": 4}).encode()))
    assert shown == {"n_ctx": 4}
