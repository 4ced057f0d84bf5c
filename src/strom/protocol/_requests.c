/* The two hot requests' usual shapes parsed in one call each: at ten thousand small requests
 * a second the Python parsers (header, body, levels of objects) were a fifth of the broker's
 * instructions per Produce and per Fetch.
 *
 * parse_request(frame) -> Request | None reads a whole Produce (v3-v12) or Fetch (v4-v18)
 * frame, request header v1/v2 and body, into the objects `strom.protocol.messages` documents
 * (produce.py's and fetch.py's slotted dataclasses), a Produce's record sets as writable views
 * of the frame. It returns None for any other request and for anything off the usual path (a
 * tagged field it does not know, a null or non-UTF-8 name, a truncated or malformed frame):
 * the Python parsers then parse it, and name what is wrong.
 *
 * request_types(classes, uuid_of) names, once, the classes to make (a dict of the names below
 * to classes: slotted dataclasses, filled here slot by slot, since their __init__, run in
 * Python, cost as much as the parse) and the function that makes a topic id from 16 bytes.
 */
#include "_slots.h"
#include <stdint.h>

enum { REQUEST, HEADER, PRODUCE, PRODUCE_TOPIC, PRODUCE_PARTITION, FETCH, FETCH_TOPIC,
       FETCH_PARTITION, FORGOTTEN_TOPIC, REPLICA_STATE, KINDS };

static const char *const class_names[KINDS] = {
    "Request", "RequestHeader", "ProduceRequest", "TopicProduceData", "PartitionProduceData",
    "FetchRequest", "FetchTopic", "FetchPartition", "ForgottenTopic", "ReplicaState"};

static const char *const field_names[KINDS][13] = {
    {"header", "body", "size", NULL},
    {"api_key", "api_version", "correlation_id", "client_id", "flexible", NULL},
    {"transactional_id", "acks", "timeout_ms", "topic_data", NULL},
    {"name", "partition_data", "topic_id", NULL},
    {"index", "records", NULL},
    {"cluster_id", "replica_id", "replica_state", "max_wait_ms", "min_bytes", "max_bytes",
     "isolation_level", "session_id", "session_epoch", "topics", "forgotten_topics_data", "rack_id", NULL},
    {"topic", "topic_id", "partitions", NULL},
    {"partition", "current_leader_epoch", "fetch_offset", "last_fetched_epoch", "log_start_offset",
     "partition_max_bytes", "replica_directory_id", "high_watermark", NULL},
    {"topic", "topic_id", "partitions", NULL},
    {"replica_id", "replica_epoch", NULL},
};

static SlotClass classes[KINDS];
static PyObject *uuid_of; /* bytes -> uuid.UUID */

#define MAKE(kind, values) slot_class_make(&classes[kind], values, (int)(sizeof(values) / sizeof(values[0])))

static PyObject *request_types(PyObject *self, PyObject *args)
{
    PyObject *given, *make_uuid;
    if (!PyArg_ParseTuple(args, "O!O", &PyDict_Type, &given, &make_uuid))
        return NULL;
    for (int k = 0; k < KINDS; k++) {
        PyObject *cls = PyDict_GetItemString(given, class_names[k]);
        if (!cls)
            return PyErr_Format(PyExc_KeyError, "no class %s given", class_names[k]);
        if (slot_class_init(&classes[k], cls, field_names[k]) < 0)
            return NULL;
    }
    Py_INCREF(make_uuid);
    Py_XSETREF(uuid_of, make_uuid);
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
    if (n == 1)
        return (int8_t)v;
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

/* An empty tag section (one zero byte); a tagged field where none is known is for Python. */
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

/* A string (non-null), a topic id (16 bytes), or a new int: NULL with `bad` set or an error. */
static PyObject *read_string(Reader *r, int flexible)
{
    return read_text(r, read_length(r, flexible, 2), NULL);
}

static PyObject *read_uuid(Reader *r)
{
    if (r->end - r->pos < 16) {
        r->bad = 1;
        return NULL;
    }
    PyObject *raw = PyBytes_FromStringAndSize((const char *)r->p + r->pos, 16);
    r->pos += 16;
    PyObject *id = raw ? PyObject_CallOneArg(uuid_of, raw) : NULL;
    Py_XDECREF(raw);
    return id;
}

static PyObject *read_int(Reader *r, int n)
{
    int64_t v = read_be(r, n);
    return r->bad ? NULL : PyLong_FromLongLong(v);
}

/* A count of array elements that can fit in what is left (each at least one byte). */
static Py_ssize_t read_count(Reader *r, int flexible)
{
    int64_t n = read_length(r, flexible, 4);
    if (r->bad || n < 0 || n > r->end - r->pos) {
        r->bad = 1;
        return -1;
    }
    return (Py_ssize_t)n;
}

/* A tag section's entries, one by one: the next tag and where its data ends, or -1 when none
 * is left (or the section is malformed: `bad`). */
typedef struct {
    Py_ssize_t left, data_end;
} Tags;

static int64_t next_tag(Reader *r, Tags *t)
{
    if (t->left <= 0 || r->bad)
        return -1;
    t->left--;
    int64_t tag = read_uvarint(r), size = read_uvarint(r);
    if (r->bad || size > r->end - r->pos) {
        r->bad = 1;
        return -1;
    }
    t->data_end = r->pos + size;
    return tag;
}

static void start_tags(Reader *r, Tags *t)
{
    int64_t n = read_uvarint(r); /* a plain count, not count + 1 */
    if (n > r->end - r->pos)
        r->bad = 1;
    t->left = r->bad ? 0 : (Py_ssize_t)n;
}

/* After a tag's data: it must have been read exactly. */
static void end_tag(Reader *r, Tags *t)
{
    if (r->pos != t->data_end)
        r->bad = 1;
}

/* The request header (v1, or v2 with an empty tag section): correlation id and client id. */
static int read_header(Reader *r, int flexible, int32_t *correlation_id, PyObject **client_id)
{
    *correlation_id = (int32_t)read_be(r, 4);
    int64_t client_len = read_be(r, 2);
    *client_id = NULL;
    if (!r->bad && client_len >= 0 && !(*client_id = read_text(r, client_len, "replace")))
        return -1;
    if (flexible)
        no_tags(r);
    return r->bad ? -1 : 0;
}

/* The Request around a parsed body (stolen; NULL: none). */
static PyObject *make_request(int16_t key, int16_t version, int flexible, int32_t correlation_id,
                              PyObject *client_id, PyObject *body, Py_ssize_t size)
{
    PyObject *header_fields[] = {PyLong_FromLong(key), PyLong_FromLong(version), PyLong_FromLong(correlation_id),
                                 client_id ? client_id : Py_NewRef(Py_None), PyBool_FromLong(flexible)};
    PyObject *header = MAKE(HEADER, header_fields);
    PyObject *request_fields[] = {header, body, PyLong_FromSsize_t(size)};
    return MAKE(REQUEST, request_fields);
}

/* --- Produce -------------------------------------------------------------------------------- */

static PyObject *parse_topics(Reader *r, PyObject *view, int flexible)
{
    Py_ssize_t count = read_count(r, flexible);
    PyObject *topics = count >= 0 ? PyList_New(count) : NULL;
    if (!topics)
        return NULL;
    for (Py_ssize_t t = 0; t < count; t++) {
        PyObject *name = read_string(r, flexible);
        if (!name)
            goto fail;
        Py_ssize_t n = read_count(r, flexible);
        PyObject *partitions = n >= 0 ? PyList_New(n) : NULL;
        if (!partitions) {
            Py_DECREF(name);
            goto fail;
        }
        PyObject *topic_fields[] = {name, partitions, Py_NewRef(Py_None)};
        PyObject *topic = MAKE(PRODUCE_TOPIC, topic_fields);
        if (!topic)
            goto fail;
        PyList_SET_ITEM(topics, t, topic);
        for (Py_ssize_t i = 0; i < n; i++) {
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
            PyObject *partition = MAKE(PRODUCE_PARTITION, partition_fields);
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

static PyObject *parse_produce_body(Reader *r, PyObject *frame, int version)
{
    int flexible = version >= 9;
    PyObject *transactional_id = NULL, *view = NULL;
    int64_t txn_len = read_length(r, flexible, 2);
    if (r->bad || (txn_len >= 0 && !(transactional_id = read_text(r, txn_len, NULL))))
        return NULL;
    int64_t acks = read_be(r, 2), timeout_ms = read_be(r, 4);
    PyObject *topics = NULL;
    if (!r->bad && (view = PyMemoryView_FromObject(frame)))
        topics = parse_topics(r, view, flexible);
    Py_XDECREF(view);
    if (topics && flexible)
        no_tags(r);
    if (!topics || r->bad) {
        Py_XDECREF(topics);
        Py_XDECREF(transactional_id);
        return NULL;
    }
    PyObject *body_fields[] = {transactional_id ? transactional_id : Py_NewRef(Py_None),
                               PyLong_FromLong((long)acks), PyLong_FromLong((long)timeout_ms), topics};
    return MAKE(PRODUCE, body_fields);
}

/* --- Fetch ---------------------------------------------------------------------------------- */

static PyObject *parse_fetch_partition(Reader *r, int version)
{
    /* One statement per field: the reads must run in the request's order (the expressions of
     * an initializer list are not sequenced). */
    PyObject *fields[8];
    fields[0] = read_int(r, 4);                                            /* partition */
    fields[1] = version >= 9 ? read_int(r, 4) : PyLong_FromLong(-1);       /* current_leader_epoch */
    fields[2] = read_int(r, 8);                                            /* fetch_offset */
    fields[3] = version >= 12 ? read_int(r, 4) : PyLong_FromLong(-1);      /* last_fetched_epoch */
    fields[4] = version >= 5 ? read_int(r, 8) : PyLong_FromLong(-1);       /* log_start_offset */
    fields[5] = read_int(r, 4);                                            /* partition_max_bytes */
    fields[6] = Py_NewRef(Py_None);                                        /* replica_directory_id (tag 0) */
    fields[7] = PyLong_FromLongLong(INT64_MAX);                            /* high_watermark (tag 1) */
    if (version >= 12 && !r->bad) {
        Tags tags;
        int64_t tag;
        start_tags(r, &tags);
        while ((tag = next_tag(r, &tags)) >= 0) {
            int slot = tag == 0 && version >= 17 ? 6 : tag == 1 && version >= 18 ? 7 : -1;
            if (slot < 0) {
                r->bad = 1;
                break;
            }
            Py_XSETREF(fields[slot], slot == 6 ? read_uuid(r) : read_int(r, 8));
            end_tag(r, &tags);
        }
    }
    if (r->bad)
        for (int i = 0; i < 8; i++)
            Py_CLEAR(fields[i]);
    return MAKE(FETCH_PARTITION, fields);
}

/* A topic of the fetch (partitions) or of the forgotten ones (partition indexes). */
static PyObject *parse_fetch_topic(Reader *r, int version, int forgotten)
{
    int flexible = version >= 12;
    PyObject *name = NULL, *topic_id = NULL, *partitions = NULL;
    if (version >= 13)
        topic_id = read_uuid(r);
    else
        name = read_string(r, flexible);
    Py_ssize_t n = (name || topic_id) ? read_count(r, flexible) : -1;
    if (n >= 0)
        partitions = PyList_New(n);
    for (Py_ssize_t i = 0; partitions && i < n; i++) {
        PyObject *p = forgotten ? read_int(r, 4) : parse_fetch_partition(r, version);
        if (!p) {
            Py_CLEAR(partitions);
            break;
        }
        PyList_SET_ITEM(partitions, i, p);
    }
    if (partitions && flexible)
        no_tags(r);
    PyObject *fields[] = {name ? name : (topic_id ? PyUnicode_FromString("") : NULL),
                          topic_id ? topic_id : Py_NewRef(Py_None), partitions};
    if (!name && !topic_id)
        Py_CLEAR(fields[1]);
    if (r->bad)
        for (int i = 0; i < 3; i++)
            Py_CLEAR(fields[i]);
    return MAKE(forgotten ? FORGOTTEN_TOPIC : FETCH_TOPIC, fields);
}

static PyObject *parse_fetch_topics(Reader *r, int version, int forgotten)
{
    Py_ssize_t n = read_count(r, version >= 12);
    PyObject *topics = n >= 0 ? PyList_New(n) : NULL;
    for (Py_ssize_t i = 0; topics && i < n; i++) {
        PyObject *t = parse_fetch_topic(r, version, forgotten);
        if (!t) {
            Py_CLEAR(topics);
            break;
        }
        PyList_SET_ITEM(topics, i, t);
    }
    return topics;
}

static PyObject *parse_fetch_body(Reader *r, int version)
{
    int flexible = version >= 12;
    PyObject *fields[12]; /* one statement per field, in the request's order */
    fields[0] = Py_NewRef(Py_None);                                        /* cluster_id (tag 0) */
    fields[1] = version < 15 ? read_int(r, 4) : PyLong_FromLong(-1);       /* replica_id */
    fields[2] = Py_NewRef(Py_None);                                        /* replica_state (tag 1) */
    fields[3] = read_int(r, 4);                                            /* max_wait_ms */
    fields[4] = read_int(r, 4);                                            /* min_bytes */
    fields[5] = read_int(r, 4);                                            /* max_bytes */
    fields[6] = read_int(r, 1);                                            /* isolation_level */
    fields[7] = version >= 7 ? read_int(r, 4) : PyLong_FromLong(0);        /* session_id */
    fields[8] = version >= 7 ? read_int(r, 4) : PyLong_FromLong(-1);       /* session_epoch */
    fields[9] = r->bad ? NULL : parse_fetch_topics(r, version, 0);         /* topics */
    fields[10] = r->bad ? NULL : version >= 7 ? parse_fetch_topics(r, version, 1) : PyList_New(0);
    fields[11] = r->bad ? NULL : version >= 11 ? read_string(r, flexible) : PyUnicode_FromString("");
    if (flexible && !r->bad) {
        Tags tags;
        int64_t tag;
        start_tags(r, &tags);
        while ((tag = next_tag(r, &tags)) >= 0) {
            if (tag == 0) {
                int64_t n = read_length(r, 1, 2);
                Py_XSETREF(fields[0], n < 0 ? (r->bad ? NULL : Py_NewRef(Py_None)) : read_text(r, n, NULL));
            } else if (tag == 1 && version >= 15) {
                PyObject *state[2];
                state[0] = read_int(r, 4);
                state[1] = read_int(r, 8);
                no_tags(r);
                if (r->bad) {
                    Py_CLEAR(state[0]);
                    Py_CLEAR(state[1]);
                }
                Py_XSETREF(fields[2], MAKE(REPLICA_STATE, state));
            } else {
                r->bad = 1;
            }
            if (!r->bad)
                end_tag(r, &tags);
        }
    }
    if (r->bad)
        for (int i = 0; i < 12; i++)
            Py_CLEAR(fields[i]);
    return MAKE(FETCH, fields);
}

/* --- the entry point ------------------------------------------------------------------------- */

static PyObject *parse_request(PyObject *self, PyObject *frame)
{
    Py_buffer buf;
    if (PyObject_GetBuffer(frame, &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    Reader r = {buf.buf, 0, buf.len, 0};
    PyObject *result = NULL, *client_id = NULL, *body = NULL;
    int16_t key = (int16_t)read_be(&r, 2), version = (int16_t)read_be(&r, 2);
    int32_t correlation_id;
    int flexible;
    if (!r.bad && key == 0 && version >= 3 && version <= 12)
        flexible = version >= 9;
    else if (!r.bad && key == 1 && version >= 4 && version <= 18)
        flexible = version >= 12;
    else
        goto off_path;
    if (read_header(&r, flexible, &correlation_id, &client_id) < 0)
        goto off_path;
    body = key == 0 ? parse_produce_body(&r, frame, version) : parse_fetch_body(&r, version);
    if (!body || r.bad || r.pos != r.end)
        goto off_path;
    result = make_request(key, version, flexible, correlation_id, client_id, body, buf.len);
    client_id = body = NULL;
    goto done;
off_path:
    if (!PyErr_Occurred())
        result = Py_NewRef(Py_None);
done:
    Py_XDECREF(client_id);
    Py_XDECREF(body);
    PyBuffer_Release(&buf);
    return result;
}

PyMethodDef request_methods[] = {
    {"parse_request", parse_request, METH_O,
     "parse_request(frame) -> Request | None (None: not a usual Produce or Fetch; parse it in Python)"},
    {"request_types", request_types, METH_VARARGS, "request_types({class name: class}, uuid_of)"},
    {NULL, NULL, 0, NULL},
};
