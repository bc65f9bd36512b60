// Compiled into idem-gateway only when it links jemalloc (gateway/CMakeLists.txt).
//
// jemalloc reads this string at start-up, before the MALLOC_CONF environment variable, so an
// operator can still override any option (MALLOC_CONF="thp:default" undoes this).
//
// thp:always backs jemalloc's memory with transparent huge pages (2 MiB) wherever the kernel
// allows them (transparent_hugepage "always" or "madvise"). The gateway allocates a little on
// every request and the memory store keeps every response for its retention, so with 4 KiB pages
// the kernel spends a page fault per 4 KiB of new memory: measured with wrk against a fresh
// memory store, 60 µs of gateway CPU per request with 4 KiB pages against 45 µs with huge pages
// (docs/benchmarks.md). The gateway never forks, so huge pages cost it no copy-on-write, only
// resident memory not yet used: ~23 MiB for an idle gateway instead of ~15 MiB.
extern "C" {
extern const char* malloc_conf;
const char* malloc_conf = "thp:always,metadata_thp:auto";
}
