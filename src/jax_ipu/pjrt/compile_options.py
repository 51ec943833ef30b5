"""jax's compiler_options, as XLA backends take them.

`jax.jit(f, compiler_options={...})` and `lowered.compile(compiler_options=
{...})` reach a PJRT plugin as the `env_option_overrides` of the serialized
CompileOptionsProto. XLA's backends read each name as a field of their
`DebugOptions` message and set it by protobuf reflection: an unknown name is
"No such compile option: 'NAME'", a value of the wrong type "While setting
option NAME, 'VALUE' is not a valid TYPE value." Code written for CPU, GPU
and TPU passes such options freely, so jax-ipu takes every name XLA takes:

- its own options (`OWN`) set the IPU compiler's;
- the XLA options with a meaning here (`ACTING`) act;
- every other field of DebugOptions is ignored, with one warning per name;
- anything else is refused with XLA's wording and a list of `OWN`.

The list of DebugOptions' fields is not copied here: it is read from the
installed jaxlib itself, whose shared library carries the serialized
descriptor of xla/xla.proto (as every C++ program built with protobuf does),
so it is always exactly the XLA that jaxlib was built from.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import mmap
import os
import re
import struct
import warnings

from jax_ipu.errors import IpuInvalidArgument
from jax_ipu.utils import protowire

# jax-ipu's own options: name -> what it takes.
OWN = {
    "available_memory_proportion": "a number, 0 < p <= 1 (default 0.6): the share of each tile's memory a "
                                   "matmul's plan may use (PopLibs' availableMemoryProportion)",
    "allow_out_of_memory": "True or False (default False): compile programs that do not fit, keeping their "
                           "memory report (Poplar's debug.allowOutOfMemory)",
    "partials_type": "'float' (default) or 'half': the type of float16 convolutions' and matmuls' partial sums "
                     "(Poplar's partialsType; 'half' applies where the result is float16)",
    "emulate_types": "True or False (default True, JAX_IPU_EMULATE_TYPES): emulate bfloat16 and complex64, which "
                     "the IPU lacks; False refuses them at compile time (hardware-native programs only)",
}

# partials_type's values (Poplar's names first) and what each means.
PARTIALS_TYPES = {"float": "float", "half": "half", "float32": "float", "float16": "half", "f32": "float",
                  "f16": "half"}

# XLA's options that act here: name -> what it does.
ACTING = {
    "xla_dump_to": "write the program after every compiler pass to DIR/<program>/ (as JAX_IPU_DUMP_TO)",
    "xla_dump_hlo_module_re": "dump only programs whose name this regular expression matches",
    "xla_dump_hlo_pass_re": "dump only after the compiler passes whose name this regular expression matches",
    "xla_enable_dumping": "False: no dumps, whatever asks for them",
    "xla_embed_ir_in_executable": "keep the StableHLO the program was compiled from; compiled.as_text() shows "
                                  "it (as the module's frontend attribute `stablehlo`)",
}


@dataclasses.dataclass(frozen=True)
class Requested:
    """What a compile's options ask of jax-ipu: changes to the compiler's
    options (fields of jax_ipu.compiler.CompileOptions) and whether to keep
    the program's StableHLO text."""
    changes: dict
    embed_ir: bool = False


def parse(overrides: dict) -> Requested:
    """What `overrides` (name -> str | bool | int | float, as jaxlib parses
    them) ask for. Raises IpuInvalidArgument for what XLA would refuse."""
    changes: dict = {}
    embed_ir = False
    enable_dumping = True
    for name, value in overrides.items():
        if name in OWN:
            changes[name] = _own_value(name, value)
            continue
        fields = xla_debug_options()
        field = _ACTING_TYPES.get(name) if fields is None else fields.get(name)
        if field is None:
            if fields is not None or not name.startswith("xla_"):
                raise IpuInvalidArgument(_no_such(name))
            # This jaxlib's list could not be read: an XLA-like name passes.
            _warn_once(name, "jax-ipu could not read XLA's options from jaxlib to check it; it is ignored")
            continue
        value = xla_value(field, value)
        if name not in ACTING:
            _warn_once(name, "it is one of XLA's debug options, which jax-ipu's compiler has no use for; "
                       "it is ignored")
        elif name == "xla_dump_to":
            changes["dump_to"] = value or None
        elif name == "xla_dump_hlo_module_re":
            changes["dump_module_re"] = _regex(name, value)
        elif name == "xla_dump_hlo_pass_re":
            changes["dump_pass_re"] = _regex(name, value)
        elif name == "xla_enable_dumping":
            enable_dumping = value
        elif name == "xla_embed_ir_in_executable":
            embed_ir = value
    if not enable_dumping:
        changes["dump_to"] = None
    return Requested(changes, embed_ir)


def _no_such(name: str) -> str:
    own = "; ".join(f"{n}: {what}" for n, what in OWN.items())
    return (f"No such compile option: '{name}'. jax-ipu's own options are {own}. The fields of XLA's "
            f"DebugOptions (xla_...) are accepted too: {', '.join(ACTING)} act, the others are ignored")


def _own_value(name: str, value):
    if name == "available_memory_proportion":
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise IpuInvalidArgument(f"compiler option {name}={value!r}: expected a number")
        try:
            proportion = float(value)
        except ValueError:
            raise IpuInvalidArgument(f"compiler option {name}={value!r}: expected a number") from None
        if not 0 < proportion <= 1:
            raise IpuInvalidArgument(f"compiler option {name}={proportion}: expected 0 < p <= 1")
        return proportion
    if name == "partials_type":
        chosen = PARTIALS_TYPES.get(str(value).strip().lower()) if isinstance(value, str) else None
        if chosen is None:
            raise IpuInvalidArgument(f"compiler option {name}={value!r}: expected 'float' or 'half'")
        return chosen
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "0", "false", "no"):
        return text in ("1", "true", "yes")
    raise IpuInvalidArgument(f"compiler option {name}={value!r}: expected true or false")


def _regex(name: str, value: str) -> str | None:
    if not value:
        return None
    try:
        re.compile(value)
    except re.error as exc:
        raise IpuInvalidArgument(f"compiler option {name}={value!r} is not a regular expression: {exc}") from None
    return value


_warned: set[str] = set()


def _warn_once(name: str, why: str | None) -> None:
    if why is None or name in _warned:
        return
    _warned.add(name)
    warnings.warn(f"compiler option {name!r}: {why} (this warning is given once per option)", stacklevel=2)


# -- XLA's DebugOptions, as jaxlib's XLA knows them --------------------------

@dataclasses.dataclass(frozen=True)
class Field:
    """One field of DebugOptions: `type` is protobuf's name of its type
    ("bool", "int32", "int64", "float", "double", "string", "enum",
    "message", ...), `enum_names` the names an enum field takes."""
    name: str
    type: str
    repeated: bool = False
    enum_names: frozenset = frozenset()


# The acting options' types, should this jaxlib's list be unreadable.
_ACTING_TYPES = {
    "xla_dump_to": Field("xla_dump_to", "string"),
    "xla_dump_hlo_module_re": Field("xla_dump_hlo_module_re", "string"),
    "xla_dump_hlo_pass_re": Field("xla_dump_hlo_pass_re", "string"),
    "xla_enable_dumping": Field("xla_enable_dumping", "bool"),
    "xla_embed_ir_in_executable": Field("xla_embed_ir_in_executable", "bool"),
}


@functools.cache
def xla_debug_options() -> dict[str, Field] | None:
    """name -> Field for every field of xla.DebugOptions in the installed
    jaxlib, or None (with a warning) when its library holds no readable
    descriptor of xla/xla.proto."""
    try:
        return _read_debug_options(_jaxlib_libraries())
    except (OSError, ValueError) as exc:
        warnings.warn(f"jax-ipu could not read XLA's DebugOptions from jaxlib ({exc}): options named xla_... "
                      "are accepted without checks", stacklevel=2)
        return None


def _jaxlib_libraries() -> list[str]:
    import jaxlib
    directory = os.path.dirname(jaxlib.__file__)
    paths = [os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".so")]
    return sorted(paths, key=os.path.getsize, reverse=True)   # the largest holds XLA


def _read_debug_options(paths: list[str]) -> dict[str, Field]:
    from google.protobuf import descriptor_pb2

    for path in paths:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                continue
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                xla = _file_descriptor(data, "xla/xla.proto")
                if xla is None:
                    continue
                messages = {m.name: m for m in xla.message_type}
                if "DebugOptions" not in messages:
                    raise ValueError(f"{os.path.basename(path)}'s xla/xla.proto has no DebugOptions")
                enums = _enums(xla)
                for dependency in xla.dependency:   # enums the fields name from other files
                    found = _file_descriptor(data, dependency)
                    if found is not None:
                        enums.update(_enums(found))
        type_names = {number: name[len("TYPE_"):].lower()
                      for name, number in descriptor_pb2.FieldDescriptorProto.Type.items()}
        repeated = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
        return {f.name: Field(f.name, type_names[f.type], f.label == repeated, enums.get(f.type_name, frozenset()))
                for f in messages["DebugOptions"].field}
    raise ValueError("no jaxlib library holds xla/xla.proto's descriptor")


def _file_descriptor(data, name: str):
    """The FileDescriptorProto named `name` serialized in `data` (a library's
    bytes), or None. It starts with its name (field 1); it ends where the
    next bytes stop being a FileDescriptorProto's fields."""
    from google.protobuf import descriptor_pb2

    encoded = name.encode()
    start = data.find(b"\x0a" + _varint(len(encoded)) + encoded)
    if start < 0:
        return None
    known = set(descriptor_pb2.FileDescriptorProto.DESCRIPTOR.fields_by_number)
    end = pos = start
    limit = len(data)
    while pos < limit:
        try:
            key, pos = protowire.varint(data, pos)
            field, wire = key >> 3, key & 7
            if field not in known or wire not in (0, 2):
                break
            size, pos = protowire.varint(data, pos)
        except ValueError:
            break
        pos += size if wire == 2 else 0
        if pos > limit:
            break
        end = pos
    proto = descriptor_pb2.FileDescriptorProto.FromString(bytes(data[start:end]))
    if proto.name != name:
        raise ValueError(f"unreadable descriptor of {name}")
    return proto


def _enums(proto) -> dict[str, frozenset]:
    """'.package.Message.Enum' -> its value names, for every enum in a file."""
    found = {}

    def walk(prefix: str, enums, messages):
        for e in enums:
            found[f"{prefix}.{e.name}"] = frozenset(v.name for v in e.value)
        for m in messages:
            walk(f"{prefix}.{m.name}", m.enum_type, m.nested_type)
    walk("." + proto.package if proto.package else "", proto.enum_type, proto.message_type)
    return found


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


# -- values, checked and converted as XLA's CompileOptions::ApplyOption does --

_INT32 = (-2**31, 2**31 - 1)
_INT64 = (-2**63, 2**63 - 1)
_FLOAT_MIN, _FLOAT_MAX = struct.unpack("<2f", struct.pack("<2I", 0x00800000, 0x7F7FFFFF))  # the smallest normal
_SPACE = " \t\n\v\f\r"   # what absl strips around numbers
_INTEGER = re.compile(r"[+-]?[0-9]+")
# absl::SimpleAtof: a leading '+' is dropped, then a decimal or hexadecimal
# number, an infinity or a NaN, as from_chars reads them.
_HEX = re.compile(r"-?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?")
_REAL = re.compile(r"-?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|(?i:inf(?:inity)?|nan(?:\([0-9A-Za-z_]*\))?))")


def xla_value(field: Field, value):
    """`value` (str, bool, int or float) as XLA sets it into `field`, or an
    IpuInvalidArgument worded as XLA words it. A string is parsed; for a
    repeated field it is a comma-separated list."""
    if isinstance(value, str):
        if field.repeated:
            return [] if value == "" else [_from_string(field, v) for v in value.split(",")]
        return _from_string(field, value)
    kind = field.type
    if isinstance(value, bool):
        ok = kind == "bool"
    elif isinstance(value, int):
        ok = (kind == "int32" and _INT32[0] <= value <= _INT32[1]) or kind in ("int64", "enum")
    elif isinstance(value, float):
        ok = (kind == "float" and _FLOAT_MIN <= value <= _FLOAT_MAX) or kind == "double"
    else:
        ok = False
    if not ok:
        raise _invalid(field, _as_text(value))
    return [value] if field.repeated else value


def _from_string(field: Field, text: str):
    kind = field.type
    if kind == "string":
        return text
    if kind == "bool" and text in ("True", "False"):
        return text == "True"
    stripped = text.strip(_SPACE)
    if kind in ("int32", "int64", "enum") and _INTEGER.fullmatch(stripped):
        low, high = _INT64 if kind == "int64" else _INT32
        if low <= int(stripped) <= high:
            return int(stripped)
    if kind == "enum" and text in field.enum_names:
        return text
    if kind in ("float", "double"):
        real = stripped[1:] if stripped.startswith("+") else stripped
        if not (real.startswith("-") and real is not stripped):    # not "+-..."
            if _HEX.fullmatch(real):
                return float.fromhex(real)
            if _REAL.fullmatch(real):
                return math.nan if "(" in real else float(real)
    raise _invalid(field, text)


def _invalid(field: Field, text: str) -> IpuInvalidArgument:
    return IpuInvalidArgument(f"While setting option {field.name}, '{text}' is not a valid {field.type} value.")


def _as_text(value) -> str:
    """absl::StrCat's spelling: bools as 1/0, doubles with six digits."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
