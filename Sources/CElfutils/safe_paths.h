// Which files the symbolicator may open (safe_paths.c).
#ifndef CCS_SAFE_PATHS_H
#define CCS_SAFE_PATHS_H

// Every place libdwfl's standard search may open for a module (its build-id path, its debuglink
// beside it and in .debug/, each directory of the search path) is absent or a regular file of
// bounded size: 1, or 0 and the search must not be made.
int ccs_search_is_harmless(
    const char *search_path, const char *file_name, const char *debuglink_file, const char *build_id);

#endif
