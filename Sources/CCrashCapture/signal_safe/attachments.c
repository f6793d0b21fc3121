// The tails of the files the app attached (a log file, say), copied into the report at the
// crash: opened by path now, so a file rotated or made since install is the one read.
// The rules of crash_path.c apply here: signal-safe calls only, nothing allocated, no lock.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cc_internal.h"
#include "crash_report.h"

void cc_append_attachments(cc_buf *b, size_t limit) {
    int count = atomic_load_explicit(&cc_global.attachment_count, memory_order_acquire);
    if (count <= 0) return;
    cc_buf_append_str(b, ",\"attachments\":[");
    for (int i = 0; i < count && i < CC_MAX_ATTACHMENTS; i++) {
        if (i > 0) cc_buf_append_str(b, ",");
        const char *path = cc_global.attachments[i].path;
        cc_buf_append_str(b, "{\"path\":");
        cc_buf_append_json_string(b, path, sizeof(cc_global.attachments[i].path));
        // Non-blocking: a FIFO under the name must not hold the crash path.
        int fd = openat(AT_FDCWD, path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        struct stat info;
        if (fd < 0 || fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
            cc_buf_append_str(b, fd < 0 ? ",\"error\":\"cannot open\"}" : ",\"error\":\"not a regular file\"}");
            if (fd >= 0) close(fd);
            continue;
        }
        uint64_t size = (uint64_t)info.st_size;
        uint64_t wanted = cc_global.attachments[i].max_bytes;
        uint64_t start = size > wanted ? size - wanted : 0;
        cc_buf_append_str(b, ",\"file_size\":");
        cc_buf_append_u64(b, size);
        cc_buf_append_str(b, ",\"offset\":");
        cc_buf_append_u64(b, start);
        cc_buf_append_str(b, ",\"base64\":\"");
        uint64_t copied = 0;
        // Whole multiples of 3 bytes until the last read, so the pieces join into one base64 text.
        unsigned char chunk[3072];
        if (lseek(fd, (off_t)start, SEEK_SET) == (off_t)start) {
            while (copied < wanted && b->len + 4 * sizeof(chunk) / 3 + 64 < limit) {
                size_t want = wanted - copied < sizeof(chunk) ? (size_t)(wanted - copied) : sizeof(chunk);
                size_t got = 0;
                while (got < want) {
                    ssize_t n = read(fd, chunk + got, want - got);
                    if (n <= 0) break;
                    got += (size_t)n;
                }
                if (got == 0) break;
                cc_append_base64(b, chunk, got);
                copied += got;
                if (got < want || got % 3 != 0) break;
            }
        }
        close(fd);
        cc_buf_append_str(b, "\",\"bytes\":");
        cc_buf_append_u64(b, copied);
        cc_buf_append_str(b, "}");
    }
    cc_buf_append_str(b, "]");
}
