/* The Produce request's usual shape, parsed in one call: at ten thousand single-record
 * requests a second the Python parser (header, body, three levels of objects) was a fifth of
 * the broker's instructions per request.
 *
 * parse_produce(frame) -> Request | None reads a whole Produce frame (v3-v12: request header
 * v1/v2, then the body) into the same objects `strom.protocol.messages.parse_request` makes,
 * record sets as writable views of the frame. It returns None for anything off the usual
 * path (another api key or version, a tagged field, a null or non-UTF-8 name, a truncated or
 * malformed frame): the Python parser then parses it, and names what is wrong.
 *
 * produce_types(Request, RequestHeader, ProduceRequest, TopicProduceData,
 * PartitionProduceData) names the classes to make, once: slotted dataclasses, filled here
 * slot by slot (their __init__, run in Python, cost as much as the parse).
 */
#include "_slots.h"
#include <stdint.h>

enum { REQUEST, HEADER, PRODUCE, TOPIC, PARTITION, KINDS };

static const char *const field_names[KINDS][6] = {
    {"header", "body", "size", NULL},
    {"api_key", "api_version", "correlation_id", "client_id", "flexible", NULL},
    {"transactional_id", "acks", "timeout_ms", "topic_data", NULL},
    {"name", "partition_data", "topic_id", NULL},
    {"index", "records", NULL},
};

static SlotClass classes[KINDS];

#define MAKE(kind, values) slot_class_make(&classes[kind], values, (int)(sizeof(values) / sizeof(values[0])))

static PyObject *produce_types(PyObject *self, PyObject *args)
{
    PyObject *given[KINDS];
    if (!PyArg_ParseTuple(args, "OOOOO", &given[0], &given[1], &given[2], &given[3], &given[4]))
        return NULL;
    for (int k = 0; k < KINDS; k++)
        if (slot_class_init(&classes[k], given[k], field_names[k]) < 0)
            return NULL;
    Py_RETURN_NONE;
}

/* The reader: a position in the frame; any read past its end or malformed sets `bad`. */
typedef struct {
    const unsigned char *p;
    Py_ssize_t pos, end;
    int bad;
} Reader;

static int64_t read_be(Reader *r, int n)
{
    if (r->end - r->pos < n) {
        r->bad = 1;
        return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | r->p[r->pos + i];
    r->pos += n;
    if (n == 2)
        return (int16_t)v;
    if (n == 4)
        return (int32_t)v;
    return (int64_t)v;
}

/* An unsigned varint of at most 5 bytes, as the flexible versions' lengths are. */
static int64_t read_uvarint(Reader *r)
{
    uint64_t v = 0;
    for (int i = 0; i < 5; i++) {
        if (r->pos >= r->end) {
            r->bad = 1;
            return 0;
        }
        unsigned char b = r->p[r->pos++];
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80))
            return (int64_t)(v & 0xffffffffu);
    }
    r->bad = 1;
    return 0;
}

/* A length (of a string, bytes or array; -1 for null): compact in flexible versions. */
static int64_t read_length(Reader *r, int flexible, int bytes)
{
    if (flexible)
        return read_uvarint(r) - 1;
    return read_be(r, bytes);
}

/* An empty tag section (one zero byte); any tagged field is for the Python parser. */
static void no_tags(Reader *r)
{
    if (r->pos >= r->end || r->p[r->pos] != 0)
        r->bad = 1;
    else
        r->pos++;
}

/* A string of `n` bytes at the position, as UTF-8 (errors: `replace` or off the path). */
static PyObject *read_text(Reader *r, int64_t n, const char *errors)
{
    if (n < 0 || n > r->end - r->pos) {
        r->bad = 1;
        return NULL;
    }
    PyObject *s = PyUnicode_DecodeUTF8((const char *)r->p + r->pos, (Py_ssize_t)n, errors);
    if (!s) {
        PyErr_Clear();
        r->bad = 1;
        return NULL;
    }
    r->pos += n;
    return s;
}

static PyObject *parse_topics(Reader *r, PyObject *view, int flexible)
{
    int64_t count = read_length(r, flexible, 4);
    if (r->bad || count < 0 || count > r->end - r->pos) {
        r->bad = 1;
        return NULL;
    }
    PyObject *topics = PyList_New(count);
    if (!topics)
        return NULL;
    for (int64_t t = 0; t < count; t++) {
        PyObject *name = read_text(r, read_length(r, flexible, 2), NULL);
        if (!name)
            goto fail;
        int64_t n = read_length(r, flexible, 4);
        PyObject *partitions = (r->bad || n < 0 || n > r->end - r->pos) ? NULL : PyList_New(n);
        if (!partitions) {
            r->bad = 1;
            Py_DECREF(name);
            goto fail;
        }
        PyObject *topic_fields[] = {name, partitions, Py_NewRef(Py_None)};
        PyObject *topic = MAKE(TOPIC, topic_fields);
        if (!topic)
            goto fail;
        PyList_SET_ITEM(topics, t, topic);
        for (int64_t i = 0; i < n; i++) {
            int64_t index = read_be(r, 4);
            int64_t size = read_length(r, flexible, 4);
            if (r->bad || size > r->end - r->pos) {
                r->bad = 1;
                goto fail;
            }
            PyObject *records = Py_None;
            if (size >= 0) {
                records = PySequence_GetSlice(view, r->pos, r->pos + size);
                if (!records)
                    goto fail;
                r->pos += size;
            } else {
                Py_INCREF(records);
            }
            PyObject *partition_fields[] = {PyLong_FromLongLong(index), records};
            PyObject *partition = MAKE(PARTITION, partition_fields);
            if (!partition)
                goto fail;
            PyList_SET_ITEM(partitions, i, partition);
            if (flexible)
                no_tags(r);
        }
        if (flexible)
            no_tags(r);
        if (r->bad)
            goto fail;
    }
    return topics;
fail:
    Py_DECREF(topics);  /* the list's unset items are NULL, which its dealloc skips */
    return NULL;
}

static PyObject *parse_produce(PyObject *self, PyObject *frame)
{
    Py_buffer buf;
    if (PyObject_GetBuffer(frame, &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    Reader r = {buf.buf, 0, buf.len, 0};
    PyObject *result = NULL, *view = NULL, *client_id = NULL, *transactional_id = NULL;
    int16_t key = (int16_t)read_be(&r, 2), version = (int16_t)read_be(&r, 2);
    if (r.bad || key != 0 || version < 3 || version > 12)
        goto off_path;
    int flexible = version >= 9;
    int32_t correlation_id = (int32_t)read_be(&r, 4);
    int64_t client_len = read_be(&r, 2);
    if (client_len >= 0 && !(client_id = read_text(&r, client_len, "replace")))
        goto off_path;
    if (flexible)
        no_tags(&r);
    int64_t txn_len = read_length(&r, flexible, 2);
    if (r.bad || (txn_len >= 0 && !(transactional_id = read_text(&r, txn_len, NULL))))
        goto off_path;
    int64_t acks = read_be(&r, 2), timeout_ms = read_be(&r, 4);
    if (r.bad || !(view = PyMemoryView_FromObject(frame)))
        goto off_path;
    PyObject *topics = parse_topics(&r, view, flexible);
    if (!topics)
        goto off_path;
    if (flexible)
        no_tags(&r);
    if (r.bad || r.pos != r.end) {
        Py_DECREF(topics);
        goto off_path;
    }
    PyObject *body_fields[] = {transactional_id ? transactional_id : Py_NewRef(Py_None),
                               PyLong_FromLong((long)acks), PyLong_FromLong((long)timeout_ms), topics};
    transactional_id = NULL;
    PyObject *body = MAKE(PRODUCE, body_fields);
    PyObject *header_fields[] = {PyLong_FromLong(key), PyLong_FromLong(version),
                                 PyLong_FromLong(correlation_id),
                                 client_id ? client_id : Py_NewRef(Py_None),
                                 PyBool_FromLong(flexible)};
    client_id = NULL;
    PyObject *header = MAKE(HEADER, header_fields);
    PyObject *request_fields[] = {header, body, PyLong_FromSsize_t(buf.len)};
    if (header && body && request_fields[2])
        result = MAKE(REQUEST, request_fields);
    else {
        Py_XDECREF(header);
        Py_XDECREF(body);
        Py_XDECREF(request_fields[2]);
    }
    goto done;
off_path:
    if (!PyErr_Occurred())
        result = Py_NewRef(Py_None);
done:
    Py_XDECREF(client_id);
    Py_XDECREF(transactional_id);
    Py_XDECREF(view);
    PyBuffer_Release(&buf);
    return result;
}

PyMethodDef produce_methods[] = {
    {"parse_produce", parse_produce, METH_O,
     "parse_produce(frame) -> Request | None (None: not the usual Produce; parse it in Python)"},
    {"produce_types", produce_types, METH_VARARGS,
     "produce_types(Request, RequestHeader, ProduceRequest, TopicProduceData, PartitionProduceData)"},
    {NULL, NULL, 0, NULL},
};
