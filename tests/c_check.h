/* Checks for the C test programs: CHECK counts a failure and says what failed and ferryd's last
 * error; include it after the ferry header the program is built against. */
#ifndef FERRY_TESTS_C_CHECK_H_
#define FERRY_TESTS_C_CHECK_H_

#include <stdio.h>

static int failures = 0;
#define CHECK(cond, ...)                                          \
  do {                                                            \
    if (!(cond)) {                                                \
      fprintf(stderr, "%s: FAILED %s: ", kProgram, #cond);        \
      fprintf(stderr, __VA_ARGS__);                               \
      fprintf(stderr, " (%s)\n", ferry_last_error());             \
      failures++;                                                 \
    }                                                             \
  } while (0)

#endif /* FERRY_TESTS_C_CHECK_H_ */
