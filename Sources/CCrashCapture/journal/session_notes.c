// The notes of a session: context the app sets and breadcrumbs it leaves, written in place in
// the session file's notes area (crashcapture_format.h) as they change. A crash costs nothing
// more for them: the next replay reads them from the session file and puts them into the
// $AppCrashed. The files attached with crashcapture_attach_file are only named here; the crash
// path reads their tails (signal_safe/attachments.c).
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cc_internal.h"
#include "crashcapture_sdk.h"

#define CC_CONTEXT_KEYS 64

static pthread_mutex_t cc_notes_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char key[101];
    char *json;  // the value as JSON text, malloc'd
} cc_context[CC_CONTEXT_KEYS];
static size_t cc_context_count;
static uint64_t cc_context_sequence;
static _Atomic uint64_t cc_breadcrumb_sequence;

static bool cc_valid_key(const char *key) {
    size_t n = strlen(key);
    if (n == 0 || n > 100 || key[0] == '$' || (key[0] >= '0' && key[0] <= '9')) return false;
    for (size_t i = 0; i < n; i++) {
        char c = key[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) return false;
    }
    return true;
}

// The context as one JSON object into the notes' older slot, then that slot's sequence: a
// reader takes the valid slot with the higher sequence, so it never sees half an update.
static int cc_write_context_locked(void) {
    char *notes = cc_session_notes();
    if (notes == NULL) return cc_fail("not installed");
    static char text[CCF_NOTES_CONTEXT_SLOT_SIZE];
    cc_buf b = {text, 0, CCF_NOTES_CONTEXT_SLOT_SIZE - CCF_NOTES_SLOT_HEADER_SIZE, false};
    cc_buf_append_str(&b, "{");
    for (size_t i = 0; i < cc_context_count; i++) {
        if (i > 0) cc_buf_append_str(&b, ",");
        cc_buf_append_json_string(&b, cc_context[i].key, sizeof(cc_context[i].key));
        cc_buf_append_str(&b, ":");
        cc_buf_append_str(&b, cc_context[i].json);
    }
    cc_buf_append_str(&b, "}");
    if (b.overflow) return -2;
    uint64_t sequence = ++cc_context_sequence;
    char *slot = notes + (sequence % CCF_NOTES_CONTEXT_SLOTS) * CCF_NOTES_CONTEXT_SLOT_SIZE;
    _Atomic uint64_t *published = (_Atomic uint64_t *)slot;
    atomic_store_explicit(published, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    uint32_t length = (uint32_t)b.len;
    uint32_t crc = cc_journal_crc32c(cc_journal_crc32c(0, &sequence, 8), text, b.len);
    memcpy(slot + 8, &length, 4);
    memcpy(slot + 12, &crc, 4);
    memcpy(slot + CCF_NOTES_SLOT_HEADER_SIZE, text, b.len);
    atomic_store_explicit(published, sequence, memory_order_release);
    return 0;
}

int cc_notes_set_context_json(const char *key, const char *value_json) {
    if (key == NULL || !cc_valid_key(key))
        return cc_fail("context key must be 1 to 100 bytes of [A-Za-z0-9_], not starting with a digit or $");
    if (cc_session_notes() == NULL) return cc_fail("not installed");
    char *copy = value_json != NULL ? strdup(value_json) : NULL;
    if (value_json != NULL && copy == NULL) return cc_fail("out of memory");
    pthread_mutex_lock(&cc_notes_lock);
    size_t index = 0;
    while (index < cc_context_count && strcmp(cc_context[index].key, key) != 0) index++;
    bool present = index < cc_context_count;
    int result = 0;
    if (!present && copy != NULL && cc_context_count == CC_CONTEXT_KEYS) {
        result = cc_fail("at most %d context keys", CC_CONTEXT_KEYS);
    } else if (present || copy != NULL) {
        // The change, then the whole context written; past the slot's room it is undone.
        char *previous = present ? cc_context[index].json : NULL;
        if (copy == NULL) {
            cc_context[index] = cc_context[--cc_context_count];
        } else {
            if (!present) snprintf(cc_context[cc_context_count++].key, sizeof(cc_context[0].key), "%s", key);
            cc_context[index].json = copy;
            copy = NULL;
        }
        result = cc_write_context_locked();
        if (result == -2) {
            if (value_json == NULL) {
                // A removal always fits; only a value can be too long.
            } else if (present) {
                copy = cc_context[index].json;
                cc_context[index].json = previous;
                previous = NULL;
            } else {
                copy = cc_context[index].json;
                cc_context_count--;
            }
            result = cc_fail("the context would pass %d bytes; it is left as it was",
                             CCF_NOTES_CONTEXT_SLOT_SIZE - CCF_NOTES_SLOT_HEADER_SIZE);
        }
        free(previous);
    }
    pthread_mutex_unlock(&cc_notes_lock);
    free(copy);
    return result;
}

void cc_notes_session_created(void) {
    // A session made again (uninstall, then install) starts with the context the app had set.
    pthread_mutex_lock(&cc_notes_lock);
    if (cc_context_count > 0) cc_write_context_locked();
    pthread_mutex_unlock(&cc_notes_lock);
}

int cc_notes_set_context(const char *key, const char *value) {
    if (value == NULL) return cc_notes_set_context_json(key, NULL);
    char json[CCF_NOTES_CONTEXT_SLOT_SIZE];
    cc_buf b = {json, 0, sizeof(json) - 1, false};
    cc_buf_append_json_string(&b, value, sizeof(json));
    if (b.overflow) return cc_fail("context value of %zu bytes is too long", strlen(value));
    json[b.len] = '\0';
    return cc_notes_set_context_json(key, json);
}

int cc_notes_add_breadcrumb(const char *message) {
    char *notes = cc_session_notes();
    if (notes == NULL || message == NULL) return cc_fail("not installed");
    uint64_t sequence = atomic_fetch_add(&cc_breadcrumb_sequence, 1) + 1;
    char *slot = notes + CCF_NOTES_CONTEXT_SLOTS * CCF_NOTES_CONTEXT_SLOT_SIZE +
                 ((sequence - 1) % CCF_NOTES_BREADCRUMB_SLOTS) * CCF_NOTES_BREADCRUMB_SLOT_SIZE;
    size_t room = CCF_NOTES_BREADCRUMB_SLOT_SIZE - CCF_NOTES_BREADCRUMB_TEXT_AT;
    size_t length = strlen(message);
    if (length > room) {
        // Cut at a character's start, never inside a UTF-8 sequence.
        length = room;
        while (length > 0 && ((unsigned char)message[length] & 0xC0) == 0x80) length--;
    }
    int64_t now = cc_wall_ms();
    _Atomic uint64_t *published = (_Atomic uint64_t *)slot;
    atomic_store_explicit(published, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    uint32_t length32 = (uint32_t)length;
    uint32_t crc = cc_journal_crc32c(cc_journal_crc32c(cc_journal_crc32c(0, &sequence, 8), &now, 8), message, length);
    memcpy(slot + 8, &length32, 4);
    memcpy(slot + 12, &crc, 4);
    memcpy(slot + 16, &now, 8);
    memcpy(slot + CCF_NOTES_BREADCRUMB_TEXT_AT, message, length);
    atomic_store_explicit(published, sequence, memory_order_release);
    return 0;
}

int crashcapture_attach_file(const char *path, size_t max_bytes) {
    if (path == NULL || path[0] != '/') return cc_fail("attach_file needs an absolute path");
    if (strlen(path) >= sizeof(cc_global.attachments[0].path)) return cc_fail("attach_file: path too long");
    if (max_bytes == 0 || max_bytes > CC_ATTACHMENT_MAX_BYTES)
        return cc_fail("attach_file: max_bytes must be 1 to %d", CC_ATTACHMENT_MAX_BYTES);
    pthread_mutex_lock(&cc_notes_lock);
    int count = atomic_load(&cc_global.attachment_count);
    int result = 0;
    if (count >= CC_MAX_ATTACHMENTS) {
        result = cc_fail("at most %d attached files", CC_MAX_ATTACHMENTS);
    } else {
        snprintf(cc_global.attachments[count].path, sizeof(cc_global.attachments[count].path), "%s", path);
        cc_global.attachments[count].max_bytes = max_bytes;
        atomic_store_explicit(&cc_global.attachment_count, count + 1, memory_order_release);
    }
    pthread_mutex_unlock(&cc_notes_lock);
    return result;
}
