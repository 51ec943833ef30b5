# ---------------------------------------------------------------- events --

cdef PJRT_Event* event_new() noexcept nogil:
    cdef PJRT_Event* ev = <PJRT_Event*>calloc(1, sizeof(PJRT_Event))
    pthread_mutex_init(&ev.lock, NULL)
    pthread_cond_init(&ev.done, NULL)
    ev.refs = 1
    return ev

cdef inline PJRT_Event* event_ref(PJRT_Event* ev) noexcept nogil:
    ipu_atomic_add(&ev.refs, 1)
    return ev

cdef void event_unref(PJRT_Event* ev) noexcept nogil:
    if ev == NULL or ipu_atomic_add(&ev.refs, -1) != 0:
        return
    pthread_mutex_destroy(&ev.lock)
    pthread_cond_destroy(&ev.done)
    free(ev.message)
    free(ev)

cdef PJRT_Error* event_error(PJRT_Event* ev) noexcept nogil:
    if ev.code == CODE_OK:
        return NULL
    return make_error(ev.code, ev.message, ev.message_size)

cdef Waiter* event_complete(PJRT_Event* ev, int code, const char* msg, size_t size) noexcept nogil:
    """Completes the event once; returns the waiters the caller must run."""
    cdef Waiter* w
    pthread_mutex_lock(&ev.lock)
    if ev.ready:
        pthread_mutex_unlock(&ev.lock)
        return NULL
    if code != CODE_OK:
        ev.message = <char*>malloc(size + 1)
        memcpy(ev.message, msg, size)
        ev.message[size] = 0
        ev.message_size = size
    ev.code = code
    ev.ready = 1
    w = ev.waiters
    ev.waiters = NULL
    pthread_cond_broadcast(&ev.done)
    pthread_mutex_unlock(&ev.lock)
    return w

cdef void run_waiters(PJRT_Event* ev, Waiter* w) noexcept nogil:
    cdef Waiter* nxt
    while w != NULL:
        nxt = w.next
        w.callback(event_error(ev), w.user_arg)
        free(w)
        w = nxt

cdef void event_set(PJRT_Event* ev, int code, const char* msg, size_t size) noexcept nogil:
    run_waiters(ev, event_complete(ev, code, msg, size))

cdef void event_wait(PJRT_Event* ev) noexcept nogil:
    pthread_mutex_lock(&ev.lock)
    while not ev.ready:
        pthread_cond_wait(&ev.done, &ev.lock)
    pthread_mutex_unlock(&ev.lock)


cdef class Event:
    """A completion signal shared between a Python worker and the framework."""
    cdef PJRT_Event* ev

    def __cinit__(self):
        self.ev = event_new()

    def __dealloc__(self):
        event_unref(self.ev)

    def set(self, error=None):
        """Completes the event; `error` is None or an exception."""
        cdef bytes msg = b""
        cdef int code = CODE_OK
        cdef const char* p
        cdef size_t n
        cdef Waiter* waiters
        if error is not None:
            code, msg = run_error_parts(error)
        p = msg
        n = len(msg)
        waiters = event_complete(self.ev, code, p, n)
        if waiters != NULL:
            # The framework's callbacks run without the GIL: they may block.
            with nogil:
                run_waiters(self.ev, waiters)

    @property
    def is_ready(self):
        return bool(self.ev.ready)

    @property
    def error_message(self):
        if not self.ev.ready or self.ev.code == CODE_OK:
            return None
        return self.ev.message[:self.ev.message_size].decode("utf-8", "replace")

    def wait(self):
        with nogil:
            event_wait(self.ev)


cdef PJRT_Event* event_of(object py_event) except NULL:
    return event_ref((<Event>py_event).ev)

cdef PJRT_Event* ready_event() noexcept nogil:
    cdef PJRT_Event* ev = event_new()
    event_set(ev, CODE_OK, NULL, 0)
    return ev


cdef PJRT_Error* e_event_destroy(PJRT_Event_Args* a) noexcept nogil:
    event_unref(a.event)
    return NULL

cdef PJRT_Error* e_event_is_ready(PJRT_Event_IsReady_Args* a) noexcept nogil:
    a.is_ready = a.event.ready != 0
    return NULL

cdef PJRT_Error* e_event_error(PJRT_Event_Args* a) noexcept nogil:
    return event_error(a.event)

cdef PJRT_Error* e_event_await(PJRT_Event_Args* a) noexcept nogil:
    event_wait(a.event)
    return event_error(a.event)

cdef PJRT_Error* e_event_on_ready(PJRT_Event_OnReady_Args* a) noexcept nogil:
    cdef PJRT_Event* ev = a.event
    pthread_mutex_lock(&ev.lock)
    if not ev.ready:
        w = <Waiter*>malloc(sizeof(Waiter))
        w.callback = a.callback
        w.user_arg = a.user_arg
        w.next = ev.waiters
        ev.waiters = w
        pthread_mutex_unlock(&ev.lock)
        return NULL
    pthread_mutex_unlock(&ev.lock)
    a.callback(event_error(ev), a.user_arg)
    return NULL

cdef PJRT_Error* e_event_create(PJRT_Event_Args* a) noexcept nogil:
    a.event = event_new()
    return NULL

cdef PJRT_Error* e_event_set(PJRT_Event_Set_Args* a) noexcept nogil:
    event_set(a.event, a.error_code, a.error_message, a.error_message_size)
    return NULL

