/* A client for the two-user isolation test (isolation_users_test.cc), through the plain C API the
 * way the attack in issue 19 used it: it may disconnect and keep using ferry_host_data().
 * usage: ferry_isolation_client SOCKET; then one command a line on stdin:
 *   connect | disconnect | alloc BYTES | fill I BYTE | check I BYTE | free I | quit
 * Each command N (from 1) answers one line "N: ..." on stdout: "ok", or what went wrong. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/ferry.h"

#define MAX_BUFFERS 64

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s SOCKET\n", argv[0]);
    return 64;
  }
  ferry_client* client = NULL;
  ferry_host_buffer* buffers[MAX_BUFFERS] = {0};
  int count = 0;
  char line[256];
  for (unsigned n = 1; fgets(line, sizeof line, stdin) != NULL; ++n) {
    char cmd[32] = {0};
    unsigned long long a = 0, b = 0;
    int fields = sscanf(line, "%31s %llu %llu", cmd, &a, &b);
    if (fields < 1) continue;
    if (strcmp(cmd, "connect") == 0) {
      ferry_connect_options o = {sizeof o, argv[1], "isolation", 0};
      if (ferry_connect(&o, &client) != FERRY_OK) {
        printf("%u: error: %s\n", n, ferry_last_error());
      } else {
        printf("%u: ok\n", n);
      }
    } else if (strcmp(cmd, "disconnect") == 0) {
      ferry_disconnect(client); /* the buffers stay mapped: ferry_host_data() still works */
      client = NULL;
      printf("%u: ok\n", n);
    } else if (strcmp(cmd, "alloc") == 0 && fields == 2 && count < MAX_BUFFERS) {
      if (ferry_host_alloc(client, (size_t)a, &buffers[count]) != FERRY_OK) {
        printf("%u: error: %s\n", n, ferry_last_error());
      } else {
        printf("%u: ok %d\n", n, count++);
      }
    } else if (strcmp(cmd, "fill") == 0 && fields == 3 && a < (unsigned long long)count && buffers[a] != NULL) {
      memset(ferry_host_data(buffers[a]), (int)b, ferry_host_size(buffers[a]));
      printf("%u: ok\n", n);
    } else if (strcmp(cmd, "check") == 0 && fields == 3 && a < (unsigned long long)count && buffers[a] != NULL) {
      const unsigned char* p = (const unsigned char*)ferry_host_data(buffers[a]);
      size_t size = ferry_host_size(buffers[a]), i = 0;
      while (i < size && p[i] == (unsigned char)b) ++i;
      if (i == size) {
        printf("%u: ok\n", n);
      } else {
        printf("%u: byte %zu of %zu is %u, not %llu\n", n, i, size, p[i], b);
      }
    } else if (strcmp(cmd, "free") == 0 && fields == 2 && a < (unsigned long long)count && buffers[a] != NULL) {
      ferry_host_free(buffers[a]);
      buffers[a] = NULL;
      printf("%u: ok\n", n);
    } else if (strcmp(cmd, "quit") == 0) {
      printf("%u: ok\n", n);
      fflush(stdout);
      break;
    } else {
      printf("%u: bad command: %s", n, line);
    }
    fflush(stdout);
  }
  for (int i = 0; i < count; ++i) ferry_host_free(buffers[i]);
  ferry_disconnect(client);
  return 0;
}
