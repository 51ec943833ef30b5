# cython: language_level=3, boundscheck=False, wraparound=False
"""The PJRT C API table of jax-ipu: the compiled boundary, and nothing more.

It holds no IPU logic. Trivial getters (dimensions, device, kinds, counts)
answer from C structs without entering Python; compile, execute and
transfers call the Python objects of jax_ipu.pjrt. Every Python call is
wrapped so that an exception becomes a PJRT_Error, and any exception already
pending on the calling thread is saved and restored around it: the
framework calls destroy functions while Python exceptions unwind, and JAX
aborts the process on an error from some calls (see shared/PJRT.md).
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.exc cimport PyErr_Fetch, PyErr_Restore
from cpython.memoryview cimport PyMemoryView_FromMemory
from cpython.buffer cimport PyBUF_READ, PyBUF_WRITE
from cpython.pycapsule cimport PyCapsule_New
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF
from libc.stdint cimport int64_t, uintptr_t
from libc.stdlib cimport malloc, calloc, free
from libc.string cimport memcpy, memset, strlen

cdef extern from "Python.h" nogil:
    int _Py_IsFinalizing()
    int PyGILState_Check()
    void* PyGILState_GetThisThreadState()
    void PyErr_SetInterrupt()

cdef extern from "pthread.h" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    int pthread_mutex_init(pthread_mutex_t*, void*)
    int pthread_mutex_destroy(pthread_mutex_t*)
    int pthread_mutex_lock(pthread_mutex_t*)
    int pthread_mutex_unlock(pthread_mutex_t*)
    int pthread_cond_init(pthread_cond_t*, void*)
    int pthread_cond_destroy(pthread_cond_t*)
    int pthread_cond_wait(pthread_cond_t*, pthread_mutex_t*)
    int pthread_cond_broadcast(pthread_cond_t*)

cdef extern from "pjrt_decls.h" nogil:
    int IPU_PJRT_MAJOR, IPU_PJRT_MINOR, NUM_PJRT_SLOTS
    const char* const ipu_slot_names[]
    void* const ipu_stub_slots[]
    int ipu_atomic_add(int*, int)
    int64_t ipu_atomic_add64(int64_t*, int64_t)

    ctypedef void (*PayloadVisitor)(const char*, size_t, const char*, size_t, void*) noexcept nogil
    ctypedef struct PJRT_Error
    ctypedef struct ErrorVTable:
        size_t struct_size
        size_t instance_size
        void* extension_start
        void (*destroy)(PJRT_Error*) noexcept nogil
        void (*message)(const PJRT_Error*, const char**, size_t*) noexcept nogil
        int (*get_code)(const PJRT_Error*) noexcept nogil
        void (*for_each_payload)(const PJRT_Error*, PayloadVisitor, void*) noexcept nogil
    ctypedef struct PJRT_Error:
        const ErrorVTable* vtable
        int code
        char* message
        size_t message_size

    ctypedef struct PJRT_Device
    ctypedef struct PJRT_Memory
    ctypedef struct UserData:
        const void* key
        void* data
        void (*dtor)(void*) noexcept nogil
        UserData* next
    ctypedef struct MemoryVTable:
        size_t struct_size
        void* extension_start
        size_t instance_struct_size
        void* (*get_user_data)(PJRT_Memory*, const void*) noexcept nogil
        void (*set_user_data)(PJRT_Memory*, const void*, void*, void (*)(void*) noexcept nogil) noexcept nogil
    ctypedef struct PJRT_Memory:
        const MemoryVTable* vtable
        int id
        const char* kind
        size_t kind_size
        const char* debug_string
        size_t debug_string_size
        const char* to_string
        size_t to_string_size
        PJRT_Device* device
        UserData* user_data
        pthread_mutex_t user_data_lock

    ctypedef void (*OnReadyCallback)(PJRT_Error*, void*) noexcept nogil
    ctypedef struct Waiter:
        OnReadyCallback callback
        void* user_arg
        Waiter* next
    ctypedef struct PJRT_Event:
        pthread_mutex_t lock
        pthread_cond_t done
        int refs
        int ready
        int code
        char* message
        size_t message_size
        Waiter* waiters

    ctypedef enum NamedValueType:
        NV_STRING, NV_INT64, NV_INT64_LIST, NV_FLOAT, NV_BOOL
    ctypedef struct PJRT_NamedValue:
        size_t struct_size
        void* extension_start
        const char* name
        size_t name_size
        NamedValueType type
        const char* string_value
        int64_t int64_value
        const int64_t* int64_array_value
        float float_value
        bint bool_value
        size_t value_size

    ctypedef struct PJRT_Device:
        int id
        int local_hardware_id
        const char* kind
        size_t kind_size
        const char* debug_string
        size_t debug_string_size
        const char* to_string
        size_t to_string_size
        PJRT_Memory* memory
        PJRT_NamedValue* attributes
        size_t num_attributes
        int64_t bytes_in_use
        int64_t peak_bytes_in_use
        int64_t num_allocs
        int64_t bytes_limit

    ctypedef struct PJRT_Client:
        void* py
        const char* platform_name
        size_t platform_name_size
        const char* platform_version
        size_t platform_version_size
        PJRT_Device** devices
        size_t num_devices
        PJRT_Memory** memories
        PJRT_NamedValue* attributes
        size_t num_attributes

    ctypedef struct PJRT_Buffer:
        void* py
        PJRT_Client* client
        PJRT_Device* device
        int type
        const int64_t* dims
        size_t num_dims
        size_t nbytes
        PJRT_Event* ready
        int deleted
        int external_refs

    ctypedef struct LogicalDeviceIds:
        int replica
        int partition
    ctypedef struct PJRT_LoadedExecutable:
        int refs
        void* py
        PJRT_Client* client
        const char* name
        size_t name_size
        const char* fingerprint
        size_t fingerprint_size
        size_t num_replicas, num_partitions, num_outputs, num_params
        const int* output_types
        const int64_t* output_dims
        const size_t* output_dim_sizes
        const char* const* memory_kinds
        const size_t* memory_kind_sizes
        PJRT_Device** devices
        size_t num_devices
        LogicalDeviceIds* logical_ids
        PJRT_NamedValue* cost
        size_t num_cost
        int64_t code_bytes, argument_bytes, output_bytes, alias_bytes, temp_bytes, peak_bytes
        int deleted
    ctypedef struct PJRT_Blob:
        void* py

    int IPU_EXTENSION_TYPE_SHARDINGS
    ctypedef struct PJRT_Extension_Base:
        size_t struct_size
        int type
        PJRT_Extension_Base* next
    ctypedef struct PJRT_Shardings_Args:
        PJRT_LoadedExecutable* executable
        size_t num_shardings
        const char* const* shardings
        const size_t* sharding_sizes
    ctypedef struct PJRT_Shardings_Extension:
        PJRT_Extension_Base base
        void* parameter_shardings
        void* output_shardings

    ctypedef struct PJRT_Api_Version:
        size_t struct_size
        void* extension_start
        int major_version
        int minor_version
    ctypedef struct PJRT_Api:
        size_t struct_size
        void* extension_start
        PJRT_Api_Version pjrt_api_version
        void* slots[1]

    ctypedef struct PJRT_Error_Destroy_Args:
        PJRT_Error* error
    ctypedef struct PJRT_Error_Message_Args:
        const PJRT_Error* error
        const char* message
        size_t message_size
    ctypedef struct PJRT_Error_GetCode_Args:
        const PJRT_Error* error
        int code
    ctypedef struct PJRT_Plugin_Attributes_Args:
        const PJRT_NamedValue* attributes
        size_t num_attributes
    ctypedef struct PJRT_Event_Args:
        PJRT_Event* event
    ctypedef struct PJRT_Event_IsReady_Args:
        PJRT_Event* event
        bint is_ready
    ctypedef struct PJRT_Event_OnReady_Args:
        PJRT_Event* event
        OnReadyCallback callback
        void* user_arg
    ctypedef struct PJRT_Event_Set_Args:
        PJRT_Event* event
        int error_code
        const char* error_message
        size_t error_message_size
    ctypedef struct PJRT_Client_Create_Args:
        size_t struct_size
        const PJRT_NamedValue* create_options
        size_t num_options
        PJRT_Client* client
    ctypedef struct PJRT_Client_Args:
        PJRT_Client* client
    ctypedef struct PJRT_Client_String_Args:
        PJRT_Client* client
        const char* str
        size_t str_size
    ctypedef struct PJRT_Client_ProcessIndex_Args:
        PJRT_Client* client
        int process_index
    ctypedef struct PJRT_Client_Devices_Args:
        PJRT_Client* client
        PJRT_Device* const* devices
        size_t num_devices
    ctypedef struct PJRT_Client_LookupDevice_Args:
        PJRT_Client* client
        int id
        PJRT_Device* device
    ctypedef struct PJRT_Client_AddressableMemories_Args:
        PJRT_Client* client
        PJRT_Memory* const* memories
        size_t num_memories
    ctypedef struct PJRT_Program:
        char* code
        size_t code_size
        const char* format
        size_t format_size
    ctypedef struct PJRT_Client_Compile_Args:
        PJRT_Client* client
        const PJRT_Program* program
        const char* compile_options
        size_t compile_options_size
        PJRT_LoadedExecutable* executable
    ctypedef struct PJRT_Client_DefaultDeviceAssignment_Args:
        PJRT_Client* client
        int num_replicas
        int num_partitions
        size_t default_assignment_size
        int* default_assignment
    ctypedef struct PJRT_Client_BufferFromHostBuffer_Args:
        PJRT_Client* client
        const void* data
        int type
        const int64_t* dims
        size_t num_dims
        const int64_t* byte_strides
        size_t num_byte_strides
        int host_buffer_semantics
        PJRT_Device* device
        PJRT_Memory* memory
        void* device_layout
        PJRT_Event* done_with_host_buffer
        PJRT_Buffer* buffer
    ctypedef struct PJRT_Device_Int_Args:
        PJRT_Device* device
        int value
    ctypedef struct PJRT_DeviceDescription_Attributes_Args:
        PJRT_Device* device
        size_t num_attributes
        const PJRT_NamedValue* attributes
    ctypedef struct PJRT_Device_String_Args:
        PJRT_Device* device
        const char* str
        size_t str_size
    ctypedef struct PJRT_Device_GetDescription_Args:
        PJRT_Device* device
        PJRT_Device* description
    ctypedef struct PJRT_Device_IsAddressable_Args:
        PJRT_Device* device
        bint is_addressable
    ctypedef struct PJRT_Device_AddressableMemories_Args:
        PJRT_Device* device
        PJRT_Memory* const* memories
        size_t num_memories
    ctypedef struct PJRT_Device_DefaultMemory_Args:
        PJRT_Device* device
        PJRT_Memory* memory
    ctypedef struct PJRT_Device_MemoryStats_Args:
        PJRT_Device* device
        int64_t bytes_in_use
        int64_t peak_bytes_in_use
        bint peak_bytes_in_use_is_set
        int64_t num_allocs
        bint num_allocs_is_set
        int64_t bytes_limit
        bint bytes_limit_is_set
    ctypedef struct PJRT_Device_GetAttributes_Args:
        PJRT_Device* device
        const PJRT_NamedValue* attributes
        size_t num_attributes
        void* device_attributes
        void (*attributes_deleter)(void*) noexcept nogil
    ctypedef struct PJRT_Memory_Int_Args:
        PJRT_Memory* memory
        int id
    ctypedef struct PJRT_Memory_String_Args:
        PJRT_Memory* memory
        const char* str
        size_t str_size
    ctypedef struct PJRT_Memory_AddressableByDevices_Args:
        PJRT_Memory* memory
        PJRT_Device* const* devices
        size_t num_devices
    ctypedef struct PJRT_Executable_Args:
        PJRT_LoadedExecutable* executable
    ctypedef struct PJRT_LoadedExecutable_GetExecutable_Args:
        PJRT_LoadedExecutable* loaded_executable
        PJRT_LoadedExecutable* executable
    ctypedef struct PJRT_Executable_String_Args:
        PJRT_LoadedExecutable* executable
        const char* str
        size_t str_size
    ctypedef struct PJRT_Executable_Size_Args:
        PJRT_LoadedExecutable* executable
        size_t value
    ctypedef struct PJRT_Executable_CodeSize_Args:
        PJRT_LoadedExecutable* executable
        int64_t size_in_bytes
    ctypedef struct PJRT_Executable_GetCostAnalysis_Args:
        PJRT_LoadedExecutable* executable
        size_t num_properties
        const PJRT_NamedValue* properties
    ctypedef struct PJRT_Executable_MemoryKinds_Args:
        PJRT_LoadedExecutable* executable
        size_t num
        const char* const* memory_kinds
        const size_t* memory_kind_sizes
    ctypedef struct PJRT_Executable_OutputElementTypes_Args:
        PJRT_LoadedExecutable* executable
        const int* output_types
        size_t num_output_types
    ctypedef struct PJRT_Executable_OutputDimensions_Args:
        PJRT_LoadedExecutable* executable
        size_t num_outputs
        const int64_t* dims
        const size_t* dim_sizes
    void ipu_clear_memory_stats(PJRT_Device_MemoryStats_Args*)
    void ipu_clear_compiled_memory_stats(PJRT_Executable_GetCompiledMemoryStats_Args*)
    ctypedef struct PJRT_Executable_GetCompiledMemoryStats_Args:
        PJRT_LoadedExecutable* executable
        int64_t generated_code_size_in_bytes, argument_size_in_bytes, output_size_in_bytes
        int64_t alias_size_in_bytes, temp_size_in_bytes
        int64_t host_generated_code_size_in_bytes, host_argument_size_in_bytes
        int64_t host_output_size_in_bytes, host_alias_size_in_bytes, host_temp_size_in_bytes
        int64_t peak_memory_in_bytes
    ctypedef struct PJRT_LoadedExecutable_AddressableDevices_Args:
        PJRT_LoadedExecutable* executable
        PJRT_Device* const* devices
        size_t num_devices
    ctypedef struct PJRT_LoadedExecutable_LogicalIds_Args:
        PJRT_LoadedExecutable* executable
        LogicalDeviceIds* ids
        size_t num_ids
    ctypedef struct PJRT_LoadedExecutable_IsDeleted_Args:
        PJRT_LoadedExecutable* executable
        bint is_deleted
    ctypedef struct PJRT_Executable_Blob_Args:
        PJRT_LoadedExecutable* executable
        const char* serialized_bytes
        size_t serialized_bytes_size
        PJRT_Blob* blob
        void (*deleter)(PJRT_Blob*) noexcept nogil
    ctypedef struct PJRT_ExecuteOptions:
        size_t struct_size
        int launch_id
        const int64_t* non_donatable_input_indices
        size_t num_non_donatable_input_indices
    ctypedef struct PJRT_LoadedExecutable_Execute_Args:
        PJRT_LoadedExecutable* executable
        PJRT_ExecuteOptions* options
        PJRT_Buffer* const* const* argument_lists
        size_t num_devices
        size_t num_args
        PJRT_Buffer** const* output_lists
        PJRT_Event** device_complete_events
        PJRT_Device* execute_device
    ctypedef struct PJRT_Buffer_Args:
        PJRT_Buffer* buffer
    ctypedef struct PJRT_Buffer_ElementType_Args:
        PJRT_Buffer* buffer
        int type
    ctypedef struct PJRT_Buffer_Dimensions_Args:
        PJRT_Buffer* buffer
        const int64_t* dims
        size_t num_dims
    ctypedef struct PJRT_Buffer_DynamicDimensionIndices_Args:
        PJRT_Buffer* buffer
        const size_t* indices
        size_t num
    ctypedef struct PJRT_Buffer_Size_Args:
        PJRT_Buffer* buffer
        size_t value
    ctypedef struct PJRT_Buffer_Device_Args:
        PJRT_Buffer* buffer
        PJRT_Device* device
    ctypedef struct PJRT_Buffer_Memory_Args:
        PJRT_Buffer* buffer
        PJRT_Memory* memory
    ctypedef struct PJRT_Buffer_Bool_Args:
        PJRT_Buffer* buffer
        bint value
    ctypedef struct PJRT_Buffer_ReadyEvent_Args:
        PJRT_Buffer* buffer
        PJRT_Event* event
    int LAYOUT_TILED, LAYOUT_STRIDES
    ctypedef struct LayoutTiled:
        const int64_t* minor_to_major
        size_t minor_to_major_size
        size_t num_tiles
    ctypedef struct LayoutStrides:
        const int64_t* byte_strides
        size_t num_byte_strides
    ctypedef struct PJRT_Buffer_MemoryLayout:
        LayoutTiled tiled
        LayoutStrides strides
        int type
    ctypedef struct PJRT_Buffer_ToHostBuffer_Args:
        PJRT_Buffer* src
        PJRT_Buffer_MemoryLayout* host_layout
        void* dst
        size_t dst_size
        PJRT_Event* event
    ctypedef struct PJRT_Buffer_CopyRawToHost_Args:
        PJRT_Buffer* buffer
        void* dst
        int64_t offset
        int64_t transfer_size
        PJRT_Event* event
    ctypedef struct PJRT_Buffer_CopyToDevice_Args:
        PJRT_Buffer* buffer
        PJRT_Device* dst_device
        PJRT_Buffer* dst_buffer
    ctypedef struct PJRT_Buffer_CopyToMemory_Args:
        PJRT_Buffer* buffer
        PJRT_Memory* dst_memory
        PJRT_Buffer* dst_buffer


# PJRT error codes used here (absl status codes).
cdef enum:
    CODE_OK = 0
    CODE_CANCELLED = 1
    CODE_UNKNOWN = 2
    CODE_INVALID_ARGUMENT = 3
    CODE_NOT_FOUND = 5
    CODE_RESOURCE_EXHAUSTED = 8
    CODE_FAILED_PRECONDITION = 9
    CODE_UNIMPLEMENTED = 12
    CODE_INTERNAL = 13

CODES = {"OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3,
         "DEADLINE_EXCEEDED": 4, "NOT_FOUND": 5, "RESOURCE_EXHAUSTED": 8,
         "FAILED_PRECONDITION": 9, "UNIMPLEMENTED": 12, "INTERNAL": 13}


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
                CODE_INVALID_ARGUMENT if isinstance(exc, (ValueError, TypeError)) else CODE_INTERNAL)
        text = str(exc) or type(exc).__name__
        if not getattr(exc, "pjrt_code", None):
            text = f"{type(exc).__name__}: {text}"
        msg = text.encode("utf-8", "replace")
        if isinstance(exc, KeyboardInterrupt):
            PyErr_SetInterrupt()     # Ctrl-C while a run was ours to do: the user's program stops
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
            code = CODES.get(getattr(error, "pjrt_code", None), CODE_INTERNAL)
            text = str(error) if getattr(error, "pjrt_code", None) else f"{type(error).__name__}: {error}"
            msg = text.encode("utf-8", "replace")
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


# ---------------------------------------------------------- named values --

cdef PJRT_NamedValue* named_values(list items, list keepalive) except *:
    """[(name, value)] -> a C array; `keepalive` holds the bytes it points at.
    Values: str, int, float, bool, or a tuple of ints."""
    cdef size_t n = len(items), i
    cdef PJRT_NamedValue* out = <PJRT_NamedValue*>calloc(max(n, 1), sizeof(PJRT_NamedValue))
    cdef int64_t[:] ints
    import numpy as np
    for i in range(n):
        name, value = items[i]
        bname = name.encode()
        keepalive.append(bname)
        out[i].struct_size = sizeof(PJRT_NamedValue)
        out[i].name = PyBytes_AS_STRING(bname)
        out[i].name_size = len(bname)
        out[i].value_size = 1
        if isinstance(value, bool):
            out[i].type = NV_BOOL
            out[i].bool_value = value
        elif isinstance(value, int):
            out[i].type = NV_INT64
            out[i].int64_value = value
        elif isinstance(value, float):
            out[i].type = NV_FLOAT
            out[i].float_value = value
        elif isinstance(value, str):
            bval = value.encode()
            keepalive.append(bval)
            out[i].type = NV_STRING
            out[i].string_value = PyBytes_AS_STRING(bval)
            out[i].value_size = len(bval)
        else:
            arr = np.ascontiguousarray(value, dtype=np.int64)
            keepalive.append(arr)
            ints = arr
            out[i].type = NV_INT64_LIST
            out[i].int64_array_value = &ints[0] if len(arr) else NULL
            out[i].value_size = len(arr)
    return out

cdef dict read_named_values(const PJRT_NamedValue* values, size_t n):
    out = {}
    for i in range(n):
        name = values[i].name[:values[i].name_size].decode()
        t = values[i].type
        if t == NV_STRING:
            out[name] = values[i].string_value[:values[i].value_size].decode()
        elif t == NV_INT64:
            out[name] = values[i].int64_value
        elif t == NV_INT64_LIST:
            out[name] = [values[i].int64_array_value[j] for j in range(values[i].value_size)]
        elif t == NV_FLOAT:
            out[name] = values[i].float_value
        elif t == NV_BOOL:
            out[name] = bool(values[i].bool_value)
    return out


# ---------------------------------------------------------------- plugin --

cdef list PLUGIN_KEEPALIVE = []
cdef PJRT_NamedValue* PLUGIN_ATTRIBUTES = NULL
cdef size_t NUM_PLUGIN_ATTRIBUTES = 0

cdef PJRT_Error* e_plugin_initialize(void* a) noexcept nogil:
    return NULL

cdef PJRT_Error* e_plugin_attributes(PJRT_Plugin_Attributes_Args* a) noexcept nogil:
    a.attributes = PLUGIN_ATTRIBUTES
    a.num_attributes = NUM_PLUGIN_ATTRIBUTES
    return NULL


# ------------------------------------------------------- client, devices --

cdef bytes as_bytes(object s):
    return s if isinstance(s, bytes) else str(s).encode()

cdef const char* kept(list keepalive, object s, size_t* size):
    b = as_bytes(s)
    keepalive.append(b)
    size[0] = PyBytes_GET_SIZE(b)
    return PyBytes_AS_STRING(b)

cdef void* memory_get_user_data(PJRT_Memory* m, const void* key) noexcept nogil:
    cdef UserData* u
    cdef void* found = NULL
    pthread_mutex_lock(&m.user_data_lock)
    u = m.user_data
    while u != NULL:
        if u.key == key:
            found = u.data
            break
        u = u.next
    pthread_mutex_unlock(&m.user_data_lock)
    return found

cdef void memory_set_user_data(PJRT_Memory* m, const void* key, void* data, void (*dtor)(void*) noexcept nogil) noexcept nogil:
    cdef UserData* u = <UserData*>malloc(sizeof(UserData))
    u.key = key
    u.data = data
    u.dtor = dtor
    pthread_mutex_lock(&m.user_data_lock)
    u.next = m.user_data
    m.user_data = u
    pthread_mutex_unlock(&m.user_data_lock)

cdef MemoryVTable MEMORY_VTABLE
MEMORY_VTABLE.struct_size = sizeof(MemoryVTable)
MEMORY_VTABLE.extension_start = NULL
MEMORY_VTABLE.instance_struct_size = sizeof(void*)
MEMORY_VTABLE.get_user_data = memory_get_user_data
MEMORY_VTABLE.set_user_data = memory_set_user_data


cdef PJRT_Client* build_client(object py_client) except NULL:
    """Mirrors a jax_ipu.pjrt.client.Client in C structs. The client's
    `keepalive` list owns every string the structs point at."""
    cdef list keep = py_client.keepalive
    cdef PJRT_Client* c = <PJRT_Client*>calloc(1, sizeof(PJRT_Client))
    cdef size_t n = len(py_client.devices), i
    cdef PJRT_Device* d
    cdef PJRT_Memory* m
    Py_INCREF(py_client)
    c.py = <void*>py_client
    c.platform_name = kept(keep, py_client.platform_name, &c.platform_name_size)
    c.platform_version = kept(keep, py_client.platform_version, &c.platform_version_size)
    c.num_devices = n
    c.devices = <PJRT_Device**>calloc(max(n, 1), sizeof(void*))
    c.memories = <PJRT_Memory**>calloc(max(n, 1), sizeof(void*))
    for i in range(n):
        dev = py_client.devices[i]
        d = <PJRT_Device*>calloc(1, sizeof(PJRT_Device))
        d.id = dev.id
        d.local_hardware_id = dev.local_hardware_id
        d.kind = kept(keep, dev.kind, &d.kind_size)
        d.debug_string = kept(keep, dev.debug_string, &d.debug_string_size)
        d.to_string = kept(keep, dev.to_string, &d.to_string_size)
        d.attributes = named_values(list(dev.attributes.items()), keep)
        d.num_attributes = len(dev.attributes)
        d.bytes_limit = dev.bytes_limit
        m = <PJRT_Memory*>calloc(1, sizeof(PJRT_Memory))
        m.vtable = &MEMORY_VTABLE
        m.id = dev.id
        m.kind = kept(keep, dev.memory_kind, &m.kind_size)
        m.debug_string = kept(keep, f"{dev.memory_kind} memory of {dev.to_string}", &m.debug_string_size)
        m.to_string = kept(keep, f"MemorySpace({dev.memory_kind}, device={dev.id})", &m.to_string_size)
        m.device = d
        pthread_mutex_init(&m.user_data_lock, NULL)
        d.memory = m
        c.devices[i] = d
        c.memories[i] = m
    return c

cdef void free_client(PJRT_Client* c) noexcept nogil:
    cdef UserData* u
    cdef UserData* nxt
    for i in range(c.num_devices):
        u = c.devices[i].memory.user_data
        while u != NULL:
            nxt = u.next
            if u.dtor != NULL:
                u.dtor(u.data)
            free(u)
            u = nxt
        free(c.devices[i].memory)
        free(c.devices[i].attributes)
        free(c.devices[i])
    free(c.devices)
    free(c.memories)
    py_release(c.py)
    free(c)

cdef PJRT_Device* device_by_id(PJRT_Client* c, int id) noexcept nogil:
    for i in range(c.num_devices):
        if c.devices[i].id == id:
            return c.devices[i]
    return NULL


cdef PJRT_Error* e_client_create(PJRT_Client_Create_Args* a) noexcept nogil:
    with gil:
        saved = py_enter()
        try:
            drain_released_now()
            from jax_ipu.pjrt.client import create_client
            options = read_named_values(a.create_options, a.num_options)
            a.client = build_client(create_client(options))
            return NULL
        except BaseException as exc:
            return error_from_exception(exc)
        finally:
            py_leave(saved)

cdef PJRT_Error* e_client_destroy(PJRT_Client_Args* a) noexcept nogil:
    if a.client != NULL:
        if not python_is_gone():
            with gil:
                saved = py_enter()
                try:
                    (<object>a.client.py).close()
                except BaseException:
                    pass
                py_leave(saved)
        free_client(a.client)
    return NULL

cdef PJRT_Error* e_client_platform_name(PJRT_Client_String_Args* a) noexcept nogil:
    a.str = a.client.platform_name
    a.str_size = a.client.platform_name_size
    return NULL

cdef PJRT_Error* e_client_platform_version(PJRT_Client_String_Args* a) noexcept nogil:
    a.str = a.client.platform_version
    a.str_size = a.client.platform_version_size
    return NULL

cdef PJRT_Error* e_client_process_index(PJRT_Client_ProcessIndex_Args* a) noexcept nogil:
    a.process_index = 0
    return NULL

cdef PJRT_Error* e_client_devices(PJRT_Client_Devices_Args* a) noexcept nogil:
    a.devices = a.client.devices
    a.num_devices = a.client.num_devices
    return NULL

cdef PJRT_Error* e_client_lookup_device(PJRT_Client_LookupDevice_Args* a) noexcept nogil:
    a.device = device_by_id(a.client, a.id)
    if a.device == NULL:
        return make_error(CODE_INVALID_ARGUMENT, b"no IPU device with that id", 26)
    return NULL

cdef PJRT_Error* e_client_addressable_memories(PJRT_Client_AddressableMemories_Args* a) noexcept nogil:
    a.memories = a.client.memories
    a.num_memories = a.client.num_devices
    return NULL

cdef PJRT_Error* e_client_default_device_assignment(PJRT_Client_DefaultDeviceAssignment_Args* a) noexcept nogil:
    cdef size_t needed = <size_t>(a.num_replicas * a.num_partitions)
    if needed > a.client.num_devices or needed > a.default_assignment_size:
        with gil:
            return error_from_text(CODE_INVALID_ARGUMENT,
                f"a program for {a.num_replicas} replicas x {a.num_partitions} partitions needs "
                f"{needed} IPUs, but {a.client.num_devices} are configured; set JAX_IPU_DEVICE_COUNT")
    for i in range(needed):
        a.default_assignment[i] = a.client.devices[i].id
    return NULL

cdef PJRT_Error* e_device_id(PJRT_Device_Int_Args* a) noexcept nogil:
    a.value = a.device.id
    return NULL

cdef PJRT_Error* e_device_process_index(PJRT_Device_Int_Args* a) noexcept nogil:
    a.value = 0
    return NULL

cdef PJRT_Error* e_device_local_hardware_id(PJRT_Device_Int_Args* a) noexcept nogil:
    a.value = a.device.local_hardware_id
    return NULL

cdef PJRT_Error* e_device_description_attributes(PJRT_DeviceDescription_Attributes_Args* a) noexcept nogil:
    a.attributes = a.device.attributes
    a.num_attributes = a.device.num_attributes
    return NULL

cdef PJRT_Error* e_device_kind(PJRT_Device_String_Args* a) noexcept nogil:
    a.str = a.device.kind
    a.str_size = a.device.kind_size
    return NULL

cdef PJRT_Error* e_device_debug_string(PJRT_Device_String_Args* a) noexcept nogil:
    a.str = a.device.debug_string
    a.str_size = a.device.debug_string_size
    return NULL

cdef PJRT_Error* e_device_to_string(PJRT_Device_String_Args* a) noexcept nogil:
    a.str = a.device.to_string
    a.str_size = a.device.to_string_size
    return NULL

cdef PJRT_Error* e_device_get_description(PJRT_Device_GetDescription_Args* a) noexcept nogil:
    a.description = a.device
    return NULL

cdef PJRT_Error* e_device_is_addressable(PJRT_Device_IsAddressable_Args* a) noexcept nogil:
    a.is_addressable = True
    return NULL

cdef PJRT_Error* e_device_addressable_memories(PJRT_Device_AddressableMemories_Args* a) noexcept nogil:
    a.memories = &a.device.memory
    a.num_memories = 1
    return NULL

cdef PJRT_Error* e_device_default_memory(PJRT_Device_DefaultMemory_Args* a) noexcept nogil:
    a.memory = a.device.memory
    return NULL

cdef PJRT_Error* e_device_memory_stats(PJRT_Device_MemoryStats_Args* a) noexcept nogil:
    ipu_clear_memory_stats(a)
    a.bytes_in_use = a.device.bytes_in_use
    a.peak_bytes_in_use = a.device.peak_bytes_in_use
    a.peak_bytes_in_use_is_set = True
    a.num_allocs = a.device.num_allocs
    a.num_allocs_is_set = True
    a.bytes_limit = a.device.bytes_limit
    a.bytes_limit_is_set = True
    return NULL

cdef void no_device_attributes(void* p) noexcept nogil:
    pass

cdef PJRT_Error* e_device_get_attributes(PJRT_Device_GetAttributes_Args* a) noexcept nogil:
    # The framework aborts on an error here: always answer.
    a.attributes = a.device.attributes
    a.num_attributes = a.device.num_attributes
    a.device_attributes = NULL
    a.attributes_deleter = no_device_attributes
    return NULL

cdef PJRT_Error* e_memory_id(PJRT_Memory_Int_Args* a) noexcept nogil:
    a.id = a.memory.id
    return NULL

cdef PJRT_Error* e_memory_kind_id(PJRT_Memory_Int_Args* a) noexcept nogil:
    a.id = 0
    return NULL

cdef PJRT_Error* e_memory_kind(PJRT_Memory_String_Args* a) noexcept nogil:
    a.str = a.memory.kind
    a.str_size = a.memory.kind_size
    return NULL

cdef PJRT_Error* e_memory_debug_string(PJRT_Memory_String_Args* a) noexcept nogil:
    a.str = a.memory.debug_string
    a.str_size = a.memory.debug_string_size
    return NULL

cdef PJRT_Error* e_memory_to_string(PJRT_Memory_String_Args* a) noexcept nogil:
    a.str = a.memory.to_string
    a.str_size = a.memory.to_string_size
    return NULL

cdef PJRT_Error* e_memory_addressable_by_devices(PJRT_Memory_AddressableByDevices_Args* a) noexcept nogil:
    a.devices = &a.memory.device
    a.num_devices = 1
    return NULL


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
    b.type = spec.pjrt_type
    b.num_dims = num_dims
    b.dims = <int64_t*>dims_address if num_dims else NULL
    b.nbytes = spec.nbytes
    b.ready = event_of(py_buffer.ready)
    ipu_atomic_add64(&b.device.bytes_in_use, <int64_t>b.nbytes)
    ipu_atomic_add64(&b.device.num_allocs, 1)
    if b.device.bytes_in_use > b.device.peak_bytes_in_use:
        b.device.peak_bytes_in_use = b.device.bytes_in_use
    return b

cdef void buffer_drop_storage(PJRT_Buffer* b) noexcept nogil:
    if not b.deleted:
        b.deleted = 1
        ipu_atomic_add64(&b.device.bytes_in_use, -<int64_t>b.nbytes)

cdef PJRT_Error* e_buffer_destroy(PJRT_Buffer_Args* a) noexcept nogil:
    cdef PJRT_Buffer* b = a.buffer
    if b != NULL:
        buffer_drop_storage(b)
        event_unref(b.ready)
        py_release(b.py)
        free(b)
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
    a.memory = a.buffer.device.memory
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
            a.event = event_of((<object>b.py).copy_to_host(dst, a.offset))
            return NULL
        except BaseException as exc:
            return error_from_exception(exc)
        finally:
            py_leave(saved)

cdef PJRT_Error* copy_buffer_to(PJRT_Buffer* b, PJRT_Device* dst, PJRT_Buffer** out) noexcept nogil:
    if b.deleted:
        return deleted_buffer_error(b)
    with gil:
        saved = py_enter()
        try:
            out[0] = wrap_buffer(b.client, (<object>b.client.py).copy_buffer(<object>b.py, dst.id))
            return NULL
        except BaseException as exc:
            return error_from_exception(exc)
        finally:
            py_leave(saved)

cdef PJRT_Error* e_buffer_copy_to_device(PJRT_Buffer_CopyToDevice_Args* a) noexcept nogil:
    return copy_buffer_to(a.buffer, a.dst_device, &a.dst_buffer)

cdef PJRT_Error* e_buffer_copy_to_memory(PJRT_Buffer_CopyToMemory_Args* a) noexcept nogil:
    return copy_buffer_to(a.buffer, a.dst_memory.device, &a.dst_buffer)


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
    if a.memory != NULL:
        dev = a.memory.device
    if dev == NULL:
        dev = a.client.devices[0]
    with gil:
        saved = py_enter()
        try:
            if a.device_layout != NULL:
                raise NotImplementedError("jax-ipu keeps arrays in the default (row-major) layout; "
                                          "custom device layouts are not supported")
            drain_released_now()
            py_buffer = (<object>a.client.py).buffer_from_host(host_array(a), dev.id)
            a.buffer = wrap_buffer(a.client, py_buffer)
            # The data was copied during the call: the host buffer is free now.
            a.done_with_host_buffer = ready_event()
            return NULL
        except BaseException as exc:
            return error_from_exception(exc)
        finally:
            py_leave(saved)


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
    kind = b"device"
    n_kinds = max(e.num_outputs, e.num_params, 1)
    kinds_arr = np.full(n_kinds, <uintptr_t>PyBytes_AS_STRING(kind), dtype=np.uintp)
    kind_sizes_arr = np.full(n_kinds, len(kind), dtype=np.uintp)
    keep.extend([types_arr, dims_arr, sizes_arr, kind, kinds_arr, kind_sizes_arr])
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
    e.num_devices = len(py_exe.device_ids)
    e.devices = <PJRT_Device**>calloc(max(e.num_devices, 1), sizeof(void*))
    e.logical_ids = <LogicalDeviceIds*>calloc(max(e.num_devices, 1), sizeof(LogicalDeviceIds))
    for i in range(e.num_devices):
        e.devices[i] = device_by_id(c, py_exe.device_ids[i])
        e.logical_ids[i].replica, e.logical_ids[i].partition = py_exe.logical_ids[i]
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
    return e

cdef void executable_unref(PJRT_LoadedExecutable* e) noexcept nogil:
    if e == NULL or ipu_atomic_add(&e.refs, -1) != 0:
        return
    free(e.devices)
    free(e.logical_ids)
    free(e.cost)
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
    a.memory_kinds = a.executable.memory_kinds
    a.memory_kind_sizes = a.executable.memory_kind_sizes
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
    a.host_argument_size_in_bytes = 0
    a.host_output_size_in_bytes = 0
    a.host_alias_size_in_bytes = 0
    a.host_temp_size_in_bytes = 0
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

cdef PJRT_Error* e_loaded_executable_execute(PJRT_LoadedExecutable_Execute_Args* a) noexcept nogil:
    cdef PJRT_LoadedExecutable* e = a.executable
    cdef PJRT_Buffer* b
    cdef size_t d, i
    if e.deleted:
        return make_error(CODE_FAILED_PRECONDITION, b"the IPU executable has been deleted", 35)
    with gil:
        saved = py_enter()
        try:
            drain_released_now()
            args = []
            for d in range(a.num_devices):
                row = []
                for i in range(a.num_args):
                    b = a.argument_lists[d][i]
                    if b.deleted:
                        raise ValueError(f"argument {i} of the IPU program has been deleted or donated")
                    row.append(<object>b.py)
                args.append(row)
            non_donatable = None
            if a.options != NULL and a.options.num_non_donatable_input_indices:
                non_donatable = {a.options.non_donatable_input_indices[i]
                                 for i in range(a.options.num_non_donatable_input_indices)}
            device_id = a.execute_device.id if a.execute_device != NULL else None
            outputs, events, donated, runs = (<object>e.py).execute(args, device_id, non_donatable)
            for d in range(a.num_devices):
                for i in donated:
                    buffer_drop_storage(a.argument_lists[d][i])
                for i in range(e.num_outputs):
                    a.output_lists[d][i] = wrap_buffer(e.client, outputs[d][i])
                if a.device_complete_events != NULL:
                    a.device_complete_events[d] = event_of(events[d])
            if runs is not None:
                (<object>e.py).launch(runs)
            return NULL
        except BaseException as exc:
            return error_from_exception(exc)
        finally:
            py_leave(saved)


# ------------------------------------------------------------- the table --

cdef PJRT_Api* API = <PJRT_Api*>calloc(1, sizeof(PJRT_Api))
API.struct_size = sizeof(PJRT_Api)
# Extensions: shardings (for programs over several IPUs).
cdef PJRT_Shardings_Extension* SHARDINGS = <PJRT_Shardings_Extension*>calloc(1, sizeof(PJRT_Shardings_Extension))
SHARDINGS.base.struct_size = sizeof(PJRT_Shardings_Extension)
SHARDINGS.base.type = IPU_EXTENSION_TYPE_SHARDINGS
SHARDINGS.base.next = NULL
SHARDINGS.parameter_shardings = <void*>e_parameter_shardings
SHARDINGS.output_shardings = <void*>e_output_shardings
API.extension_start = <void*>SHARDINGS
API.pjrt_api_version.struct_size = sizeof(PJRT_Api_Version)
API.pjrt_api_version.major_version = IPU_PJRT_MAJOR
API.pjrt_api_version.minor_version = IPU_PJRT_MINOR
for _i in range(NUM_PJRT_SLOTS):
    API.slots[_i] = ipu_stub_slots[_i]
SLOT_NAMES = [ipu_slot_names[_i].decode() for _i in range(NUM_PJRT_SLOTS)]

cdef void install(str name, void* fn) except *:
    API.slots[SLOT_NAMES.index(name)] = fn

install("Error_Destroy", <void*>e_error_destroy)
install("Error_Message", <void*>e_error_message)
install("Error_GetCode", <void*>e_error_get_code)
install("Error_ForEachPayload", <void*>e_error_for_each_payload)
install("Plugin_Initialize", <void*>e_plugin_initialize)
install("Plugin_Attributes", <void*>e_plugin_attributes)
install("Event_Destroy", <void*>e_event_destroy)
install("Event_IsReady", <void*>e_event_is_ready)
install("Event_Error", <void*>e_event_error)
install("Event_Await", <void*>e_event_await)
install("Event_OnReady", <void*>e_event_on_ready)
install("Event_Create", <void*>e_event_create)
install("Event_Set", <void*>e_event_set)
install("Client_Create", <void*>e_client_create)
install("Client_Destroy", <void*>e_client_destroy)
install("Client_PlatformName", <void*>e_client_platform_name)
install("Client_PlatformVersion", <void*>e_client_platform_version)
install("Client_ProcessIndex", <void*>e_client_process_index)
install("Client_Devices", <void*>e_client_devices)
install("Client_AddressableDevices", <void*>e_client_devices)
install("Client_LookupDevice", <void*>e_client_lookup_device)
install("Client_LookupAddressableDevice", <void*>e_client_lookup_device)
install("Client_AddressableMemories", <void*>e_client_addressable_memories)
install("Client_Compile", <void*>e_client_compile)
install("Client_DefaultDeviceAssignment", <void*>e_client_default_device_assignment)
install("Client_BufferFromHostBuffer", <void*>e_client_buffer_from_host)
install("DeviceDescription_Id", <void*>e_device_id)
install("DeviceDescription_ProcessIndex", <void*>e_device_process_index)
install("DeviceDescription_Attributes", <void*>e_device_description_attributes)
install("DeviceDescription_Kind", <void*>e_device_kind)
install("DeviceDescription_DebugString", <void*>e_device_debug_string)
install("DeviceDescription_ToString", <void*>e_device_to_string)
install("Device_GetDescription", <void*>e_device_get_description)
install("Device_IsAddressable", <void*>e_device_is_addressable)
install("Device_LocalHardwareId", <void*>e_device_local_hardware_id)
install("Device_AddressableMemories", <void*>e_device_addressable_memories)
install("Device_DefaultMemory", <void*>e_device_default_memory)
install("Device_MemoryStats", <void*>e_device_memory_stats)
install("Device_GetAttributes", <void*>e_device_get_attributes)
install("Memory_Id", <void*>e_memory_id)
install("Memory_Kind", <void*>e_memory_kind)
install("Memory_Kind_Id", <void*>e_memory_kind_id)
install("Memory_DebugString", <void*>e_memory_debug_string)
install("Memory_ToString", <void*>e_memory_to_string)
install("Memory_AddressableByDevices", <void*>e_memory_addressable_by_devices)
install("Executable_Destroy", <void*>e_executable_destroy)
install("Executable_Name", <void*>e_executable_name)
install("Executable_NumReplicas", <void*>e_executable_num_replicas)
install("Executable_NumPartitions", <void*>e_executable_num_partitions)
install("Executable_NumOutputs", <void*>e_executable_num_outputs)
install("Executable_SizeOfGeneratedCodeInBytes", <void*>e_executable_code_size)
install("Executable_GetCostAnalysis", <void*>e_executable_cost_analysis)
install("Executable_OutputMemoryKinds", <void*>e_executable_output_memory_kinds)
install("Executable_ParameterMemoryKinds", <void*>e_executable_parameter_memory_kinds)
install("Executable_OutputElementTypes", <void*>e_executable_output_element_types)
install("Executable_OutputDimensions", <void*>e_executable_output_dimensions)
install("Executable_Fingerprint", <void*>e_executable_fingerprint)
install("Executable_GetCompiledMemoryStats", <void*>e_executable_compiled_memory_stats)
install("LoadedExecutable_Destroy", <void*>e_executable_destroy)
install("LoadedExecutable_GetExecutable", <void*>e_loaded_executable_get_executable)
install("LoadedExecutable_AddressableDevices", <void*>e_loaded_executable_addressable_devices)
install("LoadedExecutable_AddressableDeviceLogicalIds", <void*>e_loaded_executable_logical_ids)
install("LoadedExecutable_Delete", <void*>e_loaded_executable_delete)
install("LoadedExecutable_IsDeleted", <void*>e_loaded_executable_is_deleted)
install("LoadedExecutable_Execute", <void*>e_loaded_executable_execute)
install("LoadedExecutable_Fingerprint", <void*>e_executable_fingerprint)
install("LoadedExecutable_GetDeviceAssignment", <void*>e_loaded_executable_device_assignment)
install("Buffer_Destroy", <void*>e_buffer_destroy)
install("Buffer_Delete", <void*>e_buffer_delete)
install("Buffer_IsDeleted", <void*>e_buffer_is_deleted)
install("Buffer_IsOnCpu", <void*>e_buffer_is_on_cpu)
install("Buffer_ElementType", <void*>e_buffer_element_type)
install("Buffer_Dimensions", <void*>e_buffer_dimensions)
install("Buffer_UnpaddedDimensions", <void*>e_buffer_dimensions)
install("Buffer_DynamicDimensionIndices", <void*>e_buffer_dynamic_dimension_indices)
install("Buffer_OnDeviceSizeInBytes", <void*>e_buffer_on_device_size)
install("Buffer_Device", <void*>e_buffer_device)
install("Buffer_Memory", <void*>e_buffer_memory)
install("Buffer_ReadyEvent", <void*>e_buffer_ready_event)
install("Buffer_IncreaseExternalReferenceCount", <void*>e_buffer_increase_external_refs)
install("Buffer_DecreaseExternalReferenceCount", <void*>e_buffer_decrease_external_refs)
install("Buffer_ToHostBuffer", <void*>e_buffer_to_host)
install("Buffer_CopyRawToHost", <void*>e_buffer_copy_raw_to_host)
install("Buffer_CopyToDevice", <void*>e_buffer_copy_to_device)
install("Buffer_CopyToMemory", <void*>e_buffer_copy_to_memory)


def set_plugin_attributes(list items):
    """Plugin attributes JAX reads (stablehlo versions, xla_version)."""
    global PLUGIN_ATTRIBUTES, NUM_PLUGIN_ATTRIBUTES
    PLUGIN_ATTRIBUTES = named_values(items, PLUGIN_KEEPALIVE)
    NUM_PLUGIN_ATTRIBUTES = len(items)


def api_capsule():
    """The PJRT_Api table, as the capsule jax's register_plugin takes."""
    return PyCapsule_New(<void*>API, b"pjrt_c_api", NULL)


def implemented_functions():
    return [name for i, name in enumerate(SLOT_NAMES) if API.slots[i] != ipu_stub_slots[i]]
