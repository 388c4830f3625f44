// Host shim over libnvshmem_host: the unique-id bootstrap and the few host calls
// cuco needs. Uses the hostlib entry points, which (unlike the inline
// nvshmemx_init_attr) resolve in the shared library.
#include <nvshmem.h>
#include <nvshmemx.h>
#include <string.h>

extern "C" int cuco_nvshmem_uid_size() { return (int)sizeof(nvshmemx_uniqueid_t); }

extern "C" int cuco_nvshmem_get_uid(void* out) {
  nvshmemx_uniqueid_t id = NVSHMEMX_UNIQUEID_INITIALIZER;
  int rc = nvshmemx_get_uniqueid(&id);
  memcpy(out, &id, sizeof(id));
  return rc;
}

extern "C" int cuco_nvshmem_init(int rank, int nranks, const void* uid) {
  nvshmemx_uniqueid_t id;
  memcpy(&id, uid, sizeof(id));
  nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
  int rc = nvshmemx_set_attr_uniqueid_args(rank, nranks, &id, &attr);
  if (rc != 0) return rc;
  return nvshmemx_hostlib_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr);
}

extern "C" void* cuco_nvshmem_malloc(size_t bytes) { return nvshmem_malloc(bytes); }
extern "C" void cuco_nvshmem_free(void* p) { nvshmem_free(p); }
// where this PE reaches `p` of PE `pe` by loads and stores (null: not by NVLink)
extern "C" void* cuco_nvshmem_ptr(void* p, int pe) { return nvshmem_ptr(p, pe); }
extern "C" int cuco_nvshmem_cumodule_init(void* module) { return nvshmemx_cumodule_init((CUmodule)module); }
extern "C" int cuco_nvshmem_my_pe() { return nvshmem_my_pe(); }
extern "C" int cuco_nvshmem_n_pes() { return nvshmem_n_pes(); }
extern "C" void cuco_nvshmem_barrier_all() { nvshmem_barrier_all(); }
extern "C" void cuco_nvshmem_finalize() { nvshmemx_hostlib_finalize(); }
