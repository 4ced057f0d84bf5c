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
 * validate_batches(buf, max_batch_bytes, check_records, require_keys) checks a produce request's
 * record set as `strom.protocol.records.validate_batches` does (headers, sizes, CRC-32C of
 * batches up to 4 KiB, the framing of uncompressed records) in one call, and makes its
 * [(position, BatchHeader)]; None when the set does not pass: the Python function then raises
 * the error that says why.
 *
 * The module also holds the Produce and Fetch request parsers (_requests.c).
 */
#include "_slots.h"
#include <stdint.h>
#include <string.h>

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

/* The `count` records of p[start:end]: NULL when each is well framed (and keyed, if asked)
 * and they fill it exactly, else the reason, with the bad record's index in *index. */
static const char *walk_records(const unsigned char *p, Py_ssize_t start, Py_ssize_t end, Py_ssize_t count,
                                int require_keys, Py_ssize_t *index)
{
    Py_ssize_t pos = start;
    for (*index = 0; *index < count; (*index)++) {
        if (pos >= end)
            return "fewer records than the batch header counts";
        const char *error = check_one(p, &pos, end, require_keys);
        if (error)
            return error;
    }
    if (pos != end) {
        *index = count - 1;
        return "bytes left after the last record the batch header counts";
    }
    return NULL;
}

static PyObject *check_records(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t start, end, count, index;
    int require_keys;
    if (walk_args(args, &view, &start, &end, &count, &require_keys) != 0)
        return NULL;
    const char *error;
    Py_BEGIN_ALLOW_THREADS
    error = walk_records((const unsigned char *)view.buf, start, end, count, require_keys, &index);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (!error)
        Py_RETURN_NONE;
    return Py_BuildValue("(ns)", index, error);
}

/* --- CRC-32C (Castagnoli), as record batches carry it ------------------------------------- */

static uint32_t crc_table[8][256];

static void crc_table_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][n] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int n = 0; n < 256; n++)
            crc_table[t][n] = (crc_table[t - 1][n] >> 8) ^ crc_table[0][crc_table[t - 1][n] & 0xff];
}

/* Eight bytes a step through the tables: where the CPU has no CRC-32C instruction. */
static uint32_t crc32c_tables(uint32_t crc, const unsigned char *p, size_t n)
{
    for (; n >= 8; p += 8, n -= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        crc = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^ crc_table[5][(lo >> 16) & 0xff]
              ^ crc_table[4][lo >> 24] ^ crc_table[3][p[4]] ^ crc_table[2][p[5]] ^ crc_table[1][p[6]]
              ^ crc_table[0][p[7]];
    }
    while (n--)
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const unsigned char *p, size_t n)
{
    uint64_t c = crc;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = _mm_crc32_u64(c, word);
    }
    crc = (uint32_t)c;
    while (n--)
        crc = _mm_crc32_u8(crc, *p++);
    return crc;
}
static int have_sse42;
#define CRC32C_HW_INIT() (have_sse42 = __builtin_cpu_supports("sse4.2"))
#define CRC32C_HW(crc, p, n) (have_sse42 ? crc32c_sse42(crc, p, n) : crc32c_tables(crc, p, n))
#else
#define CRC32C_HW_INIT() ((void)0)
#define CRC32C_HW(crc, p, n) crc32c_tables(crc, p, n)
#endif

static uint32_t crc32c(const unsigned char *p, size_t n)
{
    return ~CRC32C_HW(0xFFFFFFFFu, p, n);
}

/* --- validate_batches: a produce request's record set, checked in one call ----------------- */

static const char *const header_fields[] = {
    "base_offset", "batch_length", "partition_leader_epoch", "magic", "crc", "attributes",
    "last_offset_delta", "base_timestamp", "max_timestamp", "producer_id", "producer_epoch",
    "base_sequence", "record_count", NULL};
enum { HEADER_FIELDS = 13, HEADER_SIZE = 61, LOG_OVERHEAD = 12, CRC_START = 21, COMPRESSION_MASK = 7 };

static SlotClass batch_header;

static PyObject *batch_header_type(PyObject *self, PyObject *type)
{
    if (slot_class_init(&batch_header, type, header_fields) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static uint64_t be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* The header of the batch at p as a BatchHeader, or NULL. */
static PyObject *make_header(const unsigned char *p)
{
    PyObject *values[HEADER_FIELDS] = {
        PyLong_FromLongLong((int64_t)be(p, 8)), PyLong_FromLong((int32_t)be(p + 8, 4)),
        PyLong_FromLong((int32_t)be(p + 12, 4)), PyLong_FromLong(p[16]),
        PyLong_FromUnsignedLong((uint32_t)be(p + 17, 4)), PyLong_FromLong((int16_t)be(p + 21, 2)),
        PyLong_FromLong((int32_t)be(p + 23, 4)), PyLong_FromLongLong((int64_t)be(p + 27, 8)),
        PyLong_FromLongLong((int64_t)be(p + 35, 8)), PyLong_FromLongLong((int64_t)be(p + 43, 8)),
        PyLong_FromLong((int16_t)be(p + 51, 2)), PyLong_FromLong((int32_t)be(p + 53, 4)),
        PyLong_FromLong((int32_t)be(p + 57, 4))};
    return slot_class_make(&batch_header, values, HEADER_FIELDS);
}

/* Batches larger than this are left for the caller to check the CRC of (the crc32c
 * library interleaves three streams of the CPU's instruction: several times faster on large
 * batches than the one stream here, which is quicker to reach for a small one). */
#define CRC_HERE_MAX 4096

/* Whether the batch at p[pos:] (`size` bytes) passes what Python's validate_batches checks,
 * the records' framing only where they are not compressed (Python walks those), the CRC only
 * up to CRC_HERE_MAX bytes. */
static int batch_ok(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t max_batch_bytes,
                    int check_records, int require_keys, Py_ssize_t *size)
{
    const unsigned char *h = p + pos;
    if (end - pos < HEADER_SIZE || h[16] != 2)
        return 0;
    int32_t length = (int32_t)be(h + 8, 4), last_offset_delta = (int32_t)be(h + 23, 4);
    int32_t count = (int32_t)be(h + 57, 4);
    if (length < HEADER_SIZE - LOG_OVERHEAD || length + (Py_ssize_t)LOG_OVERHEAD > end - pos)
        return 0;
    *size = length + (Py_ssize_t)LOG_OVERHEAD;
    if (*size > max_batch_bytes || count <= 0 || last_offset_delta != count - 1)
        return 0;
    if (*size <= CRC_HERE_MAX && crc32c(h + CRC_START, (size_t)(*size - CRC_START)) != (uint32_t)be(h + 17, 4))
        return 0;
    Py_ssize_t index;
    if (check_records && !(be(h + 21, 2) & COMPRESSION_MASK)
        && walk_records(p, pos + HEADER_SIZE, pos + *size, count, require_keys, &index))
        return 0;
    return 1;
}

/* validate_batches(buf, max_batch_bytes, check_records, require_keys) ->
 * [(position, BatchHeader)] when the record set passes, None when it does not (Python's
 * validate_batches then raises the error that names why). */
static PyObject *validate_batches(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4)
        return PyErr_Format(PyExc_TypeError, "validate_batches takes 4 arguments"), NULL;
    Py_ssize_t max_batch_bytes = PyLong_AsSsize_t(args[1]);
    int check_records = PyObject_IsTrue(args[2]), require_keys = PyObject_IsTrue(args[3]);
    if ((max_batch_bytes == -1 && PyErr_Occurred()) || check_records < 0 || require_keys < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *p = view.buf;
    Py_ssize_t pos = 0, end = view.len, size = 0, batches = 0;
    int ok = end > 0;
    /* First the checks, with the GIL let go for a large set (its CRC), then the objects. */
    if (end > (1 << 16)) {
        Py_BEGIN_ALLOW_THREADS
        for (; ok && pos < end; pos += size, batches++)
            ok = batch_ok(p, pos, end, max_batch_bytes, check_records, require_keys, &size);
        Py_END_ALLOW_THREADS
    } else {
        for (; ok && pos < end; pos += size, batches++)
            ok = batch_ok(p, pos, end, max_batch_bytes, check_records, require_keys, &size);
    }
    PyObject *result = ok ? PyList_New(batches) : Py_NewRef(Py_None);
    for (Py_ssize_t i = 0, at = 0; ok && result && i < batches; i++) {
        PyObject *header = make_header(p + at);
        PyObject *entry = header ? Py_BuildValue("(nN)", at, header) : NULL;
        if (!entry) {
            Py_CLEAR(result);
            break;
        }
        PyList_SET_ITEM(result, i, entry);
        at += (Py_ssize_t)be(p + at + 8, 4) + LOG_OVERHEAD;
    }
    PyBuffer_Release(&view);
    return result;
}

/* crc32c(data, portable=False) -> the CRC-32C of a bytes-like object (portable: by the
 * tables, as where the CPU has no instruction for it; for the tests). */
static PyObject *crc32c_of(PyObject *self, PyObject *args)
{
    Py_buffer view;
    int portable = 0;
    if (!PyArg_ParseTuple(args, "y*|p", &view, &portable))
        return NULL;
    uint32_t crc;
    Py_BEGIN_ALLOW_THREADS
    crc = portable ? ~crc32c_tables(0xFFFFFFFFu, view.buf, (size_t)view.len) : crc32c(view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
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
    {"validate_batches", (PyCFunction)(void (*)(void))validate_batches, METH_FASTCALL,
     "validate_batches(buf, max_batch_bytes, check_records, require_keys) -> [(pos, BatchHeader)] | None"},
    {"batch_header_type", batch_header_type, METH_O, "batch_header_type(BatchHeader): the class to make"},
    {"crc32c", crc32c_of, METH_VARARGS, "crc32c(data, portable=False) -> int"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_records", NULL, -1, methods};

extern PyMethodDef request_methods[]; /* _requests.c: the Produce and Fetch request parsers */

PyMODINIT_FUNC PyInit__records(void)
{
    crc_table_init();
    CRC32C_HW_INIT();
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddFunctions(m, request_methods) < 0
              || PyModule_AddIntConstant(m, "CRC_HERE_MAX", CRC_HERE_MAX) < 0))
        Py_CLEAR(m);
    return m;
}
