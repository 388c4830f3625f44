// Host shim: ncclDevCommCreate/Destroy are host calls that fill a struct whose
// layout depends on the NCCL version, so they are built against that NCCL's
// headers and called from Python through ctypes. No CUDA runtime is used here:
// Python copies the filled struct to device memory.
#include <nccl.h>
#include <nccl_device.h>
#include <string.h>

extern "C" int cuco_devcomm_size() { return (int)sizeof(ncclDevComm); }

extern "C" int cuco_devcomm_create(ncclComm_t comm, int lsaBarrierCount, int ginSignalCount,
                                   int ginCounterCount, int ginForceEnable, void* out) {
  ncclDevCommRequirements reqs;
#ifdef NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER
  reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
#else
  memset(&reqs, 0, sizeof(reqs));
#endif
  reqs.lsaBarrierCount = lsaBarrierCount;
  if (ginForceEnable || ginSignalCount || ginCounterCount) {
    reqs.ginForceEnable = ginForceEnable != 0;
    reqs.ginContextCount = 1;
    reqs.ginSignalCount = ginSignalCount;
    reqs.ginCounterCount = ginCounterCount;
  }
  return (int)ncclDevCommCreate(comm, &reqs, (ncclDevComm*)out);
}

extern "C" int cuco_devcomm_destroy(ncclComm_t comm, const void* devcomm) {
  return (int)ncclDevCommDestroy(comm, (const ncclDevComm*)devcomm);
}
