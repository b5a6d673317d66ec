"""Vision without engines: image parts checked at the door, which models read images (a
vision-language folder, a projector beside a GGUF), the launch flags, and the projector's
bytes in the footprint. The real engines read images in tests/test_vision_e2e.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gguf import GGUFWriter

from fitbox.box import serving
from fitbox.box.asks import candidate
from fitbox.box.facts import Contract, Facts
from fitbox.core.costs import Sizer
from fitbox.core.projector import projector_footprint
from fitbox.core.split import HOST, Placement
from fitbox.core.types import Footprint
from fitbox.engines.llama_server import EngineInfo
from fitbox.engines.llama_server import build_argv as llama_argv
from fitbox.engines.seam import Held, LaunchIntent
from fitbox.engines.tf import build_argv as tf_argv
from fitbox.errors import InvalidRequest
from fitbox.models.catalog import Artifact, scan
from fitbox.models.hf_folders import folder_facts
from fitbox.models.vision import is_vision_config, pair_projectors
from fitbox.server.door.bodies import check_images, images
from fitbox.store.db import Store

from .support.ggufs import write_tiny_llama, write_vision_projector
from .support.hf_models import (
    LLAMA,
    LLAMA_TENSORS,
    write_config,
    write_safetensors,
    write_tokenizer,
)
from .support.images import RED, STRIPES, data_url, noise

LIMIT = 64 << 10
CHAT = "/v1/chat/completions"


def check_vision(name: str, artifacts: list[Artifact], path: str, body: dict[str, Any]) -> None:
    """The model check on a body's images (the edge counts them, the box refuses)."""
    serving.check_vision(name, artifacts, path, len(list(images(path, body))))


def chat(*urls: Any) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "What is this?"}]
    parts += [
        {"type": "image_url", "image_url": url if isinstance(url, dict) else {"url": url}}
        for url in urls
    ]
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": parts},
        ],
    }


def refused(body: dict[str, Any]) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        check_images(CHAT, body, LIMIT)
    assert caught.value.param == "messages" and caught.value.status == 400
    return caught.value


def test_inline_images_pass_and_are_counted() -> None:
    assert check_images(CHAT, chat(data_url(RED), data_url(STRIPES, "image/x-png")), LIMIT) == 2
    assert check_images(CHAT, {"messages": [{"role": "user", "content": "text only"}]}, LIMIT) == 0


def test_an_http_image_is_refused_because_fitbox_never_fetches() -> None:
    for url in ("http://example.com/cat.png", "HTTPS://example.com/cat.png"):
        error = refused(chat(data_url(RED), url))
        assert error.code == "image_url_not_fetched"
        assert "messages[1] image 2" in error.message and "data URL" in error.message


@pytest.mark.parametrize(
    ("image_url", "code", "says"),
    [
        ({"url": "file:///etc/passwd"}, "invalid_image_url", "must be a data: URL"),
        ({"detail": "high"}, "invalid_image_url", "needs"),
        ({"url": "data:text/plain;base64,aGk="}, "invalid_image_url", "data:image/<type>;base64"),
        ({"url": "data:image/png,rawbytes"}, "invalid_image_url", "data:image/<type>;base64"),
        ({"url": "data:image/png;base64,not base64!"}, "invalid_image", "does not decode"),
        (
            {"url": data_url(b"GIF00a not an image")},
            "invalid_image",
            "not a PNG, JPEG, GIF or WebP",
        ),
    ],
)
def test_a_bad_image_part_says_what_is_wrong(image_url: Any, code: str, says: str) -> None:
    error = refused(chat(image_url))
    assert error.code == code and says in error.message


def test_an_image_over_the_limit_is_refused_decoded_or_not() -> None:
    big = noise(160, 160)  # ~77 KB of random pixels
    assert len(big) > LIMIT
    error = refused(chat(data_url(big)))
    assert error.code == "image_too_large" and "FITBOX_MAX_IMAGE" in error.message
    padded = data_url(RED) + "=" * 4  # small once decoded, long as text: decoded, then judged
    assert refused(chat({"url": padded})).code == "invalid_image"
    check_images(CHAT, chat(data_url(big)), len(big))  # exactly at the limit: taken


def test_webp_and_jpeg_are_recognised_by_their_bytes() -> None:
    webp = b"RIFF\x10\x00\x00\x00WEBPVP8 " + bytes(8)
    jpeg = b"\xff\xd8\xff\xe0" + bytes(8)
    body = chat(data_url(webp, "image/webp"), data_url(jpeg, "image/jpeg"))
    assert check_images(CHAT, body, LIMIT) == 2


def responses(image: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is this?"},
                    {"type": "input_image", **image},
                ],
            }
        ],
    }


def anthropic(source: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 8,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image", "source": source},
                ],
            }
        ],
    }


def test_the_responses_and_messages_shapes_are_held_to_the_same_rules() -> None:
    """llama-server fetches an http image in these shapes too (seen running this build)."""
    assert check_images("/v1/responses", responses({"image_url": data_url(RED)}), LIMIT) == 1
    encoded = data_url(RED).partition(",")[2]
    inline = anthropic({"type": "base64", "media_type": "image/png", "data": encoded})
    assert check_images("/v1/messages", inline, LIMIT) == 1
    cases = [
        (
            "/v1/responses",
            responses({"image_url": "https://example.com/cat.png"}),
            "input",
            "image_url_not_fetched",
        ),
        ("/v1/responses", responses({"file_id": "file-1"}), "input", "invalid_image_url"),
        (
            "/v1/messages",
            anthropic({"type": "url", "url": "http://10.0.0.1/x.png"}),
            "messages",
            "image_url_not_fetched",
        ),
        (
            "/v1/messages",
            anthropic({"type": "base64", "media_type": "image/png", "data": encoded[:-3] + "!!!"}),
            "messages",
            "invalid_image",
        ),
    ]
    for path, body, param, code in cases:
        with pytest.raises(InvalidRequest) as caught:
            check_images(path, body, LIMIT)
        assert (caught.value.param, caught.value.code) == (param, code), path
    with pytest.raises(InvalidRequest) as caught:  # it renders the images: it fetches too
        check_images("/apply-template", chat("http://example.com/cat.png"), LIMIT)
    assert caught.value.code == "image_url_not_fetched"
    assert check_images("/v1/completions", {"prompt": "https://example.com/cat.png"}, LIMIT) == 0


def _audio_projector(path: Path) -> Path:
    writer = GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_audio_encoder", True)
    writer.add_tensor("a.conv1d.weight", __import__("numpy").zeros((4, 4), dtype="float32"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_projector_beside_a_gguf_makes_it_a_vision_model(tmp_path: Path) -> None:
    one = tmp_path / "one"
    one.mkdir()
    write_tiny_llama(one / "a.gguf")
    write_tiny_llama(one / "b.gguf", seed=1)
    projector = write_vision_projector(one / "mmproj-a.gguf", n_embd_text=64)
    plain = tmp_path / "plain"
    plain.mkdir()
    write_tiny_llama(plain / "text.gguf", seed=2)
    _audio_projector(plain / "mmproj-audio.gguf")  # an audio encoder gives no eyes
    found, _ = scan([tmp_path])
    by_name = {a.name: a for a in found}
    assert sorted(by_name) == ["a", "b", "text"]  # projectors are never models
    assert by_name["a"].mmproj == by_name["b"].mmproj == projector  # one serves the folder
    assert by_name["a"].vision and by_name["a"].projector is not None
    assert by_name["a"].projector.n_embd == 128
    assert not by_name["text"].vision and by_name["text"].mmproj is None


def test_several_projectors_pair_by_name_and_a_tie_pairs_none() -> None:
    here = Path("/m")
    models = [here / "Qwen2-VL-2B-Q4_K_M.gguf", here / "gemma-3-4b-Q4_0.gguf", here / "x.gguf"]
    projectors = [here / "mmproj-Qwen2-VL-2B-f16.gguf", here / "gemma-3-4b-mmproj.gguf"]
    assert pair_projectors(models, projectors) == {
        models[0]: projectors[0],
        models[1]: projectors[1],
    }
    twins = [here / "mmproj-a-f16.gguf", here / "mmproj-a-f32.gguf"]
    assert pair_projectors([here / "a-Q4_0.gguf"], twins) == {}  # which one? not a guess
    assert pair_projectors([Path("/other/a.gguf")], twins) == {}  # another folder's


def test_vision_language_configs_are_known_by_architecture_or_vision_config() -> None:
    assert is_vision_config({"architectures": ["LlavaForConditionalGeneration"]})
    assert is_vision_config({"architectures": ["Idefics3ForConditionalGeneration"]})
    assert is_vision_config(
        {"architectures": ["NewVLForConditionalGeneration"], "vision_config": {"hidden_size": 8}}
    )
    assert not is_vision_config({"architectures": ["LlamaForCausalLM"]})
    assert not is_vision_config({"architectures": ["T5ForConditionalGeneration"]})
    assert not is_vision_config({"architectures": "LlavaForConditionalGeneration"})


def test_a_vision_language_folder_is_a_vision_model_and_a_plain_one_is_not(
    tmp_path: Path,
) -> None:
    llava = tmp_path / "llava"
    llava.mkdir()
    write_config(
        llava,
        {
            "architectures": ["LlavaForConditionalGeneration"],
            "model_type": "llava",
            "vision_config": {"hidden_size": 32},
            "text_config": {**LLAMA, "model_type": "llama"},
        },
    )
    write_safetensors(llava / "model.safetensors", LLAMA_TENSORS)
    plain = tmp_path / "plain"
    plain.mkdir()
    write_config(plain, LLAMA)
    write_safetensors(plain / "model.safetensors", LLAMA_TENSORS)
    write_tokenizer(llava)
    write_tokenizer(plain)
    assert folder_facts(llava).vision and not folder_facts(plain).vision
    found = {a.name: a for a in scan([tmp_path])[0]}
    assert found["llava"].vision and not found["plain"].vision


def _artifacts(tmp_path: Path) -> dict[str, Artifact]:
    write_tiny_llama(tmp_path / "text.gguf")
    eyes = tmp_path / "eyes"
    eyes.mkdir()
    write_tiny_llama(eyes / "seeing.gguf", seed=1)
    write_vision_projector(eyes / "mmproj-seeing.gguf", n_embd_text=64)
    return {a.name: a for a in scan([tmp_path])[0]}


def test_images_for_a_model_that_reads_none_are_refused_naming_the_way_out(
    tmp_path: Path,
) -> None:
    found = _artifacts(tmp_path)
    with pytest.raises(InvalidRequest) as caught:
        check_vision("text", [found["text"]], CHAT, chat(data_url(RED)))
    assert caught.value.code == "model_not_vision_capable" and "mmproj" in caught.value.message
    check_vision("text", [found["text"]], CHAT, {"messages": [{"role": "user", "content": "hi"}]})
    check_vision("seeing", [found["seeing"]], CHAT, chat(data_url(RED)))
    with pytest.raises(InvalidRequest) as caught:  # the placement might choose the blind one
        check_vision("family", [found["text"], found["seeing"]], CHAT, chat(data_url(RED)))
    assert "only seeing read" in caught.value.message
    with pytest.raises(InvalidRequest) as caught:
        check_vision("text", [found["text"]], "/v1/responses", responses({"image_url": "x"}))
    assert (caught.value.param, caught.value.code) == ("input", "model_not_vision_capable")


INFO = EngineInfo(Path("/bin/llama-server"), frozenset({"--mmproj", "--no-mmproj-offload"}), "1")


def intent(**kw: Any) -> LaunchIntent:
    return LaunchIntent(
        **{
            "model_path": Path("/m/a.gguf"),
            "alias": "a",
            "window": 512,
            "parallel": 1,
            "gpu_layers": 0,
            "port": 1,
            **kw,
        }
    )


def test_the_projector_is_launched_beside_the_model_and_kept_where_it_was_priced() -> None:
    mmproj = Path("/m/mmproj-a.gguf")
    in_ram = llama_argv(INFO, intent(mmproj=mmproj))
    assert in_ram[in_ram.index("--mmproj") + 1] == str(mmproj)
    assert "--no-mmproj-offload" in in_ram  # priced in RAM: never moved to a GPU unasked
    on_gpu = llama_argv(INFO, intent(mmproj=mmproj, gpu_layers=99, gpus=(0,)))
    assert "--mmproj" in on_gpu and "--no-mmproj-offload" not in on_gpu
    assert "--mmproj" not in llama_argv(INFO, intent())
    old = EngineInfo(Path("/bin/llama-server"), frozenset(), "1")  # a build without mtmd
    assert "--mmproj" not in llama_argv(old, intent(mmproj=mmproj))
    assert "--vision" in tf_argv(Path("/venv/python"), intent(vision=True))
    assert "--vision" not in tf_argv(Path("/venv/python"), intent())


def test_the_projector_joins_the_footprint_on_the_device_it_runs_on(tmp_path: Path) -> None:
    seeing = _artifacts(tmp_path)["seeing"]
    assert seeing.projector is not None
    extra = projector_footprint(seeing.projector)
    plain = Artifact(seeing.name, seeing.path, seeing.facts)  # the same file, no projector
    with_eyes = Sizer(candidate(seeing, []), 1, "f16", "f16")
    without = Sizer(candidate(plain, []), 1, "f16", "f16")
    for placement, device in (
        (Placement(), HOST),
        (Placement(("gpu0",), 99), "gpu0"),
        (Placement(("gpu0", "gpu1"), 99), "gpu0"),
    ):
        eyes, bare = with_eyes.on(placement, 512), without.on(placement, 512)
        assert eyes[device].weights - bare[device].weights == extra.weights > 0
        assert eyes[device].compute - bare[device].compute == extra.compute > 0
        assert {d: f for d, f in eyes.items() if d != device} == {
            d: f for d, f in bare.items() if d != device
        }
    whole = with_eyes.whole(512).total - without.whole(512).total
    assert whole == extra.weights + extra.compute


def test_a_measurement_from_before_a_projector_was_paired_prices_the_projector_too(
    tmp_path: Path,
) -> None:
    found = _artifacts(tmp_path)
    seeing = found["seeing"]
    assert seeing.projector is not None and seeing.mmproj is not None
    blind = Artifact(seeing.name, seeing.path, seeing.facts)  # before the projector was there
    extra = projector_footprint(seeing.projector)
    contract, held = Contract(512, 1), Held(weights=1000, kv=200, compute=300, output=40)
    measured = Footprint(1000, 200, 300, 40)

    def fits(artifact: Artifact, facts: Facts) -> Footprint | None:
        fitted = candidate(artifact, facts.of(artifact.identity(), 1))
        return fitted.measured_fit(HOST, 512, "f16", "f16")

    store = Store(tmp_path / "fitbox.sqlite3")
    try:
        facts = Facts(store)
        facts.footprint_measured(held, blind, HOST, contract, 1.0, None)
        assert fits(blind, facts) == measured
        # paired since: the measurement stands for the text model, the projector is added
        assert fits(seeing, facts) == Footprint(1000 + extra.weights, 200, 300 + extra.compute, 40)
        store.flush()
        # measured with it (the next load): as measured, and the store keeps which projector
        facts.footprint_measured(held, seeing, HOST, contract, 1.0, None)
        store.flush()
        reopened = Facts(store)
        assert fits(seeing, reopened) == measured
        paired = seeing.projector_identity()
        assert paired is not None and paired.startswith(f"{seeing.mmproj}|")
        assert [m.projector for m in reopened.measured.values()] == [paired]
        # the projector replaced (or taken away) since: that measurement prices neither
        write_vision_projector(seeing.mmproj, n_embd_text=64, n_layer=3)
        replaced = next(a for a in scan([tmp_path])[0] if a.name == "seeing")
        assert replaced.projector_identity() != paired
        assert fits(replaced, reopened) is None
        assert fits(blind, reopened) is None
    finally:
        store.close()
