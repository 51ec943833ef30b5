# --------------------------------------------------------------- layouts --
# The layouts extension: device-local layouts of buffers (jax.Array.format),
# each held as the text XLA prints it in, "{1,0}" (minor to major), which
# jaxlib's PjRtLayout::Deserialize reads.

cdef PJRT_Layouts_MemoryLayout* layout_from_text(const char* text, size_t size) noexcept nogil:
    """A layout handle owning a copy of `text`; NULL when out of memory."""
    cdef PJRT_Layouts_MemoryLayout* layout = <PJRT_Layouts_MemoryLayout*>malloc(sizeof(PJRT_Layouts_MemoryLayout))
    if layout == NULL:
        return NULL
    layout.text = <char*>malloc(size + 1)
    if layout.text == NULL:
        free(layout)
        return NULL
    memcpy(layout.text, text, size)
    layout.text[size] = 0
    layout.text_size = size
    return layout

cdef void free_layout(PJRT_Layouts_MemoryLayout* layout) noexcept nogil:
    if layout != NULL:
        free(layout.text)
        free(layout)

cdef PJRT_Layouts_MemoryLayout* row_major_layout(size_t rank) noexcept nogil:
    """{rank-1,...,1,0}: the last dimension minor (the default layout)."""
    cdef char text[1024]
    cdef size_t pos = 1, i
    cdef int written
    text[0] = b'{'
    for i in range(rank):
        if i:
            text[pos] = b','
            pos += 1
        written = snprintf(text + pos, sizeof(text) - pos, "%zu", rank - 1 - i)
        if written < 0 or <size_t>written >= sizeof(text) - pos - 1:
            return NULL
        pos += written
    text[pos] = b'}'
    return layout_from_text(text, pos + 1)

cdef PJRT_Error* no_layout_memory() noexcept nogil:
    return make_error(CODE_RESOURCE_EXHAUSTED, b"out of host memory for a layout", 31)

cdef PJRT_Error* e_layout_destroy(PJRT_Layouts_MemoryLayout_Destroy_Args* a) noexcept nogil:
    free_layout(a.layout)
    return NULL

cdef PJRT_Error* e_layout_serialize(PJRT_Layouts_MemoryLayout_Serialize_Args* a) noexcept nogil:
    cdef PJRT_Layouts_MemoryLayout* copy = layout_from_text(a.layout.text, a.layout.text_size)
    if copy == NULL:
        return no_layout_memory()
    a.serialized_layout = copy
    a.serialized_bytes = copy.text
    a.serialized_bytes_size = copy.text_size
    a.serialized_layout_deleter = free_layout
    return NULL

cdef PJRT_Error* e_default_layout(PJRT_Layouts_DefaultLayout_Args* a) noexcept nogil:
    """Client_GetDefaultLayout and Topology_GetDefaultLayout: row-major."""
    a.layout = row_major_layout(a.num_dims)
    return no_layout_memory() if a.layout == NULL else NULL

cdef PJRT_Error* e_buffer_layout(PJRT_Layouts_PJRT_Buffer_MemoryLayout_Args* a) noexcept nogil:
    cdef PJRT_Buffer* b = a.buffer
    with gil:
        saved = py_enter()
        try:
            order = (<object>b.py).spec.layout
            if order is None:
                a.layout = row_major_layout(b.num_dims)
            else:
                text = ("{" + ",".join(str(d) for d in reversed(order)) + "}").encode()
                a.layout = layout_from_text(text, len(text))
            return no_layout_memory() if a.layout == NULL else NULL
        except BaseException as exc:
            return error_from_exception(exc)
        finally:
            py_leave(saved)

cdef object device_layout_order(const PJRT_Buffer_MemoryLayout* layout, size_t rank):
    """The layout JAX asks a new buffer to be held in (device_layout), as
    the order of its dimensions, major first; None for row-major."""
    cdef size_t i
    if layout == NULL:
        return None
    if layout.type == LAYOUT_TILED and layout.tiled.num_tiles == 0:
        order = tuple(layout.tiled.minor_to_major[layout.tiled.minor_to_major_size - 1 - i]
                      for i in range(layout.tiled.minor_to_major_size))
        if sorted(order) != list(range(rank)):
            raise ValueError(f"device layout {order} does not order the {rank} dimensions of the array")
        return None if order == tuple(range(rank)) else order
    raise NotImplementedError("an IPU array's layout is an order of its dimensions "
                              "(Layout(major_to_minor=...)); tiled or strided device layouts are not supported")
