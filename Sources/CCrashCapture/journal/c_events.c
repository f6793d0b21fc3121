// crashcapture_track for C programs: the event is serialized here into the journal entry the
// Swift SDK's track() writes (the session's shared part left out, marked by 0x01), so that a
// replay, or the SDK's writer in a Swift process, imports it like any other.
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>

#include "cc_internal.h"
#include "crashcapture_sdk.h"

static _Atomic uint64_t cc_c_event_sequence;

static bool cc_valid_event_name(const char *name) {
    size_t n = name != NULL ? strlen(name) : 0;
    if (n == 0 || n > 100 || name[0] == '$' || (name[0] >= '0' && name[0] <= '9')) return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) return false;
    }
    return !ccf_is_reserved_name(name, n);
}

int crashcapture_track(const char *event, const crashcapture_property *properties, size_t count) {
    cc_install_rest_finish();  // the journal is in the session file
    if (!atomic_load(&cc_global.installed)) return cc_fail("not installed");
    if (!cc_valid_event_name(event))
        return cc_fail("event name must match [A-Za-z_][A-Za-z0-9_]*, at most 100 bytes, not a reserved name");
    if (count > 0 && properties == NULL) return cc_fail("count is %zu but properties is NULL", count);
    for (size_t i = 0; i < count; i++) {
        if (cc_check_key(properties[i].key) != 0) return -1;
        // One object may name a key once: the collector refuses the whole batch of an event
        // that repeats one (its own or a static property's), and readers differ on which counts.
        for (size_t j = 0; j < i; j++)
            if (strcmp(properties[j].key, properties[i].key) == 0)
                return cc_fail("property \"%s\" is given twice", properties[i].key);
        if (cc_members_have_key(cc_global.static_props, cc_global.static_props_len, properties[i].key))
            return cc_fail("property \"%s\" is a static property of this process already", properties[i].key);
        const char *value = properties[i].value != NULL ? properties[i].value : "";
        if (strlen(value) > 8191 || !cc_valid_utf8(value))
            return cc_fail("property \"%s\": the value must be valid UTF-8 of at most 8191 bytes", properties[i].key);
    }
    crashcapture_journal *journal = cc_session_journal_for_events();
    if (journal == NULL) return cc_fail("no journal: the session file has no room for one");
    // On the heap, not in thread-local storage: a static TLS block of this size was zeroed for
    // every thread the program ever started, and for its main thread at load, tracking or not.
    enum { capacity = CCF_NOTES_CONTEXT_SLOT_SIZE * 16 };
    char *text = malloc(capacity);
    if (text == NULL) return cc_fail("no memory for the event");
    cc_buf b = {text, 0, capacity, false};
    cc_buf_append_str(&b, "{\"type\":\"track\",\"event\":");
    cc_buf_append_json_string(&b, event, 128);
    cc_buf_append_str(&b, ",\"time\":");
    cc_buf_append_i64(&b, cc_wall_ms());
    // "-c" and a number of its own: never the id of an event the SDK tracks in the same process.
    cc_buf_append_str(&b, ",\"event_id\":\"");
    cc_buf_append_str(&b, cc_global.session_id);
    cc_buf_append_str(&b, "-c");
    char digits[24];
    uint64_t number = atomic_fetch_add(&cc_c_event_sequence, 1) + 1;
    int width = 0;
    for (uint64_t rest = number; rest > 0 || width < 11; rest /= 10) digits[width++] = (char)('0' + rest % 10);
    while (width > 0) cc_buf_append(&b, &digits[--width], 1);
    cc_buf_append_str(&b, "\",\"lib\":{\"$lib_method\":\"code\",\x01,\"$lib_method\":\"code\"");
    for (size_t i = 0; i < count; i++) {
        cc_buf_append_str(&b, ",");
        cc_buf_append_json_string(&b, properties[i].key, 128);
        cc_buf_append_str(&b, ":");
        cc_buf_append_json_string(&b, properties[i].value != NULL ? properties[i].value : "", 8192);
    }
    cc_buf_append_str(&b, "}}");
    int result = 0;
    if (b.overflow)
        result = cc_fail("the event is larger than %d bytes", (int)capacity);
    // Never blocks: a C program has no writer draining its journal while it runs.
    else if (crashcapture_journal_append(journal, CCF_JOURNAL_EVENT, text, b.len, 0) != 0)
        result = cc_fail("the journal is full: the event was dropped and counted");
    free(text);
    return result;
}
