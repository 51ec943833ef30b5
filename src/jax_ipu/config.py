"""IPU Model settings, from the environment (the names Graphcore's users know).

JAX_IPU_DEVICE_COUNT=N        number of IPUs (default 1)
JAX_IPU_USE_MODEL=1           run on the IPU Model (the only target of this build)
JAX_IPU_MODEL_NUM_TILES=T     shrink each modelled IPU to T tiles
JAX_IPU_TARGET=ipu2           ipu1 (Mk1), ipu2 (Mk2, default) or ipu21 (Bow)
TF_POPLAR_FLAGS='--use_ipu_model --ipu_model_tiles=8'   the older spelling
JAX_IPU_ALLOW_OUT_OF_MEMORY=1 compile programs that do not fit (Poplar's
                              debug.allowOutOfMemory); the profile shows by how much
JAX_IPU_PROFILE=DIR           write a profile of every executed program to DIR
JAX_IPU_F64_AS_F32=1          run 64-bit types as 32-bit ones (f64 as f32, i64/u64 as
                              i32/u32), as PopTorch does; JAX still sees 64-bit arrays
JAX_IPU_EMULATE_TYPES=0       refuse bfloat16 and complex64 (which the IPU lacks) at compile
                              time instead of emulating them (the default)
JAX_IPU_EXECUTABLE_CACHE=DIR  load compiled programs from DIR and save new ones there
                              (TF_POPLAR_FLAGS=--executable_cache_path=DIR, Poplar's spelling)
JAX_IPU_MODEL_XLA_CHAINS=0    run all element-wise compute sets on numpy, none on XLA:CPU
JAX_IPU_COLLECTIVE_TIMEOUT=S  seconds a collective waits for the other IPUs and processes (600)
JAX_IPU_IPUS_PER_LINK_DOMAIN=N  IPUs joined by IPU-Links (64, an IPU-POD64); collectives
                              between such domains go over GW-Links
JAX_IPU_DUMP_TO=DIR           write each compiled program's IR after every compiler pass to DIR
                              (read by jax_ipu.model.fast.xla_chains when it is imported)
POPLAR_ENGINE_OPTIONS='{"autoReport.all":"true","autoReport.directory":"./report",
                        "debug.allowOutOfMemory":"true"}'   Poplar's spelling of the two above
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex

from jax_ipu.errors import IpuInvalidArgument

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclasses.dataclass(frozen=True)
class Config:
    device_count: int = 1
    target: str = "ipu2"
    num_tiles: int | None = None
    allow_out_of_memory: bool = False
    profile_directory: str | None = None
    f64_as_f32: bool = False
    # bfloat16 and complex64 emulated (on by default), or refused.
    emulate_types: bool = True
    dump_to: str | None = None
    executable_cache: str | None = None
    # Seconds a collective waits for the other replicas (and processes).
    collective_timeout: float = 600.0
    # IPUs joined by IPU-Links: a POD64 (beyond, GW-Links between PODs).
    ipus_per_link_domain: int = 64


# The most IPUs one client models: an IPU-POD256, the largest Graphcore
# system. Each modelled IPU has its own worker thread and engine, so far
# larger counts fail late (no thread can start) instead of running.
MAX_DEVICE_COUNT = 256


def _int(name: str, text: str, minimum: int, maximum: int | None = None, why: str = "") -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise IpuInvalidArgument(f"{name}={text!r}: expected a whole number >= {minimum}")
    if maximum is not None and value > maximum:
        raise IpuInvalidArgument(f"{name}={text!r}: at most {maximum} ({why})")
    return value


def _poplar_flags(text: str) -> dict[str, str]:
    flags = {}
    for word in shlex.split(text):
        key, _, value = word.lstrip("-").partition("=")
        flags[key] = value
    return flags


def _flag(name: str, text: str) -> bool:
    value = str(text).strip().lower()
    if value not in _TRUE | _FALSE:
        raise IpuInvalidArgument(f"{name}={text!r}: expected true or false")
    return value in _TRUE


def _engine_options(text: str) -> dict:
    try:
        options = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise IpuInvalidArgument(f"POPLAR_ENGINE_OPTIONS is not JSON ({exc}): {text!r}") from None
    if not isinstance(options, dict):
        raise IpuInvalidArgument(f"POPLAR_ENGINE_OPTIONS must be a JSON object, not {text!r}")
    return options


def _profile_directory(env, engine: dict) -> str | None:
    """JAX_IPU_PROFILE, else Poplar's autoReport (directory "." by default,
    as in Poplar) when autoReport.all or an execution profile is asked for."""
    if env.get("JAX_IPU_PROFILE"):
        return env["JAX_IPU_PROFILE"]
    wanted = any(_flag(f"POPLAR_ENGINE_OPTIONS {key}", engine[key])
                 for key in ("autoReport.all", "autoReport.outputExecutionProfile") if key in engine)
    return str(engine.get("autoReport.directory", ".")) if wanted else None


def from_environment(env=None, overrides: dict | None = None) -> Config:
    """Reads the settings; `overrides` (PJRT client options) win."""
    env = os.environ if env is None else env
    poplar = _poplar_flags(env.get("TF_POPLAR_FLAGS", ""))
    use_model = env.get("JAX_IPU_USE_MODEL", "1").strip().lower()
    if use_model in _FALSE:
        raise IpuInvalidArgument(
            "JAX_IPU_USE_MODEL=0 asks for IPU hardware, but this jax-ipu build runs on the "
            "IPU Model only (no Poplar SDK backend yet). Unset JAX_IPU_USE_MODEL to use the Model.")
    if use_model not in _TRUE:
        raise IpuInvalidArgument(f"JAX_IPU_USE_MODEL={use_model!r}: expected 1 or 0")
    overrides = overrides or {}
    tiles = overrides.get("num_tiles") or env.get("JAX_IPU_MODEL_NUM_TILES") or poplar.get("ipu_model_tiles")
    count = overrides.get("device_count") or env.get("JAX_IPU_DEVICE_COUNT", "1")
    engine = _engine_options(env.get("POPLAR_ENGINE_OPTIONS", ""))
    allow_oom = env.get("JAX_IPU_ALLOW_OUT_OF_MEMORY") or engine.get("debug.allowOutOfMemory", "false")
    return Config(
        device_count=_int("JAX_IPU_DEVICE_COUNT", str(count), 1, MAX_DEVICE_COUNT,
                          "the IPUs of an IPU-POD256, the largest system; the IPU Model runs a thread per IPU"),
        target=str(overrides.get("target") or env.get("JAX_IPU_TARGET", "ipu2")),
        num_tiles=_int("JAX_IPU_MODEL_NUM_TILES", str(tiles), 1) if tiles else None,
        allow_out_of_memory=_flag("JAX_IPU_ALLOW_OUT_OF_MEMORY", allow_oom),
        profile_directory=_profile_directory(env, engine),
        f64_as_f32=_flag("JAX_IPU_F64_AS_F32", env.get("JAX_IPU_F64_AS_F32", "0")),
        emulate_types=_flag("JAX_IPU_EMULATE_TYPES", env.get("JAX_IPU_EMULATE_TYPES", "1")),
        dump_to=env.get("JAX_IPU_DUMP_TO") or None,
        executable_cache=env.get("JAX_IPU_EXECUTABLE_CACHE") or poplar.get("executable_cache_path") or None,
        collective_timeout=float(_int("JAX_IPU_COLLECTIVE_TIMEOUT", env.get("JAX_IPU_COLLECTIVE_TIMEOUT", "600"), 1)),
        ipus_per_link_domain=_int("JAX_IPU_IPUS_PER_LINK_DOMAIN", env.get("JAX_IPU_IPUS_PER_LINK_DOMAIN", "64"), 1),
    )
