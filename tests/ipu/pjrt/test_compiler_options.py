"""jax's compiler_options as JAX users pass them (pjrt/compile_options.py):
every field of XLA's DebugOptions is accepted, with the values XLA:CPU
accepts and XLA:CPU's wording for the ones it refuses; a few act, the rest
are ignored with one warning per name; other names are refused as XLA
refuses them, listing jax-ipu's own options.

XLA:CPU is the reference for names and values: its checks are protobuf
reflection over DebugOptions, the same on every host."""
import math
import mmap
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxlib import _jax

from jax_ipu.errors import IpuInvalidArgument
from jax_ipu.pjrt import compile_options


def _program_text() -> str:
    return jax.jit(lambda x: x * 2.0 + 1.0).lower(np.float32(1)).as_text()


def _cpu_verdict(name: str, value, text=None):
    """XLA:CPU's answer to one option: None when it compiles, else its
    message without the status code."""
    cpu = jax.devices("cpu")[0]
    options = _jax.CompileOptions()
    options.env_option_overrides = [(name, value)]
    try:
        cpu.client.compile_and_load(text or _program_text(), _jax.DeviceList((cpu,)), options)
        return None
    except _jax.JaxRuntimeError as error:
        return str(error).removeprefix("INVALID_ARGUMENT: ")


def _ipu_verdict(name: str, value):
    try:
        compile_options.parse({name: value})
        return None
    except IpuInvalidArgument as error:
        return str(error)


def _through_jaxlib(value):
    """The value as the plugin receives it (jaxlib converts, e.g. numpy
    scalars to int)."""
    options = _jax.CompileOptions()
    options.env_option_overrides = [("k", value)]
    return dict(_jax.CompileOptions.ParseFromString(options.SerializeAsString()).env_option_overrides)["k"]


def _wrong_type(field: compile_options.Field):
    """A value XLA refuses for the field whatever it is called."""
    return 2.5 if field.type in ("bool", "int32", "int64", "enum") else True


# The warnings of ignored options, given once per name and process, are
# counted by the tests that record them.
pytestmark = pytest.mark.filterwarnings("ignore:compiler option")


@pytest.fixture()
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(compile_options, "_warned", set())


def test_the_fields_are_read_from_jaxlib_and_are_xlas_own():
    fields = compile_options.xla_debug_options()
    assert fields is not None and len(fields) > 200
    # jaxlib's Python binding shows a few fields of DebugOptions by name: all are there.
    shown = {n for n in dir(_jax.DebugOptions) if n.startswith("xla_")}
    assert shown and shown <= set(fields)
    text = _program_text()
    for name, field in fields.items():
        # XLA:CPU knows each name (it checks the value, so a wrong one is refused without being set),
        # and refuses it in the words jax-ipu uses.
        value = _wrong_type(field)
        expected = _cpu_verdict(name, value, text)
        assert expected is not None and expected.startswith(f"While setting option {name}, "), (name, expected)
        assert _ipu_verdict(name, value) == expected


def test_names_xla_does_not_know_are_refused_in_xlas_words_listing_jax_ipus_own():
    text = _program_text()
    fields = compile_options.xla_debug_options()
    # Made-up names, and names XLA reserves for options it removed.
    with open(compile_options._jaxlib_libraries()[0], "rb") as f, \
            mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as library:
        xla = compile_options._file_descriptor(library, "xla/xla.proto")
    removed = [n for m in xla.message_type if m.name == "DebugOptions" for n in m.reserved_name]
    assert removed
    for name in ["invalid_key", "xla_gpu_autotune_levels", "XLA_DUMP_TO", "xla_", *removed[:20]]:
        assert name not in fields
        assert _cpu_verdict(name, "1", text) == f"No such compile option: '{name}'"
        message = _ipu_verdict(name, "1")
        assert message.startswith(f"No such compile option: '{name}'. ")
        assert "available_memory_proportion" in message and "allow_out_of_memory" in message


# Values of every kind jaxlib passes (str, bool, int, float), at and across
# the edges of XLA's checks.
VALUES = [True, False, 0, 1, -1, 7, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**40, 2**63 - 1,
          0.5, 5.0, -0.5, 0.0, 1e-39, 1.1754943508222875e-38, 3.4028234663852886e+38, 1e39,
          math.inf, -math.inf, math.nan,
          "True", "False", "true", "1", "0", " 3", "3 ", "+5", "-2", "+-2", "1e3", "0x10", "1_0", "010",
          "2147483648", "9223372036854775808", "", " ", "0.5", " .5", "5.", "1e39", "-1e-50", "inf", "-Infinity",
          "nan", "nan(1)", "nan()", "NaN", "INF", "+inf", "infx", "1e", "1e+", ".", "1.", "-.5", "+.5e1", "1.5f",
          "0x1p3", "0x.8", "-0x10", "+0x10", "0x", "0x1g", "00x1", " +1", "+ 1", "1 2", "\t2\n",
          "abc", "a,b", "1,2", "1,", ",", "True,False",
          np.True_, np.int32(3), np.float32(0.25)]


def _one_field_of_each_kind() -> list[compile_options.Field]:
    """For each (type, repeated) DebugOptions has, a GPU option (which
    XLA:CPU's compiler never reads, so no value changes what it does)."""
    kinds = {}
    for name, field in sorted(compile_options.xla_debug_options().items()):
        if name.startswith("xla_gpu_"):
            kinds.setdefault((field.type, field.repeated), field)
    return list(kinds.values())


@pytest.mark.parametrize("field", _one_field_of_each_kind(), ids=lambda f: f"{f.type}{'[]' if f.repeated else ''}")
def test_values_are_checked_as_xla_checks_them(field):
    text = _program_text()
    values = list(VALUES)
    if field.enum_names:
        name = sorted(field.enum_names)[0]
        values += [name, name.lower(), f"{name},1", f"1,{name}", f"{name},BOGUS"]
    for value in values:
        received = _through_jaxlib(value)
        assert _ipu_verdict(field.name, received) == _cpu_verdict(field.name, value, text), (field.name, value)


def test_every_field_xla_accepts_is_accepted_on_ipu_and_only_the_acting_ones_act(ipu, fresh_warnings):
    fields = compile_options.xla_debug_options()
    valid = {"bool": False, "int32": 0, "int64": 0, "float": 0.5, "enum": 0, "string": ""}
    options = {}
    for name, field in fields.items():
        if field.repeated:
            options[name] = ""            # an empty list, for every type
        elif field.type in valid:
            options[name] = valid[field.type]
    # The one field no value can set (XLA refuses them all: a message, not repeated) is left out.
    assert set(fields) - set(options) == {n for n, f in fields.items() if f.type == "message" and not f.repeated}
    x = jax.device_put(np.arange(6, dtype=np.float32), ipu)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = jax.jit(lambda x: jnp.sin(x) * 2).lower(x).compile(compiler_options=options)
        out = compiled(x)
    np.testing.assert_allclose(np.asarray(out), np.sin(np.arange(6, dtype=np.float32)) * 2, rtol=1e-6)
    warned = [str(w.message) for w in caught if "compiler option" in str(w.message)]
    ignored = set(options) - set(compile_options.ACTING)
    assert len(warned) == len(ignored)
    assert {m.split("'")[1] for m in warned} == ignored
    assert all("ignored" in m for m in warned)


def test_an_ignored_option_warns_once_per_name_and_the_program_runs(ipu, fresh_warnings):
    # As Equinox's test_compiler_options passes it, on jit and on compile.
    x = jax.device_put(np.linspace(-1, 1, 8, dtype=np.float32), ipu)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = jax.jit(lambda x: x * 3 + 1, compiler_options={"xla_gpu_autotune_level": 0})(x)
        b = jax.jit(lambda x: x - 1).lower(x).compile(compiler_options={"xla_gpu_autotune_level": "0"})(x)
        c = jax.jit(lambda x: x * x, compiler_options={"xla_cpu_enable_fast_math": True,
                                                       "xla_gpu_autotune_level": 4})(x)
    host = np.linspace(-1, 1, 8, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(a), host * 3 + 1)
    np.testing.assert_array_equal(np.asarray(b), host - 1)
    np.testing.assert_array_equal(np.asarray(c), host * host)
    messages = [str(w.message) for w in caught if "compiler option" in str(w.message)]
    assert len(messages) == 2, messages
    assert "'xla_gpu_autotune_level'" in messages[0] and "ignored" in messages[0]
    assert "'xla_cpu_enable_fast_math'" in messages[1]


def test_refusals_reach_jax_as_xla_backends_word_them(ipu):
    lowered = jax.jit(lambda x: jnp.sqrt(x ** 2) + 1.0).lower(jax.device_put(np.float32(1), ipu))
    for options, message in [({"invalid_key": "invalid_value"}, "No such compile option: 'invalid_key'"),
                             ({"xla_embed_ir_in_executable": "invalid_value"},
                              "While setting option xla_embed_ir_in_executable, 'invalid_value' is not a valid "
                              "bool value."),
                             ({"xla_gpu_autotune_level": 1.5}, "'1.5' is not a valid int32 value."),
                             ({"available_memory_proportion": True}, "expected a number"),
                             ({"available_memory_proportion": "2"}, "expected 0 < p <= 1"),
                             ({"allow_out_of_memory": "maybe"}, "expected true or false"),
                             ({"xla_dump_hlo_pass_re": "(unclosed"}, "is not a regular expression")]:
        with pytest.raises(jax.errors.JaxRuntimeError, match="INVALID_ARGUMENT") as error:
            lowered.compile(compiler_options=options)
        assert message in str(error.value), (options, str(error.value))


def test_xla_dump_to_writes_the_compilers_passes_and_the_dump_options_choose(ipu, tmp_path):
    x = jax.device_put(np.ones(4, np.float32), ipu)

    def dump(name, **options):
        directory = tmp_path / name
        jax.jit(lambda x: jnp.exp(x) + 1).lower(x).compile(compiler_options={"xla_dump_to": str(directory),
                                                                             **options})
        return sorted(p.name for p in directory.rglob("*.txt")) if directory.exists() else []

    every = dump("all")
    # NN-pass.txt: the passes in their order (compiler.PASSES).
    fuse = next(name for name in every if name.endswith("-fuse.txt"))
    lower = next(name for name in every if name.endswith("-lower.txt"))
    assert every[0] == "00-input.txt" and int(lower[:2]) == int(fuse[:2]) + 1 and len(every) > 10
    assert "exponential" in (next((tmp_path / "all").iterdir()) / fuse).read_text()
    assert dump("passes", xla_dump_hlo_pass_re="^(fuse|lower)$") == [fuse, lower]
    assert dump("module", xla_dump_hlo_module_re="lambda") == every
    assert dump("other", xla_dump_hlo_module_re="^resnet") == []
    assert dump("off", xla_enable_dumping=False) == []


def test_embedded_ir_is_the_stablehlo_and_survives_serialization(ipu):
    from jax.experimental import serialize_executable

    x = jax.device_put(np.arange(4, dtype=np.float32), ipu)
    lowered = jax.jit(lambda x: jnp.cos(x) * 3).lower(x)
    plain = lowered.compile().as_text()
    embedded = lowered.compile(compiler_options={"xla_embed_ir_in_executable": True})
    assert "stablehlo.cosine" not in plain and "stablehlo=" not in plain
    text = embedded.as_text()
    assert "stablehlo=" in text and "stablehlo.cosine" in text and "ipu_program=" in text
    assert "stablehlo=" not in lowered.compile(compiler_options={"xla_embed_ir_in_executable": False}).as_text()
    np.testing.assert_allclose(np.asarray(embedded(x)), np.cos(np.arange(4, dtype=np.float32)) * 3, rtol=1e-6)
    loaded = serialize_executable.deserialize_and_load(*serialize_executable.serialize(embedded), backend="ipu")
    assert "stablehlo.cosine" in loaded.as_text()


def test_without_jaxlibs_list_xla_names_pass_unchecked_and_others_are_refused(monkeypatch, fresh_warnings,
                                                                               tmp_path):
    junk = tmp_path / "libjunk.so"
    junk.write_bytes(os.urandom(4096))
    monkeypatch.setattr(compile_options, "_jaxlib_libraries", lambda: [str(junk)])
    with pytest.warns(UserWarning, match="could not read XLA's DebugOptions"):
        assert compile_options.xla_debug_options.__wrapped__() is None
    monkeypatch.setattr(compile_options, "xla_debug_options", lambda: None)
    with pytest.warns(UserWarning, match="could not read XLA.s options"):
        assert compile_options.parse({"xla_gpu_anything": 3}).changes == {}
    assert compile_options.parse({"xla_dump_to": "/tmp/d"}).changes == {"dump_to": "/tmp/d"}
    with pytest.raises(IpuInvalidArgument, match="not a valid bool value"):
        compile_options.parse({"xla_embed_ir_in_executable": 1})
    with pytest.raises(IpuInvalidArgument, match="No such compile option: 'bogus'"):
        compile_options.parse({"bogus": 1})
