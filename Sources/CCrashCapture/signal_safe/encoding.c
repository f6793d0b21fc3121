// The crash path's lowest layer: a bounded text buffer and JSON escaping without libc's
// formatting, CRC-32, the framing of records, writes that finish, clocks, a module's build id.
// The rules of crash_path.c apply here: this runs after a fatal signal (signal-safety(7)),
// allocates nothing, takes no lock, and calls nothing above it in the crash path.
#include <errno.h>
#include <link.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cc_internal.h"
#include "crash_report.h"

// MARK: - Formatting without libc

void cc_buf_append(cc_buf *b, const char *s, size_t n) {
    if (b->overflow) return;
    if (n > b->cap - b->len) {
        b->overflow = true;
        return;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
}

void cc_buf_append_str(cc_buf *b, const char *s) { cc_buf_append(b, s, strlen(s)); }

void cc_buf_append_char(cc_buf *b, char c) { cc_buf_append(b, &c, 1); }

void cc_buf_append_u64(cc_buf *b, uint64_t v) {
    char digits[20];
    size_t n = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    while (n > 0) cc_buf_append_char(b, digits[--n]);
}

void cc_buf_append_i64(cc_buf *b, int64_t v) {
    if (v < 0) {
        cc_buf_append_char(b, '-');
        cc_buf_append_u64(b, (uint64_t)0 - (uint64_t)v);
    } else {
        cc_buf_append_u64(b, (uint64_t)v);
    }
}

// `thousandths` as a decimal with three places: 1234 as 1.234 (ms from µs, s from ms).
void cc_buf_append_thousandths(cc_buf *b, int64_t thousandths) {
    if (thousandths < 0) thousandths = 0;
    cc_buf_append_i64(b, thousandths / 1000);
    char fraction[4] = {'.', (char)('0' + (thousandths / 100) % 10), (char)('0' + (thousandths / 10) % 10),
                        (char)('0' + thousandths % 10)};
    cc_buf_append(b, fraction, 4);
}

void cc_buf_append_hex(cc_buf *b, uint64_t v) {
    static const char hex[] = "0123456789abcdef";
    char digits[16];
    size_t n = 0;
    do {
        digits[n++] = hex[v & 0xf];
        v >>= 4;
    } while (v != 0);
    cc_buf_append(b, "0x", 2);
    while (n > 0) cc_buf_append_char(b, digits[--n]);
}

void cc_buf_append_quoted_hex(cc_buf *b, uint64_t v) {
    cc_buf_append_char(b, '"');
    cc_buf_append_hex(b, v);
    cc_buf_append_char(b, '"');
}

// Escapes for a JSON string body. Bytes of invalid UTF-8 are kept as they are: the reader
// replaces them, and keeping them loses nothing an analyst could use.
void cc_buf_append_json_escaped(cc_buf *b, const char *s, size_t max_bytes) {
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < max_bytes && s[i] != '\0'; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            cc_buf_append_char(b, '\\');
            cc_buf_append_char(b, (char)c);
        } else if (c == '\n') {
            cc_buf_append(b, "\\n", 2);
        } else if (c == '\t') {
            cc_buf_append(b, "\\t", 2);
        } else if (c < 0x20 || c == 0x7f) {
            char esc[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 0xf]};
            cc_buf_append(b, esc, 6);
        } else {
            cc_buf_append_char(b, (char)c);
        }
    }
}

void cc_buf_append_json_string(cc_buf *b, const char *s, size_t max_bytes) {
    cc_buf_append_char(b, '"');
    cc_buf_append_json_escaped(b, s, max_bytes);
    cc_buf_append_char(b, '"');
}

// CRC-32 (IEEE 802.3, as zlib). Eight bytes a step through tables that install fills
// (cc_crc32_prepare): a report's 10-20 KiB would take about 50 µs four bits at a time. Before
// install, four bits at a time from 16 constants.
static uint32_t cc_crc32_tables[8][256];
static bool cc_crc32_prepared;

void cc_crc32_prepare(void) {
    if (cc_crc32_prepared) return;
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t crc = i;
        for (int bit = 0; bit < 8; bit++) crc = crc & 1 ? (crc >> 1) ^ 0xedb88320u : crc >> 1;
        cc_crc32_tables[0][i] = crc;
    }
    for (int k = 1; k < 8; k++) {
        for (int i = 0; i < 256; i++) {
            uint32_t previous = cc_crc32_tables[k - 1][i];
            cc_crc32_tables[k][i] = (previous >> 8) ^ cc_crc32_tables[0][previous & 0xff];
        }
    }
    cc_crc32_prepared = true;
}

static uint32_t cc_crc32_by_nibble(uint32_t crc, const unsigned char *p, size_t n) {
    static const uint32_t table[16] = {
        0x00000000, 0x1db71064, 0x3b6e20c8, 0x26d930ac, 0x76dc4190, 0x6b6b51f4, 0x4db26158, 0x5005713c,
        0xedb88320, 0xf00f9344, 0xd6d6a3e8, 0xcb61b38c, 0x9b64c2b0, 0x86d3d2d4, 0xa00ae278, 0xbdbdf21c,
    };
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        crc = (crc >> 4) ^ table[crc & 0xf];
        crc = (crc >> 4) ^ table[crc & 0xf];
    }
    return crc;
}

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

// CRC-32 by carry-less multiplication (Intel's "Fast CRC Computation for Generic Polynomials
// Using PCLMULQDQ", for the bit-reflected IEEE polynomial): four 16-byte lanes folded 64 bytes a
// step, then to one lane, then Barrett-reduced to 32 bits. About five times the tables' speed:
// the stacks record of a crash among 256 threads is 800 KiB, which the tables take 0.27 ms over.
// `crc` is the running value without the final inversion; n is a multiple of 16, at least 64.
__attribute__((target("pclmul,sse4.1"))) static uint32_t cc_crc32_folded(uint32_t crc, const unsigned char *p,
                                                                        size_t n) {
    const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4);
    const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);
    const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124);
    const __m128i poly_mu = _mm_set_epi64x(0x1f7011641, 0x1db710641);
    const __m128i low32 = _mm_set_epi32(0, 0, 0, -1);
    __m128i x1 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)crc));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x4 = _mm_loadu_si128((const __m128i *)(p + 48));
    p += 64;
    n -= 64;
#define CC_FOLD(x, k, next) \
    _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next)
    for (; n >= 64; n -= 64, p += 64) {
        x1 = CC_FOLD(x1, k1k2, _mm_loadu_si128((const __m128i *)p));
        x2 = CC_FOLD(x2, k1k2, _mm_loadu_si128((const __m128i *)(p + 16)));
        x3 = CC_FOLD(x3, k1k2, _mm_loadu_si128((const __m128i *)(p + 32)));
        x4 = CC_FOLD(x4, k1k2, _mm_loadu_si128((const __m128i *)(p + 48)));
    }
    x1 = CC_FOLD(x1, k3k4, x2);
    x1 = CC_FOLD(x1, k3k4, x3);
    x1 = CC_FOLD(x1, k3k4, x4);
    for (; n >= 16; n -= 16, p += 16) x1 = CC_FOLD(x1, k3k4, _mm_loadu_si128((const __m128i *)p));
#undef CC_FOLD
    // 128 bits to 64 (and 32 zero bits appended), then to 32.
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(k3k4, x1, 0x01), _mm_srli_si128(x1, 8));
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), k5, 0x00), _mm_srli_si128(x1, 4));
    // Barrett reduction.
    __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x1, low32), poly_mu, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), poly_mu, 0x00);
    return (uint32_t)_mm_extract_epi32(_mm_xor_si128(t, x1), 1);
}

// Asked once, at the first long CRC (a crash's stacks record): one cpuid, an exit to the
// hypervisor on a VM, is not worth it at every install.
static _Atomic int cc_crc32_folding;  // 0 not asked, 1 yes, 2 no

static bool cc_crc32_can_fold(void) {
    int known = atomic_load_explicit(&cc_crc32_folding, memory_order_relaxed);
    if (known == 0) {
        unsigned int eax, ebx, ecx, edx;
        bool yes = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_PCLMUL) && (ecx & bit_SSE4_1);
        known = yes ? 1 : 2;
        atomic_store_explicit(&cc_crc32_folding, known, memory_order_relaxed);
    }
    return known == 1;
}
#endif

uint32_t cc_crc32(uint32_t crc, const void *data, size_t n) {
    const unsigned char *p = data;
    crc = ~crc;
    if (!cc_crc32_prepared) return ~cc_crc32_by_nibble(crc, p, n);
    const uint32_t(*t)[256] = cc_crc32_tables;
#if defined(__x86_64__)
    if (n >= 4096 && cc_crc32_can_fold()) {
        size_t folded = n & ~(size_t)15;
        crc = cc_crc32_folded(crc, p, folded);
        p += folded;
        n -= folded;
    }
#endif
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t low = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        crc = t[7][low & 0xff] ^ t[6][(low >> 8) & 0xff] ^ t[5][(low >> 16) & 0xff] ^ t[4][low >> 24] ^
              t[3][p[4]] ^ t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
    }
    for (; n > 0; n--, p++) crc = (crc >> 8) ^ t[0][(crc ^ *p) & 0xff];
    return ~crc;
}

static void cc_put_le32(char *out, uint32_t v) {
    out[0] = (char)(v & 0xff);
    out[1] = (char)((v >> 8) & 0xff);
    out[2] = (char)((v >> 16) & 0xff);
    out[3] = (char)((v >> 24) & 0xff);
}

// Writes the 16-byte header in front of a payload that already sits at out + 16.
void cc_frame_in_place(char *out, uint32_t type, size_t len) {
    memcpy(out, CCF_RECORD_MAGIC, 4);
    cc_put_le32(out + 4, type);
    cc_put_le32(out + 8, (uint32_t)len);
    uint32_t crc = cc_crc32(0, out + 4, 8);
    crc = cc_crc32(crc, out + CCF_RECORD_HEADER_SIZE, len);
    cc_put_le32(out + 12, crc);
}

size_t cc_frame_record(char *out, size_t cap, uint32_t type, const char *payload, size_t len) {
    if (len > CCF_MAXIMUM_PAYLOAD || cap < CCF_RECORD_HEADER_SIZE || len > cap - CCF_RECORD_HEADER_SIZE) return 0;
    memmove(out + CCF_RECORD_HEADER_SIZE, payload, len);
    cc_frame_in_place(out, type, len);
    return CCF_RECORD_HEADER_SIZE + len;
}

int cc_write_all(int fd, const void *data, size_t n) {
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (w == 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int64_t cc_monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t cc_wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

// Finds NT_GNU_BUILD_ID among a module's PT_NOTE segments. Used at install and for
// modules first seen at crash time (inside a guarded stage).
bool cc_read_build_id(uintptr_t load_bias, const void *phdrs, size_t phnum, char *hex_out, size_t hex_cap) {
    static const char hex[] = "0123456789abcdef";
    const ElfW(Phdr) *ph = phdrs;
    for (size_t i = 0; i < phnum; i++) {
        if (ph[i].p_type != PT_NOTE) continue;
        const char *p = (const char *)(load_bias + ph[i].p_vaddr);
        const char *end = p + ph[i].p_memsz;
        while (p + sizeof(ElfW(Nhdr)) <= end) {
            const ElfW(Nhdr) *note = (const ElfW(Nhdr) *)p;
            const char *name = p + sizeof(ElfW(Nhdr));
            const char *desc = name + ((note->n_namesz + 3) & ~3u);
            const char *next = desc + ((note->n_descsz + 3) & ~3u);
            if (next > end) break;
            if (note->n_type == NT_GNU_BUILD_ID && note->n_namesz == 4 && memcmp(name, "GNU", 4) == 0) {
                if (note->n_descsz * 2 + 1 > hex_cap) return false;
                const unsigned char *d = (const unsigned char *)desc;
                for (size_t k = 0; k < note->n_descsz; k++) {
                    hex_out[2 * k] = hex[d[k] >> 4];
                    hex_out[2 * k + 1] = hex[d[k] & 0xf];
                }
                hex_out[note->n_descsz * 2] = '\0';
                return true;
            }
            p = next;
        }
    }
    return false;
}

// Writes a byte to every page of [p, p + n): the first write to a page of our static buffers
// otherwise costs a page fault (1-3 µs in a VM) inside the handler.
void cc_touch_pages(void *p, size_t n) {
    volatile char *bytes = p;
    for (size_t at = 0; at < n; at += 4096) bytes[at] = 0;
    if (n > 0) bytes[n - 1] = 0;
}

void cc_each_name(int directory, char *buffer, size_t size, void (*visit)(const char *name, void *context),
                  void *context) {
    for (;;) {
        long got = syscall(SYS_getdents64, directory, buffer, size);
        if (got <= 0) return;
        // struct linux_dirent64: inode (8), offset (8), record length (2), type (1), name.
        for (long at = 0; at < got;) {
            unsigned short length;
            memcpy(&length, buffer + at + 16, sizeof(length));
            visit(buffer + at + 19, context);
            at += length;
        }
    }
}

bool cc_holds_file(int fd, dev_t dev, ino_t ino) {
    struct stat status;
    return fd >= 0 && fstat(fd, &status) == 0 && status.st_dev == dev && status.st_ino == ino;
}

bool cc_note_file(int fd, dev_t *dev, ino_t *ino) {
    struct stat status;
    if (fd < 0 || fstat(fd, &status) != 0) return false;
    *dev = status.st_dev;
    *ino = status.st_ino;
    return true;
}
