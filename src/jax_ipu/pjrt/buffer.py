"""An array resident on an IPU device (its tiles' SRAM, in the Model: a
numpy array owned by the device)."""
from __future__ import annotations

import numpy as np

from jax_ipu.errors import IpuInvalidArgument
from jax_ipu.model.fast.xla_chains import aligned_copy
from jax_ipu.pjrt._capi import Event
from jax_ipu.targets import AS_32, BFLOAT16, EMULATED_DTYPES, IPU_DTYPES

# PJRT_Buffer_Type codes <-> numpy dtypes (codes from the PJRT C API enum).
_PJRT_TYPES = {1: np.bool_, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
               6: np.uint8, 7: np.uint16, 8: np.uint32, 9: np.uint64,
               10: np.float16, 11: np.float32, 12: np.float64, 13: BFLOAT16, 14: np.complex64,
               15: np.complex128}
_NUMPY_TYPES = {np.dtype(t): code for code, t in _PJRT_TYPES.items()}
_HELD = ("it holds float32, float16, int32, uint32, int16, uint16, int8, uint8 and bool, and emulates bfloat16 "
         "and complex64")
# The other codes, to name them in errors (ml_dtypes' names, as JAX prints them).
_OTHER_TYPE_NAMES = {16: "float8_e5m2", 17: "float8_e4m3fn", 18: "float8_e4m3b11fnuz", 19: "float8_e5m2fnuz",
                     20: "float8_e4m3fnuz", 21: "int4", 22: "uint4", 23: "token", 24: "int2", 25: "uint2",
                     26: "float8_e4m3", 27: "float8_e3m4", 28: "float8_e8m0fnu", 29: "float4_e2m1fn"}


def numpy_dtype(pjrt_type: int) -> np.dtype:
    try:
        return np.dtype(_PJRT_TYPES[pjrt_type])
    except KeyError:
        name = _OTHER_TYPE_NAMES.get(pjrt_type, f"PJRT element type {pjrt_type}")
        raise IpuInvalidArgument(
            f"{name} arrays cannot be placed on an IPU: {_HELD}. Convert the array first "
            f"(e.g. x.astype(jnp.float16))") from None


def pjrt_type(dtype: np.dtype) -> int:
    return _NUMPY_TYPES[np.dtype(dtype)]


def check_ipu_dtype(dtype: np.dtype, f64_as_f32: bool = False, emulate_types: bool = True) -> None:
    dtype = np.dtype(dtype)
    if dtype in IPU_DTYPES or (f64_as_f32 and dtype in AS_32) or (emulate_types and dtype in EMULATED_DTYPES):
        return
    if dtype in EMULATED_DTYPES:
        raise IpuInvalidArgument(
            f"the IPU has no {dtype.name} arithmetic, and emulating it is turned off (JAX_IPU_EMULATE_TYPES=0): "
            f"convert the array first (e.g. x.astype(jnp.float32)), or unset JAX_IPU_EMULATE_TYPES")
    advice = " (or set JAX_IPU_F64_AS_F32=1 to hold it as a 32-bit type)" if dtype in AS_32 else ""
    if dtype == np.complex128:
        advice = " (complex64 is emulated: x.astype(jnp.complex64))"
    raise IpuInvalidArgument(
        f"the IPU has no {dtype.name} type; {_HELD}. Convert the array first (and keep "
        f"JAX_ENABLE_X64 off){advice}")


def to_device(array: np.ndarray, spec: ArraySpec) -> np.ndarray:
    """A host array as the device holds it: a copy, 64-bit types narrowed
    (JAX_IPU_F64_AS_F32); integers must fit the 32-bit type."""
    if spec.device_dtype == spec.dtype:
        return aligned_copy(array)  # the caller's memory is only lent
    if spec.dtype.kind in "iu" and array.size:
        info = np.iinfo(spec.device_dtype)
        low, high = array.min(), array.max()
        if low < info.min or high > info.max:
            raise IpuInvalidArgument(
                f"a {spec.dtype.name} array with values in [{low}, {high}] does not fit the "
                f"{spec.device_dtype.name} the IPU holds it as (JAX_IPU_F64_AS_F32)")
    return np.asarray(array, order="C").astype(spec.device_dtype)


class ArraySpec:
    """What a buffer's C handle reports: computed once per shape, shared by
    every buffer of it (executables make one per output at compile time).
    `dtype` is what JAX sees; `device_dtype` what the device holds (a
    64-bit type's 32-bit sibling, under JAX_IPU_F64_AS_F32). `layout`: the
    order of the dimensions the elements are held in, major first (None:
    row-major); the buffer holds the array transposed so, of `held_shape`
    (compiler.passes.layouts)."""

    __slots__ = ("dtype", "device_dtype", "shape", "dims", "dims_address", "pjrt_type", "nbytes", "layout",
                 "held_shape")

    def __init__(self, dtype: np.dtype, shape: tuple[int, ...], layout: tuple[int, ...] | None = None):
        self.layout = layout
        self.held_shape = tuple(int(d) for d in shape) if layout is None else tuple(int(shape[d]) for d in layout)
        self.dtype = np.dtype(dtype)
        self.device_dtype = AS_32.get(self.dtype, self.dtype)
        self.shape = tuple(int(d) for d in shape)
        self.dims = np.asarray(self.shape, dtype=np.int64)  # the C side points into it
        self.dims.flags.writeable = False
        self.dims_address = self.dims.ctypes.data
        self.pjrt_type = pjrt_type(self.dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @classmethod
    def of(cls, dtype, shape, layout: tuple[int, ...] | None = None) -> ArraySpec:
        """The one spec of a dtype, shape and layout, so that checks on every
        call compare identities (comparing numpy dtypes is slow)."""
        if layout is not None and tuple(layout) == tuple(range(len(layout))):
            layout = None
        key = (np.dtype(dtype), tuple(int(d) for d in shape), None if layout is None else tuple(layout))
        spec = _SPECS.get(key)
        if spec is None:
            spec = _SPECS.setdefault(key, cls(*key))
        return spec


_SPECS: dict = {}


class DeviceBuffer:
    __slots__ = ("device", "spec", "ready", "_array", "_error", "memory", "__weakref__")

    def __init__(self, device, spec: ArraySpec, array=None, memory: int = 0):
        self.device = device
        self.spec = spec
        self.memory = memory         # index into Device.memories: 0 tile SRAM, 1 streaming memory
        if memory:
            self._reserve_streaming()
        self.ready = Event()
        self._array = None
        self._error = None
        if array is not None:
            self.fulfil(array)

    dtype = property(lambda self: self.spec.dtype)
    shape = property(lambda self: self.spec.shape)
    dims = property(lambda self: self.spec.dims)
    pjrt_type = property(lambda self: self.spec.pjrt_type)
    nbytes = property(lambda self: self.spec.nbytes)

    @property
    def device_id(self) -> int:
        return self.device.id

    @property
    def holds_data(self) -> bool:
        return self._error is None and (self._array is not None or not self.ready.is_ready)

    def _reserve_streaming(self) -> None:
        device = self.device
        if device.streaming_bytes_in_use() + self.nbytes > device.streaming_limit:
            raise IpuInvalidArgument(
                f"streaming memory of {device.to_string} is full: {self.nbytes} B more would exceed its "
                f"{device.streaming_limit} B; delete arrays held there (x.delete())")
        device.streaming.add(self)

    # -- completion, by the device worker --
    def fulfil(self, array: np.ndarray) -> None:
        self._array = array
        self.ready.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self.ready.set(error)

    def array(self) -> np.ndarray:
        """The contents, once ready (the caller waits on `ready` first)."""
        if self._error is not None:
            raise self._error
        if self._array is None:
            raise IpuInvalidArgument("the IPU buffer has been deleted or donated")
        return self._array

    def take(self) -> np.ndarray:
        """The contents, handing their ownership over (donation)."""
        array = self.array()
        self._array = None
        return array

    def delete(self) -> None:
        self._array = None

    # -- transfers --
    def copy_to_host(self, dst: memoryview, offset: int = 0, order=None, raw: bool = False) -> Event:
        """Copies bytes [offset, offset+len(dst)) of the array into dst once
        ready; `order` permutes the dimensions (major to minor) for the host.
        raw: the bytes as the device holds them (in the buffer's layout)."""
        done = Event()
        if not self.ready.is_ready:
            self.device.worker.help()      # the host waits for it: no grace
        if self.ready.is_ready:
            self._copy(dst, offset, order, raw, done)
        else:
            self.device.worker.submit(lambda: self._copy(dst, offset, order, raw, done))
        return done

    def _copy(self, dst: memoryview, offset: int, order, raw: bool, done: Event) -> None:
        self.ready.wait()
        try:
            data = self.array()
            if self.spec.layout is not None and not raw:
                data = data.transpose(np.argsort(self.spec.layout))
            if order is not None:
                data = data.transpose(order)
            data = np.ascontiguousarray(data)
            if data.dtype != self.spec.dtype:   # held narrower (JAX_IPU_F64_AS_F32)
                data = data.astype(self.spec.dtype)
            flat = data.reshape(-1).view(np.uint8)
            np.frombuffer(dst, dtype=np.uint8)[:] = flat[offset:offset + len(dst)]
            # The link carries what the device holds (narrower under JAX_IPU_F64_AS_F32).
            self.device.transfers.device_to_host += len(dst) * self.spec.device_dtype.itemsize // self.spec.dtype.itemsize
            done.set()
        except BaseException as exc:  # reported through the event
            done.set(exc)

    def copy_to_device(self, device, memory: int = 0) -> DeviceBuffer:
        """A copy on another IPU of the same client (over IPU-Links, not the
        host link), or a fresh copy on the same IPU (JAX asks for one when it
        must not alias a buffer, or moves it between SRAM and streaming
        memory: `memory` says where the copy lives)."""
        out = DeviceBuffer(device, self.spec, memory=memory)

        def copy():
            self.ready.wait()
            try:
                out.fulfil(self.array().copy())
            except BaseException as exc:  # reported through the copy
                out.fail(exc)
        if not self.ready.is_ready:
            self.device.worker.help()
        if self.ready.is_ready:  # copy now: the caller may delete this buffer next
            copy()
        else:
            self.device.worker.submit(copy)
        return out

