/* Decoding: wire bytes -> protobuf-c messages.
 *
 * protobuf-c validates the wire format itself but recurses once per nested
 * message with no limit, so a small crafted file (a GraphProto in an attribute in
 * a node in a GraphProto ...) could exhaust the stack. onnx_check_depth walks the
 * wire data first with the same descriptors, following only the fields that hold
 * messages, and refuses nesting deeper than ONNX_MAX_DEPTH. */
#include "onnx/onnx_internal.h"

#include <inttypes.h>
#include <string.h>

/* Reads a base-128 varint; false at the end of the data or past 10 bytes. */
static bool read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    uint64_t r = 0;
    for (int shift = 0; shift < 70 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = r;
            return true;
        }
    }
    return false;
}

static const ProtobufCFieldDescriptor *field_of(const ProtobufCMessageDescriptor *d, uint32_t id) {
    for (unsigned i = 0; i < d->n_fields; i++)
        if (d->fields[i].id == id) return &d->fields[i];
    return NULL;
}

/* 0: ok; 1: too deep; 2: malformed wire data. */
static int walk(const ProtobufCMessageDescriptor *d, const uint8_t *p, const uint8_t *end, int depth) {
    if (depth > ONNX_MAX_DEPTH) return 1;
    while (p < end) {
        uint64_t key, len;
        if (!read_varint(&p, end, &key)) return 2;
        switch (key & 7) {
        case 0:
            if (!read_varint(&p, end, &len)) return 2;
            break;
        case 1:
            if (end - p < 8) return 2;
            p += 8;
            break;
        case 5:
            if (end - p < 4) return 2;
            p += 4;
            break;
        case 2: {
            if (!read_varint(&p, end, &len) || len > (uint64_t)(end - p)) return 2;
            const ProtobufCFieldDescriptor *f = key >> 3 <= UINT32_MAX ? field_of(d, (uint32_t)(key >> 3)) : NULL;
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
                int r = walk((const ProtobufCMessageDescriptor *)f->descriptor, p, p + len, depth + 1);
                if (r) return r;
            }
            p += len;
            break;
        }
        default: return 2; /* groups (3, 4) are not used by onnx.proto; 6, 7 do not exist */
        }
    }
    return 0;
}

fm_status onnx_check_depth(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t n,
                           const char *what) {
    int r = walk(desc, data, data + n, 1);
    if (r == 1)
        return fm_set_error(FM_ERR_FORMAT, "%s: messages nest deeper than %d levels (a corrupt or hostile file)", what,
                            ONNX_MAX_DEPTH);
    if (r == 2)
        return fm_set_error(FM_ERR_FORMAT, "%s: not a valid protobuf %s (truncated or corrupt)", what, desc->name);
    return FM_OK;
}

ProtobufCMessage *onnx_unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t n,
                              const char *what) {
    if (onnx_check_depth(desc, data, n, what)) return NULL;
    ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, n, data);
    if (!m) fm_set_error(FM_ERR_FORMAT, "%s: not a valid protobuf %s (truncated or corrupt)", what, desc->name);
    return m;
}
