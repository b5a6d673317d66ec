"""The pieces of a task call that need no engine: the catalog's recognisers, the multipart
parser and its spool, the artifact dir's pruning, the runner environments' states, and the
whisper runner's subtitle stamps (the child's modules are stdlib where these run)."""

from __future__ import annotations

import ast
import hashlib
import json
import os
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from fitbox.engines.task_child.whisper import srt, stamp, vtt
from fitbox.engines.task_envs import BUILT_FROM, extra_requirements, state_of
from fitbox.engines.task_runners import runner_named
from fitbox.errors import FitboxError
from fitbox.models.catalog import scan
from fitbox.models.task_models import FORMATS, PIPER, WHISPER, voices
from fitbox.server.door.artifacts import Artifacts
from fitbox.server.door.uploads import read_form


def test_task_models_are_recognised_by_their_files(tmp_path: Path) -> None:
    whisper = tmp_path / "whisper-small"
    whisper.mkdir()
    for name in ("model.bin", "config.json", "vocabulary.json"):
        (whisper / name).write_bytes(b"x" * 100)
    (tmp_path / "voice.onnx").write_bytes(b"y" * 50)
    (tmp_path / "voice.onnx.json").write_text(json.dumps({"speaker_id_map": {"b": 1, "a": 0}}))
    (tmp_path / "lonely.onnx").write_bytes(b"z")  # no .onnx.json: not a voice
    found, rejected = scan([tmp_path])
    by_name = {a.name: a for a in found}
    assert set(by_name) == {"whisper-small", "voice"} and rejected == []
    assert (by_name["whisper-small"].format, by_name["whisper-small"].task) == (
        WHISPER,
        "transcription",
    )
    assert by_name["voice"].task == "speech"
    priced = by_name["voice"].facts.shape.weights_bytes
    assert (
        priced
        == 50 + len((tmp_path / "voice.onnx.json").read_bytes()) + FORMATS[PIPER].runner_bytes
    )
    assert voices(tmp_path / "voice.onnx") == ("a", "b")  # by speaker id


def _form_app(spool: Path, limit: int) -> Starlette:
    async def upload(request: Request) -> Response:
        try:
            form = await read_form(request, spool, limit)
        except FitboxError as error:
            return JSONResponse(error.body(), status_code=error.status)
        files = {
            k: [u.filename, u.size, u.sha256, u.path.read_bytes().decode()]
            for k, u in form.files.items()
        }
        form.remove()
        return JSONResponse({"fields": form.fields, "files": files})

    return Starlette(routes=[Route("/", upload, methods=["POST"])])


def test_a_form_is_spooled_hashed_and_removed(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    client = TestClient(_form_app(spool, 1000))
    sent = client.post(
        "/",
        data={"model": "m", "language": "en"},
        files={"file": ("a b.wav", b"--not a boundary\r\n" * 3)},
    )
    body = sent.json()
    assert body["fields"] == {"model": ["m"], "language": ["en"]}
    name, size, digest, content = body["files"]["file"]
    assert (name, size, content) == ("a b.wav", 54, "--not a boundary\r\n" * 3)
    assert digest == hashlib.sha256(content.encode()).hexdigest()
    assert not any(spool.iterdir())


@pytest.mark.parametrize(
    ("body", "headers", "status", "code"),
    [
        (b"{}", {"content-type": "application/json"}, 400, "not_multipart"),
        (
            b'--B\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\nabc',
            {"content-type": "multipart/form-data; boundary=B"},
            400,
            "truncated_body",
        ),
        (
            b'--B\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\n'
            + b"x" * 2000
            + b"\r\n--B--\r\n",
            {"content-type": "multipart/form-data; boundary=B"},
            413,
            "upload_too_large",
        ),
    ],
)
def test_a_bad_form_is_refused_and_leaves_nothing(
    tmp_path: Path, body: bytes, headers: dict[str, str], status: int, code: str
) -> None:
    spool = tmp_path / "spool"
    refused = TestClient(_form_app(spool, 1000)).post("/", content=body, headers=headers)
    assert (refused.status_code, refused.json()["error"]["code"]) == (status, code)
    assert not spool.exists() or not any(spool.iterdir())


def test_the_artifact_dir_keeps_what_is_young_and_fits(tmp_path: Path) -> None:
    writing = Artifacts(tmp_path / "artifacts", max_age=10**12, max_bytes=1 << 30)
    for call in (1, 2, 3, 4):
        out = writing.output(call, "wav")
        out.write(b"x" * 10)
        row = out.close()
        assert row["bytes"] == 10 and len(row["sha256"]) == 64
    for call, when in ((1, 0.0), (2, 500.0), (3, 900.0), (4, 950.0)):
        os.utime(writing.root / f"call-{call}.wav", (when, when))
    kept = Artifacts(writing.root, max_age=100, max_bytes=25)
    removed = kept.prune(now=1000.0)
    names = sorted(p.name for p in removed)
    assert names == ["call-1.wav", "call-2.wav"]  # older than 100 s
    assert kept.path_of("call-4.wav", now=1000.0) is not None and kept.path_of("../x") is None
    small = Artifacts(kept.root, max_age=10_000, max_bytes=15)
    assert [p.name for p in small.prune(now=1000.0)] == ["call-3.wav"]  # the oldest goes


def test_an_environment_is_ready_only_when_built_from_todays_list(tmp_path: Path) -> None:
    spec = runner_named("piper")
    assert state_of(tmp_path, spec).state == "missing"
    env = tmp_path / spec.name
    env.mkdir()
    (env / BUILT_FROM).write_text("piper-tts==0.1\n")
    assert state_of(tmp_path, spec).reason == "built from another requirement list"
    (env / BUILT_FROM).write_text("\n".join(extra_requirements(spec.extra)) + "\n")
    assert state_of(tmp_path, spec).state == "ready"
    (tmp_path / f"{spec.name}.failed").write_text(
        json.dumps({"requirements": extra_requirements(spec.extra), "reason": "no wheel"})
    )
    assert state_of(tmp_path, spec).state == "ready"  # a later good build stands
    (env / BUILT_FROM).unlink()
    failed = state_of(tmp_path, spec)
    assert (failed.state, failed.reason) == ("failed", "no wheel")
    (tmp_path / f"{spec.name}.building-{os.getpid()}").mkdir()
    assert state_of(tmp_path, spec).state == "building"


def test_subtitles_stamp_their_segments() -> None:
    assert stamp(3725.5, ",") == "01:02:05,500"
    segments = [
        {"start": 0.0, "end": 1.25, "text": " Hello."},
        {"start": 1.25, "end": 2.0, "text": " Bye."},
    ]
    assert (
        srt(segments)
        == "1\n00:00:00,000 --> 00:00:01,250\nHello.\n\n2\n00:00:01,250 --> 00:00:02,000\nBye.\n"
    )
    assert vtt(segments).startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.250\nHello.\n")


def test_runner_packages_are_imported_only_in_the_task_child() -> None:
    """piper-tts is GPL-3.0 and every runner's packages live in its own environment: no
    module of fitbox imports them but the task child's runners (run in that environment)."""
    src = Path(__file__).resolve().parents[1] / "src" / "fitbox"
    child = src / "engines" / "task_child"
    runner_packages = {"piper", "faster_whisper", "ctranslate2", "onnxruntime", "soundfile", "av"}
    found = []
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            if any(n.split(".")[0] in runner_packages for n in names):
                found.append(path)
    assert found and all(child in p.parents for p in found), found
