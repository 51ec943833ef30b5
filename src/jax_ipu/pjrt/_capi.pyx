# cython: language_level=3, boundscheck=False, wraparound=False
"""The PJRT C API table of jax-ipu: the compiled boundary, and nothing more.

It holds no IPU logic. Trivial getters (dimensions, device, kinds, counts)
answer from C structs without entering Python; compile, execute and
transfers call the Python objects of jax_ipu.pjrt. Every Python call is
wrapped so that an exception becomes a PJRT_Error, and any exception already
pending on the calling thread is saved and restored around it: the
framework calls destroy functions while Python exceptions unwind, and JAX
aborts the process on an error from some calls (see docs/pjrt.md).
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.exc cimport PyErr_Fetch, PyErr_Restore
from cpython.memoryview cimport PyMemoryView_FromMemory
from cpython.buffer cimport PyBUF_READ, PyBUF_WRITE
from cpython.pycapsule cimport PyCapsule_New
from cpython.pythread cimport PyThread_get_thread_ident
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF
from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, calloc, free
from libc.stdio cimport snprintf
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
        int kind_id
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
        PJRT_Memory** memories
        size_t num_memories
        PJRT_NamedValue* attributes
        size_t num_attributes
        int64_t bytes_in_use
        int64_t peak_bytes_in_use
        int64_t num_allocs
        int64_t bytes_limit
        int process_index
        int addressable

    ctypedef struct PJRT_Client:
        void* py
        const char* platform_name
        size_t platform_name_size
        const char* platform_version
        size_t platform_version_size
        PJRT_Device** devices
        size_t num_devices
        PJRT_Device** addressable_devices
        size_t num_addressable_devices
        int process_index
        PJRT_Memory** memories
        size_t num_memories
        PJRT_NamedValue* attributes
        size_t num_attributes

    ctypedef struct PJRT_Buffer:
        void* py
        PJRT_Client* client
        PJRT_Device* device
        PJRT_Memory* memory
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
        const char* const* param_memory_kinds
        const size_t* param_memory_kind_sizes
        PJRT_Device** devices
        size_t num_devices
        LogicalDeviceIds* logical_ids
        PJRT_NamedValue* cost
        size_t num_cost
        int64_t code_bytes, argument_bytes, output_bytes, alias_bytes, temp_bytes, peak_bytes
        int64_t streaming_argument_bytes, streaming_output_bytes, streaming_temp_bytes
        int deleted
        void* quick
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
    int IPU_EXTENSION_TYPE_LAYOUTS
    ctypedef struct PJRT_Layouts_MemoryLayout:
        char* text
        size_t text_size
    ctypedef PJRT_Layouts_MemoryLayout PJRT_Layouts_SerializedLayout
    ctypedef struct PJRT_Layouts_MemoryLayout_Destroy_Args:
        PJRT_Layouts_MemoryLayout* layout
    ctypedef struct PJRT_Layouts_MemoryLayout_Serialize_Args:
        PJRT_Layouts_MemoryLayout* layout
        const char* serialized_bytes
        size_t serialized_bytes_size
        PJRT_Layouts_SerializedLayout* serialized_layout
        void (*serialized_layout_deleter)(PJRT_Layouts_SerializedLayout*) noexcept nogil
    ctypedef struct PJRT_Layouts_PJRT_Buffer_MemoryLayout_Args:
        PJRT_Buffer* buffer
        PJRT_Layouts_MemoryLayout* layout
    ctypedef struct PJRT_Layouts_DefaultLayout_Args:
        const int64_t* dims
        size_t num_dims
        PJRT_Layouts_MemoryLayout* layout
    ctypedef struct PJRT_Layouts_Extension:
        PJRT_Extension_Base base
        void* memory_layout_destroy
        void* memory_layout_serialize
        void* client_get_default_layout
        void* buffer_memory_layout
        void* topology_get_default_layout
        void* executable_get_output_layouts
        void* executable_get_parameter_layouts
    int IPU_EXTENSION_TYPE_PROFILER
    ctypedef PJRT_Error PLUGIN_Profiler_Error
    ctypedef struct PLUGIN_Profiler:
        void* py
        void* data
    ctypedef struct PLUGIN_Profiler_Error_Destroy_Args:
        PLUGIN_Profiler_Error* error
    ctypedef struct PLUGIN_Profiler_Error_Message_Args:
        const PLUGIN_Profiler_Error* error
        const char* message
        size_t message_size
    ctypedef struct PLUGIN_Profiler_Error_GetCode_Args:
        const PLUGIN_Profiler_Error* error
        int code
    ctypedef struct PLUGIN_Profiler_Create_Args:
        const char* options
        size_t options_size
        PLUGIN_Profiler* profiler
    ctypedef struct PLUGIN_Profiler_Args:
        PLUGIN_Profiler* profiler
    ctypedef struct PLUGIN_Profiler_CollectData_Args:
        PLUGIN_Profiler* profiler
        unsigned char* buffer
        size_t buffer_size_in_bytes
    ctypedef struct PLUGIN_Profiler_Api:
        size_t struct_size
        void* priv
        void* error_destroy
        void* error_message
        void* error_get_code
        void* create
        void* destroy
        void* start
        void* stop
        void* collect_data
    ctypedef struct PJRT_Profiler_Extension:
        PJRT_Extension_Base base
        PLUGIN_Profiler_Api* profiler_api
        int64_t traceme_context_id

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
    ctypedef PJRT_Error* (*PJRT_CallbackError)(int, const char*, size_t) noexcept nogil
    ctypedef void (*PJRT_KeyValueDeleter)(char*) noexcept nogil
    ctypedef struct PJRT_KeyValueGetCallback_Args:
        size_t struct_size
        void* extension_start
        const char* key
        size_t key_size
        int timeout_in_ms
        PJRT_CallbackError* callback_error
        void* user_arg
        char* value
        size_t value_size
        PJRT_KeyValueDeleter value_deleter_callback
    ctypedef struct PJRT_KeyValueTryGetCallback_Args:
        size_t struct_size
        void* extension_start
        const char* key
        size_t key_size
        PJRT_CallbackError* callback_error
        void* user_arg
        char* value
        size_t value_size
        PJRT_KeyValueDeleter value_deleter_callback
    ctypedef struct PJRT_KeyValuePutCallback_Args:
        size_t struct_size
        void* extension_start
        const char* key
        size_t key_size
        const char* value
        size_t value_size
        PJRT_CallbackError* callback_error
        void* user_arg
    ctypedef PJRT_Error* (*PJRT_KeyValueGetCallback)(PJRT_KeyValueGetCallback_Args*) noexcept nogil
    ctypedef PJRT_Error* (*PJRT_KeyValueTryGetCallback)(PJRT_KeyValueTryGetCallback_Args*) noexcept nogil
    ctypedef PJRT_Error* (*PJRT_KeyValuePutCallback)(PJRT_KeyValuePutCallback_Args*) noexcept nogil
    ctypedef struct PJRT_Client_Create_Args:
        size_t struct_size
        const PJRT_NamedValue* create_options
        size_t num_options
        PJRT_KeyValueGetCallback kv_get_callback
        void* kv_get_user_arg
        PJRT_KeyValuePutCallback kv_put_callback
        void* kv_put_user_arg
        PJRT_Client* client
        PJRT_KeyValueTryGetCallback kv_try_get_callback
        void* kv_try_get_user_arg
    ctypedef struct PJRT_ProcessInfo:
        size_t struct_size
        int task_id
        uint64_t incarnation_id
        int state
        int error_code
        const char* error_message
        size_t error_message_size
    ctypedef struct PJRT_Client_UpdateGlobalProcessInfo_Args:
        PJRT_Client* client
        PJRT_ProcessInfo* process_infos
        size_t num_process_infos
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
        int64_t bytes_reservable_limit
        bint bytes_reservable_limit_is_set
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
    ctypedef struct PJRT_Executable_DeserializeAndLoad_Args:
        PJRT_Client* client
        const char* serialized_executable
        size_t serialized_executable_size
        PJRT_LoadedExecutable* loaded_executable
        const char* overridden_serialized_compile_options
        size_t overridden_serialized_compile_options_size
    int ipu_create_has_try_get(const PJRT_Client_Create_Args*)
    int ipu_has_compile_options_override(const PJRT_Executable_DeserializeAndLoad_Args*)
    ctypedef struct PJRT_Executable_OptimizedProgram_Args:
        PJRT_LoadedExecutable* executable
        PJRT_Program* program
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


# One part per PJRT object, in the order the table below needs them.
include "errors.pxi"
include "python_calls.pxi"
include "event.pxi"
include "jobs.pxi"
include "named_values.pxi"
include "plugin.pxi"
include "client.pxi"
include "distributed.pxi"
include "buffer.pxi"
include "layouts.pxi"
include "executable.pxi"
include "profiler.pxi"
include "api_table.pxi"
