#include <zlib.h>

// deflateInit2/inflateInit2 are macros passing the version and struct size.
static inline int czlib_deflate_init_gzip(z_stream *stream, int level) {
    return deflateInit2(stream, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
}
static inline int czlib_inflate_init_gzip(z_stream *stream) { return inflateInit2(stream, 15 + 16); }
