# ----------------------------------------------------------- executables --

cdef PJRT_LoadedExecutable* build_executable(PJRT_Client* c, object py_exe) except NULL:
    """Mirrors a jax_ipu.pjrt.executable.Executable; its `keepalive` owns
    the arrays and strings the struct points at."""
    import numpy as np
    cdef list keep = py_exe.keepalive
    cdef PJRT_LoadedExecutable* e = <PJRT_LoadedExecutable*>calloc(1, sizeof(PJRT_LoadedExecutable))
    cdef const int[:] types
    cdef const int64_t[:] dims
    cdef const size_t[:] dim_sizes
    cdef const size_t[:] kind_sizes
    cdef const uintptr_t[:] kinds
    cdef size_t i
    Py_INCREF(py_exe)
    e.refs = 1
    e.py = <void*>py_exe
    e.client = c
    e.name = kept(keep, py_exe.name, &e.name_size)
    e.fingerprint = kept(keep, py_exe.fingerprint, &e.fingerprint_size)
    e.num_replicas = py_exe.num_replicas
    e.num_partitions = py_exe.num_partitions
    e.num_outputs = len(py_exe.output_types)
    e.num_params = py_exe.num_params
    types_arr = np.asarray(py_exe.output_types + [0], dtype=np.intc)
    dims_arr = np.asarray([d for shape in py_exe.output_shapes for d in shape] + [0], dtype=np.int64)
    sizes_arr = np.asarray([len(s) for s in py_exe.output_shapes] + [0], dtype=np.uintp)
    # Memory kind names per output and per parameter ("device" or the
    # streaming memory's), as C strings the executable keeps.
    names = [as_bytes(k) for k in list(py_exe.output_memory_kinds) + list(py_exe.parameter_memory_kinds)]
    kinds_arr = np.asarray([<uintptr_t>PyBytes_AS_STRING(k) for k in names] + [0], dtype=np.uintp)
    kind_sizes_arr = np.asarray([len(k) for k in names] + [0], dtype=np.uintp)
    keep.extend([types_arr, dims_arr, sizes_arr, names, kinds_arr, kind_sizes_arr])
    types = types_arr
    dims = dims_arr
    dim_sizes = sizes_arr
    kinds = kinds_arr
    kind_sizes = kind_sizes_arr
    e.output_types = &types[0]
    e.output_dims = &dims[0]
    e.output_dim_sizes = &dim_sizes[0]
    e.memory_kinds = <const char* const*>&kinds[0]
    e.memory_kind_sizes = &kind_sizes[0]
    e.param_memory_kinds = <const char* const*>&kinds[e.num_outputs]
    e.param_memory_kind_sizes = &kind_sizes[e.num_outputs]
    # This process's devices of the assignment (all of them, in one process).
    e.num_devices = len(py_exe.local_device_ids)
    e.devices = <PJRT_Device**>calloc(max(e.num_devices, 1), sizeof(void*))
    e.logical_ids = <LogicalDeviceIds*>calloc(max(e.num_devices, 1), sizeof(LogicalDeviceIds))
    for i in range(e.num_devices):
        e.devices[i] = device_by_id(c, py_exe.local_device_ids[i])
        e.logical_ids[i].replica, e.logical_ids[i].partition = py_exe.local_logical_ids[i]
    cost = list(py_exe.cost_analysis.items())
    e.cost = named_values(cost, keep)
    e.num_cost = len(cost)
    stats = py_exe.memory_stats
    e.code_bytes = stats["code"]
    e.argument_bytes = stats["arguments"]
    e.output_bytes = stats["outputs"]
    e.alias_bytes = stats["aliased"]
    e.temp_bytes = stats["temporary"]
    e.peak_bytes = stats["peak"]
    e.streaming_argument_bytes = stats["streaming_arguments"]
    e.streaming_output_bytes = stats["streaming_outputs"]
    e.streaming_temp_bytes = stats["streaming_temporary"]
    if py_exe.dispatch_compiled:
        # Held here, not by the Executable (which it reads): no cycle to wait
        # for the collector, and the program goes with its last handle.
        quick = QuickPath(py_exe)
        Py_INCREF(quick)
        e.quick = <void*>quick
    return e

cdef void executable_unref(PJRT_LoadedExecutable* e) noexcept nogil:
    if e == NULL or ipu_atomic_add(&e.refs, -1) != 0:
        return
    free(e.devices)
    free(e.logical_ids)
    free(e.cost)
    py_release(e.quick)
    py_release(e.py)
    free(e)

cdef PJRT_Error* e_client_compile(PJRT_Client_Compile_Args* a) noexcept nogil:
    with gil:
        saved = py_enter()
        try:
            drain_released_now()
            code = a.program.code[:a.program.code_size]
            fmt = a.program.format[:a.program.format_size].decode()
            options = a.compile_options[:a.compile_options_size]
            py_exe = (<object>a.client.py).compile(code, fmt, options)
            a.executable = build_executable(a.client, py_exe)
            return NULL
        except BaseException as exc:
            return error_from_exception(exc)
        finally:
            py_leave(saved)

cdef PJRT_Error* e_executable_destroy(PJRT_Executable_Args* a) noexcept nogil:
    executable_unref(a.executable)
    return NULL

cdef PJRT_Error* e_loaded_executable_delete(PJRT_Executable_Args* a) noexcept nogil:
    a.executable.deleted = 1
    return NULL

cdef PJRT_Error* e_loaded_executable_is_deleted(PJRT_LoadedExecutable_IsDeleted_Args* a) noexcept nogil:
    a.is_deleted = a.executable.deleted != 0
    return NULL

cdef PJRT_Error* e_loaded_executable_get_executable(PJRT_LoadedExecutable_GetExecutable_Args* a) noexcept nogil:
    ipu_atomic_add(&a.loaded_executable.refs, 1)
    a.executable = a.loaded_executable
    return NULL

cdef PJRT_Error* e_executable_name(PJRT_Executable_String_Args* a) noexcept nogil:
    a.str = a.executable.name
    a.str_size = a.executable.name_size
    return NULL

cdef PJRT_Error* e_executable_fingerprint(PJRT_Executable_String_Args* a) noexcept nogil:
    a.str = a.executable.fingerprint
    a.str_size = a.executable.fingerprint_size
    return NULL

cdef PJRT_Error* e_executable_num_replicas(PJRT_Executable_Size_Args* a) noexcept nogil:
    a.value = a.executable.num_replicas
    return NULL

cdef PJRT_Error* e_executable_num_partitions(PJRT_Executable_Size_Args* a) noexcept nogil:
    a.value = a.executable.num_partitions
    return NULL

cdef PJRT_Error* e_executable_num_outputs(PJRT_Executable_Size_Args* a) noexcept nogil:
    a.value = a.executable.num_outputs
    return NULL

cdef PJRT_Error* e_executable_code_size(PJRT_Executable_CodeSize_Args* a) noexcept nogil:
    a.size_in_bytes = a.executable.code_bytes
    return NULL

cdef PJRT_Error* e_executable_cost_analysis(PJRT_Executable_GetCostAnalysis_Args* a) noexcept nogil:
    a.properties = a.executable.cost
    a.num_properties = a.executable.num_cost
    return NULL

cdef PJRT_Error* e_executable_output_memory_kinds(PJRT_Executable_MemoryKinds_Args* a) noexcept nogil:
    a.num = a.executable.num_outputs
    a.memory_kinds = a.executable.memory_kinds
    a.memory_kind_sizes = a.executable.memory_kind_sizes
    return NULL

cdef PJRT_Error* e_executable_parameter_memory_kinds(PJRT_Executable_MemoryKinds_Args* a) noexcept nogil:
    a.num = a.executable.num_params
    a.memory_kinds = a.executable.param_memory_kinds
    a.memory_kind_sizes = a.executable.param_memory_kind_sizes
    return NULL

cdef PJRT_Error* e_executable_output_element_types(PJRT_Executable_OutputElementTypes_Args* a) noexcept nogil:
    a.output_types = a.executable.output_types
    a.num_output_types = a.executable.num_outputs
    return NULL

cdef PJRT_Error* e_executable_output_dimensions(PJRT_Executable_OutputDimensions_Args* a) noexcept nogil:
    a.num_outputs = a.executable.num_outputs
    a.dims = a.executable.output_dims
    a.dim_sizes = a.executable.output_dim_sizes
    return NULL

cdef PJRT_Error* e_executable_compiled_memory_stats(PJRT_Executable_GetCompiledMemoryStats_Args* a) noexcept nogil:
    cdef PJRT_LoadedExecutable* e = a.executable
    ipu_clear_compiled_memory_stats(a)
    a.generated_code_size_in_bytes = e.code_bytes
    a.argument_size_in_bytes = e.argument_bytes
    a.output_size_in_bytes = e.output_bytes
    a.alias_size_in_bytes = e.alias_bytes
    a.temp_size_in_bytes = e.temp_bytes
    a.host_generated_code_size_in_bytes = 0
    # JAX's host_* figures are of memory kind pinned_host: streaming memory here.
    a.host_argument_size_in_bytes = e.streaming_argument_bytes
    a.host_output_size_in_bytes = e.streaming_output_bytes
    a.host_alias_size_in_bytes = 0
    a.host_temp_size_in_bytes = e.streaming_temp_bytes
    a.peak_memory_in_bytes = e.peak_bytes
    return NULL

cdef PJRT_Error* e_loaded_executable_addressable_devices(PJRT_LoadedExecutable_AddressableDevices_Args* a) noexcept nogil:
    a.devices = a.executable.devices
    a.num_devices = a.executable.num_devices
    return NULL

cdef PJRT_Error* e_loaded_executable_logical_ids(PJRT_LoadedExecutable_LogicalIds_Args* a) noexcept nogil:
    a.ids = a.executable.logical_ids
    a.num_ids = a.executable.num_devices
    return NULL

cdef void blob_delete(PJRT_Blob* blob) noexcept nogil:
    py_release(blob.py)
    free(blob)

cdef PJRT_Error* e_loaded_executable_device_assignment(PJRT_Executable_Blob_Args* a) noexcept nogil:
    # The framework aborts on an error here: the Python side computed the
    # bytes at compile time, so this cannot fail but for lack of memory.
    cdef PJRT_Blob* blob = <PJRT_Blob*>malloc(sizeof(PJRT_Blob))
    with gil:
        saved = py_enter()
        data = (<object>a.executable.py).serialized_device_assignment
        Py_INCREF(data)
        blob.py = <void*>data
        a.serialized_bytes = PyBytes_AS_STRING(data)
        a.serialized_bytes_size = PyBytes_GET_SIZE(data)
        py_leave(saved)
    a.blob = blob
    a.deleter = blob_delete
    return NULL

cdef PJRT_Error* blob_of(PJRT_Executable_Blob_Args* a, str method) noexcept nogil:
    """Bytes a Python method of the executable returns, handed out with a
    deleter that drops them."""
    cdef PJRT_Blob* blob = <PJRT_Blob*>malloc(sizeof(PJRT_Blob))
    if blob == NULL:
        return make_error(CODE_RESOURCE_EXHAUSTED, b"out of memory", 13)
    with gil:
        saved = py_enter()
        try:
            data = getattr(<object>a.executable.py, method)()
            if type(data) is not bytes:
                raise TypeError(f"{method} gave {type(data).__name__}, not bytes")
            Py_INCREF(data)
            blob.py = <void*>data
            a.serialized_bytes = PyBytes_AS_STRING(data)
            a.serialized_bytes_size = PyBytes_GET_SIZE(data)
        except BaseException as exc:
            free(blob)
            return error_from_exception(exc)
        finally:
            py_leave(saved)
    a.blob = blob
    a.deleter = blob_delete
    return NULL

cdef PJRT_Error* e_executable_serialize(PJRT_Executable_Blob_Args* a) noexcept nogil:
    return blob_of(a, "serialize")

cdef PJRT_Error* e_executable_deserialize_and_load(PJRT_Executable_DeserializeAndLoad_Args* a) noexcept nogil:
    with gil:
        saved = py_enter()
        try:
            drain_released_now()
            data = a.serialized_executable[:a.serialized_executable_size]
            options = None
            if ipu_has_compile_options_override(a):
                options = a.overridden_serialized_compile_options[:a.overridden_serialized_compile_options_size]
            py_exe = (<object>a.client.py).deserialize(data, options)
            a.loaded_executable = build_executable(a.client, py_exe)
            return NULL
        except BaseException as exc:
            return error_from_exception(exc)
        finally:
            py_leave(saved)

cdef PJRT_Error* e_executable_optimized_program(PJRT_Executable_OptimizedProgram_Args* a) noexcept nogil:
    """The compiled program as text (format and bytes from the executable's
    optimized_program()): its size when `code` is NULL, else the bytes."""
    cdef PJRT_Program* program = a.program
    with gil:
        saved = py_enter()
        try:
            fmt, text = (<object>a.executable.py).optimized_program()
            program.format = PyBytes_AS_STRING(fmt)
            program.format_size = PyBytes_GET_SIZE(fmt)
            if program.code == NULL:
                program.code_size = PyBytes_GET_SIZE(text)
            else:
                if program.code_size < <size_t>PyBytes_GET_SIZE(text):
                    raise ValueError("the buffer for the optimized program is too small")
                memcpy(program.code, PyBytes_AS_STRING(text), PyBytes_GET_SIZE(text))
                program.code_size = PyBytes_GET_SIZE(text)
            return NULL
        except BaseException as exc:
            return error_from_exception(exc)
        finally:
            py_leave(saved)

cdef PJRT_Error* shardings_of(PJRT_Shardings_Args* a, bint outputs) noexcept with gil:
    """The executable's serialized OpShardings (null arrays when unknown):
    JAX's view of how a program over several IPUs splits its values."""
    cdef const uintptr_t[:] ptrs
    cdef const size_t[:] sizes
    a.num_shardings = 0
    a.shardings = NULL
    a.sharding_sizes = NULL
    saved = py_enter()
    try:
        import numpy as np
        py_exe = <object>a.executable.py
        protos = py_exe.output_shardings if outputs else py_exe.parameter_shardings
        if protos is None:
            return NULL
        blobs = [bytes(p) + b"\0" for p in protos]      # never an empty buffer
        ptr_arr = np.asarray([<uintptr_t>PyBytes_AS_STRING(b) for b in blobs] + [0], dtype=np.uintp)
        size_arr = np.asarray([len(p) for p in protos] + [0], dtype=np.uintp)
        py_exe.keepalive.extend([blobs, ptr_arr, size_arr])
        ptrs = ptr_arr
        sizes = size_arr
        a.num_shardings = len(protos)
        a.shardings = <const char* const*>&ptrs[0]
        a.sharding_sizes = &sizes[0]
        return NULL
    except BaseException as exc:
        return error_from_exception(exc)
    finally:
        py_leave(saved)

cdef PJRT_Error* e_parameter_shardings(PJRT_Shardings_Args* a) noexcept nogil:
    return shardings_of(a, False)

cdef PJRT_Error* e_output_shardings(PJRT_Shardings_Args* a) noexcept nogil:
    return shardings_of(a, True)

# ------------------------------------------------------------ quick runs --
# The common call, paid on every dispatch of a small program: one device, a
# quick program (executable.is_quick), its arguments there and in the specs
# and memories it was compiled for. QuickPath.dispatch does what
# Executable.execute and _Run do for it (the same checks, objects and order)
# without the interpreter; QuickRun is its _Run. Anything else (a mismatched
# argument, undonatable donations, a call from a program's host callback on
# the device's own worker) goes to the general path, which repeats nothing
# this one has done but the harmless help() and donation check.

# Python functions the quick runs share with _Run (jax_ipu.pjrt.executable
# hands them over when imported): they are paid only off the common case.
cdef object GATHER_AND_RUN = None
cdef object RUN_FAILED = None
cdef object RECORD_RUN = None
cdef object CHECK_DONATIONS = None
cdef object DEVICE_BUFFER = None
cdef object TRACING = None
cdef object PROFILE = None
cdef object TIME_NS = None


def set_run_hooks(gather_and_run, run_failed, record_run, check_donations, device_buffer, tracing, profile):
    global GATHER_AND_RUN, RUN_FAILED, RECORD_RUN, CHECK_DONATIONS, DEVICE_BUFFER, TRACING, PROFILE, TIME_NS
    import time
    GATHER_AND_RUN, RUN_FAILED, RECORD_RUN = gather_and_run, run_failed, record_run
    CHECK_DONATIONS, DEVICE_BUFFER, TRACING, PROFILE = check_donations, device_buffer, tracing, profile
    TIME_NS = time.time_ns


cdef class QuickPath:
    """What the quick dispatch of one executable reads on every call."""
    cdef object executable, program, device, donated_set
    cdef JobQueue worker
    cdef tuple input_specs, input_memories, output_specs, donated
    cdef Py_ssize_t num_params
    cdef bint last_output_completes, own_completion

    def __init__(self, executable):
        self.executable = executable
        self.program = executable.program
        self.device = executable.single_device
        self.worker = self.device.worker
        self.input_specs = tuple(executable.input_specs)
        self.input_memories = tuple(executable.input_memories)
        self.output_specs = tuple(executable.output_specs)
        self.donated = tuple(executable.donated)
        self.donated_set = executable.donated_set
        self.num_params = executable.num_params
        self.last_output_completes = executable.last_output_completes
        self.own_completion = executable.own_completion


cdef class QuickRun:
    """One run of a QuickPath's program: a _Run for one device."""
    cdef QuickPath path
    cdef readonly list args, held, outputs
    cdef readonly object done
    cdef readonly bint all_held
    replica = None

    @property
    def executable(self):
        return self.path.executable

    @property
    def program(self):
        return self.path.program

    @property
    def device(self):
        return self.path.device

    @property
    def donated(self):
        return self.path.donated

    def __call__(self):
        cdef QuickPath q = self.path
        cdef list outputs = self.outputs
        cdef Py_ssize_t i
        traced = TRACING.RUNNING       # inside a jax.profiler trace: when the run began
        began = TIME_NS() if traced else 0
        device = q.device
        try:
            if self.all_held and not q.donated:
                results = device.engine.run(q.program, self.held, (), False)
            else:
                results = GATHER_AND_RUN(self)
        except BaseException as exc:   # reaches the user at the next sync point
            if RUN_FAILED(self, exc):
                raise
            return
        device.last_program = q.program
        device.last_between_processes = None
        if traced or PROFILE.ACTIVE is not None:
            RECORD_RUN(q.program, device, None, began, traced)
        if len(results) != len(outputs):
            raise ValueError(f"{q.program.name} gave {len(results)} results for {len(outputs)} outputs")
        for i in range(len(outputs)):   # the last output's event is the run's completion
            outputs[i].fulfil(results[i])
        if q.own_completion or not outputs:
            self.done.set()


cdef list argument_row(PJRT_LoadedExecutable_Execute_Args* a, size_t d):
    cdef PJRT_Buffer* b
    cdef size_t i
    cdef list row = []
    for i in range(a.num_args):
        b = a.argument_lists[d][i]
        if b.deleted:
            raise ValueError(f"argument {i} of the IPU program has been deleted or donated")
        row.append(<object>b.py)
    return row


cdef bint quick_dispatch(PJRT_LoadedExecutable* e, QuickPath q, PJRT_LoadedExecutable_Execute_Args* a) except -1:
    """Dispatches a quick run as Executable.execute would; False, having
    made nothing, when the general path must take the call."""
    cdef Py_ssize_t i
    cdef list row, held, outs
    cdef bint all_held = True
    cdef QuickRun run
    cdef JobQueue worker = q.worker
    ident = worker.thread_ident
    if ident is not None and <unsigned long>ident == PyThread_get_thread_ident():
        return False     # from a host callback of a program running on this IPU
    if <Py_ssize_t>a.num_args != q.num_params or (
            q.donated and a.options != NULL and a.options.num_non_donatable_input_indices):
        return False
    row = argument_row(a, 0)
    if q.donated:
        CHECK_DONATIONS(row, q.donated_set)
    if worker._jobs:
        worker.run_quick_jobs()   # quick runs still waiting: their results may be our arguments
    device = q.device
    held = []
    for i in range(q.num_params):
        buf = row[i]
        if buf.spec is not q.input_specs[i] or buf.device is not device or buf.memory != q.input_memories[i]:
            return False     # (specs are interned)
        array = buf._array
        if array is None:
            all_held = False
        held.append(array)
    outs = [DEVICE_BUFFER(device, spec) for spec in q.output_specs]
    run = QuickRun.__new__(QuickRun)
    run.path, run.args, run.held, run.all_held, run.outputs = q, row, held, all_held, outs
    # Complete when the last output is: runs fulfil outputs in order.
    run.done = outs[len(outs) - 1].ready if q.last_output_completes else Event()   # (no wraparound here)
    # Deferred: nothing runs before the outputs are wrapped.
    worker.submit_job(run, True)
    for i in q.donated:
        buffer_drop_storage(a.argument_lists[0][i])
    for i in range(len(outs)):
        a.output_lists[0][i] = wrap_buffer(e.client, outs[i])
    if a.device_complete_events != NULL:
        a.device_complete_events[0] = event_of(run.done)
    return True


cdef void release_outputs(PJRT_LoadedExecutable_Execute_Args* a, size_t num_outputs) noexcept nogil:
    """Drops the outputs and completion events an Execute that fails has
    handed out: the framework ignores them then (it starts from null
    entries, so those not yet filled are null)."""
    cdef size_t d, i
    for d in range(a.num_devices):
        for i in range(num_outputs):
            buffer_free(a.output_lists[d][i])
            a.output_lists[d][i] = NULL
        if a.device_complete_events != NULL:
            event_unref(a.device_complete_events[d])
            a.device_complete_events[d] = NULL


cdef PJRT_Error* e_loaded_executable_execute(PJRT_LoadedExecutable_Execute_Args* a) noexcept nogil:
    cdef PJRT_LoadedExecutable* e = a.executable
    cdef size_t d, i
    if e.deleted:
        return make_error(CODE_FAILED_PRECONDITION, b"the IPU executable has been deleted", 35)
    with gil:
        saved = py_enter()
        try:
            drain_released_now()
            if e.quick != NULL and a.num_devices == 1 and a.execute_device == NULL and \
                    quick_dispatch(e, <QuickPath>e.quick, a):
                return NULL
            args = [argument_row(a, d) for d in range(a.num_devices)]
            non_donatable = None
            if a.options != NULL and a.options.num_non_donatable_input_indices:
                non_donatable = {a.options.non_donatable_input_indices[i]
                                 for i in range(a.options.num_non_donatable_input_indices)}
            device_id = a.execute_device.id if a.execute_device != NULL else None
            outputs, events, donated, runs, failure = (<object>e.py).execute(args, device_id, non_donatable)
            try:
                for d in range(a.num_devices):
                    for i in donated:
                        buffer_drop_storage(a.argument_lists[d][i])
                    for i in range(e.num_outputs):
                        a.output_lists[d][i] = wrap_buffer(e.client, outputs[d][i])
                    if a.device_complete_events != NULL:
                        a.device_complete_events[d] = event_of(events[d])
                if runs is not None:
                    # The error of a run the call waited for (a program
                    # calling the host): raised by the call, as on XLA:CPU.
                    failure = (<object>e.py).launch(runs)
            except BaseException:     # (Ctrl-C while the call waits)
                release_outputs(a, e.num_outputs)
                raise
            if failure is not None:
                release_outputs(a, e.num_outputs)
                return error_from_run(failure)
            return NULL
        except BaseException as exc:
            return error_from_exception(exc)
        finally:
            py_leave(saved)

