# --------------------------------------------------------------- buffers --

cdef PJRT_Buffer* wrap_buffer(PJRT_Client* c, object py_buffer) except NULL:
    """A C handle for a jax_ipu.pjrt.buffer.DeviceBuffer (which owns `dims`)."""
    # Paid for every output of every run: plain attribute reads, and the
    # dimensions read in place from the spec's array (which the buffer keeps).
    spec = py_buffer.spec
    cdef size_t num_dims = len(<tuple>spec.shape)
    cdef uintptr_t dims_address = spec.dims_address
    cdef PJRT_Buffer* b = <PJRT_Buffer*>calloc(1, sizeof(PJRT_Buffer))
    Py_INCREF(py_buffer)
    b.py = <void*>py_buffer
    b.client = c
    b.device = device_by_id(c, py_buffer.device.id)
    b.memory = b.device.memories[<int>py_buffer.memory]
    b.type = spec.pjrt_type
    b.num_dims = num_dims
    b.dims = <int64_t*>dims_address if num_dims else NULL
    b.nbytes = spec.nbytes
    b.ready = event_of(py_buffer.ready)
    if b.memory.kind_id != 0:       # streaming memory: not the SRAM JAX's memory stats describe
        return b
    ipu_atomic_add64(&b.device.bytes_in_use, <int64_t>b.nbytes)
    ipu_atomic_add64(&b.device.num_allocs, 1)
    if b.device.bytes_in_use > b.device.peak_bytes_in_use:
        b.device.peak_bytes_in_use = b.device.bytes_in_use
    return b

cdef void buffer_drop_storage(PJRT_Buffer* b) noexcept nogil:
    if not b.deleted:
        b.deleted = 1
        if b.memory.kind_id == 0:
            ipu_atomic_add64(&b.device.bytes_in_use, -<int64_t>b.nbytes)

cdef void buffer_free(PJRT_Buffer* b) noexcept nogil:
    if b != NULL:
        buffer_drop_storage(b)
        event_unref(b.ready)
        py_release(b.py)
        free(b)

cdef PJRT_Error* e_buffer_destroy(PJRT_Buffer_Args* a) noexcept nogil:
    buffer_free(a.buffer)
    return NULL

cdef PJRT_Error* e_buffer_delete(PJRT_Buffer_Args* a) noexcept nogil:
    cdef PJRT_Buffer* b = a.buffer
    if b.deleted:
        return NULL
    buffer_drop_storage(b)
    with gil:
        saved = py_enter()
        try:
            (<object>b.py).delete()
            return NULL
        except BaseException as exc:
            return error_from_exception(exc)
        finally:
            py_leave(saved)

cdef PJRT_Error* e_buffer_is_deleted(PJRT_Buffer_Bool_Args* a) noexcept nogil:
    a.value = a.buffer.deleted != 0
    return NULL

cdef PJRT_Error* e_buffer_is_on_cpu(PJRT_Buffer_Bool_Args* a) noexcept nogil:
    # IPU buffers live in tile SRAM: the host may not alias them, so JAX
    # copies out and donation is never defeated by a live host view.
    a.value = False
    return NULL

cdef PJRT_Error* e_buffer_element_type(PJRT_Buffer_ElementType_Args* a) noexcept nogil:
    a.type = a.buffer.type
    return NULL

cdef PJRT_Error* e_buffer_dimensions(PJRT_Buffer_Dimensions_Args* a) noexcept nogil:
    a.dims = a.buffer.dims
    a.num_dims = a.buffer.num_dims
    return NULL

cdef PJRT_Error* e_buffer_dynamic_dimension_indices(PJRT_Buffer_DynamicDimensionIndices_Args* a) noexcept nogil:
    a.indices = NULL
    a.num = 0
    return NULL

cdef PJRT_Error* e_buffer_on_device_size(PJRT_Buffer_Size_Args* a) noexcept nogil:
    a.value = a.buffer.nbytes
    return NULL

cdef PJRT_Error* e_buffer_device(PJRT_Buffer_Device_Args* a) noexcept nogil:
    a.device = a.buffer.device
    return NULL

cdef PJRT_Error* e_buffer_memory(PJRT_Buffer_Memory_Args* a) noexcept nogil:
    a.memory = a.buffer.memory
    return NULL

cdef PJRT_Error* e_buffer_ready_event(PJRT_Buffer_ReadyEvent_Args* a) noexcept nogil:
    a.event = event_ref(a.buffer.ready)
    # Someone will wait for (or poll) this buffer: its device's deferred
    # quick runs run now, on this thread, and the rest get no grace. Only on
    # a thread Python knows (never take the GIL on a framework thread);
    # elsewhere the grace simply runs out.
    if not a.buffer.ready.ready and PyGILState_GetThisThreadState() != NULL and not python_is_gone():
        want_device_of(a.buffer.py)
    return NULL

cdef void want_device_of(void* py_buffer) noexcept with gil:
    saved = py_enter()
    try:
        (<object>py_buffer).device.worker.wanted()
    except BaseException:
        pass    # only a hint: the worker runs the job after its grace anyway
    py_leave(saved)

cdef PJRT_Error* e_buffer_increase_external_refs(PJRT_Buffer_Args* a) noexcept nogil:
    ipu_atomic_add(&a.buffer.external_refs, 1)
    return NULL

cdef PJRT_Error* e_buffer_decrease_external_refs(PJRT_Buffer_Args* a) noexcept nogil:
    if ipu_atomic_add(&a.buffer.external_refs, -1) < 0:
        ipu_atomic_add(&a.buffer.external_refs, 1)
        return make_error(CODE_FAILED_PRECONDITION, b"external reference count is already zero", 40)
    return NULL

cdef PJRT_Error* deleted_buffer_error(PJRT_Buffer* b) noexcept nogil:
    return make_error(CODE_FAILED_PRECONDITION, b"the IPU buffer has been deleted or donated", 42)

cdef object host_dimension_order(const PJRT_Buffer_MemoryLayout* layout, PJRT_Buffer* b):
    """The host layout JAX asks for, as the order of dimensions from major
    to minor; None for plain row-major."""
    cdef size_t i
    if layout == NULL:
        return None
    if layout.type == LAYOUT_TILED and layout.tiled.num_tiles == 0:
        order = tuple(layout.tiled.minor_to_major[layout.tiled.minor_to_major_size - 1 - i]
                      for i in range(layout.tiled.minor_to_major_size))
        return None if order == tuple(range(b.num_dims)) else order
    if layout.type == LAYOUT_STRIDES:
        import numpy as np
        from jax_ipu.pjrt.buffer import numpy_dtype
        shape = tuple(b.dims[i] for i in range(b.num_dims))
        strides = tuple(layout.strides.byte_strides[i] for i in range(layout.strides.num_byte_strides))
        if strides == np.empty(shape, numpy_dtype(b.type)).strides:
            return None
    raise NotImplementedError("jax-ipu copies arrays to the host row-major or in a permuted "
                              "dimension order; tiled or strided host layouts are not supported")


cdef PJRT_Error* e_buffer_to_host(PJRT_Buffer_ToHostBuffer_Args* a) noexcept nogil:
    cdef PJRT_Buffer* b = a.src
    if a.dst == NULL:
        a.dst_size = b.nbytes
        return NULL
    if b.deleted:
        return deleted_buffer_error(b)
    if a.dst_size < b.nbytes:
        return make_error(CODE_INVALID_ARGUMENT, b"host buffer too small for the IPU buffer", 40)
    with gil:
        saved = py_enter()
        try:
            order = host_dimension_order(a.host_layout, b)
            dst = PyMemoryView_FromMemory(<char*>a.dst, b.nbytes, PyBUF_WRITE)
            a.event = event_of((<object>b.py).copy_to_host(dst, 0, order))
            return NULL
        except BaseException as exc:
            return error_from_exception(exc)
        finally:
            py_leave(saved)

cdef PJRT_Error* e_buffer_copy_raw_to_host(PJRT_Buffer_CopyRawToHost_Args* a) noexcept nogil:
    cdef PJRT_Buffer* b = a.buffer
    if b.deleted:
        return deleted_buffer_error(b)
    if a.offset < 0 or a.transfer_size < 0 or <size_t>(a.offset + a.transfer_size) > b.nbytes:
        return make_error(CODE_INVALID_ARGUMENT, b"raw copy out of the buffer's bounds", 35)
    with gil:
        saved = py_enter()
        try:
            dst = PyMemoryView_FromMemory(<char*>a.dst, a.transfer_size, PyBUF_WRITE)
            a.event = event_of((<object>b.py).copy_to_host(dst, a.offset, None, True))
            return NULL
        except BaseException as exc:
            return error_from_exception(exc)
        finally:
            py_leave(saved)

cdef PJRT_Error* copy_buffer_to(PJRT_Buffer* b, PJRT_Device* dst, int memory, PJRT_Buffer** out) noexcept nogil:
    if b.deleted:
        return deleted_buffer_error(b)
    with gil:
        saved = py_enter()
        try:
            out[0] = wrap_buffer(b.client, (<object>b.client.py).copy_buffer(<object>b.py, dst.id, memory, dst.bytes_in_use))
            return NULL
        except BaseException as exc:
            return error_from_exception(exc)
        finally:
            py_leave(saved)

cdef PJRT_Error* e_buffer_copy_to_device(PJRT_Buffer_CopyToDevice_Args* a) noexcept nogil:
    return copy_buffer_to(a.buffer, a.dst_device, 0, &a.dst_buffer)

cdef PJRT_Error* e_buffer_copy_to_memory(PJRT_Buffer_CopyToMemory_Args* a) noexcept nogil:
    return copy_buffer_to(a.buffer, a.dst_memory.device, a.dst_memory.kind_id, &a.dst_buffer)


cdef object host_array(PJRT_Client_BufferFromHostBuffer_Args* a):
    """A read-only numpy view of the caller's host data (strides honoured)."""
    import numpy as np
    from jax_ipu.pjrt.buffer import numpy_dtype
    dtype = numpy_dtype(a.type)
    shape = tuple(a.dims[i] for i in range(a.num_dims))
    count = 1
    for d in shape:
        count *= d
    if count == 0:
        return np.empty(shape, dtype)
    if a.num_byte_strides == 0:
        strides = None
        lo, hi = 0, count * dtype.itemsize
    else:
        strides = tuple(a.byte_strides[i] for i in range(a.num_byte_strides))
        lo = sum(s * (d - 1) for s, d in zip(strides, shape) if s < 0)
        hi = sum(s * (d - 1) for s, d in zip(strides, shape) if s > 0) + dtype.itemsize
    cdef Py_ssize_t start = lo, length = hi - lo
    span = PyMemoryView_FromMemory(<char*>a.data + start, length, PyBUF_READ)
    flat = np.frombuffer(span, dtype=np.uint8)
    return np.ndarray(shape, dtype, buffer=flat, offset=-lo, strides=strides)

cdef PJRT_Error* e_client_buffer_from_host(PJRT_Client_BufferFromHostBuffer_Args* a) noexcept nogil:
    cdef PJRT_Device* dev = a.device
    cdef int memory = 0
    if a.memory != NULL:
        dev = a.memory.device
        memory = a.memory.kind_id
    if dev == NULL:
        dev = a.client.devices[0]
    with gil:
        saved = py_enter()
        try:
            order = device_layout_order(<PJRT_Buffer_MemoryLayout*>a.device_layout, a.num_dims)
            drain_released_now()
            py_buffer = (<object>a.client.py).buffer_from_host(host_array(a), dev.id, memory, dev.bytes_in_use,
                                                              order)
            a.buffer = wrap_buffer(a.client, py_buffer)
            # The data was copied during the call: the host buffer is free now.
            a.done_with_host_buffer = ready_event()
            return NULL
        except BaseException as exc:
            return error_from_exception(exc)
        finally:
            py_leave(saved)

