/*
 * check.h -- the C tests' one assertion: CHECK(cond) counts the check and,
 * when cond is false, the failure, with its place and text on stderr.  A
 * test file includes it once and reports `checks` and `failures` at the end.
 */
#ifndef AWQ_TEST_CHECK_H
#define AWQ_TEST_CHECK_H

#include <stdio.h>

static int failures, checks;

#define CHECK(cond)                                                                               \
    do {                                                                                          \
        checks++;                                                                                 \
        if (!(cond)) {                                                                            \
            failures++;                                                                           \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);              \
        }                                                                                         \
    } while (0)

#endif /* AWQ_TEST_CHECK_H */
