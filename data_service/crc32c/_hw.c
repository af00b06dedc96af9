/* CRC32C (Castagnoli) with the CPU's CRC32 instruction, over any buffer in place.
 *
 * extend(crc, data) -> int: the CRC32C of ``data`` (any C-contiguous object with the buffer
 * protocol: bytes, bytearray, memoryview, mmap, numpy), continuing ``crc``, as
 * google_crc32c.extend computes it. Nothing is copied; the GIL is released for large buffers.
 * copy_extend(crc, dst, src) -> int: copies ``src`` into ``dst`` (a writable buffer of the same
 * size, not overlapping it) and returns the CRC32C of those bytes, continuing ``crc``: each word
 * is summed on its way through a register, so a data worker sums its batch for the price of
 * copying it.
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

#if HAVE_HW
/* Three streams, as crc32c_hw, each 8-byte word summed from the register it was loaded into on its
 * way to ``dst``: the bytes are read from memory once, for the copy. */
__attribute__((target("sse4.2")))
static uint32_t copy_crc32c_hw(uint32_t crc, unsigned char *dst, const unsigned char *src, size_t len) {
    uint64_t c0 = crc ^ 0xffffffffu;
    while (len >= 3 * LONG_BLOCK) {
        uint64_t c1 = 0, c2 = 0;
        for (size_t i = 0; i < LONG_BLOCK; i += 8) {
            uint64_t a = load64(src + i), b = load64(src + LONG_BLOCK + i), c = load64(src + 2 * LONG_BLOCK + i);
            memcpy(dst + i, &a, 8);
            memcpy(dst + LONG_BLOCK + i, &b, 8);
            memcpy(dst + 2 * LONG_BLOCK + i, &c, 8);
            c0 = _mm_crc32_u64(c0, a);
            c1 = _mm_crc32_u64(c1, b);
            c2 = _mm_crc32_u64(c2, c);
        }
        c0 = shift(shift_long, (uint32_t)c0) ^ (uint32_t)c1;
        c0 = shift(shift_long, (uint32_t)c0) ^ (uint32_t)c2;
        src += 3 * LONG_BLOCK;
        dst += 3 * LONG_BLOCK;
        len -= 3 * LONG_BLOCK;
    }
    memcpy(dst, src, len);  /* the last < 24 KiB: copied, then summed from the cache */
    return crc32c_hw((uint32_t)c0 ^ 0xffffffffu, dst, len);
}
#endif

/* ``start`` as a 32-bit CRC; sets ValueError and returns 0 with *ok = 0 when it is none. */
static uint32_t parse_crc(PyObject *start, int *ok) {
    unsigned long crc = PyLong_Check(start) ? PyLong_AsUnsignedLong(start) : (unsigned long)-1;
    *ok = crc <= 0xffffffffUL;  /* not negative, too large or another type */
    if (!*ok) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "crc=%R is not a 32-bit CRC: pass 0, or the value an earlier call returned", start);
    }
    return (uint32_t)crc;
}

static PyObject *copy_extend(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *start;
    Py_buffer dst, src;
    int ok;
    if (!PyArg_ParseTuple(args, "Ow*y*:copy_extend", &start, &dst, &src))
        return NULL;
    uint32_t crc = parse_crc(start, &ok);
    if (ok && dst.len != src.len) {
        ok = 0;
        PyErr_Format(PyExc_ValueError, "copy_extend: dst holds %zd bytes, src %zd: pass a dst of src's size", dst.len,
                     src.len);
    }
    uint32_t out = 0;
#if HAVE_HW
    if (ok) {
        if (src.len >= NOGIL_BYTES) {
            Py_BEGIN_ALLOW_THREADS
            out = copy_crc32c_hw(crc, dst.buf, src.buf, (size_t)src.len);
            Py_END_ALLOW_THREADS
        } else {
            out = copy_crc32c_hw(crc, dst.buf, src.buf, (size_t)src.len);
        }
    }
#else
    (void)crc;
#endif
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    return ok ? PyLong_FromUnsignedLong(out) : NULL;
}

static PyObject *extend(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *start;
    Py_buffer view;
    int ok;
    if (!PyArg_ParseTuple(args, "Oy*:extend", &start, &view))
        return NULL;
    uint32_t crc = parse_crc(start, &ok);
    if (!ok) {
        PyBuffer_Release(&view);
        return NULL;
    }
    uint32_t out;
#if HAVE_HW
    if (view.len >= NOGIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        out = crc32c_hw(crc, view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        out = crc32c_hw(crc, view.buf, (size_t)view.len);
    }
#else
    out = 0;
    (void)crc;
#endif
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(out);
}

static PyMethodDef methods[] = {
    {"extend", extend, METH_VARARGS,
     "extend(crc, data) -> int: the CRC32C of data (any contiguous buffer, read in place), continuing crc."},
    {"copy_extend", copy_extend, METH_VARARGS,
     "copy_extend(crc, dst, src) -> int: copy src into dst (writable, the same size); the CRC32C of the bytes, "
     "continuing crc."},
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
