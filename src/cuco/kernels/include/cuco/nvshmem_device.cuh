// NVSHMEM's device API as cuco's kernels use it (put-with-signal, signals, nvshmem_ptr,
// quiet, my_pe/n_pes), without the collectives and the tile API that <nvshmem.h> and
// <nvshmemx.h> also pull in: those two headers cost about 3 s of every NVSHMEM build's
// front end and change no instruction of a kernel that calls none of them
// (tests/test_light_headers.py compares the SASS). A tree laid out otherwise, or a build
// with CUCO_FULL_HEADERS defined (that test's), gets the whole headers.
#pragma once

#if !defined(CUCO_FULL_HEADERS) && __has_include(<device/nvshmem_defines.h>) && __has_include(<device/nvshmemx_defines.h>) && \
    __has_include(<non_abi/nvshmem_build_options.h>)
#include <non_abi/nvshmem_build_options.h>
#if !defined __CUDACC_RTC__
#include <nvshmem_host.h>
#endif
#include <device/nvshmem_defines.h>
#include <device/nvshmemx_defines.h>
#else
#include <nvshmem.h>
#include <nvshmemx.h>
#endif
