// A release build's crash inside code the compiler inlined twice: read_field into
// parse_record into process. The symbolication tests strip it and find its debug info.
#include <stdio.h>
#include <stdlib.h>

static volatile int *records;

static inline __attribute__((always_inline)) int read_field(volatile int *record) {
    return *record * 3;
}

static inline __attribute__((always_inline)) int parse_record(volatile int *record, int count) {
    int sum = 0;
    for (int index = 0; index < count; index++) sum += read_field(record + index);
    return sum;
}

__attribute__((noinline)) int process(int count) {
    return parse_record(records, count) + 1;
}

int main(int argc, char **argv) {
    (void)argv;
    records = argc > 8 ? calloc(16, sizeof(int)) : NULL;
#ifdef SECOND
    printf("second build: %d\n", process(argc));
#else
    printf("%d\n", process(argc));
#endif
    return 0;
}
