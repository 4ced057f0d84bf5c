/* Slotted dataclasses made from C: an instance is allocated and its slots are set directly,
 * without its __init__ (run in Python, that cost as much as the parsing that fills it). Each
 * class is named once, with its fields in order; its slots' places are read then. */
#ifndef STROM_SLOTS_H
#define STROM_SLOTS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define MAX_SLOTS 16

typedef struct {
    PyTypeObject *type; /* NULL until named */
    int count;
    Py_ssize_t offsets[MAX_SLOTS];
} SlotClass;

/* Name `type` as the class `c` makes: each of `fields` (NULL-ended) must be one of its
 * object slots. Returns 0, or -1 with TypeError. */
static inline int slot_class_init(SlotClass *c, PyObject *type, const char *const *fields)
{
    if (!PyType_Check(type))
        return PyErr_SetString(PyExc_TypeError, "a class is needed"), -1;
    int n = 0;
    Py_ssize_t offsets[MAX_SLOTS];
    for (; fields[n]; n++) {
        PyObject *d = n < MAX_SLOTS ? PyObject_GetAttrString(type, fields[n]) : NULL;
        if (!d)
            return -1;
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type)
                 && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
        if (ok)
            offsets[n] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", ((PyTypeObject *)type)->tp_name, fields[n]);
            return -1;
        }
    }
    Py_INCREF(type);
    Py_XSETREF(c->type, (PyTypeObject *)type);
    c->count = n;
    memcpy(c->offsets, offsets, sizeof(offsets));
    return 0;
}

/* A new instance with its slots set from `values`, in the fields' order (references stolen;
 * a NULL value is a failure already raised), or NULL. */
static inline PyObject *slot_class_make(const SlotClass *c, PyObject **values, int n)
{
    int complete = 1;
    for (int i = 0; i < n; i++)
        complete &= values[i] != NULL;
    PyObject *obj = NULL;
    if (!c->type || c->count != n)
        PyErr_SetString(PyExc_RuntimeError, "class not named to the compiled helper");
    else if (complete)
        obj = c->type->tp_alloc(c->type, 0);
    for (int i = 0; i < n; i++) {
        if (obj)
            *(PyObject **)((char *)obj + c->offsets[i]) = values[i];
        else
            Py_XDECREF(values[i]);
    }
    return obj;
}

#endif
