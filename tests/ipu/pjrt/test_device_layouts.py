"""Device-local layouts (jax.experimental.layout.Format / Layout): an array
in a layout other than row-major is held as its transpose by that layout;
executables take and give arrays in the layouts JAX compiles them for and
report them; AUTO is row-major but for a transposed result, which takes the
layout in which it needs no copy, and a result constrained to a layout.
Values against numpy."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.layout import Format, Layout
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

COLUMN_MAJOR = Layout(major_to_minor=(1, 0))


def _copies(compiled) -> int:
    """Copies in the compiled program (its summary, in as_text())."""
    text = compiled.as_text()
    return int(text.split(" compute sets, ")[1].split(" copies")[0])


def test_an_array_put_in_a_layout_reports_it_and_keeps_its_values(ipu):
    x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
    a = jax.device_put(x, Format(COLUMN_MAJOR, SingleDeviceSharding(ipu)))
    assert a.format.layout.major_to_minor == (1, 0)
    np.testing.assert_array_equal(np.asarray(a), x)
    np.testing.assert_array_equal(np.asarray(jax.device_put(a, jax.devices("cpu")[0])), x)
    b = jax.device_put(a, jax.devices("ipu")[1])          # a copy keeps its layout
    assert b.format.layout.major_to_minor == (1, 0)
    np.testing.assert_array_equal(np.asarray(b), x)
    assert jnp.asarray(x).copy().format.layout.major_to_minor == (0, 1)


@pytest.mark.parametrize("order", [(1, 0), (2, 0, 1), (0, 2, 1)])
def test_programs_take_and_give_arrays_in_their_layouts(ipu, order):
    shape = (4, 6, 8)[:len(order)]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    s = SingleDeviceSharding(ipu)
    layout = Layout(major_to_minor=order)
    a = jax.device_put(x, Format(layout, s))
    f = jax.jit(lambda v: jnp.sin(v) * 2, in_shardings=Format(layout, s), out_shardings=Format(layout, s))
    compiled = f.lower(a).compile()
    assert compiled.input_formats[0][0].layout.major_to_minor == order
    assert compiled.output_formats.layout.major_to_minor == order
    out = compiled(a)
    assert out.format.layout.major_to_minor == order
    np.testing.assert_allclose(np.asarray(out), np.sin(x) * 2, rtol=1e-6, atol=1e-6)
    # Reading it in another layout from the one it is held in costs a copy.
    g = jax.jit(lambda v: jnp.sin(v) * 2)
    np.testing.assert_allclose(np.asarray(g(a)), np.sin(x) * 2, rtol=1e-6, atol=1e-6)
    default = jax.device_put(x, s)
    assert _copies(g.lower(a).compile()) > _copies(g.lower(default).compile())


def test_auto_lays_out_a_transposed_result_as_its_operand(ipu):
    x = np.arange(6 * 10, dtype=np.float32).reshape(6, 10)
    a = jax.device_put(x, ipu)
    auto = jax.jit(lambda v: v.T, out_shardings=Format(Layout.AUTO)).lower(a).compile()
    assert auto.output_formats.layout.major_to_minor == (1, 0)
    assert _copies(auto) == 0                          # the transpose is the operand's elements in order
    out = auto(a)
    assert out.format.layout.major_to_minor == (1, 0)
    np.testing.assert_array_equal(np.asarray(out), x.T)
    assert _copies(jax.jit(lambda v: v.T).lower(a).compile()) == 1
    # Inputs left to the compiler are row-major.
    both = jax.jit(lambda v: v * 2, in_shardings=Format(Layout.AUTO), out_shardings=Format(Layout.AUTO))
    compiled = both.lower(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=SingleDeviceSharding(ipu))).compile()
    assert compiled.input_formats[0][0].layout.major_to_minor == (0, 1)
    assert compiled.output_formats.layout.major_to_minor == (0, 1)


def test_a_result_constrained_to_a_layout_takes_it(ipu):
    x = np.arange(16 * 8, dtype=np.int32).reshape(16, 8)
    s = SingleDeviceSharding(ipu)

    @jax.jit
    def f(v):
        return jax.lax.with_sharding_constraint(v.T + 1, Format(COLUMN_MAJOR, s))
    out = f(jax.device_put(x, s))
    assert out.format.layout.major_to_minor == (1, 0)
    np.testing.assert_array_equal(np.asarray(out), x.T + 1)


def test_donation_in_a_layout(ipu):
    s = SingleDeviceSharding(ipu)
    x = np.arange(32 * 16, dtype=np.float32).reshape(32, 16)
    a = jax.device_put(x, Format(COLUMN_MAJOR, s))
    f = jax.jit(lambda v: v * v, in_shardings=Format(COLUMN_MAJOR, s), out_shardings=Format(COLUMN_MAJOR, s),
                donate_argnums=0)
    out = f(a)
    assert a.is_deleted()
    np.testing.assert_array_equal(np.asarray(out), x * x)


def test_split_arrays_in_a_layout(ipus):
    mesh = Mesh(np.array(ipus[:2]), ("x",))
    s = NamedSharding(mesh, P("x"))
    x = np.arange(16 * 12, dtype=np.float32).reshape(16, 12)
    a = jax.device_put(x, Format(COLUMN_MAJOR, s))
    assert all(shard.data.format.layout.major_to_minor == (1, 0) for shard in a.addressable_shards)
    f = jax.jit(lambda v: v @ v.T, in_shardings=Format(COLUMN_MAJOR, s))
    np.testing.assert_allclose(np.asarray(f(a)), x @ x.T, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(a), x)


def test_tiled_layouts_are_refused(ipu):
    s = SingleDeviceSharding(ipu)
    tiled = Layout(major_to_minor=(0, 1), tiling=((8, 128),))
    with pytest.raises(jax.errors.JaxRuntimeError, match="tiled layouts"):
        jax.jit(lambda v: v + 1, out_shardings=Format(tiled, s))(jnp.ones((8, 128)))


def test_a_loaded_executable_keeps_its_layouts(ipu):
    from jax.experimental import serialize_executable as se
    s = SingleDeviceSharding(ipu)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = jax.device_put(x, Format(COLUMN_MAJOR, s))
    compiled = jax.jit(lambda v: (v + 1).T, in_shardings=Format(COLUMN_MAJOR, s),
                       out_shardings=Format(COLUMN_MAJOR, s)).lower(a).compile()
    payload, in_tree, out_tree = se.serialize(compiled)
    loaded = se.deserialize_and_load(payload, in_tree, out_tree, backend="ipu", execution_devices=[ipu])
    assert loaded.input_formats[0][0].layout.major_to_minor == (1, 0)
    out = loaded(a)
    assert out.format.layout.major_to_minor == (1, 0)
    np.testing.assert_array_equal(np.asarray(out), (x + 1).T)
