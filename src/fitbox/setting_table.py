"""The settings table: every setting fitbox has, declared once (name, environment variable,
default, help, how its text is read, its command-line flag, the settings API scopes it may be
set in and how its JSON value there is read). It drives config.load (environment and command
line), the flags of the commands that take settings (fitbox.cli), the knobs of the settings
API (box/preferences.py) and docs/reference/settings.md (``fitbox settings --markdown``; a
test keeps it current). A knob with no environment variable is set only through the API."""

from __future__ import annotations

import json

from fitbox import setting_api as api
from fitbox import setting_values as values
from fitbox.networks import DEFAULT_TRUSTED_NETWORKS, parse_networks
from fitbox.setting_central import CENTRAL
from fitbox.setting_connections import CONNECTIONS
from fitbox.setting_tasks import TASKS
from fitbox.setting_values import BOX, KEY, LIMITS, PAIR, Setting

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "home",
        "FITBOX_HOME",
        "",
        "data dir (store, endpoint.json, logs, models); default: the platform's user data dir",
        flag="--home DIR",
    ),
    Setting(
        "models",
        "FITBOX_MODELS",
        "",
        "model roots, os.pathsep-separated; default: <data dir>/models",
        values.paths,
        flag="--models DIR",
    ),
    Setting("host", "FITBOX_HOST", "127.0.0.1", "address to listen on", flag="--host"),
    Setting(
        "port",
        "FITBOX_PORT",
        "8484",
        "port to listen on, or 'auto' for a free one",
        values.port,
        flag="--port",
    ),
    Setting(
        "ram_max",
        "FITBOX_RAM_MAX",
        "",
        "cap on host RAM fitbox may fill with models (e.g. 8GiB); default: MemAvailable",
        values.optional_size,
        flag="--ram-max",
        scopes=(LIMITS,),
        api=api.size,
    ),
    Setting(
        "vram_max",
        "FITBOX_VRAM_MAX",
        "",
        "cap on each GPU's memory fitbox may fill (e.g. 20GiB); default: what the GPU has",
        values.optional_size,
        scopes=(LIMITS,),
        api=api.size,
    ),
    Setting(
        "cpu_max",
        "FITBOX_CPU_MAX",
        "",
        "cap on the physical cores fitbox may claim for engines; default: all but one",
        values.optional_positive_int,
        scopes=(LIMITS,),
        api=api.number(1, 4096, integer=True),
    ),
    Setting(
        "storage_max",
        "FITBOX_STORAGE_MAX",
        "",
        "cap on the model store's drive that pulls may fill (e.g. 500GiB); reported in limits",
        values.optional_size,
        scopes=(LIMITS,),
        api=api.size,
    ),
    Setting(
        "transfer_max",
        "FITBOX_TRANSFER_MAX",
        "4",
        "files this box sends to other boxes at once (GET /v1/transfer/…/file); one more is "
        "answered 429 with Retry-After",
        values.positive_int,
    ),
    Setting(
        "drive_roles",
        "FITBOX_DRIVE_ROLES",
        "",
        "roles of the drives holding model roots, DIR=ROLE comma-separated: central (source "
        "of record, never reaped), worker (loads read from it, within storage_max), immutable "
        "(read in place, never written); unset: read-only is immutable, the first model "
        "root's drive is the worker, the others central",
        values.drive_roles,
    ),
    Setting(
        "movers",
        "FITBOX_MOVERS",
        "",
        "movers to turn on, comma-separated (each is off unless named): reap_to_fit (remove "
        "the least recently called worker copies that have an exact twin on a central drive "
        "when a pull or an upload needs room), upload_to_worker (a call's model on a central "
        "drive is copied to the worker drive before it loads), copy_to_central (a model only "
        "on the worker drive is copied to a central drive after its first load)",
        values.movers,
    ),
    Setting(
        "reasoning_field",
        "",
        '"reasoning_content"',
        "where a model's thinking goes in a reply: reasoning_content, reasoning, or none (left "
        "in the content)",
        scopes=(BOX, KEY),
        api=api.reasoning_field,
        kind="one of reasoning_content, reasoning, none",
    ),
    Setting(
        "progress",
        "",
        "false",
        "a streamed call that waits for a model to load sees progress chunks",
        scopes=(BOX, KEY),
        api=api.flag,
        kind="true or false",
    ),
    Setting(
        "rungs",
        "",
        json.dumps(list(api.ALL_RUNGS)),
        "the rungs (placements) this model may use",
        scopes=(PAIR,),
        api=api.rungs,
        kind="list of rungs",
    ),
    Setting(
        "quant",
        "",
        "null",
        "only this variant of the model (e.g. Q4_K_M); null: any",
        scopes=(PAIR,),
        api=api.quant,
        kind="quant name",
    ),
    Setting(
        "goal",
        "FITBOX_GOAL",
        "quality",
        "what placement optimises: quality (best variant), fast (shortest measured time), "
        "resident (keep hot models loaded)",
        values.choice("quality", "fast", "resident"),
        scopes=(BOX, PAIR),
        api=api.goal,
    ),
    Setting(
        "band",
        "",
        "1",
        "priority band: how much evicting this model costs, 1..100",
        scopes=(PAIR,),
        api=api.number(1, 100, integer=True),
        kind="integer 1..100",
    ),
    Setting(
        "max_wait",
        "FITBOX_WAIT_TIMEOUT",
        "300",
        "seconds a call may wait for busy models to free room",
        values.positive_float,
        scopes=(BOX, PAIR),
        api=api.number(0.1, 3600),
    ),
    Setting(
        "window",
        "FITBOX_CTX",
        "4096",
        "context window each model is loaded with (capped at its training context)",
        values.positive_int,
        scopes=(BOX, PAIR),
        api=api.number(256, 1 << 24, integer=True),
    ),
    Setting(
        "kv_types",
        "FITBOX_KV_TYPES",
        "f16",
        "K/V cache types to try, preferred first (e.g. f16,q8_0: q8_0 when f16 does not fit)",
        values.kv_types,
        scopes=(BOX, PAIR),
        api=api.kv,
    ),
    Setting(
        "preload",
        "",
        "false",
        "load this model at start",
        scopes=(PAIR,),
        api=api.flag,
        kind="true or false",
    ),
    Setting(
        "pinned",
        "",
        "false",
        "never evict this model; it is loaded at start",
        scopes=(PAIR,),
        api=api.flag,
        kind="true or false",
    ),
    Setting(
        "idle_ttl",
        "",
        "0.0",
        "unload a model after this many idle seconds (0: never)",
        scopes=(BOX, PAIR),
        api=api.number(0, 7 * 86400),
        kind="seconds, 0..604800",
    ),
    Setting(
        "embeddings",
        "",
        "false",
        "a decoder serves mean-pooled embeddings too, from its next load",
        scopes=(BOX, PAIR),
        api=api.flag,
        kind="true or false",
    ),
    Setting(
        "admission",
        "FITBOX_ADMISSION",
        "eta",
        "order of calls waiting for room: eta, smart (batch by model) or fifo",
        values.choice("eta", "smart", "fifo"),
        scopes=(BOX,),
        api=api.admission,
    ),
    Setting(
        "cpu_floor",
        "FITBOX_CPU_FLOOR",
        "1",
        "free physical cores a model with weights in RAM needs before it is loaded",
        values.positive_int,
        scopes=(BOX,),
        api=api.number(1, 1024, integer=True),
    ),
    Setting(
        "simulated_gpus",
        "FITBOX_SIMULATED_GPUS",
        "",
        "declare a SIMULATED GPU inventory instead of reading NVML, e.g. 24GiB,24GiB",
    ),
    Setting("engine_dir", "FITBOX_ENGINE_DIR", "", "a directory holding llama-server"),
    Setting(
        "tf_python",
        "FITBOX_TF_PYTHON",
        "",
        "the Python (with torch and transformers) the transformers engine runs under, tried "
        "first; default: <engine dir>/tf, then others (fitbox engines lists them)",
    ),
    Setting(
        "parallel",
        "FITBOX_PARALLEL",
        "4",
        "llama-server slots per model (-np; more than 1 share one KV cache, --kv-unified)",
        values.positive_int,
    ),
    Setting(
        "cpu_busy_percent",
        "FITBOX_CPU_BUSY_PERCENT",
        "90",
        "a core no engine of fitbox holds, this busy (percent) reading after reading, is busy "
        "with other work: claims take it last",
        values.positive_float,
    ),
    Setting(
        "cpu_busy_readings",
        "FITBOX_CPU_BUSY_READINGS",
        "2",
        "sensor readings in a row a core must stay that busy before claims avoid it (with "
        "FITBOX_READING_INTERVAL: 2 s by default)",
        values.positive_int,
    ),
    Setting(
        "warmup",
        "FITBOX_WARMUP",
        "auto",
        "the engine's empty warmup run at load: auto (skipped when a call waits for the load: "
        "its first token does that work; a swap took 0.91-0.94x as long on a quiet box, "
        "bench/swap.py --warmup on,auto), on, off",
        values.choice("auto", "on", "off"),
    ),
    Setting(
        "load_timeout",
        "FITBOX_LOAD_TIMEOUT",
        "300",
        "seconds a child may take to load",
        values.positive_float,
    ),
    Setting(
        "grow_cooldown",
        "FITBOX_GROW_COOLDOWN",
        "60",
        "seconds a model loaded below its preferred window serves before an idle rebuild may "
        "grow it back (when room has stayed free and it has had calls)",
        values.positive_float,
    ),
    Setting(
        "reading_interval",
        "FITBOX_READING_INTERVAL",
        "1",
        "seconds between sensor readings (host RAM and CPU, each GPU) kept in resource_log; "
        "each wakes fitbox, beside an engine that may be computing",
        values.positive_float,
    ),
    Setting(
        "reading_retention",
        "FITBOX_READING_RETENTION",
        "21600",
        "seconds of sensor readings kept; older ones are deleted",
        values.positive_float,
    ),
    Setting(
        "log_retention",
        "FITBOX_LOG_RETENTION",
        "1209600",
        "seconds an engine child's log file is kept (14 days); pruned before each launch",
        values.positive_float,
    ),
    Setting(
        "log_max",
        "FITBOX_LOG_MAX",
        "512MiB",
        "the engine children's log files in all; the oldest go first, a running child's never",
        values.positive_size,
    ),
    Setting(
        "engine_idle_timeout",
        "FITBOX_ENGINE_IDLE_TIMEOUT",
        "60",
        "seconds without a byte from an engine mid-call before it is probed; an engine that "
        "does not answer its health probe then is hung: the call ends engine_timeout and the "
        "engine is restarted",
        values.positive_float,
    ),
    Setting(
        "stop_grace",
        "FITBOX_STOP_GRACE",
        "5",
        "seconds between SIGTERM and SIGKILL when stopping a child",
        values.positive_float,
    ),
    Setting(
        "crash_limit",
        "FITBOX_CRASH_LIMIT",
        "3",
        "crashes within the crash window that mark a model failed until an operator clears it",
        values.positive_int,
    ),
    Setting(
        "crash_window",
        "FITBOX_CRASH_WINDOW",
        "300",
        "seconds over which crashes are counted",
        values.positive_float,
    ),
    Setting(
        "crash_backoff",
        "FITBOX_CRASH_BACKOFF",
        "1",
        "seconds to wait before restarting a crashed model; doubles per crash, at most 30",
        values.positive_float,
    ),
    Setting(
        "trusted_networks",
        "FITBOX_TRUSTED_NETWORKS",
        DEFAULT_TRUSTED_NETWORKS,
        "networks that may call inference without a key (comma-separated)",
        parse_networks,
    ),
    Setting(
        "trusted_proxies",
        "FITBOX_TRUSTED_PROXIES",
        "",
        "proxies whose X-Forwarded-For is believed (comma-separated); default none",
        parse_networks,
    ),
    Setting(
        "require_keys",
        "FITBOX_REQUIRE_KEYS",
        "false",
        "require an API key for inference from every network (true/false)",
        values.yes_no,
    ),
    Setting(
        "max_body",
        "FITBOX_MAX_BODY",
        "32MiB",
        "largest request body fitbox reads (e.g. 64MiB); a larger one is refused with 413 "
        "before it is read",
        values.positive_size,
    ),
    Setting(
        "max_image",
        "FITBOX_MAX_IMAGE",
        "20MiB",
        "largest image (decoded bytes) one image_url part of a chat message may hold; a "
        "larger one is refused with 400 before any model is placed",
        values.positive_size,
    ),
    *CONNECTIONS,  # what one connection may cost the box (setting_connections.py)
    *TASKS,  # task calls' uploads and outputs (setting_tasks.py)
    Setting(
        "cors_origins",
        "FITBOX_CORS_ORIGINS",
        "",
        "browser origins allowed to call fitbox (comma list, e.g. https://app.example), or * "
        "(only with FITBOX_REQUIRE_KEYS); default: CORS off",
        values.origins,
    ),
    Setting(
        "host_names",
        "FITBOX_HOST_NAMES",
        "",
        "names this box is reached by (comma list, e.g. fitbox.lan): a call from the box "
        "itself without a key (management, the dashboard, metrics) must send one of them, "
        "localhost, FITBOX_HOST or an address as its Host, so a web page whose name was "
        "rebound to this box gets nothing; default: none",
        values.host_names,
    ),
    Setting(
        "default_model",
        "FITBOX_DEFAULT_MODEL",
        "",
        "the model a call naming a model this box does not have goes to (for apps that "
        "hard-code a hosted name such as gpt-4o-mini); the reply says so in "
        "x-fitbox-default-model; default: off",
    ),
    Setting(
        "assist_model",
        "FITBOX_ASSIST_MODEL",
        "",
        "the model the helper (fitbox-helper) asks to map a plain sentence onto one of its "
        "menu actions, placed like any model; only a menu action it answers is ever run; "
        "default: none (the helper takes numbers and command words only)",
        scopes=(BOX,),
        api=api.model_name,
    ),
    *CENTRAL,  # joining a central, and the central's own (setting_central.py)
    Setting(
        "aliases",
        "FITBOX_ALIASES",
        "",
        'TOML file of [aliases] name = "model"; default: <data dir>/aliases.toml',
    ),
    Setting(
        "index_url",
        "FITBOX_INDEX_URL",
        "https://pypi.org/simple",
        "the PEP 503 simple index (with #sha256= links) fitbox update reads",
        flag="--index-url URL",
    ),
    Setting(
        "source_key",
        "FITBOX_SOURCE_KEY",
        "",
        "an admin key of the source box for fitbox pull box://...; none is needed when the "
        "source is this machine",
        flag="--source-key KEY",
        secret=True,
    ),
    Setting(
        "admin_key",
        "FITBOX_KEY",
        "",
        "an admin key the runtime commands (ps, load, unload, pin, logs, status), and launch "
        "and config minting a tool's key, send to a box elsewhere (--url); none is needed on "
        "the box itself",
        flag="--key KEY",
        secret=True,
    ),
)
BY_NAME = {s.name: s for s in SETTINGS}
