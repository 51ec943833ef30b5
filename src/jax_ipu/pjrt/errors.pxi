# ---------------------------------------------------------------- errors --

cdef void error_destroy_fn(PJRT_Error* e) noexcept nogil:
    if e != NULL:
        free(e.message)
        free(e)

cdef void error_message_fn(const PJRT_Error* e, const char** msg, size_t* size) noexcept nogil:
    msg[0] = e.message
    size[0] = e.message_size

cdef int error_get_code_fn(const PJRT_Error* e) noexcept nogil:
    return e.code

cdef void error_for_each_payload_fn(const PJRT_Error* e, PayloadVisitor v, void* arg) noexcept nogil:
    pass  # jax-ipu errors carry no payloads

cdef ErrorVTable ERROR_VTABLE
ERROR_VTABLE.struct_size = sizeof(ErrorVTable)
ERROR_VTABLE.instance_size = sizeof(PJRT_Error)
ERROR_VTABLE.extension_start = NULL
ERROR_VTABLE.destroy = error_destroy_fn
ERROR_VTABLE.message = error_message_fn
ERROR_VTABLE.get_code = error_get_code_fn
ERROR_VTABLE.for_each_payload = error_for_each_payload_fn

cdef PJRT_Error* make_error(int code, const char* msg, size_t size) noexcept nogil:
    cdef PJRT_Error* e = <PJRT_Error*>malloc(sizeof(PJRT_Error))
    e.vtable = &ERROR_VTABLE
    e.code = code
    e.message = <char*>malloc(size + 1)
    memcpy(e.message, msg, size)
    e.message[size] = 0
    e.message_size = size
    return e

cdef public PJRT_Error* ipu_unimplemented(const char* name) noexcept nogil:
    cdef char buf[256]
    cdef const char* prefix = b"jax-ipu does not implement "
    cdef size_t n = strlen(prefix), m = strlen(name)
    if n + m > 250:
        m = 250 - n
    memcpy(buf, prefix, n)
    memcpy(buf + n, name, m)
    return make_error(CODE_UNIMPLEMENTED, buf, n + m)

cdef PJRT_Error* error_from_exception(object exc) noexcept:
    """Turns a Python exception into a PJRT_Error. Never raises."""
    try:
        code = CODES.get(getattr(exc, "pjrt_code", None), None)
        if code is None:
            code = CODE_UNIMPLEMENTED if isinstance(exc, NotImplementedError) else (
                CODE_INVALID_ARGUMENT if isinstance(exc, (ValueError, TypeError)) else
                CODE_RESOURCE_EXHAUSTED if isinstance(exc, MemoryError) else CODE_INTERNAL)
        text = str(exc) or type(exc).__name__
        if not getattr(exc, "pjrt_code", None):
            text = f"{type(exc).__name__}: {text}"
        msg = text.encode("utf-8", "replace")
        if isinstance(exc, KeyboardInterrupt):
            PyErr_SetInterrupt()     # Ctrl-C while a run was ours to do: the user's program stops
        return make_error(code, msg, len(msg))
    except BaseException:
        return make_error(CODE_INTERNAL, b"jax-ipu: error while reporting an error", 39)

cdef tuple run_error_parts(object error):
    """(code, message) of a run's error, as its outputs and events report
    it (and Execute, for a call that waits for its run): the error's own
    PJRT code, or INTERNAL (RESOURCE_EXHAUSTED for MemoryError) with the
    exception's type and message, as XLA:CPU reports a failed callback."""
    code = CODES.get(getattr(error, "pjrt_code", None),
                     CODE_RESOURCE_EXHAUSTED if isinstance(error, MemoryError) else CODE_INTERNAL)
    text = str(error) if getattr(error, "pjrt_code", None) else f"{type(error).__name__}: {error}"
    return code, text.encode("utf-8", "replace")

cdef PJRT_Error* error_from_run(object exc) noexcept:
    """A failed run's error, returned by the Execute that waited for it.
    Never raises."""
    try:
        code, msg = run_error_parts(exc)
        if isinstance(exc, KeyboardInterrupt):
            PyErr_SetInterrupt()     # Ctrl-C in a callback: the user's program stops, as it would on the CPU
        return make_error(code, msg, len(msg))
    except BaseException:
        return make_error(CODE_INTERNAL, b"jax-ipu: error while reporting an error", 39)

cdef PJRT_Error* error_from_text(int code, str text) noexcept:
    msg = text.encode("utf-8", "replace")
    return make_error(code, msg, len(msg))


cdef PJRT_Error* e_error_destroy(PJRT_Error_Destroy_Args* a) noexcept nogil:
    error_destroy_fn(a.error)
    return NULL

cdef PJRT_Error* e_error_message(PJRT_Error_Message_Args* a) noexcept nogil:
    a.message = a.error.message
    a.message_size = a.error.message_size
    return NULL

cdef PJRT_Error* e_error_get_code(PJRT_Error_GetCode_Args* a) noexcept nogil:
    a.code = a.error.code
    return NULL

cdef PJRT_Error* e_error_for_each_payload(void* a) noexcept nogil:
    return NULL

