/* ei_impl.c - the one translation unit that compiles entropyinfer's
   implementation for the Gemma example engine. */
#define _POSIX_C_SOURCE 200809L
#define ENTROPYINFER_IMPLEMENTATION
#include "../../entropyinfer.h"
