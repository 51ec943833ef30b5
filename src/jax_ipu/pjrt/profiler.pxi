# -------------------------------------------------------------- profiler --
# jax.profiler's tracer for the IPUs (the PJRT profiler extension's
# PLUGIN_Profiler_Api). Each profiler holds a jax_ipu.profile.tracing.Tracer;
# its collection, a serialized XSpace, stays owned here until the next
# collection or destroy. Errors are jax-ipu PJRT_Errors.

cdef void e_profiler_error_destroy(PLUGIN_Profiler_Error_Destroy_Args* a) noexcept nogil:
    error_destroy_fn(a.error)

cdef void e_profiler_error_message(PLUGIN_Profiler_Error_Message_Args* a) noexcept nogil:
    if a.error == NULL:
        a.message, a.message_size = b"", 0
        return
    a.message = a.error.message
    a.message_size = a.error.message_size

cdef PLUGIN_Profiler_Error* e_profiler_error_get_code(PLUGIN_Profiler_Error_GetCode_Args* a) noexcept nogil:
    a.code = a.error.code if a.error != NULL else CODE_OK
    return NULL

cdef PLUGIN_Profiler_Error* profiler_gone() noexcept nogil:
    cdef const char* msg = b"jax-ipu: the profiler was called after Python shut down"
    return make_error(CODE_FAILED_PRECONDITION, msg, strlen(msg))

cdef PLUGIN_Profiler_Error* profiler_missing() noexcept nogil:
    cdef const char* msg = b"jax-ipu: no profiler given"
    return make_error(CODE_INVALID_ARGUMENT, msg, strlen(msg))

cdef PLUGIN_Profiler_Error* e_profiler_create(PLUGIN_Profiler_Create_Args* a) noexcept nogil:
    cdef PLUGIN_Profiler* p
    if python_is_gone():
        return profiler_gone()
    with gil:
        saved = py_enter()
        try:
            from jax_ipu.profile import tracing
            options = a.options[:a.options_size] if a.options != NULL else b""
            tracer = tracing.Tracer(options)
            p = <PLUGIN_Profiler*>calloc(1, sizeof(PLUGIN_Profiler))
            if p == NULL:
                raise MemoryError("jax-ipu: no memory for a profiler")
            Py_INCREF(tracer)
            p.py = <void*>tracer
            a.profiler = p
            return NULL
        except BaseException as exc:
            return error_from_exception(exc)
        finally:
            py_leave(saved)

cdef PLUGIN_Profiler_Error* e_profiler_destroy(PLUGIN_Profiler_Args* a) noexcept nogil:
    cdef PLUGIN_Profiler* p = a.profiler
    if p == NULL:
        return NULL
    if not python_is_gone():
        with gil:
            saved = py_enter()
            try:
                (<object>p.py).stop()      # a trace dropped unstopped records no more
            except BaseException:
                pass
            py_leave(saved)
    py_release(p.py)
    py_release(p.data)
    free(p)
    return NULL

cdef PLUGIN_Profiler_Error* profiler_switch(PLUGIN_Profiler* p, bint start) noexcept nogil:
    if p == NULL:
        return profiler_missing()
    if python_is_gone():
        return profiler_gone()
    with gil:
        saved = py_enter()
        try:
            if start:
                (<object>p.py).start()
            else:
                (<object>p.py).stop()
            return NULL
        except BaseException as exc:
            return error_from_exception(exc)
        finally:
            py_leave(saved)

cdef PLUGIN_Profiler_Error* e_profiler_start(PLUGIN_Profiler_Args* a) noexcept nogil:
    return profiler_switch(a.profiler, True)

cdef PLUGIN_Profiler_Error* e_profiler_stop(PLUGIN_Profiler_Args* a) noexcept nogil:
    return profiler_switch(a.profiler, False)

cdef PLUGIN_Profiler_Error* e_profiler_collect_data(PLUGIN_Profiler_CollectData_Args* a) noexcept nogil:
    cdef PLUGIN_Profiler* p = a.profiler
    cdef char* data
    cdef size_t size
    if p == NULL:
        return profiler_missing()
    if python_is_gone():
        return profiler_gone()
    with gil:
        saved = py_enter()
        try:
            # The first call (no buffer) collects; a second with a buffer
            # copies the same bytes into it.
            if a.buffer == NULL or p.data == NULL:
                collected = (<object>p.py).collect()
                if not isinstance(collected, bytes):
                    raise TypeError(f"the IPU tracer collected {type(collected).__name__}, not bytes")
                if p.data != NULL:
                    Py_DECREF(<object>p.data)
                Py_INCREF(collected)
                p.data = <void*>collected
            data = PyBytes_AS_STRING(<object>p.data)
            size = PyBytes_GET_SIZE(<object>p.data)
            if a.buffer == NULL:
                a.buffer = <unsigned char*>data
            elif <char*>a.buffer != data:
                memcpy(a.buffer, data, size)
            a.buffer_size_in_bytes = size
            return NULL
        except BaseException as exc:
            return error_from_exception(exc)
        finally:
            py_leave(saved)
