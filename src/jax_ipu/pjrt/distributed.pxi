# ------------------------------------------- several processes (jax.distributed) --
# The key-value store JAX hands Client_Create (the coordination service of
# jax.distributed), as a Python object for jax_ipu.pjrt.distributed, and
# the process states the framework pushes with UpdateGlobalProcessInfo.

cdef PJRT_Error* kv_error(int code, const char* message, size_t size) noexcept nogil:
    # The framework reports a failed get or put with an error made by this
    # function, so that it is one of ours and its code and text readable.
    return make_error(code, message, size)

cdef PJRT_CallbackError KV_ERROR = kv_error

_CODE_NAMES = {code: name for name, code in CODES.items()}


cdef class KeyValueStore:
    """Blocking get (with a timeout), try_get and put on JAX's distributed
    key-value store; the framework prefixes every key with "ipu:". The GIL
    is let go while the framework waits for a key."""
    cdef PJRT_KeyValueGetCallback get_fn
    cdef void* get_arg
    cdef PJRT_KeyValuePutCallback put_fn
    cdef void* put_arg
    cdef PJRT_KeyValueTryGetCallback try_get_fn
    cdef void* try_get_arg

    def get(self, key, timeout_seconds: float) -> bytes:
        cdef PJRT_KeyValueGetCallback_Args a
        cdef PJRT_Error* err
        k = as_bytes(key)
        memset(&a, 0, sizeof(a))
        a.struct_size = sizeof(a)
        a.key = PyBytes_AS_STRING(k)
        a.key_size = PyBytes_GET_SIZE(k)
        a.timeout_in_ms = <int>max(1, min(timeout_seconds * 1000, 2**31 - 1))
        a.callback_error = &KV_ERROR
        a.user_arg = self.get_arg
        with nogil:
            err = self.get_fn(&a)
        if err != NULL:
            self._raise(err, f"getting {k.decode()!r}")
        return self._value(a.value, a.value_size, a.value_deleter_callback)

    def try_get(self, key):
        """The value, or None when the key is not there (yet)."""
        cdef PJRT_KeyValueTryGetCallback_Args a
        cdef PJRT_Error* err
        if self.try_get_fn == NULL:
            raise NotImplementedError("this jaxlib does not pass kv_try_get to plugins")
        k = as_bytes(key)
        memset(&a, 0, sizeof(a))
        a.struct_size = sizeof(a)
        a.key = PyBytes_AS_STRING(k)
        a.key_size = PyBytes_GET_SIZE(k)
        a.callback_error = &KV_ERROR
        a.user_arg = self.try_get_arg
        with nogil:
            err = self.try_get_fn(&a)
        if err != NULL:
            if err.code == CODE_NOT_FOUND:
                error_destroy_fn(err)
                return None
            self._raise(err, f"getting {k.decode()!r}")
        return self._value(a.value, a.value_size, a.value_deleter_callback)

    def put(self, key, value) -> None:
        cdef PJRT_KeyValuePutCallback_Args a
        cdef PJRT_Error* err
        k, v = as_bytes(key), as_bytes(value)
        memset(&a, 0, sizeof(a))
        a.struct_size = sizeof(a)
        a.key = PyBytes_AS_STRING(k)
        a.key_size = PyBytes_GET_SIZE(k)
        a.value = PyBytes_AS_STRING(v)
        a.value_size = PyBytes_GET_SIZE(v)
        a.callback_error = &KV_ERROR
        a.user_arg = self.put_arg
        with nogil:
            err = self.put_fn(&a)
        if err != NULL:
            self._raise(err, f"putting {k.decode()!r}")

    cdef object _value(self, char* value, size_t size, PJRT_KeyValueDeleter deleter):
        out = value[:size] if value != NULL else b""
        if value != NULL and deleter != NULL:
            deleter(value)
        return out

    cdef _raise(self, PJRT_Error* err, str what):
        from jax_ipu.pjrt.distributed import KeyValueError
        code, text = err.code, err.message[:err.message_size].decode("utf-8", "replace")
        error_destroy_fn(err)
        raise KeyValueError(_CODE_NAMES.get(code, str(code)), f"jax.distributed's key-value store, {what}: {text}")


cdef object key_value_store(PJRT_Client_Create_Args* a):
    """The store JAX passed, or None (one process, no jax.distributed)."""
    cdef KeyValueStore store
    if a.kv_get_callback == NULL or a.kv_put_callback == NULL:
        return None
    store = KeyValueStore.__new__(KeyValueStore)
    store.get_fn, store.get_arg = a.kv_get_callback, a.kv_get_user_arg
    store.put_fn, store.put_arg = a.kv_put_callback, a.kv_put_user_arg
    if ipu_create_has_try_get(a):
        store.try_get_fn, store.try_get_arg = a.kv_try_get_callback, a.kv_try_get_user_arg
    return store


cdef PJRT_Error* e_client_update_global_process_info(PJRT_Client_UpdateGlobalProcessInfo_Args* a) noexcept nogil:
    cdef size_t i
    cdef PJRT_ProcessInfo* info
    with gil:
        saved = py_enter()
        try:
            infos = []
            for i in range(a.num_process_infos):
                info = &a.process_infos[i]
                message = info.error_message[:info.error_message_size].decode("utf-8", "replace") \
                    if info.error_message != NULL else ""
                infos.append((info.task_id, info.state, info.error_code, message))
            (<object>a.client.py).update_process_info(infos)
            return NULL
        except BaseException as exc:
            return error_from_exception(exc)
        finally:
            py_leave(saved)
