"""IPU Model settings, from the environment (the names Graphcore's users know).

JAX_IPU_DEVICE_COUNT=N        number of IPUs (default 1)
JAX_IPU_USE_MODEL=1           run on the IPU Model (the only target of this build)
JAX_IPU_MODEL_NUM_TILES=T     shrink each modelled IPU to T tiles
JAX_IPU_TARGET=ipu2           ipu1 (Mk1), ipu2 (Mk2, default) or ipu21 (Bow)
TF_POPLAR_FLAGS='--use_ipu_model --ipu_model_tiles=8'   the older spelling
"""
from __future__ import annotations

import dataclasses
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


def _int(name: str, text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise IpuInvalidArgument(f"{name}={text!r}: expected a whole number >= {minimum}")
    return value


def _poplar_flags(text: str) -> dict[str, str]:
    flags = {}
    for word in shlex.split(text):
        key, _, value = word.lstrip("-").partition("=")
        flags[key] = value
    return flags


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
    return Config(
        device_count=_int("JAX_IPU_DEVICE_COUNT", str(count), 1),
        target=str(overrides.get("target") or env.get("JAX_IPU_TARGET", "ipu2")),
        num_tiles=_int("JAX_IPU_MODEL_NUM_TILES", str(tiles), 1) if tiles else None,
    )
