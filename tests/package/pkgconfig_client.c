/* The same round trips through the installed libferry's C ABI, built with `pkg-config ferry`:
 * random data, the destination poisoned each time, two patterns, every byte checked.
 * usage: pkgconfig_client BYTES */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ferry/ferry.h>

static int fail(const char* what) {
  fprintf(stderr, "pkgconfig_client: %s: %s\n", what, ferry_last_error());
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: pkgconfig_client BYTES\n");
    return 2;
  }
  const size_t n = strtoull(argv[1], NULL, 10);
  ferry_connect_options o = {sizeof o, NULL, "package-pkgconfig-client", 0, 0, 0};
  ferry_client* c = NULL;
  if (ferry_connect(&o, &c) != FERRY_OK) return fail("connect");
  ferry_host_buffer *src = NULL, *back = NULL;
  ferry_device_region* dev = NULL;
  if (ferry_host_alloc(c, n, &src) != FERRY_OK || ferry_host_alloc(c, n, &back) != FERRY_OK) return fail("host alloc");
  if (ferry_device_alloc(c, n, &dev) != FERRY_OK) return fail("device alloc");
  unsigned char* s = ferry_host_data(src);
  unsigned char* b = ferry_host_data(back);
  FILE* urandom = fopen("/dev/urandom", "rb");
  if (!urandom) return fail("open /dev/urandom");
  for (int round = 0; round < 2; ++round) {
    if (fread(s, 1, n, urandom) != n) return fail("read /dev/urandom");
    memset(b, 0xA5 ^ round, n);
    if (ferry_backend(c) == 0) memset(ferry_device_data(dev), 0x5A ^ round, n); /* host backend: host memory */
    ferry_transfer* t = NULL;
    if (ferry_copy(c, FERRY_HOST_TO_DEVICE, src, 0, dev, 0, n, NULL, &t) != FERRY_OK) return fail("copy to device");
    if (ferry_transfer_wait(t, 30000000) != FERRY_OK) return fail("wait");
    ferry_transfer_free(t);
    if (ferry_copy(c, FERRY_DEVICE_TO_HOST, back, 0, dev, 0, n, NULL, &t) != FERRY_OK) return fail("copy to host");
    if (ferry_transfer_wait(t, 30000000) != FERRY_OK) return fail("wait");
    ferry_transfer_free(t);
    for (size_t i = 0; i < n; ++i) {
      if (b[i] != s[i]) {
        fprintf(stderr, "pkgconfig_client: round %d: byte %zu came back 0x%02x, sent 0x%02x\n", round, i, b[i], s[i]);
        return 1;
      }
    }
  }
  fclose(urandom);
  ferry_host_free(src);
  ferry_host_free(back);
  ferry_device_unregister(dev);
  ferry_disconnect(c);
  printf("pkgconfig_client: %zu bytes both ways twice, every byte checked, libferry %s\n", n, ferry_version());
  return 0;
}
