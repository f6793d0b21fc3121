// The parts of elfutils' public ABI (libdw.so.1, libdebuginfod.so.1) that the symbolicator
// calls, declared here rather than taken from libdw-dev's headers: an app that links
// CrashCapture then builds without elfutils' headers and runs without elfutils at all. These
// layouts have been fixed since the libraries took their sonames; the test suite compiles
// them against the real headers to keep them honest (ElfutilsABITests).
#ifndef CRASHCAPTURE_LIBDW_ABI_H
#define CRASHCAPTURE_LIBDW_ABI_H

#include <elf.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef uint64_t Dwarf_Addr;
typedef uint64_t Dwarf_Word;
typedef struct Dwfl Dwfl;
typedef struct Dwfl_Module Dwfl_Module;
typedef struct Dwarf_Line_s Dwarf_Line;
typedef struct Dwarf Dwarf;
typedef struct Dwarf_Files_s Dwarf_Files;
typedef struct Elf Elf;

typedef struct {
    void *addr;
    void *cu;
    void *abbrev;
    long int padding__;
} Dwarf_Die;

typedef struct {
    unsigned int code;
    unsigned int form;
    unsigned char *valp;
    void *cu;
} Dwarf_Attribute;

typedef int Dwfl_find_elf(Dwfl_Module *, void **, const char *, Dwarf_Addr, char **, Elf **);
typedef int Dwfl_find_debuginfo(
    Dwfl_Module *, void **, const char *, Dwarf_Addr, const char *, const char *, uint32_t, char **);
typedef int Dwfl_section_address(
    Dwfl_Module *, void **, const char *, Dwarf_Addr, const char *, uint32_t, const Elf64_Shdr *, Dwarf_Addr *);

typedef struct {
    Dwfl_find_elf *find_elf;
    Dwfl_find_debuginfo *find_debuginfo;
    Dwfl_section_address *section_address;
    char **debuginfo_path;
} Dwfl_Callbacks;

#define CC_DW_TAG_entry_point 0x03
#define CC_DW_TAG_inlined_subroutine 0x1d
#define CC_DW_TAG_subprogram 0x2e
#define CC_DW_TAG_module 0x1e
#define CC_DW_TAG_namespace 0x39
#define CC_DW_AT_name 0x03
#define CC_DW_AT_call_column 0x57
#define CC_DW_AT_call_file 0x58
#define CC_DW_AT_call_line 0x59
#define CC_DW_AT_linkage_name 0x6e
#define CC_DW_AT_MIPS_linkage_name 0x2007

typedef struct debuginfod_client debuginfod_client;

#endif
