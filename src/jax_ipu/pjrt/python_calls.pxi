# -------------------------------------------------------------- Python calls --
# `py_enter`/`py_leave` bracket every entry into Python from a C callback:
# the caller may have a Python exception pending (a destructor running while
# an exception unwinds), which must survive untouched.

cdef struct SavedError:
    PyObject* type
    PyObject* value
    PyObject* traceback

cdef inline SavedError py_enter() noexcept:
    cdef SavedError s
    PyErr_Fetch(&s.type, &s.value, &s.traceback)
    return s

cdef inline void py_leave(SavedError s) noexcept:
    PyErr_Restore(s.type, s.value, s.traceback)

cdef inline bint python_is_gone() noexcept nogil:
    return _Py_IsFinalizing() != 0


# References released on threads that do not hold the GIL wait here until a
# thread that does drains them. Taking the GIL on a framework thread is what
# must never happen: during interpreter shutdown it ends that thread through
# a C++ destructor, and the process aborts.
cdef struct Released:
    void* obj
    Released* next

cdef pthread_mutex_t RELEASED_LOCK
pthread_mutex_init(&RELEASED_LOCK, NULL)
cdef Released* RELEASED = NULL

cdef void py_release(void* obj) noexcept nogil:
    """Drops a reference the C side holds, safely from any thread."""
    global RELEASED
    cdef Released* r
    if obj == NULL or python_is_gone():
        return
    if PyGILState_Check():
        with gil:
            saved = py_enter()
            Py_DECREF(<object>obj)
            py_leave(saved)
        return
    r = <Released*>malloc(sizeof(Released))
    r.obj = obj
    pthread_mutex_lock(&RELEASED_LOCK)
    r.next = RELEASED
    RELEASED = r
    pthread_mutex_unlock(&RELEASED_LOCK)

cdef void drain_released_now() noexcept:
    """With the GIL held: drops the references other threads released."""
    global RELEASED
    cdef Released* r
    cdef Released* nxt
    if RELEASED == NULL:    # a racy read, but only a hint: the next drain sees it
        return
    # The lock's holders never wait for the GIL, so it is taken without
    # letting the GIL go (which would hand it to a waiting worker).
    pthread_mutex_lock(&RELEASED_LOCK)
    r = RELEASED
    RELEASED = NULL
    pthread_mutex_unlock(&RELEASED_LOCK)
    while r != NULL:
        nxt = r.next
        Py_DECREF(<object>r.obj)
        free(r)
        r = nxt


def drain_released():
    """Drops references the framework released on its own threads (the
    device workers call this between jobs)."""
    drain_released_now()

