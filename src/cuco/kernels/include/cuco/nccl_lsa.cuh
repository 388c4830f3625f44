// NCCL's device API as cuco's LSA kernels use it (the device communicator, windows and
// their LSA pointers, the cooperative groups, the LSA barrier), without the GIN, LL
// all-to-all and reduce-copy parts <nccl_device.h> also pulls in: seconds of every LSA
// build's front end, and no instruction of a kernel that calls none of them
// (tests/test_light_headers.py compares the SASS). GIN kernels include <nccl_device.h>
// (cuco/gin.cuh). A tree laid out otherwise, or a build with CUCO_FULL_HEADERS defined
// (that test's), gets the whole header.
#pragma once

#if !defined(CUCO_FULL_HEADERS) && __has_include(<nccl_device/coop.h>) && \
    __has_include(<nccl_device/impl/comm__funcs.h>) && __has_include(<nccl_device/impl/core__funcs.h>) && \
    __has_include(<nccl_device/impl/lsa_barrier__funcs.h>) && __has_include(<nccl_device/impl/ptr__funcs.h>)
#include <nccl_device/coop.h>
#include <nccl_device/impl/comm__funcs.h>
#include <nccl_device/impl/core__funcs.h>
#include <nccl_device/impl/lsa_barrier__funcs.h>
#include <nccl_device/impl/ptr__funcs.h>
#else
#include <nccl_device.h>
#endif
