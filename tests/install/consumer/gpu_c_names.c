/* A C program on the installed C API (hils/gpu/c_api.h): the spec's enum names come from the
   library's tables without a GPU. Exit 0 only on the names of hils/spec.hpp. */
#include <stdio.h>
#include <string.h>

#include "hils/gpu/c_api.h"

int main(void) {
  const char* names = hils_gpu_enum_names("key_rule");
  printf("hils_gpu_enum_names(\"key_rule\") = %s\n", names ? names : "(null)");
  if (names == NULL || strcmp(names, "exact mean landmark_key taylor") != 0) return 1;
  if (hils_gpu_enum_names("no_such_field") != NULL) return 1;
  return 0;
}
