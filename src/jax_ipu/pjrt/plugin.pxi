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

