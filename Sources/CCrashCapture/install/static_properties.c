// The event properties every event of the process carries, and the `lib` object, serialized
// once at install so that the crash path only copies them; the property rules the C API checks
// (the Swift SDK checks its own before it calls in).
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "cc_internal.h"

int cc_check_key(const char *key) {
    size_t n = key != NULL ? strlen(key) : 0;
    if (n == 0 || n > 100) return cc_fail("property key must be 1 to 100 bytes");
    if (key[0] == '$') return cc_fail("property key \"%s\": keys starting with $ are reserved for presets", key);
    for (size_t i = 0; i < n; i++) {
        char c = key[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (i > 0 && c >= '0' && c <= '9');
        if (!ok) return cc_fail("property key \"%s\" must match [A-Za-z_][A-Za-z0-9_]*", key);
    }
    if (ccf_is_reserved_name(key, n)) return cc_fail("property key \"%s\" is a reserved name", key);
    return 0;
}

bool cc_valid_utf8(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        int extra = *p < 0x80 ? 0 : (*p & 0xe0) == 0xc0 ? 1 : (*p & 0xf0) == 0xe0 ? 2 : (*p & 0xf8) == 0xf0 ? 3 : -1;
        if (extra < 0 || (extra == 1 && *p < 0xc2)) return false;
        p++;
        for (int i = 0; i < extra; i++, p++)
            if ((*p & 0xc0) != 0x80) return false;
    }
    return true;
}

static void cc_append_member(cc_buf *b, const char *key, const char *value) {
    if (b->len > 0) cc_buf_append_str(b, ",");
    cc_buf_append_json_string(b, key, 256);
    cc_buf_append_str(b, ":");
    cc_buf_append_json_string(b, value, 8191);
}

// Process start in ms since the epoch: /proc/self/stat field 22 counts clock ticks since
// boot, and CLOCK_BOOTTIME says how long ago boot was (cheaper than reading /proc/stat).
static int64_t cc_process_start_ms(void) {
    char buffer[1024];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buffer, sizeof(buffer) - 1);
    close(fd);
    if (n <= 0) return 0;
    buffer[n] = '\0';
    const char *p = strrchr(buffer, ')');
    if (p == NULL) return 0;
    unsigned long long start_ticks = 0;
    // Fields after the command: state is field 3, starttime field 22.
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
               &start_ticks) != 1)
        return 0;
    cc_global.start_ticks = start_ticks;
    long hz = sysconf(_SC_CLK_TCK);
    struct timespec boot_now;
    if (hz <= 0 || clock_gettime(CLOCK_BOOTTIME, &boot_now) != 0) return 0;
    int64_t since_boot_ms = (int64_t)boot_now.tv_sec * 1000 + boot_now.tv_nsec / 1000000;
    int64_t started_ms = (int64_t)(start_ticks * 1000 / (unsigned long long)hz);
    return cc_wall_ms() - (since_boot_ms - started_ms);
}

int cc_build_static_json(const crashcapture_config *config) {
    struct utsname uts;
    if (uname(&uts) != 0) memset(&uts, 0, sizeof(uts));
    cc_buf b = {cc_global.static_props, 0, sizeof(cc_global.static_props) - 1, false};
    cc_append_member(&b, "$app_name", cc_global.app_name);
    cc_append_member(&b, "$app_version", cc_global.app_version);
    cc_append_member(&b, "$os", "Linux");
    cc_append_member(&b, "$os_version", uts.release);
    cc_append_member(&b, "$model", uts.machine);
    cc_append_member(&b, "$lib", CCF_LIB_NAME);
    cc_append_member(&b, "$lib_version", CRASHCAPTURE_VERSION);
    cc_append_member(&b, "$hostname", uts.nodename);
    cc_buf_append_str(&b, ",\"$process_start_time\":");
    cc_buf_append_i64(&b, cc_process_start_ms());
    for (size_t i = 0; i < config->property_count; i++) {
        const crashcapture_property *p = &config->properties[i];
        if (cc_check_key(p->key) != 0) return -1;
        if (p->value == NULL) return cc_fail("property \"%s\" has no value", p->key);
        if (strlen(p->value) > 8191) return cc_fail("property \"%s\" is longer than 8191 bytes", p->key);
        if (!cc_valid_utf8(p->value)) return cc_fail("property \"%s\" is not valid UTF-8", p->key);
        cc_append_member(&b, p->key, p->value);
    }
    if (config->prevalidated_properties_json != NULL && config->prevalidated_properties_json[0] != '\0') {
        cc_buf_append_str(&b, ",");
        cc_buf_append_str(&b, config->prevalidated_properties_json);
    }
    if (b.overflow) return cc_fail("static properties exceed %zu bytes", sizeof(cc_global.static_props) - 1);
    cc_global.static_props[b.len] = '\0';
    cc_global.static_props_len = b.len;

    cc_buf lib = {cc_global.lib_json, 0, sizeof(cc_global.lib_json), false};
    cc_buf_append_str(&lib, "\"lib\":{\"$lib\":\"" CCF_LIB_NAME "\",\"$lib_version\":\"" CRASHCAPTURE_VERSION
                            "\",\"$lib_method\":\"autoTrack\",\"$lib_detail\":\"signal handler\",\"$app_version\":");
    cc_buf_append_json_string(&lib, cc_global.app_version, 200);
    cc_buf_append_str(&lib, "}");
    if (lib.overflow) return cc_fail("app version is too long");
    cc_global.lib_json_len = lib.len;
    return 0;
}
