# ------------------------------------------------------------- the table --

cdef PJRT_Api* API = <PJRT_Api*>calloc(1, sizeof(PJRT_Api))
API.struct_size = sizeof(PJRT_Api)
# Extensions: shardings (for programs over several IPUs) ...
cdef PJRT_Shardings_Extension* SHARDINGS = <PJRT_Shardings_Extension*>calloc(1, sizeof(PJRT_Shardings_Extension))
SHARDINGS.base.struct_size = sizeof(PJRT_Shardings_Extension)
SHARDINGS.base.type = IPU_EXTENSION_TYPE_SHARDINGS
SHARDINGS.parameter_shardings = <void*>e_parameter_shardings
SHARDINGS.output_shardings = <void*>e_output_shardings
# ... and the profiler (jax.profiler's traces show the IPUs).
cdef PLUGIN_Profiler_Api* PROFILER_API = <PLUGIN_Profiler_Api*>calloc(1, sizeof(PLUGIN_Profiler_Api))
PROFILER_API.struct_size = sizeof(PLUGIN_Profiler_Api)
PROFILER_API.error_destroy = <void*>e_profiler_error_destroy
PROFILER_API.error_message = <void*>e_profiler_error_message
PROFILER_API.error_get_code = <void*>e_profiler_error_get_code
PROFILER_API.create = <void*>e_profiler_create
PROFILER_API.destroy = <void*>e_profiler_destroy
PROFILER_API.start = <void*>e_profiler_start
PROFILER_API.stop = <void*>e_profiler_stop
PROFILER_API.collect_data = <void*>e_profiler_collect_data
cdef PJRT_Profiler_Extension* PROFILER = <PJRT_Profiler_Extension*>calloc(1, sizeof(PJRT_Profiler_Extension))
PROFILER.base.struct_size = sizeof(PJRT_Profiler_Extension)
PROFILER.base.type = IPU_EXTENSION_TYPE_PROFILER
PROFILER.base.next = NULL
PROFILER.profiler_api = PROFILER_API
# ... and buffers' device-local layouts.
cdef PJRT_Layouts_Extension* LAYOUTS = <PJRT_Layouts_Extension*>calloc(1, sizeof(PJRT_Layouts_Extension))
LAYOUTS.base.struct_size = sizeof(PJRT_Layouts_Extension)
LAYOUTS.base.type = IPU_EXTENSION_TYPE_LAYOUTS
LAYOUTS.memory_layout_destroy = <void*>e_layout_destroy
LAYOUTS.memory_layout_serialize = <void*>e_layout_serialize
LAYOUTS.client_get_default_layout = <void*>e_default_layout
LAYOUTS.buffer_memory_layout = <void*>e_buffer_layout
LAYOUTS.topology_get_default_layout = <void*>e_default_layout
PROFILER.base.next = &LAYOUTS.base
SHARDINGS.base.next = &PROFILER.base
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
install("Client_AddressableDevices", <void*>e_client_addressable_devices)
install("Client_LookupDevice", <void*>e_client_lookup_device)
install("Client_LookupAddressableDevice", <void*>e_client_lookup_addressable_device)
install("Client_UpdateGlobalProcessInfo", <void*>e_client_update_global_process_info)
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
install("Executable_Serialize", <void*>e_executable_serialize)
install("Executable_DeserializeAndLoad", <void*>e_executable_deserialize_and_load)
install("Executable_OptimizedProgram", <void*>e_executable_optimized_program)
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

