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

