/* CRC32C (Castagnoli) with the CPU's CRC32 instruction, over any buffer in place.
 *
 * extend(crc, data) -> int: the CRC32C of ``data`` (any C-contiguous object with the buffer
 * protocol: bytes, bytearray, memoryview, mmap, numpy), continuing ``crc``, as
 * google_crc32c.extend computes it. Nothing is copied; the GIL is released for large buffers.
 *
 * One CRC32 instruction has a latency of 3 cycles and a throughput of 1 a cycle, so the loop
 * runs three independent streams over three adjacent blocks and joins them: the CRC of A then B
 * is CRC(A) shifted over len(B) zero bytes, XOR CRC(B) from a zero state. The shift is a
 * multiplication by x^(8 len(B)) modulo the polynomial, read from a table of 4 x 256 entries per
 * block length, built once at import.
 *
 * Built only for x86-64 (SSE4.2); importing it on a CPU without SSE4.2, or where it was not
 * built, fails with ImportError and data_service.crc32c falls back to google-crc32c.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HAVE_HW 1
#else
#define HAVE_HW 0
#endif

#define POLY 0x82f63b78u   /* CRC32C, reflected */
#define LONG_BLOCK 8192    /* bytes per stream in the large loop */
#define SHORT_BLOCK 256    /* bytes per stream in the small one */
#define NOGIL_BYTES 65536  /* below this, releasing the GIL costs more than it frees */

static uint32_t shift_long[4][256], shift_short[4][256];

/* a * b modulo POLY, both polynomials in the reflected representation (a != 0). */
static uint32_t multmodp(uint32_t a, uint32_t b) {
    uint32_t m = (uint32_t)1 << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0)
                break;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ POLY : b >> 1;
    }
    return p;
}

/* x^(8 n) modulo POLY: the operator that moves a CRC state over n zero bytes. */
static uint32_t xpow8n(size_t n) {
    uint32_t p = (uint32_t)1 << 31;   /* x^0 */
    uint32_t sq = (uint32_t)1 << 30;  /* x^1, squared as n's bits are read */
    size_t bits = n * 8;
    while (bits) {
        if (bits & 1)
            p = multmodp(sq, p);
        sq = multmodp(sq, sq);
        bits >>= 1;
    }
    return p;
}

static void fill_shift(uint32_t table[4][256], size_t n) {
    uint32_t op = xpow8n(n);
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++)
            table[k][b] = multmodp(op, b << (8 * k));
}

static inline uint32_t shift(uint32_t table[4][256], uint32_t crc) {
    return table[0][crc & 0xff] ^ table[1][(crc >> 8) & 0xff] ^ table[2][(crc >> 16) & 0xff] ^ table[3][crc >> 24];
}

#if HAVE_HW
static inline uint64_t load64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);  /* one unaligned load; no aliasing assumptions */
    return v;
}

/* Three streams of ``block`` bytes each, joined; ``*len`` >= 3 * block. */
#define THREE_WAY(block, table)                                                        \
    while (len >= 3 * (block)) {                                                       \
        uint64_t c1 = 0, c2 = 0;                                                       \
        const unsigned char *end = buf + (block);                                      \
        do {                                                                           \
            c0 = _mm_crc32_u64(c0, load64(buf));                                       \
            c1 = _mm_crc32_u64(c1, load64(buf + (block)));                             \
            c2 = _mm_crc32_u64(c2, load64(buf + 2 * (block)));                         \
            buf += 8;                                                                  \
        } while (buf < end);                                                           \
        c0 = shift(table, (uint32_t)c0) ^ (uint32_t)c1;                                \
        c0 = shift(table, (uint32_t)c0) ^ (uint32_t)c2;                                \
        buf += 2 * (block);                                                            \
        len -= 3 * (size_t)(block);                                                    \
    }

__attribute__((target("sse4.2")))
static uint32_t crc32c_hw(uint32_t crc, const unsigned char *buf, size_t len) {
    uint64_t c0 = crc ^ 0xffffffffu;
    while (len && ((uintptr_t)buf & 7)) {
        c0 = _mm_crc32_u8((uint32_t)c0, *buf++);
        len--;
    }
    THREE_WAY(LONG_BLOCK, shift_long)
    THREE_WAY(SHORT_BLOCK, shift_short)
    while (len >= 8) {
        c0 = _mm_crc32_u64(c0, load64(buf));
        buf += 8;
        len -= 8;
    }
    while (len) {
        c0 = _mm_crc32_u8((uint32_t)c0, *buf++);
        len--;
    }
    return (uint32_t)c0 ^ 0xffffffffu;
}
#endif

static PyObject *extend(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *start;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "Oy*:extend", &start, &view))
        return NULL;
    unsigned long crc = PyLong_Check(start) ? PyLong_AsUnsignedLong(start) : (unsigned long)-1;
    if (crc > 0xffffffffUL) {  /* also negative, too large or not an int */
        PyErr_Clear();
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "crc=%R is not a 32-bit CRC: pass 0, or the value an earlier call returned",
                            start);
    }
    uint32_t out;
#if HAVE_HW
    if (view.len >= NOGIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        out = crc32c_hw((uint32_t)crc, view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        out = crc32c_hw((uint32_t)crc, view.buf, (size_t)view.len);
    }
#else
    out = 0;
#endif
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(out);
}

static PyMethodDef methods[] = {
    {"extend", extend, METH_VARARGS,
     "extend(crc, data) -> int: the CRC32C of data (any contiguous buffer, read in place), continuing crc."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_hw", "CRC32C with the CPU's CRC32 instruction.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__hw(void) {
#if HAVE_HW
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("sse4.2")) {
        PyErr_SetString(PyExc_ImportError, "this CPU has no SSE4.2 CRC32 instruction");
        return NULL;
    }
    fill_shift(shift_long, LONG_BLOCK);
    fill_shift(shift_short, SHORT_BLOCK);
    return PyModule_Create(&module);
#else
    PyErr_SetString(PyExc_ImportError, "built without a CRC32C instruction (x86-64 SSE4.2 only)");
    return NULL;
#endif
}
