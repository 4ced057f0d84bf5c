/* Record framing checks for produce requests: the one loop over every record that the
 * broker runs on the hot path. `strom.protocol.records` holds the same rules in Python, used
 * where this module was not built; the tests hold both to the same answers.
 *
 * check_records(buf, start, end, count, require_keys) walks the `count` records of an
 * uncompressed RecordBatch v2 body buf[start:end] and returns None when every record is well
 * framed (and keyed, if asked), else (index of the first bad record, reason).
 *
 * schema_ids(buf, start, end, count, value) reads the schema registry's framing (magic byte 0,
 * a 4-byte big-endian schema id) at the start of each record's value (or key), for schema
 * validation on produce: (the distinct ids, in order of first use, the indexes of the records
 * whose non-null field is not framed), or None when the records are malformed (the framing
 * check refuses those) or use more distinct ids than it keeps.
 *
 * The module also holds the Produce request parser (_produce.c).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

enum { VARINT_OK = 0, VARINT_TRUNCATED = 1, VARINT_TOO_LONG = 2 };

/* A zig-zag varint of at most `max_bytes` bytes (5 for an int, 10 for a long), read from
 * p[*pos] without passing `end`. */
static int read_varint(const unsigned char *p, Py_ssize_t end, Py_ssize_t *pos, int max_bytes,
                       int64_t *out)
{
    uint64_t raw = 0;
    for (int i = 0; i < max_bytes; i++) {
        if (*pos >= end)
            return VARINT_TRUNCATED;
        unsigned char b = p[(*pos)++];
        raw |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            if (max_bytes == 5) {
                uint32_t r32 = (uint32_t)raw;
                *out = (int32_t)((r32 >> 1) ^ (uint32_t)(-(int32_t)(r32 & 1)));
            } else {
                *out = (int64_t)((raw >> 1) ^ (uint64_t)(-(int64_t)(raw & 1)));
            }
            return VARINT_OK;
        }
    }
    return VARINT_TOO_LONG;
}

/* Skips a length-prefixed byte string (length -1, or any negative, is null). */
static const char *skip_bytes(const unsigned char *p, Py_ssize_t end, Py_ssize_t *pos,
                              int64_t *length)
{
    if (read_varint(p, end, pos, 5, length) != VARINT_OK)
        return "malformed length";
    if (*length > 0) {
        if (*length > end - *pos)
            return "field runs past the end of the record";
        *pos += *length;
    }
    return NULL;
}

static const char *check_one(const unsigned char *p, Py_ssize_t *pos, Py_ssize_t end,
                             int require_keys)
{
    int64_t size, value, length;
    if (read_varint(p, end, pos, 5, &size) != VARINT_OK)
        return "malformed record length";
    if (size < 1 || size > end - *pos)
        return "record length runs past the end of the batch";
    Py_ssize_t record_end = *pos + size;
    (*pos)++; /* attributes */
    if (read_varint(p, record_end, pos, 10, &value) != VARINT_OK)
        return "malformed timestamp delta";
    if (read_varint(p, record_end, pos, 5, &value) != VARINT_OK)
        return "malformed offset delta";
    const char *error = skip_bytes(p, record_end, pos, &length);
    if (error)
        return error;
    if (require_keys && length < 0)
        return "Compacted topic cannot accept message without key";
    if ((error = skip_bytes(p, record_end, pos, &length)))
        return error;
    int64_t headers;
    if (read_varint(p, record_end, pos, 5, &headers) != VARINT_OK)
        return "malformed header count";
    if (headers < 0)
        return "negative header count";
    for (int64_t h = 0; h < headers; h++) {
        if ((error = skip_bytes(p, record_end, pos, &length)))
            return error;
        if (length < 0)
            return "null header key";
        if ((error = skip_bytes(p, record_end, pos, &length)))
            return error;
    }
    if (*pos != record_end)
        return "record length does not match its fields";
    return NULL;
}

/* Both walks take (buf, start, end, count, flag); on failure the buffer is released. */
static int walk_args(PyObject *args, Py_buffer *view, Py_ssize_t *start, Py_ssize_t *end,
                     Py_ssize_t *count, int *flag)
{
    if (!PyArg_ParseTuple(args, "y*nnnp", view, start, end, count, flag))
        return -1;
    if (*start < 0 || *end > view->len || *start > *end) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "range outside the buffer");
        return -1;
    }
    return 0;
}

static PyObject *check_records(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t start, end, count;
    int require_keys;
    if (walk_args(args, &view, &start, &end, &count, &require_keys) != 0)
        return NULL;
    const unsigned char *p = (const unsigned char *)view.buf;
    const char *error = NULL;
    Py_ssize_t pos = start, index = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; index < count; index++) {
        if (pos >= end) {
            error = "fewer records than the batch header counts";
            break;
        }
        if ((error = check_one(p, &pos, end, require_keys)))
            break;
    }
    if (!error && pos != end) {
        error = "bytes left after the last record the batch header counts";
        index = count - 1;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (!error)
        Py_RETURN_NONE;
    return Py_BuildValue("(ns)", index, error);
}

#define MAX_SCHEMA_IDS 64

/* The key (value=0) or value (value=1) of the record at *pos: its offset and length (-1: null). */
static int field_of(const unsigned char *p, Py_ssize_t *pos, Py_ssize_t end, int value,
                    Py_ssize_t *field, int64_t *field_length)
{
    int64_t size, skip, length;
    if (read_varint(p, end, pos, 5, &size) != VARINT_OK || size < 1 || size > end - *pos)
        return -1;
    Py_ssize_t record_end = *pos + size;
    (*pos)++; /* attributes */
    if (read_varint(p, record_end, pos, 10, &skip) != VARINT_OK ||
        read_varint(p, record_end, pos, 5, &skip) != VARINT_OK)
        return -1;
    for (int which = 0; which <= value; which++) {
        Py_ssize_t at;
        if (read_varint(p, record_end, pos, 5, &length) != VARINT_OK)
            return -1;
        at = *pos;
        if (length > 0) {
            if (length > record_end - *pos)
                return -1;
            *pos += length;
        }
        *field = at;
        *field_length = length;
    }
    *pos = record_end;
    return 0;
}

static PyObject *schema_ids(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t start, end, count;
    int value;
    if (walk_args(args, &view, &start, &end, &count, &value) != 0)
        return NULL;
    const unsigned char *p = (const unsigned char *)view.buf;
    uint32_t ids[MAX_SCHEMA_IDS];
    int distinct = 0;
    PyObject *unframed = PyList_New(0);
    if (!unframed) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_ssize_t pos = start;
    int malformed = 0;
    for (Py_ssize_t index = 0; index < count && !malformed; index++) {
        Py_ssize_t field;
        int64_t length;
        if (pos >= end || field_of(p, &pos, end, value, &field, &length) != 0) {
            malformed = 1;
            break;
        }
        if (length < 0)
            continue; /* null: nothing to validate */
        if (length < 5 || p[field] != 0) {
            PyObject *i = PyLong_FromSsize_t(index);
            if (!i || PyList_Append(unframed, i) != 0) {
                Py_XDECREF(i);
                Py_DECREF(unframed);
                PyBuffer_Release(&view);
                return NULL;
            }
            Py_DECREF(i);
            continue;
        }
        uint32_t id = ((uint32_t)p[field + 1] << 24) | ((uint32_t)p[field + 2] << 16) |
                      ((uint32_t)p[field + 3] << 8) | (uint32_t)p[field + 4];
        int seen = 0;
        for (int k = 0; k < distinct && !seen; k++)
            seen = ids[k] == id;
        if (!seen) {
            if (distinct == MAX_SCHEMA_IDS) {
                malformed = 1; /* too many to keep: the caller walks in Python */
                break;
            }
            ids[distinct++] = id;
        }
    }
    if (!malformed && pos != end)
        malformed = 1;
    PyBuffer_Release(&view);
    if (malformed) {
        Py_DECREF(unframed);
        Py_RETURN_NONE;
    }
    PyObject *found = PyTuple_New(distinct);
    if (!found) {
        Py_DECREF(unframed);
        return NULL;
    }
    for (int k = 0; k < distinct; k++)
        PyTuple_SET_ITEM(found, k, PyLong_FromUnsignedLong(ids[k]));
    return Py_BuildValue("(NN)", found, unframed);
}

static PyMethodDef methods[] = {
    {"schema_ids", schema_ids, METH_VARARGS,
     "schema_ids(buf, start, end, count, value) -> None | (ids, unframed indexes)"},
    {"check_records", check_records, METH_VARARGS,
     "check_records(buf, start, end, count, require_keys) -> None | (index, reason)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_records", NULL, -1, methods};

extern PyMethodDef produce_methods[]; /* _produce.c: the Produce request parser */

PyMODINIT_FUNC PyInit__records(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddFunctions(m, produce_methods) < 0)
        Py_CLEAR(m);
    return m;
}
