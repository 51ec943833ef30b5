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
    cdef size_t n = len(py_client.all_devices), i
    cdef PJRT_Device* d
    cdef PJRT_Memory* m
    Py_INCREF(py_client)
    c.py = <void*>py_client
    c.platform_name = kept(keep, py_client.platform_name, &c.platform_name_size)
    c.platform_version = kept(keep, py_client.platform_version, &c.platform_version_size)
    c.num_devices = n
    c.devices = <PJRT_Device**>calloc(max(n, 1), sizeof(void*))
    cdef size_t kinds = len(py_client.devices[0].memories) if n else 1, k
    cdef size_t n_local = len(py_client.devices), j = 0
    c.process_index = py_client.process_index
    c.num_addressable_devices = n_local
    c.addressable_devices = <PJRT_Device**>calloc(max(n_local, 1), sizeof(void*))
    # The client's (addressable) memories are its own devices'.
    c.num_memories = n_local * kinds
    c.memories = <PJRT_Memory**>calloc(max(n_local * kinds, 1), sizeof(void*))
    for i in range(n):
        dev = py_client.all_devices[i]
        d = <PJRT_Device*>calloc(1, sizeof(PJRT_Device))
        d.id = dev.id
        d.local_hardware_id = dev.local_hardware_id
        d.process_index = dev.process_index
        d.addressable = dev.process_index == py_client.process_index
        d.kind = kept(keep, dev.kind, &d.kind_size)
        d.debug_string = kept(keep, dev.debug_string, &d.debug_string_size)
        d.to_string = kept(keep, dev.to_string, &d.to_string_size)
        d.attributes = named_values(list(dev.attributes.items()), keep)
        d.num_attributes = len(dev.attributes)
        d.bytes_limit = dev.bytes_limit
        # The device's memories, as the Python device lists them (kind,
        # description); ids: device id + kind index x device count.
        d.num_memories = kinds
        d.memories = <PJRT_Memory**>calloc(kinds, sizeof(void*))
        for k in range(kinds):
            kind, description = dev.memories[k]
            m = <PJRT_Memory*>calloc(1, sizeof(PJRT_Memory))
            m.vtable = &MEMORY_VTABLE
            m.id = dev.id + k * n
            m.kind_id = k
            m.kind = kept(keep, kind, &m.kind_size)
            m.debug_string = kept(keep, f"{description} of {dev.to_string}", &m.debug_string_size)
            m.to_string = kept(keep, f"MemorySpace({kind}, device={dev.id})", &m.to_string_size)
            m.device = d
            pthread_mutex_init(&m.user_data_lock, NULL)
            d.memories[k] = m
        d.memory = d.memories[0]
        c.devices[i] = d
        if d.addressable:
            for k in range(kinds):
                c.memories[k * n_local + j] = d.memories[k]
            c.addressable_devices[j] = d
            j += 1
    return c

cdef void free_client(PJRT_Client* c) noexcept nogil:
    cdef size_t i, k
    cdef UserData* u
    cdef UserData* nxt
    for i in range(c.num_devices):
        for k in range(c.devices[i].num_memories):
            u = c.devices[i].memories[k].user_data
            while u != NULL:
                nxt = u.next
                if u.dtor != NULL:
                    u.dtor(u.data)
                free(u)
                u = nxt
            free(c.devices[i].memories[k])
        free(c.devices[i].memories)
        free(c.devices[i].attributes)
        free(c.devices[i])
    free(c.devices)
    free(c.addressable_devices)
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
            a.client = build_client(create_client(options, key_value_store(a)))
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
    a.process_index = a.client.process_index
    return NULL

cdef PJRT_Error* e_client_devices(PJRT_Client_Devices_Args* a) noexcept nogil:
    a.devices = a.client.devices
    a.num_devices = a.client.num_devices
    return NULL

cdef PJRT_Error* e_client_addressable_devices(PJRT_Client_Devices_Args* a) noexcept nogil:
    a.devices = a.client.addressable_devices
    a.num_devices = a.client.num_addressable_devices
    return NULL

cdef PJRT_Error* e_client_lookup_addressable_device(PJRT_Client_LookupDevice_Args* a) noexcept nogil:
    # `id` is the local hardware id here: this process's IPU number.
    cdef size_t i
    a.device = NULL
    for i in range(a.client.num_addressable_devices):
        if a.client.addressable_devices[i].local_hardware_id == a.id:
            a.device = a.client.addressable_devices[i]
    if a.device == NULL:
        return make_error(CODE_INVALID_ARGUMENT, b"no addressable IPU with that local hardware id", 46)
    return NULL

cdef PJRT_Error* e_client_lookup_device(PJRT_Client_LookupDevice_Args* a) noexcept nogil:
    a.device = device_by_id(a.client, a.id)
    if a.device == NULL:
        return make_error(CODE_INVALID_ARGUMENT, b"no IPU device with that id", 26)
    return NULL

cdef PJRT_Error* e_client_addressable_memories(PJRT_Client_AddressableMemories_Args* a) noexcept nogil:
    a.memories = a.client.memories
    a.num_memories = a.client.num_memories
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
    a.value = a.device.process_index
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
    a.is_addressable = a.device.addressable != 0
    return NULL

cdef PJRT_Error* e_device_addressable_memories(PJRT_Device_AddressableMemories_Args* a) noexcept nogil:
    a.memories = a.device.memories
    a.num_memories = a.device.num_memories
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
    # All of the limit may be reserved (the Model has no allocator of its own).
    a.bytes_reservable_limit = a.device.bytes_limit
    a.bytes_reservable_limit_is_set = True
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
    a.id = a.memory.kind_id
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

