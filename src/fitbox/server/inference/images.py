"""POST /v1/images/generations in OpenAI's shape, and the short-lived URLs of its images.

The client's fields are checked here, each refused by name when it cannot be honoured: an
empty prompt, ``n`` out of 1..10, a size the model cannot make (read from its folder's
files, models/task_models.py and the runner's ``rule_from_folder``, before the model is
placed: nothing is evicted for a call that cannot be served). The call is then served as a
task (server/inference/tasks.py). The runner answers in base64; each PNG is kept in the
artifact dir under a name of 128 random bits, recorded on the call row by its bytes and
sha256 (never that name: the row is readable by read keys, the name is a capability), and
the client gets it as ``b64_json`` or as a ``url`` fitbox serves itself
(``GET /v1/images/files/{name}``) behind the same key check as the call, until the artifact
dir's age limit (FITBOX_ARTIFACT_MAX_AGE) passes.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
from hashlib import sha256
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from fitbox.box.box import Box
from fitbox.engines.task_child.diffusers import MAX_STEPS, rule_from_folder
from fitbox.engines.task_child.replies import BadRequest
from fitbox.errors import EngineFailed, FitboxError, ImageExpired, InvalidRequest, StorageFailed
from fitbox.models.task_models import DIFFUSERS
from fitbox.server.door.artifacts import Artifacts
from fitbox.server.door.bodies import json_object
from fitbox.server.inference.openai import refused
from fitbox.server.inference.tasks import Keeper, Task, artifacts_of, serve_task

log = logging.getLogger(__name__)
FIELDS = frozenset({"model", "prompt", "n", "size", "response_format", "seed", "steps", "user"})
FORMATS = ("b64_json", "url")
N_MAX = 10  # OpenAI's own bound on n
PROMPT_MAX = 32000  # characters, OpenAI's largest (gpt-image-1)
SEED_MAX = 2**63 - 1
FILES_PATH = "/v1/images/files/"
_FILE = re.compile(r"^image-[0-9a-f]{32}\.png$")


def _integer(body: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRequest(
            f"'{name}' must be an integer from {low} to {high} (got {value!r}).",
            param=name,
            code="invalid_value",
        )
    return value


def _checked(box: Box, body: dict[str, Any]) -> dict[str, Any]:
    """The child's fields from the client's, each checked (``user`` is dropped: it names an
    end user for OpenAI's abuse monitoring, which a box has nothing to do with)."""
    extra = sorted(set(body) - FIELDS)
    if extra:
        raise InvalidRequest(
            f"POST /v1/images/generations cannot honour '{extra[0]}' here: fitbox's image "
            f"runner takes only {', '.join(sorted(FIELDS))}.",
            param=extra[0],
            code="unsupported_field",
        )
    body.pop("user", None)
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise InvalidRequest("Missing required field 'model'.", param="model")
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidRequest(
            "'prompt' is empty: say what the image should show.",
            param="prompt",
            code="empty_prompt",
        )
    if len(prompt) > PROMPT_MAX:
        raise InvalidRequest(f"'prompt' is longer than {PROMPT_MAX} characters.", param="prompt")
    n = _integer(body, "n", 1, N_MAX) or 1
    _integer(body, "seed", 0, SEED_MAX)
    _integer(body, "steps", 1, MAX_STEPS)
    fmt = body.setdefault("response_format", "b64_json")
    if fmt not in FORMATS:
        raise InvalidRequest(
            f"response_format '{fmt}' is not one of {', '.join(FORMATS)}.",
            param="response_format",
            code="unsupported_response_format",
        )
    _check_size(box, body["model"], body.get("size"))
    # the child's body says n as n_images: the box reads a body's n as the slots a chat call's
    # choices take (box/needs.py choices), and a task child has one; n_images is what the
    # box's ETA counts instead (box/serving.py max_tokens)
    body.pop("n", None)
    body["n_images"] = n
    return body


def _check_size(box: Box, model: str, size: object) -> None:
    """A size the named image model cannot make, refused with the sizes it can (a name the
    catalog does not know, or a model of another task, is the box's to refuse, as any)."""
    try:
        artifacts = [a for a in box.catalog.variants(model) if a.format == DIFFUSERS]
    except FitboxError:
        return
    for artifact in artifacts:
        try:
            rule = rule_from_folder(artifact.path)
        except (OSError, ValueError):
            continue  # its runner reads the folder itself, and says what it lacks
        try:
            rule.parse(size)
        except BadRequest as exc:
            raise InvalidRequest(str(exc), param="size", code="invalid_size") from None


def _keeper(request: Request, fmt: str) -> Keeper:
    """Each PNG of the runner's reply kept under an unguessable name, and the client's
    reply: each image as ``b64_json`` or as a URL to that name."""
    base = str(request.base_url).rstrip("/") + FILES_PATH

    def keep(content: bytes, artifacts: Artifacts) -> tuple[bytes, list[dict[str, Any]]]:
        try:
            reply = json.loads(content)
            items = [
                (item["b64_json"], base64.b64decode(item["b64_json"], validate=True))
                for item in reply["data"]
            ]
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise EngineFailed("the image runner's reply holds no base64 PNGs") from None
        records, data = [], []
        for index, (b64, png) in enumerate(items):
            output = artifacts.unguessable("png")
            output.write(png)
            record = output.close()
            if fmt == "url" and output.path is None:
                log.warning("%s cannot be written: an image URL was refused", artifacts.root)
                raise StorageFailed(  # its path is the operator's: the log says it
                    "The image could not be kept in the box's artifact dir, so it has no "
                    "URL; ask response_format b64_json, or free or fix that drive.",
                    param="response_format",
                    code="artifact_dir_unwritable",
                )
            url = base + output.name
            records.append({**record, "name": f"image-{index + 1}.png"})
            data.append({"url": url} if fmt == "url" else {"b64_json": b64})
        return json.dumps({"created": reply.get("created"), "data": data}).encode(), records

    return keep


async def generations(request: Request, engine: str) -> Response:
    body: dict[str, Any] = {}
    try:
        _, body = await json_object(request)
        body = _checked(request.app.state.box, body)
    except FitboxError as error:
        refused(request, engine, body, error)
        raise
    prompt = body["prompt"].encode()
    inputs = [
        {
            "role": "input",
            "name": "prompt",
            "bytes": len(prompt),
            "sha256": sha256(prompt).hexdigest(),
        }
    ]
    task = Task(
        engine,
        body,
        "png",
        inputs=inputs,
        outputs=_keeper(request, body["response_format"]),
        work=float(body["n_images"]),  # its ETA: images over the model's measured images/s
    )
    return await serve_task(request, task)


async def image_file(request: Request) -> Response:
    """An image a call kept, by the name its URL carries, while the artifact dir keeps it."""
    name = request.path_params["name"]
    path = artifacts_of(request).path_of(name) if _FILE.match(name) else None
    try:  # read whole (a PNG of a few MB at most): a prune cannot cut it off mid-send
        png = await run_in_threadpool(path.read_bytes) if path is not None else None
    except OSError:
        png = None
    if png is None:
        raise ImageExpired(
            f"No image '{name}' is kept here: an image URL lives FITBOX_ARTIFACT_MAX_AGE "
            "seconds, and the oldest go first past FITBOX_ARTIFACT_MAX."
        )
    return Response(png, media_type="image/png", headers={"cache-control": "private"})
