/* Prints libsodium's BLAKE2b-512 of the bytes 0, 1, 2, ... (mod 251) for each length given, one
 * "LENGTH HEX" line each: what the report page's BLAKE2b is compared with. */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  if (sodium_init() < 0) return 1;
  for (int i = 1; i < argc; ++i) {
    const size_t n = strtoul(argv[i], NULL, 10);
    unsigned char* data = malloc(n + 1);
    if (data == NULL) return 1;
    for (size_t j = 0; j < n; ++j) data[j] = (unsigned char)(j % 251);
    unsigned char h[64];
    crypto_generichash(h, sizeof h, data, n, NULL, 0);
    free(data);
    char hex[129];
    sodium_bin2hex(hex, sizeof hex, h, sizeof h);
    printf("%zu %s\n", n, hex);
  }
  return 0;
}
