/* jax-ipu's own declarations of the PJRT C API structures it uses,
 * written from the facts of xla/pjrt/c/pjrt_c_api.h (API 0.112/0.113):
 * field order and types only. Every args struct opens with the same two
 * fields; a struct's size is the offset past its last field. The handle
 * structs (PJRT_Client, PJRT_Buffer, ...) are jax-ipu's own: the framework
 * never looks inside them, except for the vtable that PJRT_Error and
 * PJRT_Memory must start with. */
#ifndef JAX_IPU_PJRT_DECLS_H_
#define JAX_IPU_PJRT_DECLS_H_
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define IPU_PJRT_MAJOR 0
#define IPU_PJRT_MINOR 112
#define ARGS_HEAD size_t struct_size; void* extension_start;

/* ---- handles ---------------------------------------------------------- */
typedef struct PJRT_Error PJRT_Error;
typedef struct PJRT_Event PJRT_Event;
typedef struct PJRT_Client PJRT_Client;
typedef struct PJRT_Device PJRT_Device;
typedef struct PJRT_Device PJRT_DeviceDescription; /* a device describes itself */
typedef struct PJRT_Memory PJRT_Memory;
typedef struct PJRT_Buffer PJRT_Buffer;
typedef struct PJRT_LoadedExecutable PJRT_LoadedExecutable;
typedef struct PJRT_LoadedExecutable PJRT_Executable; /* one object, refcounted */
typedef struct PJRT_Blob PJRT_Blob; /* serialized bytes handed out with a deleter */

typedef void (*PayloadVisitor)(const char*, size_t, const char*, size_t, void*);
typedef struct {
  size_t struct_size; size_t instance_size; void* extension_start;
  void (*destroy)(PJRT_Error*);
  void (*message)(const PJRT_Error*, const char**, size_t*);
  int (*get_code)(const PJRT_Error*);
  void (*for_each_payload)(const PJRT_Error*, PayloadVisitor, void*);
} ErrorVTable;
struct PJRT_Error { const ErrorVTable* vtable; int code; char* message; size_t message_size; };

typedef struct {
  size_t struct_size; void* extension_start; size_t instance_struct_size;
  void* (*get_user_data)(PJRT_Memory*, const void*);
  void (*set_user_data)(PJRT_Memory*, const void*, void*, void (*)(void*));
} MemoryVTable;
typedef struct UserData { const void* key; void* data; void (*dtor)(void*); struct UserData* next; } UserData;
struct PJRT_Memory {
  const MemoryVTable* vtable;
  int id;
  const char* kind; size_t kind_size;
  const char* debug_string; size_t debug_string_size;
  const char* to_string; size_t to_string_size;
  int kind_id; /* index into the device's memories: 0 SRAM, 1 streaming memory */
  PJRT_Device* device;
  UserData* user_data;
  pthread_mutex_t user_data_lock;
};

typedef void (*OnReadyCallback)(PJRT_Error*, void*);
typedef struct Waiter { OnReadyCallback callback; void* user_arg; struct Waiter* next; } Waiter;
struct PJRT_Event {
  pthread_mutex_t lock; pthread_cond_t done;
  int refs; int ready; int code; char* message; size_t message_size;
  Waiter* waiters;
};

typedef enum { NV_STRING = 0, NV_INT64, NV_INT64_LIST, NV_FLOAT, NV_BOOL } NamedValueType;
typedef struct {
  size_t struct_size; void* extension_start;
  const char* name; size_t name_size;
  NamedValueType type;
  union { const char* string_value; int64_t int64_value; const int64_t* int64_array_value; float float_value; bool bool_value; };
  size_t value_size;
} PJRT_NamedValue;

struct PJRT_Device {
  int id; int local_hardware_id;
  const char* kind; size_t kind_size;
  const char* debug_string; size_t debug_string_size;
  const char* to_string; size_t to_string_size;
  PJRT_Memory* memory; /* the default: memories[0] */
  PJRT_Memory** memories; size_t num_memories;
  PJRT_NamedValue* attributes; size_t num_attributes;
  int64_t bytes_in_use; int64_t peak_bytes_in_use; int64_t num_allocs; int64_t bytes_limit;
  int process_index; /* the process whose IPUs these are (jax.distributed) */
  int addressable;   /* this process's own */
};

struct PJRT_Client {
  void* py; /* PyObject*: jax_ipu.pjrt.client.Client */
  const char* platform_name; size_t platform_name_size;
  const char* platform_version; size_t platform_version_size;
  PJRT_Device** devices; size_t num_devices; /* every process's */
  PJRT_Device** addressable_devices; size_t num_addressable_devices; /* this process's */
  int process_index;
  PJRT_Memory** memories; size_t num_memories; /* this process's devices' */
  PJRT_NamedValue* attributes; size_t num_attributes; /* plugin attributes */
};

struct PJRT_Buffer {
  void* py; /* PyObject*: jax_ipu.pjrt.buffer.DeviceBuffer */
  PJRT_Client* client;
  PJRT_Device* device;
  PJRT_Memory* memory;
  int type;
  const int64_t* dims; size_t num_dims; /* owned by py */
  size_t nbytes;
  PJRT_Event* ready;
  int deleted;
  int external_refs;
};

typedef struct { int replica; int partition; } LogicalDeviceIds;
struct PJRT_LoadedExecutable {
  int refs;
  void* py; /* PyObject*: jax_ipu.pjrt.executable.Executable */
  PJRT_Client* client;
  const char* name; size_t name_size;
  const char* fingerprint; size_t fingerprint_size;
  size_t num_replicas, num_partitions, num_outputs, num_params;
  const int* output_types;              /* [num_outputs] */
  const int64_t* output_dims;           /* concatenated */
  const size_t* output_dim_sizes;       /* [num_outputs] */
  const char* const* memory_kinds;      /* [outputs] */
  const size_t* memory_kind_sizes;
  const char* const* param_memory_kinds; /* [params] */
  const size_t* param_memory_kind_sizes;
  PJRT_Device** devices; size_t num_devices;
  LogicalDeviceIds* logical_ids;
  PJRT_NamedValue* cost; size_t num_cost;
  int64_t code_bytes, argument_bytes, output_bytes, alias_bytes, temp_bytes, peak_bytes;
  int64_t streaming_argument_bytes, streaming_output_bytes, streaming_temp_bytes; /* JAX's host_* figures */
  int deleted;
  void* quick; /* PyObject*: its QuickPath, or NULL (executable.pxi) */
};

struct PJRT_Blob { void* py; }; /* PyObject*: bytes */

/* ---- extensions ------------------------------------------------------ */
#define IPU_EXTENSION_TYPE_SHARDINGS 19 /* PJRT_Extension_Type_Shardings */
typedef struct PJRT_Extension_Base {
  size_t struct_size; int type; struct PJRT_Extension_Base* next;
} PJRT_Extension_Base;
/* Both calls of the shardings extension take these arguments. */
typedef struct {
  ARGS_HEAD PJRT_Executable* executable;
  size_t num_shardings;                 /* out */
  const char* const* shardings;         /* out: serialized xla.OpSharding each */
  const size_t* sharding_sizes;         /* out */
} PJRT_Shardings_Args;
typedef struct {
  PJRT_Extension_Base base;
  void* parameter_shardings;
  void* output_shardings;
} PJRT_Shardings_Extension;

/* The profiler extension (xla/pjrt/c/pjrt_c_api_profiler_extension.h) points
 * at a PLUGIN_Profiler_Api table (xla/backends/profiler/plugin/
 * profiler_c_api.h, version 1). jaxlib checks the table's struct_size
 * exactly and does not set the args' struct_size: never read it. */
#define IPU_EXTENSION_TYPE_PROFILER 1 /* PJRT_Extension_Type_Profiler */
typedef struct PJRT_Error PLUGIN_Profiler_Error; /* jax-ipu's errors serve both tables */
typedef struct PLUGIN_Profiler {
  void* py;   /* PyObject*: the jax_ipu.profile.tracing.Tracer */
  void* data; /* PyObject*: bytes of the last collection, owned until the next or destroy */
} PLUGIN_Profiler;
typedef struct { size_t struct_size; void* priv; PLUGIN_Profiler_Error* error; } PLUGIN_Profiler_Error_Destroy_Args;
typedef struct {
  size_t struct_size; void* priv; const PLUGIN_Profiler_Error* error;
  const char* message; size_t message_size; /* out */
} PLUGIN_Profiler_Error_Message_Args;
typedef struct { size_t struct_size; void* priv; const PLUGIN_Profiler_Error* error; int code; } PLUGIN_Profiler_Error_GetCode_Args;
typedef struct {
  size_t struct_size; const char* options; size_t options_size; /* a serialized tensorflow.ProfileOptions */
  PLUGIN_Profiler* profiler; /* out */
} PLUGIN_Profiler_Create_Args;
typedef struct { size_t struct_size; PLUGIN_Profiler* profiler; } PLUGIN_Profiler_Args; /* Destroy, Start, Stop */
/* A call with buffer == NULL hands out the plugin's own bytes (buffer and
 * size set); a call with a buffer copies them into it. */
typedef struct {
  size_t struct_size; PLUGIN_Profiler* profiler;
  uint8_t* buffer; size_t buffer_size_in_bytes; /* in/out, out */
} PLUGIN_Profiler_CollectData_Args;
typedef struct {
  size_t struct_size; void* priv;
  void* error_destroy; void* error_message; void* error_get_code;
  void* create; void* destroy; void* start; void* stop; void* collect_data;
} PLUGIN_Profiler_Api;
typedef struct {
  PJRT_Extension_Base base;
  PLUGIN_Profiler_Api* profiler_api;
  int64_t traceme_context_id; /* for args extensions only */
} PJRT_Profiler_Extension;

/* The layouts extension (xla/pjrt/c/pjrt_c_api_layouts_extension.h,
 * version 4): a buffer's device-local layout. A layout is held as the text
 * XLA prints it in ("{1,0}", minor to major), which is also the serialized
 * form jaxlib reads (PjRtLayout::Deserialize). The executables' layouts are
 * left NULL: jaxlib then reads them from the optimized program. */
#define IPU_EXTENSION_TYPE_LAYOUTS 4 /* PJRT_Extension_Type_Layouts */
typedef struct PJRT_Layouts_MemoryLayout { char* text; size_t text_size; } PJRT_Layouts_MemoryLayout;
typedef struct PJRT_Layouts_MemoryLayout PJRT_Layouts_SerializedLayout; /* a copy, freed by its deleter */
typedef struct { ARGS_HEAD PJRT_Layouts_MemoryLayout* layout; } PJRT_Layouts_MemoryLayout_Destroy_Args;
typedef struct {
  ARGS_HEAD PJRT_Layouts_MemoryLayout* layout;
  const char* serialized_bytes; size_t serialized_bytes_size;      /* out */
  PJRT_Layouts_SerializedLayout* serialized_layout;                /* out */
  void (*serialized_layout_deleter)(PJRT_Layouts_SerializedLayout*); /* out */
} PJRT_Layouts_MemoryLayout_Serialize_Args;
typedef struct { ARGS_HEAD PJRT_Buffer* buffer; PJRT_Layouts_MemoryLayout* layout; } PJRT_Layouts_PJRT_Buffer_MemoryLayout_Args;
/* Client_GetDefaultLayout and Topology_GetDefaultLayout: a client or topology, then these. */
typedef struct {
  ARGS_HEAD void* owner; int type; const int64_t* dims; size_t num_dims;
  PJRT_Layouts_MemoryLayout* layout; /* out */
} PJRT_Layouts_DefaultLayout_Args;
typedef struct {
  PJRT_Extension_Base base;
  void* memory_layout_destroy; void* memory_layout_serialize; void* client_get_default_layout;
  void* buffer_memory_layout; void* topology_get_default_layout;
  void* executable_get_output_layouts; void* executable_get_parameter_layouts;
} PJRT_Layouts_Extension;

/* ---- argument structs ----------------------------------------------- */
typedef struct { ARGS_HEAD int major_version; int minor_version; } PJRT_Api_Version;
typedef struct { ARGS_HEAD PJRT_Error* error; } PJRT_Error_Destroy_Args;
typedef struct { ARGS_HEAD const PJRT_Error* error; const char* message; size_t message_size; } PJRT_Error_Message_Args;
typedef struct { ARGS_HEAD const PJRT_Error* error; int code; } PJRT_Error_GetCode_Args;
typedef struct { ARGS_HEAD const PJRT_Error* error; PayloadVisitor visitor; void* user_arg; } PJRT_Error_ForEachPayload_Args;
typedef struct { ARGS_HEAD } PJRT_Plugin_Initialize_Args;
typedef struct { ARGS_HEAD const PJRT_NamedValue* attributes; size_t num_attributes; } PJRT_Plugin_Attributes_Args;

typedef struct { ARGS_HEAD PJRT_Event* event; } PJRT_Event_Args; /* Destroy, Error, Await */
typedef struct { ARGS_HEAD PJRT_Event* event; bool is_ready; } PJRT_Event_IsReady_Args;
typedef struct { ARGS_HEAD PJRT_Event* event; OnReadyCallback callback; void* user_arg; } PJRT_Event_OnReady_Args;
typedef struct { ARGS_HEAD PJRT_Event* event; int error_code; const char* error_message; size_t error_message_size; } PJRT_Event_Set_Args;

/* The key-value store of jax.distributed, as the framework hands it to
 * Client_Create: the plugin passes its own error maker (callback_error, a
 * pointer to the function pointer) and reads the errors it makes; a value
 * got is the framework's, freed by its deleter once copied. */
typedef PJRT_Error* (*PJRT_CallbackError)(int code, const char* message, size_t message_size);
typedef void (*PJRT_KeyValueDeleter)(char* value);
typedef struct {
  ARGS_HEAD const char* key; size_t key_size; int timeout_in_ms;
  PJRT_CallbackError* callback_error; void* user_arg;
  char* value; size_t value_size; PJRT_KeyValueDeleter value_deleter_callback; /* out */
} PJRT_KeyValueGetCallback_Args;
typedef struct {
  ARGS_HEAD const char* key; size_t key_size;
  PJRT_CallbackError* callback_error; void* user_arg;
  char* value; size_t value_size; PJRT_KeyValueDeleter value_deleter_callback; /* out */
} PJRT_KeyValueTryGetCallback_Args;
typedef struct {
  ARGS_HEAD const char* key; size_t key_size; const char* value; size_t value_size;
  PJRT_CallbackError* callback_error; void* user_arg;
} PJRT_KeyValuePutCallback_Args;
typedef PJRT_Error* (*PJRT_KeyValueGetCallback)(PJRT_KeyValueGetCallback_Args*);
typedef PJRT_Error* (*PJRT_KeyValueTryGetCallback)(PJRT_KeyValueTryGetCallback_Args*);
typedef PJRT_Error* (*PJRT_KeyValuePutCallback)(PJRT_KeyValuePutCallback_Args*);
typedef struct {
  ARGS_HEAD const PJRT_NamedValue* create_options; size_t num_options;
  PJRT_KeyValueGetCallback kv_get_callback; void* kv_get_user_arg;
  PJRT_KeyValuePutCallback kv_put_callback; void* kv_put_user_arg;
  PJRT_Client* client; PJRT_KeyValueTryGetCallback kv_try_get_callback; void* kv_try_get_user_arg;
} PJRT_Client_Create_Args;
/* What the framework learns of the other processes from the coordination
 * service (IFRT's WatchGlobalProcessInfo), pushed on every change. */
typedef struct {
  size_t struct_size; int task_id; uint64_t incarnation_id; int state; int error_code;
  const char* error_message; size_t error_message_size;
} PJRT_ProcessInfo;
typedef struct { ARGS_HEAD PJRT_Client* client; PJRT_ProcessInfo* process_infos; size_t num_process_infos; } PJRT_Client_UpdateGlobalProcessInfo_Args;
typedef struct { ARGS_HEAD PJRT_Client* client; } PJRT_Client_Args; /* Destroy */
typedef struct { ARGS_HEAD PJRT_Client* client; const char* str; size_t str_size; } PJRT_Client_String_Args; /* PlatformName/Version */
typedef struct { ARGS_HEAD PJRT_Client* client; int process_index; } PJRT_Client_ProcessIndex_Args;
typedef struct { ARGS_HEAD PJRT_Client* client; PJRT_Device* const* devices; size_t num_devices; } PJRT_Client_Devices_Args;
typedef struct { ARGS_HEAD PJRT_Client* client; int id; PJRT_Device* device; } PJRT_Client_LookupDevice_Args;
typedef struct { ARGS_HEAD PJRT_Client* client; PJRT_Memory* const* memories; size_t num_memories; } PJRT_Client_AddressableMemories_Args;
typedef struct { ARGS_HEAD char* code; size_t code_size; const char* format; size_t format_size; } PJRT_Program;
typedef struct { ARGS_HEAD PJRT_Client* client; const PJRT_Program* program; const char* compile_options; size_t compile_options_size; PJRT_LoadedExecutable* executable; } PJRT_Client_Compile_Args;
typedef struct { ARGS_HEAD PJRT_Client* client; int num_replicas; int num_partitions; size_t default_assignment_size; int* default_assignment; } PJRT_Client_DefaultDeviceAssignment_Args;
typedef struct {
  ARGS_HEAD PJRT_Client* client; const void* data; int type; const int64_t* dims; size_t num_dims;
  const int64_t* byte_strides; size_t num_byte_strides; int host_buffer_semantics;
  PJRT_Device* device; PJRT_Memory* memory; void* device_layout;
  PJRT_Event* done_with_host_buffer; PJRT_Buffer* buffer;
} PJRT_Client_BufferFromHostBuffer_Args;

typedef struct { ARGS_HEAD PJRT_Device* device; int value; } PJRT_Device_Int_Args; /* DescId, ProcessIndex, LocalHardwareId */
typedef struct { ARGS_HEAD PJRT_Device* device; size_t num_attributes; const PJRT_NamedValue* attributes; } PJRT_DeviceDescription_Attributes_Args;
typedef struct { ARGS_HEAD PJRT_Device* device; const char* str; size_t str_size; } PJRT_Device_String_Args; /* Kind/DebugString/ToString */
typedef struct { ARGS_HEAD PJRT_Device* device; PJRT_Device* description; } PJRT_Device_GetDescription_Args;
typedef struct { ARGS_HEAD PJRT_Device* device; bool is_addressable; } PJRT_Device_IsAddressable_Args;
typedef struct { ARGS_HEAD PJRT_Device* device; PJRT_Memory* const* memories; size_t num_memories; } PJRT_Device_AddressableMemories_Args;
typedef struct { ARGS_HEAD PJRT_Device* device; PJRT_Memory* memory; } PJRT_Device_DefaultMemory_Args;
typedef struct {
  ARGS_HEAD PJRT_Device* device;
  int64_t bytes_in_use;
  int64_t peak_bytes_in_use; bool peak_bytes_in_use_is_set;
  int64_t num_allocs; bool num_allocs_is_set;
  int64_t largest_alloc_size; bool largest_alloc_size_is_set;
  int64_t bytes_limit; bool bytes_limit_is_set;
  int64_t bytes_reserved; bool bytes_reserved_is_set;
  int64_t peak_bytes_reserved; bool peak_bytes_reserved_is_set;
  int64_t bytes_reservable_limit; bool bytes_reservable_limit_is_set;
  int64_t largest_free_block_bytes; bool largest_free_block_bytes_is_set;
  int64_t pool_bytes; bool pool_bytes_is_set;
  int64_t peak_pool_bytes; bool peak_pool_bytes_is_set;
  int64_t peak_allocated_bytes; bool peak_allocated_bytes_is_set;
} PJRT_Device_MemoryStats_Args;
/* The framework does not zero out-fields: clear every field after the
 * input ones, within the size the caller declared. */
#define IPU_CLEAR_OUTPUTS(args, first_out) do { \
    size_t from_ = offsetof(__typeof__(*(args)), first_out); \
    size_t to_ = (args)->struct_size < sizeof(*(args)) ? (args)->struct_size : sizeof(*(args)); \
    if (to_ > from_) memset((char*)(args) + from_, 0, to_ - from_); } while (0)
typedef struct {
  ARGS_HEAD PJRT_Device* device; const PJRT_NamedValue* attributes; size_t num_attributes;
  void* device_attributes; void (*attributes_deleter)(void*);
} PJRT_Device_GetAttributes_Args;

typedef struct { ARGS_HEAD PJRT_Memory* memory; int id; } PJRT_Memory_Int_Args; /* Id, Kind_Id */
typedef struct { ARGS_HEAD PJRT_Memory* memory; const char* str; size_t str_size; } PJRT_Memory_String_Args;
typedef struct { ARGS_HEAD PJRT_Memory* memory; PJRT_Device* const* devices; size_t num_devices; } PJRT_Memory_AddressableByDevices_Args;

typedef struct { ARGS_HEAD PJRT_LoadedExecutable* executable; } PJRT_Executable_Args; /* Destroy, Delete */
typedef struct { ARGS_HEAD PJRT_LoadedExecutable* loaded_executable; PJRT_Executable* executable; } PJRT_LoadedExecutable_GetExecutable_Args;
typedef struct { ARGS_HEAD PJRT_LoadedExecutable* executable; const char* str; size_t str_size; } PJRT_Executable_String_Args; /* Name, Fingerprint */
typedef struct { ARGS_HEAD PJRT_LoadedExecutable* executable; size_t value; } PJRT_Executable_Size_Args; /* NumReplicas/Partitions/Outputs */
typedef struct { ARGS_HEAD PJRT_LoadedExecutable* executable; int64_t size_in_bytes; } PJRT_Executable_CodeSize_Args;
typedef struct { ARGS_HEAD PJRT_LoadedExecutable* executable; size_t num_properties; const PJRT_NamedValue* properties; } PJRT_Executable_GetCostAnalysis_Args;
typedef struct { ARGS_HEAD PJRT_LoadedExecutable* executable; size_t num; const char* const* memory_kinds; const size_t* memory_kind_sizes; } PJRT_Executable_MemoryKinds_Args;
typedef struct { ARGS_HEAD PJRT_LoadedExecutable* executable; const int* output_types; size_t num_output_types; } PJRT_Executable_OutputElementTypes_Args;
typedef struct { ARGS_HEAD PJRT_LoadedExecutable* executable; size_t num_outputs; const int64_t* dims; const size_t* dim_sizes; } PJRT_Executable_OutputDimensions_Args;
typedef struct {
  ARGS_HEAD PJRT_LoadedExecutable* executable;
  int64_t generated_code_size_in_bytes, argument_size_in_bytes, output_size_in_bytes, alias_size_in_bytes, temp_size_in_bytes;
  int64_t host_generated_code_size_in_bytes, host_argument_size_in_bytes, host_output_size_in_bytes, host_alias_size_in_bytes, host_temp_size_in_bytes;
  int64_t peak_memory_in_bytes;
  int64_t total_size_in_bytes, total_allocation_bytes, indefinite_allocations, peak_unpadded_heap_bytes;
} PJRT_Executable_GetCompiledMemoryStats_Args;
typedef struct { ARGS_HEAD PJRT_LoadedExecutable* executable; PJRT_Device* const* devices; size_t num_devices; } PJRT_LoadedExecutable_AddressableDevices_Args;
typedef struct { ARGS_HEAD PJRT_LoadedExecutable* executable; LogicalDeviceIds* ids; size_t num_ids; } PJRT_LoadedExecutable_LogicalIds_Args;
typedef struct { ARGS_HEAD PJRT_LoadedExecutable* executable; bool is_deleted; } PJRT_LoadedExecutable_IsDeleted_Args;
typedef struct {
  ARGS_HEAD PJRT_LoadedExecutable* executable; const char* serialized_bytes; size_t serialized_bytes_size;
  PJRT_Blob* blob; void (*deleter)(PJRT_Blob*);
} PJRT_Executable_Blob_Args; /* GetDeviceAssignment, Serialize */
typedef struct {
  ARGS_HEAD PJRT_Client* client; const char* serialized_executable; size_t serialized_executable_size;
  PJRT_LoadedExecutable* loaded_executable;                       /* out */
  const char* overridden_serialized_compile_options; size_t overridden_serialized_compile_options_size;
  void* load_options;
} PJRT_Executable_DeserializeAndLoad_Args;
typedef struct { ARGS_HEAD PJRT_LoadedExecutable* executable; PJRT_Program* program; } PJRT_Executable_OptimizedProgram_Args;
/* Whether the caller's struct (of `struct_size` bytes) holds `field`. */
#define IPU_HAS_FIELD(args, field) \
  ((args)->struct_size >= offsetof(__typeof__(*(args)), field) + sizeof((args)->field))
/* Frameworks older than the try-get callback pass a shorter struct. */
static inline int ipu_create_has_try_get(const PJRT_Client_Create_Args* a) {
  return a->struct_size >= offsetof(PJRT_Client_Create_Args, kv_try_get_user_arg) + sizeof(void*)
         && a->kv_try_get_callback != NULL;
}
static inline int ipu_has_compile_options_override(const PJRT_Executable_DeserializeAndLoad_Args* a) {
  return IPU_HAS_FIELD(a, overridden_serialized_compile_options_size) && a->overridden_serialized_compile_options != NULL;
}
typedef struct {
  ARGS_HEAD void** send_callbacks; void** recv_callbacks; size_t num_send_ops; size_t num_recv_ops;
  int launch_id; const int64_t* non_donatable_input_indices; size_t num_non_donatable_input_indices;
  /* later fields unused */
} PJRT_ExecuteOptions;
typedef struct {
  ARGS_HEAD PJRT_LoadedExecutable* executable; PJRT_ExecuteOptions* options;
  PJRT_Buffer* const* const* argument_lists; size_t num_devices; size_t num_args;
  PJRT_Buffer** const* output_lists; PJRT_Event** device_complete_events; PJRT_Device* execute_device;
} PJRT_LoadedExecutable_Execute_Args;

typedef struct { ARGS_HEAD PJRT_Buffer* buffer; } PJRT_Buffer_Args; /* Destroy, Delete, Inc/DecRef */
typedef struct { ARGS_HEAD PJRT_Buffer* buffer; int type; } PJRT_Buffer_ElementType_Args;
typedef struct { ARGS_HEAD PJRT_Buffer* buffer; const int64_t* dims; size_t num_dims; } PJRT_Buffer_Dimensions_Args;
typedef struct { ARGS_HEAD PJRT_Buffer* buffer; const size_t* indices; size_t num; } PJRT_Buffer_DynamicDimensionIndices_Args;
typedef struct { ARGS_HEAD PJRT_Buffer* buffer; size_t value; } PJRT_Buffer_Size_Args;
typedef struct { ARGS_HEAD PJRT_Buffer* buffer; PJRT_Device* device; } PJRT_Buffer_Device_Args;
typedef struct { ARGS_HEAD PJRT_Buffer* buffer; PJRT_Memory* memory; } PJRT_Buffer_Memory_Args;
typedef struct { ARGS_HEAD PJRT_Buffer* buffer; bool value; } PJRT_Buffer_Bool_Args; /* IsDeleted, IsOnCpu */
typedef struct { ARGS_HEAD PJRT_Buffer* buffer; PJRT_Event* event; } PJRT_Buffer_ReadyEvent_Args;
typedef struct {
  ARGS_HEAD const int64_t* minor_to_major; size_t minor_to_major_size;
  const int64_t* tile_dims; const size_t* tile_dim_sizes; size_t num_tiles;
} LayoutTiled;
typedef struct { ARGS_HEAD const int64_t* byte_strides; size_t num_byte_strides; } LayoutStrides;
enum { LAYOUT_TILED = 0, LAYOUT_STRIDES = 1 };
typedef struct { ARGS_HEAD union { LayoutTiled tiled; LayoutStrides strides; }; int type; } PJRT_Buffer_MemoryLayout;
typedef struct { ARGS_HEAD PJRT_Buffer* src; PJRT_Buffer_MemoryLayout* host_layout; void* dst; size_t dst_size; PJRT_Event* event; } PJRT_Buffer_ToHostBuffer_Args;
typedef struct { ARGS_HEAD PJRT_Buffer* buffer; void* dst; int64_t offset; int64_t transfer_size; PJRT_Event* event; } PJRT_Buffer_CopyRawToHost_Args;
typedef struct { ARGS_HEAD PJRT_Buffer* buffer; PJRT_Device* dst_device; PJRT_Buffer* dst_buffer; } PJRT_Buffer_CopyToDevice_Args;
typedef struct { ARGS_HEAD PJRT_Buffer* buffer; PJRT_Memory* dst_memory; PJRT_Buffer* dst_buffer; } PJRT_Buffer_CopyToMemory_Args;

/* ---- the API table ---------------------------------------------------- */
/* Slot order of PJRT_Api after its version header. X(name) for each. */
#define PJRT_API_SLOTS(X) \
  X(Error_Destroy) X(Error_Message) X(Error_GetCode) \
  X(Plugin_Initialize) X(Plugin_Attributes) \
  X(Event_Destroy) X(Event_IsReady) X(Event_Error) X(Event_Await) X(Event_OnReady) \
  X(Client_Create) X(Client_Destroy) X(Client_PlatformName) X(Client_ProcessIndex) \
  X(Client_PlatformVersion) X(Client_Devices) X(Client_AddressableDevices) \
  X(Client_LookupDevice) X(Client_LookupAddressableDevice) X(Client_AddressableMemories) \
  X(Client_Compile) X(Client_DefaultDeviceAssignment) X(Client_BufferFromHostBuffer) \
  X(DeviceDescription_Id) X(DeviceDescription_ProcessIndex) X(DeviceDescription_Attributes) \
  X(DeviceDescription_Kind) X(DeviceDescription_DebugString) X(DeviceDescription_ToString) \
  X(Device_GetDescription) X(Device_IsAddressable) X(Device_LocalHardwareId) \
  X(Device_AddressableMemories) X(Device_DefaultMemory) X(Device_MemoryStats) \
  X(Memory_Id) X(Memory_Kind) X(Memory_DebugString) X(Memory_ToString) X(Memory_AddressableByDevices) \
  X(Executable_Destroy) X(Executable_Name) X(Executable_NumReplicas) X(Executable_NumPartitions) \
  X(Executable_NumOutputs) X(Executable_SizeOfGeneratedCodeInBytes) X(Executable_GetCostAnalysis) \
  X(Executable_OutputMemoryKinds) X(Executable_OptimizedProgram) X(Executable_Serialize) \
  X(LoadedExecutable_Destroy) X(LoadedExecutable_GetExecutable) X(LoadedExecutable_AddressableDevices) \
  X(LoadedExecutable_Delete) X(LoadedExecutable_IsDeleted) X(LoadedExecutable_Execute) \
  X(Executable_DeserializeAndLoad) X(LoadedExecutable_Fingerprint) \
  X(Buffer_Destroy) X(Buffer_ElementType) X(Buffer_Dimensions) X(Buffer_UnpaddedDimensions) \
  X(Buffer_DynamicDimensionIndices) X(Buffer_GetMemoryLayout) X(Buffer_OnDeviceSizeInBytes) \
  X(Buffer_Device) X(Buffer_Memory) X(Buffer_Delete) X(Buffer_IsDeleted) X(Buffer_CopyToDevice) \
  X(Buffer_ToHostBuffer) X(Buffer_IsOnCpu) X(Buffer_ReadyEvent) X(Buffer_UnsafePointer) \
  X(Buffer_IncreaseExternalReferenceCount) X(Buffer_DecreaseExternalReferenceCount) \
  X(Buffer_OpaqueDeviceMemoryDataPointer) \
  X(CopyToDeviceStream_Destroy) X(CopyToDeviceStream_AddChunk) X(CopyToDeviceStream_TotalBytes) \
  X(CopyToDeviceStream_GranuleSize) X(CopyToDeviceStream_CurrentBytes) \
  X(TopologyDescription_Create) X(TopologyDescription_Destroy) X(TopologyDescription_PlatformName) \
  X(TopologyDescription_PlatformVersion) X(TopologyDescription_GetDeviceDescriptions) \
  X(TopologyDescription_Serialize) X(TopologyDescription_Attributes) \
  X(Compile) \
  X(Executable_OutputElementTypes) X(Executable_OutputDimensions) X(Buffer_CopyToMemory) \
  X(Client_CreateViewOfDeviceBuffer) X(Executable_Fingerprint) X(Client_TopologyDescription) \
  X(Executable_GetCompiledMemoryStats) X(Memory_Kind_Id) X(ExecuteContext_Create) \
  X(ExecuteContext_Destroy) X(Buffer_CopyRawToHost) X(AsyncHostToDeviceTransferManager_Destroy) \
  X(AsyncHostToDeviceTransferManager_TransferData) X(Client_CreateBuffersForAsyncHostToDevice) \
  X(AsyncHostToDeviceTransferManager_RetrieveBuffer) X(AsyncHostToDeviceTransferManager_Device) \
  X(AsyncHostToDeviceTransferManager_BufferCount) X(AsyncHostToDeviceTransferManager_BufferSize) \
  X(AsyncHostToDeviceTransferManager_SetBufferError) X(AsyncHostToDeviceTransferManager_AddMetadata) \
  X(Client_DmaMap) X(Client_DmaUnmap) X(Client_CreateUninitializedBuffer) \
  X(Client_UpdateGlobalProcessInfo) X(TopologyDescription_Deserialize) X(Client_CreateAliasBuffer) \
  X(Client_FulfillAliasBuffer) X(LoadedExecutable_GetDeviceAssignment) X(Client_CreateErrorBuffer) \
  X(AsyncHostToDeviceTransferManager_TransferLiteral) X(Buffer_CopyRawToHostFuture) \
  X(Device_PoisonExecution) X(Device_CreateAsyncTrackingEvent) X(AsyncTrackingEvent_Destroy) \
  X(Executable_GetCompileOptions) X(Buffer_DonateWithControlDependency) X(Event_Create) X(Event_Set) \
  X(Device_GetAttributes) X(Client_Load) X(LoadedExecutable_AddressableDeviceLogicalIds) \
  X(Buffer_Bitcast) X(Error_ForEachPayload) X(TopologyDescription_Fingerprint) \
  X(Executable_ParameterMemoryKinds) X(Device_ClearMemoryStats) \
  X(TopologyDescription_MakeCanonicalShapeForMemorySpace) X(TopologyDescription_GetMemorySpaceKindIds)

#define IPU_SLOT_ENUM(name) SLOT_##name,
enum { PJRT_API_SLOTS(IPU_SLOT_ENUM) NUM_PJRT_SLOTS };

typedef struct {
  size_t struct_size; void* extension_start;
  PJRT_Api_Version pjrt_api_version;
  void* slots[NUM_PJRT_SLOTS];
} PJRT_Api;

/* Every slot starts as a stub that answers UNIMPLEMENTED naming itself, so
 * the next missing piece names itself. */
PJRT_Error* ipu_unimplemented(const char* function_name);
#define IPU_STUB(name) static PJRT_Error* stub_##name(void* args) { (void)args; return ipu_unimplemented("PJRT_" #name); }
PJRT_API_SLOTS(IPU_STUB)
#define IPU_STUB_ENTRY(name) (void*)stub_##name,
static void* const ipu_stub_slots[NUM_PJRT_SLOTS] = { PJRT_API_SLOTS(IPU_STUB_ENTRY) };
#define IPU_SLOT_NAME(name) #name,
static const char* const ipu_slot_names[NUM_PJRT_SLOTS] = { PJRT_API_SLOTS(IPU_SLOT_NAME) };

static inline int ipu_atomic_add(int* p, int v) { return __atomic_add_fetch(p, v, __ATOMIC_ACQ_REL); }
static inline int64_t ipu_atomic_add64(int64_t* p, int64_t v) { return __atomic_add_fetch(p, v, __ATOMIC_ACQ_REL); }
#define ipu_clear_memory_stats(args) IPU_CLEAR_OUTPUTS(args, bytes_in_use)
#define ipu_clear_compiled_memory_stats(args) IPU_CLEAR_OUTPUTS(args, generated_code_size_in_bytes)
#endif
