/*
 * The wire format as the compiled data paths see it (host/switch/_engine.c,
 * host/transport/_client.c). No offset is written here: each extension receives the
 * field offsets and widths of ina_fabric.protocol.fields (the one definition) as a dict
 * (``layout()`` in host/switch/fast.py) and ina_layout_from_dict checks that every
 * width is the one these readers use.
 */
#ifndef INA_WIRE_H
#define INA_WIRE_H

#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    int header, version, type, flags, exponent, job, worker, count, seq, nelem,
        width, bitmap, session;
    int v_version, t_data, t_result, t_error, f_partial, f_overflow, f_retransmit, f_last,
        f_forwarded, f_congested,
        no_exponent, group_worker, nonfinite, max_job_workers;
} InaLayout;

static inline uint32_t ina_rd16(const uint8_t *p) { return ((uint32_t)p[0] << 8) | p[1]; }
static inline uint32_t ina_rd32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t ina_rd64(const uint8_t *p) {
    return ((uint64_t)ina_rd32(p) << 32) | ina_rd32(p + 4);
}
static inline void ina_wr16(uint8_t *p, uint32_t v) { p[0] = v >> 8; p[1] = v; }
static inline void ina_wr32(uint8_t *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}
static inline void ina_wr64(uint8_t *p, uint64_t v) {
    ina_wr32(p, (uint32_t)(v >> 32));
    ina_wr32(p + 4, (uint32_t)v);
}

/* one big-endian int32 element of a datagram, in and out (unaligned; the element loops
 * of both extensions are written with these, and still vectorize) */
static inline int32_t ina_be32(const uint8_t *p) {
    uint32_t u;
    memcpy(&u, p, 4);
    return (int32_t)__builtin_bswap32(u);
}
static inline void ina_put_be32(uint8_t *p, uint32_t v) {
    v = __builtin_bswap32(v);
    memcpy(p, &v, 4);
}

static int ina_get_int(PyObject *d, const char *name, int *out) {
    PyObject *v = PyDict_GetItemString(d, name);   /* borrowed */
    if (!v) {
        PyErr_Format(PyExc_KeyError, "wire layout lacks %s", name);
        return -1;
    }
    long x = PyLong_AsLong(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    *out = (int)x;
    return 0;
}

/* layout: field offsets ("<name>") and widths in bytes ("<name>_bytes"), plus the
 * constants the data paths need; -1 with an exception set when anything differs */
static int ina_layout_from_dict(PyObject *d, InaLayout *L) {
    struct { const char *name; int *off; int width; } f[] = {
        {"version", &L->version, 1}, {"type", &L->type, 1}, {"flags", &L->flags, 1},
        {"exponent", &L->exponent, 1}, {"job", &L->job, 2}, {"worker", &L->worker, 1},
        {"count", &L->count, 2}, {"seq", &L->seq, 4}, {"nelem", &L->nelem, 2},
        {"width", &L->width, 1}, {"bitmap", &L->bitmap, 4},
        {"session", &L->session, 8},
    };
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "layout must be a dict");
        return -1;
    }
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        char key[64];
        int width;
        snprintf(key, sizeof key, "%s_bytes", f[i].name);
        if (ina_get_int(d, f[i].name, f[i].off) < 0 || ina_get_int(d, key, &width) < 0)
            return -1;
        if (width != f[i].width) {
            PyErr_Format(PyExc_ValueError, "the wire format changed: field %s is %d bytes, "
                         "the compiled data path reads %d (update ina_fabric/protocol/ina_wire.h "
                         "and its users)", f[i].name, width, f[i].width);
            return -1;
        }
    }
    if (ina_get_int(d, "header", &L->header) < 0 || ina_get_int(d, "VERSION", &L->v_version) < 0 ||
        ina_get_int(d, "DATA", &L->t_data) < 0 || ina_get_int(d, "RESULT", &L->t_result) < 0 ||
        ina_get_int(d, "ERROR", &L->t_error) < 0 ||
        ina_get_int(d, "PARTIAL", &L->f_partial) < 0 ||
        ina_get_int(d, "OVERFLOW", &L->f_overflow) < 0 ||
        ina_get_int(d, "RETRANSMIT", &L->f_retransmit) < 0 ||
        ina_get_int(d, "LAST", &L->f_last) < 0 ||
        ina_get_int(d, "FORWARDED", &L->f_forwarded) < 0 ||
        ina_get_int(d, "CONGESTED", &L->f_congested) < 0 ||
        ina_get_int(d, "NO_EXPONENT", &L->no_exponent) < 0 ||
        ina_get_int(d, "GROUP_WORKER", &L->group_worker) < 0 ||
        ina_get_int(d, "NONFINITE", &L->nonfinite) < 0 ||
        ina_get_int(d, "MAX_JOB_WORKERS", &L->max_job_workers) < 0)
        return -1;
    if (L->header % 4) {
        PyErr_SetString(PyExc_ValueError, "header length must be a multiple of 4");
        return -1;
    }
    return 0;
}

#endif
