# ------------------------------------------------------------------ jobs --

cdef object DEQUE = None
cdef object NEW_LOCK = None
cdef object PERF_COUNTER = None


cdef class JobQueue:
    """A device's jobs, run one at a time in submission order: what every
    dispatch pays (submitting a job, running the quick ones waiting on the
    thread that needs the device), compiled. jax_ipu.pjrt.device.DeviceWorker
    adds the thread that runs the rest and says what quick jobs, graces and
    lingers are (its GRACE_SECONDS and LINGER_SECONDS are read here)."""
    cdef public object _jobs         # (job, quick, due, seq)
    cdef public object _run_lock     # held while a job runs: one at a time, in order
    cdef public object _wake         # the worker's wake-ups (DeviceWorker makes it)
    cdef public object thread_ident  # the worker thread's (compared on every dispatch)
    cdef public long long _submitted
    cdef public long long _urged     # jobs up to this number are due now
    cdef public double _wakes_at     # when the worker's sleep ends (inf: until woken)

    def __cinit__(self, *args, **kwargs):
        global DEQUE, NEW_LOCK, PERF_COUNTER
        if DEQUE is None:
            import collections, threading, time
            DEQUE, NEW_LOCK, PERF_COUNTER = collections.deque, threading.Lock, time.perf_counter
        self._jobs = DEQUE()
        self._run_lock = NEW_LOCK()

    cdef int submit_job(self, job, bint quick) except -1:
        self._submitted += 1
        if quick:
            due = PERF_COUNTER() + self.GRACE_SECONDS
            self._jobs.append((job, True, due, self._submitted))
            if due + self.LINGER_SECONDS < self._wakes_at:     # the worker would sleep well past it
                self._wakes_at = due
                self._wake.put(True)
        else:   # due now, and so are the deferred jobs before it
            self._jobs.append((job, False, 0.0, self._submitted))
            self._urged = self._submitted
            self._wake.put(True)
        return 0

    cdef int run_quick_jobs(self) except -1:
        jobs = self._jobs
        if not jobs or not jobs[0][1] or not self._run_lock.acquire(False):
            return 0
        try:
            while jobs and jobs[0][1]:
                jobs.popleft()[0]()
        finally:
            self._run_lock.release()
        return 0

    def submit(self, job, quick=False):
        """Queues a job: a quick one (a run that takes microseconds and cannot
        block) waits its grace, any other wakes the worker at once."""
        self.submit_job(job, quick)

    def help(self):
        """Runs the quick jobs waiting at the front on the calling thread
        (they never block), unless a job is running now."""
        self.run_quick_jobs()

    def urge(self):
        """Someone waits for the jobs submitted so far: no grace for them."""
        if self._urged != self._submitted and self._jobs:
            self._urged = self._submitted
            self._wake.put(True)

    def wanted(self):
        """Someone asks about the results of the jobs submitted so far (a
        buffer's ready event): quick ones run now, on the asking thread (it
        takes less than waking the worker would), the rest without grace."""
        self.run_quick_jobs()
        self.urge()
