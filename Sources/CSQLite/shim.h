#include <sqlite3.h>

// SQLITE_TRANSIENT is a macro over a cast Swift cannot import.
static inline void (*csqlite_transient(void))(void *) { return SQLITE_TRANSIENT; }
