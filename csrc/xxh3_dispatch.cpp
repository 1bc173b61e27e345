// xxHash's runtime x86 dispatcher (scalar/SSE2/AVX2/AVX-512 picked at first use) compiled into the
// engine: a portable -O3 build gets only SSE2 (~12 GB/s hot here); AVX2 hashes ~30 GB/s, and the
// receiving thread hashes every byte it lands, so the difference shows in transfer rates.
#if defined(__x86_64__) || defined(__i386__)
#include "third_party/xxhash/xxh_x86dispatch.c"
#endif
