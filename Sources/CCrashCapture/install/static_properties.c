// The event properties every event of the process carries, and the `lib` object, serialized
// once at install so that the crash path only copies them; the property rules the C API checks
// (the Swift SDK checks its own before it calls in).
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
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

// Strict UTF-8, as the collector reads JSON text (RFC 3629): no overlong forms, no UTF-16
// surrogates, nothing past U+10FFFF. Anything looser is refused there, with its whole batch.
static size_t cc_utf8_sequence(const unsigned char *p) {
    unsigned char lead = p[0];
    if (lead < 0x80) return 1;
    size_t length;
    unsigned char low = 0x80, high = 0xbf;
    if (lead >= 0xc2 && lead <= 0xdf) length = 2;
    else if (lead == 0xe0) length = 3, low = 0xa0;
    else if (lead == 0xed) length = 3, high = 0x9f;
    else if (lead >= 0xe1 && lead <= 0xef) length = 3;
    else if (lead == 0xf0) length = 4, low = 0x90;
    else if (lead == 0xf4) length = 4, high = 0x8f;
    else if (lead >= 0xf1 && lead <= 0xf3) length = 4;
    else return 0;
    if (p[1] < low || p[1] > high) return 0;  // a NUL (the string's end) fails here too
    for (size_t i = 2; i < length; i++)
        if ((p[i] & 0xc0) != 0x80) return 0;
    return length;
}

bool cc_valid_utf8(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        size_t length = cc_utf8_sequence(p);
        if (length == 0) return false;
        p += length;
    }
    return true;
}

// Whether the members in `b` (static properties, flat: keys, then strings, numbers, booleans
// or lists of strings) already name `key`. `,"key":` or `"key":` at the start can only be a
// key there: inside a string every quote is escaped, and a string's closing quote is followed
// by `,`, `]`, `}` or `:`, never by a key's first letter.
bool cc_members_have_key(const char *members, size_t length, const char *key) {
    size_t n = strlen(key);
    for (size_t at = 0; at + n + 3 <= length; at++) {
        if (members[at] != '"' || (at > 0 && members[at - 1] != ',')) continue;
        if (memcmp(members + at + 1, key, n) == 0 && members[at + 1 + n] == '"' && members[at + 2 + n] == ':')
            return true;
    }
    return false;
}

int crashcapture_is_static_property(const char *key) {
    return key != NULL && atomic_load(&cc_global.installed) &&
           cc_members_have_key(cc_global.static_props, cc_global.static_props_len, key);
}

// MARK: - The prevalidated members, checked at install

// A strict reader of `"key":value,...` (the members of a JSON object, no braces): a trailing
// comma, a bad escape or number, a control character or bad UTF-8 in a string, a key twice or a
// key the property rules refuse would make every report and the session file unreadable (or
// refused by the collector). Values are what the Sensors data model allows: text, a number, a
// boolean, a list of texts. Install time only: not the crash path.
typedef struct cc_json_reader {
    const unsigned char *p;
    const char *problem;
} cc_json_reader;

static void cc_json_space(cc_json_reader *r) {
    while (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r') r->p++;
}

static bool cc_json_hex(unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static unsigned cc_json_unit(const unsigned char *p) {
    unsigned unit = 0;
    for (int i = 0; i < 4; i++) unit = unit << 4 | (unsigned)(p[i] <= '9' ? p[i] - '0' : (p[i] | 0x20) - 'a' + 10);
    return unit;
}

// A string token; `plain` (when not NULL) gets whether it has no escape, `bytes` its length.
static bool cc_json_string(cc_json_reader *r, bool *plain, size_t *bytes) {
    if (*r->p != '"') return r->problem = "expected a string", false;
    r->p++;
    if (plain != NULL) *plain = true;
    size_t count = 0;
    while (*r->p != '"') {
        if (*r->p == '\0') return r->problem = "an unterminated string", false;
        if (*r->p < 0x20) return r->problem = "a control character in a string (escape it)", false;
        if (*r->p == '\\') {
            if (plain != NULL) *plain = false;
            unsigned char e = r->p[1];
            if (e == 'u') {
                for (int i = 2; i < 6; i++)
                    if (!cc_json_hex(r->p[i])) return r->problem = "a bad \\u escape", false;
                unsigned unit = cc_json_unit(r->p + 2);
                r->p += 6;
                if (unit >= 0xdc00 && unit <= 0xdfff) return r->problem = "a lone low surrogate escape", false;
                if (unit >= 0xd800 && unit <= 0xdbff) {
                    if (r->p[0] != '\\' || r->p[1] != 'u') return r->problem = "a lone high surrogate escape", false;
                    for (int i = 2; i < 6; i++)
                        if (!cc_json_hex(r->p[i])) return r->problem = "a bad \\u escape", false;
                    unsigned low = cc_json_unit(r->p + 2);
                    if (low < 0xdc00 || low > 0xdfff) return r->problem = "a lone high surrogate escape", false;
                    r->p += 6;
                }
                count += 3;
                continue;
            }
            if (e == '\0' || strchr("\"\\/bfnrt", e) == NULL) return r->problem = "a bad escape", false;
            r->p += 2;
            count++;
            continue;
        }
        size_t length = cc_utf8_sequence(r->p);
        if (length == 0) return r->problem = "text that is not UTF-8", false;
        r->p += length;
        count += length;
    }
    r->p++;
    if (bytes != NULL) *bytes = count;
    return true;
}

static size_t cc_json_digits(cc_json_reader *r) {
    const unsigned char *start = r->p;
    while (*r->p >= '0' && *r->p <= '9') r->p++;
    return (size_t)(r->p - start);
}

static bool cc_json_number(cc_json_reader *r) {
    const unsigned char *start = r->p;
    if (*r->p == '-') r->p++;
    if (*r->p == '0') r->p++;
    else if (cc_json_digits(r) == 0) return r->problem = "a bad value", false;
    if (*r->p == '.') {
        r->p++;
        if (cc_json_digits(r) == 0) return r->problem = "a bad number", false;
    }
    if (*r->p == 'e' || *r->p == 'E') {
        r->p++;
        if (*r->p == '+' || *r->p == '-') r->p++;
        if (cc_json_digits(r) == 0) return r->problem = "a bad number", false;
    }
    if (*r->p >= '0' && *r->p <= '9') return r->problem = "a bad number (a leading zero)", false;
    // Grammatical, but no double holds it: the collector refuses it.
    char text[64];
    size_t n = (size_t)(r->p - start);
    if (n >= sizeof(text)) return r->problem = "a number of too many digits", false;
    memcpy(text, start, n);
    text[n] = '\0';
    double value = strtod(text, NULL);
    if (value == HUGE_VAL || value == -HUGE_VAL) return r->problem = "a number out of range", false;
    return true;
}

static bool cc_json_value(cc_json_reader *r) {
    size_t bytes = 0;
    switch (*r->p) {
    case '"':
        if (!cc_json_string(r, NULL, &bytes)) return false;
        if (bytes > 8191) return r->problem = "a text longer than 8191 bytes", false;
        return true;
    case 't':
        return strncmp((const char *)r->p, "true", 4) == 0 ? (r->p += 4, true) : (r->problem = "a bad value", false);
    case 'f':
        return strncmp((const char *)r->p, "false", 5) == 0 ? (r->p += 5, true) : (r->problem = "a bad value", false);
    case '[': {
        r->p++;
        cc_json_space(r);
        if (*r->p == ']') return r->p++, true;
        for (int items = 1;; items++) {
            if (items > 500) return r->problem = "a list of more than 500 texts", false;
            cc_json_space(r);
            if (*r->p != '"') return r->problem = "a list item that is not text", false;
            if (!cc_json_string(r, NULL, &bytes)) return false;
            if (bytes > 8191) return r->problem = "a text longer than 8191 bytes", false;
            cc_json_space(r);
            if (*r->p == ']') return r->p++, true;
            if (*r->p != ',') return r->problem = "expected ',' or ']'", false;
            r->p++;
        }
    }
    case '{': return r->problem = "an object (values are text, numbers, booleans or lists of text)", false;
    case 'n': return r->problem = "null (values are text, numbers, booleans or lists of text)", false;
    default: return cc_json_number(r);
    }
}

// Appends the members of `json` to `b` after checking them all; `b` holds the members so far,
// whose keys none may repeat.
static int cc_append_prevalidated(cc_buf *b, const char *json) {
    cc_json_reader r = {(const unsigned char *)json, NULL};
    cc_json_space(&r);
    if (*r.p == '\0') return 0;
    size_t first = b->len;
    for (;;) {
        cc_json_space(&r);
        const unsigned char *key_start = r.p;
        bool plain = false;
        size_t key_bytes = 0;
        if (!cc_json_string(&r, &plain, &key_bytes)) break;
        char key[101];
        if (!plain || key_bytes > 100) {
            r.problem = "a key that is not 1 to 100 plain bytes [A-Za-z_][A-Za-z0-9_]*";
            r.p = key_start;
            break;
        }
        memcpy(key, key_start + 1, key_bytes);
        key[key_bytes] = '\0';
        if (cc_check_key(key) != 0) {
            char reason[256];
            snprintf(reason, sizeof(reason), "%s", cc_last_error_text());
            b->len = first;
            return cc_fail("prevalidated_properties_json: %s", reason);
        }
        // The members so far, this call's own included (appended as they are read).
        if (cc_members_have_key(b->data, b->len, key)) {
            b->len = first;
            return cc_fail("prevalidated_properties_json: the key \"%s\" is given twice", key);
        }
        cc_json_space(&r);
        if (*r.p != ':') {
            r.problem = "expected ':'";
            break;
        }
        r.p++;
        cc_json_space(&r);
        const unsigned char *value_start = r.p;
        if (!cc_json_value(&r)) break;
        if (b->len > 0) cc_buf_append_str(b, ",");
        cc_buf_append(b, (const char *)key_start, 2 + key_bytes);
        cc_buf_append_str(b, ":");
        cc_buf_append(b, (const char *)value_start, (size_t)(r.p - value_start));
        cc_json_space(&r);
        if (*r.p == '\0') return 0;
        if (*r.p != ',') {
            r.problem = "expected ',' between members";
            break;
        }
        r.p++;
        cc_json_space(&r);
        if (*r.p == '\0') {
            r.problem = "a trailing comma";
            break;
        }
    }
    b->len = first;
    return cc_fail("prevalidated_properties_json is not the members of a JSON object: %s at byte %zu",
                   r.problem != NULL ? r.problem : "a bad member", (size_t)(r.p - (const unsigned char *)json));
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
        if (cc_members_have_key(b.data, b.len, p->key))
            return cc_fail("property \"%s\" is given twice", p->key);
        cc_append_member(&b, p->key, p->value);
    }
    const char *prevalidated = config->prevalidated_properties_json;
    if (prevalidated != NULL && cc_append_prevalidated(&b, prevalidated) != 0) return -1;
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
