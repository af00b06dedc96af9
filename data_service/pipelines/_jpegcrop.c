/* Decode only a region of a JPEG, optionally at a reduced DCT scale (libjpeg-turbo).
 *
 * The calls tf.data's decode_and_crop_jpeg and DALI's CPU image_random_crop make:
 * jpeg_crop_scanline() leaves out the iMCU columns left and right of the region,
 * jpeg_skip_scanlines() entropy-decodes the rows above it without IDCT, colour conversion or
 * upsampling, and the rows below are never read. scale_num/8 (1..8) picks libjpeg's scaled IDCT.
 *
 * info(data) -> (width, height, components, jpeg_color_space, progressive, precision, arith)
 * decode_crop(data, x, y, w, h, scale_num) -> (bytearray, rows, cols) or None
 *     The box [x, x + w) x [y, y + h) of the full-size image, decoded at scale_num / 8: the
 *     output covers [floor(x * s), ceil((x + w) * s)) and likewise for rows, s = scale_num / 8,
 *     as interleaved RGB (rows x cols x 3, uint8). None when libjpeg issued a warning (corrupt
 *     data): the caller then decodes the whole image its usual way, so corrupt files behave
 *     exactly as without this module. ValueError on an error.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>

#define FAST_IDCT 1         /* flags: libjpeg's JDCT_IFAST (tf.data's default) */
#define PLAIN_UPSAMPLING 2  /* flags: chroma replicated, not interpolated (do_fancy_upsampling off) */
#define BATCH_ROWS 16       /* rows asked of jpeg_read_scanlines per call (an iMCU row at 4:2:0) */
#define CONTEXT 4  /* pixels decoded beyond each side of the box (see decode_crop) */

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    int warnings;
    char message[JMSG_LENGTH_MAX];
} error_mgr;

static void on_error(j_common_ptr cinfo) {
    error_mgr *err = (error_mgr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0) ((error_mgr *)cinfo->err)->warnings++;  /* a warning: corrupt data */
}

static int open_header(struct jpeg_decompress_struct *cinfo, error_mgr *err, const Py_buffer *view) {
    cinfo->err = jpeg_std_error(&err->pub);
    err->pub.error_exit = on_error;
    err->pub.emit_message = on_message;
    err->warnings = 0;
    err->message[0] = 0;
    jpeg_create_decompress(cinfo);
    jpeg_mem_src(cinfo, (const unsigned char *)view->buf, (unsigned long)view->len);
    jpeg_read_header(cinfo, TRUE);
    return 0;
}

static PyObject *info(PyObject *self, PyObject *args) {
    Py_buffer view;
    struct jpeg_decompress_struct cinfo;
    error_mgr err;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*", &view)) return NULL;
    memset(&cinfo, 0, sizeof(cinfo));
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "%s", err.message);
        return NULL;
    }
    open_header(&cinfo, &err, &view);
    result = Py_BuildValue("(IIiiiii)", cinfo.image_width, cinfo.image_height, cinfo.num_components,
                           (int)cinfo.jpeg_color_space, (int)cinfo.progressive_mode, cinfo.data_precision,
                           (int)cinfo.arith_code);
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *decode_crop(PyObject *self, PyObject *args) {
    Py_buffer view;
    int x, y, w, h, scale, flags = 0;
    struct jpeg_decompress_struct cinfo;
    error_mgr err;
    PyObject *volatile out = NULL;  /* read after a longjmp */
    JSAMPARRAY row;
    if (!PyArg_ParseTuple(args, "y*iiiii|i", &view, &x, &y, &w, &h, &scale, &flags)) return NULL;
    if (scale < 1 || scale > 8 || x < 0 || y < 0 || w < 1 || h < 1) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "bad crop (%d, %d, %d, %d) or scale %d/8", x, y, w, h, scale);
        return NULL;
    }
    memset(&cinfo, 0, sizeof(cinfo));
    if (setjmp(err.jump)) {
        Py_XDECREF(out);
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "%s", err.message);
        return NULL;
    }
    open_header(&cinfo, &err, &view);
    if ((unsigned)(x + w) > cinfo.image_width || (unsigned)(y + h) > cinfo.image_height) {
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "crop (%d, %d, %d, %d) outside the %ux%u image", x, y, w, h,
                     cinfo.image_width, cinfo.image_height);
        return NULL;
    }
    cinfo.out_color_space = JCS_RGB;
    cinfo.scale_num = (unsigned)scale;
    cinfo.scale_denom = 8;
    if (flags & FAST_IDCT) cinfo.dct_method = JDCT_IFAST;
    if (flags & PLAIN_UPSAMPLING) cinfo.do_fancy_upsampling = FALSE;
    jpeg_start_decompress(&cinfo);
    {
        /* the box in output (scaled) pixels */
        JDIMENSION x0 = (JDIMENSION)(((long long)x * scale) / 8);
        JDIMENSION x1 = (JDIMENSION)(((long long)(x + w) * scale + 7) / 8);
        JDIMENSION y0 = (JDIMENSION)(((long long)y * scale) / 8);
        JDIMENSION y1 = (JDIMENSION)(((long long)(y + h) * scale + 7) / 8);
        JDIMENSION xoff, cw, cols, rows, r;
        unsigned char *dst;
        if (x1 > cinfo.output_width) x1 = cinfo.output_width;
        if (y1 > cinfo.output_height) y1 = cinfo.output_height;
        if (x1 <= x0) x1 = x0 + 1;
        if (y1 <= y0) y1 = y0 + 1;
        cols = x1 - x0;
        rows = y1 - y0;
        /* Decode 4 more pixels each side where the image has them (a chroma sample at up to 4x
         * horizontal subsampling): the upsampler treats the edges
         * of the decoded columns as the image's edges, so the box's own edge pixels come out as in
         * a whole-image decode only when their neighbours are decoded too. */
        xoff = x0 > CONTEXT ? x0 - CONTEXT : 0;
        cw = (x1 + CONTEXT < cinfo.output_width ? x1 + CONTEXT : cinfo.output_width) - xoff;
        if (cw < cinfo.output_width) jpeg_crop_scanline(&cinfo, &xoff, &cw);  /* widens to iMCU edges */
        out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)rows * cols * 3);
        if (out == NULL) {
            jpeg_destroy_decompress(&cinfo);
            PyBuffer_Release(&view);
            return NULL;
        }
        dst = (unsigned char *)PyByteArray_AS_STRING(out);
        /* as many rows per call as the decoder makes at once (an iMCU row), copied out of it */
        row = (*cinfo.mem->alloc_sarray)((j_common_ptr)&cinfo, JPOOL_IMAGE, cinfo.output_width * 3, BATCH_ROWS);
        if (y0 > 0) jpeg_skip_scanlines(&cinfo, y0);
        for (r = 0; r < rows;) {
            JDIMENSION want = rows - r < BATCH_ROWS ? rows - r : BATCH_ROWS, got, k;
            got = jpeg_read_scanlines(&cinfo, row, want);
            if (got == 0) break;  /* a short image: the rest stays zero (the warning sends it to the whole decoder) */
            for (k = 0; k < got; k++, r++)
                memcpy(dst + (size_t)r * cols * 3, row[k] + (size_t)(x0 - xoff) * 3, (size_t)cols * 3);
        }
        jpeg_abort_decompress(&cinfo);  /* the rows below are never read */
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&view);
        if (err.warnings) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        return Py_BuildValue("(NII)", out, rows, cols);
    }
}

/* dst[i] = src[n - 1 - i] */
static void reverse_row(const unsigned char *src, unsigned char *dst, Py_ssize_t n, Py_ssize_t from) {
    Py_ssize_t i;
    for (i = from; i < n; i++) dst[i] = src[n - 1 - i];
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_SIMD_MIRROR 1
/* 16 bytes per step with an SSSE3 byte shuffle; the rest scalar. */
__attribute__((target("ssse3")))
static void reverse_row_ssse3(const unsigned char *src, unsigned char *dst, Py_ssize_t n) {
    const __m128i rev = _mm_setr_epi8(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(src + n - 16 - i)), rev));
    reverse_row(src, dst, n, i);
}
#endif

static int simd_mirror = 0;  /* set at import when the CPU has SSSE3 */

/* copy_rows(src, rows, cols, flip, dst): rows x cols bytes from src into dst, each row mirrored
 * when flip: a horizontal flip of a planar image written straight into the batch. */
static PyObject *copy_rows(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    Py_ssize_t rows, cols, y;
    int flip;
    if (!PyArg_ParseTuple(args, "y*nnpw*", &src, &rows, &cols, &flip, &dst)) return NULL;
    if (rows < 0 || cols < 0 || src.len < rows * cols || dst.len < rows * cols) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        PyErr_SetString(PyExc_ValueError, "copy_rows: buffers smaller than rows x cols");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    if (!flip) {
        memcpy(dst.buf, src.buf, (size_t)(rows * cols));
    } else {
        for (y = 0; y < rows; y++) {
            const unsigned char *in = (const unsigned char *)src.buf + y * cols;
            unsigned char *out = (unsigned char *)dst.buf + y * cols;
#ifdef HAVE_SIMD_MIRROR
            if (simd_mirror) {
                reverse_row_ssse3(in, out, cols);
                continue;
            }
#endif
            reverse_row(in, out, cols, 0);
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"copy_rows", copy_rows, METH_VARARGS, "(src, rows, cols, flip, dst): copy rows, each mirrored if flip"},
    {"info", info, METH_VARARGS, "(width, height, components, jpeg_color_space, progressive, precision, arith)"},
    {"decode_crop", decode_crop, METH_VARARGS, "(data, x, y, w, h, scale_num) -> (bytearray RGB, rows, cols) or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpegcrop", NULL, -1, methods};

PyMODINIT_FUNC PyInit__jpegcrop(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
#ifdef HAVE_SIMD_MIRROR
    __builtin_cpu_init();
    simd_mirror = __builtin_cpu_supports("ssse3") && getenv("HETERO_NO_SIMD") == NULL;
#endif
    PyModule_AddIntConstant(m, "SIMD_MIRROR", simd_mirror);
    PyModule_AddIntConstant(m, "JCS_GRAYSCALE", JCS_GRAYSCALE);
    PyModule_AddIntConstant(m, "JCS_YCbCr", JCS_YCbCr);
    PyModule_AddIntConstant(m, "JCS_RGB", JCS_RGB);
    PyModule_AddIntConstant(m, "FAST_IDCT", FAST_IDCT);
    PyModule_AddIntConstant(m, "PLAIN_UPSAMPLING", PLAIN_UPSAMPLING);
    PyModule_AddIntConstant(m, "LIBJPEG_VERSION", JPEG_LIB_VERSION);
    return m;
}
